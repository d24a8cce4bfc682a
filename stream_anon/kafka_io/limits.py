"""The largest message the service may write: its output bound, derived at start from the broker.

A Kafka broker refuses a record batch larger than its ``message.max.bytes`` (a topic may lower or raise it with
``max.message.bytes``; Apache Kafka's default is 1,048,588 bytes), and the producer refuses a message larger than
its own ``kafka.max_request_size``.  A message over either limit can never be delivered: the service would stop
on it, and again on every restart.  So every message the service writes (ledger entries, classes, suppressions,
dead letters, side-path outputs) is kept within one bound (:class:`MessageBound`, in the sense of
:func:`~stream_anon.formats.messages.message_size`: key + value + framing):

    bound = min(each service topic's max.message.bytes, kafka.max_request_size, service.max_output_bytes when set)

read at start with the admin API (``DescribeConfigs`` on the topics, :func:`broker_message_limits`: a topic's
effective ``max.message.bytes`` is the broker's ``message.max.bytes`` unless the topic sets its own).  A broker that
answers nothing for these names (Tansu answers an empty list) gets :data:`FALLBACK_MESSAGE_MAX_BYTES`, Apache
Kafka's default, which every Kafka-compatible broker accepts.  The producers' ``batch_size`` is capped at the bound too
(a batch of many small messages is also one record batch to the broker).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError

from stream_anon.kafka_io.settings import FALLBACK_MESSAGE_MAX_BYTES, MIN_OUTPUT_BOUND

log = logging.getLogger(__name__)

__all__ = ["FALLBACK_MESSAGE_MAX_BYTES", "MIN_OUTPUT_BOUND", "MessageBound", "broker_message_limits", "output_bound",
           "read_output_bound"]



@dataclass(frozen=True)
class MessageBound:
    """The output bound and where it comes from (``describe()`` for the start-up line)."""

    bytes: int
    broker: int | None = None  # the broker's message.max.bytes (None: not reported)
    topics: Mapping[str, int] = field(default_factory=dict)  # topic -> max.message.bytes, as reported
    max_request_size: int = 0
    configured: int | None = None  # service.max_output_bytes

    def describe(self) -> str:
        parts = []
        if self.broker is not None:
            parts.append(f"broker message.max.bytes {self.broker:,}")
        if self.topics:
            low = min(self.topics.items(), key=lambda kv: kv[1])
            parts.append(f"max.message.bytes {low[1]:,} of {low[0]}, the lowest of the service's topics")
        elif self.broker is None:
            parts.append(f"the broker reports no limit: Kafka's default {FALLBACK_MESSAGE_MAX_BYTES:,}")
        parts.append(f"kafka.max_request_size {self.max_request_size:,}")
        if self.configured is not None:
            parts.append(f"service.max_output_bytes {self.configured:,}")
        return f"{self.bytes:,} bytes ({', '.join(parts)})"


def _int_value(entry: Any) -> int | None:
    """The integer value of one DescribeConfigs entry (a dict as kafka-python returns it), or None."""
    value = entry.get("value", entry.get("config_value")) if isinstance(entry, Mapping) else entry
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def broker_message_limits(admin: KafkaAdminClient, topics: Sequence[str]) -> tuple[int | None, dict[str, int]]:
    """(the broker's ``message.max.bytes``, topic -> ``max.message.bytes``) as the broker reports them; what it
    does not report is missing (None, or absent from the dict).  Only the topics are asked: a topic's effective
    ``max.message.bytes`` is the broker's ``message.max.bytes`` unless the topic sets its own, so the broker's value
    is None here.  Raises ``KafkaError``/``OSError`` when the broker does not answer; a broker that does not support
    the request is treated as reporting nothing."""
    broker: int | None = None  # (a topic's max.message.bytes is the broker's message.max.bytes unless set for it)
    limits: dict[str, int] = {}
    try:  # (no DescribeCluster: Tansu 0.6 closes the connection on it)
        if topics:
            res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None})
                                          for t in topics], config_filter="all")
            for t, cfg in res.get("topic", {}).items():
                v = _int_value(cfg.get("max.message.bytes"))
                if v is not None:
                    limits[str(t)] = v
    except (NotImplementedError, ValueError, TypeError, AttributeError) as e:  # no such request / odd answer
        log.info("the broker's message size limits are not readable (%r): using Kafka's default", e)
    return broker, limits


def output_bound(*, broker: int | None, topics: Mapping[str, int], max_request_size: int,
                 configured: int | None = None) -> MessageBound:
    """The bound of the module docstring."""
    known = [*([] if broker is None else [broker]), *topics.values()]
    candidates = [*(known or [FALLBACK_MESSAGE_MAX_BYTES]), max_request_size]
    if configured is not None:
        candidates.append(configured)
    return MessageBound(min(candidates), broker, dict(topics), max_request_size, configured)


def read_output_bound(admin: KafkaAdminClient, topics: Sequence[str], *, max_request_size: int,
                      configured: int | None = None) -> MessageBound:
    """:func:`output_bound` of what the broker reports (:func:`broker_message_limits`)."""
    try:
        broker, limits = broker_message_limits(admin, topics)
    except KafkaError as e:  # an old broker or one that refuses the request: Kafka's default
        log.info("the broker's message size limits are not readable (%r): using Kafka's default", e)
        broker, limits = None, {}
    return output_bound(broker=broker, topics=limits, max_request_size=max_request_size, configured=configured)
