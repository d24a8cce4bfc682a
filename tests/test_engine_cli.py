"""``stream-anon anonymize`` and ``stream-anon verify`` end to end on ADULT."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from stream_anon.cli import main
from stream_anon.core.datasets import read_adult


def test_anonymize_writes_release_and_summary_and_verify_accepts(adult_path: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out, summ = tmp_path / "out.csv", tmp_path / "sum.json"
    rc = main(["anonymize", "--input", str(adult_path), "--k", "10", "--delta", "1000", "--beta", "50", "--mu", "100",
               "--output", str(out), "--summary", str(summ)])
    assert rc == 0
    s = json.loads(summ.read_text())
    for key in ("records_in", "records_released", "records_suppressed", "gt_loss", "lm_loss", "lm_loss_per_attribute",
                "ubdsa_loss", "castle_loss", "castle_loss_with_suppressed", "classes", "min_class_size", "max_delay",
                "mean_delay", "seconds", "records_per_second", "parameters"):
        assert key in s, key
    assert s["records_in"] == 32561 == s["records_released"] + s["records_suppressed"]
    assert s["max_delay"] <= 1000 and s["late_records"] == 0 and s["min_class_size"] >= 10
    assert s["gt_loss"] == pytest.approx(s["castle_loss_with_suppressed"])
    assert set(s["lm_loss_per_attribute"]) == set(s["parameters"]["qi"]) and len(s["parameters"]["qi"]) == 14
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(df.columns[:2]) == ["record_id", "class_id"] and df.columns[-1] == "income"
    assert len(df) == s["records_released"] and df["record_id"].is_unique
    assert main(["verify", "--input", str(out), "--k", "10", "--adult-schema"]) == 0
    assert main(["verify", "--input", str(out), "--k", "11"]) == 1  # some classes hold exactly 10
    printed = capsys.readouterr().out
    assert "VIOLATIONS" in printed and "k=11" in printed


def test_anonymize_csv_with_qi_subset_and_l(adult_path: Path, tmp_path: Path) -> None:
    df = read_adult(adult_path).iloc[:3000]
    src = tmp_path / "adult.csv"
    df.to_csv(src, index=False)
    out, summ = tmp_path / "out.csv", tmp_path / "sum.json"
    rc = main(["anonymize", "--input", str(src), "--k", "5", "--delta", "200", "--beta", "20", "--mu", "20",
               "--qi", "age,sex,race,education", "--l", "2", "--algorithm", "ubdsa", "--loss", "ubdsa",
               "--leftover", "leftover", "--seed", "3", "--output", str(out), "--summary", str(summ)])
    assert rc == 0
    s = json.loads(summ.read_text())
    assert s["format"] == "csv" and s["parameters"]["qi"] == ["age", "education", "race", "sex"]
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(got.columns) == ["record_id", "class_id", "age", "education", "race", "sex", "income"]
    assert main(["verify", "--input", str(out), "--k", "5", "--l", "2"]) == 0
    # tampering with one generalized value makes the class inconsistent
    got.loc[0, "age"] = "[0-1]"
    got.to_csv(tmp_path / "bad.csv", index=False)
    assert main(["verify", "--input", str(tmp_path / "bad.csv"), "--k", "5"]) == 1


@pytest.mark.parametrize("args, message", [
    (["--k", "1"], "k: must be an integer >= 2, got 1"),
    (["--k", "10", "--delta", "5"], "delta: must be an integer >= 10, got 5"),
    (["--beta", "0"], "beta: must be an integer >= 1, got 0"),
    (["--qi", "age,height"], "unknown quasi-identifier(s) ['height']"),
    (["--sensitive", "salary"], "unknown sensitive attribute 'salary'"),
])
def test_bad_parameters_exit_2_with_a_clear_message(adult_path: Path, args: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["anonymize", "--input", str(adult_path), *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_bad_record_exits_2_naming_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bad.data"
    src.write_text("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
                   "2174, 0, 40, United-States, <=50K\n"
                   "150, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
                   "2174, 0, 40, United-States, <=50K\n")
    rc = main(["anonymize", "--input", str(src), "--k", "2", "--delta", "2", "--beta", "1", "--mu", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "'age'" in err and "150" in err
