"""The service configuration: precedence flag > env > YAML > default, conversions, clear errors."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from waiting import wait_for

import stream_anon
from stream_anon.cli import CLIENT_LOGGERS, COMMAND_MODULES, build_parser, configure_logging
from stream_anon.cli import service as cli_service
from stream_anon.cli.service import (
    BOOTSTRAP_ENV,
    DEPRECATED_BOOTSTRAP_ENV,
    EMBEDDED_IDLE_FLUSH_SECONDS,
    bootstrap_servers_from_env,
    config_from_args,
    embedded_broker_defaults,
)
from stream_anon.config.settings import (
    Config,
    ConfigError,
    TopicSettings,
    env_name,
    env_to_option,
    option_names,
)
from stream_anon.config.side_paths import SideTopics
from stream_anon.core.datasets import DatasetError, read_adult_for_replay
from stream_anon.core.schema import adult_schema
from stream_anon.metrics.endpoint import MetricsEndpointError
from stream_anon.service.audit import collect_outputs

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
    ({"service.idle_flush_seconds": -1}, r"service.idle_flush_seconds: expected a number >= 0 \(0 = never\), got -1"),
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
    derived = cfg.with_options({"kafka.bootstrap_servers": "h:9092", "side_paths.krr.epsilon": "0.3"})
    assert derived.kafka.bootstrap_servers == "h:9092" and derived.side_paths.krr.epsilon == 0.3
    assert cfg.kafka.bootstrap_servers is None and cfg.side_paths.krr.epsilon is None  # unchanged
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


def test_a_custom_schema_takes_its_side_path_attributes_from_the_schema(tmp_path: Path) -> None:
    """Issue 20: a schema that declares no side-path attributes loads, with its side paths off (and said why);
    attributes listed in the configuration are still checked against the schema."""
    schema = _people_schema(tmp_path)
    cfg = Config.load(env={}, overrides={"anonymization.schema": str(schema)})
    assert cfg.side_paths.krr.attributes is None
    assert "schema 'people' declares no side-path attributes" in (cfg.side_paths_off() or "")
    with pytest.raises(ConfigError, match=r"side_paths\.krr\.attributes.*'people'.*'sex'"):
        Config.load(env={}, overrides={"anonymization.schema": str(schema), "side_paths.krr.attributes": "sex"})
    assert Config.load(env={}, overrides={"anonymization.schema": str(schema), "side_paths.enabled": False})
    ok = Config.load(env={}, overrides={
        "anonymization.schema": str(schema), "side_paths.krr.attributes": "diagnosis", "side_paths.rs.enabled": False,
        "side_paths.blap.attributes": "age", "side_paths.blap.categorical_attributes": "[]",
        "side_paths.kmeans.attributes": "age"})
    assert ok.side_paths.krr.attributes == ["diagnosis"]


@pytest.mark.integration
@pytest.mark.parametrize("args", [
    ["--set", "side_paths.krr.epsilon=-1"],
    ["--schema", "SCHEMA", "--set", "side_paths.krr.attributes=sex"],
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
                                         "anonymization.l": "null", "anonymization.t_closeness": "null"})
    assert cfg.anonymization.l is None


@pytest.mark.parametrize("command", ["anonymize", "verify", "bench", "perturb", "estimate", "run", "demo",
                                     "udp-bridge", "report", "audit"])
def test_cli_registers_every_command_module(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every sub-command module is imported and registered (a module that cannot be imported is an error, never
    skipped): each command answers --help."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0 and f"usage: stream-anon {command}" in capsys.readouterr().out


# ------------------------------------------------------------------ operator mistakes through the CLI (issue 11)
def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_ANON_")}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "stream_anon", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=full_env)


def _one_line_exit_2(out: subprocess.CompletedProcess[str], prefix: str) -> str:
    """The single stderr line of an operator mistake (exit 2, no traceback, nothing started)."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(lines) == 1 and lines[0].startswith(prefix), out.stderr
    assert "Traceback" not in out.stdout + out.stderr and "embedded Tansu" not in out.stdout + out.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket listens on (as a running stream-anon's endpoint would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def busy_ports() -> Iterator[tuple[int, int]]:
    """Two loopback ports other sockets listen on (a running stream-anon's main and side-path endpoints)."""
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        yield a.getsockname()[1], b.getsockname()[1]


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("topics.input", "bad topic!", "option topics.input: expected a Kafka topic name"),
    ("kafka.security_protocol", "TLS", "option kafka.security_protocol: expected PLAINTEXT, SSL,"),
    ("kafka.ssl_cafile", "/no/such/ca.pem", "option kafka.ssl_cafile: file '/no/such/ca.pem' does not exist"),
    ("kafka.linger_ms", -5, "option kafka.linger_ms: expected an integer in [0, 900000], got -5"),
])
def test_preflight_names_a_bad_option_before_a_busy_port(busy_ports: tuple[int, int], option: str, value: object,
                                                        needle: str) -> None:
    """Issue 16: with both metrics ports held by another process, a bad option is still reported as the bad
    option (the ports are checked last); with good options the busy ports are reported, each by its option."""
    main, side = busy_ports
    ports = {"service.metrics_port": main, "service.side_metrics_port": side}
    with pytest.raises(ConfigError, match=re.escape(needle)):
        cli_service.preflight(Config.load(env={}, overrides={**ports, option: value}))
    with pytest.raises(MetricsEndpointError, match=rf"option service\.metrics_port: port {main} .* in use"):
        cli_service.preflight(Config.load(env={}, overrides=ports))
    with pytest.raises(MetricsEndpointError,
                       match=rf"option service\.side_metrics_port: port {side} .* in use"):
        cli_service.preflight(Config.load(env={}, overrides={**ports, "service.metrics_port": 0}))


def test_demo_names_a_bad_run_dir_before_a_busy_port(busy_ports: tuple[int, int], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    main, side = busy_ports
    args = build_parser().parse_args(["demo", "--metrics-port", str(main), "--set", f"service.side_metrics_port={side}",
                                      "--run-dir", str(f)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert f"stream-anon demo: --run-dir: cannot create directory {str(f)!r}" in err and "in use" not in err, err


@pytest.mark.integration
@pytest.mark.parametrize("command", ["run", "demo"])
def test_metrics_port_in_use_is_one_line_and_exit_2_before_anything_starts(command: str, busy_port: int,
                                                                           tmp_path: Path) -> None:
    extra = ["--run-dir", str(tmp_path / "run"), "--synthetic"] if command == "demo" else []
    line = _one_line_exit_2(_cli(command, "--metrics-port", str(busy_port), *extra), f"stream-anon {command}: ")
    assert f"option service.metrics_port: port {busy_port} on 127.0.0.1 is already in use" in line
    assert "0 to turn the metrics endpoint off" in line


@pytest.mark.integration
def test_udp_bridge_metrics_port_in_use_is_one_line_and_exit_2(busy_port: int) -> None:
    line = _one_line_exit_2(_cli("udp-bridge", "--listen", "127.0.0.1:0", "--sink", "null", "--metrics-port",
                                 str(busy_port), "--max-seconds", "5"), "stream-anon udp-bridge: ")
    assert f"option --metrics-port: port {busy_port} on 127.0.0.1 is already in use" in line


@pytest.mark.integration
def test_side_metrics_port_in_use_or_shared_is_refused(busy_port: int) -> None:
    line = _one_line_exit_2(_cli("run", "--metrics-port", "0", "--set", f"service.side_metrics_port={busy_port}"),
                            "stream-anon run: ")
    assert "option service.side_metrics_port" in line and "already in use" in line
    line = _one_line_exit_2(_cli("run", "--metrics-port", "9311", "--set", "service.side_metrics_port=9311"),
                            "stream-anon run: ")
    assert "service.metrics_port and service.side_metrics_port: both 9311" in line


@pytest.mark.integration
@pytest.mark.parametrize(("args", "needle"), [
    (["--metrics-addr", "no-such-host.invalid"], "option service.metrics_addr: cannot resolve 'no-such-host.invalid'"),
    (["--metrics-addr", "192.0.2.1"], "option service.metrics_addr: '192.0.2.1' is not an address of this machine"),
    (["--security-protocol", "TLS"], "option kafka.security_protocol: expected PLAINTEXT, SSL, SASL_PLAINTEXT, "
                                     "SASL_SSL, got 'TLS'"),
    (["--set", "kafka.sasl_mechanism=MD5"], "option kafka.sasl_mechanism"),
    (["--set", "kafka.ssl_cafile=/no/such/ca.pem"], "option kafka.ssl_cafile: file '/no/such/ca.pem' does not exist"),
    (["--input-topic", "bad topic!"], "option topics.input: expected a Kafka topic name"),
    (["--set", "kafka.session_timeout_ms=-1"], "option kafka.session_timeout_ms: expected an integer > 100, got -1"),
    (["--set", "kafka.request_timeout_ms=0"], "option kafka.fetch_max_wait_ms: expected an integer >= 0 below"),
    (["--set", "kafka.compression_type=foo"], "option kafka.compression_type: expected gzip, snappy, lz4, zstd"),
    (["--set", "kafka.linger_ms=-5"], "option kafka.linger_ms: expected an integer in [0, 900000], got -5"),
    (["--set", "kafka.max_request_size=10"], "option kafka.max_request_size"),
    (["--k", "ten"], "error: argument --k: invalid int value: 'ten'"),
    (["--config", "/no/such/config.yaml"], "config file '/no/such/config.yaml' does not exist"),
])
def test_bad_run_flags_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    line = _one_line_exit_2(_cli("run", "--metrics-port", "0", *args), "stream-anon run")
    assert needle in line, line


@pytest.mark.integration
@pytest.mark.parametrize(("args", "needle"), [
    (["--records", "0"], "argument --records: expected an integer >= 1, got '0'"),
    (["--records", "-5"], "argument --records: expected an integer >= 1, got '-5'"),
    (["--rate", "-1"], "argument --rate: expected a number >= 0, got '-1'"),
    (["--timeout", "0"], "argument --timeout: expected a number > 0, got '0'"),
    (["--timeout", "nan"], "argument --timeout: expected a number > 0, got 'nan'"),
])
def test_bad_demo_flags_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    line = _one_line_exit_2(_cli("demo", "--metrics-port", "0", *args), "stream-anon demo")
    assert needle in line, line


@pytest.mark.integration
def test_demo_run_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    line = _one_line_exit_2(_cli("demo", "--metrics-port", "0", "--run-dir", str(f)), "stream-anon demo: ")
    assert f"--run-dir: cannot create directory {str(f)!r}" in line


def _adult_variants(adult_path: Path, tmp_path: Path) -> dict[str, Path]:
    lines = adult_path.read_text(encoding="utf-8").splitlines(keepends=True)
    head = tmp_path / "head.data"
    head.write_text("".join(lines[:1000]), encoding="utf-8")
    cut = tmp_path / "cut.data"
    cut.write_bytes(adult_path.read_bytes()[:100_000])  # ends in the middle of line 821
    wrong = tmp_path / "adult.test"
    wrong.write_text("|1x3 Cross validator\n" + "".join(lines[:50]), encoding="utf-8")
    return {"head": head, "cut": cut, "wrong": wrong, "missing": tmp_path / "nowhere.data", "dir": tmp_path}


@pytest.mark.integration
@pytest.mark.parametrize("via", ["--adult", "$STREAM_ANON_ADULT"])
@pytest.mark.parametrize(("variant", "needle"), [
    ("missing", "does not exist (from {via})"),
    ("dir", "(from {via}) is a directory"),
    ("head", "(from {via}) holds 1,000 records, fewer than the 32,561 of the UCI adult.data"),
    ("cut", "(from {via}): line 821 has fewer than 15 fields (sha256 "),
    ("wrong", "(from {via}): line 1 has fewer than 15 fields"),
])
def test_demo_names_the_adult_file_its_origin_and_what_is_wrong(adult_path: Path, tmp_path: Path, via: str,
                                                                variant: str, needle: str) -> None:
    path = _adult_variants(adult_path, tmp_path)[variant]
    args = ["demo", "--metrics-port", "0", "--no-side-paths", "--run-dir", str(tmp_path / "run")]
    if via == "--adult":
        out = _cli(*args, "--adult", str(path))
    else:
        out = _cli(*args, env={"STREAM_ANON_ADULT": str(path)})
    line = _one_line_exit_2(out, "stream-anon demo: ")
    assert needle.format(via=via) in line, line
    assert str(path) in line


def test_demo_short_file_with_records_it_holds_is_accepted(adult_path: Path, tmp_path: Path) -> None:
    """A short file is refused only when more records are asked of it than it holds (here: in-process)."""
    head = _adult_variants(adult_path, tmp_path)["head"]
    df, warning = read_adult_for_replay(head, origin="--adult", records=600)
    assert len(df) == 600 and warning is not None and "not the UCI adult.data" in warning
    with pytest.raises(DatasetError, match=r"holds 1,000 records, fewer than the 2,000 asked for with --records"):
        read_adult_for_replay(head, origin="--adult", records=2000)
    full, warning = read_adult_for_replay(adult_path, origin="$STREAM_ANON_ADULT")
    assert len(full) == 32561 and warning is None


@pytest.mark.integration
def test_version_comes_from_the_package_metadata() -> None:
    out = _cli("--version")
    assert out.returncode == 0, out.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert out.stdout.startswith(f"stream-anon {version} (Python "), out.stdout
    assert importlib.metadata.version("stream-anon") == version == stream_anon.__version__


@pytest.mark.integration
def test_bad_log_level_and_unknown_command_are_one_line() -> None:
    line = _one_line_exit_2(_cli("--log-level", "LOUD", "run"), "stream-anon: error: argument --log-level")
    assert "'LOUD'" in line
    _one_line_exit_2(_cli("nonsense"), "stream-anon: error: argument COMMAND: invalid choice: 'nonsense'")


def test_client_library_loggers_are_quiet_unless_debug() -> None:
    saved = {n: (logging.getLogger(n).level, logging.getLogger(n).propagate) for n in ("", *CLIENT_LOGGERS)}
    seen: list[str] = []

    class Catcher(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    catcher = Catcher()
    logging.getLogger().addHandler(catcher)
    try:
        configure_logging("INFO")  # issue 20: the client libraries' own lines never reach the output but at DEBUG
        logging.getLogger("kafka.net.selector").warning("Task ran for 0.2 s. It is blocking the event loop")
        logging.getLogger("kafka").critical("client chatter")
        logging.getLogger("librdkafka").error("client chatter")
        logging.getLogger("stream_anon.service.app").info("our own line")
        assert seen == ["our own line"]
        # the records are still made from WARNING up: the filters on the client loggers (the receive-limit lines that
        # arm the oversize search of a kafka-python consumer) see them
        assert logging.getLogger("kafka.consumer.fetcher").isEnabledFor(logging.ERROR)
        seen.clear()
        logging.getLogger().setLevel(logging.DEBUG)
        configure_logging("DEBUG")
        logging.getLogger("kafka.conn").debug("debug chatter")
        assert seen == ["debug chatter"]
        assert logging.getLogger("librdkafka").isEnabledFor(logging.DEBUG)
    finally:
        logging.getLogger().removeHandler(catcher)
        for n, (level, propagate) in saved.items():
            logging.getLogger(n).setLevel(level)
            logging.getLogger(n).propagate = propagate


def test_closing_clients_cancelled_metadata_refresh_is_not_an_error_line() -> None:
    """kafka-python logs ``ERROR Metadata refresh: failed Cancelled`` when a client closes during its periodic
    metadata request (issue 11: two such lines ended every demo); other metadata errors still show."""
    from kafka.errors import Cancelled, KafkaTimeoutError

    configure_logging("INFO")
    configure_logging("INFO")  # idempotent: one filter
    cluster = logging.getLogger("kafka.cluster")
    assert sum(type(f).__name__ == "CancelledMetadataRefresh" for f in cluster.filters) == 1
    seen: list[str] = []

    class Catcher(logging.Handler):  # on the logger itself (caplog's handlers sit on the root and, from pytest 9,
        def emit(self, record: logging.LogRecord) -> None:  # on the loggers that did not propagate when the test
            seen.append(record.getMessage())  # began: one record could reach them twice)

    catcher = Catcher()
    cluster.addHandler(catcher)
    try:
        cluster.error("Metadata refresh: failed %s", Cancelled())
        cluster.error("Metadata refresh: failed %s", KafkaTimeoutError("no answer"))
    finally:
        cluster.removeHandler(catcher)
    assert seen == ["Metadata refresh: failed KafkaTimeoutError: no answer"]


# ------------------------------------------------------------------ one name for the bootstrap servers variable
def test_deprecated_bootstrap_variable_is_used_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_service, "_warned", set())
    monkeypatch.delenv(BOOTSTRAP_ENV, raising=False)
    monkeypatch.setenv(DEPRECATED_BOOTSTRAP_ENV, "old:9092")
    cfg = config_from_args(build_parser().parse_args(["run"]), prog="stream-anon run")
    assert cfg.kafka.bootstrap_servers == "old:9092"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$STREAM_ANON_BOOTSTRAP_SERVERS is deprecated (used)" in err
    assert f"set ${BOOTSTRAP_ENV} instead" in err
    monkeypatch.setattr(cli_service, "_warned", set())
    monkeypatch.setenv(BOOTSTRAP_ENV, "new:9092")  # the config's own name wins
    assert config_from_args(build_parser().parse_args(["run"])).kafka.bootstrap_servers == "new:9092"
    assert "deprecated (ignored" in capsys.readouterr().err
    monkeypatch.setattr(cli_service, "_warned", set())
    cfg = config_from_args(build_parser().parse_args(["run", "--bootstrap-servers", "flag:9092"]))
    assert cfg.kafka.bootstrap_servers == "flag:9092"
    assert bootstrap_servers_from_env("tool", {DEPRECATED_BOOTSTRAP_ENV: "old:1"}) == "old:1"
    assert bootstrap_servers_from_env("tool", {BOOTSTRAP_ENV: "new:1", DEPRECATED_BOOTSTRAP_ENV: "old:1"}) == "new:1"
    assert bootstrap_servers_from_env("tool", {}) is None


def test_only_the_alias_helper_reads_the_deprecated_variable() -> None:
    users = []
    for path in [*ROOT.glob("stream_anon/**/*.py"), *ROOT.glob("replay_tools/**/*.py"), *ROOT.glob("deploy/**/*"),
                 *ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "config.example.yaml"]:
        if path.is_file() and DEPRECATED_BOOTSTRAP_ENV in path.read_text(encoding="utf-8", errors="replace"):
            users.append(str(path.relative_to(ROOT)))
    assert users == ["stream_anon/cli/service.py"], users


# ------------------------------------------------------------------ idle flush with the embedded broker
@pytest.mark.parametrize(("args", "env", "file_text", "expected"), [
    ([], {}, None, EMBEDDED_IDLE_FLUSH_SECONDS),
    (["--idle-flush-seconds", "0"], {}, None, 0.0),
    (["--set", "service.idle_flush_seconds=2"], {}, None, 2.0),
    ([], {"STREAM_ANON_SERVICE_IDLE_FLUSH_SECONDS": "0"}, None, 0.0),
    ([], {}, "service: {idle_flush_seconds: 0}\n", 0.0),
    ([], {}, "service: {idle-flush-seconds: 1.5}\n", 1.5),
    (["--bootstrap-servers", "h:9092"], {}, None, 0.0),  # an external broker keeps its records: no default
])
def test_embedded_broker_idle_flush_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                            env: dict[str, str], file_text: str | None, expected: float) -> None:
    for name in list(os.environ):
        if name.startswith("STREAM_ANON_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if file_text is not None:
        f = tmp_path / "c.yaml"
        f.write_text(file_text)
        args = [*args, "--config", str(f)]
    parsed = build_parser().parse_args(["run", *args])
    cfg, notes = embedded_broker_defaults(config_from_args(parsed), parsed)
    assert cfg.service.idle_flush_seconds == expected
    assert bool(notes) == (expected == EMBEDDED_IDLE_FLUSH_SECONDS and not args)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_run_with_its_embedded_broker_releases_a_replay_sent_without_end_marker(adult_path: Path,
                                                                                tmp_path: Path) -> None:
    """``run`` + embedded broker + a finite replay with ``--no-flush``: the idle-flush default releases (or
    suppresses) every record, so a SIGTERM afterwards loses none of them."""
    log = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_ANON_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stream_anon", "run", "--metrics-port", "0", "--no-side-paths",
                                 "--k", "5", "--delta", "400"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env)
    try:

        def embedded_bootstrap() -> str | None:
            text = log.read_text()
            m = re.search(r"embedded Tansu broker on (127\.0\.0\.1:\d+)", text)
            return m.group(1) if m and "assigned partitions" in text else None

        bootstrap = wait_for(embedded_bootstrap, 90, "the embedded broker and the partitions assigned",
                             alive=lambda: proc.poll() is None, context=log.read_text)
        assert f"a partition quiet for {EMBEDDED_IDLE_FLUSH_SECONDS:g} s is flushed" in log.read_text()
        n = 1200
        replay = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--adult", str(adult_path), "--limit",
                                 str(n), "--bootstrap-servers", bootstrap, "--no-flush", "--no-progress"],
                                capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert replay.returncode == 0, replay.stderr
        schema = adult_schema()
        deadline = time.monotonic() + 90
        while True:
            snap = collect_outputs(bootstrap, input_topic="adult.raw", anon="adult.anon", suppressed="adult.suppressed",
                                   dlq="adult.dlq",
                                   qis=[a.name for a in schema.qis], sensitive=["income"], timeout_s=20, idle_s=0.2)
            accounted = len(snap.records)
            if accounted >= n or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert accounted == n, f"{accounted} of {n} records released or suppressed; log:\n{log.read_text()[-3000:]}"
        assert "idle for" in log.read_text()  # released by the idle flush, not by an end-of-stream marker
        assert not snap.records.duplicated(["src_partition", "src_offset"]).any()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0, log.read_text()[-3000:]


def test_every_cli_module_with_a_register_function_is_a_command_module() -> None:
    """The dispatcher imports its sub-command modules statically (``COMMAND_MODULES``): a new module under
    ``stream_anon/cli`` must be listed there, or its commands would be silently missing."""
    listed = {m.__name__.rsplit(".", 1)[1] for m in COMMAND_MODULES}
    defines_register = set()
    for path in sorted((ROOT / "stream_anon" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body):
            defines_register.add(path.stem)
    assert defines_register == listed


def test_the_loss_confirmation_window_is_an_option_defaulting_to_the_guards_constant() -> None:
    """``service.loss_confirm_seconds``: how long an end below a floor is read again before it is a loss (exit 4);
    by default the broker guard's ``HIGHWATER_CONFIRM_SECONDS``, 0 allowed (the first read decides), never negative."""
    from stream_anon.service.broker_guard import HIGHWATER_CONFIRM_SECONDS

    assert Config().service.loss_confirm_seconds == HIGHWATER_CONFIRM_SECONDS
    assert Config.load(env={}, overrides={"service.loss_confirm_seconds": "1"}).service.loss_confirm_seconds == 1.0
    assert Config.load(env={}, overrides={"service.loss_confirm_seconds": "0"}).service.loss_confirm_seconds == 0.0
    with pytest.raises(ConfigError, match="loss_confirm_seconds"):
        Config.load(env={}, overrides={"service.loss_confirm_seconds": "-1"})
