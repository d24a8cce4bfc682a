"""What a caller of the engine relies on: the :class:`EngineLike` protocol that :class:`~stream_anon.core.engine.Engine`
implements (the service's pipeline is written against it; a test can hand it any engine with these methods)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from stream_anon.core.engine.release import Release


class EngineLike(Protocol):
    """A delay-bounded k-anonymity engine: records in (in arrival order), releases out.

    ``push`` and ``push_encoded`` give the same releases; ``push_encoded`` takes the QI encoding of the record
    from one vectorized ``encode_many`` over a run of records (``encode_many(columns)[i]`` belongs to the i-th
    record of the run).
    """

    def encode_many(self, columns: Mapping[str, Sequence[Any]]) -> np.ndarray:
        """QI name -> column of values (one per record) -> one encoded row per record."""
        ...

    def push(self, record: Mapping[str, Any], now: float | None = None) -> list[Release]:
        """One validated record; returns the releases its arrival triggered (``now``: seconds, wall clock)."""
        ...

    def push_encoded(self, record: Mapping[str, Any], v: np.ndarray, now: float | None = None) -> list[Release]:
        """:meth:`push` with the record's row of :meth:`encode_many`."""
        ...

    def flush(self, now: float | None = None) -> list[Release]:
        """End of stream: release or suppress everything buffered."""
        ...

    def expire(self, now: float) -> list[Release]:
        """Apply the wall-clock delay bound without an arrival (no-op when the engine has none)."""
        ...

    @property
    def buffered_records(self) -> int:
        """Records pushed and not yet released or suppressed."""
        ...

    @property
    def open_clusters(self) -> int:
        """Clusters being formed (not yet released)."""
        ...
