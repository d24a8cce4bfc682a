"""Engines with injected bugs, wrapping the real engine (tests of the pre-publish gate and the pipeline's guard).

Each implements :class:`~stream_anon.core.engine.protocol.EngineLike`; the faults are what a bug in the engine's
release path could do.  The pipeline and the gate must keep every published class k-anonymous and every input
accounted exactly once whatever the engine returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.core.engine import Engine, Release


class FaultyEngine:
    """Passes everything to ``inner`` and lets :meth:`fault` rewrite the releases."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    def fault(self, releases: list[Release]) -> list[Release]:
        return releases

    def encode_many(self, columns: Mapping[str, Sequence[Any]]) -> np.ndarray:
        return self.inner.encode_many(columns)

    def push(self, record: Mapping[str, Any], now: float | None = None) -> list[Release]:
        return self.fault(self.inner.push(record, now))

    def push_encoded(self, record: Mapping[str, Any], v: np.ndarray, now: float | None = None) -> list[Release]:
        return self.fault(self.inner.push_encoded(record, v, now))

    def flush(self, now: float | None = None) -> list[Release]:
        return self.fault(self.inner.flush(now))

    def expire(self, now: float) -> list[Release]:
        return self.fault(self.inner.expire(now))

    @property
    def buffered_records(self) -> int:
        return self.inner.buffered_records

    @property
    def open_clusters(self) -> int:
        return self.inner.open_clusters


def _part(r: Release, idx: Sequence[int], **changes: Any) -> Release:
    return dataclasses.replace(r, record_ids=tuple(r.record_ids[i] for i in idx),
                               records=tuple(r.records[i] for i in idx), delays=tuple(r.delays[i] for i in idx),
                               delays_seconds=tuple(r.delays_seconds[i] for i in idx)
                               if len(r.delays_seconds) == len(r.record_ids) else r.delays_seconds, **changes)


class SplitClassesEngine(FaultyEngine):
    """Releases every class as two halves under the same generalization (a class of fewer than 2k records then
    becomes two classes below k), each half claiming the whole class's size."""

    def fault(self, releases: list[Release]) -> list[Release]:
        out = []
        for r in releases:
            n = len(r.record_ids)
            if r.kind == "class" and n >= 2:
                out.append(_part(r, range(n // 2)))
                out.append(_part(r, range(n // 2, n)))
            else:
                out.append(r)
        return out


class NarrowingEngine(FaultyEngine):
    """Releases every other class with its ``age`` interval narrowed to its first member's age: the other
    members' ages are outside the published generalization."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.n = 0

    def fault(self, releases: list[Release]) -> list[Release]:
        out = []
        for r in releases:
            if r.kind == "class":
                self.n += 1
                ages = {rec["age"] for rec in r.records}
                if self.n % 2 == 0 and len(ages) > 1:
                    a = r.records[0]["age"]
                    r = dataclasses.replace(r, generalized={**r.generalized, "age": f"[{a}-{a}]"})
            out.append(r)
        return out


class RaisingEngine(FaultyEngine):
    """Raises on the push of any record whose ``age`` is in ``ages`` (after keeping it: the record stays in the
    engine's state and may be released later), and on ``encode_many`` for runs that contain one."""

    def __init__(self, inner: Engine, ages: frozenset[int]) -> None:
        super().__init__(inner)
        self.ages = ages

    def encode_many(self, columns: Mapping[str, Sequence[Any]]) -> np.ndarray:
        if any(a in self.ages for a in columns["age"]):
            raise ValueError("encode_many: injected failure")
        return self.inner.encode_many(columns)

    def push(self, record: Mapping[str, Any], now: float | None = None) -> list[Release]:
        releases = self.inner.push(record, now)
        if record["age"] in self.ages:
            raise KeyError(f"injected failure for age {record['age']}")
        return releases


class DuplicatingEngine(FaultyEngine):
    """Releases its first class a second time with the next release (the same offsets in two classes)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.first: Release | None = None
        self.repeated = False

    def fault(self, releases: list[Release]) -> list[Release]:
        out = list(releases)
        for r in releases:
            if r.kind == "class" and self.first is None:
                self.first = r
                return out
        if out and self.first is not None and not self.repeated:
            self.repeated = True
            out.append(self.first)
        return out


class BadLossEngine(FaultyEngine):
    """Every third class carries a loss that is not a number (its entry cannot be built)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.n = 0

    def fault(self, releases: list[Release]) -> list[Release]:
        out = []
        for r in releases:
            if r.kind == "class":
                self.n += 1
                if self.n % 3 == 0:
                    r = dataclasses.replace(r, loss="not a number")  # type: ignore[arg-type]
            out.append(r)
        return out
