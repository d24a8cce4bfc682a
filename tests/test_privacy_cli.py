"""``stream-anon perturb`` / ``stream-anon estimate`` on the real ADULT file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

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


def test_krr_perturb_and_estimate(adult_path: Path, adult: pd.DataFrame, tmp_path: Path) -> None:
    out, summary, est = tmp_path / "krr.csv", tmp_path / "krr.json", tmp_path / "est.json"
    cols = "sex,race,workclass,education"
    assert _run("perturb", "--mechanism", "krr", "--epsilon", "2", "--input", str(adult_path), "--columns", cols,
                "--output", str(out), "--summary", str(summary), "--seed", "7") == 0
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
