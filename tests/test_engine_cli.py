"""``stream-anon anonymize`` and ``stream-anon verify`` end to end: the public release layout, the meta file,
a verifier that never guesses, duplicate record ids, and one-line errors (exit 2) for operator mistakes."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from stream_anon.cli import main
from stream_anon.cli.anonymize import release_rng, release_table
from stream_anon.core.datasets import read_adult
from stream_anon.core.engine import Release
from stream_anon.core.schema import Attribute, Kind, Role, Schema, adult_schema

ROOT = Path(__file__).resolve().parents[1]
ADULT_SCHEMA_FILE = ROOT / "stream_anon" / "core" / "data" / "adult" / "schema.yaml"
OPAQUE_ID = re.compile(r"^[0-9a-f]{16}$")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m stream_anon ARGS`` as a separate process (the real entry point)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "stream_anon", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess[str], command: str) -> str:
    """The process exited 2 with exactly one line on stderr, ``stream-anon COMMAND: error: ...``."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"stream-anon {command}: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def adult_head(adult_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 3,000 ADULT lines (UCI layout)."""
    path = tmp_path_factory.mktemp("adult") / "adult3000.data"
    with open(adult_path, encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(3000)), encoding="utf-8")
    return path


# ------------------------------------------------------------------ the public release
@pytest.mark.slow  # (all of ADULT through anonymize: CI's full suite; not in the fast tier, for its time budget)
def test_anonymize_writes_public_release_meta_and_summary(adult_path: Path, tmp_path: Path,
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
    assert s["release"]["layout"] == "public"
    assert "adult-0" not in summ.read_text()  # no record id in the summary
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    schema = adult_schema()
    assert list(df.columns) == ["class_id", *[a.name for a in schema.attributes if a.is_qi], "income"]
    assert len(df) == s["records_released"]
    assert "adult-" not in out.read_text()  # no record id anywhere in the release
    # opaque class ids: 64 random bits in hex, one per class, the rows of a class together
    assert df["class_id"].map(lambda c: bool(OPAQUE_ID.match(c))).all()
    assert df["class_id"].nunique() == s["classes"]
    blocks = (df["class_id"] != df["class_id"].shift()).sum()
    assert blocks == s["classes"]
    meta = json.loads((tmp_path / "out.csv.meta.json").read_text())
    assert meta["layout"] == "public" and meta["columns"]["record_id"] is None
    assert meta["columns"]["sensitive"] == ["income"] and len(meta["columns"]["quasi_identifiers"]) == 14
    assert (meta["k"], meta["records"], meta["classes"]) == (10, s["records_released"], s["classes"])
    capsys.readouterr()
    assert main(["verify", "--input", str(out), "--k", "10", "--adult-schema"]) == 0
    printed = capsys.readouterr().out
    assert "roles from meta file" in printed and f"OK: {s['records_released']} records" in printed
    assert main(["verify", "--input", str(out), "--k", "11"]) == 1  # some classes hold exactly 10
    printed = capsys.readouterr().out
    assert "VIOLATIONS" in printed and "k=11" in printed


@pytest.mark.slow  # (three anonymize runs: CI's full suite; not in the fast tier, for its time budget)
def test_public_order_is_not_release_order_and_ids_are_not_reproducible(adult_head: Path, tmp_path: Path) -> None:
    common = ["anonymize", "--input", str(adult_head), "--k", "5", "--delta", "200", "--beta", "20", "--mu", "20"]
    assert main([*common, "--output", str(tmp_path / "ids.csv"), "--keep-ids"]) == 0
    assert main([*common, "--output", str(tmp_path / "a.csv")]) == 0
    assert main([*common, "--output", str(tmp_path / "b.csv")]) == 0
    ids = pd.read_csv(tmp_path / "ids.csv", dtype=str, keep_default_na=False)
    a = pd.read_csv(tmp_path / "a.csv", dtype=str, keep_default_na=False)
    b = pd.read_csv(tmp_path / "b.csv", dtype=str, keep_default_na=False)
    qis = [c for c in a.columns if c not in ("class_id", "income")]
    # same engine run (seed 0), so the same released rows ...
    rows = [*qis, "income"]
    key = lambda d: sorted(map(tuple, d[rows].to_numpy().tolist()))  # noqa: E731
    assert key(a) == key(b) == key(ids)
    # ... but new random class ids each run, and the classes in another order than released
    assert not set(a["class_id"]) & set(b["class_id"])
    gen = lambda d: list(dict.fromkeys(map(tuple, d[qis].to_numpy().tolist())))  # noqa: E731
    assert gen(a) != gen(ids) and gen(a) != gen(b) and sorted(gen(a)) == sorted(gen(ids))
    assert set(ids["class_id"]) == {f"c{int(c[1:])}" for c in ids["class_id"]}  # --keep-ids: the engine's ids
    # a seeded release (tests only) is reproducible
    assert main([*common, "--output", str(tmp_path / "s1.csv"), "--release-seed", "4"]) == 0
    assert main([*common, "--output", str(tmp_path / "s2.csv"), "--release-seed", "4"]) == 0
    assert (tmp_path / "s1.csv").read_bytes() == (tmp_path / "s2.csv").read_bytes()


def _release(cid: str, gen: str, values: list[str], *, reused: bool = False) -> Release:
    recs = tuple({"id": f"{cid}-{v}", "q": v, "s": v} for v in values)
    return Release(class_id=cid, kind="class", generalized={"age": gen}, record_ids=tuple(r["id"] for r in recs),
                   records=recs, delays=(0,) * len(recs), delays_seconds=(0.0,) * len(recs), loss=0.0,
                   size=len(recs), reused=reused)


def test_release_table_shuffles_classes_and_rows_uniformly() -> None:
    schema = Schema("t", (Attribute("age", Role.QUASI_IDENTIFIER, Kind.NUMERIC, lo=0, hi=100, integer=True),
                          Attribute("s", Role.SENSITIVE, Kind.CATEGORICAL)))
    releases = [_release(f"c{i}", f"[{i}-{i}]", [f"{i}.{j}" for j in range(5)]) for i in range(5)]
    releases.append(_release("c0", "[0-0]", ["0.5", "0.6"], reused=True))  # released later under class c0
    first_class = {i: 0 for i in range(5)}
    first_row_of_c0 = {j: 0 for j in range(7)}
    trials = 700
    for seed in range(trials):
        table, roles = release_table(releases, schema, rng=random.Random(seed))
        assert list(table.columns) == ["class_id", "age", "s"] and roles.layout == "public"
        assert table["class_id"].nunique() == 5 and len(table) == 27
        c0 = table[table["age"] == "[0-0]"]
        assert c0["class_id"].nunique() == 1 and len(c0) == 7  # the reused rows join their class
        assert list(c0.index) == list(range(c0.index[0], c0.index[0] + 7))  # a class's rows together
        first_class[int(table["age"].iloc[0][1:-1].split("-")[0])] += 1
        first_row_of_c0[int(c0["s"].iloc[0].split(".")[1])] += 1
    # each class first in ~1/5 of the trials, each row of c0 first in ~1/7: 5 standard deviations of slack
    for counts, m in ((first_class, 5), (first_row_of_c0, 7)):
        p = 1 / m
        sd = (trials * p * (1 - p)) ** 0.5
        assert all(abs(c - trials * p) <= 5 * sd for c in counts.values()), counts
    assert isinstance(release_rng(None), random.SystemRandom)
    table, _ = release_table(releases, schema)  # default generator: the OS's CSPRNG
    assert table["class_id"].map(lambda c: bool(OPAQUE_ID.match(c))).all()


def test_keep_ids_layout_and_qi_subset_with_l(adult_path: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    df = read_adult(adult_path).iloc[:3000]
    src = tmp_path / "adult.csv"
    df.to_csv(src, index=False)
    out, summ = tmp_path / "out.csv", tmp_path / "sum.json"
    rc = main(["anonymize", "--input", str(src), "--k", "5", "--delta", "200", "--beta", "20", "--mu", "20",
               "--qi", "age,sex,race,education", "--l", "2", "--algorithm", "ubdsa", "--loss", "ubdsa",
               "--leftover", "leftover", "--seed", "3", "--keep-ids", "--output", str(out), "--summary", str(summ)])
    assert rc == 0
    assert "--keep-ids" in capsys.readouterr().err  # a warning: outside the threat model
    s = json.loads(summ.read_text())
    assert s["format"] == "csv" and s["parameters"]["qi"] == ["age", "education", "race", "sex"]
    assert s["release"]["layout"] == "with-ids"
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(got.columns) == ["record_id", "class_id", "age", "education", "race", "sex", "income"]
    assert got["record_id"].is_unique and got["record_id"].str.startswith("adult-").all()
    assert main(["verify", "--input", str(out), "--k", "5", "--l", "2"]) == 0
    # tampering with one generalized value makes the class inconsistent
    got.loc[0, "age"] = "[0-1]"
    got.to_csv(tmp_path / "bad.csv", index=False)
    assert main(["verify", "--input", str(tmp_path / "bad.csv"), "--k", "5", "--qi", "age,education,race,sex",
                 "--sensitive", "income"]) == 1


# ------------------------------------------------------------------ regression: verify never guesses
@pytest.mark.integration
@pytest.mark.parametrize("keep_ids", [False, True], ids=["public", "with-ids"])
def test_edited_release_without_sensitive_column_never_verifies_ok(adult_head: Path, tmp_path: Path,
                                                                   keep_ids: bool) -> None:
    """Issue 11: a released file edited so that a class falls below k, with the sensitive column dropped,
    passed `verify` with OK (rc 0), with and without --schema: the last column (a QI) was taken as sensitive."""
    out = tmp_path / "out.csv"
    assert main(["anonymize", "--input", str(adult_head), "--k", "5", "--delta", "200", "--beta", "20", "--mu",
                 "20", "--output", str(out), *(["--keep-ids"] if keep_ids else [])]) == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    last_qi = df.columns[-2]  # native-country, the column the old verifier took as sensitive
    sizes = df.groupby("class_id").size()
    victim = sizes.index[0]
    rows = df.index[df["class_id"] == victim]
    value = df.loc[rows[0], last_qi]
    other = next(v for v in df[last_qi].unique() if v != value)
    df.loc[rows[: len(rows) - 4], last_qi] = other  # only k-1 = 4 rows keep the class's generalization
    df = df.drop(columns=["income"])
    edited = tmp_path / "edited.csv"
    df.to_csv(edited, index=False)
    # 1. no meta file beside the edited copy, no --schema: the verifier cannot tell the roles -> exit 2
    line = one_line_error(cli("verify", "--input", str(edited), "--k", "5"), "verify")
    assert "cannot tell which columns are quasi-identifiers" in line and "--schema" in line
    # 2. with --schema / --adult-schema: the schema's 14 QIs are checked -> the edited class is caught
    for flags in (["--schema", str(ADULT_SCHEMA_FILE)], ["--adult-schema"]):
        proc = cli("verify", "--input", str(edited), "--k", "5", *flags)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert "VIOLATIONS" in proc.stdout and f"class {victim!r}: rows differ on quasi-identifier(s) " \
                                              f"[{last_qi!r}]" in proc.stdout
        assert "OK" not in proc.stdout
    # 3. the original meta file beside the edited copy: it names 'income', which is gone -> exit 2
    (tmp_path / "edited.csv.meta.json").write_bytes((tmp_path / "out.csv.meta.json").read_bytes())
    for flags in ([], ["--adult-schema"]):
        line = one_line_error(cli("verify", "--input", str(edited), "--k", "5", *flags), "verify")
        assert "['income']" in line and "does not describe this file" in line
    # 4. the edited rows moved to a class of their own: every class consistent, two classes below k
    df.loc[rows[: len(rows) - 4], "class_id"] = "moved"
    df.to_csv(edited, index=False)
    proc = cli("verify", "--input", str(edited), "--k", "5", "--adult-schema", "--no-meta")
    assert proc.returncode == 1 and f"class {victim!r}: 4 " in proc.stdout and "< k=5" in proc.stdout


@pytest.mark.integration
def test_verify_missing_input_names_the_flag_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.csv"
    line = one_line_error(cli("verify", "--input", str(missing), "--k", "5"), "verify")
    assert f"--input: file {str(missing)!r} does not exist" in line


# ------------------------------------------------------------------ duplicate record ids
@pytest.mark.integration
def test_anonymize_refuses_duplicate_record_ids_naming_the_rows(adult_head: Path, tmp_path: Path) -> None:
    df = read_adult(adult_head, check_count=False).iloc[:40]
    df.loc[16, "id"] = df.loc[2, "id"]  # rows 3 and 17
    src = tmp_path / "dup.csv"
    df.to_csv(src, index=False)
    out = tmp_path / "out.csv"
    line = one_line_error(cli("anonymize", "--input", str(src), "--k", "5", "--delta", "10", "--output", str(out)),
                          "anonymize")
    assert "record id 'adult-00002' appears in rows 3 and 17" in line and str(src) in line
    assert not out.exists()


def _person_schema(tmp_path: Path) -> Path:
    (tmp_path / "city.csv").write_text("Lyon;FR;*\nParis;FR;*\nRome;IT;*\nMilan;IT;*\n", encoding="utf-8")
    spec = {"name": "visits", "record_id": "visit", "person_id": "patient", "attributes": [
        {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
        {"name": "city", "role": "quasi_identifier", "type": "categorical", "hierarchy": "city.csv"},
        {"name": "diagnosis", "role": "sensitive", "type": "categorical", "values": ["flu", "cold"]}]}
    path = tmp_path / "visits.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.mark.integration
def test_duplicate_record_ids_of_one_person_are_counted_once(tmp_path: Path) -> None:
    schema = _person_schema(tmp_path)
    cities = ["Lyon", "Paris", "Rome", "Milan"]
    lines = ["visit,patient,age,city,diagnosis"]
    for i in range(60):  # 30 patients, each visit id sent twice (the same individual)
        p = i % 30
        lines.append(f"v{p},p{p},{20 + p},{cities[p % 4]},{'flu' if p % 3 else 'cold'}")
    src = tmp_path / "visits.csv"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, summ = tmp_path / "out.csv", tmp_path / "s.json"
    proc = cli("anonymize", "--input", str(src), "--schema", str(schema), "--k", "3", "--delta", "20", "--beta", "5",
               "--mu", "5", "--keep-ids", "--output", str(out), "--summary", str(summ))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(summ.read_text())
    assert s["parameters"]["person_id"] == "patient" and s["records_in"] == 60
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(got.columns) == ["record_id", "patient", "class_id", "age", "city", "diagnosis"]
    persons = got.groupby("class_id")["patient"].nunique()
    assert (persons >= 3).all()  # k counts distinct persons, not rows
    proc = cli("verify", "--input", str(out), "--k", "3", "--schema", str(schema))
    assert proc.returncode == 0 and "distinct 'patient' values" in proc.stdout, (proc.stdout, proc.stderr)
    # the public layout withholds the person id, and verify says what its class sizes count
    assert cli("anonymize", "--input", str(src), "--schema", str(schema), "--k", "3", "--delta", "20", "--beta", "5",
               "--mu", "5", "--output", str(tmp_path / "pub.csv")).returncode == 0
    proc = cli("verify", "--input", str(tmp_path / "pub.csv"), "--k", "3")
    assert "does not carry the person id 'patient'" in proc.stdout
    # the same visit id for two different patients is refused
    lines[31] = lines[31].replace("p0,", "p99,")  # v0 again, now for p99
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = one_line_error(cli("anonymize", "--input", str(src), "--schema", str(schema), "--k", "3", "--delta", "20",
                              "--output", str(out)), "anonymize")
    assert "record id 'v0' appears in rows 1 and 31 with different person ids ['p0', 'p99']" in line


# ------------------------------------------------------------------ operator mistakes: one line, exit 2
@pytest.mark.parametrize("args, message", [
    (["--k", "1"], "--k: must be an integer >= 2, got 1"),
    (["--k", "10", "--delta", "5"], "--delta: must be an integer >= 10, got 5"),
    (["--beta", "0"], "--beta: must be an integer >= 1, got 0"),
    (["--qi", "age,height"], "--qi: unknown quasi-identifier(s) ['height']"),
    (["--qi", ","], "--qi: expected a comma-separated list"),
    (["--sensitive", "salary"], "--sensitive: unknown sensitive attribute 'salary'"),
    (["--l", "3"], "--l: must be an integer in [1, 2]"),
])
def test_bad_parameters_exit_2_with_a_clear_message(adult_head: Path, args: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    rc = main(["anonymize", "--input", str(adult_head), *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


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


def _files(tmp_path: Path) -> dict[str, Path]:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: x\nattributes: [\n  {name: a\n", encoding="utf-8")
    no_hier = tmp_path / "nohier.yaml"
    no_hier.write_text(yaml.safe_dump({"name": "x", "attributes": [
        {"name": "city", "role": "quasi_identifier", "type": "categorical", "hierarchy": "gone.csv"}]}),
        encoding="utf-8")
    header_only = tmp_path / "header.csv"
    header_only.write_text("id,age,workclass\n", encoding="utf-8")
    other = tmp_path / "other.csv"
    other.write_text("name,height\nann,170\n", encoding="utf-8")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x", encoding="utf-8")
    release = tmp_path / "release.csv"
    release.write_text("class_id,age,income\nc,[20-30],>50K\n", encoding="utf-8")
    binary = tmp_path / "binary.dat"
    binary.write_bytes(bytes(range(256)) * 8)
    not_utf8 = tmp_path / "latin1.yaml"
    not_utf8.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    a_list = tmp_path / "list.yaml"
    a_list.write_text("- a\n- b\n", encoding="utf-8")
    return {"bad_yaml": bad_yaml, "no_hier": no_hier, "header_only": header_only, "other": other,
            "a_file": a_file, "release": release, "binary": binary, "not_utf8": not_utf8, "a_list": a_list,
            "dir": tmp_path}


@pytest.mark.integration
@pytest.mark.parametrize("command, argv, fragments", [
    ("anonymize", ["--input", "{tmp}/nope.csv"], ["--input: file", "nope.csv' does not exist"]),
    ("anonymize", ["--input", "{dir}"], ["--input:", "is not a regular file"]),
    ("anonymize", ["--input", "{adult}", "--schema", "{tmp}/nope.yaml"], ["--schema: file", "does not exist"]),
    ("anonymize", ["--input", "{adult}", "--schema", "{bad_yaml}"], ["--schema", "not valid YAML"]),
    ("anonymize", ["--input", "{adult}", "--schema", "{no_hier}"], ["--schema", "hierarchy file", "does not exist"]),
    ("anonymize", ["--input", "{adult}", "--schema", "{not_utf8}"], ["--schema", "not a UTF-8 text file"]),
    ("anonymize", ["--input", "{adult}", "--schema", "{a_list}"], ["--schema", "expected a mapping at top level"]),
    ("anonymize", ["--input", "{binary}"], ["--input:", "binary.dat", "cannot be read as a ','-separated CSV"]),
    ("anonymize", ["--input", "{adult}", "--k", "abc"], ["argument --k: invalid int value: 'abc'"]),
    ("anonymize", ["--input", "{adult}", "--output", "{a_file}/out.csv"], ["--output: cannot write", "is a file, not a folder"]),
    ("anonymize", ["--input", "{adult}", "--output", "{adult}"], ["--output:", "is also the input file"]),
    ("anonymize", ["--input", "{adult}", "--summary", "{dir}"], ["--summary:", "is a directory"]),
    ("anonymize", ["--input", "{header_only}"], ["--input:", "header.csv"]),
    ("anonymize", ["--input", "{other}"], ["--input:", "required by schema 'adult' are missing",
                                           "give --schema for another data set"]),
    ("anonymize", ["--input", "{adult}", "--keep-ids"], ["--keep-ids: only with --output"]),
    ("verify", ["--input", "{release}"], ["the following arguments are required: --k"]),
    ("verify", ["--input", "{binary}", "--k", "2", "--adult-schema"], ["binary.dat' is not a readable CSV"]),
    ("verify", ["--input", "{release}", "--k", "1"], ["--k: must be an integer >= 2"]),
    ("verify", ["--input", "{release}", "--k", "2", "--qi", "age,height", "--sensitive", "income"],
     ["--qi names 'height' as the quasi-identifier column"]),
    ("verify", ["--input", "{release}", "--k", "2", "--qi", "age"], ["['income'] have no role"]),
    ("verify", ["--input", "{release}", "--k", "2", "--qi", "age", "--l", "2"], ["['income'] have no role"]),
    ("verify", ["--input", "{release}", "--k", "2", "--schema", "{bad_yaml}"], ["--schema", "not valid YAML"]),
    ("verify", ["--input", "{release}", "--k", "2", "--schema", "x.yaml", "--adult-schema"], ["not both"]),
    ("verify", ["--input", "{release}", "--k", "2", "--meta", "{tmp}/nope.json"], ["--meta: file"]),
    ("verify", ["--input", "{release}", "--k", "2", "--meta", "{a_file}"], ["cannot be read as JSON"]),
])
def test_operator_mistakes_give_one_line_and_exit_2(command: str, argv: list[str], fragments: list[str],
                                                    adult_head: Path, tmp_path: Path) -> None:
    files = _files(tmp_path)
    subst = {"tmp": str(tmp_path), "adult": str(adult_head), **{k: str(v) for k, v in files.items()}}
    line = one_line_error(cli(command, *[a.format(**subst) for a in argv]), command)
    for f in fragments:
        assert f in line, line
