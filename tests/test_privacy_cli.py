"""``stream-anon perturb`` / ``stream-anon estimate`` on the real ADULT file and on any CSV with a schema."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from stream_anon.cli import main
from stream_anon.core.datasets import read_adult


def _run(*argv: str) -> int:
    return main(list(argv))


@pytest.fixture(scope="module")
def adult(adult_path: Path) -> pd.DataFrame:
    return read_adult(adult_path)


def _check_within_se(est: dict, column: str, adult: pd.DataFrame, z: float = 4.0) -> None:
    entry = est["columns"][column]
    truth = adult[column].astype(str).value_counts()
    for cat, count, se in zip(entry["categories"], entry["counts"], entry["std_errors"], strict=True):
        t = float(truth.get(cat, 0))
        assert abs(count - t) <= z * se + 1e-9, (column, cat, count, t, se)
    assert entry["truth"]["counts"] == [float(truth.get(c, 0)) for c in entry["categories"]]


@pytest.mark.slow  # (all of ADULT through the command: CI's full suite; not in the fast tier, for its time budget)
def test_krr_perturb_and_estimate(adult_path: Path, adult: pd.DataFrame, tmp_path: Path) -> None:
    out, summary, est = tmp_path / "krr.csv", tmp_path / "krr.json", tmp_path / "est.json"
    cols = "sex,race,workclass,education"
    assert _run("perturb", "--mechanism", "krr", "--epsilon", "2", "--input", str(adult_path), "--columns", cols,
                "--output", str(out), "--summary", str(summary), "--seed", "7", "--keep-ids") == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert len(df) == len(adult) == 32_561
    assert list(df["id"][:2]) == ["adult-00000", "adult-00001"]
    for c in cols.split(","):
        assert set(df[c]) <= set(adult[c].unique()) | {"?"}
        assert (df[f"epsilon.{c}"].astype(float) == 2.0).all()
        assert (df[f"mechanism.{c}"] == "krr").all()
    assert (df["epsilon.record"].astype(float) == 8.0).all()
    # k-RR actually changed values: share kept ~ p for sex (k=2): e^2/(e^2+1)
    p_sex = math.exp(2) / (math.exp(2) + 1)
    kept = float((df["sex"].to_numpy() == adult["sex"].to_numpy()).mean())
    assert abs(kept - p_sex) <= 4 * math.sqrt(p_sex * (1 - p_sex) / len(df))
    s = json.loads(summary.read_text())
    assert s["epsilon_per_record"] == pytest.approx(8.0) and s["columns"]["race"]["epsilon"] == 2.0
    assert s["values_per_s"] > 0 and s["n_records"] == 32_561
    assert _run("estimate", "--mechanism", "krr", "--input", str(out), "--truth", str(adult_path),
                "--output", str(est)) == 0
    e = json.loads(est.read_text())
    assert set(e["columns"]) == set(cols.split(",")) and e["epsilon_per_record"] == pytest.approx(8.0)
    for c in cols.split(","):
        _check_within_se(e, c, adult)
        t = e["columns"][c]["truth"]
        assert 0 <= t["total_variation"] < 0.1 and t["max_abs_frequency_error"] < 0.05


def test_perturb_writes_the_public_layout_by_default(adult_path: Path, adult: pd.DataFrame, tmp_path: Path) -> None:
    """No record id column and the rows shuffled: the output joins nothing by id or position; the estimates are
    the same (they depend only on the multiset of reports)."""
    out, est = tmp_path / "krr.csv", tmp_path / "est.json"
    assert _run("perturb", "--mechanism", "krr", "--epsilon", "2", "--input", str(adult_path), "--columns", "sex",
                "--output", str(out), "--seed", "7") == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(df.columns) == ["sex", "mechanism.sex", "epsilon.sex", "epsilon.record"]
    assert not df.isin(set(adult["id"])).any().any()
    # shuffled: agreement with the input row by row is that of independent rows (~ P(same sex)), far below
    # k-RR's keep probability e^2/(e^2+1) = 0.881
    kept = float((df["sex"].to_numpy() == adult["sex"].to_numpy()).mean())
    assert kept < 0.7, kept
    assert _run("estimate", "--mechanism", "krr", "--input", str(out), "--truth", str(adult_path),
                "--output", str(est)) == 0
    _check_within_se(json.loads(est.read_text()), "sex", adult)


@pytest.mark.slow  # (all of ADULT through the command: CI's full suite; the fast tier has its units)
def test_rs_l_no_repeat_perturb_and_estimate(adult_path: Path, adult: pd.DataFrame, tmp_path: Path) -> None:
    out, summary, est = tmp_path / "rsl.csv", tmp_path / "rsl.json", tmp_path / "est.json"
    assert _run("perturb", "--mechanism", "rs-l", "--epsilon", "1.5", "--l", "3", "--variant", "no-repeat",
                "--input", str(adult_path), "--columns", "workclass,race", "--output", str(out),
                "--summary", str(summary), "--seed", "8") == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    reports = df[["race#1", "race#2", "race#3"]].to_numpy()
    assert (reports[:, 0] != reports[:, 1]).all() and (reports[:, 1] != reports[:, 2]).all()
    s = json.loads(summary.read_text())
    race = s["columns"]["race"]
    assert race["epsilon"] == pytest.approx(1.5) and race["variant"] == "no-repeat" and race["l"] == 3
    assert race["epsilon_if_draw_order"] > race["epsilon"]
    assert race["draws_used"] >= 3 * len(df)
    assert _run("estimate", "--mechanism", "rs-l", "--input", str(out), "--truth", str(adult_path),
                "--output", str(est)) == 0
    e = json.loads(est.read_text())
    for c in ("workclass", "race"):
        _check_within_se(e, c, adult)
    # the reports say how they were made: estimating them as another variant is refused
    assert _run("estimate", "--mechanism", "rs-l", "--variant", "independent", "--input", str(out),
                "--output", str(tmp_path / "x.json")) == 2


def test_per_record_budget_split_and_refusal(adult_path: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out, summary = tmp_path / "pr.csv", tmp_path / "pr.json"
    assert _run("perturb", "--mechanism", "rs", "--epsilon", "3", "--budget", "per-record", "--input", str(adult_path),
                "--columns", "sex,race,age", "--output", str(out), "--summary", str(summary), "--seed", "1") == 0
    s = json.loads(summary.read_text())
    assert [s["columns"][c]["epsilon"] for c in ("sex", "race", "age")] == pytest.approx([1.0, 1.0, 1.0])
    assert s["epsilon_per_record"] == pytest.approx(3.0)
    assert _run("estimate", "--mechanism", "rs", "--input", str(out), "--output", str(tmp_path / "e.json")) == 0
    e = json.loads((tmp_path / "e.json").read_text())
    assert len(e["columns"]["age"]["categories"]) == 90 - 17 + 1  # integer domain of the schema
    refused = tmp_path / "refused.csv"
    capsys.readouterr()
    assert _run("perturb", "--mechanism", "krr", "--epsilon", "1", "--record-budget", "1.5", "--input",
                str(adult_path), "--columns", "sex,race", "--output", str(refused)) == 3
    err = capsys.readouterr().err
    assert "privacy budget exhausted" in err and "race" in err
    assert not refused.exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--mechanism", "krr", "--epsilon", "1", "--columns", "nope"], "unknown column 'nope'"),
    (["--mechanism", "krr", "--columns", "sex"], "--epsilon is required"),
    (["--mechanism", "krr", "--gamma", "2", "--columns", "sex"], "--gamma: only for"),
    (["--mechanism", "rs-l", "--epsilon", "1", "--l", "3", "--variant", "no-repeat", "--columns", "sex"],
     "column 'sex' (2 categories)"),
    (["--mechanism", "krr", "--epsilon", "1", "--columns", "fnlwgt"], "use --mechanism blap"),
])
def test_bad_arguments_exit_2_with_message(argv: list[str], fragment: str, adult_path: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert _run("perturb", *argv, "--input", str(adult_path), "--output", str(tmp_path / "o.csv")) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.slow  # (all of ADULT through the command: CI's full suite; the fast tier has its units)
def test_blap_numeric_and_categorical(adult_path: Path, adult: pd.DataFrame, tmp_path: Path) -> None:
    out, est = tmp_path / "blap.csv", tmp_path / "est.json"
    assert _run("perturb", "--mechanism", "blap", "--epsilon", "1", "--input", str(adult_path),
                "--columns", "age,hours-per-week,sex", "--output", str(out), "--seed", "5") == 0
    df = pd.read_csv(out, keep_default_na=False)
    age = df["age"].to_numpy(dtype=float)
    assert age.min() >= 17 and age.max() <= 90 and not np.all(age == np.round(age))
    assert _run("estimate", "--mechanism", "blap", "--input", str(out), "--truth", str(adult_path),
                "--output", str(est)) == 0
    e = json.loads(est.read_text())
    for c in ("age", "hours-per-week"):
        entry = e["columns"][c]
        assert entry["kind"] == "numeric"
        assert abs(entry["estimated_mean"] - adult[c].mean()) <= 4 * entry["std_error"]
    assert e["columns"]["sex"]["kind"] == "categorical"
    _check_within_se(e, "sex", adult)


# ------------------------------------------------------------------ any CSV with a schema (issue 11)
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env_drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``python -m stream_anon ARGS`` as a separate process (the real entry point)."""
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "stream_anon", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def one_line_error(proc: subprocess.CompletedProcess[str], command: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stream-anon {command}: error: "), proc.stderr
    return lines[0]


CITIES = ["Lyon", "Paris", "Rome", "Milan"]
CITY_SHARE = [0.4, 0.3, 0.2, 0.1]


@pytest.fixture()
def visits(tmp_path: Path) -> tuple[Path, Path, pd.DataFrame]:
    """A non-ADULT data set: 20,000 visits with a schema (record id 'visit'), drawn with a fixed seed."""
    (tmp_path / "city.csv").write_text("Lyon;FR;*\nParis;FR;*\nRome;IT;*\nMilan;IT;*\n", encoding="utf-8")
    spec = {"name": "visits", "record_id": "visit", "attributes": [
        {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
        {"name": "city", "role": "quasi_identifier", "type": "categorical", "hierarchy": "city.csv"},
        {"name": "diagnosis", "role": "sensitive", "type": "categorical", "values": ["flu", "cold", "none"]}]}
    schema = tmp_path / "visits.yaml"
    schema.write_text(yaml.safe_dump(spec), encoding="utf-8")
    rng = np.random.default_rng(11)
    n = 20_000
    df = pd.DataFrame({"visit": [f"v{i}" for i in range(n)], "age": rng.integers(0, 121, n),
                       "city": rng.choice(CITIES, n, p=CITY_SHARE),
                       "diagnosis": rng.choice(["flu", "cold", "none"], n, p=[0.2, 0.3, 0.5])})
    data = tmp_path / "visits.csv"
    df.to_csv(data, index=False)
    return data, schema, df


def test_perturb_and_estimate_any_csv_with_a_schema(visits: tuple[Path, Path, pd.DataFrame], tmp_path: Path) -> None:
    data, schema, truth = visits
    out, est = tmp_path / "krr.csv", tmp_path / "est.json"
    assert _run("perturb", "--schema", str(schema), "--input", str(data), "--mechanism", "krr", "--epsilon", "2",
                "--output", str(out), "--seed", "3", "--keep-ids") == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(df.columns) == ["visit", "city", "diagnosis", "mechanism.city", "mechanism.diagnosis",
                                "epsilon.city", "epsilon.diagnosis", "epsilon.record"]  # default: the categorical ones
    assert df["visit"].tolist() == truth["visit"].tolist()
    assert set(df["city"]) <= set(CITIES) and (df["epsilon.record"].astype(float) == 4.0).all()
    assert _run("estimate", "--schema", str(schema), "--mechanism", "krr", "--input", str(out), "--truth", str(data),
                "--output", str(est)) == 0
    e = json.loads(est.read_text())
    for column in ("city", "diagnosis"):
        entry = e["columns"][column]
        counts = truth[column].value_counts()
        for cat, count, se in zip(entry["categories"], entry["counts"], entry["std_errors"], strict=True):
            assert abs(count - counts.get(cat, 0)) <= 4 * se + 1e-9, (column, cat)
    # bounded Laplace on the numeric QI, inside the schema's public domain [0, 120]
    blap = tmp_path / "blap.csv"
    assert _run("perturb", "--schema", str(schema), "--input", str(data), "--mechanism", "blap", "--epsilon", "1",
                "--columns", "age", "--output", str(blap), "--seed", "4") == 0
    ages = pd.read_csv(blap)["age"].to_numpy(dtype=float)
    assert ages.min() >= 0 and ages.max() <= 120
    assert _run("estimate", "--schema", str(schema), "--mechanism", "blap", "--input", str(blap), "--truth", str(data),
                "--output", str(est)) == 0
    age = json.loads(est.read_text())["columns"]["age"]
    assert abs(age["estimated_mean"] - truth["age"].mean()) <= 4 * age["std_error"]


@pytest.mark.integration
def test_non_adult_csv_without_schema_says_what_it_needs(visits: tuple[Path, Path, pd.DataFrame],
                                                         tmp_path: Path) -> None:
    data, _, _ = visits
    line = one_line_error(cli("perturb", "--input", str(data), "--mechanism", "krr", "--epsilon", "1",
                              "--output", str(tmp_path / "o.csv")), "perturb")
    assert "required by schema 'adult' are missing" in line and "give --schema for another data set" in line


@pytest.mark.integration
def test_unknown_category_in_the_input_names_row_field_allowed_and_value(visits: tuple[Path, Path, pd.DataFrame],
                                                                         tmp_path: Path) -> None:
    data, schema, truth = visits
    bad = truth.copy()
    bad.loc[6, "city"] = "Berlin"
    bad.to_csv(data, index=False)
    line = one_line_error(cli("perturb", "--schema", str(schema), "--input", str(data), "--mechanism", "krr",
                              "--epsilon", "1", "--output", str(tmp_path / "o.csv")), "perturb")
    assert "row 7, field 'city': unknown category 'Berlin'" in line
    assert "'Lyon', 'Paris', 'Rome', 'Milan'" in line


@pytest.mark.integration
def test_estimate_refuses_reports_outside_the_public_domain(visits: tuple[Path, Path, pd.DataFrame],
                                                             tmp_path: Path) -> None:
    data, schema, _ = visits
    out = tmp_path / "krr.csv"
    assert _run("perturb", "--schema", str(schema), "--input", str(data), "--mechanism", "krr", "--epsilon", "1",
                "--columns", "city", "--output", str(out), "--seed", "1") == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    df.loc[41, "city"] = "Atlantis"
    df.to_csv(out, index=False)
    line = one_line_error(cli("estimate", "--schema", str(schema), "--mechanism", "krr", "--input", str(out),
                              "--output", str(tmp_path / "e.json")), "estimate")
    assert "row 42, column 'city': 'Atlantis' is not a possible report" in line and "'Lyon'" in line


@pytest.mark.integration
@pytest.mark.parametrize("command, argv, fragments", [
    ("perturb", ["--mechanism", "krr", "--epsilon", "1", "--input", "{tmp}/nope.csv", "--output", "{tmp}/o.csv"],
     ["--input: file", "nope.csv' does not exist"]),
    ("perturb", ["--mechanism", "krr", "--epsilon", "1", "--schema", "{tmp}/nope.yaml", "--input", "{data}",
                 "--output", "{tmp}/o.csv"], ["--schema: file", "does not exist"]),
    ("perturb", ["--mechanism", "krr", "--epsilon", "1", "--schema", "{schema}", "--output", "{tmp}/o.csv"],
     ["--input: no file given"]),
    ("perturb", ["--mechanism", "krr", "--epsilon", "1", "--schema", "{schema}", "--input", "{data}",
                 "--columns", "city,height", "--output", "{tmp}/o.csv"],
     ["--columns: unknown column 'height'", "allowed: age, city, diagnosis"]),
    ("perturb", ["--mechanism", "krr", "--epsilon", "-1", "--input", "{data}", "--output", "{tmp}/o.csv"],
     ["argument --epsilon: expected a number in (0, inf), got '-1'"]),
    ("perturb", ["--mechanism", "krr", "--epsilon", "1", "--schema", "{schema}", "--input", "{data}",
                 "--output", "{data}"], ["--output:", "is also the input file"]),
    ("perturb", ["--mechanism", "krr", "--epsilon", "1", "--schema", "{schema}", "--input", "{data}",
                 "--output", "{schema}/o.csv"], ["--output: cannot write", "is a file, not a folder"]),
    ("perturb", ["--mechanism", "laplace", "--epsilon", "1", "--output", "{tmp}/o.csv"],
     ["argument --mechanism: invalid choice: 'laplace'"]),
    ("estimate", ["--mechanism", "krr", "--schema", "{schema}", "--input", "{data}", "--output", "{tmp}/e.json"],
     ["--input:", "has no perturbed columns"]),
    ("estimate", ["--mechanism", "krr", "--input", "{tmp}/nope.csv", "--output", "{tmp}/e.json"],
     ["--input: file", "does not exist"]),
    ("estimate", ["--mechanism", "krr", "--input", "{data}", "--truth", "{tmp}/nope.data", "--output", "{tmp}/e.json"],
     ["--truth: file", "does not exist"]),
])
def test_operator_mistakes_give_one_line_and_exit_2(command: str, argv: list[str], fragments: list[str],
                                                    visits: tuple[Path, Path, pd.DataFrame], tmp_path: Path) -> None:
    data, schema, _ = visits
    subst = {"tmp": str(tmp_path), "data": str(data), "schema": str(schema)}
    line = one_line_error(cli(command, *[a.format(**subst) for a in argv]), command)
    for f in fragments:
        assert f in line, line


@pytest.mark.integration
def test_perturb_without_input_or_environment(tmp_path: Path) -> None:
    line = one_line_error(cli("perturb", "--mechanism", "krr", "--epsilon", "1", "--output", str(tmp_path / "o.csv"),
                              env_drop=("STREAM_ANON_ADULT",)), "perturb")
    assert "--input: no input file given and $STREAM_ANON_ADULT is not set" in line
