"""What the Kafka layer produces: :class:`OutputMessage` (one message to one topic, from one input partition),
:class:`Delivery` (where an acknowledged message was stored) and the header name the side paths set (pure: no
Kafka).

The main path's outputs carry no headers (docs/threat-model.md); the side paths mark each message with its kind
(:data:`H_KIND`).
"""

from __future__ import annotations

from dataclasses import dataclass

H_KIND = "kind"
"""Header of every side-path output: what it is (``krr``, ``rs``, ``blap``, ``estimates``, ``kmeans``)."""


@dataclass(frozen=True)
class OutputMessage:
    """One message to produce: ``kind`` names what it is (``ledger``, ``anon``, ``suppressed``, ``dlq``, or a side
    path's kind), ``topic``, the input partition it derives from (output partition = that mod the topic's
    partitions), key, value (None: a tombstone), headers and Kafka timestamp (``timestamp_ms``, None: the
    producer's send time)."""

    kind: str
    topic: str
    src_partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Delivery:
    """Where an acknowledged message was stored."""

    topic: str
    partition: int
    offset: int
