"""The main path of one service member (``stream-anon run``): consume -> anonymize -> ledger -> produce -> commit.

The internal ledger (``<input>.ledger``, :mod:`stream_anon.service.ledger`) is the source of truth for recovery and
accounting; the public topics are never read back.  The loop keeps the outbox order of that module::

    poll a batch -> the partition's pipeline (inline or in a worker process)
    1. each finished batch's ledger entries -> the ledger (ledger producer, linger 0), without waiting
    2. as soon as a batch's entries are acknowledged (checked without blocking), its outputs -> anon /
       suppressed / dlq (output producer); meanwhile the next batches go on
    every service.commit_interval_ms (everything must be acknowledged here):
    3. flush the ledger, send the remaining outputs, flush the outputs
    4. a checkpoint per partition whose watermark or entries moved -> the ledger; flush it
    5. commit the watermarks (asynchronously)
    6. once a commit is confirmed: tombstones for the ledger keys no recovery can need

:class:`MainPath` is what callers hold (its totals, its events, its partitions); :meth:`MainPath.run` builds the
clients once (:mod:`~stream_anon.service.clients`, entered into an ``ExitStack``) and runs the loop
(:mod:`~stream_anon.service.loop`) with its collaborators: the partition table (:mod:`~stream_anon.service.
partitions`), the ledger outbox, steps 1-3 (:mod:`~stream_anon.service.outbox`), the committer, steps 4-6
(:mod:`~stream_anon.service.committer`), partition recovery (:mod:`~stream_anon.service.recovery`), the broker's
health (:mod:`~stream_anon.service.broker_health`), the producer-failure policy
(:mod:`~stream_anon.service.failure_policy`) and the group poller (:mod:`~stream_anon.kafka_io.poller`).

Exit codes (what ends a run, and how): 0 stopped; 1 a worker failed, a producer kept failing (more than
``PRODUCER_RECREATIONS_MAX`` failures in a row while the broker answers), a message was refused for good, or the
group consumer's polls kept failing; 2 a configuration the broker refuses (the ledger topic missing with
``topics.create`` false, a ledger shared with another consumer group, a message size limit below
:data:`~stream_anon.kafka_io.limits.MIN_OUTPUT_BOUND`, a ledger with fewer partitions than the input); 3 the broker unreachable at start, or gone
while the stop path waited for it (nothing more committed: a restart recovers from the ledger); 4 the broker lost
data (:mod:`stream_anon.service.broker_guard`; what the producers hold is abandoned).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import ExitStack

import numpy as np
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema
from stream_anon.kafka_io.errors import (
    BrokerUnavailableError,
    ConsumerFailedError,
    MessageRejectedError,
    ProducerFatalError,
)
from stream_anon.kafka_io.lifecycle import Closing, StopClock
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.privacy.base import crypto_rng
from stream_anon.service.broker_guard import EXIT_DATA_LOSS, BrokerDataLossError
from stream_anon.service.clients import (
    LOOP_REQUEST_TIMEOUT_MS,
    MissingLedgerError,
    OutputBoundError,
    TopicLayoutError,
    open_main_clients,
)
from stream_anon.service.committer import CommitProgress
from stream_anon.service.failure_policy import PRODUCER_RECREATIONS_MAX
from stream_anon.service.liveness import LoopHeartbeat, LoopView
from stream_anon.service.loop import MainLoop
from stream_anon.service.partitions import OwnedPartition, PartitionTable
from stream_anon.service.recovery import LedgerConflictError, LedgerLostError
from stream_anon.service.totals import MainPathTotals
from stream_anon.service.wiring import (
    load_schema,
    make_engine_factory,
    make_entry_factory,
    pipeline_settings,
    with_release_secret,
)
from stream_anon.service.workers import Backend, InlineBackend, ProcessBackend, WorkerError

__all__ = ["LOOP_REQUEST_TIMEOUT_MS", "PRODUCER_RECREATIONS_MAX", "MainPath", "MainPathTotals"]

log = logging.getLogger(__name__)


class MainPath:
    """The main path of one service member.  ``run()`` until ``stop_event`` is set; returns an exit code.

    ``service.workers`` = 0 runs the pipelines inline; >= 1 in that many worker processes (needs the default
    engine: a custom ``engine_factory`` forces inline).  The release secret must be resolved once for all the
    processes of a service (:func:`~stream_anon.service.wiring.with_release_secret`); when ``cfg`` has none, it is
    generated here (``secret_generated`` then becomes true).

    What callers read while it runs: ``ready`` (clients connected, subscribed), ``assigned`` (the group gave this
    member its partitions at least once), ``totals``, ``states`` (the owned partitions), ``committed`` (partition ->
    watermark last committed), ``commits_made`` (commits that moved a watermark past its highest commit so far).
    """

    def __init__(self, cfg: Config, *, metrics: ServiceMetrics | None = None, schema: Schema | None = None,
                 engine_factory: Callable[[int], EngineLike] | None = None,
                 stop_event: threading.Event | None = None, secret_generated: bool = False,
                 heartbeat: LoopHeartbeat | None = None, release_rng: np.random.Generator | None = None) -> None:
        if cfg.release.secret is None:
            cfg, secret = with_release_secret(cfg)
            secret_generated = secret.generated
        self.cfg = cfg
        self.secret_generated = secret_generated
        self.metrics = metrics if metrics is not None else ServiceMetrics(CollectorRegistry())
        self.schema = schema if schema is not None else load_schema(cfg)
        self._custom_engine = engine_factory is not None
        self.engine_factory = engine_factory or make_engine_factory(cfg, self.schema)
        self.stop_event = stop_event or threading.Event()
        self.stop_clock = StopClock(self.stop_event)  # the stop path's shared grace for acknowledgements
        self.ready = threading.Event()
        self.assigned = threading.Event()
        self.table = PartitionTable()
        self.totals = MainPathTotals()
        self.progress = CommitProgress()
        self.heartbeat = heartbeat or LoopHeartbeat(cfg.service.healthz_stall_seconds)  # ticked every iteration
        self.view = LoopView()  # for the lag monitor: assigned partitions, consumed positions (replaced, never mutated)
        # the shuffle of each release tick's classes: ChaCha20 from OS entropy (or anonymization.seed when set)
        self.release_rng = release_rng if release_rng is not None else crypto_rng(cfg.anonymization.seed)
        self.metrics.k_parameter.set(cfg.anonymization.k)
        self.metrics.delay_bound_arrivals.set(cfg.anonymization.delta)

    @property
    def states(self) -> Mapping[int, OwnedPartition]:
        """The owned partitions (partition -> what the loop knows of it)."""
        return self.table.owned

    @property
    def committed(self) -> dict[int, int]:
        """partition -> the watermark last committed for it (owned partitions)."""
        return self.table.committed()

    @property
    def commits_made(self) -> int:
        return self.progress.made

    def run(self) -> int:
        for line in self.cfg.release_options().startup_warnings(secret_generated=self.secret_generated):
            log.warning("%s", line)
        closing = Closing()
        with ExitStack() as stack:
            pipelines = stack.enter_context(ExitStack())  # unwound last: the pipelines outlive the clients
            try:
                clients = open_main_clients(self.cfg, stack, metrics=self.metrics, stopping=self.stop_event.is_set,
                                            stop_clock=self.stop_clock, closing=closing, owned=self.table.partitions,
                                            alive=self.heartbeat.tick)
            except BrokerUnavailableError as e:
                log.error("%s", e)
                closing.broker_silent()
                return 3
            except (MissingLedgerError, OutputBoundError, TopicLayoutError) as e:
                log.error("%s", e)
                return 2
            # the pipelines (and their workers) build every output within the bound read from the broker
            self.cfg = self.cfg.with_options({"service.max_output_bytes": clients.bound.bytes},
                                             origin="the broker's message size limit")
            backend = self._backend()
            pipelines.callback(backend.close)
            rc = self._run(MainLoop(self, clients, backend), closing)
        t = self.totals
        log.info("main path stopped: consumed %d, released %d, suppressed %d, dead-lettered %d, skipped %d, "
                 "control %d", t.consumed, t.released, t.suppressed, t.dead_lettered, t.skipped, t.control)
        return rc

    def _backend(self) -> Backend:
        cfg = self.cfg
        if cfg.service.workers > 0 and not self._custom_engine:
            return ProcessBackend(cfg, cfg.service.workers, stop=self.stop_event.is_set)
        return InlineBackend(self.schema, pipeline_settings(cfg), self.engine_factory,
                             make_entry_factory(cfg, self.schema))

    def _run(self, loop: MainLoop, closing: Closing) -> int:
        """The loop, then its stop path; what ended it -> the exit code (one ERROR line naming it)."""
        rc = 0
        try:
            loop.run()
        except BrokerDataLossError as e:
            log.error("broker %s lost data this service had committed or acknowledged: %s; stopping without publishing "
                      "over it (exit code %d; docs/service.md, \"A broker that lost its data\")",
                      self.cfg.kafka.bootstrap_servers, e, EXIT_DATA_LOSS)
            closing.abandon()
            rc = EXIT_DATA_LOSS
        except LedgerLostError as e:
            log.error("%s (exit code %d on every start until the operator acts: docs/service.md, \"A topic that was "
                      "deleted or recreated\")", e, EXIT_DATA_LOSS)
            closing.abandon()
            rc = EXIT_DATA_LOSS
        except ProducerFatalError as e:
            if self.stop_event.is_set():  # a stop while the producers were failing: left to the next start
                log.error("%s; stopped meanwhile: stopping without committing what is not acknowledged (a restart "
                          "recovers from the ledger)", e)
                rc = 3
            else:
                log.error("%s; stopping with exit code 1 (a restart recovers from the ledger)", e)
                rc = 1
        except (WorkerError, MessageRejectedError, ConsumerFailedError) as e:
            log.error("%s; stopping with exit code 1 (a restart recovers from the ledger)", e)
            rc = 1
        except BrokerUnavailableError as e:  # stopped while the broker was away: outputs not acknowledged
            log.error("%s; stopping without committing them (a restart recovers from the ledger)", e)
            rc = 3
        except LedgerConflictError as e:
            log.error("%s", e)
            rc = 2
        finally:
            ok = loop.finish(clean=rc == 0)
            if not (ok and rc == 0) or loop.broker_silent:
                closing.broker_silent()  # the broker did not answer, or the run failed: no client waits again
            if not ok and rc == 0:
                rc = 3
        return rc
