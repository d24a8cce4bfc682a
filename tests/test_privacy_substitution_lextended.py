"""l-extended random substitution: both variants, estimators (biased paper / unbiased), exact eps."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stream_anon.privacy import LExtendedSubstitution, PrivacyParameterError
from stream_anon.privacy.substitution import (
    enumerate_no_repeat_output_probabilities,
    enumerated_epsilon,
    gamma_for_epsilon,
    no_repeat_draw_order_epsilon,
    no_repeat_epsilon,
    no_repeat_inclusion_probabilities,
)

# N=8, skewed data: true count 1500 in the first cell (privacy-peers.md's setting)
TRUTH8 = np.array([1500, 1000, 800, 600, 500, 300, 200, 100])


def _reps(mech: LExtendedSubstitution, truth: np.ndarray, reps: int) -> tuple[np.ndarray, np.ndarray, int]:
    codes = np.repeat(np.arange(len(truth)), truth)
    unbiased = np.empty((reps, len(truth)))
    paper = np.empty((reps, len(truth)))
    draws = 0
    for r in range(reps):
        out = mech.randomise_codes(codes)
        draws += mech.draws_used
        unbiased[r] = mech.estimate_counts_from_codes(out).counts
        paper[r] = mech.estimate_counts_paper_from_codes(out)
    return unbiased, paper, draws


def test_parameters() -> None:
    with pytest.raises(PrivacyParameterError, match="variant"):
        LExtendedSubstitution(categories=list(range(4)), gamma=2.0, l=2, variant="paper")  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match=r"no-repeat.*\[1, 3\].*4"):
        LExtendedSubstitution(categories=list(range(4)), gamma=2.0, l=4, variant="no-repeat")
    with pytest.raises(PrivacyParameterError, match="l"):
        LExtendedSubstitution(categories=list(range(4)), gamma=2.0, l=0)
    m = LExtendedSubstitution(categories=list(range(4)), gamma=2.0, l=6)  # independent: any l
    assert m.epsilon == pytest.approx(6 * math.log(2.0))


@pytest.mark.parametrize("n_rep", [1, 2, 4])
def test_independent_unbiased_variance_over_l(n_rep: int) -> None:
    mech = LExtendedSubstitution(categories=list(range(8)), gamma=math.e, l=n_rep, variant="independent", rng=20 + n_rep)
    reps = 200
    unbiased, paper, draws = _reps(mech, TRUTH8, reps)
    n = int(TRUTH8.sum())
    var = np.asarray(mech.variance(TRUTH8, n))
    assert np.allclose(unbiased, paper)  # for independent draws divide-by-l IS the unbiased estimator
    assert np.all(np.abs(unbiased.mean(axis=0) - TRUTH8) <= 4 * np.sqrt(var / reps))
    ratio = unbiased.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) <= 4 * math.sqrt(2 / (reps - 1))), ratio
    single = LExtendedSubstitution(categories=list(range(8)), gamma=math.e, l=1)
    assert np.allclose(var, np.asarray(single.variance(TRUTH8, n)) / n_rep)
    assert draws == reps * n * n_rep


def test_no_repeat_outputs_are_distinct_sets_and_shuffled() -> None:
    mech = LExtendedSubstitution(categories=list(range(6)), gamma=5.0, l=3, variant="no-repeat", rng=5)
    n = 60_000
    out = mech.randomise_codes(np.zeros(n, dtype=np.int64))
    assert out.shape == (n, 3)
    assert (np.diff(np.sort(out, axis=1), axis=1) > 0).all()
    # shuffled: each position holds the true value with probability a_l / l (not p in the first position)
    expected = mech.a_l / 3
    tol = 4 * math.sqrt(expected * (1 - expected) / n)
    for j in range(3):
        assert abs(float(np.mean(out[:, j] == 0)) - expected) <= tol
    assert mech.p - expected > 10 * tol  # draw order would have shown p in column 0: the test can tell
    assert mech.draws_used >= 3 * n and mech.total_draws == mech.draws_used
    with pytest.raises(PrivacyParameterError, match="repeats"):
        mech.estimate_counts_from_codes(np.array([[0, 0, 1]]))


@pytest.mark.parametrize("n_rep", [2, 3, 4])
def test_no_repeat_paper_estimator_biased_inclusion_estimator_unbiased(n_rep: int) -> None:
    """N=8, gamma=e, n=5000: the divide-by-l estimator is off by hundreds on the 1500 cell;
    (Y_v - n b_l)/(a_l - b_l) is unbiased within 4 SE."""
    mech = LExtendedSubstitution(categories=list(range(8)), gamma=math.e, l=n_rep, variant="no-repeat", rng=30 + n_rep)
    reps = 150
    unbiased, paper, draws = _reps(mech, TRUTH8, reps)
    n = int(TRUTH8.sum())
    var = np.asarray(mech.variance(TRUTH8, n))
    se_mean = np.sqrt(var / reps)
    assert np.all(np.abs(unbiased.mean(axis=0) - TRUTH8) <= 4 * se_mean)
    ratio = unbiased.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) <= 4 * math.sqrt(2 / (reps - 1))), ratio
    # the paper's estimator: its mean matches the closed-form expectation, which is far from the truth
    expected_paper = mech.paper_estimate_expectation(TRUTH8)
    paper_se = paper.std(axis=0, ddof=1) / math.sqrt(reps)
    assert np.all(np.abs(paper.mean(axis=0) - expected_paper) <= 4 * paper_se + 1e-9)
    bias = paper.mean(axis=0) - TRUTH8
    assert bias[0] < -100 * (n_rep - 1) and abs(bias[0]) > 20 * paper_se[0], bias
    # draws: at least one per output; rejections add more
    assert draws > reps * n * n_rep


@pytest.mark.parametrize("big_n, gamma, n_rep", [(8, math.e, 2), (8, math.e, 4), (50, 5.0, 4)])
def test_paper_estimator_is_shrinkage_toward_uniform(big_n: int, gamma: float, n_rep: int) -> None:
    mech = LExtendedSubstitution(categories=list(range(big_n)), gamma=gamma, l=n_rep, variant="no-repeat")
    truth = np.random.default_rng(0).integers(0, 1000, size=big_n).astype(float)
    n = truth.sum()
    kappa = mech.paper_shrinkage
    assert 0 < kappa < 1
    assert np.allclose(mech.paper_estimate_expectation(truth), n / big_n + kappa * (truth - n / big_n))
    ind = LExtendedSubstitution(categories=list(range(big_n)), gamma=gamma, l=n_rep)
    assert ind.paper_shrinkage == 1.0 and np.allclose(ind.paper_estimate_expectation(truth), truth)


def test_inclusion_probabilities_match_enumeration() -> None:
    for big_n, gamma, n_rep in [(4, 2.0, 2), (5, math.e, 3), (6, 10.0, 4), (7, 1.2, 1)]:
        a, b = no_repeat_inclusion_probabilities(big_n, gamma, n_rep)
        dist = enumerate_no_repeat_output_probabilities(big_n, gamma, n_rep, true_value=1)
        assert sum(dist.values()) == pytest.approx(1.0)
        assert a == pytest.approx(sum(p for s, p in dist.items() if 1 in s), rel=1e-12)
        assert b == pytest.approx(sum(p for s, p in dist.items() if 3 in s), rel=1e-12)
        assert a + (big_n - 1) * b == pytest.approx(n_rep)


def test_exact_epsilon_by_enumeration() -> None:
    """Closed forms for the set (shuffled) and draw-order eps equal brute-force enumeration;
    shuffling strictly lowers eps for l >= 2; l = 1 is plain FRAPP (ln gamma)."""
    for big_n in (3, 4, 5, 6):
        for gamma in (1.3, math.e, 8.0):
            for n_rep in range(1, big_n):
                eps_set = no_repeat_epsilon(big_n, gamma, n_rep)
                eps_order = no_repeat_draw_order_epsilon(big_n, gamma, n_rep)
                assert eps_set == pytest.approx(enumerated_epsilon(big_n, gamma, n_rep), rel=1e-12)
                assert eps_order == pytest.approx(enumerated_epsilon(big_n, gamma, n_rep, ordered=True), rel=1e-12)
                assert eps_set >= math.log(gamma) - 1e-12
                if n_rep == 1:
                    assert eps_set == pytest.approx(math.log(gamma))
                else:
                    assert eps_set < eps_order
    m = LExtendedSubstitution(categories=list(range(5)), gamma=3.0, l=2, variant="no-repeat")
    assert m.epsilon == pytest.approx(enumerated_epsilon(5, 3.0, 2))
    assert m.epsilon_draw_order == pytest.approx(enumerated_epsilon(5, 3.0, 2, ordered=True))


def test_independent_epsilon_by_enumeration() -> None:
    """Independent draws: the worst ratio over all output sequences is gamma^l."""
    big_n, gamma, n_rep = 4, 2.5, 3
    mech = LExtendedSubstitution(categories=list(range(big_n)), gamma=gamma, l=n_rep)
    col = mech.p, mech.q
    worst = 0.0
    for seq in itertools.product(range(big_n), repeat=n_rep):
        pa = math.prod(col[0] if s == 0 else col[1] for s in seq)
        pb = math.prod(col[0] if s == 1 else col[1] for s in seq)
        worst = max(worst, math.log(pa / pb))
    assert worst == pytest.approx(mech.epsilon) == pytest.approx(n_rep * math.log(gamma))


def test_no_repeat_empirical_privacy_ratio() -> None:
    """Empirical P[set | a] / P[set | b] <= e^eps (exact set eps) within binomial tolerance, and tight."""
    big_n, gamma, n_rep = 4, 4.0, 2
    mech = LExtendedSubstitution(categories=list(range(big_n)), gamma=gamma, l=n_rep, variant="no-repeat", rng=8)
    n = 200_000

    def set_freqs(t: int) -> dict[tuple[int, ...], float]:
        out = np.sort(mech.randomise_codes(np.full(n, t)), axis=1)
        keys, counts = np.unique(out[:, 0] * big_n + out[:, 1], return_counts=True)
        return {(int(k) // big_n, int(k) % big_n): c / n for k, c in zip(keys, counts, strict=True)}

    fa, fb = set_freqs(0), set_freqs(1)
    bound = math.exp(mech.epsilon)
    tight = []
    for s in itertools.combinations(range(big_n), n_rep):
        pa, pb = fa.get(s, 0.0), fb.get(s, 0.0)
        tol = 4 * math.sqrt(pa * (1 - pa) / n + bound**2 * pb * (1 - pb) / n)
        assert pa - bound * pb <= tol, s
        assert pb - bound * pa <= 4 * math.sqrt(pb * (1 - pb) / n + bound**2 * pa * (1 - pa) / n), s
        if 0 in s and 1 not in s:
            tight.append(abs(pa - bound * pb) <= tol)
    assert all(tight)  # sets with a but not b attain the ratio
    assert math.exp(mech.epsilon_draw_order) > bound


def test_gamma_for_epsilon_roundtrip() -> None:
    for variant, n_rep in [("independent", 3), ("no-repeat", 2), ("no-repeat", 5)]:
        g = gamma_for_epsilon(8, 2.0, n_rep, variant)  # type: ignore[arg-type]
        m = LExtendedSubstitution.for_epsilon(categories=list(range(8)), epsilon=2.0, l=n_rep,
                                              variant=variant)  # type: ignore[arg-type]
        assert m.gamma == pytest.approx(g) and m.epsilon == pytest.approx(2.0, rel=1e-9)


def test_labels_and_bound() -> None:
    cats = ["a", "b", "c", "d", "e"]
    m = LExtendedSubstitution(categories=cats, gamma=3.0, l=2, variant="no-repeat", rng=1)
    out = m.randomise_many(np.array(["a", "b", "c"] * 10, dtype=object))
    assert out.shape == (30, 2) and set(out.ravel()) <= set(cats)
    assert m.randomise("a").shape == (2,)
    est = m.estimate_counts(out)
    assert est.n == 30 and est.mechanism == "rs-l/no-repeat"
    assert isinstance(m.estimate_counts_paper(out), np.ndarray)
    with pytest.raises(PrivacyParameterError, match=r"\(n, 2\)"):
        m.estimate_counts(np.array(["a", "b", "c"], dtype=object))
    ind1 = LExtendedSubstitution(categories=cats, gamma=3.0, l=1)
    from stream_anon.privacy import frapp_standard_error_bound
    assert ind1.standard_error_bound(1000) == pytest.approx(frapp_standard_error_bound(5, 3.0, 1000))
    ind4 = LExtendedSubstitution(categories=cats, gamma=3.0, l=4)
    assert ind4.standard_error_bound(1000) == pytest.approx(frapp_standard_error_bound(5, 3.0, 1000) / 2)
