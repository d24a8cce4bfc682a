"""Issue 20, item 2: one set of defaults for the service, the offline tools, the benchmarks and the report, shown
in every ``--help``; ``report --compute-extras`` recomputes with the run's own settings (its point in the grid is
the run's own figure); every section of a report is filled or not shown; LM from its own values; integers as
integers."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from ops_support import QUIET_PORTS, run_cli

from stream_anon.config.settings import AnonymizationSettings
from stream_anon.core.datasets import read_adult
from stream_anon.core.defaults import DEFAULTS
from stream_anon.core.schema import adult_schema

N = 2000


def test_the_service_takes_the_one_set_of_defaults() -> None:
    service = AnonymizationSettings()
    for f in dataclasses.fields(DEFAULTS):
        assert getattr(service, f.name) == getattr(DEFAULTS, f.name), f.name
    assert (DEFAULTS.k, DEFAULTS.delta, DEFAULTS.beta, DEFAULTS.mu, DEFAULTS.l, DEFAULTS.zeta) == (10, 1000, 50, 100,
                                                                                                   2, 0)


@pytest.mark.parametrize("command", [["run"], ["demo"], ["anonymize"], ["bench", "engine"], ["bench", "service"],
                                     ["bench", "release-path"]])
@pytest.mark.integration  # starts the CLI as a process
def test_every_help_shows_the_defaults(command: list[str]) -> None:
    out = run_cli(*command, "--help")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stderr
    assert re.search(r"default 10\b", text) or command == ["bench", "release-path"], text
    if command[0] in ("run", "demo", "anonymize"):
        assert "default 1000" in text and "default 50" in text and "default 100" in text
        assert re.search(r"default 2\b", text), text  # l
        assert re.search(r"zeta \(?0|default 0: no reuse", text), text  # no cluster reuse
    if command == ["bench", "engine"]:
        assert DEFAULTS.describe() in text and "default 0 (no cluster reuse)" in text
    if command == ["bench", "release-path"]:
        assert "default 2, the service's" in text


@pytest.fixture(scope="module")
def adult_head(adult_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first N ADULT records as a CSV with ADULT's columns (what `anonymize` and the report's extras read)."""
    path = tmp_path_factory.mktemp("adult-head") / "adult_head.csv"
    read_adult(adult_path).head(N).to_csv(path, index=False)
    return path


@pytest.mark.integration  # starts the CLI as a process
def test_anonymize_uses_the_shared_defaults(adult_head: Path, tmp_path: Path) -> None:
    out = run_cli("anonymize", "--input", str(adult_head), "--summary", str(tmp_path / "s.json"))
    assert out.returncode == 0, out.stderr
    params = json.loads((tmp_path / "s.json").read_text())["parameters"]
    assert {k: params[k] for k in DEFAULTS.as_dict()} == DEFAULTS.as_dict()
    assert json.loads((tmp_path / "s.json").read_text())["records_reused"] == 0
    # a schema without a sensitive attribute: one line saying how to go without l-diversity
    schema = tmp_path / "nosens.yaml"
    schema.write_text("name: nosens\nrecord_id: id\nattributes:\n  - {name: age, role: quasi_identifier, type: numeric, "
                      "domain: [17, 90], integer: true}\n")
    (tmp_path / "ages.csv").write_text("id,age\n" + "".join(f"r{i},{20 + i % 50}\n" for i in range(200)))
    bad = run_cli("anonymize", "--input", str(tmp_path / "ages.csv"), "--schema", str(schema))
    assert bad.returncode == 2 and "pass --l none --t-closeness none" in bad.stderr, bad.stderr
    ok = run_cli("anonymize", "--input", str(tmp_path / "ages.csv"), "--schema", str(schema), "--l", "none",
                 "--t-closeness", "none", "--k", "5", "--delta", "50")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.integration  # starts the CLI as a process
@pytest.mark.timeout(600)
def test_compute_extras_uses_the_runs_own_settings_and_shows_its_figure(adult_head: Path, adult_path: Path,
                                                                        tmp_path: Path) -> None:
    """A run of non-default settings (k=5, delta=300, beta=20, l off, seed 3): the grid is computed with the
    run's beta, mu, l, zeta and seed on the run's records, holds the run's (k, delta), and there its GT is the
    run's own."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = run_cli("anonymize", "--input", str(adult_head), "--k", "5", "--delta", "300", "--beta", "20", "--l", "none",
                  "--seed", "3", "--output", str(run_dir / "released.csv"), "--summary", str(run_dir / "summary.json"))
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    rep = run_cli("report", str(run_dir), "--compute-extras", "--adult", str(adult_path), "--grid-k", "3,10",
                  "--grid-delta", "100", "--epsilons", "1,4", "--repetitions", "2", timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "k=5 delta=300 beta=20 mu=100 castle/gt leftover=suppress l=None zeta=0 (from summary.json)" in rep.stderr
    grid = json.loads((run_dir / "grid.json").read_text())
    assert sorted({(g["k"], g["delta"]) for g in grid}) == [(3, 100), (3, 300), (5, 100), (5, 300), (10, 100),
                                                           (10, 300)]
    assert {(g["beta"], g["mu"], g["l"], g["zeta"], g["records"]) for g in grid} == {(20, 100, None, 0, N)}
    own = next(g for g in grid if (g["k"], g["delta"]) == (5, 300))
    assert own["gt_loss"] == pytest.approx(summary["gt_loss"], abs=1e-12)  # the run's own figure, at its point
    for g in grid:  # LM from its own value: the sum over the 14 QIs
        assert g["lm_loss"] == pytest.approx(14 * g["gt_loss"])
    html = (run_dir / "report.html").read_text()
    assert "k in [3, 5, 10], delta in [100, 300]" in html and "[5.0" not in html  # integers as integers
    assert "The run&#x27;s own point (k=5, delta=300) is circled" in html or "own point (k=5, delta=300)" in html
    assert 'class="missing"' not in html  # every section shown is filled; anonymize's release has no delays:
    assert '<h2 id="delay">' not in html and "Release delay against the bound: there are no per-record delays" in html
    assert all(f'<h2 id="{a}">' in html for a in ("loss", "classes", "generalization", "ldp", "side"))
    side = json.loads((run_dir / "side_estimates.json").read_text())
    assert {e["attribute"] for e in side} == set(adult_schema().side_path_attributes("krr")) | set(
        adult_schema().side_path_attributes("rs")) | set(adult_schema().side_path_attributes("blap"))


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_demo_report_shows_no_empty_section_and_its_extras_hold_the_demos_figure(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    demo = run_cli("demo", "--synthetic", "--records", str(N), "--seed", "5", "--run-dir", str(run_dir), *QUIET_PORTS,
                   timeout=600)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "eps spent" not in demo.stdout and "one record over all side outputs: eps 3.9" in demo.stdout  # the default per-record total
    html = (run_dir / "report.html").read_text()
    assert 'class="missing"' not in html
    assert '<h2 id="loss">' not in html and '<h2 id="ldp">' not in html  # not shown: their inputs are not there
    assert "Not shown, for want of their input" in html and "--compute-extras</code> runs the engine grid" in html
    assert '<h2 id="side">' in html  # the service's own estimates (side_estimates.json of the demo)
    summary = json.loads((run_dir / "summary.json").read_text())
    rep = run_cli("report", str(run_dir), "--compute-extras", "--grid-k", "5", "--grid-delta", "500", "--epsilons",
                  "1,4", "--repetitions", "2", timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    grid = pd.DataFrame(json.loads((run_dir / "grid.json").read_text()))
    own = grid[(grid.k == 10) & (grid.delta == 1000)].iloc[0]
    # the demo's synthetic records again (its seed and count), the engine with its settings and seed: its figure
    assert (own.l, own.zeta, own.records) == (2, 0, N)
    assert own.gt_loss == pytest.approx(summary["gt_loss"], abs=1e-9)
    html = (run_dir / "report.html").read_text()
    assert '<h2 id="loss">' in html and '<h2 id="ldp">' in html and "Not shown" not in html
