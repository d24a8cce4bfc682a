"""Where the side paths' write-ahead lives (Kafka I/O of :mod:`stream_anon.side.outbox`): the internal compacted topic
``<input>.side-outbox`` (1 partition, ``cleanup.policy=compact``, created like the budget topic) and its **read
mark**, the committed offset of the group ``stream-anon-side-outbox.<input>`` on that partition (no member ever
joins it): every entry below it is complete, so a start reads the outbox from there, not from its beginning (on a
broker that does not compact, Tansu, the partition keeps every entry and tombstone it was ever sent).

The topic is INTERNAL (docs/threat-model.md): its entries hold the exact bytes of the side copies with the
positions (side partition end offsets) they were written at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import KafkaError, NoError
from kafka.structs import OffsetAndMetadata

from stream_anon.config.settings import Config
from stream_anon.kafka_io.clients import retry
from stream_anon.kafka_io.producer import OutputProducer
from stream_anon.kafka_io.reader import PartitionReader, RawRecord
from stream_anon.side.budget_store import ensure_state_topic
from stream_anon.side.outbox import RecoveryReport, SideOutbox, Where

log = logging.getLogger(__name__)

READ_CHUNK = 2000
"""Offsets per read of the outbox partition (a chunk of the write-ahead is up to the output bound)."""
READ_MARK_SECONDS = 10.0
"""The read mark is committed at most this often while running (and after the start's recovery)."""


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
        self.committed_mark: int | None = None  # the read mark as last committed by this member
        self._next_mark = 0.0

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

    def move_mark(self, admin: KafkaAdminClient, mark: int | None, *, force: bool = False) -> None:
        """Commit ``mark`` when it moved, at most every ``READ_MARK_SECONDS`` unless ``force``; a refusal is a
        WARNING (the next start reads a little more)."""
        if mark is None or mark == self.committed_mark:
            return
        now = time.monotonic()
        if not force and now < self._next_mark:
            return
        self._next_mark = now + READ_MARK_SECONDS
        try:
            self.write_mark(admin, mark)
        except (KafkaError, OSError) as e:
            log.warning("side paths: the outbox read mark (%d) was not committed (%r); tried again later", mark, e)
            return
        self.committed_mark = mark

    def recover(self, outbox: SideOutbox, producer: OutputProducer, *, mark: int | None,
                side_partitions: Sequence[Where], stop: Callable[[], bool]) -> RecoveryReport:
        """At start, before anything is consumed: complete the entries the last run left (:meth:`SideOutbox.recover
        <stream_anon.side.outbox.SideOutbox.recover>`, from ``mark``; a failed attempt is retried once its re-sends
        are acknowledged), then read the end of every side partition (the outbox's exact ends)."""
        k = self.cfg.kafka
        reader = PartitionReader(k, stop=stop)
        outbox_end: list[int] = [0]

        def attempt() -> RecoveryReport:
            producer.flush()  # a failed attempt's re-sends are stored before the side partitions are read again
            records, outbox_end[0] = self.load(reader, mark)
            return outbox.recover(records, reader, producer)

        def side_ends() -> dict[Where, int]:
            return {(t, p): reader.bounds(t, p)[1] for t, p in side_partitions}

        try:
            rep = retry("recover the side outbox", attempt, k, stop=stop)
            outbox.ends.update(retry("read the side partitions' ends", side_ends, k, stop=stop))
        finally:
            reader.close()
        if rep.entries or rep.dropped:
            log.warning("side paths: outbox %s: %s", self.topic, rep.line())
        else:
            log.info("side paths: outbox %s: nothing pending from the last run (read from offset %s to %d, %.2f s)",
                     self.topic, mark if mark is not None else "0", outbox_end[0], rep.seconds)
        outbox.acked_end = outbox_end[0]
        return rep
