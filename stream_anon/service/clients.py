"""The Kafka clients of one main-path member, built once at start (:func:`open_main_clients`) and closed by the
``ExitStack`` they were entered into: topics made sure of, the broker guard, the group poller, the recovery
reader, the broker-health view and the two producers (:class:`ServiceProducers`, which the loop may recreate).

Every client exists for the whole run or the run does not start (:class:`~stream_anon.kafka_io.errors.
BrokerUnavailableError`: exit 3; :class:`MissingLedgerError`: exit 2): nothing downstream checks for a missing
one.  How long each may take to close is decided when the stop path knows how it went
(:class:`~stream_anon.kafka_io.lifecycle.Closing`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient

from stream_anon.config.settings import Config
from stream_anon.kafka_io.clients import prepare_topics, retry
from stream_anon.kafka_io.consumers import open_poller
from stream_anon.kafka_io.lifecycle import LOOP_REQUEST_TIMEOUT_MS, Closing, StopClock
from stream_anon.kafka_io.limits import MIN_OUTPUT_BOUND, MessageBound, read_output_bound
from stream_anon.kafka_io.poller import FailingPolls, Poller
from stream_anon.kafka_io.producer import OutputProducer, open_producer
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.kafka_io.settings import KafkaSettings
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.service.broker_guard import BrokerGuard
from stream_anon.service.broker_health import BrokerHealth
from stream_anon.service.outbox import Topics

log = logging.getLogger(__name__)

__all__ = ["LOOP_REQUEST_TIMEOUT_MS", "MainClients", "MissingLedgerError", "OutputBoundError", "ServiceProducers",
           "TopicLayoutError", "main_topics", "open_main_clients"]



class MissingLedgerError(RuntimeError):
    """The ledger topic does not exist and ``topics.create`` is false (a configuration error: exit 2)."""


class OutputBoundError(RuntimeError):
    """The broker's or the producer's message size limit is too small for the service (exit 2)."""


class TopicLayoutError(RuntimeError):
    """The ledger has fewer partitions than the input (partitions were added to the input): ledger partition =
    input partition would mix two input partitions in one ledger partition (exit 2)."""


def main_topics(cfg: Config) -> Topics:
    t = cfg.topics
    return Topics(input=t.input, ledger=t.ledger_topic(), roles={"anon": t.anon, "suppressed": t.suppressed,
                                                                  "dlq": t.dlq})


class ServiceProducers:
    """The output producer and the ledger producer (the ledger's messages are few and small, and step 2 waits for
    them: no linger); :meth:`recreate` closes both, abandoning what they hold, and opens new ones."""

    def __init__(self, kafka: KafkaSettings, **options: Any) -> None:
        self.kafka = kafka
        self.options = options
        self._outputs = open_producer(kafka, **options)
        self._ledger = open_producer(dataclasses.replace(kafka, linger_ms=0), label="ledger", **options)

    @property
    def outputs(self) -> OutputProducer:
        return self._outputs

    @property
    def ledger(self) -> OutputProducer:
        return self._ledger

    def recreate(self) -> None:
        self.close(0.0)
        self._outputs = open_producer(self.kafka, **self.options)
        self._ledger = open_producer(dataclasses.replace(self.kafka, linger_ms=0), label="ledger", **self.options)

    def close(self, timeout_s: float) -> None:
        for producer in (self._outputs, self._ledger):
            producer.close(timeout_s=timeout_s)


@dataclass(frozen=True)
class MainClients:
    """The clients of one run (see the module docstring)."""

    topics: Topics
    counts: dict[str, int]  # topic -> partitions
    bound: MessageBound  # the output bound (topics.max_message_bytes is its bytes)
    guard: BrokerGuard
    poller: Poller
    reader: PartitionReader
    health: BrokerHealth
    producers: ServiceProducers


def open_main_clients(cfg: Config, stack: ExitStack, *, metrics: ServiceMetrics, stopping: Callable[[], bool],
                      stop_clock: StopClock, closing: Closing, owned: Callable[[], Iterable[int]],
                      alive: Callable[[], None] = lambda: None) -> MainClients:
    """Connect (with the start-up retry policy), make sure of the topics and open every client; each is entered
    into ``stack`` as soon as it exists.  ``owned``: the partitions the loop owns (the health checks read their
    ledger partitions); ``alive``: called while a flush waits for the broker (the loop's heartbeat)."""
    k = cfg.kafka
    bounds: list[MessageBound] = []

    def read_bound(admin: KafkaAdminClient) -> None:
        bounds.append(retry("message size limits", lambda: read_output_bound(
            admin, cfg.topics.service_topics(), max_request_size=k.max_request_size,
            configured=cfg.service.max_output_bytes), k, stop=stopping))

    counts = prepare_topics(k, cfg.topics.service_topics(), cfg.topics.layout(),
                            on_retry=metrics.broker_reconnects.inc, stop=stopping, also=read_bound)
    ledger, n_input = cfg.topics.ledger_topic(), counts.get(cfg.topics.input, 0)
    if ledger not in counts:
        raise MissingLedgerError(f"topics.ledger: topic {ledger} does not exist and topics.create is false: create it "
                                 f"(compacted, with the input's partition count; deploy/kafka/create-topics.sh)")
    if counts[ledger] < n_input:
        raise TopicLayoutError(f"topics.ledger: {ledger} has {counts[ledger]} partitions, fewer than the {n_input} of "
                               f"the input {cfg.topics.input} (partitions were added to the input): add partitions to "
                               f"the ledger so that it has as many (kafka-topics --alter --partitions {n_input}), then "
                               f"start again")
    bound = bounds[0]
    if bound.bytes < MIN_OUTPUT_BOUND:
        raise OutputBoundError(f"the output bound is {bound.describe()}, below the {MIN_OUTPUT_BOUND:,} bytes the "
                               f"service needs: raise the broker's message.max.bytes (or the topics' "
                               f"max.message.bytes) or kafka.max_request_size")
    log.info("every message written stays within %s", bound.describe())
    topics = dataclasses.replace(main_topics(cfg), max_message_bytes=bound.bytes)
    # a batch of small messages is one record batch to the broker too: never larger than the bound
    k = dataclasses.replace(k, batch_size=min(k.batch_size, bound.bytes))
    guard = BrokerGuard(cfg, [topics.input, topics.ledger, *topics.roles.values()])
    stack.callback(guard.close)
    retry("topic metadata", guard.start, k, stop=stopping)
    reader_kafka = dataclasses.replace(k, request_timeout_ms=min(k.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS))
    poller = retry("consumer", lambda: open_poller(k, topics.input, group_id=k.group_id,
                                                   reader=lambda: PartitionReader(reader_kafka)), k, stop=stopping)
    stack.callback(lambda: poller.close(closing.consumer_seconds))
    # (a read of the recovery or a health check gives up as soon as the service stops)
    reader = retry("recovery reader", lambda: PartitionReader(reader_kafka, stop=stopping), k, stop=stopping)
    stack.callback(reader.close)
    n_ledger = counts[topics.ledger]
    health = BrokerHealth(guard, poller, reader, kafka=k, input_topic=topics.input, ledger_topic=topics.ledger,
                          ledger_partition=lambda p: p % n_ledger, owned=owned, stopping=stopping,
                          confirm_seconds=cfg.service.loss_confirm_seconds)
    # polls that keep failing while the broker answers end the run (exit 1: a supervisor starts a fresh member)
    poller.failures = FailingPolls(cfg.service.producer_recovery_seconds, lambda: health.check_data(force=True),
                                   pause_s=min(1.0, cfg.service.poll_timeout_ms / 1000.0))

    def produce_error(topic: str) -> None:
        metrics.produce_errors.labels(topic=topic).inc()

    # a flush on the stop path waits for the stop grace, not forever (lifecycle.StopClock)
    def watchdog() -> None:  # every slice of a flush that waits: the loop is alive; did the broker lose data?
        alive()
        health.check_data()

    producers = ServiceProducers(k, partition_counts=counts, stop=stop_clock.give_up, on_error=produce_error,
                                 stuck_after_s=cfg.service.producer_recovery_seconds, watchdog=watchdog)
    stack.callback(lambda: producers.close(closing.producer_seconds))
    return MainClients(topics, counts, bound, guard, poller, reader, health, producers)
