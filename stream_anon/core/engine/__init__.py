"""Delay-bounded k-anonymity engine: CASTLE (Cao et al., IEEE TDSC 2011) and a UBDSA-style policy.

``from stream_anon.core.engine import Engine, EngineConfig, Release``; see docs/engine.md.
"""

from stream_anon.core.engine.castle import Engine
from stream_anon.core.engine.config import DEFAULT_ZETA, EngineConfig, EngineConfigError
from stream_anon.core.engine.release import Release

__all__ = ["DEFAULT_ZETA", "Engine", "EngineConfig", "EngineConfigError", "Release"]
