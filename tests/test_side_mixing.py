"""Mixing windows of side copies (pure): when a window leaves, what it holds, its order and its timestamp; and the
permutation statistics the linkage test measures the position attack against."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stream_anon.service.linkage import (
    offset_linkage,
    offset_windows,
    permutation_match_moments,
    value_linkage,
)
from stream_anon.side.encoding import CopyBatch
from stream_anon.side.mixing import CopyMixer


def batch(topic: str, ids: range) -> CopyBatch:
    return CopyBatch(topic, [f"k{i}".encode() for i in ids], [f"{topic}:{i}".encode() for i in ids], 1.0)


def mixer(records: int = 10, seconds: float = 5.0, seed: int = 0) -> tuple[CopyMixer, list[float]]:
    now = [100.0]
    m = CopyMixer(records, seconds, np.random.default_rng(seed), clock=lambda: now[0], wall=lambda: 1e9 + now[0])
    return m, now


def test_a_window_leaves_at_its_record_count_or_its_age_and_holds_every_topic() -> None:
    m, now = mixer()
    m.add(0, [batch("a", range(0, 6)), batch("b", range(0, 6))], 6)
    m.add(1, [batch("a", range(100, 103)), batch("b", range(100, 103))], 3)
    assert m.due() == [] and m.pending_records == 9 and m.seconds_to_next() == 5.0
    m.add(0, [batch("a", range(6, 12)), batch("b", range(6, 12))], 6)
    (w,) = m.due()  # partition 0 reached 10 records (12: a window holds at least `records`)
    assert (w.partition, w.records, w.reason) == (0, 12, "records")
    assert [c.topic for c in w.copies] == ["a", "b"]
    assert sorted(w.copies[0].payloads) == sorted(f"a:{i}".encode() for i in range(12))
    assert w.timestamp_ms == int((1e9 + 100.0) * 1000)
    now[0] += 5.0
    (w1,) = m.due()
    assert (w1.partition, w1.records, w1.reason) == (1, 3, "seconds") and m.pending_records == 0
    m.add(1, [batch("a", range(3)), batch("b", range(3))], 3)
    assert [x.reason for x in m.flush()] == ["flush"] and m.flush() == []
    with pytest.raises(ValueError, match="2 copies for 3 records"):
        m.add(0, [batch("a", range(2))], 3)


def test_each_topic_is_shuffled_independently_and_uniformly() -> None:
    """Over many windows of 4 records the position of record 0 is uniform on each topic (chi-square, 3 degrees of
    freedom, below its 99.99 % point 21.1), and the two topics' orders are independent."""
    m, _ = mixer(records=4, seed=7)
    counts = np.zeros((4, 4))
    same = 0
    n = 4000
    for _ in range(n):
        m.add(0, [batch("a", range(4)), batch("b", range(4))], 4)
        (w,) = m.due()
        a, b = w.copies
        pa, pb = a.keys.index(b"k0"), b.keys.index(b"k0")
        counts[pa, pb] += 1
        same += a.keys == b.keys
    margins = counts.sum(axis=1)
    chi2 = float(((margins - n / 4) ** 2 / (n / 4)).sum())
    assert chi2 < 21.1, margins
    assert abs(same - n / 24) < 4 * math.sqrt(n / 24)  # both orders equal: 1/4! if independent


@pytest.mark.parametrize("n", [1, 2, 5])
def test_permutation_moments_are_exact(n: int) -> None:
    """Against an enumeration of all n! permutations, for fixed points, a distance band and arbitrary sets."""
    rng = np.random.default_rng(n)
    cases = [np.eye(n, dtype=bool), np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= 1,
             rng.random((n, n)) < 0.4]
    for allowed in cases:
        xs = [sum(bool(allowed[i, p[i]]) for i in range(n)) for p in itertools.permutations(range(n))]
        mean, var = permutation_match_moments(allowed)
        assert mean == pytest.approx(float(np.mean(xs))) and var == pytest.approx(float(np.var(xs)), abs=1e-12)


def test_offset_and_value_linkage_tell_a_shuffle_from_the_input_order() -> None:
    rng = np.random.default_rng(3)
    n_windows, size = 40, 200
    parts, offs, stamps, src = [], [], [], []
    for w in range(n_windows):
        perm = rng.permutation(size)
        for j in range(size):
            parts.append(0)
            offs.append(w * size + j)
            stamps.append(1000 + w)
            src.append(w * size + int(perm[j]))  # the record at side position j arrived at input offset src
    windows = offset_windows(parts, offs, stamps)
    assert [len(w) for w in windows] == [size] * n_windows
    shuffled = offset_linkage(windows, offs, src)
    assert shuffled.expected == pytest.approx(n_windows) and shuffled.variance == pytest.approx(n_windows)
    assert abs(shuffled.z) < 4
    band = offset_linkage(windows, offs, src, distance=10)
    assert band.expected_fraction == pytest.approx((21 * size - 110) / size**2) and abs(band.z) < 4
    in_order = offset_linkage(windows, offs, offs)  # no mixing: every copy at its input offset
    assert in_order.hits == n_windows * size and in_order.z > 100
    # without pseudonyms: values of the copy at an offset vs the input record's there (5 distinct values)
    values = {o: int(o % 5) for o in range(n_windows * size)}
    copy_values = [values[s] for s in src]
    v = value_linkage(windows, offs, copy_values, values.__getitem__)
    assert v.expected_fraction == pytest.approx(0.2, abs=0.01) and abs(v.z) < 4
    assert value_linkage(windows, offs, [values[o] for o in offs], values.__getitem__).fraction == 1.0
