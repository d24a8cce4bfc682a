"""Where the side paths' write-ahead lives (Kafka I/O of :mod:`stream_anon.side.outbox`): the internal compacted topic
``<input>.side-outbox`` (1 partition, ``cleanup.policy=compact``, created like the budget topic) and its **read
mark**, the committed offset of the group ``stream-anon-side-outbox.<input>`` on that partition (no member ever
joins it): every entry below it is complete, so a start reads the outbox from there, not from its beginning (on a
broker that does not compact, Tansu, the partition keeps every entry and tombstone it was ever sent).

The topic is INTERNAL (docs/threat-model.md): its entries hold the exact bytes of the side copies with the
positions (side partition end offsets) they were written at.
"""

from __future__ import annotations

from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import KafkaError, NoError
from kafka.structs import OffsetAndMetadata

from stream_anon.config.settings import Config
from stream_anon.kafka_io.reader import PartitionReader, RawRecord
from stream_anon.side.budget_store import ensure_state_topic

READ_CHUNK = 2000
"""Offsets per read of the outbox partition (a chunk of the write-ahead is up to the output bound)."""


def outbox_topic(input_topic: str) -> str:
    """The internal write-ahead topic of the side paths of ``input_topic``: ``<input>.side-outbox``."""
    return f"{input_topic}.side-outbox"


def read_mark_group(input_topic: str) -> str:
    """The consumer group whose committed offset on the outbox partition is its read mark."""
    return f"stream-anon-side-outbox.{input_topic}"


class OutboxTopic:
    """The outbox topic of ``input_topic`` (module docstring)."""

    def __init__(self, cfg: Config, input_topic: str) -> None:
        self.cfg = cfg
        self.input_topic = input_topic
        self.topic = outbox_topic(input_topic)

    def ensure(self, admin: KafkaAdminClient) -> None:
        """Create the topic when missing (``topics.create``); an existing one must have exactly 1 partition."""
        ensure_state_topic(admin, self.cfg, self.topic, "outbox", f"the topic {self.topic!r}")

    def read_mark(self, admin: KafkaAdminClient) -> int | None:
        """The committed read mark (None: none yet: read from the beginning)."""
        tp = TopicPartition(self.topic, 0)
        group = read_mark_group(self.input_topic)
        committed = admin.list_group_offsets({group: [tp]}).get(group, {}).get(tp)
        return None if committed is None or committed.offset is None or committed.offset < 0 else int(committed.offset)

    def write_mark(self, admin: KafkaAdminClient, offset: int) -> None:
        """Commit ``offset`` as the read mark (raises ``KafkaError`` when the broker refuses it)."""
        tp = TopicPartition(self.topic, 0)
        result = admin.alter_group_offsets(read_mark_group(self.input_topic), {tp: OffsetAndMetadata(
            offset, "stream-anon side-path outbox read mark", -1)})
        error = result.get(tp)
        if isinstance(error, type) and issubclass(error, KafkaError) and error is not NoError:
            raise error(f"the outbox read mark of {self.topic!r} was not committed")

    def load(self, reader: PartitionReader, start: int | None) -> tuple[list[RawRecord], int]:
        """(offset, key, value) of the outbox partition from ``start`` (None: its beginning) to its end, and the
        end."""
        return reader.read_forward_records(self.topic, 0, start, READ_CHUNK)
