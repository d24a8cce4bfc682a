"""From the configuration to the main path's parts: the schema, one engine per partition, the pipeline settings.

The service loop (:mod:`stream_anon.service.app`, :mod:`stream_anon.service.loop`), the pipeline workers
(:mod:`stream_anon.service.workers`) and the side paths build their parts here, from the same validated
:class:`~stream_anon.config.settings.Config`.
"""

from __future__ import annotations

from collections.abc import Callable

from stream_anon.config.settings import Config
from stream_anon.core.engine import Engine
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema
from stream_anon.formats.release import ClassEncoder, ReleaseSecret, resolve_secret
from stream_anon.service.gate import PrePublishGate
from stream_anon.service.ledger import EntryFactory
from stream_anon.service.pipeline import PipelineSettings


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
    """Input topic and limits of the pure per-partition pipeline."""
    a = cfg.anonymization
    return PipelineSettings(input_topic=cfg.topics.input, k=a.k, delta=a.delta,
                            l=a.l if isinstance(a.l, int) and a.diversity == "distinct" else None,
                            max_message_bytes=cfg.service.max_message_bytes,
                            max_delay=max(a.delta, a.delta_leftover or 0))


def make_entry_factory(cfg: Config, schema: Schema) -> Callable[[int, str], EntryFactory]:
    """(partition, incarnation) -> the :class:`EntryFactory` of that partition: the pre-publish gate (k, l of the
    config), the public class encoder (``release.include_record_ids``), the dead-letter options and the release
    secret, which must be resolved already (:func:`with_release_secret`, in the parent process)."""
    opts = cfg.release_options()
    if opts.secret is None:
        raise ValueError("release.secret is not resolved: call wiring.with_release_secret(cfg) once in the parent "
                         "process and hand its config to the workers")
    secret = opts.secret.encode("utf-8", "surrogatepass")
    a = cfg.anonymization
    qis = [x.name for x in schema.qis]
    sensitive = [x.name for x in schema.sensitive]
    req = a.requirement(schema)  # the diversity requirement (None: k only), stated in the class messages
    l_stated = req.min_distinct if req is not None and req.l_active else None
    every = a.engine_config(seed=None).effective_t_reference_every

    def factory(partition: int, incarnation: str) -> EntryFactory:
        return EntryFactory(input_topic=cfg.topics.input, partition=partition, incarnation=incarnation,
                            classes=ClassEncoder(qis=qis, sensitive=sensitive, k=a.k, l=l_stated,
                                                 include_record_ids=opts.include_record_ids, requirement=req),
                            secret=secret, dlq_payload=opts.dlq_payload,
                            dlq_max_payload_bytes=opts.dlq_max_payload_bytes,
                            gate=PrePublishGate(schema, k=a.k, requirement=req, reference_every=every),
                            max_message_bytes=cfg.service.max_output_bytes)

    return factory


def with_release_secret(cfg: Config) -> tuple[Config, ReleaseSecret]:
    """``cfg`` with ``release.secret`` set, and the secret: the configured one, or one generated now (CSPRNG).

    Call it ONCE in the parent process, before starting pipeline workers and the side-path process, and hand them
    the returned config: every process then derives the same pseudonyms and dead-letter hashes.
    """
    secret = resolve_secret(cfg.release.secret)
    if secret.generated:
        cfg = cfg.with_options({"release.secret": secret.text}, origin="generated at start")
    return cfg, secret
