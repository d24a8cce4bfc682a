"""What the engine emits: one :class:`Release` per released equivalence class (or suppressed record)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ReleaseKind = Literal["class", "suppressed"]


@dataclass(frozen=True)
class Release:
    """A released equivalence class, or one suppressed record (``kind="suppressed"``).

    Attributes:
        class_id: equivalence-class id; a record released under a previously released cluster's
            generalization (CASTLE's reuse of Omega) carries that cluster's id (``reused=True``).
        kind: ``"class"`` or ``"suppressed"``.
        generalized: QI name -> released string: ``"[lo-hi]"`` for numeric QIs, the hierarchy node label
            for categorical ones; ``{}`` when suppressed.
        record_ids: ids of the source records in this release.
        records: the original (validated) records, same order.
        delays: arrivals each record waited (position of the releasing arrival - own position).
        delays_seconds: wall-clock seconds each record waited (from the ``now`` values given to push).
        loss: the class's per-record loss, mean over QIs of l_a (Goldberger-Tassa / LM per-attribute loss);
            1.0 for a suppressed record.
        size: distinct individuals sharing the generalization (for a reuse: the reused class's size).
        reused: released under a previously released cluster's generalization.
        leftover: released (or suppressed) through the leftover cluster.
        reference: with t-closeness, the reference distribution the class was checked against: ``(sensitive
            value, count)`` pairs in value order (:class:`~stream_anon.core.diversity.RunningReference`); a
            reuse carries its class's.  None without t-closeness.
    """

    class_id: str
    kind: ReleaseKind
    generalized: dict[str, str]
    record_ids: tuple[Any, ...]
    records: tuple[Mapping[str, Any], ...]
    delays: tuple[int, ...]
    delays_seconds: tuple[float, ...]
    loss: float
    size: int
    reused: bool = False
    leftover: bool = False
    reference: tuple[tuple[Any, int], ...] | None = None

    @property
    def n_records(self) -> int:
        return len(self.record_ids)

    @property
    def suppressed(self) -> bool:
        return self.kind == "suppressed"
