"""Helpers shared by tests/test_deploy_*.py: the deploy files, metric names in PromQL, exposition parsing."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
RULES_YML = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST_YML = DEPLOY / "prometheus" / "rules.test.yml"
COMPOSE_YML = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DASHBOARD_JSON = DEPLOY / "grafana" / "dashboards" / "stream-anon.json"
GRAFANA_DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources"
GRAFANA_DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards"
ENV_EXAMPLE = DEPLOY / ".env.example"

# Series Prometheus itself attaches to every target (allowed in rules/dashboards besides the service's own).
PROMETHEUS_SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_BRACKETS = re.compile(r"\[[^\]]*\]")  # range selectors, subqueries
_BRACES = re.compile(r"\{[^}]*\}")  # label matchers
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TEMPLATE_VARS = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_IDENT = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "inf", "nan", "Inf", "NaN", "atan2", "start", "end"})


def promql_metric_names(expr: str) -> set[str]:
    """Metric (series) names a PromQL expression selects: identifiers that are not functions, keywords,
    label names, strings, durations or Grafana variables.  Recording-rule names (with ':') included."""
    text = _STRINGS.sub(" ", expr)
    text = _TEMPLATE_VARS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name in _KEYWORDS:
            continue
        names.add(name)
    return names


def load_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(RULES_YML)["groups"] for r in g["rules"]]


def recording_rule_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def alert_rules() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def rule_exprs() -> list[tuple[str, str]]:
    return [(f"rules.yml {r.get('alert') or r.get('record')}", str(r["expr"])) for r in rules()]


def dashboard() -> dict[str, Any]:
    with open(DASHBOARD_JSON, encoding="utf-8") as f:
        return json.load(f)


def dashboard_panels(d: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    d = d or dashboard()
    out = []
    for p in d["panels"]:
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,")


def dashboard_exprs(d: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every templating query (label_values(metric, label))."""
    d = d or dashboard()
    out = []
    for p in dashboard_panels(d):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r} target {t.get('refId')}", str(t.get("expr", ""))))
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if isinstance(q, str):
            m = _LABEL_VALUES.search(q)
            out.append((f"variable {v.get('name')!r}", m.group(1) if m else q))
    return out


def series_names(family: str, mtype: str) -> set[str]:
    """Sample names prometheus_client exposes for a metric family of a given type.

    Counters: the registry names the family without ``_total``, the text format's ``# TYPE`` line with it.
    """
    if mtype == "counter":
        base = family[: -len("_total")] if family.endswith("_total") else family
        return {base + "_total", base + "_created"}
    if mtype == "histogram":
        return {family + s for s in ("_bucket", "_sum", "_count", "_created")}
    if mtype == "summary":
        return {family, family + "_sum", family + "_count", family + "_created"}
    return {family}


def declared_series(registry_families: Iterable[tuple[str, str]]) -> dict[str, str]:
    """series name -> family for (family, type) pairs."""
    out = {}
    for fam, mtype in registry_families:
        for s in series_names(fam, mtype):
            out[s] = fam
    return out


_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)")
_SAMPLE_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)")


def parse_exposition(text: str) -> tuple[set[str], dict[str, str]]:
    """(sample names with at least one sample, {family: type} from the # TYPE lines) of a /metrics page."""
    samples, types = set(), {}
    for line in text.splitlines():
        m = _TYPE_LINE.match(line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        if line and not line.startswith("#"):
            m = _SAMPLE_LINE.match(line)
            if m:
                samples.add(m.group(1))
    return samples, types


def require_tool(name: str) -> str:
    """Path of a required CLI tool; a missing tool FAILS the test (CI installs it: .ci/run)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: install Debian's prometheus package (apt-get install prometheus); "
                    "the deploy checks run real tools and never skip")
    return path
