"""The group consumer the paths poll, over the client library ``kafka.consumer_client`` names: confluent-kafka
(:class:`~stream_anon.kafka_io.confluent_poller.ConfluentPoller`, the default) or kafka-python
(:class:`~stream_anon.kafka_io.poller.GroupPoller`), both behind :class:`~stream_anon.kafka_io.poller.Poller`."""

from __future__ import annotations

from collections.abc import Callable

from stream_anon.kafka_io.clients import make_consumer
from stream_anon.kafka_io.confluent_poller import ConfluentPoller
from stream_anon.kafka_io.oversized import OversizeSearch
from stream_anon.kafka_io.poller import FailingPolls, GroupPoller, Poller
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.kafka_io.settings import KafkaSettings


def open_poller(k: KafkaSettings, topic: str, *, group_id: str, reader: Callable[[], PartitionReader],
                failures: FailingPolls | None = None) -> Poller:
    """The group consumer of ``topic`` in ``group_id`` over ``kafka.consumer_client`` (records per poll:
    ``kafka.max_poll_records``; ``reader``: group-less readers for kafka-python's unreadable records)."""
    if k.consumer_client == "kafka-python":
        return GroupPoller(make_consumer(k, group_id=group_id), topic, max_records=k.max_poll_records, reader=reader,
                           failures=failures, search=OversizeSearch(k, listens_to_logs=True))
    return ConfluentPoller(k, topic, group_id=group_id, max_records=k.max_poll_records, failures=failures)
