"""Engine parameters (CASTLE, Cao et al., IEEE TDSC 8(3), 2011; UBDSA, Sopaoglu & Abul, JIIS 54, 2020).

Every parameter is validated when the config is built; a bad value raises :class:`EngineConfigError`
naming the parameter, the allowed range and the value received.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from stream_anon.core.diversity import DISTANCES, DiversityParameterError, DiversityRequirement
from stream_anon.core.validation import require_bool, require_choice, require_float, require_int

ALGORITHMS = ("castle", "ubdsa")
LOSSES = ("gt", "lm", "ubdsa")
LEFTOVER_POLICIES = ("suppress", "leftover")

DEFAULT_ZETA = 1000
"""Default bound of Omega (released clusters kept for reuse): the 1000 most recent ones."""


class EngineConfigError(ValueError):
    """An engine parameter is out of range; ``parameter``, ``allowed`` and ``value`` say which and why."""

    def __init__(self, parameter: str, allowed: str, value: Any):
        super().__init__(f"{parameter}: must be {allowed}, got {value!r}")
        self.parameter = parameter
        self.allowed = allowed
        self.value = value


def _int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    return require_int(name, value, low=lo, high=hi, error=EngineConfigError)


@dataclass(frozen=True)
class EngineConfig:
    """Parameters of the delay-bounded k-anonymity engine.

    Attributes:
        k: every released class holds >= k distinct individuals (k >= 2).
        delta: delay bound in arrivals: when the record at position p arrives, the record at p - delta is
            released (or suppressed) if still buffered. Must be >= k (a smaller buffer can never form a class).
        beta: maximum number of open (non-k-anonymized) clusters, >= 1.
        mu: tau = mean loss of the mu most recently released clusters (tau starts at 0), >= 1.
        algorithm: ``castle`` (Cao et al.) or ``ubdsa`` (delay-aware variant, see docs/engine.md).
        loss: loss that scores cluster choice: ``gt`` (Goldberger-Tassa), ``lm`` (CASTLE/Iyengar), ``ubdsa`` (CAIL).
        leftover: ``suppress`` (CASTLE) or ``leftover`` (ADULT stream paper: an independent leftover cluster).
        delta_leftover: how many further arrivals a leftover record may wait (default: delta).
        l: optional l-diversity of the schema's sensitive attribute, in the model ``diversity`` (None or <= 1:
            none); an integer, or any number >= 1 with ``diversity="entropy"``.
        diversity: the l-diversity model: ``distinct`` (>= l distinct values, CASTLE's extension), ``entropy``
            (entropy >= log l) or ``recursive`` (r_1 < c (r_l + ... + r_m)); :mod:`stream_anon.core.diversity`.
        c: the c of recursive (c, l)-diversity (> 0; only with ``diversity="recursive"``).
        t_closeness: optional t in [0, 1]: the Earth Mover's Distance between every released class's sensitive
            distribution and the stream's running distribution is at most t.
        t_distance: ground distance of t-closeness: ``auto`` (ordered for a numeric sensitive attribute, equal
            for a categorical one), ``equal`` or ``ordered``.
        t_reference_every: the running distribution is frozen in a snapshot after every this many arrivals
            (default: delta); see :class:`~stream_anon.core.diversity.RunningReference`.
        zeta: Omega (reuse set) keeps at most the zeta most recently released clusters (0 disables reuse).
        max_age: Omega also drops clusters released more than max_age arrivals ago (None: no age limit).
        max_delay_seconds: optional wall-clock bound: a record buffered longer than this (by ``now``) is
            handled as if its delay had expired.
        adaptive_delay: adjust the effective delay in [delta_min, delta] after each release.
        delta_min: lower end of the adaptive delay (default: max(k, delta // 4)).
        seed: seed of the engine's generator (random choices of CASTLE); None: OS entropy.
        age_weight: UBDSA only: weight of the age pressure in the cluster-choice score (per-record loss units).
        release_slack: UBDSA only: a k-anonymous cluster is released early when its loss is at most
            tau * (1 + release_slack * age), age = (p - its oldest arrival) / delta in [0, 1].
    """

    k: int
    delta: int
    beta: int
    mu: int
    algorithm: str = "castle"
    loss: str = "gt"
    leftover: str = "suppress"
    delta_leftover: int | None = None
    l: int | float | None = None  # noqa: E741 - the paper's name
    diversity: str = "distinct"
    c: float | None = None
    t_closeness: float | None = None
    t_distance: str = "auto"
    t_reference_every: int | None = None
    zeta: int = DEFAULT_ZETA
    max_age: int | None = None
    max_delay_seconds: float | None = None
    adaptive_delay: bool = False
    delta_min: int | None = None
    seed: int | None = 0
    age_weight: float = 0.5
    release_slack: float = 1.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "k", _int("k", self.k, 2))
        set_(self, "delta", _int("delta", self.delta, self.k))
        set_(self, "beta", _int("beta", self.beta, 1))
        set_(self, "mu", _int("mu", self.mu, 1))
        require_choice("algorithm", self.algorithm, ALGORITHMS, error=EngineConfigError)
        require_choice("loss", self.loss, LOSSES, error=EngineConfigError)
        require_choice("leftover", self.leftover, LEFTOVER_POLICIES, error=EngineConfigError)
        if self.delta_leftover is not None:
            set_(self, "delta_leftover", _int("delta_leftover", self.delta_leftover, 1))
        try:
            req = DiversityRequirement(model=self.diversity, l=self.l, c=self.c, t=self.t_closeness)
        except DiversityParameterError as e:
            raise EngineConfigError(e.parameter, e.allowed, e.value) from None
        set_(self, "l", req.l)
        set_(self, "c", req.c)
        set_(self, "t_closeness", req.t)
        if self.t_distance not in DISTANCES:
            raise EngineConfigError("t_distance", f"one of {list(DISTANCES)}", self.t_distance)
        if self.t_reference_every is not None:
            set_(self, "t_reference_every", _int("t_reference_every", self.t_reference_every, 1))
        set_(self, "zeta", _int("zeta", self.zeta, 0))
        if self.max_age is not None:
            set_(self, "max_age", _int("max_age", self.max_age, 1))
        if self.max_delay_seconds is not None:
            set_(self, "max_delay_seconds", require_float(
                "max_delay_seconds", self.max_delay_seconds, low=0.0, low_open=True,
                allowed="a finite number of seconds > 0 (or None)", error=EngineConfigError))
        set_(self, "adaptive_delay", require_bool("adaptive_delay", self.adaptive_delay, error=EngineConfigError))
        if self.delta_min is not None:
            set_(self, "delta_min", _int("delta_min", self.delta_min, self.k, self.delta))
        if self.seed is not None:
            set_(self, "seed", _int("seed", self.seed, 0))
        set_(self, "age_weight", require_float("age_weight", self.age_weight, low=0.0, error=EngineConfigError))
        set_(self, "release_slack", require_float("release_slack", self.release_slack, low=0.0,
                                                  error=EngineConfigError))

    @property
    def effective_delta_leftover(self) -> int:
        return self.delta if self.delta_leftover is None else self.delta_leftover

    @property
    def effective_t_reference_every(self) -> int:
        return self.delta if self.t_reference_every is None else self.t_reference_every

    @property
    def effective_delta_min(self) -> int:
        if self.delta_min is not None:
            return self.delta_min
        return max(self.k, self.delta // 4)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
