"""``verify`` under diversity models: a released table that violates entropy / recursive l-diversity or
t-closeness fails with a line naming the class, the figure and the bound; t-closeness is checked against the
references the release states (anonymize's meta file), else against the file's own distribution (noted);
``anonymize`` then ``verify`` end to end through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from stream_anon.core.diversity import DiversityRequirement
from stream_anon.core.verify import read_release_references, verify_release_frame

ROOT = Path(__file__).resolve().parents[1]


def table(classes: dict[str, list[str]], sensitive: str = "income") -> pd.DataFrame:
    rows = [{"class_id": cid, "age": "[20-29]", sensitive: v} for cid, vs in classes.items() for v in vs]
    return pd.DataFrame(rows)


def check(df: pd.DataFrame, req: DiversityRequirement, references: dict[str, dict[str, int]] | None = None,
          sensitive: str = "income"):  # type: ignore[no-untyped-def]
    return verify_release_frame(df, ["age"], 2, None, sensitive, record_id=None, requirement=req,
                                references=references)


def test_entropy_and_recursive_violations_name_class_figure_and_bound() -> None:
    df = table({"A": ["x"] * 5 + ["y"] * 5, "B": ["x"] * 9 + ["y"]})
    rep = check(df, DiversityRequirement(model="entropy", l=2))
    assert not rep.ok and rep.violations == [
        "class 'B': entropy of 'income' 0.3251 < log(l)=0.6931 (entropy l=2)"]
    assert rep.violation_counts == {"class not entropy l-diverse": 1}
    rep = check(df, DiversityRequirement(model="recursive", c=3, l=2))
    assert rep.violations == ["class 'B': recursive (3, 2): largest 'income' count 9 >= c x (r_2 + ... + r_m) = 3 x 1"]
    assert check(df, DiversityRequirement(model="entropy", l=1.3)).ok  # H(0.1) = 0.325 >= log 1.3 = 0.262


def test_t_closeness_against_stated_references_and_the_files_own_distribution() -> None:
    df = table({"A": ["x"] * 7 + ["y"] * 3, "B": ["x"] * 5 + ["y"] * 5})
    refs = {"A": {"x": 70, "y": 30}, "B": {"x": 50, "y": 50}}
    rep = check(df, DiversityRequirement(t=0.05), refs)
    assert rep.ok, rep.violations  # each class is its own reference's distribution
    assert "against the file's own distribution of 'income' (not the claim): 2 of 2 classes" in rep.notes[0]
    rep = check(df, DiversityRequirement(t=0.05), {"A": {"x": 70, "y": 30}, "B": {"x": 80, "y": 20}})
    assert rep.violations == ["class 'B': EMD of 'income' to its stated reference 0.3000 > t=0.05 (equal distance)"]
    rep = check(df, DiversityRequirement(t=0.05), {"A": {"x": 70, "y": 30}})
    assert rep.violations == ["class 'B': the release states no reference distribution for it"]
    # without references: the file's own distribution (60 % x), and a note that this is another test
    assert check(df, DiversityRequirement(t=0.1)).ok  # both classes exactly 0.1 from 60 % x: at the bound
    rep = check(df, DiversityRequirement(t=0.09))
    assert len(rep.violations) == 2 and "the file's own distribution" in rep.notes[0]
    # a reference value the file never shows still counts (equal distance over the union of values)
    rep = check(table({"A": ["x"] * 2}), DiversityRequirement(t=0.5), {"A": {"x": 1, "z": 1}})
    assert rep.ok


def test_ordered_distance_orders_numbers_and_refuses_text() -> None:
    df = table({"A": ["3", "4", "5"], "B": ["6", "8", "11"]}, sensitive="salary")
    uniform = {str(v): 1 for v in range(3, 12)}
    rep = check(df, DiversityRequirement(t=0.2, distance="ordered"), {"A": uniform, "B": uniform}, "salary")
    assert rep.violations == ["class 'A': EMD of 'salary' to its stated reference 0.3750 > t=0.2 (ordered distance)"]
    rep = check(table({"A": ["low", "high"]}, "salary"), DiversityRequirement(t=0.2, distance="ordered"),
                sensitive="salary")
    assert rep.violations == ["column 'salary': the ordered distance needs numeric values, got ['high', 'low']"]


# ---------------------------------------------------------------------------------------------- end to end
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "stream_anon", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def adult_head(adult_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("adult") / "adult5000.data"
    with open(adult_path, encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(5000)), encoding="utf-8")
    return path


@pytest.mark.integration  # starts the CLI as a process
def test_anonymize_then_verify_each_model_and_a_tampered_file_fails(adult_head: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    p = cli("anonymize", "--input", str(adult_head), "--k", "5", "--delta", "200", "--zeta", "0", "--l", "2",
            "--t-closeness", "0.15", "--output", str(out), "--summary", str(tmp_path / "s.json"))
    assert p.returncode == 0, p.stderr
    meta = json.loads((tmp_path / "t.csv.meta.json").read_text())
    assert meta["t_closeness"]["t"] == 0.15 and meta["t_closeness"]["distance"] == "equal" and meta["l"] == 2
    refs = read_release_references(tmp_path / "t.csv.meta.json")
    df = pd.read_csv(out, dtype=str)
    assert refs is not None and set(refs) == set(df["class_id"])
    assert len(meta["t_closeness"]["references"]) == 5000 // 200  # one snapshot per delta arrivals
    summary = json.loads((tmp_path / "s.json").read_text())["sensitive_disclosure"]
    assert summary["majority_guess"] == pytest.approx(summary["prior_released"])
    v = cli("verify", "--input", str(out), "--k", "5", "--l", "2", "--t-closeness", "0.15")
    assert v.returncode == 0, v.stdout + v.stderr
    assert "OK:" in v.stdout and "distinct 2-diversity and 0.15-closeness (equal distance)" in v.stdout
    assert "note: against the file's own distribution of 'income' (not the claim)" in v.stdout
    # tamper: make one class all >50K
    cid = df["class_id"].iloc[0]
    df.loc[df["class_id"] == cid, "income"] = ">50K"
    df.to_csv(out, index=False)
    v = cli("verify", "--input", str(out), "--k", "5", "--t-closeness", "0.15")
    assert v.returncode == 1
    assert f"class {cid!r}: EMD of 'income' to its stated reference" in v.stdout
    v = cli("verify", "--input", str(out), "--k", "5", "--l", "2")
    assert v.returncode == 1 and f"class {cid!r}: 1 distinct 'income' values < l=2" in v.stdout
    # entropy l = 1.5: written, checked, and stated in the meta file
    out2 = tmp_path / "e.csv"
    p = cli("anonymize", "--input", str(adult_head), "--k", "5", "--delta", "200", "--zeta", "0",
            "--diversity", "entropy", "--l", "1.5", "--output", str(out2))
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "e.csv.meta.json").read_text())["diversity"] == {"model": "entropy", "l": 1.5}
    assert cli("verify", "--input", str(out2), "--k", "5", "--diversity", "entropy", "--l", "1.5").returncode == 0
    v = cli("verify", "--input", str(out2), "--k", "5", "--diversity", "entropy", "--l", "2")
    assert v.returncode == 1 and "entropy of 'income'" in v.stdout and "< log(l)=0.6931" in v.stdout


@pytest.mark.parametrize("command, args, message", [
    ("verify", ["--diversity", "recursive", "--l", "2"], "--c: must be a number > 0 with recursive (c, l)-diversity"),
    ("verify", ["--t-closeness", "2"], "--t-closeness: must be a number in [0, 1], got 2.0"),
    ("verify", ["--l", "1.5"], "--l: must be an integer >= 1, got 1.5"),
    ("anonymize", ["--diversity", "entropy", "--l", "3"], "--l: must be a number in [1, 2]"),
    ("anonymize", ["--t-closeness", "0.2", "--t-distance", "ordered"], "--t-distance: must be equal or auto"),
    ("anonymize", ["--c", "2", "--l", "2"], "--c: must be unset unless diversity is recursive"),
])
@pytest.mark.integration  # starts the CLI as a process
def test_bad_model_parameters_exit_2_with_one_line(adult_head: Path, tmp_path: Path, command: str, args: list[str],
                                                    message: str) -> None:
    target = ["--input", str(adult_head)] if command == "anonymize" else ["--input", str(adult_head), "--k", "5"]
    p = cli(command, *target, *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
