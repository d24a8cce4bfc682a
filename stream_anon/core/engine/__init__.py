"""Delay-bounded k-anonymity engine: CASTLE (Cao et al., IEEE TDSC 2011) and a UBDSA-style policy.

``from stream_anon.core.engine import Engine, EngineConfig, Release``; see docs/engine.md.
"""

from stream_anon.core.engine.castle import Engine
from stream_anon.core.engine.config import DEFAULT_ZETA, EngineConfig, EngineConfigError
from stream_anon.core.engine.release import Release

__all__ = ["DEFAULT_ZETA", "Engine", "EngineConfig", "EngineConfigError", "Release", "warm_up"]


def warm_up() -> None:
    """Import numba and load (or, the first time, compile) the engine's compiled pass now: 1-2 s on a slow machine,
    paid at a process's start instead of by the first records of its first engine (the service's pipeline
    executors call it when they start; a no-op after the first call)."""
    from stream_anon.core.engine.kernels import warm_up as load_kernels

    load_kernels()
