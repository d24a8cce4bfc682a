"""What a released class's sensitive values must satisfy beyond k: l-diversity and t-closeness (pure).

One :class:`DiversityRequirement` is the single definition that the engine (to form classes), the pre-publish
gate (to refuse a class) and the verifier (to check a released file) all apply, each to counts it computed
itself.  Its check is vectorized: :meth:`DiversityRequirement.check` takes a ``(n, m)`` matrix of counts (n
classes or candidate unions, m sensitive values) and returns n verdicts.

Models (Machanavajjhala, Kifer, Gehrke, Venkitasubramaniam, "l-Diversity: Privacy Beyond k-Anonymity", ACM
TKDD 1(1), 2007, Definitions 3.2-3.4 and Sec. 4.1; Li, Li, Venkatasubramanian, "t-Closeness: Privacy Beyond
k-Anonymity and l-Diversity", ICDE 2007, Sec. 4), for a class with counts ``r_1 >= r_2 >= ... >= r_m`` of its
sensitive values, ``n = sum r_i``, ``p_i = r_i / n``:

* ``distinct`` l-diversity: at least ``l`` distinct values (``r_l >= 1``);
* ``entropy`` l-diversity: ``H = -sum p_i log p_i >= log l`` (natural log; ``l`` may be any real >= 1; it
  implies at least ``ceil(l)`` distinct values, since ``H <= log m``);
* ``recursive`` (c, l)-diversity: ``r_1 < c (r_l + r_(l+1) + ... + r_m)`` (integer ``l >= 2``, ``c > 0``;
  it implies at least ``l`` distinct values);
* ``t``-closeness: the Earth Mover's Distance between the class's distribution P and a reference
  distribution Q is at most ``t``, with the ground distance of ARX's two implementations:

  - *equal distance* (categorical values; ``EqualDistanceTCloseness``): every two distinct values are 1 apart,
    ``EMD = 1/2 sum_i |p_i - q_i|`` (the total variation distance);
  - *ordered distance* (numeric values; ``OrderedDistanceTCloseness``): the values of the domain in ascending
    order ``v_1 < ... < v_M`` are ``|i - j| / (M - 1)`` apart, ``EMD = 1/(M - 1) sum_i |sum_(j<=i) (p_j - q_j)|``.
    The domain is the values present in P or Q (ARX: the values of the data set; in a stream, the reference
    holds every value seen up to its snapshot, and a class can only add values that arrived after it).

  With two values both distances are ``|p_1 - q_1|``.

The reference of t-closeness in a stream is :class:`RunningReference` (see there: what it is, and why the
released data carries it).  Floating-point: entropy is accepted down to ``log l - 1e-9`` and an EMD up to
``t + 1e-9`` (:data:`TOLERANCE`), so a class exactly at the bound (e.g. counts 5/5 for entropy l=2, or an EMD
equal to t) passes on every platform; the recursive test is on integer counts and exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_anon.core.defaults import DIVERSITY_MODELS, T_DISTANCES

MODELS = DIVERSITY_MODELS
"""The l-diversity variants (``diversity`` option)."""
DISTANCES = T_DISTANCES
"""Ground distances of t-closeness: ``auto`` = ordered for a numeric sensitive attribute, equal otherwise."""
TOLERANCE = 1e-9
"""Slack of the floating-point comparisons (entropy in nats, EMD in [0, 1])."""

__all__ = ["DISTANCES", "MODELS", "TOLERANCE", "DiversityParameterError", "DiversityRequirement", "RunningReference",
           "sorted_values", "value_sort_key", "counts_matrix", "emd", "entropy", "disclosure_figures"]


class DiversityParameterError(ValueError):
    """A diversity parameter is out of range: ``parameter``, ``allowed`` and ``value`` say which and why."""

    def __init__(self, parameter: str, allowed: str, value: Any):
        super().__init__(f"{parameter}: must be {allowed}, got {value!r}")
        self.parameter = parameter
        self.allowed = allowed
        self.value = value


def _real(name: str, value: Any, allowed: str, ok: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise DiversityParameterError(name, allowed, value)
    v = float(value)
    if not math.isfinite(v) or not ok(v):
        raise DiversityParameterError(name, allowed, value)
    return v


def _number(v: float) -> int | float:
    """``2.0`` -> ``2`` (parameters are written as integers when they are)."""
    return int(v) if float(v).is_integer() else float(v)


# ---------------------------------------------------------------------------------------------- formulas
def entropy(counts: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of counts: ``log n - (1/n) sum r log r``; 0 for an empty row."""
    c = np.asarray(counts, dtype=np.float64)
    n = np.asarray(c.sum(axis=-1))
    rlogr = (c * np.log(c, out=np.zeros_like(c), where=c > 0)).sum(axis=-1)
    pos = n > 0
    h = np.log(n, out=np.zeros_like(n), where=pos) - np.divide(rlogr, n, out=np.zeros_like(n), where=pos)
    nats: np.ndarray = np.maximum(h, 0.0)
    return nats


def emd(counts: np.ndarray, reference: np.ndarray, distance: str) -> np.ndarray:
    """Earth Mover's Distance between each row of ``counts`` and ``reference`` (rows, or one row for all), both
    normalized to distributions.  ``ordered``: the columns must be in ascending value order; the domain is the
    columns present in the row or the reference.  An empty row or reference is at distance 1."""
    c = np.asarray(counts, dtype=np.float64)
    q = np.asarray(reference, dtype=np.float64)
    n = c.sum(axis=-1, keepdims=True)
    nq = q.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, c / np.where(n > 0, n, 1.0), 0.0)
        qd = np.where(nq > 0, q / np.where(nq > 0, nq, 1.0), 0.0)
    d = p - qd
    if distance == "equal":
        out = 0.5 * np.abs(d).sum(axis=-1)
    elif distance == "ordered":
        present = (c > 0) | (q > 0)
        m = present.sum(axis=-1)
        steps = (np.abs(np.cumsum(d, axis=-1)) * present).sum(axis=-1)
        out = np.where(m > 1, steps / np.maximum(m - 1, 1), 0.0)
    else:
        raise ValueError(f"distance: must be 'equal' or 'ordered', got {distance!r}")
    empty = (n[..., 0] <= 0) | (nq[..., 0] <= 0)
    return np.where(empty, 1.0, out)


def value_sort_key(v: Any) -> tuple[bool, Any, str]:
    """Sort key of sensitive values: numbers ascending, then text in code-point order."""
    return (isinstance(v, str), v if not isinstance(v, str) else 0, str(v))


def sorted_values(values: Iterable[Any]) -> list[Any]:
    """Values in the order of the ordered distance (and of published rows): numbers ascending, then text."""
    return sorted(values, key=value_sort_key)


def counts_matrix(classes: Sequence[Mapping[Any, int]], reference: Mapping[Any, int] | None = None,
                  ) -> tuple[list[Any], np.ndarray, np.ndarray | None]:
    """Counts given as mappings (value -> count) as one matrix over the sorted union of their values:
    (values, ``(len(classes), m)`` counts, the reference as a row or None)."""
    keys: set[Any] = set()
    for c in classes:
        keys.update(c)
    if reference is not None:
        keys.update(reference)
    values = sorted_values(keys)
    index = {v: i for i, v in enumerate(values)}
    mat = np.zeros((len(classes), len(values)))
    for row, c in enumerate(classes):
        for v, n in c.items():
            mat[row, index[v]] += n
    ref = None
    if reference is not None:
        ref = np.zeros(len(values))
        for v, n in reference.items():
            ref[index[v]] += n
    return values, mat, ref


# ---------------------------------------------------------------------------------------------- the requirement
@dataclass(frozen=True)
class DiversityRequirement:
    """What every released class's sensitive values must satisfy (besides k).

    Attributes:
        model: ``distinct``, ``entropy`` or ``recursive`` (the l-diversity variant; see the module docstring).
        l: the l of the model; None or <= 1: no l-diversity (``recursive`` needs an integer >= 2).
        c: the c of recursive (c, l)-diversity (> 0); only with ``recursive``.
        t: t-closeness threshold in [0, 1]; None: no t-closeness.
        distance: ground distance of t-closeness, ``equal`` or ``ordered`` (resolve ``auto`` with
            :meth:`resolve_distance` first).
    """

    model: str = "distinct"
    l: int | float | None = None  # noqa: E741 - the paper's name
    c: float | None = None
    t: float | None = None
    distance: str = "equal"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.model not in MODELS:
            raise DiversityParameterError("diversity", f"one of {list(MODELS)}", self.model)
        if self.l is not None:
            if self.model == "entropy":
                set_(self, "l", _number(_real("l", self.l, "a number >= 1", lambda v: v >= 1)))
            else:
                lo = 2 if self.model == "recursive" else 1
                v = _real("l", self.l, f"an integer >= {lo}", lambda v: v >= lo and v.is_integer())
                set_(self, "l", int(v))
        if self.model == "recursive":
            if self.l is None:
                raise DiversityParameterError("l", "an integer >= 2 with recursive (c, l)-diversity", None)
            if self.c is None:
                raise DiversityParameterError("c", "a number > 0 with recursive (c, l)-diversity", None)
        if self.c is not None:
            if self.model != "recursive":
                raise DiversityParameterError("c", "unset unless diversity is recursive", self.c)
            set_(self, "c", _number(_real("c", self.c, "a number > 0", lambda v: v > 0)))
        if self.t is not None:
            set_(self, "t", _number(_real("t_closeness", self.t, "a number in [0, 1]", lambda v: 0 <= v <= 1)))
        if self.distance not in ("equal", "ordered"):
            raise DiversityParameterError("t_distance", "equal or ordered (auto is resolved by the attribute)",
                                          self.distance)

    @staticmethod
    def resolve_distance(distance: str, numeric: bool) -> str:
        """``auto`` -> ``ordered`` for a numeric sensitive attribute, ``equal`` for a categorical one; ``ordered``
        needs numeric values (a categorical attribute has no order we could rely on)."""
        if distance not in DISTANCES:
            raise DiversityParameterError("t_distance", f"one of {list(DISTANCES)}", distance)
        if distance == "auto":
            return "ordered" if numeric else "equal"
        if distance == "ordered" and not numeric:
            raise DiversityParameterError("t_distance", "equal or auto for a categorical sensitive attribute "
                                          "(ordered needs numeric values)", distance)
        return distance

    # ------------------------------------------------------------------ properties
    @property
    def l_active(self) -> bool:
        """An l-diversity model is in force (``l`` > 1)."""
        return self.l is not None and self.l > 1

    @property
    def active(self) -> bool:
        """Anything is required (an l-diversity model or t-closeness)."""
        return self.l_active or self.t is not None

    @property
    def min_distinct(self) -> int:
        """Distinct values every satisfying class holds: l (distinct, recursive), ceil(l) (entropy), else 1."""
        if not self.l_active:
            return 1
        assert self.l is not None
        if self.model == "entropy":
            return max(1, math.ceil(self.l - TOLERANCE))
        return int(self.l)

    @property
    def monotone(self) -> bool:
        """Adding records to a satisfying class keeps it satisfying (only distinct l-diversity alone)."""
        return self.t is None and (self.model == "distinct" or not self.l_active)

    @property
    def needs_reference(self) -> bool:
        return self.t is not None

    # ------------------------------------------------------------------ the check
    def check(self, counts: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
        """Verdicts for counts of shape ``(..., m)`` (a class per row); ``reference``: the t-closeness
        reference counts over the same columns (one row, or one per class row), required with ``t``.  With the
        ordered distance the columns must be in ascending value order.  An empty class never satisfies."""
        c = np.asarray(counts, dtype=np.float64)
        ok: np.ndarray = c.sum(axis=-1) > 0
        if self.l_active:
            ok &= self.l_check(c)
        if self.t is not None:
            if reference is None:
                raise ValueError("t-closeness needs the reference distribution")
            ok &= np.asarray(reference, dtype=np.float64).sum(axis=-1) > 0  # no reference: nothing to be close to
            ok &= emd(c, reference, self.distance) <= self.t + TOLERANCE
        return ok

    def l_check(self, c: np.ndarray) -> np.ndarray:
        """The l-diversity part of :meth:`check` (True when no l is in force)."""
        if not self.l_active:
            return np.ones(c.shape[:-1], dtype=bool)
        assert self.l is not None
        verdicts: np.ndarray
        if self.model == "distinct":
            verdicts = np.count_nonzero(c, axis=-1) >= self.l
            return verdicts
        if self.model == "entropy":
            return entropy(c) >= math.log(self.l) - TOLERANCE
        li = int(self.l)
        if c.shape[-1] < li:
            return np.zeros(c.shape[:-1], dtype=bool)
        s = -np.sort(-c, axis=-1)
        verdicts = s[..., 0] < self.c * s[..., li - 1:].sum(axis=-1)
        return verdicts

    def check_row(self, counts: Sequence[float], reference: Sequence[float] | None = None) -> bool:
        """:meth:`check` for one class, in plain Python (no numpy call overhead: the engine's per-cluster test;
        the property tests hold it equal to :meth:`check`).  Same columns and order rules."""
        n = 0.0
        for x in counts:
            n += x
        if n <= 0:
            return False
        if self.l_active:
            lv = self.l
            assert lv is not None
            if self.model == "distinct":
                if sum(1 for x in counts if x > 0) < lv:
                    return False
            elif self.model == "entropy":
                h = math.log(n) - sum(x * math.log(x) for x in counts if x > 0) / n
                if h < math.log(lv) - TOLERANCE:
                    return False
            else:
                li = int(lv)
                desc = sorted((x for x in counts if x > 0), reverse=True)
                if len(desc) < li or not desc[0] < self.c * sum(desc[li - 1:]):  # type: ignore[operator]
                    return False
        if self.t is not None:
            if reference is None:
                raise ValueError("t-closeness needs the reference distribution")
            nq = 0.0
            for x in reference:
                nq += x
            if nq <= 0:
                return False
            if self.distance == "equal":
                d = 0.5 * sum(abs(x / n - q / nq) for x, q in zip(counts, reference, strict=True))
            else:
                cum = steps = 0.0
                m = 0
                for x, q in zip(counts, reference, strict=True):
                    if x > 0 or q > 0:
                        cum += x / n - q / nq
                        steps += abs(cum)
                        m += 1
                d = steps / (m - 1) if m > 1 else 0.0
            if d > self.t + TOLERANCE:
                return False
        return True

    def satisfied(self, counts: Mapping[Any, int], reference: Mapping[Any, int] | None = None) -> bool:
        """:meth:`check_row` for one class given as value -> count (values of any type; ordered: numbers)."""
        _, mat, ref = counts_matrix([counts], reference if self.t is not None else None)
        return self.check_row(mat[0].tolist(), ref.tolist() if ref is not None else None)

    def explain(self, counts: Mapping[Any, int], reference: Mapping[Any, int] | None = None,
                attribute: str = "sensitive") -> list[str]:
        """What a class (value -> count) fails, one line per failed part (empty when it satisfies); lines name
        the model, the class's figure and the bound, never a member's value."""
        _, mat, ref = counts_matrix([counts], reference if self.t is not None else None)
        out = []
        if mat.sum() <= 0:
            return [f"no {attribute!r} values"]
        if self.l_active and not bool(self.l_check(mat)[0]):
            assert self.l is not None
            if self.model == "distinct":
                out.append(f"{int(np.count_nonzero(mat))} distinct {attribute!r} values < l={self.l}")
            elif self.model == "entropy":
                out.append(f"entropy of {attribute!r} {float(entropy(mat)[0]):.4f} < log(l)={math.log(self.l):.4f} "
                           f"(entropy l={self.l})")
            else:
                s = sorted((int(x) for x in mat[0] if x > 0), reverse=True)
                tail = sum(s[int(self.l) - 1:])
                out.append(f"recursive ({self.c}, {self.l}): largest {attribute!r} count {s[0]} >= c x "
                           f"(r_{self.l} + ... + r_m) = {self.c} x {tail}")
        if self.t is not None:
            if ref is None or ref.sum() <= 0:
                out.append("t-closeness: no reference distribution")
            else:
                d = float(emd(mat, ref, self.distance)[0])
                if d > self.t + TOLERANCE:
                    out.append(f"EMD of {attribute!r} to the reference {d:.4f} > t={self.t} ({self.distance} "
                               f"distance)")
        return out

    # ------------------------------------------------------------------ descriptions
    def public_fields(self) -> dict[str, Any]:
        """What a public class message states beyond ``k`` and ``l`` (empty for distinct l-diversity alone):
        ``{"diversity": {"model": ..., "l": ..., ("c": ...)}}`` for entropy / recursive, ``{"t_closeness":
        {"t": ..., "distance": ...}}`` with t-closeness (the message adds the reference)."""
        out: dict[str, Any] = {}
        if self.l_active and self.model != "distinct":
            d: dict[str, Any] = {"model": self.model, "l": self.l}
            if self.model == "recursive":
                d["c"] = self.c
            out["diversity"] = d
        if self.t is not None:
            out["t_closeness"] = {"t": self.t, "distance": self.distance}
        return out

    def describe(self) -> str:
        """``"entropy 1.5-diversity and 0.2-closeness (equal distance)"``; ``"none"`` when nothing is required."""
        parts = []
        if self.l_active:
            if self.model == "recursive":
                parts.append(f"recursive ({self.c}, {self.l})-diversity")
            else:
                parts.append(f"{self.model} {self.l}-diversity")
        if self.t is not None:
            parts.append(f"{self.t}-closeness ({self.distance} distance)")
        return " and ".join(parts) or "none"


# ---------------------------------------------------------------------------------------------- disclosure figures
def disclosure_figures(classes: Iterable[Mapping[Any, int]], prior: Mapping[Any, int] | None = None,
                       share: float = 0.9) -> dict[str, Any]:
    """What released classes disclose about the sensitive value, from each class's counts (value -> count):

    * ``records``, ``classes``;
    * ``share_dominated``: share of released records in classes where one value has >= ``share`` of the class;
    * ``majority_guess``: an attacker who places a record in its class and guesses the class's most frequent
      value is right for this share of released records (sum over classes of the largest count / records);
    * ``prior_released``: the same guess without the release (the overall most frequent value), over the
      released records; ``prior`` (given the counts of all input records): over all records.
    """
    n = dominated = right = n_classes = 0
    overall: dict[Any, int] = {}
    for c in classes:
        size = sum(c.values())
        if size <= 0:
            continue
        top = max(c.values())
        n_classes += 1
        n += size
        right += top
        if top >= share * size:
            dominated += size
        for v, k in c.items():
            overall[v] = overall.get(v, 0) + k
    out: dict[str, Any] = {
        "records": n, "classes": n_classes, "share_dominated": dominated / n if n else 0.0,
        "dominance_threshold": share, "majority_guess": right / n if n else 0.0,
        "prior_released": max(overall.values()) / n if n else 0.0,
    }
    if prior is not None and sum(prior.values()) > 0:
        out["prior"] = max(prior.values()) / sum(prior.values())
    return out


# ---------------------------------------------------------------------------------------------- the reference
class RunningReference:
    """The reference distribution of t-closeness in a stream: the sensitive values of every record that arrived
    in the partition (in this engine instance), frozen in snapshots.

    Rule: after every ``every``-th arrival the snapshot becomes the counts of all arrivals so far; before the
    first snapshot the reference is the live counts.  A class is checked against the reference in force when it
    is released, and the released data carries that reference (the class message's ``t_closeness.reference``;
    ``anonymize``'s meta file), so a verifier recomputes the check exactly.

    Why all arrivals and not the released records: it is the best estimate of the population a reader compares a
    class with (it does not lose the suppressed outliers), and it is ahead of the releases by the delay bound
    (the first class, at arrival ``delta``, is checked against ``delta`` records, not against itself).  Why
    snapshots: the reference a class carries tells the number of arrivals when it was taken; frozen every
    ``every`` (default delta) arrivals it tells no more than the release's own time does, where live counts
    would name the arrival that triggered the release (and with it the member that expired).  Why carried: the
    reference depends on records that are never published (suppressed, still buffered), so neither a reader nor
    a verifier could rebuild it from the releases; carried, each class's claim is checkable on its own.

    The engine keeps the same counts in its own coded arrays; the gate keeps one of these, fed with the records
    the pipeline pushes, and checks each class against it (independently of the engine's).
    """

    __slots__ = ("counts", "every", "seen", "_frozen")

    def __init__(self, every: int):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise DiversityParameterError("t_reference_every", "an integer >= 1", every)
        self.every = every
        self.seen = 0
        self.counts: dict[Any, int] = {}
        self._frozen: tuple[tuple[Any, int], ...] | None = None

    def observe(self, value: Any) -> None:
        """One arrival with sensitive value ``value``."""
        self.counts[value] = self.counts.get(value, 0) + 1
        self.seen += 1
        if self.seen % self.every == 0:
            self._frozen = self._pairs()

    def _pairs(self) -> tuple[tuple[Any, int], ...]:
        return tuple((v, self.counts[v]) for v in sorted_values(self.counts))

    def current(self) -> tuple[tuple[Any, int], ...]:
        """The reference in force: ``(value, count)`` pairs in :func:`sorted_values` order."""
        return self._frozen if self._frozen is not None else self._pairs()
