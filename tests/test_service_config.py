"""The service configuration: precedence flag > env > YAML > default, conversions, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_anon.cli import build_parser
from stream_anon.cli.service import config_from_args
from stream_anon.service.config import Config, ConfigError, env_name, env_to_option, option_names

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
    ({"anonymization.algorithm": "mondrian"}, "castle or ubdsa"),
    ({"anonymization.nope": 1}, "unknown option"),
    ({"service.metrics_port": 70000}, "service.metrics_port"),
    ({"topics.anon": "adult.raw"}, "must differ"),
])
def test_bad_values_name_the_option(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
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
