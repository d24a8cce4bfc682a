"""Where the side paths persist their cumulative budgets: an internal compacted topic (Kafka I/O only).

The topic (``side_paths.budget_topic``, default ``<input>.side-budget``) has one partition and
``cleanup.policy=compact``; each state record's key names what it holds (:mod:`stream_anon.side.budgets`), so
compaction keeps the latest value of each key.  :meth:`BudgetTopic.put` produces the records and waits until the
broker acknowledged them (and everything sent before them); :meth:`BudgetTopic.load` reads the partition from its
beginning to its high watermark and keeps the last value per key.  On a broker that does not compact (Tansu) the
partition keeps every version and ``load`` reads them all: the start-up time then grows with the history (about
16 bytes per changed counter of the per-person sketch, nothing per record otherwise).

The topic is INTERNAL (docs/threat-model.md): the lifetime-cap sketch's state holds its secret hash key.

The budget's **anchor** lives outside that topic (:mod:`stream_anon.side.budgets`): the committed offset of the
consumer group :func:`~stream_anon.side.budgets.anchor_group` on the input's partition 0, read with
:func:`read_anchor` and written with :func:`write_anchor` (``OffsetCommit`` through the admin client: no member ever
joins that group).  :func:`side_outputs_found` tells a first start from a budget that vanished when there is
neither a state nor an anchor: the side topics that spend (copies, k-means) must be empty.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, NoError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from stream_anon.config.settings import Config
from stream_anon.formats.messages import OutputMessage
from stream_anon.kafka_io.clients import client_options, cluster_brokers, fetch_limits
from stream_anon.kafka_io.producer import OutputProducer
from stream_anon.kafka_io.reader import position_before, records_max_wait_ms
from stream_anon.kafka_io.settings import COMPACTED_TOPIC_CONFIG
from stream_anon.side.budgets import BudgetAnchor, anchor_group

log = logging.getLogger(__name__)

KIND = "side-budget"


class BudgetTopicError(RuntimeError):
    """The budget topic exists in a shape the side paths cannot use (the message names the topic; not a
    ``ValueError``: retrying cannot help)."""


class BudgetStore(Protocol):
    """Where the budget state records go: the latest value per key survives."""

    def describe(self) -> str: ...

    def load(self) -> dict[str, bytes]: ...

    def put(self, producer: OutputProducer, records: Mapping[str, bytes]) -> None: ...


class BudgetTopic:
    """The compacted state topic of the side paths' budgets (see the module docstring)."""

    def __init__(self, cfg: Config, topic: str) -> None:
        self.cfg = cfg
        self.topic = topic

    def describe(self) -> str:
        return f"topic {self.topic!r}"

    def ensure(self, admin: KafkaAdminClient) -> None:
        """Create the topic (1 partition, compacted) when it is missing and ``topics.create`` is on; an existing
        topic must have exactly one partition (:class:`BudgetTopicError` otherwise: the state is read from and
        written to partition 0 only)."""
        ensure_state_topic(admin, self.cfg, self.topic, "budget", "side_paths.budget_topic")

    def load(self, timeout_s: float = 60.0) -> dict[str, bytes]:
        """key -> latest value (tombstones drop their key) of the whole partition."""
        consumer = KafkaConsumer(**client_options(self.cfg.kafka), group_id=None, enable_auto_commit=False,
                                 auto_offset_reset="earliest", fetch_max_wait_ms=records_max_wait_ms(self.cfg.kafka),
                                 **fetch_limits(self.cfg.kafka, partition_bytes=4 * 1048576))
        tp = TopicPartition(self.topic, 0)
        out: dict[str, bytes] = {}
        try:
            consumer.assign([tp])
            begin = int(consumer.beginning_offsets([tp])[tp] or 0)
            consumer.seek(tp, begin)
            deadline = time.monotonic() + timeout_s
            # (Tansu: end_offsets() is wrong; the highwater comes with a fetch)
            while (highwater := consumer.highwater(tp)) is None:
                for r in consumer.poll(timeout_ms=200).get(tp, []):
                    self._take(out, r.key, r.value)
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(f"{self.describe()}: no fetch response within {timeout_s:g} s")
            end = int(highwater)
            while position_before(consumer, tp, end):
                for r in consumer.poll(timeout_ms=500).get(tp, []):
                    if r.offset < end:
                        self._take(out, r.key, r.value)
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(f"{self.describe()}: read stalled at offset {consumer.position(tp)} of "
                                            f"{end} after {timeout_s:g} s")
        finally:
            consumer.close()
        return out

    @staticmethod
    def _take(out: dict[str, bytes], key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        k = key.decode("utf-8", "backslashreplace")
        if value is None:
            out.pop(k, None)
        else:
            out[k] = value

    def put(self, producer: OutputProducer, records: Mapping[str, bytes]) -> None:
        """Produce ``records`` and wait until they (and everything sent before) are acknowledged."""
        if not records:
            return
        producer.send([OutputMessage(KIND, self.topic, 0, key.encode(), value) for key, value in records.items()])
        producer.flush()


def ensure_state_topic(admin: KafkaAdminClient, cfg: Config, topic: str, what: str, option: str) -> None:
    """Create the internal state topic ``topic`` of the side paths (1 partition, ``cleanup.policy=compact``) when it
    is missing and ``topics.create`` is on; an existing one must have exactly one partition (:class:`BudgetTopicError`
    naming ``what`` and ``option`` otherwise)."""
    if topic in set(admin.list_topics()):
        for desc in admin.describe_topics([topic]):
            n = len(desc.get("partitions") or ())
            if n != 1:
                raise BudgetTopicError(f"{what} topic {topic!r} has {n} partitions; the side paths' {what} state "
                                       f"needs a topic of exactly 1 ({option})")
        return
    if not cfg.topics.create:
        log.warning("side paths: %s topic %s does not exist and topics.create is false", what, topic)
        return
    try:
        layout = cfg.topics.layout()  # replicated as the service's other topics (the cluster's brokers, up to 3)
        replication = layout.replication(cluster_brokers(admin))
        admin.create_topics([NewTopic(topic, 1, replication, topic_configs={
            **COMPACTED_TOPIC_CONFIG, **layout.replication_config(replication)})])
        log.info("created the side paths' %s topic %s (1 partition, cleanup.policy=compact)", what, topic)
    except TopicAlreadyExistsError:
        pass


def read_anchor(admin: KafkaAdminClient, input_topic: str) -> BudgetAnchor | None:
    """The budget anchor of ``input_topic`` (None: the anchor group has no committed offset there)."""
    tp = TopicPartition(input_topic, 0)
    group = anchor_group(input_topic)
    found = admin.list_group_offsets({group: [tp]}).get(group, {})
    committed = found.get(tp)
    return BudgetAnchor.from_offset(None if committed is None else int(committed.offset))


def write_anchor(admin: KafkaAdminClient, input_topic: str, anchor: BudgetAnchor) -> None:
    """Commit ``anchor`` as the anchor group's offset on ``input_topic``'s partition 0 (raises ``KafkaError`` when
    the broker refuses it).  The metadata names it for whoever lists the group's offsets (Apache Kafka keeps it;
    Tansu drops it)."""
    tp = TopicPartition(input_topic, 0)
    result = admin.alter_group_offsets(anchor_group(input_topic), {tp: OffsetAndMetadata(
        anchor.offset, f"stream-anon side-path budget anchor: {anchor}", -1)})
    error = result.get(tp)
    if isinstance(error, type) and issubclass(error, KafkaError) and error is not NoError:
        raise error(f"the budget anchor of {input_topic!r} was not committed")


ANCHOR_WARNING_EVERY_SECONDS = 60.0
"""A budget anchor the broker does not take is tried again at every flush (each poll of an idle input, 5 a second):
its WARNING comes at the first failure, then at most this often, with the count of failed tries."""


class AnchorWriter:
    """Commits the budget's anchors (:func:`write_anchor`) for the side app: a refusal is logged at the first failure,
    then at most once every :data:`ANCHOR_WARNING_EVERY_SECONDS` with the count of failed tries (the app tries again
    at every flush), and the commit that follows failures is logged once.  ``clock``: seconds (monotonic)."""

    def __init__(self, input_topic: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.input_topic = input_topic
        self.clock = clock
        self.failures = 0  # failed tries since the last commit
        self._warned_at = float("-inf")

    def write(self, admin: KafkaAdminClient, anchor: BudgetAnchor) -> bool:
        """Commit ``anchor``; False when the broker refused it (logged as above)."""
        try:
            write_anchor(admin, self.input_topic, anchor)
        except (KafkaError, OSError) as e:
            self.failures += 1
            now = self.clock()
            if self.failures == 1 or now - self._warned_at >= ANCHOR_WARNING_EVERY_SECONDS:
                self._warned_at = now
                log.warning("side paths: the budget anchor (%s) was not committed (%r); tried again at every flush "
                            "(%d failed tries so far; this line at most once every %.0f s)", anchor, e,
                            self.failures, ANCHOR_WARNING_EVERY_SECONDS)
            return False
        if self.failures:
            log.info("side paths: the budget anchor (%s) is committed, after %d failed tries", anchor, self.failures)
            self.failures = 0
        return True


def side_outputs_found(cfg: Config, topics: Sequence[str], timeout_s: float = 10.0) -> str | None:
    """The first of ``topics`` that holds a message (``"topic 'x' holds messages"``), or None when all are empty or
    missing.  Reads from each partition's beginning (Tansu's ListOffsets is not reliable: a fetch is)."""
    consumer = KafkaConsumer(**client_options(cfg.kafka), group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=20)
    try:
        existing = set(consumer.topics())
        tps = [TopicPartition(t, p) for t in topics if t in existing for p in (consumer.partitions_for_topic(t) or ())]
        if not tps:
            return None
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while True:
            for tp, recs in consumer.poll(timeout_ms=200).items():
                if recs:
                    return f"side topic {tp.topic!r} holds messages"
            if all(consumer.highwater(tp) is not None for tp in tps):
                for tp in tps:
                    if int(consumer.highwater(tp) or 0) > int(consumer.position(tp) or 0):
                        return f"side topic {tp.topic!r} holds messages"
                return None
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"side topics {sorted({tp.topic for tp in tps})}: no fetch answer within "
                                        f"{timeout_s:g} s")
    finally:
        consumer.close()
