"""Synthetic ADULT-shaped generator: schema validity, determinism, ADULT marginals within multinomial error."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from scipy import stats

from stream_anon.core.datasets import read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.replay.synthetic import (
    ADULT_MARGINALS_PATH,
    AttributeMarginal,
    Marginals,
    MarginalsError,
    SyntheticGenerator,
    adult_marginals,
    synthetic_adult_records,
)

N = 40_000


@pytest.fixture(scope="module")
def shipped() -> Marginals:
    return Marginals.load(ADULT_MARGINALS_PATH)


@pytest.fixture(scope="module")
def sample(shipped: Marginals) -> dict[str, np.ndarray]:
    return SyntheticGenerator(shipped, rng=20240611).columns(N)


def _category_counts(m: AttributeMarginal, column: np.ndarray) -> np.ndarray:
    """Counts of the sample in the marginal's categories / distinct values / bins."""
    if m.kind == "bins":
        assert m.edges is not None
        return np.histogram(column.astype(np.float64), bins=m.edges)[0]
    index = {v: i for i, v in enumerate(m.values or ())}
    idx = np.array([index[v] for v in column.tolist()])
    return np.bincount(idx, minlength=len(index))


def marginal_deviations(marginals: Marginals, columns: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Per attribute: (max |p_hat - p| / SE over categories, chi-square p-value), SE = sqrt(p(1-p)/n)."""
    out = {}
    for name, m in marginals.attributes.items():
        counts = _category_counts(m, columns[name])
        n = counts.sum()
        p = m.probabilities
        se = np.sqrt(p * (1 - p) / n)
        z = np.abs(counts / n - p) / np.where(se > 0, se, np.inf)
        # chi-square on categories with expected count >= 5 (the rest pooled into one cell)
        expected = p * n
        big = expected >= 5
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        keep = exp > 0
        pvalue = stats.chisquare(obs[keep], exp[keep]).pvalue
        out[name] = (float(z.max()), float(pvalue))
    return out


def _thresholds(marginals: Marginals, alpha: float = 0.001) -> tuple[float, float]:
    """Bonferroni over every category (z) and over attributes (chi-square p), family-wise level ``alpha``."""
    k = sum(m.counts.size for m in marginals.attributes.values())
    z = float(stats.norm.isf(alpha / (2 * k)))
    return z, alpha / len(marginals.attributes)


def test_every_record_validates_against_the_adult_schema(shipped: Marginals) -> None:
    schema = adult_schema()
    recs = SyntheticGenerator(shipped, rng=1).records(20_000)
    for r in recs:
        assert schema.validate(r) == r  # valid and already normalized (native ints, exact strings)
    assert list(recs[0]) == ["id", *schema.names]


def test_ids_are_labelled_synthetic_and_unbounded_iteration_continues(shipped: Marginals) -> None:
    gen = SyntheticGenerator(shipped, rng=3, batch_size=1000)
    recs = list(itertools.islice(gen, 2500))  # crosses batch boundaries
    assert [r["id"] for r in recs] == [f"synth-{i:06d}" for i in range(2500)]
    assert gen.next_index == 3000  # three batches drawn: the iterator is lazy and unbounded
    assert next(iter(SyntheticGenerator(shipped, rng=3, start_index=1_000_000).records(1)))["id"] == "synth-1000000"


def test_same_seed_same_records_other_seed_other_records(shipped: Marginals) -> None:
    a = SyntheticGenerator(shipped, rng=7).records(3000)
    b = SyntheticGenerator(shipped, rng=7).records(3000)
    c = SyntheticGenerator(shipped, rng=8).records(3000)
    assert a == b
    assert a != c
    assert list(synthetic_adult_records(100, rng=7, marginals=shipped)) == a[:100]
    g = SyntheticGenerator(shipped, rng=7)
    assert g.records(100) + g.records(2900) == a  # independent of how the records are requested


def test_marginals_match_adult_within_multinomial_error(shipped: Marginals, sample: dict[str, np.ndarray]) -> None:
    z_max, p_min = _thresholds(shipped)
    dev = marginal_deviations(shipped, sample)
    for name, (z, pvalue) in dev.items():
        assert z < z_max, f"{name}: a category is {z:.2f} SE off (limit {z_max:.2f})"
        assert pvalue > p_min, f"{name}: chi-square p = {pvalue:.2e} (limit {p_min:.1e})"


def test_the_marginal_check_has_power_against_a_wrong_distribution(shipped: Marginals) -> None:
    """Negative control: sampling age and workclass uniformly must fail the same check."""
    wrong = dict(shipped.attributes)
    for name in ("age", "workclass"):
        m = wrong[name]
        wrong[name] = AttributeMarginal(name, m.kind, np.ones_like(m.counts), values=m.values, edges=m.edges)
    bad = Marginals(n=shipped.n, attributes=wrong, dependencies=shipped.dependencies)
    cols = SyntheticGenerator(bad, rng=20240611).columns(N)
    z_max, p_min = _thresholds(shipped)
    dev = marginal_deviations(shipped, cols)
    assert dev["age"][0] > z_max and dev["age"][1] < p_min
    assert dev["workclass"][0] > z_max and dev["workclass"][1] < p_min
    assert dev["sex"][0] < z_max  # untouched attributes still pass


def test_education_num_is_derived_from_education_as_in_adult(sample: dict[str, np.ndarray],
                                                             shipped: Marginals) -> None:
    given, mapping = shipped.dependencies["education-num"]
    assert given == "education" and mapping["Bachelors"] == 13 and mapping["Preschool"] == 1
    assert all(mapping[e] == n for e, n in zip(sample["education"].tolist(), sample["education-num"].tolist(),
                                               strict=True))


def test_shipped_json_equals_the_marginals_of_the_real_file(adult_path, shipped: Marginals) -> None:
    real = Marginals.from_adult_file(adult_path)
    assert real.n == shipped.n == 32_561
    assert set(real.attributes) == set(shipped.attributes)
    for name, m in real.attributes.items():
        s = shipped.attributes[name]
        assert m.kind == s.kind
        assert np.array_equal(m.counts, s.counts), name
        assert m.values == s.values
        if m.kind == "bins":
            assert m.edges is not None and s.edges is not None and np.array_equal(m.edges, s.edges)
    assert real.dependencies == shipped.dependencies
    # counts, not records: the JSON holds per-category totals only
    df = read_adult(adult_path)
    assert shipped.attributes["sex"].counts.tolist() == [int(df["sex"].eq(v).sum())
                                                         for v in shipped.attributes["sex"].values or ()]
    assert ADULT_MARGINALS_PATH.stat().st_size < 20_000


def test_offline_falls_back_to_the_shipped_json(monkeypatch: pytest.MonkeyPatch, adult_path) -> None:
    monkeypatch.delenv("STREAM_ANON_ADULT", raising=False)
    m = adult_marginals()
    assert "sha256" in m.source and m.n == 32_561
    monkeypatch.setenv("STREAM_ANON_ADULT", str(adult_path))
    assert adult_marginals().n == 32_561
    with pytest.raises(MarginalsError, match="does not exist"):
        adult_marginals("/nonexistent/adult.data")


def test_marginals_json_errors_name_the_field(tmp_path) -> None:
    with pytest.raises(MarginalsError, match="format"):
        Marginals.from_json({"format": "other"})
    with pytest.raises(MarginalsError, match="'age'.*counts"):
        AttributeMarginal("age", "values", np.array([-1, 2]), values=(1, 2))
    with pytest.raises(MarginalsError, match="edges"):
        AttributeMarginal("fnlwgt", "bins", np.array([1, 2]), edges=np.array([0.0, 1.0]))
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    with pytest.raises(MarginalsError, match="m.json"):
        Marginals.load(bad)


class CountingGenerator:
    """A numpy Generator that counts the draws made through it (same stream as the wrapped generator)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        attr = getattr(self.rng, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)
        return counted


@pytest.mark.slow  # (CI's full suite; not in the fast tier, for its time budget)
def test_generation_is_vectorized_per_batch_and_the_throughput_is_printed(shipped: Marginals) -> None:
    """What makes the generator fast, asserted without a clock: a fixed number of vectorized draws per batch of
    8,192 records (one ``choice`` per drawn attribute), never one per record.  The rate is printed, not asserted
    (it depends on the machine and its load)."""
    counting = CountingGenerator(0)
    gen = SyntheticGenerator(shipped, rng=0)
    gen.rng = counting  # type: ignore[assignment]  # the same seed's stream, drawn through the counter
    t0 = time.perf_counter()
    recs = gen.records(100_000)
    dt = time.perf_counter() - t0
    batches = -(-100_000 // gen.batch_size)
    drawn = [name for name in shipped.attributes if name not in shipped.dependencies]
    assert counting.calls["choice"] == batches * len(drawn)
    assert sum(counting.calls.values()) <= batches * (len(drawn) + 2)  # + the uniform draws inside fnlwgt's bins
    assert len(recs) == 100_000 and recs == SyntheticGenerator(shipped, rng=0).records(100_000)  # same stream
    print(f"\nsynthetic generator: {len(recs):,} records in {dt:.3f} s = {len(recs) / dt:,.0f} records/s (dicts)")
    t0 = time.perf_counter()
    SyntheticGenerator(shipped, rng=0).columns(300_000)
    dt = time.perf_counter() - t0
    print(f"synthetic generator: 300,000 records as columns in {dt:.3f} s = {3e5 / dt:,.0f} records/s")
