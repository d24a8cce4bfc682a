"""The side paths' write-ahead (stream_anon/side/outbox.py) against a simulated broker (lists in, lists out): a
process that dies at every point of write-ahead / send / acknowledgement / tombstone (and of the next start's
recovery), with none, all, a prefix or a random per-partition prefix of what was in flight landing, leaves after the
next start every record with a copy on every side topic or on none, and no copy twice; chunk encoding round trips
under the output bound; identical copies (no pseudonyms) are matched as a multiset."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pytest

from stream_anon.formats.messages import MESSAGE_FRAMING_BYTES, Delivery, OutputMessage
from stream_anon.side.outbox import (
    CopyGroup,
    OutboxEntry,
    OutboxFormatError,
    SideOutbox,
    decode_chunk,
    missing_messages,
    pending_entries,
)

INPUT = "adult.raw"
OUTBOX = "adult.raw.side-outbox"
SIDE = ("adult.krr", "adult.rs", "adult.blap")
ESTIMATES = "adult.estimates"
PARTITIONS = 2
BOUND = 1600  # small: most entries go to the outbox in several chunks
KIND = (("kind", b"x"),)


STATS: Counter[str] = Counter()


class Crash(BaseException):
    """The process dies here (no ``except Exception`` can swallow it)."""


@dataclass
class SimBroker:
    """Append-only logs per (topic, partition) of (key, value, timestamp); the outbox read mark; the committed
    input position (windows consumed: committed before they are perturbed, as the side paths do)."""

    logs: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, int | None]]] = field(default_factory=dict)
    mark: int | None = None
    committed: int = 0

    def log(self, topic: str, partition: int) -> list[tuple[bytes | None, bytes | None, int | None]]:
        return self.logs.setdefault((topic, partition), [])

    def store(self, topic: str, partition: int, key: bytes | None, value: bytes | None, ts: int | None) -> int:
        log = self.log(topic, partition)
        log.append((key, value, ts))
        return len(log) - 1


class CrashPlan:
    def __init__(self, at: int | None) -> None:
        self.at = at
        self.count = 0
        self.names: list[str] = []

    def point(self, name: str) -> None:
        self.names.append(name)
        if self.at is not None and self.count == self.at:
            self.count += 1
            raise Crash(name)
        self.count += 1


class SimReceipt:
    def __init__(self, n: int) -> None:
        self.stored: list[Delivery | None] = [None] * n

    @property
    def acknowledged(self) -> bool:
        return all(d is not None for d in self.stored)

    def deliveries(self) -> list[Delivery]:
        if not self.acknowledged:
            raise ValueError("not acknowledged yet")
        return [d for d in self.stored if d is not None]


@dataclass
class InFlight:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    ts: int | None
    receipt: SimReceipt
    index: int


class SimProducer:
    """Sends stay in flight until ``flush`` stores them (in order) and acknowledges them; each send and each
    flush is a crash point named after what it carries."""

    def __init__(self, broker: SimBroker, crash: CrashPlan, phase: str) -> None:
        self.broker = broker
        self.crash = crash
        self.phase = phase
        self.in_flight: list[InFlight] = []

    def _what(self, topic: str, value: bytes | None) -> str:
        if topic == OUTBOX:
            return f"{self.phase}-tombstones" if value is None else f"{self.phase}-entry"
        return f"{self.phase}-copies"

    def partition_for(self, topic: str, src_partition: int) -> int:
        return src_partition % PARTITIONS

    def send(self, messages: Iterable[OutputMessage]) -> SimReceipt:
        msgs = list(messages)
        r = SimReceipt(len(msgs))
        for i, m in enumerate(msgs):
            self.in_flight.append(InFlight(m.topic, self.partition_for(m.topic, m.src_partition), m.key, m.value,
                                           m.timestamp_ms, r, i))
            if m.topic == OUTBOX and m.value is not None and i < len(msgs) - 1:
                self.crash.point(f"{self.phase}-between-chunks")
        if msgs:
            self.crash.point(self._what(msgs[0].topic, msgs[0].value) + "-sent")
        return r

    def send_values(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]], *, timestamp_ms: int | None = None) -> SimReceipt:
        r = SimReceipt(len(values))
        p = self.partition_for(topic, src_partition)
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.in_flight.append(InFlight(topic, p, k, v, timestamp_ms, r, i))
        if values:
            self.crash.point(f"{self._what(topic, values[0])}-sent")
        return r

    def flush(self) -> int:
        mine, self.in_flight = self.in_flight, []
        kinds = set()
        for m in mine:
            off = self.broker.store(m.topic, m.partition, m.key, m.value, m.ts)
            m.receipt.stored[m.index] = Delivery(m.topic, m.partition, off)
            kinds.add(self._what(m.topic, m.value))
        for k in sorted(kinds):
            self.crash.point(f"{k}-acked")
        return len(mine)

    def land(self, how: str, rng: random.Random) -> None:
        """The process died: the broker stores none, all, the first half, or a random prefix of each partition's
        share of what was in flight (a stop purges each partition's queue where its socket left it)."""
        msgs, self.in_flight = self.in_flight, []
        if how == "all":
            keep = msgs
        elif how == "half":
            keep = msgs[: len(msgs) // 2]
        elif how == "per-partition":
            by: dict[tuple[str, int], list[InFlight]] = {}
            for m in msgs:
                by.setdefault((m.topic, m.partition), []).append(m)
            cut = {w: rng.randint(0, len(v)) for w, v in by.items()}
            seen: Counter[tuple[str, int]] = Counter()
            keep = []
            for m in msgs:
                w = (m.topic, m.partition)
                if seen[w] < cut[w]:
                    keep.append(m)
                seen[w] += 1
        else:
            keep = []
        for m in keep:
            self.broker.store(m.topic, m.partition, m.key, m.value, m.ts)


class SimReader:
    def __init__(self, broker: SimBroker, crash: CrashPlan, compact: bool) -> None:
        self.broker = broker
        self.crash = crash
        self.compact = compact

    def read_forward_records(self, topic: str, partition: int, start: int | None,
                             chunk: int) -> tuple[list[tuple[int, bytes | None, bytes | None]], int]:
        self.crash.point("recovery-read")
        log = self.broker.log(topic, partition)
        recs = [(i, k, v) for i, (k, v, _ts) in enumerate(log)]
        if self.compact and topic == OUTBOX:  # as compaction may leave it: latest per key, tombstones gone
            last = {k: i for i, k, _ in recs}
            recs = [r for r in recs if last[r[1]] == r[0] and r[2] is not None]
        lo = start or 0
        return [r for r in recs if r[0] >= lo], len(log)


@dataclass
class Window:
    """One released mixing window: ``ids`` records of input ``partition``, stamped ``ts``."""

    partition: int
    ids: list[str]
    ts: int


def make_windows(n: int, seed: int = 0) -> list[Window]:
    rng = random.Random(seed)
    out, nxt = [], 0
    for i in range(n):
        size = rng.randint(1, 9)
        out.append(Window(i % PARTITIONS, [f"r{nxt + j}" for j in range(size)], 1_700_000_000_000 + i))
        nxt += size
    return out


def groups_of(w: Window, pseudonyms: bool) -> list[CopyGroup]:
    out = []
    for topic in SIDE:
        ids = list(w.ids)
        random.Random(f"{topic}{w.ts}").shuffle(ids)  # each topic in its own order, as the mixer sends them
        if pseudonyms:
            keys: tuple[bytes | None, ...] = tuple(f"p-{i}".encode() for i in ids)
            values = tuple(f'{{"id":"p-{i}","t":"{topic}","pad":"{"x" * 90}"}}'.encode() for i in ids)
        else:  # no key, and copies that often have the same bytes (k-RR of few values)
            keys = (None,) * len(ids)
            values = tuple(f'{{"v":{int(i[1:]) % 3},"pad":"{"y" * 90}"}}'.encode() for i in ids)
        out.append(CopyGroup(topic, w.partition, w.ts, KIND, keys, values))
    if w.ts % 4 == 0:
        out.append(CopyGroup(ESTIMATES, 0, w.ts, KIND, (b"krr/age",), (f'{{"round":{w.ts}}}'.encode(),)))
    return out


def run_incarnation(broker: SimBroker, windows: Sequence[Window], plan: CrashPlan, *, landing: str, seed: int,
                    run: str, pseudonyms: bool, compact: bool) -> None:
    producer = SimProducer(broker, plan, "recovery")
    try:
        outbox = SideOutbox(OUTBOX, INPUT, bound=BOUND, run_id=run)
        reader = SimReader(broker, plan, compact)
        records, end = reader.read_forward_records(OUTBOX, 0, broker.mark, 100)
        rep = outbox.recover(records, reader, producer)
        STATS["entries"] += rep.entries
        STATS["resent"] += rep.resent
        STATS["found"] += rep.found
        STATS["dropped"] += rep.dropped
        outbox.ends = {(t, p): len(broker.log(t, p)) for t in (*SIDE, ESTIMATES) for p in range(PARTITIONS)}
        outbox.acked_end = end
        broker.mark = outbox.read_mark
        producer.phase = "running"
        while broker.committed < len(windows):
            w = windows[broker.committed]
            broker.committed += 1  # committed before it is perturbed (at most once)
            plan.point("committed")
            outbox.publish(producer, groups_of(w, pseudonyms))
            if broker.committed % 3 == 0:  # the periodic flush
                producer.flush()
                outbox.settle(producer)
                broker.mark = outbox.read_mark
        producer.flush()
        outbox.settle(producer)
        producer.flush()
    except Crash:
        producer.land(landing, random.Random(seed))
        raise


def complete_run(windows: Sequence[Window], crashes: Sequence[int | None], landing: str, *, pseudonyms: bool = True,
                 compact: bool = False, plans: list[CrashPlan] | None = None) -> SimBroker:
    broker = SimBroker()
    for i, at in enumerate([*crashes, None]):
        plan = CrashPlan(at)
        if plans is not None:
            plans.append(plan)
        try:
            run_incarnation(broker, windows, plan, landing=landing, seed=i + 7 * (at or 0), run=f"run{i}",
                            pseudonyms=pseudonyms, compact=compact)
        except Crash:
            continue
    return broker


def problems(broker: SimBroker, windows: Sequence[Window], pseudonyms: bool) -> list[str]:
    """Every record's copies on all side topics or on none, none twice, and no stranger on a side topic."""
    out = []
    if pseudonyms:
        per_topic = {t: Counter(k for p in range(PARTITIONS) for k, _, _ in broker.log(t, p)) for t in SIDE}
        for t, c in per_topic.items():
            out += [f"{t}: {k!r} published {n} times" for k, n in c.items() if n > 1]
        everything = {f"p-{i}".encode() for w in windows for i in w.ids}
        for t, c in per_topic.items():
            out += [f"{t}: unknown copy {k!r}" for k in c if k not in everything]
        for k in everything:
            where = [t for t in SIDE if per_topic[t][k]]
            if where and len(where) != len(SIDE):
                out.append(f"{k!r} only on {where}")
    else:  # per window (its timestamp): the window's multiset of copies on every topic, or nothing
        for w in windows:
            expected = {g.topic: Counter(g.values) for g in groups_of(w, False) if g.topic in SIDE}
            got = {t: Counter(v for k, v, ts in broker.log(t, w.partition) if ts == w.ts) for t in SIDE}
            if any(got[t] for t in SIDE) and got != expected:
                out.append(f"window {w.ts}: {({t: sum(c.values()) for t, c in got.items()})} of {len(w.ids)}")
    est = Counter(v for p in range(PARTITIONS) for _, v, _ in broker.log(ESTIMATES, p))
    out += [f"estimate {v!r} published {n} times" for v, n in est.items() if n > 1]
    return out


@pytest.fixture(scope="module")
def windows() -> list[Window]:
    return make_windows(10)


def crash_points(windows: Sequence[Window], **kw: object) -> list[str]:
    plan = CrashPlan(None)
    run_incarnation(SimBroker(), windows, plan, landing="none", seed=0, run="probe",
                    pseudonyms=bool(kw.get("pseudonyms", True)), compact=False)
    return plan.names


def test_without_a_crash_every_window_is_published_once_and_the_outbox_is_settled(windows: list[Window]) -> None:
    broker = complete_run(windows, [], "none")
    assert problems(broker, windows, True) == []
    for t in SIDE:
        assert sum(len(broker.log(t, p)) for p in range(PARTITIONS)) == sum(len(w.ids) for w in windows)
    left = pending_entries([(i, k, v) for i, (k, v, _) in enumerate(broker.log(OUTBOX, 0))])
    assert left.entries == [] and left.stray == []  # every entry tombstoned
    assert broker.mark is not None and 0 < broker.mark < len(broker.log(OUTBOX, 0))


@pytest.mark.parametrize("pseudonyms", [True, pytest.param(False, marks=pytest.mark.slow)])  # (the fast tier:
@pytest.mark.parametrize("landing", [pytest.param("none", marks=pytest.mark.slow),  # pseudonyms, landing "half";
                                     pytest.param("all", marks=pytest.mark.slow), "half",  # the others: CI's full
                                     pytest.param("per-partition", marks=pytest.mark.slow)])  # suite (its budget))
def test_a_crash_at_every_point_leaves_every_record_on_all_side_topics_or_none(windows: list[Window], landing: str,
                                                                              pseudonyms: bool) -> None:
    names = crash_points(windows, pseudonyms=pseudonyms)
    assert {"running-entry-sent", "running-between-chunks", "running-entry-acked", "running-copies-sent",
            "running-copies-acked", "running-tombstones-sent", "committed"} <= set(names)
    failures = {}
    before = Counter(STATS)
    for at in range(len(names)):
        for compact in (False, True):
            broker = complete_run(windows, [at], landing, pseudonyms=pseudonyms, compact=compact)
            found = problems(broker, windows, pseudonyms)
            if found:
                failures[(at, names[at], compact)] = found
    assert failures == {}
    done = STATS - before  # the recoveries had work: entries pending, copies found and (unless all landed) re-sent
    assert done["entries"] > 0 and done["found"] > 0
    assert (done["dropped"] > 0) == (landing != "none")  # entries cut between their chunks (or mid-send)
    assert done["resent"] > 0  # (even when all in flight lands: a crash before a window's last topic was sent)


@pytest.mark.parametrize("landing", ["none", "half", "per-partition"])
def test_a_crash_during_the_next_start_s_recovery_still_converges(windows: list[Window], landing: str) -> None:
    """A first crash after copies were sent, then a crash at every point of the recovery that follows."""
    names = crash_points(windows)
    firsts = [i for i, n in enumerate(names) if n == "running-copies-sent"][1:4]
    failures = {}
    tried = 0
    for first in firsts:
        plans: list[CrashPlan] = []
        complete_run(windows, [first], landing, plans=plans)
        recovery = [i for i, n in enumerate(plans[1].names) if n.startswith("recovery")]
        for second in recovery:
            broker = complete_run(windows, [first, second], landing)
            tried += 1
            found = problems(broker, windows, True)
            if found:
                failures[(first, second, plans[1].names[second])] = found
    assert tried > 3 and failures == {}


def test_the_stall_stop_case_is_completed_at_the_next_start() -> None:
    """The case issue 18 measured: a window's copies reached krr but not rs or blap (purged at a stop): the next
    start sends exactly the missing ones."""
    broker = SimBroker()
    producer = SimProducer(broker, CrashPlan(None), "running")
    outbox = SideOutbox(OUTBOX, INPUT, bound=BOUND, run_id="a")
    outbox.ends = {(t, p): 0 for t in SIDE for p in range(PARTITIONS)}
    w = Window(1, [f"r{i}" for i in range(50)], 1_700_000_000_501)  # (no estimate with it)
    outbox.publish(producer, groups_of(w, True))
    keep = [m for m in producer.in_flight if m.topic == SIDE[0]] + [m for m in producer.in_flight
                                                                    if m.topic == SIDE[1]][:7]
    producer.in_flight = []
    for m in keep:
        broker.store(m.topic, m.partition, m.key, m.value, m.ts)
    assert [len(broker.log(t, 1)) for t in SIDE] == [50, 7, 0]
    b = SideOutbox(OUTBOX, INPUT, bound=BOUND, run_id="b")
    p2 = SimProducer(broker, CrashPlan(None), "recovery")
    rep = b.recover([(i, k, v) for i, (k, v, _) in enumerate(broker.log(OUTBOX, 0))],
                    SimReader(broker, CrashPlan(None), False), p2)
    assert (rep.entries, rep.messages, rep.found, rep.resent) == (1, 150, 57, 93)
    assert [len(broker.log(t, 1)) for t in SIDE] == [50, 50, 50]
    assert {ts for t in SIDE for _, _, ts in broker.log(t, 1)} == {w.ts}  # re-sent with the window's timestamp
    assert problems(broker, [w], True) == []
    again = b.recover([(i, k, v) for i, (k, v, _) in enumerate(broker.log(OUTBOX, 0))],
                      SimReader(broker, CrashPlan(None), False), p2)
    assert again.entries == 0  # tombstoned


def test_chunks_round_trip_under_the_bound() -> None:
    w = Window(0, [f"r{i}" for i in range(40)], 5)
    groups = tuple(groups_of(w, True)) + (CopyGroup(ESTIMATES, 1, 9, (), (None, b""), (b"", b"\x00\xff")),)
    entry = OutboxEntry("run/1", {(SIDE[0], 0): 12, (SIDE[1], 0): None, (ESTIMATES, 1): 3}, groups)
    chunks = entry.chunks(INPUT, BOUND)
    assert len(chunks) > 5
    assert all(len(k) + len(v) + MESSAGE_FRAMING_BYTES <= BOUND for k, v in chunks)
    assert all(k.startswith(b"adult.raw/run/1/") for k, _ in chunks)
    assert decode_chunk(chunks[0][1]).ends == entry.ends
    back = pending_entries([(i, k, v) for i, (k, v) in enumerate(reversed(chunks))])  # any order
    assert back.entries == [entry] and back.stray == []
    partial = pending_entries([(i, k, v) for i, (k, v) in enumerate(chunks[:-1])])
    assert partial.entries == [] and len(partial.stray) == len(chunks) - 1
    assert pending_entries([(0, k, v) for k, v in chunks] + [(1, chunks[0][0], None)]).entries == []
    with pytest.raises(OutboxFormatError):
        decode_chunk(b"SAO1\x00\x00\x00\x02{}")
    with pytest.raises(OutboxFormatError):
        decode_chunk(chunks[0][1] + b"x")


def test_identical_copies_are_matched_as_a_multiset_from_the_recorded_end() -> None:
    same = b'{"v":1}'
    e = OutboxEntry("a/1", {("t", 0): 2}, (CopyGroup("t", 0, 1, (), (None, None, None), (same, same, b"z")),))
    # offsets 0-1 are older copies (before the recorded end); one of the entry's two `same` copies landed
    found = {("t", 0): [(0, None, same), (1, None, same), (2, None, same)]}
    [[missing]] = missing_messages([e], found)
    assert list(missing.values) == [same, b"z"]
    later = OutboxEntry("a/2", {("t", 0): 3}, (CopyGroup("t", 0, 2, (), (None,), (same,)),))
    found = {("t", 0): [(2, None, same), (3, None, same), (4, None, same)]}
    assert missing_messages([e, later], found) == [[CopyGroup("t", 0, 1, (), (None,), (b"z",))], []]
