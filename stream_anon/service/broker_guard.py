"""Detects a broker that lost its data, so that the main path stops instead of publishing over it (issue 12).

A Kafka-compatible broker can come back empty: Tansu on memory storage loses every topic, record, committed
offset and producer id on a restart, and the clients' own metadata requests recreate the topics with 4
partitions under new topic ids (docs/tansu.md, "Findings").  A service that went on would consume the new
records from its old positions (skipping some), re-publish outputs at positions of new records and write
ledger checkpoints that no longer match the input.  The signals, each cheap:

* **topic identity** (:func:`compare_topics`): a topic's id (KIP-516) or partition count differs from what the
  service saw at start, or the topic is gone (one metadata request without auto-creation for the input, the
  ledger and the output topics: :meth:`BrokerGuard.check_topics`);
* **offsets that went backwards** (:class:`OffsetFloors`): a partition's highwater below an offset this service
  committed (input) or had acknowledged (ledger): records the broker once had are gone.  Highwaters come from
  fetches (``highwater()``), never from ``end_offsets()`` (wrong on Tansu).

On any of them :class:`BrokerDataLossError` is raised; ``stream-anon run`` logs it in one line and exits with
code 4 (:data:`EXIT_DATA_LOSS`), abandoning what its producers still hold.  What the operator does then is in
docs/service.md ("A broker that lost its data").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError

from stream_anon.config.settings import Config
from stream_anon.kafka_io.clients import client_options, cluster_brokers
from stream_anon.kafka_io.lifecycle import LOOP_REQUEST_TIMEOUT_MS

log = logging.getLogger(__name__)

EXIT_DATA_LOSS = 4
"""Exit code of ``stream-anon run`` when the broker lost data the service had committed or acknowledged."""
GUARD_REQUEST_TIMEOUT_MS = LOOP_REQUEST_TIMEOUT_MS
"""Longest one metadata request of the check (and a new admin client's bootstrap) may take: a stalled broker must
not hold the loop longer."""
UNKNOWN_TOPIC = 3  # Kafka error code UNKNOWN_TOPIC_OR_PARTITION


HIGHWATER_CONFIRM_SECONDS = 10.0
"""The default of ``service.loss_confirm_seconds``: an end below a floor is a loss only when fresh reads still
show it this long after the first (and at least once more): on a replicated Apache Kafka cluster a newly elected
leader's highwater can lag behind what the old leader had acknowledged for a moment, until its followers fetch from
it (seen on three nodes under load: 1,263 after offset 1,264 was acknowledged, a false exit 4; 2,348 after 25,200
in the leader-kill probe; docs/tansu.md)."""


class BrokerDataLossError(RuntimeError):
    """The broker no longer has data this service committed or acknowledged (the message says which signal)."""


@dataclass(frozen=True)
class TopicState:
    """What the broker's metadata says of one topic: its id (None if the broker reports none) and partitions."""

    topic_id: str | None
    partitions: int


def compare_topics(before: Mapping[str, TopicState], now: Mapping[str, TopicState | None]) -> list[str]:
    """What changed between two metadata views of the same topics: one line per topic that is gone, has a new
    topic id (recreated) or another partition count.  A topic missing from ``now`` is not checked."""
    return [line for _topic, line in topic_changes(before, now)]


def topic_changes(before: Mapping[str, TopicState], now: Mapping[str, TopicState | None]) -> list[tuple[str, str]]:
    """(topic, what changed) for every topic of :func:`compare_topics`."""
    problems = []
    for topic, old in sorted(before.items()):
        if topic not in now:
            continue
        new = now[topic]
        if new is None:
            problems.append((topic, f"topic {topic} is gone"))
        elif old.topic_id is not None and new.topic_id is not None and new.topic_id != old.topic_id:
            problems.append((topic, f"topic {topic} was recreated (topic id {old.topic_id} -> {new.topic_id}, "
                                    f"{old.partitions} -> {new.partitions} partitions)"))
        elif new.partitions != old.partitions:
            problems.append((topic, f"topic {topic} has {new.partitions} partitions, {old.partitions} at start"))
    return problems


class OffsetFloors:
    """Per topic partition the lowest end offset a broker that kept its data can report: the highest offset
    this service committed (input) or saw acknowledged + 1 (ledger).  End offsets never decrease."""

    def __init__(self) -> None:
        self._floor: dict[tuple[str, int], tuple[int, str]] = {}

    def raise_to(self, topic: str, partition: int, offset: int, what: str) -> None:
        """Record that ``topic[partition]`` had at least ``offset`` records (``what`` says how we know)."""
        old = self._floor.get((topic, partition))
        if old is None or offset > old[0]:
            self._floor[(topic, partition)] = (offset, what)

    def floor(self, topic: str, partition: int) -> int | None:
        f = self._floor.get((topic, partition))
        return None if f is None else f[0]

    def check(self, topic: str, partition: int, highwater: int | None) -> str | None:
        """One line if ``highwater`` (from a fetch) is below the floor, else None."""
        f = self._floor.get((topic, partition))
        if f is None or highwater is None or highwater >= f[0]:
            return None
        return (f"{topic}[{partition}] ends at offset {highwater}, below offset {f[0]} this service {f[1]}: "
                f"records the broker had are gone")


class BrokerGuard:
    """The topic-identity check of one service process: :meth:`start` records the topics' ids and partition
    counts, :meth:`check_topics` compares the broker's current view with them (raising
    :class:`BrokerDataLossError`).  The offsets' floors are in :attr:`floors` (checked by the caller, which has
    the highwaters)."""

    def __init__(self, cfg: Config, topics: Sequence[str],
                 admin_factory: Callable[[], KafkaAdminClient] | None = None) -> None:
        self.cfg = cfg
        self.topics = list(dict.fromkeys(topics))
        self._admin_factory = admin_factory or self._make_admin
        self._admin: KafkaAdminClient | None = None
        self.baseline: dict[str, TopicState] = {}
        self.floors = OffsetFloors()
        self.unwritten_outputs: frozenset[str] = frozenset()  # output topics a change of which may be no loss...
        self.unwritten: Callable[[str], bool] = lambda topic: False  # ...when this says nothing was written to them

    def _make_admin(self) -> KafkaAdminClient:
        opts: dict[str, Any] = {**client_options(self.cfg.kafka),
                                "request_timeout_ms": min(self.cfg.kafka.request_timeout_ms, GUARD_REQUEST_TIMEOUT_MS)}
        return KafkaAdminClient(**opts, bootstrap_timeout_ms=min(self.cfg.kafka.connect_timeout_ms,
                                                                 GUARD_REQUEST_TIMEOUT_MS))

    def describe(self) -> dict[str, TopicState | None]:
        """The broker's current view of the topics (None: the topic does not exist); raises ``KafkaError`` or
        ``OSError`` when the broker does not answer."""
        if self._admin is None:
            self._admin = self._admin_factory()
        out: dict[str, TopicState | None] = {}
        for d in self._admin.describe_topics(self.topics):
            name = str(d.get("name", d.get("topic")))
            if d.get("error_code", 0) == UNKNOWN_TOPIC or not d.get("partitions"):
                out[name] = None
            else:
                tid = d.get("topic_id")
                out[name] = TopicState(None if tid is None else str(tid), len(d["partitions"]))
        return out

    def start(self) -> None:
        """Record the topics' ids and partition counts (the service just made sure they exist)."""
        now = self.describe()
        self.baseline = {t: s for t, s in now.items() if s is not None}
        log.info("broker guard: %s", ", ".join(f"{t} (id {s.topic_id}, {s.partitions} partitions)"
                                               for t, s in sorted(self.baseline.items())))

    def check_topics(self) -> KafkaError | OSError | None:
        """Compare the broker's view with the start; raise :class:`BrokerDataLossError` on a change.  Returns the
        error when the broker did not answer (nothing checked: an outage is not a loss), else None.

        An output topic this service never wrote to (:attr:`unwritten`: e.g. a dead-letter topic with no dead
        letter yet) that is gone or was recreated with its partition count lost nothing: it is created again
        (when ``topics.create``) or taken as it now is, with one WARNING line, instead of ending the run."""
        try:
            now = self.describe()
        except (KafkaError, OSError) as e:
            log.debug("broker guard: metadata request failed: %r", e)
            self.close()  # a fresh client next time
            return e
        changes = topic_changes(self.baseline, now)
        takeable = [(t, line) for t, line in changes if t in self.unwritten_outputs and self.unwritten(t)
                    and (now[t] is None or now[t].partitions == self.baseline[t].partitions)]  # type: ignore[union-attr]
        if len(takeable) < len(changes):  # anything else changed too: a broker that lost data, create nothing on it
            raise BrokerDataLossError("; ".join(line for _t, line in changes))
        problems = [line for t, line in takeable if not self._take_empty(t, now[t], line)]
        if problems:
            raise BrokerDataLossError("; ".join(problems))
        return None

    def _take_empty(self, topic: str, state: TopicState | None, change: str) -> bool:
        """An unwritten output topic changed: take the new one (or create it again); False: it cannot be taken
        (another partition count, or gone with ``topics.create`` false)."""
        old = self.baseline[topic]
        if state is not None and state.partitions == old.partitions:
            self.baseline[topic] = state
            log.warning("broker guard: %s; this service had written nothing to it: nothing is lost, going on with the "
                        "new topic", change)
            return True
        if state is None and self.cfg.topics.create and self._admin is not None:
            try:
                layout = self.cfg.topics.layout()  # as created at start: replication, min ISR, the ledger compacted
                replication = layout.replication(cluster_brokers(self._admin))
                self._admin.create_topics([NewTopic(topic, old.partitions, replication,
                                                    topic_configs=layout.topic_config(topic, replication))])
            except (KafkaError, OSError) as e:  # e.g. still being deleted (Apache Kafka deletes asynchronously)
                log.warning("broker guard: %s; this service had written nothing to it: creating it again failed (%r), "
                            "trying again at the next check", change, e)
                return True
            log.warning("broker guard: %s; this service had written nothing to it: created it again (%d partitions), "
                        "nothing is lost", change, old.partitions)
            return True  # (its new id becomes the baseline at the next check: "recreated", unwritten, same count)
        return False

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except (KafkaError, OSError) as e:
                log.debug("broker guard: close failed: %r", e)
