"""Search published messages for what must never be there (the end-to-end linkage test; pure).

* :class:`TokenSearch`: every occurrence of any of a set of forbidden byte strings (record ids, pseudonyms of
  another run, source offsets, timing values) in the keys, values and header names/values of messages.  Exact
  substring search, grouped by token length (one set intersection per length and message), so searching all
  32,561 ADULT record ids in every public message is a matter of seconds.  Short numeric tokens (offsets) also
  occur legitimately inside generalizations (``"[17-21]"``): search record ids that cannot collide (the replay
  tools can prefix them), and check offsets and timings structurally with :func:`forbidden_fields`.
* :func:`forbidden_fields`: JSON field names of a public message that must not exist (:data:`FORBIDDEN_PUBLIC_FIELDS`).
* :func:`join_candidates`: identifier-like strings (at least 8 characters of ``[A-Za-z0-9_-]`` with a digit,
  and a letter unless 16 or more long: record ids, hex pseudonyms, class ids) that occur in two message sets, i.e. a key or field an
  analyst could join them by (e.g. the same id in ``anon`` and a side topic); a heuristic, so it takes the
  schema's own labels to ignore.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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
