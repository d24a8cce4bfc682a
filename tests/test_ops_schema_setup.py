"""Issue 20, item 1: your own stream in one line.  ``stream-anon run --schema FILE --input-topic T`` with nothing
else (but port 0 for the metrics endpoints: tests bind no fixed port): every topic derives from T, the side paths
take their attributes from the schema, only the paths that run get topics, and the user's data goes through
``run``, ``audit``, ``verify`` and ``report``.  Paths in a config file are resolved against the file's folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from kafka import KafkaAdminClient
from ops_support import (
    KAFKA_LOGGER_LINE,
    QUIET_PORTS,
    embedded_address,
    run_cli,
    running,
    user_records,
    user_schema,
    wait_until,
)

from stream_anon.config.settings import DERIVED_TOPICS, Config, ConfigError, derived_topic, topic_base
from stream_anon.core.schema import Kind, Schema, SchemaError

N_VISITS = 3000


# ------------------------------------------------------------------------------------------------ topic names
@pytest.mark.parametrize(("input_topic", "base"), [("visits.raw", "visits"), ("visits", "visits"),
                                                    ("a.b.raw", "a.b"), ("raw", "raw"), (".raw", ".raw")])
def test_every_output_topic_derives_from_the_input(input_topic: str, base: str) -> None:
    assert topic_base(input_topic) == base
    t = Config.load(env={}, overrides={"topics.input": input_topic}).topics
    for option in DERIVED_TOPICS:
        assert getattr(t, option) == derived_topic(input_topic, option) == f"{base}.{option}"
    assert t.ledger_topic() == f"{input_topic}.ledger"
    assert input_topic not in {getattr(t, o) for o in DERIVED_TOPICS}  # a suffix always: never the input itself


def test_each_derived_topic_is_overridable_and_the_rest_follow_the_input(tmp_path: Path) -> None:
    cfg = Config.load(env={"STREAM_ANON_TOPICS_DLQ": "ops.errors"},
                      overrides={"topics.input": "visits.raw", "topics.anon": "visits.public"})
    t = cfg.topics
    assert (t.anon, t.dlq, t.suppressed, t.krr) == ("visits.public", "ops.errors", "visits.suppressed", "visits.krr")
    # a derived config with another input re-derives what was not given, keeps what was
    t2 = cfg.with_options({"topics.input": "trips.raw"}).topics
    assert (t2.anon, t2.dlq, t2.suppressed) == ("visits.public", "ops.errors", "trips.suppressed")
    f = tmp_path / "c.yaml"
    f.write_text("topics: {input: trips, kmeans: null, estimates: ''}\n")
    t3 = Config.load(f, env={}).topics
    assert (t3.kmeans, t3.estimates, t3.anon) == ("trips.kmeans", "trips.estimates", "trips.anon")


def test_the_defaults_are_those_of_adult_raw() -> None:
    t = Config.load(env={}).topics
    assert (t.input, t.anon, t.dlq, t.krr, t.estimates) == ("adult.raw", "adult.anon", "adult.dlq", "adult.krr",
                                                            "adult.estimates")


# ------------------------------------------------------------------------------------------------ paths in a file
def test_paths_in_a_config_file_are_resolved_against_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "conf"
    schema = user_schema(conf_dir / "schemas")
    (conf_dir / "ca.pem").write_text("not used here")
    cfg_file = conf_dir / "service.yaml"
    cfg_file.write_text("anonymization: {schema: schemas/visits.yaml}\nkafka: {ssl_cafile: ca.pem}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the current directory has neither file
    cfg = Config.load(cfg_file, env={})
    assert Path(cfg.anonymization.schema or "") == schema and Path(cfg.kafka.ssl_cafile or "") == conf_dir / "ca.pem"
    assert cfg.anonymization.load_schema().name == "visits"
    # a flag or an environment variable stays relative to the current directory
    with pytest.raises(ConfigError, match=r"anonymization\.schema.*schemas/visits\.yaml"):
        Config.load(cfg_file, env={}, overrides={"anonymization.schema": "schemas/visits.yaml"})


# ------------------------------------------------------------------------------------------------ side-path roles
def test_side_path_attributes_come_from_the_schema(tmp_path: Path) -> None:
    schema = Schema.load(user_schema(tmp_path))
    assert schema.side_path_attributes("krr") == ["city"]
    assert schema.side_path_attributes("blap", Kind.NUMERIC) == ["age"]
    assert schema.side_path_attributes("blap", Kind.CATEGORICAL) == ["diagnosis"]
    assert schema.side_path_attributes("rs") == []
    cfg = Config.load(env={}, overrides={"anonymization.schema": str(tmp_path / "visits.yaml")})
    assert cfg.side_paths_off() is None
    plan = cfg.side_paths.check(schema)
    assert [p.attribute for p in plan.krr] == ["city"] and plan.rs == []
    assert [p.attribute for p in plan.blap_numeric] == ["age"] and [p.attribute for p in plan.blap_categorical] == [
        "diagnosis"]
    assert plan.kmeans is not None and plan.kmeans.attributes == ["age"]
    # a list in the configuration wins over the declarations
    cfg2 = cfg.with_options({"side_paths.krr.attributes": "diagnosis"})
    assert [p.attribute for p in cfg2.side_paths.check(schema).krr] == ["diagnosis"]


def test_a_schema_without_side_path_attributes_turns_them_off_and_says_why(tmp_path: Path) -> None:
    path = user_schema(tmp_path, side_paths=False)
    cfg = Config.load(env={}, overrides={"anonymization.schema": str(path)})
    assert cfg.side_paths_off() == ("schema 'visits' declares no side-path attributes (declare them with "
                                    "side_paths: [krr, rs, blap, kmeans] on an attribute, or list them in "
                                    "side_paths.<path>.attributes)")


@pytest.mark.parametrize(("spec", "needle"), [
    ({"name": "id", "role": "identifier", "type": "categorical", "side_paths": ["krr"]}, "identifier never goes"),
    ({"name": "age", "type": "numeric", "domain": [0, 9], "side_paths": ["krr"]}, "side path 'krr' needs a "
                                                                                   "categorical attribute"),
    ({"name": "c", "type": "categorical", "values": ["a", "b"], "side_paths": ["kmeans"]}, "'kmeans' needs a numeric"),
    ({"name": "c", "type": "categorical", "values": ["a", "b"], "side_paths": ["lap"]}, r"side_paths \['lap'\] not "
                                                                                          "among"),
    ({"name": "n", "type": "numeric", "side_paths": ["blap"]}, "'blap' needs a numeric attribute with a public"),
])
def test_side_path_declarations_are_checked_when_the_schema_loads(spec: dict[str, object], needle: str) -> None:
    with pytest.raises(SchemaError, match=needle):
        Schema.from_dict({"name": "s", "attributes": [spec]})


# ------------------------------------------------------------------------------------------------ end to end
def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {t for t in admin.list_topics() if not t.startswith("__")}
    finally:
        admin.close()


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_user_schema_end_to_end_through_run_audit_verify_report(tmp_path: Path) -> None:
    """The issue's scenario: a user's own stream, through the real commands."""
    work = tmp_path / "visits"
    schema = user_schema(work / "schemas")
    data = user_records(work / "visits.csv", N_VISITS)
    run_dir = work / "run-dir"
    with running(tmp_path / "run.log", "run", "--schema", str(schema), "--input-topic", "visits.raw",
                 *QUIET_PORTS, cwd=work) as run:
        bs = wait_until("the embedded broker and the main path", lambda: embedded_address(run.text())
                        if "main path: consuming visits.raw" in run.text() else None, 120, proc=run)
        wait_until("the side paths", lambda: "side paths: consuming visits.raw" in run.text(), 120, proc=run)
        replay = run_cli("kafka", "--csv", str(data), "--schema", str(schema), "--topic", "visits.raw",
                         "--bootstrap-servers", bs, "--no-progress", module="replay_tools", timeout=180)
        assert replay.returncode == 0, replay.stderr
        audit_args = ["audit", "--bootstrap-servers", bs, "--input-topic", "visits.raw", "--schema", str(schema)]

        def audited() -> bool:  # every record accounted (the replay ends with the end-of-stream marker)
            out = run_cli(*audit_args, timeout=120)
            return out.returncode == 0 and "OK: every input offset accounted exactly once" in out.stdout

        wait_until("audit OK on the user's stream", audited, 240, proc=run, step_s=1.0)
        out = run_cli(*audit_args, "--run-dir", str(run_dir), timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"outcomes: control 1, released [\d,]+, suppressed [\d,]+ \(total 3,001\)", out.stdout), out.stdout
        topics = _topics(bs)
        log = run.text()
        run.interrupt()
        assert run.wait(60) == 0, run.text()[-3000:]
    # only the paths that run have topics; everything derives from visits.raw, nothing is called adult.*
    main = {"visits.raw", "visits.raw.ledger", "visits.anon", "visits.suppressed", "visits.dlq"}
    side = {"visits.krr", "visits.blap", "visits.estimates", "visits.kmeans"}
    assert main | side <= topics and not {t for t in topics if t.startswith("adult.")}, topics
    assert "visits.rs" not in topics  # the schema declares no rs attribute: no rs path, no topic
    assert ("each record spends 2.9 over all side outputs (exact eps per topic visits.krr 1.4, visits.blap 1.1, "
            "k-means window 0.4)") in log
    assert not KAFKA_LOGGER_LINE.search(log) and "Traceback" not in log
    final = run.text().strip().splitlines()[-1]
    assert re.fullmatch(r"stream-anon run: stopped: consumed 3,000, released ([\d,]+), suppressed ([\d,]+), "
                        r"dead-lettered 0, left for the next start 0 \(buffered, not yet released\)", final), final
    # verify: the released table of the run directory, k and l, the QI strings against the run's schema
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["records_released"] + summary["records_suppressed"] == N_VISITS
    assert summary["parameters"]["k"] == 10 and summary["k_anonymity"]["verified"] is True
    assert yaml.safe_load((run_dir / "schema.yaml").read_text())["name"] == "visits"
    ver = run_cli("verify", "--input", str(run_dir / "released.csv"), "--k", "10", "--l", "2", "--schema",
                  str(run_dir / "schema.yaml"))
    assert ver.returncode == 0 and f"OK: {summary['records_released']} records" in ver.stdout, ver.stdout + ver.stderr
    assert "does not carry the person id 'patient'" in ver.stdout
    # report: the run directory's report, then the extras with the run's own settings on the user's data
    rep = run_cli("report", str(run_dir), "--compute-extras", "--data", str(data), "--grid-k", "5,10",
                  "--grid-delta", "500,1000", "--epsilons", "1,4", "--repetitions", "2", timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "schema 'visits', 3,000 records" in rep.stderr
    html = (run_dir / "report.html").read_text()
    for anchor in ("loss", "delay", "classes", "generalization", "ldp", "side"):
        assert f'<h2 id="{anchor}">' in html, anchor
    grid = json.loads((run_dir / "grid.json").read_text())
    own = next(g for g in grid if (g["k"], g["delta"]) == (10, 1000))
    assert (own["l"], own["zeta"], own["records"], own["qis"]) == (2, 0, N_VISITS, 2)
    curves = json.loads((run_dir / "ldp_curves.json").read_text())
    assert {(c["mechanism"], c["attribute"]) for c in curves} == {
        ("k-RR", "city"), ("discretized bounded Laplace", "diagnosis"), ("bounded Laplace (mean)", "age")}


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_schema_without_side_path_attributes_runs_without_side_paths(tmp_path: Path) -> None:
    schema = user_schema(tmp_path / "s", side_paths=False)
    with running(tmp_path / "run.log", "run", "--schema", str(schema), "--input-topic", "plain", *QUIET_PORTS) as run:
        bs = wait_until("the main path", lambda: embedded_address(run.text())
                        if "main path: consuming plain" in run.text() else None, 120, proc=run)
        topics = _topics(bs)
        run.interrupt()
        assert run.wait(60) == 0, run.text()[-3000:]
    assert "side paths off: schema 'visits' declares no side-path attributes" in run.text()
    assert topics == {"plain", "plain.ledger", "plain.anon", "plain.suppressed", "plain.dlq"}, topics
