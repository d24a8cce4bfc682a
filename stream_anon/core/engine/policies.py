"""The optional policies around CASTLE's loop and the hooks through which the loop calls them (docs/castle.md).

The engine (:mod:`stream_anon.core.engine.castle`) holds each enabled policy as an attribute (``None`` when
off) and calls it at fixed points of the loop:

* ``policy.age_coefficient(J, delta_eff)``: scoring of clusters below k in best_selection, and
  ``policy.releases_early(loss, tau, age)``: after t joins a k-anonymous cluster (:class:`Policy`, the
  UBDSA-style variant; CASTLE's policy does neither);
* ``wall_clock.expire(now)``: after each arrival's position-based delay check, and from
  ``Engine.expire(now)`` on an idle stream (:class:`WallClockBound`, ``max_delay_seconds``);
* ``leftover.take(slot, person, value, p)``: in delay_constraint, for a record CASTLE would suppress;
  ``leftover.after_arrival(p)``: after each arrival's delay checks; ``leftover.flush()``: at end of stream
  (:class:`~stream_anon.core.engine.leftover.LeftoverCluster`, ``leftover="leftover"``);
* ``adaptive.after_release(values)``: in output_cluster after each released class; returns the new
  effective delay (:class:`AdaptiveDelay`, ``adaptive_delay``).

l-diversity is a condition rather than a hook: :meth:`Tally.meets <stream_anon.core.engine.tally.Tally.meets>`
and split_l (:mod:`stream_anon.core.engine.split`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from stream_anon.core.engine.config import EngineConfig


@dataclass(frozen=True)
class Policy:
    """CASTLE or the UBDSA-style variant (Sopaoglu & Abul, J. Intell. Inf. Syst. 54:605-631, 2020).

    UBDSA's full text is not available to us; this is the documented variant of docs/castle.md:

    * **Age pressure in cluster choice**: the score of joining cluster C is ``E(C, t) - w J age(C)`` while C is
      below k, ``age(C) = (p - oldest arrival in C) / delta`` in [0, 1], ``w = age_weight``
      (:meth:`age_coefficient`; ``E`` is summed over the J QIs).
    * **Early release**: a k-anonymous (and l-diverse) cluster is released at once when its loss is at most
      ``tau (1 + s age(C))``, ``s = release_slack`` (:meth:`releases_early`).

    CASTLE uses neither (``age_weight = 0``, release only when a record's delay expires).
    """

    name: str
    age_weight: float  # 0 for CASTLE
    early_release: bool
    release_slack: float = 0.0

    @classmethod
    def from_config(cls, config: EngineConfig) -> Policy:
        if config.algorithm == "ubdsa":
            return cls(name="ubdsa", age_weight=config.age_weight, early_release=True,
                       release_slack=config.release_slack)
        return cls(name="castle", age_weight=0.0, early_release=False)

    @property
    def age_pressure(self) -> bool:
        return self.age_weight > 0.0

    def age_coefficient(self, j: int, delta_eff: int) -> float:
        """Weight of (p - oldest arrival) in the score of a cluster below k: ``w J / delta``."""
        return self.age_weight * j / delta_eff

    def releases_early(self, loss_sum: float, tau_sum: float, age: float) -> bool:
        """A releasable cluster with loss (summed over QIs) ``loss_sum`` and age in [0, 1] is released now."""
        return loss_sum <= tau_sum * (1.0 + self.release_slack * age)


class WallClockBound:
    """``max_delay_seconds``: a record buffered for >= ``seconds`` (by the ``now`` given to push / expire) goes
    through delay_constraint as if its position-based delay had expired.

    ``expire_waiting_since(bound)`` is the engine's walk over the buffer in arrival order that handles every
    record that arrived at or before ``bound``; the bound holds to the granularity of the calls."""

    def __init__(self, seconds: float, expire_waiting_since: Callable[[float], None]):
        self.seconds = seconds
        self._expire_waiting_since = expire_waiting_since

    def expire(self, now: float) -> None:
        self._expire_waiting_since(now - self.seconds)


class AdaptiveDelay:
    """Adaptive delay (``adaptive_delay``): the effective delay in [delta_min, delta] after each release.

    The ADULT stream paper's exact rule is not available; ours: over the last W = mu released classes,
    r = (1/J) sum_a D_a / W, D_a = distinct released values of QI a (1: every class has its own values, a fine
    output; small: classes collapse onto the same coarse nodes); delta_eff = delta_min + (delta - delta_min)
    (1 - r): a coarse output gets more time to gather similar records, a fine one is released sooner.
    """

    def __init__(self, delta: int, delta_min: int, window: int, n_qis: int):
        self.delta = delta
        self.delta_min = delta_min
        self.recent: deque[tuple[str, ...]] = deque(maxlen=window)
        self.value_counts: list[dict[str, int]] = [{} for _ in range(n_qis)]

    def after_release(self, key: tuple[str, ...]) -> int:
        """Record the released values (one per QI) of a class; return the new effective delay."""
        keys, counts = self.recent, self.value_counts
        if len(keys) == keys.maxlen:
            for c, v in zip(counts, keys[0], strict=True):
                c[v] -= 1
                if c[v] == 0:
                    del c[v]
        keys.append(key)
        for c, v in zip(counts, key, strict=True):
            c[v] = c.get(v, 0) + 1
        r = sum(len(c) for c in counts) / (len(counts) * len(keys))
        return int(round(self.delta_min + (self.delta - self.delta_min) * (1.0 - r)))
