"""Static checks of deploy/: promtool (real binary), rules and dashboard vs the metrics module, compose, Dockerfile.

No Docker engine runs in CI, so the compose stack and the image are validated by reading them: YAML parses,
every referenced file exists, images are pinned, every service has a healthcheck or a documented reason,
the service's STREAM_ANON_* variables are real config options, ports agree across files.  The live
cross-check against a running service and a real Prometheus server is tests/test_deploy_live.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_support import (
    COMPOSE_YML,
    DASHBOARD_JSON,
    DEPLOY,
    DOCKERFILE,
    ENV_EXAMPLE,
    GRAFANA_DASHBOARD_PROVIDERS,
    GRAFANA_DATASOURCES,
    PROMETHEUS_SYNTHETIC,
    PROMETHEUS_YML,
    REPO,
    RULES_TEST_YML,
    RULES_YML,
    alert_rules,
    dashboard,
    dashboard_exprs,
    dashboard_panels,
    declared_series,
    load_yaml,
    promql_metric_names,
    recording_rule_names,
    require_tool,
    rule_exprs,
)
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config, TopicSettings, env_to_option
from stream_anon.metrics.definitions import METRIC_NAMES, ServiceMetrics


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def _module_series() -> dict[str, str]:
    families = [(m.name, m.type) for m in ServiceMetrics(CollectorRegistry()).registry.collect()]
    return declared_series(families)


# ----------------------------------------------------------------------------------------------- promtool
@pytest.mark.integration
def test_promtool_check_config() -> None:
    r = _promtool("check", "config", str(PROMETHEUS_YML))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@pytest.mark.integration
def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES_YML))
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(load_yaml(RULES_YML)["groups"][0]["rules"]) + len(load_yaml(RULES_YML)["groups"][1]["rules"])
    assert f"SUCCESS: {n} rules found" in r.stdout


@pytest.mark.integration
def test_promtool_rule_unit_tests_fire_every_alert() -> None:
    r = _promtool("test", "rules", str(RULES_TEST_YML))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    spec = load_yaml(RULES_TEST_YML)
    assert spec["rule_files"] == ["rules.yml"]
    fired: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for t in spec["tests"]:
        for a in t.get("alert_rule_test", []):
            target = fired if a.get("exp_alerts") else quiet
            target[a["alertname"]] = target.get(a["alertname"], 0) + 1
            for exp in a.get("exp_alerts") or []:  # annotations are checked exactly, not left out
                assert {"summary", "description"} <= set(exp.get("exp_annotations", {})), a["alertname"]
    names = {r["alert"] for r in alert_rules()}
    assert names == set(fired), f"alerts without a firing test: {names - set(fired)}"
    assert names == set(quiet), f"alerts without a quiet (negative) test: {names - set(quiet)}"
    # and every recording rule is evaluated against a hand-computed value
    tested = {e["expr"] for t in spec["tests"] for e in t.get("promql_expr_test", [])}
    assert recording_rule_names() <= tested, recording_rule_names() - tested


@pytest.mark.integration
@pytest.mark.slow
def test_rule_unit_tests_catch_a_broken_alert(tmp_path: Path) -> None:
    """Replacing any alert's expression by one that never fires makes `promtool test rules` fail."""
    import copy
    from concurrent.futures import ThreadPoolExecutor

    import yaml

    rules_doc = load_yaml(RULES_YML)
    names = [r["alert"] for g in rules_doc["groups"] for r in g["rules"] if "alert" in r]

    def broken(alert: str) -> int:
        doc = copy.deepcopy(rules_doc)
        for g in doc["groups"]:
            for r in g["rules"]:
                if r.get("alert") == alert:
                    r["expr"] = "vector(0) > 1"
        d = tmp_path / alert
        d.mkdir()
        (d / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        (d / RULES_TEST_YML.name).write_text(RULES_TEST_YML.read_text(encoding="utf-8"), encoding="utf-8")
        return _promtool("test", "rules", str(d / RULES_TEST_YML.name)).returncode

    with ThreadPoolExecutor(max_workers=2) as pool:
        codes = dict(zip(names, pool.map(broken, names), strict=True))
    assert all(rc != 0 for rc in codes.values()), {a: rc for a, rc in codes.items() if rc == 0}


# ----------------------------------------------------------------------------------------------- alerts
REQUIRED_ALERTS = {
    # alert: metrics its expression must use
    "StreamAnonServiceDown": {"up"},
    "StreamAnonConsumerLagGrowing": {"stream_anon_consumer_lag"},
    "StreamAnonReleaseDelayNearBound": {"stream_anon_release_delay_arrivals_bucket", "stream_anon_delay_bound_arrivals"},
    "StreamAnonDeadLetterRateHigh": {"stream_anon_records_dead_lettered_total", "stream_anon_records_consumed_total"},
    "StreamAnonPrivacyBudgetNearlyExhausted": {"stream_anon_epsilon_budget_remaining",
                                               "stream_anon_epsilon_budget_total"},
    "StreamAnonKAnonymityViolation": {"stream_anon_k_anonymity_violations_total"},
    "StreamAnonInternalError": {"stream_anon_internal_errors_total"},
    "StreamAnonPrivacyBudgetExhausted": {"stream_anon_side_outputs_refused_total"},
    "StreamAnonStalled": {"stream_anon_seconds_since_progress", "stream_anon_consumer_lag"},
}


def test_required_alerts_exist_with_summary_description_and_severity() -> None:
    by_name = {r["alert"]: r for r in alert_rules()}
    for name, metrics in REQUIRED_ALERTS.items():
        assert name in by_name, f"alert {name} missing from rules.yml"
        assert metrics <= promql_metric_names(by_name[name]["expr"]), (name, by_name[name]["expr"])
    for name, r in by_name.items():
        assert r["labels"]["severity"] in ("warning", "critical"), name
        ann = r["annotations"]
        assert ann.get("summary", "").strip(), f"{name}: no summary"
        desc = ann.get("description", "")
        # a description says what happened AND what to do: long enough, with an imperative next step
        assert len(desc) >= 200, f"{name}: description too short to say what to do ({len(desc)} chars)"
        assert re.search(r"\b(Check|Stop|Raise|Read|Decide|Look|restart|scale|fix)\b", desc), name


# ----------------------------------------------------------------------------------------------- PromQL names
@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (job, le) (rate(stream_anon_release_delay_arrivals_bucket{job=~"$job"}[$__rate_interval]))',
     {"stream_anon_release_delay_arrivals_bucket"}),
    ("histogram_quantile(0.99, sum(rate(a_bucket[5m])) by (le)) > on (job) 0.9 * max by (job) (b)", {"a_bucket", "b"}),
    ('up{job="stream-anon"} == 0', {"up"}),
    ("x / (y > 0) < 0.1 and (max_over_time(x[1d]) > x)", {"x", "y"}),
    ("sum(job:stream_anon_records_consumed:rate1m) offset 5m + 1e3", {"job:stream_anon_records_consumed:rate1m"}),
    ('label_replace(z, "dst", "$1", "src", "(.*)")', {"z"}),
])
def test_promql_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def _check_names(where: str, names: set[str], series: dict[str, str], records: set[str]) -> list[str]:
    bad = []
    for n in sorted(names):
        if ":" in n:
            if n not in records:
                bad.append(f"{where}: recording rule {n} is not defined in rules.yml")
        elif n not in series and n not in PROMETHEUS_SYNTHETIC:
            bad.append(f"{where}: metric {n} is not exported by stream_anon.metrics.definitions")
    return bad


def test_rule_and_dashboard_metrics_exist_in_the_metrics_module() -> None:
    series = _module_series()
    # the module's METRIC_NAMES agrees with what its registry exposes
    for name in METRIC_NAMES:
        assert name in series or name + "_bucket" in series, name
    records = recording_rule_names()
    bad = []
    for where, expr in rule_exprs() + dashboard_exprs():
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        bad += _check_names(where, names, series, records)
    assert not bad, "\n".join(bad)


DASHBOARD_MUST_SHOW = {
    "throughput in/out": {"stream_anon_records_consumed_total", "stream_anon_records_released_total"},
    "lag": {"stream_anon_consumer_lag"},
    "progress": {"stream_anon_seconds_since_progress"},
    "delay quantiles vs bound": {"stream_anon_release_delay_arrivals_bucket", "stream_anon_delay_bound_arrivals"},
    "information loss": {"stream_anon_gt_loss", "stream_anon_class_information_loss_sum"},
    "class sizes": {"stream_anon_class_size_bucket"},
    "buffer": {"stream_anon_buffered_records", "stream_anon_open_clusters"},
    "DLQ and suppression": {"stream_anon_records_dead_lettered_total", "stream_anon_records_suppressed_total"},
    "gate refusals and internal errors": {"stream_anon_k_anonymity_violations_total",
                                          "stream_anon_internal_errors_total"},
    "eps per side topic": {"stream_anon_epsilon_per_record", "stream_anon_epsilon_budget_remaining"},
    "estimate errors": {"stream_anon_estimate_standard_error", "stream_anon_estimate_abs_error"},
    "UDP gaps": {"stream_anon_udp_gaps_total"},
}


def test_dashboard_panels_have_datasource_and_queries() -> None:
    d = dashboard()
    uid = load_yaml(next(GRAFANA_DATASOURCES.glob("*.yml")))["datasources"][0]["uid"]
    panels = dashboard_panels(d)
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"]), "panel ids repeat"
    assert len(panels) >= 10
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        assert all(k in p["gridPos"] for k in ("h", "w", "x", "y")), p["title"]
        for t in p["targets"]:
            assert str(t.get("expr", "")).strip(), f"panel {p['title']!r} target {t.get('refId')} has no expr"
            assert t["datasource"]["uid"] == uid, p["title"]
    used = set().union(*(promql_metric_names(e) for _, e in dashboard_exprs(d)))
    for what, metrics in DASHBOARD_MUST_SHOW.items():
        assert metrics <= used, f"dashboard lacks {what}: {metrics - used}"
    bound_panels = [p for p in panels if any("stream_anon_delay_bound_arrivals" in t["expr"] for t in p["targets"])
                    and any("stream_anon_release_delay_arrivals_bucket" in t["expr"] for t in p["targets"])]
    assert bound_panels, "no panel draws the delay quantiles against the bound in one graph"


def test_grafana_provisioning_matches_compose() -> None:
    compose = load_yaml(COMPOSE_YML)
    ds_files = sorted(GRAFANA_DATASOURCES.glob("*.yml"))
    assert ds_files
    ds = load_yaml(ds_files[0])["datasources"]
    assert [x["type"] for x in ds] == ["prometheus"]
    assert ds[0]["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
    providers = load_yaml(next(GRAFANA_DASHBOARD_PROVIDERS.glob("*.yml")))["providers"]
    mounts = {_split_volume(v)[1]: _split_volume(v)[0] for v in compose["services"]["grafana"]["volumes"]
              if v.startswith(".")}
    for prov in providers:
        path = prov["options"]["path"]
        assert path in mounts, f"dashboard provider path {path} is not mounted into grafana"
        assert (DEPLOY / mounts[path] / DASHBOARD_JSON.name).is_file()
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{providers[0]['options']['path']}/{DASHBOARD_JSON.name}"


# ----------------------------------------------------------------------------------------------- compose
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def _env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _substitute(value: Any, env: dict[str, str]) -> Any:
    """Compose interpolation with deploy/.env = .env.example (as the docs tell users to do)."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1), m.group(3) or ""), value)
    if isinstance(value, list):
        return [_substitute(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, env) for k, v in value.items()}
    return value


def test_compose_variables_are_documented_in_env_example() -> None:
    text = COMPOSE_YML.read_text(encoding="utf-8")
    used = {m.group(1) for m in _VAR.finditer(text)}
    env = _env_example()
    assert used - set(env) == set(), f"variables used in compose but not in .env.example: {used - set(env)}"
    assert set(env) - used == set(), f".env.example documents unused variables: {set(env) - used}"
    assert all(env.values()), [k for k, v in env.items() if not v]


def _image_pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":") if "@" not in image else (image, ":", "digest")
    return bool(name) and tag not in ("", "latest") and bool(re.search(r"\d", tag)) and "/" not in tag


def _split_volume(vol: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume; the source may be a ${VAR:?message} interpolation."""
    if vol.startswith("${"):
        end = vol.index("}") + 1
        return vol[:end], vol[end + 1:].split(":")[0]
    parts = vol.split(":")
    return parts[0], parts[1]


def test_compose_services_images_healthchecks_and_dependencies() -> None:
    raw = load_yaml(COMPOSE_YML)
    compose = _substitute(raw, _env_example())
    services = compose["services"]
    assert {"kafka", "kafka-topics", "stream-anon", "replay", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc, f"{name}: no image"
        assert _image_pinned(svc["image"]), f"{name}: image {svc['image']!r} is not pinned to a version tag"
        raw_image = raw["services"][name]["image"]
        assert "latest" not in raw_image and (":" in raw_image), f"{name}: {raw_image!r}"
        reason = svc.get("x-no-healthcheck-reason")
        if reason is None:
            hc = svc.get("healthcheck")
            assert hc and hc.get("test") and not hc.get("disable"), f"{name}: no healthcheck and no reason"
            assert svc.get("restart") == "unless-stopped", f"{name}: long-running service should restart"
        else:
            assert len(reason.strip()) >= 40, f"{name}: x-no-healthcheck-reason must explain why"
            assert "healthcheck" not in svc
            assert svc.get("restart") == "no", f"{name}: a job without healthcheck must be one-shot"
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            target = services[dep]
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in target, f"{name} waits for {dep} healthy, but {dep} has no healthcheck"
            elif cond["condition"] == "service_completed_successfully":
                assert "x-no-healthcheck-reason" in target, f"{dep} is not a one-shot job"
            if "profiles" not in svc:
                assert "profiles" not in target, f"{name} (default profile) depends on profile-only {dep}"
    # the built image: every service running it builds it (nothing pulls the local-only tag)
    for name, svc in services.items():
        if svc["image"].startswith("stream-anon:"):
            build = svc["build"]
            context = (DEPLOY / build["context"]).resolve()
            assert context == REPO and (context / build["dockerfile"]).resolve() == DOCKERFILE.resolve(), name
        else:
            assert "build" not in svc, name
    # bind mounts exist (host paths given by variables are the user's: documented in .env.example)
    for name, svc in raw["services"].items():
        for vol in svc.get("volumes", []):
            src, target = _split_volume(vol)
            assert target.startswith("/"), f"{name}: volume target {target!r}"
            if src.startswith("."):
                assert (DEPLOY / src).exists(), f"{name}: mounted {src} does not exist"
            elif src.startswith("${"):
                m = _VAR.fullmatch(src)
                assert m is not None and m.group(1) in _env_example(), f"{name}: {src}"
            else:
                assert src in raw.get("volumes", {}), f"{name}: named volume {src} not declared"


def test_compose_kafka_is_kraft_with_the_official_image() -> None:
    compose = load_yaml(COMPOSE_YML)
    kafka = compose["services"]["kafka"]
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", kafka["image"])
    env = kafka["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@kafka:")
    assert not any("ZOOKEEPER" in key for svc in compose["services"].values() for key in svc.get("environment", {}))
    assert compose["services"]["kafka-topics"]["image"] == kafka["image"]


@pytest.mark.integration
def test_topic_job_creates_the_services_topics_with_matching_partitions() -> None:
    compose = load_yaml(COMPOSE_YML)
    job = compose["services"]["kafka-topics"]
    script_src, script_target = _split_volume(next(v for v in job["volumes"] if v.startswith("./kafka/")))
    script = DEPLOY / script_src
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text(encoding="utf-8")
    assert script_target in job["entrypoint"]
    # the per-record outputs get the input's partition count, the periodic ones a single partition
    per_record = re.search(r"for suffix in ([a-z ]+); do\s+create \"\$PREFIX\.\$suffix\" \"\$PARTITIONS\"", text)
    single = re.search(r"for suffix in ([a-z ]+); do\s+create \"\$PREFIX\.\$suffix\" 1", text)
    assert per_record and single, "create-topics.sh layout changed"
    defaults = TopicSettings()
    ledger = re.search(r'create "\$INPUT_TOPIC\.ledger" "\$PARTITIONS" --config cleanup\.policy=compact', text)
    assert ledger, "create-topics.sh must create the ledger compacted, with the input's partitions"
    created = {f"adult.{s}" for s in per_record.group(1).split() + single.group(1).split()} | {defaults.input,
                                                                                              "adult.raw.ledger"}
    expected = {defaults.input, defaults.ledger_topic(), *defaults.outputs().values(), *defaults.side().values()}
    assert created == expected, f"topics created {sorted(created)} != the service's {sorted(expected)}"
    assert {f"adult.{s}" for s in single.group(1).split()} == {defaults.estimates, defaults.kmeans}
    assert job["environment"]["INPUT_PARTITIONS"] == "${INPUT_PARTITIONS:-4}"


def test_compose_service_environment_is_valid_service_config() -> None:
    compose = _substitute(load_yaml(COMPOSE_YML), _env_example())
    env = {k: str(v) for k, v in compose["services"]["stream-anon"]["environment"].items()}
    unknown = [k for k in env if env_to_option(k) is None]
    assert not unknown, f"not stream-anon config options: {unknown}"
    cfg = Config.load(None, env=env)  # raises ConfigError on a bad value
    assert cfg.kafka.bootstrap_servers == "kafka:9092"
    assert cfg.service.metrics_addr == "0.0.0.0"
    # the same ports everywhere: service config, compose, Prometheus scrape targets, Dockerfile
    ports = {cfg.service.metrics_port, cfg.service.side_metrics_port}
    hc = " ".join(compose["services"]["stream-anon"]["healthcheck"]["test"])
    assert f":{cfg.service.metrics_port}/metrics" in hc
    assert {int(p) for p in compose["services"]["stream-anon"]["expose"]} == ports
    prom = load_yaml(PROMETHEUS_YML)
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "stream-anon")
    assert all(sd["names"] == ["stream-anon"] for sd in job["dns_sd_configs"])
    assert {sd["port"] for sd in job["dns_sd_configs"]} == ports
    docker = DOCKERFILE.read_text(encoding="utf-8")
    expose = next(line for line in docker.splitlines() if line.startswith("EXPOSE"))
    assert {int(p) for p in expose.split()[1:]} == ports
    assert f"STREAM_ANON_SERVICE_METRICS_PORT={cfg.service.metrics_port}" in docker
    assert f"STREAM_ANON_SERVICE_SIDE_METRICS_PORT={cfg.service.side_metrics_port}" in docker
    # the UDP bridge job scrapes the port the bridge is told to serve
    bridge = compose["services"]["udp-bridge"]["command"]
    udp_job = next(j for j in prom["scrape_configs"] if j["job_name"] == "stream-anon-udp")
    assert str(udp_job["dns_sd_configs"][0]["port"]) == bridge[bridge.index("--metrics-port") + 1]


def test_compose_replay_jobs_use_real_cli_options() -> None:
    """The replay/udp jobs' arguments parse with the real replay_tools and stream-anon parsers."""
    import argparse

    import replay_tools.__main__ as replay_main
    from stream_anon.cli import build_parser

    compose = _substitute(load_yaml(COMPOSE_YML), _env_example())
    p: argparse.ArgumentParser = replay_main.build_parser()
    for job in ("replay", "udp-sender"):
        svc = compose["services"][job]
        assert svc["entrypoint"] == ["python", "-m", "replay_tools"]
        args = p.parse_args([str(a) for a in svc["command"]])
        assert args.adult == "/data/adult.data"
    bridge = [str(a) for a in compose["services"]["udp-bridge"]["command"]]
    build_parser().parse_args(bridge)
    build_parser().parse_args([str(a) for a in compose["services"]["stream-anon"]["command"]])


# ----------------------------------------------------------------------------------------------- Dockerfile
def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_pinned_base_nonroot_user_and_healthcheck() -> None:
    ins = _dockerfile_instructions()
    froms = [rest for op, rest in ins if op == "FROM"]
    assert froms and all(_image_pinned(f.split()[0]) for f in froms), froms
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?", froms[-1].split()[0]), froms[-1]
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    users = [rest for op, rest in ins[last_from:] if op == "USER"]
    assert users, "no USER: the image would run as root"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]
    health = [rest for op, rest in ins if op == "HEALTHCHECK"]
    assert len(health) == 1 and "/metrics" in health[0] and "CMD" in health[0]
    # what COPY takes from the build context (the repository root) exists
    for op, rest in ins:
        if op == "COPY":
            for src in rest.split()[:-1]:
                if not src.startswith("--"):
                    assert (REPO / src).exists(), f"COPY source {src} missing from the build context"


def test_dockerignore_keeps_what_the_build_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    kept = {line[1:].split("/")[0] for line in ignore if line.startswith("!")}
    copied = {src.split("/")[0] for op, rest in _dockerfile_instructions() if op == "COPY" for src in rest.split()[:-1]}
    assert copied <= kept, copied - kept


def test_env_example_holds_placeholders_not_secrets() -> None:
    env = _env_example()
    assert env["GRAFANA_ADMIN_PASSWORD"] == "change-me"
    assert env["ADULT_DIR"].startswith("/path/to/")


# ----------------------------------------------------------------------------------------------- Kubernetes
def _k8s(kind: str) -> dict[str, Any]:
    docs = [d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in load_yaml_all(f) if d]
    matches = [d for d in docs if d.get("kind") == kind]
    assert len(matches) == 1, f"expected one {kind} in deploy/k8s, found {len(matches)}"
    return matches[0]


def load_yaml_all(path: Path) -> list[Any]:
    import yaml

    with open(path, encoding="utf-8") as f:
        return list(yaml.safe_load_all(f))


def test_k8s_manifests_probes_config_and_podmonitor(tmp_path: Path) -> None:
    kustomization = load_yaml(DEPLOY / "k8s" / "kustomization.yaml")
    assert all((DEPLOY / "k8s" / r).is_file() for r in kustomization["resources"])
    dep, cm, pm = _k8s("Deployment"), _k8s("ConfigMap"), _k8s("PodMonitor")
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    assert _image_pinned(container["image"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True and pod["spec"]["securityContext"]["runAsUser"] != 0
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/metrics" and get["port"] in ports, probe
    # the ConfigMap's file is a valid service config, its metrics port is the container's, reachable off-loopback
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert container["args"][container["args"].index("--config") + 1].startswith(mount["mountPath"] + "/")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"], encoding="utf-8")
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert all(env_to_option(k) for k in env), env
    cfg = Config.load(tmp_path / "config.yaml", env=env)
    assert cfg.service.metrics_port == ports["metrics"] and cfg.service.metrics_addr == "0.0.0.0"
    assert cfg.service.side_metrics_port == ports["side-metrics"]
    # the PodMonitor selects these pods, scrapes the named port, and labels the job as the rules expect
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == set(ports)
    assert labels[pm["spec"]["jobLabel"]] == "stream-anon"
    assert any('up{job="stream-anon"}' in r["expr"] for r in alert_rules())
