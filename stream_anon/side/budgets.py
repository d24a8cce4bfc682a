"""The side paths' cumulative privacy budgets and their persisted state, pure (no Kafka).

Budgets belong to the data, not to a consumer group: they are keyed by the INPUT TOPIC (``<scope>`` below), and a
start whose state is missing or older than what the input's progress implies is refused (fail closed).

Two budgets accumulate and must survive restarts, consumer-group changes and operator mistakes:

* the lifetime cap of each person, or of each record id when the schema has no person id
  (``side_paths.person_budget.cap_epsilon``): a :class:`~stream_anon.privacy.person_budget.PersonBudgetSketch`
  charged one record's total eps every time the record is perturbed, over all passes and all groups;
* the k-means stream budget (``side_paths.kmeans.total_epsilon``, optional): a
  :class:`~stream_anon.privacy.budget.BudgetAccountant` charged each released window's exact eps, persisted with
  the k-means window counter (window ids never repeat across restarts).

:class:`SideBudgets` turns every change into **state records** (key -> bytes) for a store that keeps the latest
value per key (the internal compacted topic ``<input>.side-budget``; the side app writes them and waits for the
broker's acknowledgement BEFORE it publishes the outputs that spent them, so a crash can only over-count).

Keys (``<scope>`` = the input topic; a topic name never contains ``/``):

* ``<scope>/head``: the budget's identity and integrity record, written LAST in every write (one partition,
  idempotent producer: when it is acknowledged, every record before it is too): the ``generation`` (1 at the first
  start, +1 for every deliberate new budget), the write sequence number ``seq``, every live key (relative to the
  scope) with the ``seq`` it was written at, and the history of the generations (when and how each started);
* ``<scope>/kmeans``: the k-means window counter and the accountant (:meth:`BudgetAccountant.to_dict`), JSON;
* ``<scope>/person/meta``: width, depth and the sketch's secret hash key (JSON; the topic is internal);
* ``<scope>/person/delta/<slot>``: the counters a write changed (flat cell index, new value), in a ring of
  :data:`DELTA_SLOTS` slots;
* ``<scope>/person/chunk/<i>``: a snapshot of all counters, in chunks of :data:`CHUNK_CELLS`, written when the
  deltas since the last snapshot would fill the ring or outgrow the snapshot.  A delta slot is reused only after
  a snapshot that covers it was acknowledged.

Every record carries its ``generation`` and ``seq``.  :meth:`SideBudgets.open` reads the head and loads exactly the
keys it lists: each must exist, belong to the head's generation and carry a ``seq`` at least the listed one
(a later, torn write may have replaced it with newer values), else the state is refused naming the key (a
tombstone or a deleted record).  Counters only grow and every record holds values the counters really had, so the
sketch is restored as the cell-wise MAXIMUM of the listed chunks and deltas.  A binary record's value is one line
of JSON (its header), a newline, then little-endian arrays.

**The anchor** (:class:`BudgetAnchor`): a record of the budget's (generation, seq) OUTSIDE the budget topic, so
that deleting that topic, tombstoning its keys or pointing ``side_paths.budget_topic`` elsewhere cannot pass for a
first start.  It is the committed offset of a consumer group named after the input topic
(:func:`anchor_group`; no member ever joins it) on the input's partition 0: ``generation * 10**12 + seq``.  Brokers
keep a committed offset as long as the group exists, whatever happens to other topics; commit METADATA would be
the natural place, but Tansu drops it (measured: docs/side-paths.md).  :meth:`SideBudgets.open` decides the start
(:class:`BudgetOpening`):

* head and anchor absent, no side output on the side topics: the first start (generation 1, recorded);
* head absent while an anchor exists or side topics hold outputs: refused (:class:`BudgetRefusedError`);
* head older than the anchor (a lower generation, or the same generation and a lower seq), a listed key missing,
  or a record that cannot be read: refused;
* otherwise the state is restored;
* ``new_budget`` (``stream-anon run --new-budget``): a new generation, whatever was found; the caller logs it as a
  WARNING and the head's history records it (the state of the previous generations stays ignored).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_anon.privacy.budget import BudgetAccountant, BudgetSpend, BudgetStateError
from stream_anon.privacy.person_budget import PersonBudgetSketch

STATE_FORMAT = 2
DELTA_SLOTS = 256
"""Delta records kept per sketch (a ring: slot = delta number mod DELTA_SLOTS)."""
DELTA_CELLS = 32_768
"""Changed cells per delta record at most (16 bytes each: 512 KiB)."""
CHUNK_CELLS = 65_536
"""Counters per snapshot chunk (8 bytes each: 512 KiB)."""
ANCHOR_BASE = 10**12
"""The anchor offset is ``generation * ANCHOR_BASE + seq`` (readable in ``kafka-consumer-groups`` output)."""
HISTORY_KEPT = 20
"""Generations the head's history keeps (the latest ones)."""
NEW_BUDGET_HOW = ("start a new budget deliberately with `stream-anon run --new-budget` (logged as a WARNING and "
                  "recorded in the budget topic; every record may then spend its lifetime cap again)")


class SideStateError(ValueError):
    """The side paths' persisted budget state cannot be used (the message names the key)."""


class BudgetRefusedError(SideStateError):
    """The budget state is missing or older than the input's progress implies: the start is refused."""


def anchor_group(input_topic: str) -> str:
    """The consumer group whose committed offset on ``input_topic``'s partition 0 anchors the budget."""
    return f"stream-anon-side-budget.{input_topic}"


@dataclass(frozen=True, order=True)
class BudgetAnchor:
    """(generation, seq) of the last budget write the anchor saw."""

    generation: int
    seq: int

    @property
    def offset(self) -> int:
        return self.generation * ANCHOR_BASE + self.seq

    @classmethod
    def from_offset(cls, offset: int | None) -> BudgetAnchor | None:
        """The anchor of a committed offset (None: no commit, -1, or not an anchor value)."""
        if offset is None or offset < ANCHOR_BASE:
            return None
        return cls(offset // ANCHOR_BASE, offset % ANCHOR_BASE)

    def __str__(self) -> str:
        return f"generation {self.generation}, write {self.seq}"


@dataclass(frozen=True)
class BudgetOpening:
    """How :meth:`SideBudgets.open` started the budget: ``kind`` ``restored`` | ``first`` | ``new``, a one-line
    ``message`` (the caller logs ``new`` as a WARNING, the others as INFO)."""

    kind: str
    message: str
    generation: int


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


def _json_record(key: str, value: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise SideStateError(f"budget state: key {key!r}: not JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("v") != STATE_FORMAT:
        raise SideStateError(f"budget state: key {key!r}: expected a JSON object with v={STATE_FORMAT}, got "
                             f"{value[:80]!r}")
    return obj


def _int_field(key: str, header: Mapping[str, Any], name: str, lo: int = 0) -> int:
    v = header.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SideStateError(f"budget state: key {key!r}: {name} must be an integer >= {lo}, got {v!r}")
    return v


class SideBudgets:
    """The cumulative budgets of the side paths on one input topic (``scope``); see the module docstring.

    ``kmeans_total``: the k-means stream budget (None: none); ``kmeans_windows``: persist the k-means window counter
    (k-means on); ``person_cap``, ``person_width``, ``person_depth``, ``person_key``: the lifetime-cap sketch (cap
    None: none; key None: 32 bytes from ``secrets``).
    Call :meth:`open` (or :meth:`restore`) once before spending.
    """

    def __init__(self, *, scope: str, kmeans_total: float | None = None, kmeans_windows: bool = False,
                 person_cap: float | None = None, person_width: int = 1 << 17, person_depth: int = 8,
                 person_key: bytes | None = None) -> None:
        self.scope = scope
        self.kmeans: BudgetAccountant | None = (BudgetAccountant(total_epsilon=kmeans_total)
                                                if kmeans_total is not None else None)
        self.kmeans_windows = kmeans_windows or kmeans_total is not None
        self.person: PersonBudgetSketch | None = (PersonBudgetSketch(cap_epsilon=person_cap, width=person_width,
                                                                     depth=person_depth, key=person_key)
                                                  if person_cap is not None else None)
        self.next_window = 0  # the next k-means window id (never reused: persisted)
        self.generation = 0  # 0 until open()
        self.seq = 0  # sequence number of the last write (all records of one write share it)
        self.history: list[dict[str, Any]] = []
        self.restored = False
        self.live: dict[str, int] = {}  # key -> seq of every record of this generation the head lists
        self._head_dirty = False
        self._kmeans_dirty = False
        self._meta_written = False
        self._changed: list[np.ndarray] = []  # flat counter indices changed since the last take_updates
        self._deltas = 0  # delta records written since the last snapshot's ring start (slot = _deltas % SLOTS)
        self._parts_since_snapshot = 0
        self._cells_since_snapshot = 0

    # ------------------------------------------------------------------ views
    @property
    def persistent(self) -> bool:
        """True when there is a cumulative budget (or the k-means window counter) to persist."""
        return self.kmeans_windows or self.person is not None

    @property
    def anchor(self) -> BudgetAnchor:
        """(generation, seq) of the last write, for the anchor."""
        return BudgetAnchor(self.generation, self.seq)

    def key(self, *parts: str) -> str:
        return "/".join((self.scope, *parts))

    # ------------------------------------------------------------------ spending
    def spend_kmeans(self, epsilon: float, label: str) -> BudgetSpend:
        """Charge the k-means stream budget (raises ``BudgetExhaustedError``, spending nothing, if it does not fit)."""
        assert self.kmeans is not None
        spend = self.kmeans.spend(epsilon, label)
        self._kmeans_dirty = True
        return spend

    def take_window(self) -> int:
        """The next k-means window id (released or refused: ids are never reused)."""
        index = self.next_window
        self.next_window += 1
        self._kmeans_dirty = True
        return index

    def spend_person(self, person_ids: Sequence[Any], epsilon: float) -> np.ndarray:
        """Charge each record's person (or record id) ``epsilon`` (in order); returns the accepted mask (refused:
        nothing spent)."""
        sketch = self.person
        assert sketch is not None
        mask, cells = sketch.try_spend_cells(person_ids, epsilon)  # cells: (n, depth), row r's cell index
        if mask.any():
            flat = (np.arange(sketch.depth, dtype=np.int64)[None, :] * sketch.width + cells[mask]).reshape(-1)
            self._changed.append(flat)
        return mask

    # ------------------------------------------------------------------ persistence
    def take_updates(self) -> dict[str, bytes]:
        """The state records of every change since the last call, the head last (empty: nothing to write).  Write
        them, in this order, and wait for the acknowledgement before publishing anything that spent them."""
        out: dict[str, bytes] = {}
        kmeans_changed = self.kmeans_windows and self._kmeans_dirty
        sketch = self.person
        person_changed = sketch is not None and bool(self._changed)
        if not (kmeans_changed or person_changed or self._head_dirty):
            return out
        self.seq += 1
        seq, gen = self.seq, self.generation
        if kmeans_changed:
            key = self.key("kmeans")
            out[key] = _json({"v": STATE_FORMAT, "generation": gen, "seq": seq, "next_window": self.next_window,
                              "accountant": None if self.kmeans is None else self.kmeans.to_dict(history=10)})
            self.live[key] = seq
            self._kmeans_dirty = False
        if sketch is not None and person_changed:
            if not self._meta_written:
                key = self.key("person", "meta")
                out[key] = _json(self._meta(sketch))
                self.live[key] = seq
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
                    header = {"v": STATE_FORMAT, "generation": gen, "seq": seq, "cells": int(part.size),
                              **self._stats(sketch)}
                    key = self.key("person", "delta", str(self._deltas % DELTA_SLOTS))
                    self._deltas += 1
                    out[key] = _binary(header, part, flat[part].astype("<f8"))
                    self.live[key] = seq
                self._parts_since_snapshot += n_parts
                self._cells_since_snapshot += int(cells.size)
        out[self.key("head")] = _json(self._head())
        self._head_dirty = False
        return out

    def _head(self) -> dict[str, Any]:
        cut = len(self.scope) + 1  # keys relative to the scope: the head stays small (a few KiB)
        return {"v": STATE_FORMAT, "input": self.scope, "generation": self.generation, "seq": self.seq,
                "keys": {k[cut:]: v for k, v in sorted(self.live.items())}, "history": self.history[-HISTORY_KEPT:]}

    def _meta(self, sketch: PersonBudgetSketch) -> dict[str, Any]:
        return {"v": STATE_FORMAT, "generation": self.generation, "seq": self.seq, "kind": "PersonBudgetSketch",
                "width": sketch.width, "depth": sketch.depth, "key": sketch.key_hex}

    @staticmethod
    def _stats(sketch: PersonBudgetSketch) -> dict[str, Any]:
        return {"total_spent": sketch.total_spent, "n_spends": sketch.n_spends, "n_refused": sketch.n_refused}

    def _snapshot(self, sketch: PersonBudgetSketch) -> dict[str, bytes]:
        flat = sketch.counters.reshape(-1).astype("<f8")
        out = {}
        for k in [k for k in self.live if k.startswith(self.key("person", "delta") + "/")]:
            del self.live[k]  # covered by the snapshot
        for i, start in enumerate(range(0, flat.size, CHUNK_CELLS)):
            part = flat[start:start + CHUNK_CELLS]
            header = {"v": STATE_FORMAT, "generation": self.generation, "seq": self.seq, "start": start,
                      "cells": int(part.size), **self._stats(sketch)}
            key = self.key("person", "chunk", str(i))
            out[key] = _binary(header, part)
            self.live[key] = self.seq
        self._deltas = 0
        self._parts_since_snapshot = 0
        self._cells_since_snapshot = 0
        return out

    # ------------------------------------------------------------------ start
    def open(self, records: Mapping[str, bytes], *, anchor: BudgetAnchor | None = None,
             outputs_exist: Callable[[], str | None] = lambda: None, new_budget: bool = False,
             when: str = "", where: str = "the budget topic") -> BudgetOpening:
        """Decide the start (module docstring) from the persisted ``records`` (latest value per key), the ``anchor``
        (None: none found) and ``outputs_exist`` (called only when neither a head nor an anchor exists: a
        description of the side outputs found, or None); ``when``: the time to record; ``where``: how the refusal
        names the store.  Raises :class:`BudgetRefusedError` or :class:`SideStateError` (one line each, naming
        the key and how to start a new budget) unless ``new_budget``.  After it, :meth:`take_updates` returns the
        head of a first or new budget (write it at start)."""
        head_key = self.key("head")
        previous: dict[str, Any] | None = None
        problem: str | None = None
        head: dict[str, Any] | None = None
        if records.get(head_key) is not None:
            try:
                head = self._read_head(head_key, records[head_key])
                previous = {"generation": head["generation"], "seq": head["seq"]}
                if anchor is not None and (head["generation"], head["seq"]) < (anchor.generation, anchor.seq):
                    problem = (f"the budget state in {where} is at {BudgetAnchor(head['generation'], head['seq'])} "
                               f"but the input's anchor (consumer group {anchor_group(self.scope)!r}) shows "
                               f"{anchor}: the state is older than the input's progress (rolled back, or keys "
                               f"tombstoned and rewritten)")
                else:
                    self._restore(head, records)
            except SideStateError as e:
                problem = str(e).removeprefix("budget state: ")
        elif anchor is not None:
            problem = (f"no budget state for input {self.scope!r} in {where} (key {head_key!r}), but the input's "
                       f"anchor (consumer group {anchor_group(self.scope)!r}) shows a budget at {anchor}: the state "
                       f"was deleted, tombstoned or written to another budget topic")
            previous = {"generation": anchor.generation, "seq": anchor.seq}
        else:
            found = outputs_exist()
            if found is not None:
                problem = (f"no budget state for input {self.scope!r} in {where} and no anchor, but {found}: side "
                           f"outputs were published under a budget that is gone (or by a version without "
                           f"anchors)")
        if problem is not None and not new_budget:
            raise BudgetRefusedError(f"{problem}; restore the budget topic, or {NEW_BUDGET_HOW}")
        if problem is None and not new_budget:
            if head is not None:
                return BudgetOpening("restored", f"budget of input {self.scope!r} restored from {where} "
                                                 f"(generation {self.generation}, write {self.seq})", self.generation)
            self._new_generation(1, when, "first start: no budget state, no anchor and no side output found", None)
            return BudgetOpening("first", f"first start: new budget of input {self.scope!r} (generation 1) in "
                                          f"{where}", 1)
        known = [g for g in ((previous or {}).get("generation"), anchor.generation if anchor else None) if g]
        generation = max(known, default=0) + 1
        if problem is not None:
            reason = "--new-budget: " + problem
        elif head is not None:
            reason = "--new-budget: the previous budget was readable and current, and was abandoned deliberately"
        else:
            reason = "--new-budget at a first start (no budget state, no anchor and no side output found)"
        self._new_generation(generation, when, reason, previous, history=head["history"] if head is not None else None)
        return BudgetOpening("new", f"NEW budget of input {self.scope!r} started by --new-budget (generation "
                                    f"{generation}, recorded in {where}): the spending of generation "
                                    f"{(previous or {}).get('generation', '-')} is forgotten and every record may "
                                    f"spend its lifetime cap again ({reason.removeprefix('--new-budget: ')})",
                             generation)

    def restore(self, records: Mapping[str, bytes]) -> None:
        """Load the state of this scope (tests and tools: :meth:`open` without an anchor); a scope without a head
        starts a first generation."""
        self.open(records)

    def _new_generation(self, generation: int, when: str, how: str, previous: dict[str, Any] | None, *,
                        history: list[dict[str, Any]] | None = None) -> None:
        carried_window = self.next_window
        kmeans_total = self.kmeans.total_epsilon if self.kmeans is not None else None
        if self.kmeans is not None:
            self.kmeans = BudgetAccountant(total_epsilon=kmeans_total)  # type: ignore[arg-type]
        if self.person is not None:
            p = self.person
            self.person = PersonBudgetSketch(cap_epsilon=p.cap_epsilon, width=p.width, depth=p.depth)
        self.generation, self.seq = generation, 0
        self.next_window = carried_window  # window ids never repeat while the old counter is known
        self.live = {}
        self.history = [*(history or []), {"generation": generation, "started": when, "how": how,
                                           "replaced": previous}][-HISTORY_KEPT:]
        self._meta_written = False
        self._changed = []
        self._deltas = self._parts_since_snapshot = self._cells_since_snapshot = 0
        self._head_dirty = True
        self._kmeans_dirty = self.kmeans_windows
        self.restored = True

    def _read_head(self, key: str, value: bytes) -> dict[str, Any]:
        head = _json_record(key, value)
        generation = _int_field(key, head, "generation", 0)  # 0: written without open() (pure use, tests)
        seq = _int_field(key, head, "seq", 1)
        keys = head.get("keys")
        if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, int) and not
                                                 isinstance(v, bool) and 1 <= v <= seq for k, v in keys.items()):
            raise SideStateError(f"budget state: key {key!r}: keys must map record keys to write numbers 1..{seq}")
        history = head.get("history")
        if not isinstance(history, list):
            raise SideStateError(f"budget state: key {key!r}: history must be a list, got {history!r}")
        return {"generation": generation, "seq": seq, "keys": {self.key(k): v for k, v in keys.items()},
                "history": history}

    def _listed(self, head: dict[str, Any], records: Mapping[str, bytes], key: str) -> bytes:
        value = records.get(key)
        if value is None:
            raise SideStateError(f"budget state: key {key!r} is missing (deleted or tombstoned) although the head "
                                 f"lists it (generation {head['generation']}, write {head['keys'][key]})")
        return value

    def _check_version(self, head: dict[str, Any], key: str, fields: Mapping[str, Any]) -> int:
        gen = _int_field(key, fields, "generation", 0)
        seq = _int_field(key, fields, "seq", 1)
        if gen != head["generation"] or seq < head["keys"][key]:
            raise SideStateError(f"budget state: key {key!r} holds generation {gen}, write {seq}; the head lists "
                                 f"generation {head['generation']}, write {head['keys'][key]} (an older record "
                                 f"was written back)")
        return seq

    def _restore(self, head: dict[str, Any], records: Mapping[str, bytes]) -> None:
        keys: dict[str, int] = head["keys"]
        key = self.key("kmeans")
        if key in keys:
            state = _json_record(key, self._listed(head, records, key))
            self._check_version(head, key, state)
            self.next_window = _int_field(key, state, "next_window")
            acc = state.get("accountant")
            if self.kmeans is not None and acc is not None:
                try:
                    self.kmeans = BudgetAccountant.from_dict(acc, total_epsilon=self.kmeans.total_epsilon)
                except (ValueError, BudgetStateError) as e:
                    raise SideStateError(f"budget state: key {key!r}: {str(e).removeprefix('budget state: ')}") \
                        from None
        if self.person is not None:
            self._restore_person(head, records)
        self.generation, self.seq = head["generation"], head["seq"]
        self.history = list(head["history"])
        self.live = dict(keys)
        self.restored = True

    def _restore_person(self, head: dict[str, Any], records: Mapping[str, bytes]) -> None:
        sketch = self.person
        assert sketch is not None
        prefix = self.key("person") + "/"
        parts = [k for k in head["keys"] if k.startswith(prefix)]
        if not parts:
            return
        meta_key = self.key("person", "meta")
        if meta_key not in parts:
            raise SideStateError(f"budget state: key {meta_key!r} is not listed while {len(parts)} sketch "
                                 f"record(s) are: the counters cannot be used without the sketch's key")
        meta = _json_record(meta_key, self._listed(head, records, meta_key))
        self._check_version(head, meta_key, meta)
        try:
            width, depth, hash_key = int(meta["width"]), int(meta["depth"]), bytes.fromhex(str(meta["key"]))
        except (ValueError, KeyError, TypeError) as e:
            raise SideStateError(f"budget state: key {meta_key!r}: {e}") from None
        if (width, depth) != (sketch.width, sketch.depth):
            raise SideStateError(
                f"budget state: key {meta_key!r}: the persisted lifetime-cap sketch has width {width}, depth {depth}; "
                f"side_paths.person_budget.width/depth are {sketch.width}/{sketch.depth} (a sketch of another size "
                f"cannot carry the spending over: set them back)")
        restored = PersonBudgetSketch(cap_epsilon=sketch.cap_epsilon, width=width, depth=depth, key=hash_key)
        flat = restored.counters.reshape(-1)
        best_seq, stats = -1, None
        for k in parts:
            if k == meta_key:
                continue
            header, payload = _split_binary(k, self._listed(head, records, k))
            seq = self._check_version(head, k, header)
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
                raise SideStateError(f"budget state: key {k!r}: unknown record of the lifetime-cap sketch")
            if seq > best_seq:
                best_seq, stats = seq, header
        if stats is not None:
            restored.total_spent = float(stats.get("total_spent", 0.0))
            restored.n_spends = int(stats.get("n_spends", 0))
            restored.n_refused = int(stats.get("n_refused", 0))
        self.person = restored
        self._meta_written = True
        # the next write may reuse delta slots: start a new ring only after a snapshot of what was restored
        self._parts_since_snapshot = DELTA_SLOTS

    @staticmethod
    def _check_values(key: str, values: np.ndarray) -> None:
        if values.size and (not np.all(np.isfinite(values)) or values.min() < 0):
            raise SideStateError(f"budget state: key {key!r}: counters must be finite and >= 0")
