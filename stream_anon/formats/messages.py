"""What the Kafka layer produces: :class:`OutputMessage` (one message to one topic, from one input partition),
:class:`Delivery` (where an acknowledged message was stored) and the header name the side paths set (pure: no
Kafka).

The main path's outputs carry no headers (docs/threat-model.md); the side paths mark each message with its kind
(:data:`H_KIND`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

H_KIND = "kind"
"""Header of every side-path output: what it is (``krr``, ``rs``, ``blap``, ``estimates``, ``kmeans``)."""

MESSAGE_FRAMING_BYTES = 512
"""What a broker counts on top of a message's key and value against its ``message.max.bytes`` (the record batch
header, 61 bytes, the record's own varints and attributes, headers), with room to spare: a message of key + value +
this many bytes fits a bound of that size (:func:`message_size`)."""


def message_size(key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()) -> int:
    """The bytes a single-message record batch of this message takes at most, to compare with a broker's
    ``message.max.bytes``: key + value + headers + :data:`MESSAGE_FRAMING_BYTES`."""
    return (len(key or b"") + len(value or b"") + sum(len(k.encode("utf-8", "surrogatepass")) + len(v)
                                                      for k, v in headers) + MESSAGE_FRAMING_BYTES)


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


class Receipt(Protocol):
    """What a send returns (:class:`~stream_anon.kafka_io.producer.Receipt`): whether every message is
    acknowledged, and where each was stored (``ValueError`` while one is not)."""

    @property
    def acknowledged(self) -> bool: ...

    def deliveries(self) -> list[Delivery]: ...
