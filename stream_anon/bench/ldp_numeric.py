"""``stream-anon bench ldp-numeric``: bounded Laplace speed and scale, discretized utility, mean estimators,
eps selection on ADULT, and DP k-means (QuadkDP / UniQuadkDP vs non-private k-means and diffprivlib).

Prints markdown tables of what it measured.  ``--quick`` runs in seconds (few runs, small arrays).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from stream_anon.bench import reachability
from stream_anon.privacy.base import PrivacyParameterError, seeded_crypto_rng
from stream_anon.privacy.bounded_laplace import (
    BoundedLaplace,
    Calibration,
    DiscretizedBoundedLaplace,
    UnsafeFloatBoundedLaplace,
    actual_epsilon,
    bounded_laplace_scale,
)
from stream_anon.privacy.dp_kmeans import (
    Neighbouring,
    QuadTreeKMeans,
    nicv,
    relative_improvement,
    weighted_kmeans,
    window_epsilon,
)
from stream_anon.privacy.epsilon_selection import (
    select_epsilon_categorical,
    select_epsilon_classifier,
    select_epsilon_numeric,
)

KMEANS_EPSILONS = (0.05, 0.1, 0.2, 0.5, 1.0)
CALIBRATIONS: tuple[Calibration, ...] = ("exact", "patent")
KMEANS_GAMMAS = (0.1, 0.3, 0.5, 0.7)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream-anon bench ldp-numeric", description=__doc__)
    p.add_argument("--quick", action="store_true", help="few runs and small arrays (seconds)")
    p.add_argument("--runs", type=int, default=None, help="seeded runs per DP k-means cell (default 30; quick 3)")
    p.add_argument("--adult", default=None, help="path of adult.data (default $STREAM_ANON_ADULT)")
    p.add_argument("--clusters", type=int, default=5, help="k for the DP k-means tables (default 5)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["speed", "exact", "reachability", "mean", "select", "kmeans"], help="sections to skip")
    return p


def _rate(fn: Callable[[], Any], n: int, repeats: int = 3) -> float:
    """Values per second, best of ``repeats`` wall-clock runs after a warm-up."""
    return _rates(fn, n, repeats)[0]


def _rates(fn: Callable[[], Any], n: int, repeats: int = 3) -> tuple[float, float]:
    """(values per wall second, values per CPU second of this process), each the best of ``repeats`` runs.

    The CPU figure is the one to compare on a loaded machine (the code is single-threaded numpy)."""
    fn()
    best_wall = best_cpu = math.inf
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        best_wall = min(best_wall, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    return n / best_wall, n / max(best_cpu, 1e-9)


def _generator(name: str, seed: int) -> np.random.Generator:
    """ChaCha20 (default noise generator; seeded here) or PCG64 (numpy's default, used before; not cryptographic)."""
    return seeded_crypto_rng(seed) if name == "ChaCha20" else np.random.default_rng(seed)


def _speed(quick: bool, seed: int) -> None:
    n = 200_000 if quick else 1_000_000
    data = np.random.default_rng(seed)
    ages = data.integers(17, 91, n).astype(np.float64)
    reals = data.uniform(-1.0, 1.0, n)
    cats = ["Preschool", "HS-grad", "Some-college", "Bachelors", "Masters"]
    idx = data.integers(0, 5, n)
    vals = np.array(cats, dtype=object)[idx]
    print("## Speed (one core, best of 3)\n")
    print("ChaCha20 = the default noise generator (randomgen ChaCha, 20 rounds; seeded here); PCG64 = numpy's "
          "default, used before (not cryptographic): the difference is the cost of the CSPRNG.\n")
    print("| mechanism | generator | values | values/s (wall) | values per CPU second |")
    print("|---|---|---:|---:|---:|")
    for gen in ("ChaCha20", "PCG64"):
        blap = BoundedLaplace(epsilon=1.0, lower=17, upper=90, integer=True, rng=_generator(gen, seed))
        real = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, rng=_generator(gen, seed))
        unsafe = UnsafeFloatBoundedLaplace(epsilon=1.0, lower=17, upper=90, rng=_generator(gen, seed))
        dblap = DiscretizedBoundedLaplace(epsilon=1.0, categories=cats, rng=_generator(gen, seed))
        print(f"| BoundedLaplace.randomise_many (age, integer grid) | {gen} | {n:,} | "
              f"{_fmt_rates(partial(blap.randomise_many, ages), n)} |")
        print(f"| BoundedLaplace.randomise_many ([-1, 1], grid 2^-7, real inputs) | {gen} | {n:,} | "
              f"{_fmt_rates(partial(real.randomise_many, reals), n)} |")
        print(f"| UnsafeFloatBoundedLaplace (age; not eps-DP, before) | {gen} | {n:,} | "
              f"{_fmt_rates(partial(unsafe.randomise_many, ages), n)} |")
        print(f"| DiscretizedBoundedLaplace.randomise_indices (m=5) | {gen} | {n:,} | "
              f"{_fmt_rates(partial(dblap.randomise_indices, idx), n)} |")
        print(f"| DiscretizedBoundedLaplace.randomise_many (strings) | {gen} | {n:,} | "
              f"{_fmt_rates(partial(dblap.randomise_many, vals), n)} |")
    print()
    print("## Continuous theory: naive scale dQ/eps vs the scale that gives eps (domain [-1, 1], width 2)\n")
    print("| sensitivity | eps | naive b | actual eps of naive b | Holohan b | actual eps of Holohan b |")
    print("|---:|---:|---:|---:|---:|---:|")
    for sens in (2.0, 1.0, 0.5, 0.1):
        for eps in (0.1, 1.0, 5.0):
            b = bounded_laplace_scale(epsilon=eps, sensitivity=sens, width=2.0)
            print(f"| {sens:g} | {eps:g} | {sens / eps:.4g} | {actual_epsilon(sens / eps, sens, 2.0):.4f} | "
                  f"{b:.4g} | {actual_epsilon(b, sens, 2.0):.4f} |")
    print()


def _fmt_rates(fn: Callable[[], Any], n: int) -> str:
    wall, cpu = _rates(fn, n)
    return f"{wall:,.0f} | {cpu:,.0f}"


def _exact(quick: bool) -> None:
    print("## Stated vs exact eps (grid tables; exact value rounded up by < 1e-12)\n")
    print("| mechanism | domain / m | target eps | calibration | scale b | grid points | exact eps |")
    print("|---|---|---:|---|---:|---:|---:|")
    for name, lo, hi, integer in (("age", 17, 90, True), ("hours-per-week", 1, 99, True),
                                  ("education-num", 1, 16, True), ("real", -1, 1, False)):
        for eps in (0.1, 1.0, 5.0):
            for cal in CALIBRATIONS:
                m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=integer, calibration=cal)
                print(f"| bounded Laplace {name} | [{lo}, {hi}] | {eps:g} | {cal} | {m.scale:.6g} | {len(m.grid)} | "
                      f"{m.epsilon!r} |")
    m1 = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, sensitivity=1.0)
    print(f"| bounded Laplace real, sensitivity 1 | [-1, 1] | 1 | exact | {m1.scale:.6g} | {len(m1.grid)} | "
          f"{m1.epsilon!r} |")
    for mm in (2, 3, 5, 16):
        for cal in CALIBRATIONS:
            d = DiscretizedBoundedLaplace(epsilon=1.0, categories=list(range(mm)), calibration=cal)
            print(f"| discretized bounded Laplace | m = {mm} | 1 | {cal} | {d.scale:.6g} | - | {d.epsilon!r} |")
    print()
    print("## Discretized bounded Laplace vs k-RR at the same exact eps: P(report = true category)\n")
    print("| eps | m | DBL exact-calibrated P(true) (ends .. middle) | DBL patent b = 2/eps P(true) (its exact eps) | "
          "k-RR P(true) |")
    print("|---:|---:|---|---|---:|")
    for mm in (2, 5, 16):
        for eps in (0.5, 1.0, 2.0, 5.0):
            d = DiscretizedBoundedLaplace(epsilon=eps, categories=list(range(mm)))
            pat = DiscretizedBoundedLaplace(epsilon=eps, categories=list(range(mm)), calibration="patent")
            print(f"| {eps:g} | {mm} | {_half(d.p_true)} | {_half(pat.p_true)} ({pat.epsilon:.3f}) | "
                  f"{math.exp(eps) / (math.exp(eps) + mm - 1):.3f} |")
    print()
    print("## DP k-means: exact eps of one window (eps = 1, gamma = 0.5, d = 2, max_depth 6)\n")
    print("| calibration | under replace-one | under add/remove |")
    print("|---|---:|---:|")
    relations: tuple[Neighbouring, ...] = ("replace", "add_remove")
    for relation in relations:
        km = QuadTreeKMeans(n_clusters=3, epsilon=1.0, bounds=([17, 1], [90, 99]), neighbouring=relation)
        cells = []
        for rel in relations:
            try:
                t, c = window_epsilon(km.noise, rel)
                cells.append(f"{float(t + c):.4f} (tree {float(t):.4f} + leaves {float(c):.4f})")
            except PrivacyParameterError:
                cells.append("inf (root count without noise)")
        print(f"| {relation} (tree scale {km.noise.tree_scale}, leaf scale {km.noise.count_scale}) | "
              f"{cells[0]} | {cells[1]} |")
    print()
    print("## Mean estimators on the grid: SD of one transformed report (exact, from the table)\n")
    print("| attribute | eps | unbiased h = P^-1 x: SD mid / end | boundary-corrected w=0.1: SD mid / end | "
          "its max bias | continuous formula on the grid: max bias |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, lo, hi, integer in (("age", 17, 90, True), ("hours-per-week", 1, 99, True),
                                  ("education-num", 1, 16, True), ("real [-1, 1]", -1, 1, False)):
        for eps in (0.1, 1.0, 5.0):
            m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=integer)
            P, x = m.transition_matrix, m.grid
            mid = len(x) // 2
            cells = []
            for w in (0.0, 0.1):
                h = m.unbiased_transform(x, boundary_width=w)
                sd = np.sqrt(np.maximum(P @ (h * h) - (P @ h) ** 2, 0.0))
                cells.append(f"{sd[mid]:.2f} / {sd[0]:.2f}")
            cont = UnsafeFloatBoundedLaplace(scale=m.scale, lower=lo, upper=hi)
            hc = cont.unbiased_transform(x)
            print(f"| {name} | {eps:g} | {cells[0]} | {cells[1]} | {m.max_transform_bias():.3f} | "
                  f"{np.abs(P @ hc - x).max():.3f} |")
    print()


def _half(p: np.ndarray) -> str:
    """The first half of a symmetric vector (ends .. middle), 3 decimals."""
    return ", ".join(f"{v:.3f}" for v in p[: (len(p) + 1) // 2])


def _reachability(quick: bool, seed: int) -> None:
    n = 50_000 if quick else 200_000
    print(f"## Exact reachability (n = {n:,} outputs per pair; `python -m stream_anon.bench.reachability`)\n")
    print(reachability.report(epsilons=(1.0,), n=n, seed=seed))
    print()


def _adult(path: str | None) -> Any:
    from stream_anon.core.datasets import read_adult

    return read_adult(path)


def _mean_estimators(df: Any, quick: bool, seed: int) -> None:
    runs = 5 if quick else 50
    methods = ("boundary-corrected", "unbiased", "aggregate", "per-value")
    print(f"## Mean estimators on ADULT ({runs} seeded runs, integer grid): bias and SD of the estimate\n")
    print("| attribute | eps | " + " | ".join(f"{m} bias | SD" for m in methods) + " |")
    print("|---|---:|" + "---:|---:|" * len(methods))
    rng = seeded_crypto_rng(seed)
    for col, lo, hi in (("age", 17, 90), ("hours-per-week", 1, 99)):
        x = df[col].to_numpy(dtype=float)
        for eps in (0.5, 1.0, 2.0, 5.0):
            m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=True, rng=rng)
            res: dict[str, list[float]] = {meth: [] for meth in methods}
            for _ in range(runs):
                y = m.randomise_many(x)
                for meth, lst in res.items():
                    lst.append(m.estimate_mean(y, method=meth)[0])  # type: ignore[arg-type]
            cells = []
            for lst in res.values():
                a = np.array(lst)
                cells.append(f"{a.mean() - x.mean():+.3f} | {a.std(ddof=1):.3f}")
            print(f"| {col} | {eps:g} | " + " | ".join(cells) + " |")
    print()
    print("Exact bias of the boundary-corrected estimator on these data (from the table, no sampling):\n")
    print("| attribute | eps | E[estimate] - mean | max_transform_bias |")
    print("|---|---:|---:|---:|")
    for col, lo, hi in (("age", 17, 90), ("hours-per-week", 1, 99)):
        x = df[col].to_numpy(dtype=float)
        for eps in (0.5, 1.0, 2.0, 5.0):
            m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=True)
            h = m.unbiased_transform(m.grid)
            rows = (x - lo).astype(np.int64)
            expected = float(np.mean((m.transition_matrix @ h)[rows]))
            print(f"| {col} | {eps:g} | {expected - x.mean():+.4f} | {m.max_transform_bias():.3f} |")
    print()


def _selection(df: Any, quick: bool, seed: int) -> None:
    runs = 2 if quick else 5
    grid = (0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0)
    print(f"## Epsilon selection on ADULT (bounded Laplace, {runs} runs per eps)\n")
    for col, lo, hi, target in (("age", 17, 90, 5.0), ("hours-per-week", 1, 99, 5.0)):
        x = df[col].to_numpy(dtype=float)
        c = select_epsilon_numeric(x, lower=lo, upper=hi, target=target, metric="mae", grid=grid, runs=runs,
                                   integer=True, rng=seed)
        print(f"### {col}: smallest eps with mean absolute error <= {target:g} -> {c.selected_epsilon}\n")
        print("```\n" + c.format_table() + "\n```\n")
        c = select_epsilon_numeric(x, lower=lo, upper=hi, target=0.5, metric="mean", grid=grid, runs=runs,
                                   integer=True, rng=seed)
        print(f"### {col}: smallest eps with |mean error| <= 0.5 (boundary-corrected mean) -> {c.selected_epsilon}\n")
        print("```\n" + c.format_table() + "\n```\n")
    # categorical: education, ordered by education-num (ordinal), discretized bounded Laplace vs k-RR
    order = df.groupby("education")["education-num"].first().sort_values().index.tolist()
    edu = df["education"].to_numpy(dtype=object)
    for mech in ("blap", "krr"):
        c = select_epsilon_categorical(edu, categories=order, target=0.5, mechanism=mech, grid=grid, runs=runs,
                                       rng=seed)
        print(f"### education (16 ordered categories), {mech}: smallest eps with misclassification <= 0.5 -> "
              f"{c.selected_epsilon}\n")
        print("```\n" + c.format_table() + "\n```\n")
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("(classifier-based selection skipped: scikit-learn not installed)\n")
        return
    cols = ["age", "education-num", "hours-per-week"]
    X = df[cols].to_numpy(dtype=float)
    y = (df["income"] == ">50K").to_numpy()
    cgrid = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
    for score in ("accuracy", "balanced_accuracy"):
        c = select_epsilon_classifier(X, y, lower=[17, 1, 1], upper=[90, 16, 99], target=0.75 if score == "accuracy"
                                      else 0.9, score=score, grid=cgrid, runs=runs, integer=True,
                                      rng=seed)
        print(f"### income ~ {', '.join(cols)} (logistic regression; eps per record split over 3 columns): "
              f"relative {score} -> {c.selected_epsilon}\n")
        print("```\n" + c.format_table() + "\n```\n")


def _blobs(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.15, 0.85, size=(5, 2))
    return np.clip(centers[rng.integers(0, 5, n)] + rng.normal(0, 0.05, (n, 2)), 0.0, 1.0)


def _diffprivlib_kmeans() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from diffprivlib.models import KMeans
        return KMeans
    except Exception:  # noqa: BLE001 - any import failure (e.g. scikit-learn 1.9) means: no peer
        return None


def _kmeans(datasets: Sequence[tuple[str, np.ndarray]], k: int, runs: int, quick: bool, seed: int) -> None:
    eps_list = KMEANS_EPSILONS
    gammas = (0.5,) if quick else KMEANS_GAMMAS
    peer = _diffprivlib_kmeans()
    for name, X in datasets:
        t0 = time.perf_counter()
        base = min(nicv(X, weighted_kmeans(X, np.ones(len(X)), k, rng=seed + s, n_init=3)[0]) for s in range(3))
        print(f"## DP k-means on {name} (n = {len(X):,}, k = {k}, {runs} seeded runs, box [0, 1]^2)\n")
        print(f"non-private k-means NICV = {base:.6f} (best of 3 seeded Lloyd runs, 3 k-means++ inits each)\n")
        print("| eps | gamma | QuadkDP NICV | UniQuadkDP NICV | RP | leaves (mean) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for eps in eps_list:
            for gamma in gammas:
                res: dict[str, list[float]] = {"quad": [], "uniquad": []}
                leaves = []
                for variant in ("quad", "uniquad"):
                    for r in range(runs):
                        m = QuadTreeKMeans(n_clusters=k, epsilon=eps, bounds=(0.0, 1.0), gamma=gamma,
                                           variant=variant, rng=seed * 100_003 + r).fit(X)
                        assert m.cluster_centers_ is not None and m.leaves_ is not None
                        res[variant].append(nicv(X, m.cluster_centers_))
                        leaves.append(len(m.leaves_))
                q, u = np.array(res["quad"]), np.array(res["uniquad"])
                print(f"| {eps:g} | {gamma:g} | {q.mean():.5f} ± {q.std(ddof=1) / math.sqrt(runs):.5f} | "
                      f"{u.mean():.5f} ± {u.std(ddof=1) / math.sqrt(runs):.5f} | "
                      f"{relative_improvement(q.mean(), u.mean(), base):+.3f} | {np.mean(leaves):.0f} |")
        print()
        if peer is not None:
            print("| eps | diffprivlib KMeans NICV (bounds=([0,0],[1,1])) |")
            print("|---:|---:|")
            for eps in eps_list:
                vals = []
                for r in range(runs):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        pm = peer(n_clusters=k, epsilon=eps, bounds=([0.0, 0.0], [1.0, 1.0]),
                                  random_state=seed * 100_003 + r).fit(X)
                    vals.append(nicv(X, pm.cluster_centers_))
                a = np.array(vals)
                print(f"| {eps:g} | {a.mean():.5f} ± {a.std(ddof=1) / math.sqrt(runs):.5f} |")
            print()
        else:
            print("(diffprivlib not importable: peer column skipped)\n")
        print(f"({name}: {time.perf_counter() - t0:.1f} s)\n")
    # speed requirement: UniQuadkDP on 100,000 2-D points
    X = _blobs(100_000, seed + 1)
    times = []
    for r in range(3):
        t = time.perf_counter()
        QuadTreeKMeans(n_clusters=k, epsilon=1.0, bounds=(0.0, 1.0), variant="uniquad", rng=r).fit(X)
        times.append(time.perf_counter() - t)
    print(f"UniQuadkDP fit on 100,000 2-D points: best {min(times):.3f} s, worst {max(times):.3f} s "
          f"(eps = 1, gamma = 0.5, k = {k})\n")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv or [])
    quick = bool(args.quick)
    runs = args.runs if args.runs is not None else (3 if quick else 30)
    if runs < 2:
        print("--runs must be at least 2 (standard errors)")
        return 2
    t0 = time.perf_counter()
    print(f"# stream-anon bench ldp-numeric{' --quick' if quick else ''} (runs = {runs}, seed = {args.seed})\n")
    df = None
    if {"mean", "select", "kmeans"} - set(args.skip):  # read ADULT first: a bad path is an error at once
        from stream_anon.core.datasets import DatasetError

        try:
            df = _adult(args.adult)
        except DatasetError as e:
            print(f"error: {e}")
            return 2
    if "speed" not in args.skip:
        _speed(quick, args.seed)
    if "exact" not in args.skip:
        _exact(quick)
    if "reachability" not in args.skip:
        _reachability(quick, args.seed)
    if "mean" not in args.skip:
        _mean_estimators(df, quick, args.seed)
    if "select" not in args.skip:
        _selection(df, quick, args.seed)
    if "kmeans" not in args.skip:
        assert df is not None
        age = (df["age"].to_numpy(dtype=float) - 17.0) / (90.0 - 17.0)  # schema domains [17, 90], [1, 99]
        hours = (df["hours-per-week"].to_numpy(dtype=float) - 1.0) / (99.0 - 1.0)
        adult_xy = np.column_stack([age, hours])
        blobs = _blobs(20_000 if not quick else 5_000, args.seed)
        _kmeans([("ADULT age x hours-per-week", adult_xy), ("synthetic blobs (5 Gaussians, sd 0.05)", blobs)],
                args.clusters, runs, quick, args.seed)
    print(f"total time: {time.perf_counter() - t0:.1f} s")
    return 0
