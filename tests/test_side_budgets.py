"""Cumulative side-path budgets that survive restarts: the k-means stream budget and the lifetime cap per person or
record, their state records (written before the outputs that spend them), restoring them, and refusing a state that
is unreadable, missing, tombstoned or older than its anchor (the start decisions of ``SideBudgets.open``; the same
through the real service: tests/test_side_budget_resets.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import TopicPartition
from prometheus_client import CollectorRegistry
from test_side_app import Consumer, MemoryStore, Producer, SidePathApp, make_app, messages, poller

from stream_anon.config.settings import Config
from stream_anon.config.side_paths import KMeansConfig, PersonBudgetConfig, SidePathConfig, SideTopics
from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.core.schema import Schema, adult_schema
from stream_anon.formats.release import Pseudonymizer
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.side.budgets import (
    DELTA_SLOTS,
    BudgetAnchor,
    BudgetRefusedError,
    SideBudgets,
    SideStateError,
    anchor_group,
)
from stream_anon.side.processor import SKIP_BAD_PERSON_ID, SKIP_PERSON_BUDGET, SidePathProcessor

SECRET = b"side-budget-test-secret-01234567"
TOPICS = SideTopics()


@pytest.fixture(scope="module")
def adult(adult_path: Path) -> list[dict[str, Any]]:
    return list(iter_records(read_adult(adult_path)))[:3000]


def person_schema() -> Schema:
    return dataclasses.replace(adult_schema(), person_id="pid", _by_name={})


def with_persons(records: list[dict[str, Any]], persons: int) -> list[dict[str, Any]]:
    """Record i belongs to person i mod ``persons`` (int ids; a few as strings)."""
    return [{**r, "pid": (i % persons) if i % persons % 7 else f"p{i % persons}"} for i, r in enumerate(records)]


def apply(state: dict[str, bytes], updates: dict[str, bytes]) -> None:
    """What a compacted topic keeps: the latest value per key."""
    state.update(updates)


# ------------------------------------------------------------------------------------------ per-person cap
def test_person_cap_refuses_every_side_output_of_a_person_over_the_cap(adult: list[dict[str, Any]]) -> None:
    base = SidePathConfig(estimates_every=0, estimates_every_seconds=None, kmeans=KMeansConfig(window=250))
    eps_all = base.check().epsilon_all
    cfg = dataclasses.replace(base, person_budget=PersonBudgetConfig(cap_epsilon=2.5 * eps_all, width=1 << 12))
    proc = SidePathProcessor(cfg, person_schema(), rng=1, pseudonymize=Pseudonymizer(SECRET))
    recs = with_persons(adult[:300], 100)  # 3 records per person: the third does not fit 2.5 records' eps
    batch = proc.process_batch_encoded(recs)
    assert batch.skipped == {SKIP_PERSON_BUDGET: 100}
    assert [len(c) for c in batch.copies] == [200, 200, 200]
    assert proc.records_processed == 200 and proc._window_fill == 200  # k-means never saw the refused records
    state: dict[str, bytes] = {}
    apply(state, proc.take_budget_updates())
    assert any(k.startswith("side/person/delta/") for k in state) and "side/person/meta" in state
    assert list(state)[-1] == "side/head"  # the head is written last

    # a restart restores the sketch: those persons stay capped; a new person is not
    again = SidePathProcessor(cfg, person_schema(), rng=2, pseudonymize=Pseudonymizer(SECRET))
    again.restore_budgets(state)
    assert again.budgets.person is not None and proc.budgets.person is not None
    assert np.array_equal(again.budgets.person.counters, proc.budgets.person.counters)
    more = with_persons(adult[300:400], 100) + [{**adult[400], "pid": "newcomer"}, {**adult[401], "pid": True}]
    b2 = again.process_batch_encoded(more)
    assert b2.skipped == {SKIP_PERSON_BUDGET: 100, SKIP_BAD_PERSON_ID: 1}
    assert [len(c) for c in b2.copies] == [1, 1, 1]
    # without the restored state the same records would have gone through: the restart did not reset the budget
    fresh = SidePathProcessor(cfg, person_schema(), rng=2, pseudonymize=Pseudonymizer(SECRET))
    assert fresh.process_batch_encoded(more).skipped == {SKIP_BAD_PERSON_ID: 1}


def test_person_cap_needs_a_cap_of_at_least_one_record() -> None:
    eps_all = SidePathConfig().check().epsilon_all
    assert eps_all <= 4.0 == PersonBudgetConfig().cap_epsilon  # the default record fits the default lifetime cap
    with pytest.raises(ValueError, match=r"person_budget\.cap_epsilon: expected at least the exact eps of one record "
                                         r"over all side outputs \(3\.9\d*\), got 3(\.0)?"):
        SidePathConfig(person_budget=PersonBudgetConfig(cap_epsilon=3.0)).check(person_schema())
    assert SidePathConfig(person_budget=PersonBudgetConfig(cap_epsilon=eps_all)).check(person_schema())
    # without a person id the cap counts per record id; a schema with neither cannot have one
    no_ids = dataclasses.replace(adult_schema(), record_id=None, _by_name={})
    with pytest.raises(ValueError, match=r"person_budget\.cap_epsilon: expected null for schema 'adult', which "
                                         r"declares neither a person_id nor a record_id"):
        SidePathConfig(pseudonyms=False).check(no_ids)


def test_sketch_state_round_trips_through_deltas_and_snapshots_and_survives_a_torn_write() -> None:
    """A tiny sketch (2 x 64 counters) forces snapshots; at every step the restored counters equal the live ones;
    a write cut at any point restores counters at least those of the last complete write (never an under-count)."""
    rng = np.random.default_rng(0)
    live = SideBudgets(scope="g", person_cap=1e6, person_width=64, person_depth=2)
    state: dict[str, bytes] = {}
    snapshots = 0
    for step in range(3 * DELTA_SLOTS):
        ids = rng.integers(0, 500, size=int(rng.integers(1, 40))).tolist()
        before = dict(state)
        assert live.person is not None
        counters_before = live.person.counters.copy()
        live.spend_person(ids, float(rng.uniform(0.1, 2.0)))
        updates = live.take_updates()
        snapshots += any("/chunk/" in k for k in updates)
        # torn write: only a prefix of the records reached the topic (then the outputs were not published)
        items = list(updates.items())
        cut = dict(before)
        apply(cut, dict(items[:int(rng.integers(0, len(items) + 1))]))
        torn = SideBudgets(scope="g", person_cap=1e6, person_width=64, person_depth=2)
        torn.restore(cut)
        assert torn.person is not None
        assert np.all(torn.person.counters >= counters_before)
        assert np.all(torn.person.counters <= live.person.counters)
        apply(state, updates)
        restored = SideBudgets(scope="g", person_cap=1e6, person_width=64, person_depth=2)
        restored.restore(state)
        assert restored.person is not None
        assert np.array_equal(restored.person.counters, live.person.counters), step
    assert snapshots >= 2
    assert len([k for k in state if "/delta/" in k]) <= DELTA_SLOTS  # the ring bounds what a restore reads


@pytest.mark.parametrize(("key", "value", "match"), [
    ("g/kmeans", b"{not json", r"key 'g/kmeans'"),
    ("g/kmeans", json.dumps({"v": 2, "generation": 0, "seq": 1, "next_window": 1, "accountant": {
        "kind": "BudgetAccountant", "version": 1, "spent_sum": -1}}).encode(),
     r"key 'g/kmeans': spent_compensation must be a finite number"),
    ("g/person/delta/0", b"no header", r"key 'g/person/delta/0'"),
    ("g/person/meta", json.dumps({"v": 2, "generation": 0, "seq": 1, "width": 32, "depth": 4,
                                  "key": "00" * 32}).encode(),
     r"width 32, depth 4; side_paths\.person_budget\.width/depth are 64/2"),
    ("g/head", b"\xff", r"key 'g/head'"),
])
def test_a_state_that_cannot_be_read_is_refused_naming_the_key(key: str, value: bytes, match: str) -> None:
    good = SideBudgets(scope="g", kmeans_total=3.0, person_cap=10.0, person_width=64, person_depth=2)
    assert good.person is not None
    good.spend_kmeans(1.0, "w0")
    good.take_window()
    good.spend_person([1, 2, 3], 1.0)
    state = good.take_updates()
    state[key] = value
    with pytest.raises(SideStateError, match=match):
        SideBudgets(scope="g", kmeans_total=3.0, person_cap=10.0, person_width=64, person_depth=2).restore(state)
    # another scope's records are not this group's business
    SideBudgets(scope="other", kmeans_total=3.0, person_cap=10.0, person_width=64, person_depth=2).restore(state)


# ------------------------------------------------------------------------------------------ k-means stream budget
def test_kmeans_budget_is_persisted_before_the_release_and_a_restart_cannot_reset_it(
        adult: list[dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    side = SidePathConfig(estimates_every=0, estimates_every_seconds=None,
                          kmeans=KMeansConfig(window=250, epsilon=0.4, total_epsilon=1.0))
    app, producer, _ = make_app(side, Consumer())
    store = app.budget_store
    assert isinstance(store, MemoryStore) and store.topic == "adult.raw.side-budget"
    assert app.restore_budgets(store) == 0  # nothing persisted yet
    tp = TopicPartition("adult.raw", 0)
    app._process(tp.partition, messages(adult[:300]))
    app._process(tp.partition, messages(adult[300:600], start=300))
    sent = producer.sent
    km = [i for i, m in enumerate(sent) if m.kind == "kmeans"]
    budget = [i for i, m in enumerate(sent) if m.topic == store.topic]
    assert len(km) == 2 and len(budget) >= 2
    # each window's spend (and id) reached the budget topic, acknowledged, before the window was sent
    kmeans_state = [i for i in budget if sent[i].key == b"adult.raw/kmeans"]  # keyed by the INPUT topic
    for i, window in zip(km, (0, 1), strict=True):
        assert json.loads(sent[i].value)["window"] == window
        before = [j for j in kmeans_state if j < i]
        assert before and json.loads(sent[before[-1]].value)["next_window"] == window + 1
    assert all("adult.raw/head" in keys for _, keys in store.puts)
    for i in km:  # the head is the last state record written before a release
        assert sent[max(j for j in budget if j < i)].key == b"adult.raw/head"
    spent = json.loads(sent[kmeans_state[-1]].value)["accountant"]["spent"]
    assert spent == pytest.approx(2 * json.loads(sent[km[0]].value)["epsilon"])

    # restart: a new app reading the same topic keeps the spending; the third window does not fit
    with caplog.at_level(logging.ERROR):
        app2, producer2, _ = make_app(side, Consumer(), producer=producer)
        assert app2.restore_budgets(store) == 0
    assert app2.processor.kmeans_stopped and "stays STOPPED" in caplog.text
    app2._process(tp.partition, messages(adult[600:900], start=600))
    assert [m for m in producer2.sent[len(sent):] if m.kind == "kmeans"] == []
    assert app2.processor.kmeans_refused == 1 and app2.processor.records_processed == 300  # copies still flow
    assert app2.processor.budgets.next_window == 3  # window ids go on (window 2 was refused), never repeat


def test_unreadable_state_stops_the_side_paths_with_one_line_and_exit_2(adult: list[dict[str, Any]],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    side = SidePathConfig(kmeans=KMeansConfig(window=250, total_epsilon=5.0))
    app, producer, _ = make_app(side, Consumer())
    store = app.budget_store
    assert isinstance(store, MemoryStore)
    producer.send_values(store.topic, 0, [b"adult.raw/head"], [b"\xff not a state"], [])
    with caplog.at_level(logging.ERROR):
        assert app.restore_budgets(store) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert f"topic '{store.topic}'" in errors[0] and "key 'adult.raw/head'" in errors[0]
    assert "--new-budget" in errors[0]
    assert app.status.error is not None and app.status.finished.is_set()


def test_seeded_noise_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    side = SidePathConfig(seed=5, allow_seeded_noise=True, pseudonyms=False)
    app, _, _ = make_app(side, Consumer())
    assert isinstance(app, SidePathApp) and isinstance(app._producer, Producer)
    warnings = app.startup_warnings()
    assert any("side_paths.seed is set (5)" in w and "reproducible" in w for w in warnings)
    assert any("pseudonyms is false" in w for w in warnings)


def test_the_app_counts_and_logs_person_cap_refusals(adult: list[dict[str, Any]],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    base = SidePathConfig(estimates_every=0, estimates_every_seconds=None, kmeans=KMeansConfig(enabled=False))
    eps_all = base.check().epsilon_all
    side = dataclasses.replace(base, person_budget=PersonBudgetConfig(cap_epsilon=eps_all, width=1 << 10))
    cfg = dataclasses.replace(Config().with_options({"release.secret": "x" * 32}), side_paths=side)
    metrics = ServiceMetrics(CollectorRegistry())
    app = SidePathApp(cfg, metrics, rng=0, schema=person_schema())
    producer = Producer(cfg)
    app._poller, app._producer = poller(Consumer()), producer
    app.budget_store = MemoryStore(cfg, producer)
    tp = TopicPartition("adult.raw", 0)
    with caplog.at_level(logging.WARNING, logger="stream_anon.side.app"):
        for start in (0, 20):  # 20 persons, one record each, then each a second record: all refused
            app._process(tp.partition, messages(with_persons(adult[start:start + 20], 20), start=start))
    assert app.status.skipped == {SKIP_PERSON_BUDGET: 20} and app.status.processed == 20
    assert metrics.registry.get_sample_value("stream_anon_side_records_skipped_total",
                                             {"topic": "adult.raw", "reason": SKIP_PERSON_BUDGET}) == 20
    warnings = [r.getMessage() for r in caplog.records if "person_budget.cap_epsilon" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("side paths: 20 record(s) so far")
    # the sketch's state was written (acknowledged) before the first batch's copies were sent
    store = app.budget_store
    assert isinstance(store, MemoryStore) and store.puts and store.puts[0][0] == 0


# ------------------------------------------------------------------------------------------ start decisions
def _budgets(**kw: Any) -> SideBudgets:
    return SideBudgets(scope="in.raw", kmeans_total=3.0, kmeans_windows=True, person_cap=4.0, person_width=64,
                       person_depth=2, **kw)


def _spent_state() -> tuple[dict[str, bytes], BudgetAnchor]:
    """A budget opened at a first start, then two writes (windows, persons): the topic's state and its anchor."""
    b = _budgets()
    opening = b.open({}, when="t0")
    assert opening.kind == "first" and opening.generation == 1
    state: dict[str, bytes] = {}
    apply(state, b.take_updates())  # the first start's head, written before any record
    for i in range(2):
        b.spend_kmeans(1.0, f"w{i}")
        b.take_window()
        b.spend_person([10 * i + j for j in range(5)], 3.9)
        apply(state, b.take_updates())
    return state, b.anchor


def test_a_first_start_is_recorded_and_the_next_start_restores_it() -> None:
    state, anchor = _spent_state()
    assert anchor == BudgetAnchor(1, 3) and BudgetAnchor.from_offset(anchor.offset) == anchor
    head = json.loads(state["in.raw/head"])
    assert head["history"][0]["how"].startswith("first start") and head["history"][0]["started"] == "t0"
    b = _budgets()
    opening = b.open(state, anchor=anchor, outputs_exist=lambda: pytest.fail("not asked when a head exists"))
    assert opening.kind == "restored" and b.anchor == anchor and b.next_window == 2
    assert b.kmeans is not None and b.kmeans.spent == pytest.approx(2.0)
    assert b.person is not None and not b.person.try_spend([0], 3.9)[0]  # record 0 spent its cap already
    assert b.take_updates() == {}  # nothing to write until something is spent
    # an anchor behind the state (its last commit before a crash) is fine
    assert _budgets().open(state, anchor=BudgetAnchor(1, 1)).kind == "restored"


@pytest.mark.parametrize("action", ["topic deleted", "kmeans key tombstoned", "head tombstoned", "delta tombstoned",
                                    "rolled back", "another budget topic", "outputs without state"])
def test_a_state_that_is_missing_or_older_than_its_anchor_is_refused_unless_a_new_budget_is_asked(
        action: str) -> None:
    state, anchor = _spent_state()
    older = dict(state)
    outputs: str | None = None
    if action in ("topic deleted", "another budget topic"):
        state = {}
    elif action == "kmeans key tombstoned":
        del state["in.raw/kmeans"]
    elif action == "head tombstoned":
        del state["in.raw/head"]
    elif action == "delta tombstoned":
        del state[next(k for k in state if "/delta/" in k)]
    elif action == "rolled back":  # an older copy of the topic: every record one write behind
        b = _budgets()
        b.open({}, when="t0")
        older = {}
        apply(older, b.take_updates())
        state = older
    elif action == "outputs without state":  # neither state nor anchor, but copies on the side topics
        state, anchor, outputs = {}, None, "side topic 'in.krr' holds messages"  # type: ignore[assignment]
    with pytest.raises(BudgetRefusedError) as e:
        _budgets().open(state, anchor=anchor, outputs_exist=lambda: outputs)
    text = str(e.value)
    assert "\n" not in text and "--new-budget" in text, text
    if action == "kmeans key tombstoned":
        assert "key 'in.raw/kmeans' is missing" in text
    if action in ("topic deleted", "head tombstoned"):
        assert f"anchor (consumer group {anchor_group('in.raw')!r}) shows a budget at generation 1, write 3" in text
    if action == "outputs without state":
        assert "side topic 'in.krr' holds messages" in text
    # deliberately: a new generation, recorded in its head, nothing of the old one counted
    b = _budgets()
    opening = b.open(state, anchor=anchor, outputs_exist=lambda: outputs, new_budget=True, when="t1")
    generation = 1 if action == "outputs without state" else 2  # nothing known of the lost generation: 1
    assert opening.kind == "new" and opening.generation == generation and "NEW budget" in opening.message
    updates = b.take_updates()
    head = json.loads(updates["in.raw/head"])
    assert head["generation"] == generation and head["history"][-1]["started"] == "t1"
    assert head["history"][-1]["how"].startswith("--new-budget: ")
    # a readable head keeps the earlier generations in the history; a lost one cannot
    kept = action in ("kmeans key tombstoned", "delta tombstoned", "rolled back")
    assert [h["generation"] for h in head["history"]] == ([1, 2] if kept else [generation])
    assert b.kmeans is not None and b.kmeans.spent == 0 and b.person is not None and b.person.try_spend([0], 3.9)[0]


def test_records_of_an_abandoned_generation_are_ignored_and_window_ids_go_on() -> None:
    state, anchor = _spent_state()
    b = _budgets()
    b.open(state, anchor=anchor, new_budget=True, when="t1")  # readable and current: abandoned deliberately
    assert b.next_window == 2  # the counter is carried over: window ids never repeat
    apply(state, b.take_updates())
    b.spend_person([99], 3.9)
    apply(state, b.take_updates())
    again = _budgets()
    assert again.open(state, anchor=b.anchor).kind == "restored" and again.generation == 2
    assert again.person is not None and again.person.try_spend([0], 3.9)[0]  # generation 1's deltas are not read
    assert not again.person.try_spend([99], 3.9)[0]
    assert json.loads(state["in.raw/head"])["history"][0]["how"].startswith("first start")
    # an anchor of an older generation never blocks a newer state; a newer anchor does
    assert _budgets().open(state, anchor=BudgetAnchor(1, 99)).kind == "restored"
    with pytest.raises(BudgetRefusedError, match="older than the input's progress"):
        _budgets().open(state, anchor=BudgetAnchor(3, 1))
