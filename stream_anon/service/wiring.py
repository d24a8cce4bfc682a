"""From the configuration to the main path's parts: the schema, one engine per partition, the pipeline settings.

The service loop (:mod:`stream_anon.service.app`), the pipeline workers (:mod:`stream_anon.service.workers`) and
the side paths build their parts here, from the same validated :class:`~stream_anon.service.config.Config`.
"""

from __future__ import annotations

from collections.abc import Callable

from stream_anon.core.engine import Engine
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema
from stream_anon.service.config import Config
from stream_anon.service.pipeline import PipelineSettings
from stream_anon.service.release import ReleaseSecret, resolve_secret


def load_schema(cfg: Config) -> Schema:
    """The schema of ``anonymization.schema`` (default ADULT) with the configured QI/sensitive roles."""
    return cfg.anonymization.load_schema()


def make_engine_factory(cfg: Config, schema: Schema) -> Callable[[int], EngineLike]:
    """partition -> a fresh :class:`~stream_anon.core.engine.Engine` with the configured parameters (seed +
    partition when seeded); the parameters were validated when the config was loaded."""
    a = cfg.anonymization

    def factory(partition: int) -> EngineLike:
        return Engine(schema, a.engine_config(seed=None if a.seed is None else a.seed + partition))

    return factory


def pipeline_settings(cfg: Config) -> PipelineSettings:
    """Topic names and limits of the pure per-partition pipeline."""
    t, a, s = cfg.topics, cfg.anonymization, cfg.service
    return PipelineSettings(input_topic=t.input, anon_topic=t.anon, suppressed_topic=t.suppressed, dlq_topic=t.dlq,
                            k=a.k, delta=a.delta, l=a.l, max_message_bytes=s.max_message_bytes,
                            dlq_max_bytes=s.dlq_max_bytes)


def with_release_secret(cfg: Config) -> tuple[Config, ReleaseSecret]:
    """``cfg`` with ``release.secret`` set, and the secret: the configured one, or one generated now (CSPRNG).

    Call it ONCE in the parent process, before starting pipeline workers and the side-path process, and hand them
    the returned config: every process then derives the same pseudonyms and dead-letter hashes.
    """
    secret = resolve_secret(cfg.release.secret)
    if secret.generated:
        cfg = cfg.with_options({"release.secret": secret.text}, origin="generated at start")
    return cfg, secret
