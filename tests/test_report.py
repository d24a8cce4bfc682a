"""`stream-anon report`: a run directory from the real engine on an ADULT slice -> HTML with PNG plots.

The images are decoded (Pillow, matplotlib's own dependency) and checked for size and content; missing
optional inputs produce a note in their section instead of a failure; malformed inputs name the file and field.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from stream_anon.cli import main as cli_main
from stream_anon.core.engine import Engine, EngineConfig
from stream_anon.core.schema import adult_schema
from stream_anon.privacy import KRandomizedResponse
from stream_anon.replay.synthetic import SyntheticGenerator
from stream_anon.report import plots
from stream_anon.report.analysis import (
    class_sizes,
    generalization_levels,
    project_onto_simplex,
    quantiles,
    total_variation,
)
from stream_anon.report.extras import compute_ldp_curves
from stream_anon.report.html import write_report
from stream_anon.report.rundir import (
    LDP_CURVES_FILE,
    RunDirError,
    load_run_dir,
    released_frame,
    write_run_dir,
)

K, DELTA, N_RECORDS = 5, 300, 3000
IMG = re.compile(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')
ALL_PLOTS = {"information loss vs k and delta", "release delay distribution", "class size histogram",
             "generalization per attribute", "epsilon vs error", "estimated vs true distributions"}


def _engine_run(adult_path: Path, run_dir: Path) -> tuple[list[Any], dict[str, Any]]:
    from stream_anon.core.datasets import iter_adult_records
    from stream_anon.core.engine import Engine, EngineConfig
    from stream_anon.core.loss import summarize_releases

    schema = adult_schema()
    engine = Engine(schema, EngineConfig(k=K, delta=DELTA, beta=50, mu=100, seed=0))
    releases = []
    for _, rec in zip(range(N_RECORDS), iter_adult_records(adult_path), strict=False):
        releases.extend(engine.push(schema.validate(rec)))
    releases.extend(engine.flush())
    summary = summarize_releases(releases, schema, K).as_dict()
    summary.update({"k": K, "delta": DELTA, "records_in": N_RECORDS, "dataset": "ADULT (first 3000 records)"})
    write_run_dir(run_dir, summary=summary, releases=releases, schema=schema, delay_bound=DELTA)
    return releases, summary


def _images(html: str) -> dict[str, Image.Image]:
    out: dict[str, Image.Image] = {}
    for alt, data in IMG.findall(html):
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        img.load()
        assert img.format == "PNG"
        out[alt] = img
    return out


def _assert_not_blank(name: str, img: Image.Image) -> None:
    w, h = img.size
    assert w >= 300 and h >= 200, (name, img.size)
    arr = np.asarray(img.convert("RGB")).astype(int)
    non_white = (arr.min(axis=2) < 240).mean()
    assert non_white > 0.02, f"{name}: {non_white:.3%} non-white pixels: blank plot"
    packed = (arr[..., 0] << 16) | (arr[..., 1] << 8) | arr[..., 2]
    assert np.unique(packed).size > 20, f"{name}: too few colours for a plot"


@pytest.fixture(scope="module")
def full_run(adult_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("report-run")
    releases, summary = _engine_run(adult_path, run_dir)
    out = run_dir / "page.html"
    rc = cli_main(["report", str(run_dir), "--output", str(out), "--compute-extras", "--adult", str(adult_path),
                   "--grid-records", "600", "--grid-k", "3,5,10", "--grid-delta", "100,200", "--epsilons", "1,4",
                   "--repetitions", "2", "--png-dir", str(run_dir / "png")])
    assert rc == 0
    return {"dir": run_dir, "html": out.read_text(encoding="utf-8"), "releases": releases, "summary": summary}


@pytest.mark.slow
def test_report_embeds_every_plot_as_a_nonblank_png(full_run: dict[str, Any]) -> None:
    imgs = _images(full_run["html"])
    assert set(imgs) == ALL_PLOTS
    for name, img in imgs.items():
        _assert_not_blank(name, img)
    assert 'class="missing"' not in full_run["html"]
    # --png-dir wrote the same plots as files
    files = sorted(p.name for p in (full_run["dir"] / "png").glob("*.png"))
    assert files == sorted(["loss.png", "delay.png", "classes.png", "generalization.png", "ldp.png", "side.png"])


@pytest.mark.slow
def test_compute_extras_wrote_the_requested_grid_and_curves(full_run: dict[str, Any]) -> None:
    grid = json.loads((full_run["dir"] / "grid.json").read_text())
    # the requested grid, plus the run's own (k, delta) = (5, 300) (issue 20: the plot shows the run's point)
    assert sorted((g["k"], g["delta"]) for g in grid) == [(k, d) for k in (3, 5, 10) for d in (100, 200, 300)]
    for g in grid:
        # LM from its own value: the sum over the QIs (= J x GT with these hierarchies), not GT again
        assert 0 < g["gt_loss"] < 1 and g["records"] == 600 and g["qis"] == 14
        assert g["lm_loss"] == pytest.approx(g["qis"] * g["gt_loss"]) and g["lm_loss"] > 1
    # loss grows with k at fixed delta (more records per class need wider generalization)
    by = {(g["k"], g["delta"]): g["gt_loss"] for g in grid}
    assert by[(3, 200)] < by[(10, 200)] and by[(3, 100)] < by[(10, 100)]
    curves = json.loads((full_run["dir"] / "ldp_curves.json").read_text())
    assert {c["mechanism"] for c in curves} >= {"k-RR", "random substitution", "bounded Laplace (mean)"}
    for c in curves:
        assert [p["epsilon"] for p in c["points"]] == [1.0, 4.0]
    krr = next(c for c in curves if c["mechanism"] == "k-RR")
    assert krr["points"][1]["error"] < krr["points"][0]["error"]  # more epsilon, less error


@pytest.mark.slow
def test_report_numbers_match_the_run(full_run: dict[str, Any]) -> None:
    run = load_run_dir(full_run["dir"])
    released = run.released
    n_class = sum(len(r.record_ids) for r in full_run["releases"] if r.kind == "class")
    assert len(released) == n_class == full_run["summary"]["records_released"]
    sizes = class_sizes(released)
    assert sizes.min() >= K  # the engine's output is k-anonymous; the report shows "classes smaller than k: 0"
    assert re.search(r"<th>classes smaller than k</th><td class=\"num\">0</td>", full_run["html"])
    assert run.delays_arrivals is not None and run.delta == DELTA
    assert np.nanmax(run.delays_arrivals) <= DELTA
    p50 = float(np.quantile(run.delays_arrivals, 0.5))
    n = len(run.delays_arrivals)
    assert (f'<th>arrivals</th><td>released records</td><td class="num">{n:,}</td><td class="num">{p50:,.4g}</td>'
            in full_run["html"])
    assert "SYNTHETIC" not in full_run["html"]  # real data: no banner


def test_generalization_levels_follow_the_loss_formulas() -> None:
    schema = adult_schema()
    df = pd.DataFrame({"record_id": ["a", "b", "c", "d"], "class_id": ["1", "1", "2", "2"],
                       "age": ["[30-39]", "[17-90]", "45", "*"],
                       "education": ["Bachelors", "*", "Higher-education", "no-such-node"]})
    by = {a.name: a for a in generalization_levels(df, schema)}
    assert set(by) == {"age", "education"}
    np.testing.assert_allclose(by["age"].relative, [9 / 73, 1.0, 0.0, 1.0])
    edu = schema["education"].hierarchy
    assert edu is not None
    node = edu.node("Higher-education")
    expected = [0.0, 1.0, (edu.leaf_count(node) - 1) / (edu.n_leaves - 1), np.nan]
    np.testing.assert_allclose(by["education"].relative, expected)
    assert by["education"].levels is not None
    assert by["education"].levels.tolist() == [0, edu.height, edu.height - int(edu.node_depth[node]), -1]
    assert by["education"].unparsed == 1 and by["age"].unparsed == 0


@pytest.mark.slow  # (an engine run on all of ADULT, then the report: CI's full suite; the sections' units stay fast)
def test_missing_optional_inputs_are_not_shown_and_named_in_the_summary(adult_path: Path, tmp_path: Path) -> None:
    """Issue 20: every section shown is filled; a section without its input is left out, and the summary says
    which and how to produce it."""
    _engine_run(adult_path, tmp_path)
    (tmp_path / "delays.json").unlink()
    out = write_report(tmp_path)
    html = out.read_text(encoding="utf-8")
    assert out == tmp_path / "report.html"
    imgs = _images(html)
    assert set(imgs) == {"release delay distribution", "class size histogram", "generalization per attribute"}
    for name, img in imgs.items():
        _assert_not_blank(name, img)
    assert 'class="missing"' not in html
    for anchor in ("loss", "ldp", "side"):
        assert f'<h2 id="{anchor}">' not in html
    summary = html[:html.index('<h2 id="delay">')]
    assert "Not shown, for want of their input" in summary
    for f in ("grid.json", "ldp_curves.json", "side_estimates.json"):
        assert f"<code>{f}</code> is missing" in summary


def test_malformed_inputs_name_the_file_and_field(adult_path: Path, tmp_path: Path, capsys: Any) -> None:
    _engine_run(adult_path, tmp_path)
    (tmp_path / "grid.json").write_text(json.dumps([{"delta": 100, "gt_loss": 0.2}]))
    with pytest.raises(RunDirError, match=r"grid\.json\[0\]: field 'k' missing"):
        load_run_dir(tmp_path)
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "grid.json[0]: field 'k' missing" in capsys.readouterr().err
    (tmp_path / "grid.json").unlink()
    (tmp_path / "side_estimates.json").write_text(json.dumps([{"topic": "t", "attribute": "sex", "kind": "frequency",
                                                               "categories": ["a", "b"], "estimated": [0.5]}]))
    with pytest.raises(RunDirError, match=r"side_estimates\.json\[0\]\.estimated: expected 2 values"):
        load_run_dir(tmp_path)
    (tmp_path / "released.csv").unlink()
    with pytest.raises(RunDirError, match="required file released.csv is missing"):
        load_run_dir(tmp_path)


def test_released_frame_has_the_documented_columns(adult_path: Path, tmp_path: Path) -> None:
    releases, _ = _engine_run(adult_path, tmp_path)
    schema = adult_schema()
    df = released_frame(releases, schema)
    assert list(df.columns) == ["record_id", "class_id", *[a.name for a in schema.qis], "income", "delay",
                                "delay_seconds"]
    on_disk = pd.read_csv(tmp_path / "released.csv", dtype=str, keep_default_na=False)
    assert list(on_disk.columns) == list(df.columns) and len(on_disk) == len(df)
    assert on_disk["record_id"].is_unique


@pytest.mark.slow  # (CI's full suite; not in the fast tier, for its time budget)
def test_scaleout_partitioner_and_loss_per_partition(adult_path: Path) -> None:
    from kafka.partitioner.default import DefaultPartitioner

    from stream_anon.core.datasets import iter_adult_records
    from stream_anon.report.scaleout import kafka_partition, run_partitioned

    class Cluster:  # the metadata kafka-python's producer hands its partitioner
        def __init__(self, n: int) -> None:
            self.n = n

        def topics(self) -> set[str]:
            return {"t"}

        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(self.n))

        available_partitions_for_topic = partitions_for_topic

    ids = [f"adult-{i:05d}" for i in range(200)]
    for p in (2, 4):
        producer_choice = [DefaultPartitioner().partition("t", i, i.encode(), None, None, Cluster(p)) for i in ids]
        assert [kafka_partition(i, p) for i in ids] == producer_choice
        assert len(set(producer_choice)) == p
    schema = adult_schema()
    records = [schema.validate(r) for _, r in zip(range(4000), iter_adult_records(adult_path), strict=False)]
    one = run_partitioned(records, schema, partitions=1, k=10, delta=200)
    same = run_partitioned(records, schema, partitions=2, k=10, delta=200)
    half = run_partitioned(records, schema, partitions=2, k=10, delta=100)
    assert one["classes"] > 0 and same["classes"] > 0
    # the same delta per partition keeps the loss (each engine still chooses among delta buffered records);
    # splitting one delta between partitions shrinks every buffer and raises it: by more than partitioning
    # alone moves it (full ADULT, k=10: 0.291 / 0.288 / 0.328 for P=1 / P=2 same delta / P=2 half; docs/deploy.md)
    assert half["gt_loss"] - same["gt_loss"] > abs(same["gt_loss"] - one["gt_loss"])


# ----------------------------------------------------------------------------- a small synthetic run directory
SYN_N, SYN_K, SYN_DELTA = 1500, 5, 200


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run directory built here from synthetic records: the engine's releases, a demo-like summary.json with
    ``"synthetic": true`` and a ``delay_arrivals`` over released + suppressed records (the demo's population),
    and ldp_curves.json computed on the synthetic columns plus one curve in the old unprojected form."""
    run_dir = tmp_path_factory.mktemp("synthetic-run")
    schema = adult_schema()
    gen = SyntheticGenerator(schema=schema, rng=5)
    engine = Engine(schema, EngineConfig(k=SYN_K, delta=SYN_DELTA, beta=50, mu=100, seed=0))
    releases = []
    for rec in gen.records(SYN_N):
        releases.extend(engine.push(rec))
    releases.extend(engine.flush())
    released = [d for r in releases if r.kind == "class" for d in r.delays]
    suppressed = [d for r in releases if r.kind == "suppressed" for d in r.delays]
    assert suppressed, "the fixture needs suppressed records to tell the two delay populations apart"
    both = np.asarray(released + suppressed, dtype=float)
    summary = {"data_source": "SYNTHETIC ADULT-shaped records (1,500)", "synthetic": True, "records_in": SYN_N,
               "records_released": len(released), "records_suppressed": len(suppressed),
               "parameters": {"k": SYN_K, "delta": SYN_DELTA},
               "delay_arrivals": {"p50": float(np.percentile(both, 50)), "p99": float(np.percentile(both, 99)),
                                  "max": float(both.max()), "mean": float(both.mean())},
               "k_anonymity": {"verified": True, "violations": [], "classes": 0},
               "side_paths": {f"setting_{i}": i for i in range(150)}}  # many raw entries, as a demo's summary has
    write_run_dir(run_dir, summary=summary, releases=releases, schema=schema, delay_bound=SYN_DELTA)
    columns = pd.DataFrame(SyntheticGenerator(schema=schema, rng=6).columns(3000))
    curves = compute_ldp_curves(columns, schema, epsilons=(0.1, 0.5, 2.0), repetitions=3, seed=1)
    old = dict(curves[0], mechanism="old unprojected k-RR", projection=None,
               points=[{"epsilon": 0.1, "error": 13.1, "error_std": 2.0}, {"epsilon": 2.0, "error": 0.2}])
    (run_dir / LDP_CURVES_FILE).write_text(json.dumps([*curves, old]))
    out = write_report(run_dir)
    return {"dir": run_dir, "html": out.read_text(encoding="utf-8"), "released_delays": released,
            "summary": summary, "columns": columns}


@pytest.mark.slow
def test_every_plotted_total_variation_is_in_0_1(synthetic_run: dict[str, Any]) -> None:
    run = load_run_dir(synthetic_run["dir"])
    assert run.ldp_curves is not None
    series = plots.ldp_series(run.ldp_curves)
    tv = [s for s in series if s.metric == "total variation distance"]
    assert len(tv) >= 3  # k-RR, the substitutions (and the discretized bounded Laplace when built)
    for s in tv:
        for arr in (s.error, s.lower, s.upper):
            assert arr is not None and np.all((arr >= 0) & (arr <= 1)), (s.label, arr)
    assert "old unprojected k-RR" not in {s.label.split(" (")[0] for s in series}  # TV 13.1: left out, and said so
    html = synthetic_run["html"]
    assert "Not plotted: old unprojected k-RR" in html and "projected onto the probability simplex" in html
    assert 'alt="epsilon vs error"' in html


@pytest.mark.slow
def test_the_projection_is_what_bounds_tv(synthetic_run: dict[str, Any]) -> None:
    """Power: at eps = 0.1 on 3,000 records the raw unbiased estimate is far from a distribution (TV > 1);
    its projection is a distribution and its TV is <= 1."""
    schema = adult_schema()
    cats = list(schema["education"].domain_values)
    values = synthetic_run["columns"]["education"].to_numpy()
    true = np.array([np.sum(values == c) for c in cats], dtype=float) / len(values)
    mech = KRandomizedResponse(epsilon=0.1, categories=cats, rng=np.random.default_rng(3))
    est = mech.estimate_counts(mech.randomise_many(values)).frequencies
    assert est.min() < 0 and total_variation(est, true) > 1  # what the old report plotted
    p = project_onto_simplex(est)
    assert p.min() >= 0 and p.sum() == pytest.approx(1.0) and 0 <= total_variation(p, true) <= 1


def test_project_onto_simplex_is_the_euclidean_projection() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = rng.normal(0.1, 1.0, size=int(rng.integers(1, 30)))
        p = project_onto_simplex(v)
        assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)
        # KKT conditions of min ||p - v||^2 s.t. p >= 0, sum p = 1: v - p equals one theta on the support,
        # and v <= theta off it
        theta = (v - p)[p > 0]
        assert np.ptp(theta) < 1e-9
        assert np.all(v[p == 0] <= theta[0] + 1e-9)
    dist = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_onto_simplex(dist), dist)  # a distribution is its own projection
    np.testing.assert_allclose(project_onto_simplex(np.array([2.0, 0.0])), [1.0, 0.0])
    np.testing.assert_allclose(project_onto_simplex(np.array([0.5, 0.5, -3.0])), [0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match="finite"):
        project_onto_simplex(np.array([np.nan, 1.0]))


@pytest.mark.slow
def test_summary_and_plots_come_first_raw_tables_last_and_collapsed(synthetic_run: dict[str, Any]) -> None:
    html = synthetic_run["html"]
    first_img = html.index("<img ")
    before = html[:first_img]
    assert before.count("<tr>") <= 25  # a short summary, not ~200 rows of flattened JSON
    assert "summary.json</code>, flattened" in html and "side_paths.setting_149" in html
    details = html.index("<details>")
    assert details > html.rindex("<img ")  # the raw table comes after every plot
    assert html.index("side_paths.setting_0") > details and html.index("</details>") > html.index("setting_149")
    assert html.index('<h2 id="raw">') > html.rindex("<h2 id=") - 1  # the last section


@pytest.mark.slow
def test_synthetic_banner_is_the_first_thing_on_the_page(synthetic_run: dict[str, Any]) -> None:
    html = synthetic_run["html"]
    assert "<title>[SYNTHETIC] stream-anon report" in html
    banner = html.index('<div class="banner" id="synthetic">SYNTHETIC DATA (SYNTHETIC ADULT-shaped records (1,500))')
    assert banner < html.index("<h2") and banner < html.index("<img ")
    assert banner - html.index("<h1>") < 200  # right under the title


@pytest.mark.slow
def test_delay_p50_is_labelled_with_its_population(synthetic_run: dict[str, Any]) -> None:
    """The report's delay rows are over the released records; the run's summary.json figure (the demo: released
    + suppressed) is shown beside it with its population, so two different p50 are never unlabelled."""
    html = synthetic_run["html"]
    released = np.asarray(synthetic_run["released_delays"], dtype=float)
    p50 = quantiles(released)["p50"]
    assert (f'<th>arrivals</th><td>released records</td><td class="num">{released.size:,}</td>'
            f'<td class="num">{p50:,.4g}</td>') in html
    theirs = synthetic_run["summary"]["delay_arrivals"]["p50"]
    assert theirs != p50  # the suppressed records move the median: the populations matter
    assert ("<th>arrivals (summary.json delay_arrivals)</th><td>released + suppressed records (the demo&#x27;s "
            f'summary)</td><td class="num">-</td><td class="num">{theirs:,.4g}</td>') in html
    assert "release delay p50 / p99 (arrivals, released records)" in html  # the key figure at the top, labelled


@pytest.mark.slow  # (an engine run and a whole report, 3 s: CI's full suite)
def test_a_run_directory_in_the_public_layout_is_read(adult_path: Path, tmp_path: Path) -> None:
    """The demo writes released.csv without record ids (class_id, QIs, sensitive: what the anon topic holds)."""
    _engine_run(adult_path, tmp_path)
    df = pd.read_csv(tmp_path / "released.csv", dtype=str)
    df.drop(columns=["record_id", "delay", "delay_seconds"]).to_csv(tmp_path / "released.csv", index=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    summary["delay_arrivals"] = {"p50": 12.0, "p99": 250.0, "max": 290.0, "mean": 40.0, "n": len(df),
                                 "population": "released records"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "delays.json").write_text(json.dumps({"arrivals": sorted(range(len(df))), "bound": DELTA}))
    run = load_run_dir(tmp_path)
    assert "record_id" not in run.released.columns and len(run.released) == len(df)
    assert class_sizes(run.released).min() >= K
    html = write_report(tmp_path).read_text(encoding="utf-8")
    assert "class size histogram" in _images(html)
    assert f"<td>released records</td><td class=\"num\">{len(df):,}</td>" in html
