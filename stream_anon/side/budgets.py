"""The side paths' cumulative privacy budgets and their persisted state, pure (no Kafka).

Two budgets accumulate over the stream and must survive a restart:

* the k-means stream budget (``side_paths.kmeans.total_epsilon``): a
  :class:`~stream_anon.privacy.budget.BudgetAccountant` charged each released window's exact eps;
* the per-person cap (``side_paths.person_budget.cap_epsilon``, schemas with a person id): a
  :class:`~stream_anon.privacy.person_budget.PersonBudgetSketch` charged one record's total eps per record.

:class:`SideBudgets` holds them and turns every change into **state records** (key -> bytes) for a store that
keeps the latest value per key (the internal compacted topic ``<input>.side-budget``; the side app writes them
and waits for the broker's acknowledgement BEFORE it publishes the outputs that spent them, so a crash can only
over-count, never under-count).  :meth:`SideBudgets.restore` reads them back at start; a state that exists but
cannot be read raises :class:`SideStateError` (the side paths then refuse to start).

Keys (``<scope>`` = the side paths' consumer group):

* ``<scope>/kmeans``: the accountant (:meth:`BudgetAccountant.to_dict`, JSON);
* ``<scope>/person/meta``: width, depth and the sketch's secret hash key (JSON; the topic is internal);
* ``<scope>/person/delta/<slot>``: the counters a batch changed (flat cell index, new value), in a ring of
  :data:`DELTA_SLOTS` slots;
* ``<scope>/person/chunk/<i>``: a snapshot of all counters, in chunks of :data:`CHUNK_CELLS`, written when the
  deltas since the last snapshot would fill the ring or outgrow the snapshot.  A delta slot is reused only after
  a snapshot that covers it was acknowledged.

Counters only grow and every record written holds values the counters really had, so :meth:`restore` takes the
cell-wise MAXIMUM of every snapshot chunk and delta it finds: a partly written snapshot or delta (a crash in the
middle of a write) never lowers a counter below what any published output spent.  The value of a binary record is
one line of JSON (its header), a newline, then little-endian arrays.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.privacy.budget import BudgetAccountant, BudgetSpend, BudgetStateError
from stream_anon.privacy.person_budget import PersonBudgetSketch

STATE_FORMAT = 1
DELTA_SLOTS = 64
"""Delta records kept per sketch (a ring: slot = sequence number mod DELTA_SLOTS)."""
DELTA_CELLS = 32_768
"""Changed cells per delta record at most (16 bytes each: 512 KiB)."""
CHUNK_CELLS = 65_536
"""Counters per snapshot chunk (8 bytes each: 512 KiB)."""


class SideStateError(ValueError):
    """The side paths' persisted budget state exists but cannot be read (the message names the key)."""


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


def _binary(header: Mapping[str, Any], *arrays: np.ndarray) -> bytes:
    return b"".join([_json(dict(header)), b"\n", *(a.tobytes() for a in arrays)])


def _split_binary(key: str, value: bytes) -> tuple[dict[str, Any], bytes]:
    head, sep, payload = value.partition(b"\n")
    if not sep:
        raise SideStateError(f"budget state: key {key!r}: no header line")
    try:
        header = json.loads(head)
    except ValueError as e:
        raise SideStateError(f"budget state: key {key!r}: header is not JSON ({e})") from None
    if not isinstance(header, dict) or header.get("v") != STATE_FORMAT:
        raise SideStateError(f"budget state: key {key!r}: expected a header with v={STATE_FORMAT}, got {head[:80]!r}")
    return header, payload


def _int_field(key: str, header: Mapping[str, Any], name: str, lo: int = 0) -> int:
    v = header.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SideStateError(f"budget state: key {key!r}: {name} must be an integer >= {lo}, got {v!r}")
    return v


class SideBudgets:
    """The cumulative budgets of one side-path consumer group (``scope``); see the module docstring.

    ``kmeans_total``: the k-means stream budget (None: none); ``person_cap``, ``person_width``, ``person_depth``:
    the per-person sketch (cap None: none).
    """

    def __init__(self, *, scope: str, kmeans_total: float | None = None, person_cap: float | None = None,
                 person_width: int = 1 << 18, person_depth: int = 4) -> None:
        self.scope = scope
        self.kmeans: BudgetAccountant | None = (BudgetAccountant(total_epsilon=kmeans_total)
                                                if kmeans_total is not None else None)
        self.person: PersonBudgetSketch | None = (PersonBudgetSketch(cap_epsilon=person_cap, width=person_width,
                                                                     depth=person_depth)
                                                  if person_cap is not None else None)
        self.restored = False
        self._kmeans_dirty = False
        self._meta_written = False
        self._changed: list[np.ndarray] = []  # flat counter indices changed since the last take_updates
        self._seq = 0  # sequence number of the last delta record (or snapshot) written
        self._parts_since_snapshot = 0
        self._cells_since_snapshot = 0

    # ------------------------------------------------------------------ views
    @property
    def persistent(self) -> bool:
        """True when there is a cumulative budget to persist."""
        return self.kmeans is not None or self.person is not None

    def key(self, *parts: str) -> str:
        return "/".join((self.scope, *parts))

    # ------------------------------------------------------------------ spending
    def spend_kmeans(self, epsilon: float, label: str) -> BudgetSpend:
        """Charge the k-means stream budget (raises ``BudgetExhaustedError``, spending nothing, if it does not fit)."""
        assert self.kmeans is not None
        spend = self.kmeans.spend(epsilon, label)
        self._kmeans_dirty = True
        return spend

    def spend_person(self, person_ids: Sequence[Any], epsilon: float) -> np.ndarray:
        """Charge each record's person ``epsilon`` (in order); returns the accepted mask (refused: nothing spent)."""
        sketch = self.person
        assert sketch is not None
        mask = sketch.try_spend(person_ids, epsilon)
        if mask.any():
            accepted = [p for p, ok in zip(person_ids, mask.tolist(), strict=True) if ok]
            cells = sketch.cells(accepted)  # (n, depth): row r's cell index
            flat = (np.arange(sketch.depth, dtype=np.int64)[None, :] * sketch.width + cells).reshape(-1)
            self._changed.append(flat)
        return mask

    # ------------------------------------------------------------------ persistence
    def take_updates(self) -> dict[str, bytes]:
        """The state records of every change since the last call (empty: nothing to write).  Write them, and wait
        for the acknowledgement, before publishing anything that spent them."""
        out: dict[str, bytes] = {}
        if self.kmeans is not None and self._kmeans_dirty:
            out[self.key("kmeans")] = _json(self.kmeans.to_dict(history=10))
            self._kmeans_dirty = False
        sketch = self.person
        if sketch is not None and self._changed:
            if not self._meta_written:
                out[self.key("person", "meta")] = _json(self._meta(sketch))
                self._meta_written = True
            cells = np.unique(np.concatenate(self._changed))
            self._changed = []
            n_parts = math.ceil(cells.size / DELTA_CELLS)
            if (self._parts_since_snapshot + n_parts > DELTA_SLOTS
                    or 2 * (self._cells_since_snapshot + cells.size) > sketch.counters.size):
                out.update(self._snapshot(sketch))
            else:
                flat = sketch.counters.reshape(-1)
                for start in range(0, cells.size, DELTA_CELLS):
                    part = cells[start:start + DELTA_CELLS].astype("<i8")
                    self._seq += 1
                    header = {"v": STATE_FORMAT, "seq": self._seq, "cells": int(part.size), **self._stats(sketch)}
                    out[self.key("person", "delta", str(self._seq % DELTA_SLOTS))] = _binary(
                        header, part, flat[part].astype("<f8"))
                self._parts_since_snapshot += n_parts
                self._cells_since_snapshot += int(cells.size)
        return out

    def _meta(self, sketch: PersonBudgetSketch) -> dict[str, Any]:
        state = sketch.to_dict()
        return {"v": STATE_FORMAT, "kind": "PersonBudgetSketch", "width": sketch.width, "depth": sketch.depth,
                "key": state["key"]}

    @staticmethod
    def _stats(sketch: PersonBudgetSketch) -> dict[str, Any]:
        return {"total_spent": sketch.total_spent, "n_spends": sketch.n_spends, "n_refused": sketch.n_refused}

    def _snapshot(self, sketch: PersonBudgetSketch) -> dict[str, bytes]:
        self._seq += 1
        flat = sketch.counters.reshape(-1).astype("<f8")
        out = {}
        for i, start in enumerate(range(0, flat.size, CHUNK_CELLS)):
            part = flat[start:start + CHUNK_CELLS]
            header = {"v": STATE_FORMAT, "seq": self._seq, "start": start, "cells": int(part.size),
                      **self._stats(sketch)}
            out[self.key("person", "chunk", str(i))] = _binary(header, part)
        self._parts_since_snapshot = 0
        self._cells_since_snapshot = 0
        return out

    def restore(self, records: Mapping[str, bytes]) -> None:
        """Load the state records of this scope (the latest value of each key; others are ignored).

        Raises :class:`SideStateError` naming the key when a record cannot be read, or when the persisted
        sketch has another size than the configured one.  Records of a budget that is not configured now are
        ignored (the current configuration decides what is enforced).
        """
        mine = {k: v for k, v in records.items() if k.startswith(self.scope + "/") and v is not None}
        key = self.key("kmeans")
        if self.kmeans is not None and key in mine:
            try:
                state = json.loads(mine[key])
                self.kmeans = BudgetAccountant.from_dict(state, total_epsilon=self.kmeans.total_epsilon)
            except (ValueError, BudgetStateError) as e:
                raise SideStateError(f"budget state: key {key!r}: {str(e).removeprefix('budget state: ')}") from None
        if self.person is not None:
            self._restore_person(mine)
        self.restored = True

    def _restore_person(self, mine: Mapping[str, bytes]) -> None:
        sketch = self.person
        assert sketch is not None
        prefix = self.key("person") + "/"
        parts = {k: v for k, v in mine.items() if k.startswith(prefix)}
        if not parts:
            return
        meta_key = self.key("person", "meta")
        if meta_key not in parts:
            raise SideStateError(f"budget state: key {meta_key!r} missing while {len(parts)} sketch record(s) "
                                 f"exist: the counters cannot be used without the sketch's key")
        try:
            meta = json.loads(parts[meta_key])
            if not isinstance(meta, dict) or meta.get("v") != STATE_FORMAT:
                raise ValueError(f"expected a JSON object with v={STATE_FORMAT}")
            width, depth, hash_key = int(meta["width"]), int(meta["depth"]), bytes.fromhex(str(meta["key"]))
        except (ValueError, KeyError, TypeError) as e:
            raise SideStateError(f"budget state: key {meta_key!r}: {e}") from None
        if (width, depth) != (sketch.width, sketch.depth):
            raise SideStateError(
                f"budget state: key {meta_key!r}: the persisted per-person sketch has width {width}, depth {depth}; "
                f"side_paths.person_budget.width/depth are {sketch.width}/{sketch.depth} (a sketch of another size "
                f"cannot carry the spending over: set them back)")
        restored = PersonBudgetSketch(cap_epsilon=sketch.cap_epsilon, width=width, depth=depth, key=hash_key)
        flat = restored.counters.reshape(-1)
        best_seq, stats = -1, None
        for k, v in parts.items():
            if k == meta_key:
                continue
            header, payload = _split_binary(k, v)
            seq = _int_field(k, header, "seq", 1)
            n = _int_field(k, header, "cells", 1)
            if k.startswith(prefix + "chunk/"):
                start = _int_field(k, header, "start")
                if len(payload) != 8 * n or start + n > flat.size:
                    raise SideStateError(f"budget state: key {k!r}: {n} counters from {start} do not fit a sketch "
                                         f"of {flat.size} counters in {len(payload)} bytes")
                values = np.frombuffer(payload, dtype="<f8")
                self._check_values(k, values)
                np.maximum(flat[start:start + n], values, out=flat[start:start + n])
            elif k.startswith(prefix + "delta/"):
                if len(payload) != 16 * n:
                    raise SideStateError(f"budget state: key {k!r}: {n} cells need {16 * n} bytes, got {len(payload)}")
                idx = np.frombuffer(payload[:8 * n], dtype="<i8")
                values = np.frombuffer(payload[8 * n:], dtype="<f8")
                if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
                    raise SideStateError(f"budget state: key {k!r}: cell index outside the sketch")
                self._check_values(k, values)
                np.maximum.at(flat, idx, values)
            else:
                raise SideStateError(f"budget state: key {k!r}: unknown record of the per-person sketch")
            self._seq = max(self._seq, seq)
            if seq > best_seq:
                best_seq, stats = seq, header
        if stats is not None:
            restored.total_spent = float(stats.get("total_spent", 0.0))
            restored.n_spends = int(stats.get("n_spends", 0))
            restored.n_refused = int(stats.get("n_refused", 0))
        self.person = restored
        self._meta_written = True
        # the next delta may reuse slots: start a new ring only after a snapshot of what was restored
        self._parts_since_snapshot = DELTA_SLOTS

    @staticmethod
    def _check_values(key: str, values: np.ndarray) -> None:
        if values.size and (not np.all(np.isfinite(values)) or values.min() < 0):
            raise SideStateError(f"budget state: key {key!r}: counters must be finite and >= 0")
