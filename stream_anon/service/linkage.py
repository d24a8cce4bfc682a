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
* The release-timing attack (a class message's timestamp against its expiring member) is in
  :mod:`stream_anon.service.release_timing`.
* :func:`join_candidates`: identifier-like strings (at least 8 characters of ``[A-Za-z0-9_-]`` with a digit,
  and a letter unless 16 or more long: record ids, hex pseudonyms, class ids) that occur in two message sets, i.e. a key or field an
  analyst could join them by (e.g. the same id in ``anon`` and a side topic); a heuristic, so it takes the
  schema's own labels to ignore.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
