"""Per-person eps cap in bounded memory: a keyed count-min sketch that never under-counts a person's spending.

When a schema has a person id, every record of the same person spends from that person's total.  An exact
ledger keeps one number per person (unbounded); :class:`PersonBudgetSketch` keeps ``depth`` x ``width``
counters instead (Cormode & Muthukrishnan, "An improved data stream summary: the count-min sketch", 2005) with
the *conservative update* (Estan & Varghese 2002):

* person p hashes to one counter per row, h_r(p) = 4 bytes of one BLAKE2b digest keyed with a secret 256-bit key,
  mod ``width`` (so nobody who does not hold the key can choose ids that collide);
* its estimate is min_r C[r, h_r(p)]; a spend of eps is accepted iff estimate + eps <= cap (relative tolerance
  1e-9, as :class:`~stream_anon.privacy.budget.BudgetAccountant`), and then every one of its counters is raised
  to max(C, estimate + eps) (rounded up to the next double).

Invariant: every counter is >= the true total of every person hashed to it (counters only grow; an accepted
spend raises the person's counters to >= its new true total), so the estimate never under-counts and **no
person is ever allowed more than the cap**.  The price is false refusals: a person can be refused because
others share all its counters.  For a person that has spent s and asks for eps, with S the total accepted by
everyone, a refusal needs every row to carry more than cap - s - eps of others' spending; with the key unknown
to whoever chooses the spends, each row's excess has mean at most S / width, so by Markov and the independence of
the rows

    P(false refusal) <= (S / (width * (cap - s - eps)))^depth      (:meth:`false_refusal_bound`).

Memory: ``depth * width * 8`` bytes (the side paths' default 8 x 2^17: 8 MiB), fixed.  Size it so S / (width * cap)
stays small: with N persons each spending up to the cap, the bound for a fresh person asking for cap/2 is
(2N/width)^depth.  When every person spends about the whole cap at once (the side paths' default: one pass of a
record spends nearly its lifetime cap) the sketch is a partitioned Bloom filter: a fresh person is refused when all
its ``depth`` counters are taken, with probability about (1 - e^(-N/width))^depth after N persons (8 x 2^17 and all
of ADULT, N = 32,561: 5.5e-6 per record).
The state (:meth:`to_dict`) contains the key and must stay internal.
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.core.validation import is_int, require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, parameter_error
from stream_anon.privacy.budget import (
    RELATIVE_TOLERANCE,
    STATE_ERROR,
    STATE_VERSION,
    BudgetExhaustedError,
    BudgetStateError,
)

__all__ = ["PersonBudgetSketch", "person_key_bytes"]


def person_key_bytes(person_id: Any) -> bytes:
    """Canonical bytes of a person id (int, str or bytes; type-tagged so 7 and "7" differ)."""
    if is_int(person_id):
        return b"i" + str(int(person_id)).encode()
    if isinstance(person_id, str):
        return b"s" + person_id.encode("utf-8")
    if isinstance(person_id, bytes):
        return b"b" + person_id
    raise parameter_error("person_id", "an int, a str or bytes", person_id)


class PersonBudgetSketch:
    """Conservative count-min sketch of eps spent per person, refusing spends past ``cap_epsilon`` (module doc).

    ``width`` counters per row (16..2^30), ``depth`` rows (1..16), ``key`` 16..64 secret bytes (default 32 from
    ``secrets``).  ``try_spend`` is vectorized over a batch and processes a person's repeated ids in order.
    """

    def __init__(self, *, cap_epsilon: float, width: int = 1 << 18, depth: int = 4, key: bytes | None = None
                 ) -> None:
        self.cap_epsilon = check_epsilon(cap_epsilon, "cap_epsilon")
        self.width = require_int("width", width, low=16, high=1 << 30, error=parameter_error)
        self.depth = require_int("depth", depth, low=1, high=16, error=parameter_error)
        if key is None:
            key = secrets.token_bytes(32)
        if not isinstance(key, bytes) or not 16 <= len(key) <= 64:
            raise PrivacyParameterError(f"key: expected 16..64 bytes, got {type(key).__name__} of length "
                                        f"{len(key) if isinstance(key, bytes) else '-'}")
        self._key = key
        self.counters = np.zeros((self.depth, self.width), dtype=np.float64)
        self.total_spent = 0.0
        self.n_spends = 0
        self.n_refused = 0

    def __repr__(self) -> str:
        return (f"PersonBudgetSketch(cap_epsilon={self.cap_epsilon!r}, width={self.width}, depth={self.depth}, "
                f"spends={self.n_spends}, refused={self.n_refused})")

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the counters (fixed at construction)."""
        return int(self.counters.nbytes)

    # ------------------------------------------------------------------ hashing
    @property
    def key_hex(self) -> str:
        """The secret hash key, hex (keep it internal)."""
        return self._key.hex()

    def cells(self, person_ids: Iterable[Any]) -> np.ndarray:
        """(n, depth) counter indices of the persons (one keyed BLAKE2b digest, 4 bytes per row)."""
        return self._cells_of([person_key_bytes(pid) for pid in person_ids])

    def _cells_of(self, keys: Sequence[bytes]) -> np.ndarray:
        size, key = 4 * self.depth, self._key
        digests = b"".join([hashlib.blake2b(k, key=key, digest_size=size).digest() for k in keys])
        words = np.frombuffer(digests, dtype="<u4").reshape(len(keys), self.depth)
        return (words % np.uint32(self.width)).astype(np.int64)

    def estimate(self, person_ids: Iterable[Any]) -> np.ndarray:
        """Upper bounds of what each person has spent (min over its counters)."""
        c = self.cells(person_ids)
        return self._estimate_cells(c)

    def _estimate_cells(self, c: np.ndarray) -> np.ndarray:
        rows = np.arange(self.depth)[None, :]
        return self.counters[rows, c].min(axis=1) if c.shape[0] else np.zeros(0)

    def remaining(self, person_id: Any) -> float:
        """What the person may still spend (a lower bound of the true rest)."""
        return max(0.0, self.cap_epsilon - float(self.estimate([person_id])[0]))

    # ------------------------------------------------------------------ spending
    def try_spend(self, person_ids: Sequence[Hashable], epsilon: float | Sequence[float] | np.ndarray
                  ) -> np.ndarray:
        """Accept or refuse one spend per element (in order for repeated ids); returns the accepted mask.

        ``epsilon``: one value for all, or one per element.  Refused spends change nothing.
        """
        return self.try_spend_cells(person_ids, epsilon)[0]

    def try_spend_cells(self, person_ids: Sequence[Hashable], epsilon: float | Sequence[float] | np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`try_spend`, also returning the (n, depth) counter indices of the persons (each id hashed once)."""
        ids = list(person_ids)
        n = len(ids)
        eps = np.asarray(epsilon, dtype=np.float64)
        if eps.ndim == 0:
            eps = np.full(n, float(eps))
        if eps.shape != (n,):
            raise PrivacyParameterError(f"epsilon: expected one value or {n} values, got shape {eps.shape}")
        if n and (not np.all(np.isfinite(eps)) or np.any(eps <= 0)):
            raise PrivacyParameterError(f"epsilon: every spend must be in (0, inf), got {eps[~(eps > 0)][:1]!r}")
        keys = [person_key_bytes(pid) for pid in ids]
        cells = self._cells_of(keys)
        occurrence = np.empty(n, dtype=np.int64)
        seen: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            occurrence[i] = seen.get(k, 0)
            seen[k] = occurrence[i] + 1
        accepted = np.zeros(n, dtype=bool)
        limit = self.cap_epsilon * (1.0 + RELATIVE_TOLERANCE)
        rows = np.arange(self.depth)
        for r in range(int(occurrence.max()) + 1 if n else 0):
            idx = np.flatnonzero(occurrence == r)
            c = cells[idx]
            est = self._estimate_cells(c)
            new = np.nextafter(est + eps[idx], np.inf)  # rounded up: never below the true total
            ok = new <= limit
            for row in rows:
                np.maximum.at(self.counters[row], c[ok, row], new[ok])
            accepted[idx[ok]] = True
        self.n_spends += int(accepted.sum())
        self.n_refused += int(n - accepted.sum())
        self.total_spent = math.fsum([self.total_spent, float(eps[accepted].sum())])
        return accepted, cells

    def spend(self, person_id: Hashable, epsilon: float, label: str = "") -> None:
        """Spend for one person or raise :class:`BudgetExhaustedError` (nothing spent)."""
        eps = check_epsilon(epsilon)
        if not self.try_spend([person_id], eps)[0]:
            rest = self.remaining(person_id)
            raise BudgetExhaustedError(
                f"per-person budget: {label or 'release'} needs epsilon={eps:.6g} but at most {rest:.6g} of the "
                f"person's cap epsilon={self.cap_epsilon:.6g} may remain (count-min estimate, never an under-count)",
                requested=eps, remaining=rest, total=self.cap_epsilon, label=label)

    def false_refusal_bound(self, epsilon: float, spent: float = 0.0) -> float:
        """Markov bound (S / (width (cap - spent - eps)))^depth on refusing a person who truly fits."""
        slack = self.cap_epsilon - spent - check_epsilon(epsilon)
        if slack <= 0:
            return 1.0
        return min(1.0, self.total_spent / (self.width * slack)) ** self.depth

    def fresh_refusal_rate(self, epsilon: float) -> float:
        """The chance that a person never seen before is refused ``epsilon`` now: the product over the rows of the
        share of counters above ``cap - epsilon`` (exact for a key the sketch's secret hash spreads uniformly)."""
        limit = self.cap_epsilon * (1.0 + RELATIVE_TOLERANCE) - check_epsilon(epsilon)
        if limit < 0:
            return 1.0
        return float(np.prod(np.count_nonzero(self.counters > limit, axis=1) / self.width))

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable state (includes the secret key: keep it internal)."""
        return {"kind": "PersonBudgetSketch", "version": STATE_VERSION, "cap_epsilon": self.cap_epsilon,
                "width": self.width, "depth": self.depth, "key": self._key.hex(),
                "counters": base64.b64encode(self.counters.astype("<f8").tobytes()).decode("ascii"),
                "total_spent": self.total_spent, "n_spends": self.n_spends, "n_refused": self.n_refused}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], *, cap_epsilon: float | None = None) -> PersonBudgetSketch:
        """Restore :meth:`to_dict`; ``cap_epsilon`` replaces the stored cap (spending is kept).  Raises
        :class:`BudgetStateError` naming the field for anything malformed."""
        if not isinstance(state, Mapping) or state.get("kind") != "PersonBudgetSketch":
            raise BudgetStateError(f"budget state: kind must be 'PersonBudgetSketch', got "
                                   f"{state.get('kind') if isinstance(state, Mapping) else type(state).__name__!r}")
        if state.get("version") != STATE_VERSION:
            raise BudgetStateError(f"budget state: version must be {STATE_VERSION}, got {state.get('version')!r}")
        try:
            key = bytes.fromhex(str(state["key"]))
            width, depth = int(state["width"]), int(state["depth"])
            cap = float(state["cap_epsilon"]) if cap_epsilon is None else check_epsilon(cap_epsilon, "cap_epsilon")
            sketch = cls(cap_epsilon=cap, width=width, depth=depth, key=key)
            raw = base64.b64decode(str(state["counters"]), validate=True)
        except (KeyError, ValueError, TypeError, PrivacyParameterError) as e:
            raise BudgetStateError(f"budget state: PersonBudgetSketch field unreadable: {e}") from None
        if len(raw) != 8 * width * depth:
            raise BudgetStateError(f"budget state: counters must be {depth} x {width} doubles "
                                   f"({8 * width * depth} bytes), got {len(raw)} bytes")
        counters = np.frombuffer(raw, dtype="<f8")
        if counters.size != width * depth or not np.all(np.isfinite(counters)) or np.any(counters < 0):
            raise BudgetStateError(f"budget state: counters must be {depth} x {width} finite non-negative doubles, "
                                   f"got {counters.size} values")
        sketch.counters = counters.reshape(depth, width).astype(np.float64)
        for name in ("n_spends", "n_refused"):
            setattr(sketch, name, require_int(name, state.get(name), low=0, error=STATE_ERROR))
        sketch.total_spent = require_float("total_spent", state.get("total_spent"), low=0.0, error=STATE_ERROR)
        return sketch
