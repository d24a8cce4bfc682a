"""Cluster-choice and release policies: CASTLE (Cao et al. 2011) and a UBDSA-style delay-aware variant.

UBDSA (Sopaoglu & Abul, J. Intell. Inf. Syst. 54:605-631, 2020) minimizes the *average* delay while
keeping quality, with a utility that trades data quality against data aging.  Its full text is not
available to us; :class:`Policy` implements the documented variant described in docs/engine.md:

* **Age pressure in cluster choice.** The score of joining cluster C is
  ``E(C, t) - w * J * age(C)`` for clusters still below k, where ``E`` is the enlargement of the selected
  loss, ``age(C) = (p - oldest arrival in C) / delta`` in [0, 1] and ``w`` is ``EngineConfig.age_weight``
  (per-record-loss units; J = number of QIs, because E is summed over QIs).  Clusters close to their
  deadline that still need records attract them, so fewer records reach the deadline in a small cluster.
* **Early release.** As soon as a cluster is k-anonymous (and l-diverse) *and* its loss is at most
  ``tau * (1 + s * age(C))`` (``s = EngineConfig.release_slack``: the older the cluster, the more loss is
  accepted -- utility trades quality against aging), it is released at once instead of waiting for its
  oldest record's deadline.  This lowers the average delay; the maximum delay bound delta is unchanged.

CASTLE uses neither (``w = 0``, release only when a record's delay expires).
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_anon.core.engine.config import EngineConfig


@dataclass(frozen=True)
class Policy:
    """What the selected algorithm changes in the CASTLE loop."""

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
