"""The anonymization defaults every command shares, defined once: the service (``run``, ``demo``: the
``anonymization`` options of :mod:`stream_anon.config.settings`), the offline tools (``anonymize``), the benchmarks
(``bench engine``, ``bench service``, ``bench release-path``) and the report's recomputation (``report
--compute-extras``, which starts from the run's own settings).  Each command shows them in its ``--help``.

k = 10, delta = 1000 (CASTLE's delay bound, in arrivals), beta = 50, mu = 100, CASTLE with GT loss, leftover records
suppressed, distinct l = 2 of the sensitive attribute with t-closeness t = 0.2 against the stream's running
distribution, and no cluster reuse (zeta = 0): what the threat model relies on (docs/threat-model.md).  The engine's constructor (:class:`~stream_anon.core.engine.EngineConfig`) keeps
the paper's own behaviour where a caller gives nothing (no l, reuse of the last 1000 clusters) for the experiments
that reproduce the papers; no command uses those.

Pure and import-free, so that ``--help`` stays fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class AnonymizationDefaults:
    """The engine parameters every command starts from (see the module docstring)."""

    k: int = 10
    delta: int = 1000
    beta: int = 50
    mu: int = 100
    algorithm: str = "castle"
    loss: str = "gt"
    leftover: str = "suppress"
    l: int | float | None = 2  # noqa: E741  (l of the l-diversity model; None: none)
    diversity: str = "distinct"  # the l-diversity model: distinct | entropy | recursive (core/diversity.py)
    c: float | None = None  # c of recursive (c, l)-diversity
    t_closeness: float | None = 0.2  # t-closeness against the running distribution (docs/threat-model.md)
    t_distance: str = "auto"  # ground distance of t-closeness: auto | equal | ordered
    zeta: int = 0  # CASTLE's cluster reuse: off

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """``k=10 delta=1000 beta=50 mu=100 castle/gt leftover=suppress distinct l=2 t=0.2 zeta=0`` (for --help
        texts)."""
        t = f" t={self.t_closeness}" if self.t_closeness is not None else ""
        c = f" c={self.c}" if self.c is not None else ""
        return (f"k={self.k} delta={self.delta} beta={self.beta} mu={self.mu} {self.algorithm}/{self.loss} "
                f"leftover={self.leftover} {self.diversity} l={self.l if self.l is not None else 'none'}{c}{t} "
                f"zeta={self.zeta}")


DEFAULTS = AnonymizationDefaults()

DIVERSITY_MODELS = ("distinct", "entropy", "recursive")
"""The l-diversity variants (``diversity`` option; :mod:`stream_anon.core.diversity`)."""
T_DISTANCES = ("auto", "equal", "ordered")
"""Ground distances of t-closeness (``t_distance`` option): auto = ordered for numeric, equal otherwise."""

REPORT_GRID_KS = (5, 10, 25, 50)
"""``report --compute-extras``: the k values of the loss grid (the run's own k is added)."""
REPORT_GRID_DELTAS = (250, 500, 1000, 2000)
"""``report --compute-extras``: the delta values of the loss grid (the run's own delta is added)."""
REPORT_EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""``report --compute-extras``: the epsilons of the LDP error curves."""
