"""The compiled ``best_selection`` loop (``core/engine/kernels.py``) gives bit for bit what the numpy formula gives:
each cluster's union score and enlargement, the chosen cluster, and so the engine's whole release stream (the ten
pinned streams of ``tests/test_engine_adult.py`` did not change when it came; checked there under numba's generic,
Haswell and host CPU targets too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_anon.core.datasets import read_adult
from stream_anon.core.engine import Engine, EngineConfig
from stream_anon.core.engine.clusters import QIEncoder
from stream_anon.core.engine.kernels import numpy_order_sum, union_enlargements
from stream_anon.core.schema import adult_schema


@pytest.fixture(scope="module")
def adult_head(adult_path: Path) -> dict[str, list[Any]]:
    """The first 3,000 ADULT records, column-wise, with their row number as id."""
    df = read_adult(adult_path).head(3000)
    return {c: df[c].tolist() for c in df.columns}


@pytest.mark.parametrize("n", [0, 1, 5, 7, 8, 9, 15, 16, 17, 23, 64, 127, 128])
def test_the_kernels_sum_is_numpys_sum_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    rows = rng.random((400, n)) * rng.choice([1e-9, 1.0, 3e7], size=(400, n)) * rng.choice([-1, 1], size=(400, n))
    expected = rows.sum(axis=-1)
    got = np.array([numpy_order_sum(np.ascontiguousarray(r), n) for r in rows])
    assert got.tobytes() == expected.tobytes()  # bit for bit (-0.0 included), not approximately


def _numpy_enlargements(enc: QIEncoder, box: np.ndarray, v: np.ndarray, wnew: np.ndarray, base: np.ndarray,
                        p: int, oldest: np.ndarray, age_coef: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The numpy formula (what ``Engine._best_selection`` computed before the kernel, and still computes for a
    schema past ``MAX_TERMS``)."""
    ls = enc.score_rows(np.minimum(box, v))
    e = wnew * ls
    e -= base
    if age_coef is not None:
        e -= (p - oldest) * age_coef
    return ls, e


@pytest.mark.parametrize("age", [False, True])
def test_union_scores_enlargements_and_the_choice_equal_the_numpy_formula(age: bool,
                                                                          adult_head: dict[str, list[Any]]) -> None:
    enc = QIEncoder(adult_schema(), score="gt")
    rng = np.random.default_rng(20261127)
    records = enc.encode_many(adult_head)
    cap = 40
    for trial in range(200):
        box = np.full((cap, enc.width), np.inf)  # free slots: +inf boxes, base -inf
        base = np.full(cap, -np.inf)
        wnew = np.ones(cap)
        for c in rng.choice(cap, size=int(rng.integers(1, cap)), replace=False):
            members = records[rng.choice(len(records), size=int(rng.integers(1, 12)))]
            box[c] = members.min(axis=0)
            wnew[c] = len(members) + 1
            base[c] = len(members) * float(enc.score_rows(box[c]))
        box[rng.random(box.shape) < 0.02] = -0.0  # signed zeros come out as numpy's
        v = records[trial]
        oldest = rng.integers(0, 1000, cap)
        age_coef = rng.random(cap) * (rng.random(cap) < 0.5)
        ls, e = np.empty(cap), np.empty(cap)
        c = union_enlargements(box, v, enc.jn, enc.jc, enc.neg_inv_range, enc.score_table, wnew, base, age, 1000,
                               oldest, age_coef, ls, e, np.empty(enc.jn), np.empty(enc.jc))
        ls_np, e_np = _numpy_enlargements(enc, box, v, wnew, base, 1000, oldest, age_coef if age else None)
        assert ls.tobytes() == ls_np.tobytes() and e.tobytes() == e_np.tobytes(), trial
        assert c == int(e_np.argmin())


@pytest.mark.parametrize(("loss", "algorithm"), [("gt", "castle"), ("lm", "castle"), ("ubdsa", "ubdsa")])
def test_the_engine_releases_the_same_stream_with_the_numpy_fallback(loss: str, algorithm: str,
                                                                     adult_head: dict[str, list[Any]]) -> None:
    """The fallback (a schema past MAX_TERMS QIs of one kind) forced on ADULT's first records: the same releases."""
    schema = adult_schema()
    columns = adult_head
    n = len(columns["age"])
    streams = []
    for compiled in (True, False):
        eng = Engine(schema, EngineConfig(k=5, delta=200, beta=30, mu=50, loss=loss, algorithm=algorithm,
                                                  seed=3, l=2))
        eng._work.compiled = compiled
        if not compiled:
            eng._work.union = np.empty((eng.gamma.capacity, eng.enc.width))
        enc = eng.encode_many(columns)
        out = []
        for i in range(n):
            rec = {k: col[i] for k, col in columns.items()}
            out += [(r.class_id, sorted(r.record_ids), sorted(r.generalized.items()))
                    for r in eng.push_encoded(rec, enc[i], now=float(i))]
        out += [(r.class_id, sorted(r.record_ids), sorted(r.generalized.items())) for r in eng.flush(now=float(n))]
        streams.append(out)
    assert streams[0] == streams[1] and len(streams[0]) > 20


def test_warm_up_compiles_exactly_what_the_engine_calls(adult_head: dict[str, list[Any]]) -> None:
    """The service's executors call ``warm_up()`` at their start (``service.workers.Pipelines``) so that no
    partition's first records wait 1-2 s for numba: that only works if the engine's calls then need no new
    compilation (the same argument types), both through ``push`` and through ``encode_many`` + ``push_encoded``."""
    from stream_anon.core.engine import warm_up

    warm_up()
    compiled = list(union_enlargements.signatures)
    assert compiled
    for age_pressure in (False, True):
        eng = Engine(adult_schema(), EngineConfig(k=5, delta=100, beta=20, mu=10, seed=1,
                                                  algorithm="ubdsa" if age_pressure else "castle"))
        rows = eng.encode_many({c: col[:300] for c, col in adult_head.items()})
        for i in range(300):
            record = {c: col[i] for c, col in adult_head.items()}
            if i % 2:
                eng.push(record, now=float(i))
            else:
                eng.push_encoded(record, rows[i], now=float(i))
    assert list(union_enlargements.signatures) == compiled
