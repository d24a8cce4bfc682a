"""The engine's view of the sensitive attribute: value codes, count vectors and the running reference.

With a diversity requirement (:class:`~stream_anon.core.diversity.DiversityRequirement`: l-diversity of any
model, t-closeness) every count the engine keeps of sensitive values is a row over *codes*: a categorical
attribute's codes are its domain values in schema order (fixed width), other values get the next code on first
sight (the width doubles when needed, and every registered array grows with it).  Rows of the open clusters
are one matrix (:class:`~stream_anon.core.engine.clusters.ClusterStore`), so a requirement is checked for every
candidate merge at once.

t-closeness: :class:`SensitiveCodes` also counts every arrival (``arrived``) and freezes the reference in
force after every ``every``-th arrival, exactly as :class:`~stream_anon.core.diversity.RunningReference` (the
gate's independent copy) does; :meth:`reference_pairs` is what a release carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stream_anon.core.diversity import DiversityRequirement, sorted_values, value_sort_key

INITIAL_WIDTH = 16


class SensitiveCodes:
    """Value codes of the sensitive attribute and the requirement's check on code-indexed count rows.

    ``on_grow(width)`` is called after the width grew, for the owner to resize its own count arrays
    (:func:`resize` helps).
    """

    def __init__(self, requirement: DiversityRequirement, domain: tuple[Any, ...] = (), *,
                 every: int = 1, on_grow: Callable[[int], None] | None = None):
        self.req = requirement
        self.codes: dict[Any, int] = {v: i for i, v in enumerate(domain)}
        self.values: list[Any] = list(domain)
        self.width = len(domain) if domain else INITIAL_WIDTH
        self.on_grow = on_grow
        self.every = every
        self.t = requirement.t is not None
        self.ordered = self.t and requirement.distance == "ordered"
        self._order: np.ndarray | None = None  # column order by value (ordered distance)
        self.arrived = np.zeros(self.width)
        self.snapshot: np.ndarray | None = None
        self.seen = 0
        self._pairs: tuple[tuple[Any, int], ...] | None = None
        self._distinct = requirement.model == "distinct" and requirement.t is None and requirement.l_active
        self._l = int(requirement.l) if self._distinct else 0  # type: ignore[arg-type]

    # ------------------------------------------------------------------ codes
    def code(self, value: Any) -> int:
        c = self.codes.get(value)
        if c is None:
            c = len(self.values)
            self.codes[value] = c
            self.values.append(value)
            self._order = None
            if c >= self.width:
                self.width *= 2
                self.arrived = resize(self.arrived, self.width)
                if self.snapshot is not None:
                    self.snapshot = resize(self.snapshot, self.width)
                if self.on_grow is not None:
                    self.on_grow(self.width)
        return c

    def arrive(self, code: int) -> None:
        """One arrival (t-closeness): count it; freeze the reference after every ``every``-th."""
        self.arrived[code] += 1
        self.seen += 1
        if self.seen % self.every == 0:
            self.snapshot = self.arrived.copy()
            self._pairs = None

    # ------------------------------------------------------------------ the reference
    def reference(self) -> np.ndarray:
        """The reference in force (code-indexed): the last snapshot, or the live counts before the first."""
        return self.snapshot if self.snapshot is not None else self.arrived

    def reference_pairs(self) -> tuple[tuple[Any, int], ...] | None:
        """The reference in force as ``(value, count)`` pairs in value order (what a release carries)."""
        if not self.t:
            return None
        if self.snapshot is None:
            return self._pairs_of(self.arrived)
        if self._pairs is None:
            self._pairs = self._pairs_of(self.snapshot)
        return self._pairs

    def _pairs_of(self, vec: np.ndarray) -> tuple[tuple[Any, int], ...]:
        nz = {self.values[i]: int(vec[i]) for i in np.flatnonzero(vec[: len(self.values)]).tolist()}
        return tuple((v, nz[v]) for v in sorted_values(nz))

    def _column_order(self) -> np.ndarray:
        if self._order is None or len(self._order) != self.width:
            n = len(self.values)
            by_value = sorted(range(n), key=lambda i: value_sort_key(self.values[i]))
            self._order = np.array(by_value + list(range(n, self.width)), dtype=np.intp)
        return self._order

    # ------------------------------------------------------------------ checks
    def ok(self, row: np.ndarray, reference: np.ndarray | None = None) -> bool:
        """One count row satisfies the requirement (against ``reference``, default the one in force)."""
        if self._distinct:
            return int(np.count_nonzero(row)) >= self._l
        ref_list: list[float] | None = None
        if self.t:
            ref = self.reference() if reference is None else reference
            if self.ordered:
                order = self._column_order()
                row = row[order]
                ref = ref[order]
            ref_list = ref.tolist()
        return self.req.check_row(row.tolist(), ref_list)

    def ok_rows(self, rows: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
        """Verdicts for count rows ``(..., width)``; ``reference``: one row or one per row (default: in force)."""
        ref = None
        if self.t:
            ref = self.reference() if reference is None else reference
            if self.ordered:
                order = self._column_order()
                rows = rows[..., order]
                ref = ref[..., order]
        return self.req.check(rows, ref)


def resize(a: np.ndarray, width: int) -> np.ndarray:
    """``a`` with its last axis zero-padded to ``width``."""
    out = np.zeros((*a.shape[:-1], width), dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out
