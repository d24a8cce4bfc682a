"""The service configuration: precedence flag > env > YAML > default, conversions, clear errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stream_anon.cli import build_parser
from stream_anon.cli.service import config_from_args
from stream_anon.service.config import (
    Config,
    ConfigError,
    TopicSettings,
    env_name,
    env_to_option,
    option_names,
)
from stream_anon.side.config import SideTopics

ROOT = Path(__file__).resolve().parents[1]


def test_precedence_flag_beats_env_beats_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("anonymization: {k: 4, delta: 300, beta: 7}\nkafka: {group_id: from-file}\n"
                 "side_paths: {krr: {epsilon: 2.0, attributes: [sex]}}\n")
    env = {"STREAM_ANON_ANONYMIZATION_K": "6", "STREAM_ANON_ANONYMIZATION_DELTA": "400",
           "STREAM_ANON_SIDE_PATHS_KRR_EPSILON": "0.25", "STREAM_ANON_ADULT": "/not/a/config/option"}
    cfg = Config.load(f, env=env, overrides={"anonymization.k": 8})
    assert cfg.anonymization.k == 8  # flag
    assert cfg.anonymization.delta == 400  # env beats file
    assert cfg.anonymization.beta == 7  # file beats default
    assert cfg.anonymization.mu == 100  # default
    assert cfg.kafka.group_id == "from-file"
    assert cfg.side_paths.krr.epsilon == 0.25 and cfg.side_paths.krr.attributes == ["sex"]


def test_cli_flags_and_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_ANON_ANONYMIZATION_BETA", "9")
    monkeypatch.setenv("STREAM_ANON_KAFKA_GROUP_ID", "env-group")
    args = build_parser().parse_args(["run", "--k", "12", "--bootstrap-servers", "h:9092", "--group-id", "g",
                                      "--set", "side_paths.rs.l=3", "--set", "topics.anon=my.anon",
                                      "--no-side-paths"])
    cfg = config_from_args(args)
    assert cfg.anonymization.k == 12 and cfg.anonymization.beta == 9
    assert cfg.kafka.bootstrap_servers == "h:9092" and cfg.kafka.group_id == "g"
    assert cfg.side_paths.rs.l == 3 and cfg.topics.anon == "my.anon" and cfg.side_paths.enabled is False


def test_security_options_pass_through() -> None:
    cfg = Config.load(env={}, overrides={"kafka.security_protocol": "SASL_SSL", "kafka.sasl_mechanism": "PLAIN",
                                         "kafka.sasl_plain_username": "u", "kafka.sasl_plain_password": "p",
                                         "kafka.ssl_cafile": "/ca.pem"})
    opts = cfg.kafka.security_options()
    assert opts == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_plain_username": "u",
                    "sasl_plain_password": "p", "ssl_cafile": "/ca.pem", "ssl_check_hostname": True}
    assert cfg.redacted()["kafka"]["sasl_plain_password"] == "***"


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"anonymization.k": "x"}, "anonymization.k"),
    ({"anonymization.k": 1}, "anonymization.k"),
    ({"anonymization.delta": 5}, "anonymization.delta"),
    ({"anonymization.algorithm": "mondrian"}, "anonymization.algorithm.*castle.*ubdsa"),
    ({"anonymization.nope": 1}, "unknown option"),
    ({"service.metrics_port": 70000}, "service.metrics_port"),
    ({"topics.anon": "adult.raw"}, "must differ"),
])
def test_bad_values_name_the_option(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config.load(env={}, overrides=overrides)


def test_unknown_option_in_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("anonymization: {kk: 3}\n")
    with pytest.raises(ConfigError, match="kk"):
        Config.load(f, env={})


def test_example_config_loads_and_documents_every_option() -> None:
    example = ROOT / "config.example.yaml"
    cfg = Config.load(example, env={})
    for section in ("kafka", "topics", "anonymization", "service"):  # the example shows the defaults
        assert cfg.to_dict()[section] == Config().to_dict()[section]
    text = example.read_text()
    docs = (ROOT / "docs" / "service.md").read_text()
    for opt in option_names():
        leaf = opt.split(".")[-1]
        assert f"{leaf}:" in text, f"{opt} missing from config.example.yaml"
        assert env_to_option(env_name(opt)) == opt
        assert f"`{opt}`" in docs, f"{opt} missing from docs/service.md"


def test_text_options_keep_their_text() -> None:
    env = {"STREAM_ANON_KAFKA_SASL_PLAIN_PASSWORD": "yes", "STREAM_ANON_KAFKA_CLIENT_ID": "1:30",
           "STREAM_ANON_ANONYMIZATION_QI": "age,sex", "STREAM_ANON_ANONYMIZATION_L": "null",
           "STREAM_ANON_SERVICE_IDLE_FLUSH_SECONDS": "2.5", "STREAM_ANON_TOPICS_CREATE": "false"}
    cfg = Config.load(env=env, overrides={"kafka.ssl_password": "007", "anonymization.sensitive": "income"})
    assert cfg.kafka.sasl_plain_password == "yes" and cfg.kafka.client_id == "1:30"
    assert cfg.kafka.ssl_password == "007"
    assert cfg.anonymization.qi == ["age", "sex"] and cfg.anonymization.l is None
    assert cfg.service.idle_flush_seconds == 2.5 and cfg.topics.create is False


def test_config_is_frozen_and_derived_configs_are_new_validated_ones() -> None:
    cfg = Config.load(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kafka.bootstrap_servers = "h:9092"  # type: ignore[misc]
    derived = cfg.with_options({"kafka.bootstrap_servers": "h:9092", "side_paths.krr.epsilon": "0.5"})
    assert derived.kafka.bootstrap_servers == "h:9092" and derived.side_paths.krr.epsilon == 0.5
    assert cfg.kafka.bootstrap_servers is None and cfg.side_paths.krr.epsilon == 1.0  # unchanged
    with pytest.raises(ConfigError, match=r"anonymization\.delta.*>= 10.*5"):
        cfg.with_options({"anonymization.delta": 5})


def test_topic_defaults_are_the_side_paths_own() -> None:
    t, side = TopicSettings(), SideTopics()
    assert t.side_topics() == side
    assert (t.krr, t.rs, t.blap, t.estimates, t.kmeans, t.dlq) == (side.krr, side.rs, side.blap, side.estimates,
                                                                  side.kmeans, side.dlq)


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"anonymization.beta": 0}, r"option anonymization\.beta: expected an integer >= 1, got 0"),
    ({"anonymization.max_delay_seconds": -1.0}, r"option anonymization\.max_delay_seconds:.*-1\.0"),
    ({"anonymization.qi": ["age", "nope"]}, r"anonymization\.schema.*qi.*'nope'"),
    ({"side_paths.krr.epsilon": -1}, r"option side_paths\.krr\.epsilon: expected a number in \(0, inf\), got -1"),
    ({"side_paths.kmeans.window": 1}, r"option side_paths\.kmeans\.window"),
    ({"kafka.producer_client": "rdkafka"}, r"kafka\.producer_client.*confluent-kafka or kafka-python.*rdkafka"),
])
def test_engine_and_side_path_options_are_validated_at_load(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config.load(env={}, overrides=overrides)


def _people_schema(tmp_path: Path) -> Path:
    spec = {"name": "people", "record_id": "pid", "person_id": None, "attributes": [
        {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
        {"name": "diagnosis", "role": "sensitive", "type": "categorical", "values": ["a", "b"]}]}
    path = tmp_path / "people.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def test_a_custom_schema_needs_its_own_side_path_attributes(tmp_path: Path) -> None:
    schema = _people_schema(tmp_path)
    with pytest.raises(ConfigError, match=r"side_paths\.krr\.attributes.*'people'.*'sex'"):
        Config.load(env={}, overrides={"anonymization.schema": str(schema)})
    assert Config.load(env={}, overrides={"anonymization.schema": str(schema), "side_paths.enabled": False})
    ok = Config.load(env={}, overrides={
        "anonymization.schema": str(schema), "side_paths.krr.attributes": "diagnosis", "side_paths.rs.enabled": False,
        "side_paths.blap.attributes": "age", "side_paths.blap.categorical_attributes": "[]",
        "side_paths.kmeans.attributes": "age"})
    assert ok.side_paths.krr.attributes == ["diagnosis"]


@pytest.mark.parametrize("args", [
    ["--set", "side_paths.krr.epsilon=-1"],
    ["--schema", "SCHEMA"],
    ["--k", "1"],
])
def test_run_refuses_invalid_options_with_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    """Invalid options stop start-up before anything is started (no broker, no side paths without them)."""
    args = [str(_people_schema(tmp_path)) if a == "SCHEMA" else a for a in args]
    out = subprocess.run([sys.executable, "-m", "stream_anon", "run", "--metrics-port", "0", *args],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stream-anon run: option "), out.stderr
    assert "Traceback" not in out.stderr and "embedded Tansu" not in out.stdout + out.stderr


def test_malformed_yaml_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("anonymization: {k: [1,\n")
    with pytest.raises(ConfigError, match=r"config file .*c\.yaml: not valid YAML"):
        Config.load(f, env={})


def test_service_defaults_keep_the_threat_model() -> None:
    """Reuse off and l = 2 by default; the ledger beside the input (docs/threat-model.md)."""
    cfg = Config.load(env={})
    assert cfg.anonymization.zeta == 0 and cfg.anonymization.l == 2
    assert cfg.anonymization.engine_config(seed=0).zeta == 0
    assert cfg.topics.ledger_topic() == "adult.raw.ledger"
    assert Config.load(env={}, overrides={"topics.input": "x.raw"}).topics.ledger_topic() == "x.raw.ledger"
    assert Config.load(env={}, overrides={"topics.ledger": "audit.trail"}).topics.ledger_topic() == "audit.trail"
    assert Config.load(env={}, overrides={"anonymization.l": "null"}).anonymization.l is None  # knowingly
    with pytest.raises(ConfigError, match=r"topics: input, output and ledger topics must differ"):
        Config.load(env={}, overrides={"topics.ledger": "adult.anon"})


@pytest.mark.parametrize("zeta", ["1", "1000", "null"])
def test_cluster_reuse_is_refused_in_the_service_with_one_line(zeta: str) -> None:
    with pytest.raises(ConfigError, match=r"^option anonymization\.zeta: CASTLE's cluster reuse publishes single "
                                          r"records.*the service requires 0, got .*\(docs/threat-model\.md\)$"):
        Config.load(env={}, overrides={"anonymization.zeta": zeta})


def _schema_file(tmp_path: Path, sensitive: list[dict[str, object]]) -> Path:
    spec = {"name": "plain", "record_id": "pid", "attributes": [
        {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
        *sensitive]}
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.mark.parametrize(("sensitive", "needle"), [
    ([], r"option anonymization\.l: l-diversity \(default 2 in the service\) needs a sensitive attribute and "
         r"schema 'plain' has none; set anonymization\.l: null"),
    ([{"name": "flag", "role": "sensitive", "type": "categorical", "values": ["yes"]}],
     r"option anonymization\.l: expected at most the 1 distinct value\(s\) of the sensitive attribute 'flag' of "
     r"schema 'plain', got 2; set anonymization\.l: null"),
])
def test_a_schema_that_cannot_be_l_diverse_is_one_clear_error_naming_the_option(
        tmp_path: Path, sensitive: list[dict[str, object]], needle: str) -> None:
    schema = _schema_file(tmp_path, sensitive)
    with pytest.raises(ConfigError, match=needle):
        Config.load(env={}, overrides={"anonymization.schema": str(schema), "side_paths.enabled": False})
    cfg = Config.load(env={}, overrides={"anonymization.schema": str(schema), "side_paths.enabled": False,
                                         "anonymization.l": "null"})
    assert cfg.anonymization.l is None


@pytest.mark.parametrize("command", ["anonymize", "verify", "bench", "perturb", "estimate", "run", "demo",
                                     "udp-bridge", "report", "audit"])
def test_cli_registers_every_command_module(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every sub-command module is imported and registered (a module that cannot be imported is an error, never
    skipped): each command answers --help."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0 and f"usage: stream-anon {command}" in capsys.readouterr().out
