"""Search published messages for what must never be there (the end-to-end linkage test; pure).

* :class:`TokenSearch`: every occurrence of any of a set of forbidden byte strings (record ids, pseudonyms of
  another run, source offsets, timing values) in the keys, values and header names/values of messages.  Exact
  substring search, grouped by token length (one set intersection per length and message), so searching all
  32,561 ADULT record ids in every public message is a matter of seconds.  Short numeric tokens (offsets) also
  occur legitimately inside generalizations (``"[17-21]"``): search record ids that cannot collide (the replay
  tools can prefix them), and check offsets and timings structurally with :func:`forbidden_fields`.
* :func:`forbidden_fields`: JSON field names of a public message that must not exist (:data:`FORBIDDEN_PUBLIC_FIELDS`).
* :func:`permutation_match_moments` and :class:`PositionLinkage`: how often an attacker who knows a record's input
  position finds its side copy at (or within ``d`` of) the same offset, against what a uniformly random order of
  each mixing window gives (the expected count and its variance, exact for a uniform permutation; the side paths'
  windows: :mod:`stream_anon.side.mixing`).
* :func:`release_timing_attack`: how often an attacker who knows every record's arrival time and QIs (the threat
  model's attacker) pins the *expiring member* of a class from the class message's Kafka timestamp: CASTLE releases
  a class when its oldest record is delta arrivals old, so the record delta arrivals before the arrival that
  triggered the release is (almost always) a member.  Measured against what the release ticks allow (guessing among
  the candidates of the tick, :mod:`stream_anon.service.ticks`), with the order of a tick's classes against a
  uniformly random one (:class:`OrderConcordance`).
* :func:`join_candidates`: identifier-like strings (at least 8 characters of ``[A-Za-z0-9_-]`` with a digit,
  and a letter unless 16 or more long: record ids, hex pseudonyms, class ids) that occur in two message sets, i.e. a key or field an
  analyst could join them by (e.g. the same id in ``anon`` and a side topic); a heuristic, so it takes the
  schema's own labels to ignore.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream_anon.core.intervals import parse_interval
from stream_anon.core.schema import Kind, Schema
from stream_anon.formats.release import decode_class_message

FORBIDDEN_PUBLIC_FIELDS = frozenset({
    "record_id", "record_ids", "id", "members", "src_offset", "offset", "offsets", "src_topic", "src_partition",
    "partition", "release_id", "release", "release_offset", "horizon", "delay", "delays", "position_delay",
    "latency_s", "latency", "timestamp", "ingest_time", "arrival",
})
"""Field names that carry a record's identity, position or timing; none may appear in a public message."""

_WORD = re.compile(rb"[A-Za-z0-9_]")
_IDLIKE = re.compile(rb"[A-Za-z0-9_\-]{8,}")
_LETTER = re.compile(rb"[A-Za-z]")
_DIGIT = re.compile(rb"[0-9]")


@dataclass(frozen=True)
class ScannedMessage:
    """One consumed message of a topic (what the test hands the search)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()

    def parts(self) -> Iterator[tuple[str, bytes]]:
        """(where, bytes) of every searchable part: key, value, each header's name and value."""
        if self.key is not None:
            yield "key", self.key
        if self.value is not None:
            yield "value", self.value
        for name, v in self.headers:
            yield "header-name", name.encode("utf-8", "backslashreplace")
            if v is not None:
                yield f"header:{name}", v


@dataclass(frozen=True)
class TokenHit:
    topic: str
    partition: int
    offset: int
    where: str
    token: bytes


def _as_bytes(token: bytes | str | int) -> bytes:
    if isinstance(token, bytes):
        return token
    if isinstance(token, str):
        return token.encode("utf-8", "backslashreplace")
    return str(token).encode("ascii")


class TokenSearch:
    """Find any of ``tokens`` in byte strings.

    Args:
        tokens: forbidden tokens (bytes; text is UTF-8 encoded, integers written in decimal).
        word_boundary: a match counts only when the bytes around it are not ``[A-Za-z0-9_]`` (so ``adult-1``
            does not match inside ``adult-12``).
    """

    def __init__(self, tokens: Iterable[bytes | str | int], *, word_boundary: bool = False) -> None:
        by_len: dict[int, set[bytes]] = {}
        for t in tokens:
            b = _as_bytes(t)
            if not b:
                raise ValueError("TokenSearch: empty token")
            by_len.setdefault(len(b), set()).add(b)
        self._by_len = sorted(by_len.items())
        self.word_boundary = word_boundary
        self.n_tokens = sum(len(s) for _, s in self._by_len)

    def find(self, data: bytes) -> list[bytes]:
        """The distinct tokens occurring in ``data`` (sorted)."""
        n = len(data)
        found: set[bytes] = set()
        for length, tokens in self._by_len:
            if length > n:
                break
            hits = {data[i: i + length] for i in range(n - length + 1)} & tokens
            if hits and self.word_boundary:
                hits = {t for t in hits if self._bounded(data, t)}
            found |= hits
        return sorted(found)

    @staticmethod
    def _bounded(data: bytes, token: bytes) -> bool:
        i = data.find(token)
        while i >= 0:
            j = i + len(token)
            before = i == 0 or not _WORD.match(data, i - 1)
            after = j >= len(data) or not _WORD.match(data, j)
            if before and after:
                return True
            i = data.find(token, i + 1)
        return False

    def scan(self, messages: Iterable[ScannedMessage]) -> list[TokenHit]:
        """Every (message, part, token) where a token occurs."""
        out = []
        for m in messages:
            for where, data in m.parts():
                for t in self.find(data):
                    out.append(TokenHit(m.topic, m.partition, m.offset, where, t))
        return out


def _walk_keys(obj: Any, path: str, out: list[str], names: frozenset[str]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if k in names:
                out.append(p)
            _walk_keys(v, p, out, names)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _walk_keys(v, f"{path}[{i}]", out, names)


def forbidden_fields(value: bytes | None, names: frozenset[str] = FORBIDDEN_PUBLIC_FIELDS) -> list[str]:
    """JSON paths of fields named in ``names`` (a value that is not JSON is reported as ``"<not JSON>"``)."""
    if value is None:
        return []
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ["<not JSON>"]
    out: list[str] = []
    _walk_keys(obj, "", out, names)
    return out


def _idlike(m: ScannedMessage) -> set[bytes]:
    out: set[bytes] = set()
    for _, data in m.parts():
        out.update(t for t in _IDLIKE.findall(data) if _DIGIT.search(t) and (len(t) >= 16 or _LETTER.search(t)))
    return out


def join_candidates(a: Iterable[ScannedMessage], b: Iterable[ScannedMessage],
                    ignore: Iterable[bytes | str] = ()) -> set[bytes]:
    """Identifier-like tokens found in a message of ``a`` and in a message of ``b`` (each one a key an analyst
    could join the two by), except those in ``ignore`` (e.g. the schema's category labels)."""
    skip = {_as_bytes(t) for t in ignore}
    seen_a: set[bytes] = set()
    for m in a:
        seen_a |= _idlike(m)
    common: set[bytes] = set()
    for m in b:
        common |= _idlike(m) & seen_a
    return common - skip


# ============================================================================================ release timing
class QiSpace:
    """A schema's QIs as numbers: a record is a point (a numeric value, or a categorical value's leaf index in its
    hierarchy), a generalization is a box (an interval's bounds, or a node's leaf range); a generalization covers
    a record iff the point lies in the box (the verifier's coverage rule, vectorized)."""

    def __init__(self, schema: Schema) -> None:
        self.qis = schema.qis

    def points(self, records: Sequence[Mapping[str, Any]]) -> np.ndarray:
        out = np.empty((len(records), len(self.qis)), dtype=np.float64)
        for j, a in enumerate(self.qis):
            if a.kind is Kind.NUMERIC:
                out[:, j] = [float(r[a.name]) for r in records]
            else:
                assert a.hierarchy is not None
                index = a.hierarchy.leaf_index
                out[:, j] = [index[str(r[a.name])] for r in records]
        return out

    def box(self, generalized: Mapping[str, str]) -> tuple[np.ndarray, np.ndarray]:
        lo = np.empty(len(self.qis))
        hi = np.empty(len(self.qis))
        for j, a in enumerate(self.qis):
            text = generalized[a.name]
            if a.kind is Kind.NUMERIC:
                lo[j], hi[j] = parse_interval(text)
            else:
                assert a.hierarchy is not None
                node = a.hierarchy.node(text)
                lo[j], hi[j] = a.hierarchy.node_leaf_lo[node], a.hierarchy.node_leaf_hi[node]
        return lo, hi


@dataclass(frozen=True)
class PartitionArrivals:
    """The records of one input partition in arrival order: input ``offsets`` (ascending), their Kafka
    ``timestamps_ms`` (the arrival times the attacker knows) and QI ``points`` (:class:`QiSpace`)."""

    offsets: np.ndarray
    timestamps_ms: np.ndarray
    points: np.ndarray
    latest_ms: np.ndarray = field(init=False)  # running maximum of the timestamps (they need not be monotone)

    def __post_init__(self) -> None:
        object.__setattr__(self, "latest_ms", np.maximum.accumulate(self.timestamps_ms))

    def position(self, offset: int) -> int:
        return int(np.searchsorted(self.offsets, offset))

    def last_at_or_before(self, t_ms: float) -> int:
        """Position of the latest arrival at or before ``t_ms`` (-1: none)."""
        return int(np.searchsorted(self.latest_ms, t_ms, side="right")) - 1


@dataclass(frozen=True)
class ReleasedClass:
    """One class message as the attacker reads it (partition, ``position`` = its offset on the anon partition,
    Kafka ``timestamp_ms``, generalization box ``lo``/``hi``, and with t-closeness the total of the reference
    snapshot it carries, ``reference_total``: the arrivals counted when the snapshot was taken) and, for scoring
    only, the ledger's truth: its ``members`` (input offsets) and the ``trigger`` offset that released it."""

    partition: int
    position: int
    timestamp_ms: int
    lo: np.ndarray
    hi: np.ndarray
    members: frozenset[int]
    trigger: int | None = None
    reference_total: int | None = None


@dataclass
class PinCount:
    """The QI attack with a window: the candidates of a release are the records delta arrivals before each arrival
    in (timestamp - ``window_ms``, timestamp] whose QIs its generalization covers; ``unique``: releases with exactly
    one candidate; ``correct``: that one is the expiring member (the record delta arrivals before the trigger: what
    the timing names); ``member``: it is one of the release's members (the expiring one or another: a member is
    also found by its QIs alone, since every member arrived within the delta arrivals before the release)."""

    window_ms: float
    unique: int = 0
    correct: int = 0
    member: int = 0


@dataclass
class OrderConcordance:
    """Within each group of classes with one (partition, timestamp): pairs ordered alike by anon offset and by
    trigger (``concordant`` - ``discordant`` = S), beside a uniformly random order of each group (mean 0, variance
    [n(n-1)(2n+5) - sum over tied triggers t(t-1)(2t+5)] / 18 per group, Kendall's null with ties in one ranking)."""

    pairs: int = 0
    concordant: int = 0
    discordant: int = 0
    variance: float = 0.0

    def add(self, triggers: Sequence[int]) -> None:
        """One group: its classes' triggers in anon-offset order."""
        n = len(triggers)
        if n < 2:
            return
        t = np.asarray(triggers)
        diff = np.sign(t[None, :] - t[:, None])[np.triu_indices(n, 1)]
        self.concordant += int((diff > 0).sum())
        self.discordant += int((diff < 0).sum())
        self.pairs += n * (n - 1) // 2
        _, ties = np.unique(t, return_counts=True)
        self.variance += (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18

    @property
    def z(self) -> float:
        s = self.concordant - self.discordant
        return s / math.sqrt(self.variance) if self.variance > 0 else (0.0 if s == 0 else math.inf)

    @property
    def tau(self) -> float:
        n = self.concordant + self.discordant
        return (self.concordant - self.discordant) / n if n else math.nan


@dataclass
class ReleaseTimingReport:
    """The release-timing attack (see :func:`release_timing_attack`), scored per *release*: the classes one arrival
    released (CASTLE splits a large cluster into several classes, all released by the arrival at which its oldest
    record expired, and only one of them holds that record).

    Attributes:
        releases, classes: releases (distinct (partition, trigger)) scored, and their classes.
        groups: distinct (partition, timestamp) of the classes: one per tick with releases (without ticks: about
            one per produce batch).
        oracle_member: the record delta arrivals before the TRUE trigger (the ledger's) is a member of the release:
            how CASTLE names the expiring member.
        position_member: the attack of the issue: the record delta arrivals before the latest arrival at or before
            the release's timestamp is a member of the release.
        pins: the QI attack for each window (a candidate: covered by the generalization of one of the release's
            classes, the grouping granted to the attacker).
        tick_guess_expected, tick_guess_variance: correct pins (the expiring member) expected from guessing
            uniformly among the candidates of the release's tick: the records delta arrivals before the arrivals the service processed in the
            tick (after the previous tick's last trigger up to this tick's last trigger: an attacker who knows the
            service's lag exactly), covered like the pins' candidates.
        tick_candidates: that candidate count per release.
        tick_eliminated, tick_eliminated_correct: the same candidates matched within each tick by elimination (a
            release with one candidate left is pinned to it, which leaves the other releases of the tick; repeated
            until nothing changes), and how many of those pins are the expiring member: the best attack we know
            from the tick's information alone.
        order: the anon order of each group's classes against their triggers' order.
    """

    releases: int = 0
    classes: int = 0
    groups: int = 0
    oracle_member: int = 0
    position_member: int = 0
    pins: list[PinCount] = field(default_factory=list)
    tick_guess_expected: float = 0.0
    tick_guess_variance: float = 0.0
    tick_candidates: list[int] = field(default_factory=list)
    tick_eliminated: int = 0
    tick_eliminated_correct: int = 0
    order: OrderConcordance = field(default_factory=OrderConcordance)

    @property
    def best_pin(self) -> PinCount:
        """The window with the most correct pins (an attacker who picked the best window with hindsight)."""
        return max(self.pins, key=lambda p: p.correct)

    @property
    def tick_bound(self) -> float:
        """What the tick's information allows: the better of guessing within the tick (its expected count plus four
        standard deviations) and elimination within the tick."""
        return max(self.tick_guess_expected + 4 * math.sqrt(self.tick_guess_variance),
                   float(self.tick_eliminated_correct))

    def lines(self) -> list[str]:
        best = self.best_pin
        n = max(self.releases, 1)
        sd = math.sqrt(self.tick_guess_variance)
        med = float(np.median(self.tick_candidates)) if self.tick_candidates else math.nan
        return [
            f"{self.releases:,} releases ({self.classes:,} classes) in {self.groups:,} (partition, timestamp) groups; "
            f"the record delta arrivals before the true trigger is a member in {self.oracle_member:,}",
            f"position attack (delta arrivals before the latest arrival at or before the timestamp): a member in "
            f"{self.position_member:,} of {self.releases:,} ({self.position_member / n:.1%})",
            "QI attack by window (unique / the expiring member / a member): " + ", ".join(
                f"{p.window_ms:g} ms: {p.unique:,} / {p.correct:,} / {p.member:,}" for p in self.pins),
            f"best window {best.window_ms:g} ms: pinned uniquely {best.unique:,}, the expiring member {best.correct:,} "
            f"of {self.releases:,} ({best.correct / n:.1%}); guessing among the tick's candidates (median {med:.0f} "
            f"per release): {self.tick_guess_expected:.1f} +- {sd:.1f} ({self.tick_guess_expected / n:.1%}); "
            f"elimination within the tick: {self.tick_eliminated:,} pinned, {self.tick_eliminated_correct:,} the "
            f"expiring member ({self.tick_eliminated_correct / n:.1%})",
            f"anon order vs trigger order within groups: tau {self.order.tau:.3f} over {self.order.pairs:,} pairs, "
            f"z = {self.order.z:.2f} (a uniformly random order: |z| <= 4)",
        ]


DEFAULT_WINDOWS_MS = (10.0, 25.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0)


def release_timing_attack(classes: Sequence[ReleasedClass], arrivals: Mapping[int, PartitionArrivals], delta: int,
                          windows_ms: Sequence[float] = DEFAULT_WINDOWS_MS,
                          reference_every: int | None = None) -> ReleaseTimingReport:
    """Score the release-timing attack on ``classes`` (see :class:`ReleaseTimingReport`); ``delta``: the engine's
    delay bound in arrivals (public: the attacker knows the configuration).  Classes without a trigger (released
    by an end-of-stream flush, a wall-clock expiry) are not scored.

    A class that carries a t-closeness reference snapshot tells more: the snapshot in force when it was released
    was taken after ``reference_total`` arrivals and is renewed every ``reference_every`` (default ``delta``)
    arrivals, so its trigger is one of the arrivals ``reference_total`` .. ``reference_total + reference_every``
    (1-based, in one engine's count: a run without restarts); the attacker intersects every window (the pins'
    and the tick's) with that range."""
    every = delta if reference_every is None else reference_every
    rep = ReleaseTimingReport(pins=[PinCount(w) for w in windows_ms])
    groups: dict[tuple[int, int], list[ReleasedClass]] = {}
    for c in classes:
        groups.setdefault((c.partition, c.timestamp_ms), []).append(c)
    tick_range: dict[tuple[int, int], tuple[int, int]] = {}  # group -> arrival positions processed in its tick
    last_trigger: dict[int, int] = {}
    for (p, t), group in sorted(groups.items()):
        arr = arrivals[p]
        trig = [arr.position(c.trigger) for c in group if c.trigger is not None]
        hi = max(trig) if trig else arr.last_at_or_before(t)
        tick_range[(p, t)] = (last_trigger.get(p, -1) + 1, hi)
        last_trigger[p] = max(last_trigger.get(p, -1), hi)
        rep.groups += 1
        rep.order.add([arr.position(c.trigger) for c in sorted(group, key=lambda c: c.position)
                       if c.trigger is not None])
    in_tick: dict[tuple[int, int], list[tuple[set[int], int]]] = {}  # group -> (candidates, expiring) per release
    releases: dict[tuple[int, int], list[ReleasedClass]] = {}
    for c in classes:
        if c.trigger is not None:
            releases.setdefault((c.partition, c.trigger), []).append(c)
    for (p, trigger), cs in sorted(releases.items()):
        arr = arrivals[p]
        t = min(c.timestamp_ms for c in cs)
        latest = arr.last_at_or_before(t)
        at = arr.position(trigger)
        if latest < delta or at < delta:
            continue
        members = frozenset().union(*(c.members for c in cs))
        boxes = [(c.lo, c.hi) for c in cs]
        refs = [c.reference_total for c in cs if c.reference_total is not None]
        ref_lo, ref_hi = (max(refs) - 1, min(refs) - 1 + every) if refs else (0, len(arr.offsets))
        expiring = at - delta
        rep.releases += 1
        rep.classes += len(cs)
        rep.oracle_member += int(arr.offsets[expiring]) in members
        rep.position_member += int(arr.offsets[latest - delta]) in members
        for pin in rep.pins:
            first = max(arr.last_at_or_before(t - pin.window_ms) + 1, ref_lo)
            cand = _covered(arr, boxes, first - delta, min(latest, ref_hi) - delta)
            if len(cand) == 1:
                pin.unique += 1
                pin.correct += int(cand[0]) == expiring
                pin.member += int(arr.offsets[cand[0]]) in members
        lo, hi = tick_range[(p, t)]
        cand = _covered(arr, boxes, max(lo, ref_lo) - delta, min(hi, ref_hi) - delta)
        rep.tick_candidates.append(len(cand))
        in_tick.setdefault((p, t), []).append((set(cand.tolist()), expiring))
        if len(cand) and expiring in cand:
            q = 1 / len(cand)
            rep.tick_guess_expected += q
            rep.tick_guess_variance += q * (1 - q)
    for sets in in_tick.values():
        pinned = _eliminate([s for s, _ in sets])
        rep.tick_eliminated += len(pinned)
        rep.tick_eliminated_correct += sum(x == sets[i][1] for i, x in pinned.items())
    return rep


def _eliminate(candidates: Sequence[set[int]]) -> dict[int, int]:
    """Index -> the candidate it is pinned to: a set with one candidate left pins it, and that candidate leaves
    every other set; until nothing changes."""
    left = [set(s) for s in candidates]
    pinned: dict[int, int] = {}
    changed = True
    while changed:
        changed = False
        for i, s in enumerate(left):
            if i not in pinned and len(s) == 1:
                x = next(iter(s))
                pinned[i] = x
                changed = True
                for j, other in enumerate(left):
                    if j != i:
                        other.discard(x)
    return pinned


def _covered(arr: PartitionArrivals, boxes: Sequence[tuple[np.ndarray, np.ndarray]], lo: int, hi: int
             ) -> np.ndarray:
    """Positions in [lo, hi] (clipped at 0) whose QIs one of the generalizations ``boxes`` covers."""
    lo = max(lo, 0)
    if hi < lo:
        return np.empty(0, dtype=np.int64)
    pts = arr.points[lo: hi + 1]
    ok = np.zeros(len(pts), dtype=bool)
    for b_lo, b_hi in boxes:
        ok |= np.all((pts >= b_lo) & (pts <= b_hi), axis=1)
    return np.flatnonzero(ok) + lo


@dataclass(frozen=True)
class TopicMessage:
    """A consumed message as the release-timing analysis reads it (the fields of a kafka-python ConsumerRecord)."""

    partition: int
    offset: int
    timestamp: int
    value: bytes | None


@dataclass(frozen=True)
class ReleasedRecord:
    """One released record as the ledger tells it (``stream_anon.service.audit.OutputSnapshot.records``): its input
    partition and offset, its class, the offset of the arrival that released it and the milliseconds from its input
    timestamp to its release in the pipeline."""

    src_partition: int
    src_offset: int
    class_id: str
    release_offset: int | None
    latency_ms: float | None


@dataclass
class ReleaseTiming:
    """What the release-timing measurement needs: the classes and arrivals (:func:`release_timing_attack`), and per
    released record the milliseconds from its input timestamp to its class message's timestamp (``publish_ms``)
    and from its release in the pipeline to that timestamp (``held_ms``: what the release ticks add)."""

    classes: list[ReleasedClass]
    arrivals: dict[int, PartitionArrivals]
    publish_ms: np.ndarray
    held_ms: np.ndarray

    def latency_lines(self) -> list[str]:
        def pct(a: np.ndarray) -> str:
            if not len(a):
                return "none"
            q = np.percentile(a, [50, 99])
            return f"p50 {q[0]:,.0f} ms, p99 {q[1]:,.0f} ms, max {a.max():,.0f} ms"

        return [f"input timestamp -> class message timestamp: {pct(self.publish_ms)} ({len(self.publish_ms):,} "
                f"records)", f"release in the pipeline -> class message timestamp: {pct(self.held_ms)}"]


def release_timing_inputs(schema: Schema, inputs: Iterable[TopicMessage], anon: Iterable[TopicMessage],
                          released: Iterable[ReleasedRecord]) -> ReleaseTiming:
    """Join the input topic (arrival times, QIs), the anon topic (timestamps, positions, generalizations) and the
    ledger's released records (members, triggers) into what :func:`release_timing_attack` scores.  Input messages
    without a value (end-of-stream markers) are not arrivals."""
    space = QiSpace(schema)
    by_partition: dict[int, list[TopicMessage]] = {}
    for m in inputs:
        if m.value:
            by_partition.setdefault(m.partition, []).append(m)
    arrivals: dict[int, PartitionArrivals] = {}
    arrival_ms: dict[tuple[int, int], int] = {}
    for p, msgs in by_partition.items():
        msgs.sort(key=lambda m: m.offset)
        arrivals[p] = PartitionArrivals(np.array([m.offset for m in msgs], dtype=np.int64),
                                        np.array([m.timestamp for m in msgs], dtype=np.float64),
                                        space.points([json.loads(m.value or b"{}") for m in msgs]))
        arrival_ms.update(((p, m.offset), m.timestamp) for m in msgs)
    members: dict[str, list[ReleasedRecord]] = {}
    for r in released:
        members.setdefault(r.class_id, []).append(r)
    classes: list[ReleasedClass] = []
    publish: list[float] = []
    held: list[float] = []
    for m in anon:
        pc = decode_class_message(m.value)
        recs = members[pc.class_id]
        lo, hi = space.box(pc.qi)
        reference = (json.loads(m.value or b"{}").get("t_closeness") or {}).get("reference")
        classes.append(ReleasedClass(recs[0].src_partition, m.offset, m.timestamp, lo, hi,
                                     frozenset(r.src_offset for r in recs), recs[0].release_offset,
                                     sum(int(n) for _v, n in reference) if reference else None))
        for r in recs:
            t_in = arrival_ms[(r.src_partition, r.src_offset)]
            publish.append(m.timestamp - t_in)
            if r.latency_ms is not None:
                held.append(m.timestamp - t_in - r.latency_ms)
    return ReleaseTiming(classes, arrivals, np.array(publish), np.array(held))


def released_records(records: Any) -> list[ReleasedRecord]:
    """The released rows of an :class:`~stream_anon.service.audit.OutputSnapshot`'s ``records`` frame (pandas)."""
    rel = records[records.outcome == "released"]
    return [ReleasedRecord(int(p), int(o), str(c), None if r != r else int(r), None if lat != lat else lat * 1000.0)
            for p, o, c, r, lat in zip(rel.src_partition, rel.src_offset, rel.class_id, rel.release_offset,
                                       rel.latency_s, strict=True)]


# ============================================================================================ position linkage
def permutation_match_moments(allowed: np.ndarray) -> tuple[float, float]:
    """Mean and variance of X = #{i : pi(i) in A_i} for pi a uniformly random permutation of n positions, where
    ``allowed[i, j]`` says position j is in A_i (n x n booleans).

    With r_i = |A_i|, c_j = #{i : j in A_i} and S = sum r_i: P(pi(i) in A_i) = r_i / n, and for i != j
    P(pi(i) in A_i, pi(j) in A_j) = (r_i r_j - |A_i & A_j|) / (n (n - 1)), so

        E X = S / n,   E X^2 = S / n + ((S^2 - sum r_i^2) - (sum c_j^2 - S)) / (n (n - 1)).

    (A_i = {i}: the fixed points, mean 1 and variance 1.)"""
    a = np.asarray(allowed, dtype=bool)
    n = a.shape[0]
    if a.shape != (n, n):
        raise ValueError(f"allowed: expected a square matrix, got shape {a.shape}")
    if n == 0:
        return 0.0, 0.0
    r = a.sum(axis=1).astype(np.float64)
    c = a.sum(axis=0).astype(np.float64)
    total = float(r.sum())
    mean = total / n
    if n == 1:
        return mean, mean * (1 - mean)
    pairs = (total * total - float((r * r).sum())) - (float((c * c).sum()) - total)
    return mean, max(0.0, mean + pairs / (n * (n - 1)) - mean * mean)


@dataclass
class PositionLinkage:
    """Hits of the position attack summed over windows, beside what a uniform permutation of each window gives:
    ``hits`` observed, ``expected`` and ``variance`` (windows are independent: means and variances add)."""

    copies: int = 0
    hits: int = 0
    expected: float = 0.0
    variance: float = 0.0
    windows: int = 0
    sizes: list[int] = field(default_factory=list)

    def add(self, hits: int, allowed: np.ndarray) -> None:
        """One window: its observed ``hits`` and its ``allowed`` matrix (:func:`permutation_match_moments`)."""
        mean, var = permutation_match_moments(allowed)
        self.copies += int(allowed.shape[0])
        self.hits += int(hits)
        self.expected += mean
        self.variance += var
        self.windows += 1
        self.sizes.append(int(allowed.shape[0]))

    @property
    def fraction(self) -> float:
        return self.hits / self.copies if self.copies else math.nan

    @property
    def expected_fraction(self) -> float:
        return self.expected / self.copies if self.copies else math.nan

    @property
    def z(self) -> float:
        """(hits - expected) / sd; |z| <= 4 is what a uniform shuffle within each window gives."""
        return (self.hits - self.expected) / math.sqrt(self.variance) if self.variance > 0 else math.inf

    def __str__(self) -> str:
        return (f"{self.hits:,} of {self.copies:,} ({self.fraction:.5f}); a uniform shuffle of each of the "
                f"{self.windows} windows gives {self.expected:.1f} +- {math.sqrt(self.variance):.1f} "
                f"({self.expected_fraction:.5f}), z = {self.z:.2f}")


def offset_windows(partitions: Sequence[int], offsets: Sequence[int], timestamps: Sequence[int]
                   ) -> list[list[int]]:
    """The mixing windows of a side topic: indices of its copies grouped by partition into runs of consecutive
    offsets with one Kafka timestamp (a window's copies share its release time and one block of offsets)."""
    order = sorted(range(len(offsets)), key=lambda i: (partitions[i], offsets[i]))
    out: list[list[int]] = []
    prev: tuple[int, int, int] | None = None
    for i in order:
        key = (partitions[i], timestamps[i], offsets[i])
        if prev is None or key[0] != prev[0] or key[1] != prev[1] or key[2] != prev[2] + 1:
            out.append([])
        out[-1].append(i)
        prev = key
    return out


def offset_linkage(windows: Sequence[Sequence[int]], side_offsets: Sequence[int], input_offsets: Sequence[int],
                   distance: int = 0) -> PositionLinkage:
    """The position attack on copies whose records are known (by pseudonym): a hit is a copy whose side offset is
    within ``distance`` of its record's input offset (same partition: a window keeps its partition); the null
    model places each window's records uniformly on the window's offsets."""
    out = PositionLinkage()
    for w in windows:
        pos = np.array([side_offsets[i] for i in w], dtype=np.int64)
        src = np.array([input_offsets[i] for i in w], dtype=np.int64)
        allowed = np.abs(src[:, None] - np.sort(pos)[None, :]) <= distance
        out.add(int((np.abs(pos - src) <= distance).sum()), allowed)
    return out


def value_linkage(windows: Sequence[Sequence[int]], side_positions: Sequence[Any], copy_values: Sequence[Any],
                  input_value_at: Any) -> PositionLinkage:
    """The position attack without pseudonyms: a hit is a copy whose values equal those of the input record at its
    own position (``side_positions[i]``, e.g. (partition, offset); ``input_value_at(position)``: the input record's
    values there; with a high eps a copy reports its record's values).  A window's
    records are the input records at its copies' offsets (one contiguous block per partition); the null model
    places them uniformly on those offsets."""
    out = PositionLinkage()
    for w in windows:
        pos = [side_positions[i] for i in w]
        truth = [input_value_at(o) for o in pos]
        index = {v: k for k, v in enumerate(dict.fromkeys(truth))}
        codes = np.array([index[v] for v in truth], dtype=np.int64)
        allowed = codes[:, None] == codes[None, :]  # record at position k may sit at j: same values
        hits = sum(1 for i, t in zip(w, truth, strict=True) if copy_values[i] == t)
        out.add(hits, allowed)
    return out
