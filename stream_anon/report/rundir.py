"""A run directory: what a run of stream-anon leaves behind for the report (format in docs/deploy.md).

Required:
    ``summary.json``  one JSON object: counts, losses, delay statistics, parameters (``k``, ``delta``
                      at top level or under ``config.anonymization`` / ``anonymization``), eps spent.
    ``released.csv``  the released records, one row each: ``class_id, <QI columns>, <sensitive>`` (the public
                      layout the demo writes, with its meta file ``released.csv.meta.json``), or with a leading
                      ``record_id`` column (``anonymize --keep-ids``); optional ``delay`` / ``delay_arrivals`` and
                      ``delay_seconds`` columns.
Optional:
    ``delays.json``        ``{"arrivals": [...], "seconds": [...], "bound": delta}`` (or a bare list of arrivals):
                           per-record delays of the *released* records.
    ``grid.json``          engine experiment grid: list of ``{k, delta, beta, mu, loss_metric, gt_loss, lm_loss,
                           ubdsa_loss}``.
    ``ldp_curves.json``    list of ``{mechanism, attribute, error_metric, projection, points: [{epsilon, error,
                           error_std}]}``; a total variation distance is in [0, 1] (``projection: "simplex"``: of
                           the estimate projected onto the probability simplex).
    ``side_estimates.json`` list of ``{topic, attribute, kind: "frequency"|"mean", categories, estimated, true,
                           std_errors}`` (``kind="mean"``: scalars ``estimated``, ``true``, ``std_error``).
    ``schema.yaml``        the schema of the released records (default: the shipped ADULT schema).

Loading never fails on a missing *optional* file (the report says it is missing); a malformed file raises
:class:`RunDirError` naming the file, the field, what was expected and what was found.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.core.schema import Schema, adult_schema

SUMMARY_FILE = "summary.json"
RELEASED_FILE = "released.csv"
DELAYS_FILE = "delays.json"
GRID_FILE = "grid.json"
LDP_CURVES_FILE = "ldp_curves.json"
SIDE_ESTIMATES_FILE = "side_estimates.json"
SCHEMA_FILES = ("schema.yaml", "schema.yml", "schema.json")

GRID_FIELDS = ("k", "delta", "beta", "mu", "loss_metric", "gt_loss", "lm_loss", "ubdsa_loss")
DELAY_ARRIVAL_COLUMNS = ("delay", "delay_arrivals")
TV_METRIC = "total variation distance"
SIMPLEX_PROJECTION = "simplex"  # ldp_curves.json "projection": TV of the Euclidean projection onto the simplex
DELAY_SECONDS_COLUMNS = ("delay_seconds",)


class RunDirError(ValueError):
    """A run directory file is missing (required ones) or malformed."""


@dataclass
class LdpCurve:
    mechanism: str
    attribute: str
    error_metric: str
    epsilon: np.ndarray
    error: np.ndarray
    error_std: np.ndarray | None = None
    projection: str | None = None  # "simplex": the error is measured on the estimate projected onto the simplex

    @property
    def is_total_variation(self) -> bool:
        return self.error_metric == TV_METRIC

    @property
    def valid(self) -> bool:
        """False for a total variation distance outside [0, 1] (computed on an unprojected estimate)."""
        return not self.is_total_variation or bool(((self.error >= 0) & (self.error <= 1)).all())


@dataclass
class SideEstimate:
    topic: str
    attribute: str
    kind: str  # "frequency" | "mean"
    categories: list[str]
    estimated: np.ndarray
    true: np.ndarray | None
    std_errors: np.ndarray | None


@dataclass
class RunDir:
    path: Path
    summary: dict[str, Any]
    released: pd.DataFrame
    schema: Schema
    delays_arrivals: np.ndarray | None = None
    delays_seconds: np.ndarray | None = None
    delay_bound: float | None = None
    grid: pd.DataFrame | None = None
    ldp_curves: list[LdpCurve] | None = None
    side_estimates: list[SideEstimate] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def k(self) -> int | None:
        v = summary_value(self.summary, "k")
        return int(v) if v is not None else None

    @property
    def synthetic(self) -> bool:
        """The run's data is synthetic (``"synthetic": true`` in summary.json, as the demo writes it)."""
        return summary_value(self.summary, "synthetic") is True

    @property
    def delta(self) -> float | None:
        if self.delay_bound is not None:
            return self.delay_bound
        v = summary_value(self.summary, "delta")
        return float(v) if v is not None else None


def summary_value(summary: Mapping[str, Any], key: str) -> Any:
    """``key`` at top level of the summary, else under ``config.anonymization``, ``anonymization`` or ``parameters``."""
    if key in summary and _is_scalar(summary[key]):
        return summary[key]
    for path in (("config", "anonymization"), ("anonymization",), ("parameters",), ("engine",), ("config",)):
        node: Any = summary
        for p in path:
            node = node.get(p) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping) and key in node and _is_scalar(node[key]):
            return node[key]
    return None


def _is_scalar(v: Any) -> bool:
    return isinstance(v, int | float | str | bool) or v is None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: not valid JSON ({e})") from None


def _float_array(values: Any, where: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise RunDirError(f"{where}: expected a list of numbers, got {str(values)[:80]!r}") from None
    if arr.ndim != 1:
        raise RunDirError(f"{where}: expected a flat list of numbers, got an array of shape {arr.shape}")
    return arr


def _require(entry: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(entry, Mapping):
        raise RunDirError(f"{where}: expected an object, got {type(entry).__name__}")
    if key not in entry:
        raise RunDirError(f"{where}: field {key!r} missing (has {sorted(entry)})")
    return entry[key]


def load_schema(run_dir: Path) -> Schema:
    for name in SCHEMA_FILES:
        if (run_dir / name).is_file():
            return Schema.load(run_dir / name)
    return adult_schema()


def load_grid(path: Path) -> pd.DataFrame:
    data = _read_json(path)
    if isinstance(data, Mapping) and "grid" in data:
        data = data["grid"]
    if not isinstance(data, list) or not data:
        raise RunDirError(f"{path}: expected a non-empty list of grid points, got {type(data).__name__}")
    rows = []
    for i, entry in enumerate(data):
        where = f"{path.name}[{i}]"
        row: dict[str, Any] = {"k": float(_require(entry, "k", where)), "delta": float(_require(entry, "delta", where))}
        for key in ("beta", "mu"):
            row[key] = float(entry[key]) if entry.get(key) is not None else math.nan
        row["loss_metric"] = str(entry.get("loss_metric", "gt"))
        row["algorithm"] = str(entry.get("algorithm", "castle"))
        losses = [key for key in ("gt_loss", "lm_loss", "ubdsa_loss") if entry.get(key) is not None]
        if not losses:
            raise RunDirError(f"{where}: needs at least one of gt_loss, lm_loss, ubdsa_loss (has {sorted(entry)})")
        for key in ("gt_loss", "lm_loss", "ubdsa_loss", "suppressed_fraction"):
            row[key] = float(entry[key]) if entry.get(key) is not None else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def load_ldp_curves(path: Path) -> list[LdpCurve]:
    data = _read_json(path)
    if isinstance(data, Mapping) and "curves" in data:
        data = data["curves"]
    if isinstance(data, Mapping):  # {mechanism: [points]} shorthand
        data = [{"mechanism": name, "points": pts} for name, pts in data.items()]
    if not isinstance(data, list) or not data:
        raise RunDirError(f"{path}: expected a non-empty list of curves, got {type(data).__name__}")
    curves = []
    for i, entry in enumerate(data):
        where = f"{path.name}[{i}]"
        points = _require(entry, "points", where)
        if not isinstance(points, list) or not points:
            raise RunDirError(f"{where}.points: expected a non-empty list of {{epsilon, error}}, got {points!r:.80}")
        eps = _float_array([_require(p, "epsilon", f"{where}.points[{j}]") for j, p in enumerate(points)],
                           f"{where}.points[].epsilon")
        err = _float_array([_require(p, "error", f"{where}.points[{j}]") for j, p in enumerate(points)],
                           f"{where}.points[].error")
        std = None
        if all(p.get("error_std") is not None for p in points):
            std = _float_array([p["error_std"] for p in points], f"{where}.points[].error_std")
        if np.any(eps <= 0):
            raise RunDirError(f"{where}.points[].epsilon: expected epsilon > 0, got {eps.tolist()}")
        order = np.argsort(eps)
        curves.append(LdpCurve(mechanism=str(_require(entry, "mechanism", where)),
                               attribute=str(entry.get("attribute", "")),
                               error_metric=str(entry.get("error_metric", "error")),
                               epsilon=eps[order], error=err[order],
                               error_std=std[order] if std is not None else None,
                               projection=str(entry["projection"]) if entry.get("projection") else None))
    return curves


def load_side_estimates(path: Path) -> list[SideEstimate]:
    data = _read_json(path)
    if isinstance(data, Mapping) and "estimates" in data:
        data = data["estimates"]
    if not isinstance(data, list) or not data:
        raise RunDirError(f"{path}: expected a non-empty list of estimates, got {type(data).__name__}")
    out = []
    for i, entry in enumerate(data):
        where = f"{path.name}[{i}]"
        kind = str(entry.get("kind", "frequency")) if isinstance(entry, Mapping) else ""
        if kind not in ("frequency", "mean"):
            raise RunDirError(f"{where}.kind: expected 'frequency' or 'mean', got {kind!r}")
        est_raw = _require(entry, "estimated", where)
        true_raw = entry.get("true")
        if kind == "mean":
            cats = [str(entry.get("attribute", "mean"))]
            est = _float_array([est_raw], f"{where}.estimated")
            true = _float_array([true_raw], f"{where}.true") if true_raw is not None else None
            se_raw = entry.get("std_error", entry.get("std_errors"))
            se = _float_array(np.atleast_1d(np.asarray(se_raw, dtype=float)).tolist(), f"{where}.std_error") \
                if se_raw is not None else None
        else:
            cats = [str(c) for c in _require(entry, "categories", where)]
            est = _float_array(est_raw, f"{where}.estimated")
            true = _float_array(true_raw, f"{where}.true") if true_raw is not None else None
            se = _float_array(entry["std_errors"], f"{where}.std_errors") if entry.get("std_errors") is not None \
                else None
            for name, arr in (("estimated", est), ("true", true), ("std_errors", se)):
                if arr is not None and len(arr) != len(cats):
                    raise RunDirError(f"{where}.{name}: expected {len(cats)} values (one per category), "
                                      f"got {len(arr)}")
        out.append(SideEstimate(topic=str(entry.get("topic", "")), attribute=str(entry.get("attribute", "")),
                                kind=kind, categories=cats, estimated=est, true=true, std_errors=se))
    return out


def _first_column(df: pd.DataFrame, names: Sequence[str]) -> str | None:
    return next((c for c in names if c in df.columns), None)


def load_run_dir(run_dir: str | Path) -> RunDir:
    """Read a run directory; required files missing or any file malformed raise :class:`RunDirError`."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirError(f"run directory {str(path)!r} does not exist")
    summary_path, released_path = path / SUMMARY_FILE, path / RELEASED_FILE
    for p in (summary_path, released_path):
        if not p.is_file():
            raise RunDirError(f"run directory {path}: required file {p.name} is missing")
    summary = _read_json(summary_path)
    if not isinstance(summary, dict):
        raise RunDirError(f"{summary_path}: expected a JSON object, got {type(summary).__name__}")
    released = pd.read_csv(released_path, dtype=str, keep_default_na=False)
    if "class_id" not in released.columns:
        raise RunDirError(f"{released_path}: column 'class_id' missing (has {list(released.columns)})")
    schema = load_schema(path)
    run = RunDir(path=path, summary=summary, released=released, schema=schema)

    arrivals_col = _first_column(released, DELAY_ARRIVAL_COLUMNS)
    if arrivals_col is not None:
        run.delays_arrivals = pd.to_numeric(released[arrivals_col], errors="coerce").to_numpy(dtype=float)
        run.notes.append(f"delays (arrivals) from column {arrivals_col!r} of {RELEASED_FILE}")
    seconds_col = _first_column(released, DELAY_SECONDS_COLUMNS)
    if seconds_col is not None:
        run.delays_seconds = pd.to_numeric(released[seconds_col], errors="coerce").to_numpy(dtype=float)
    if (path / DELAYS_FILE).is_file():
        data = _read_json(path / DELAYS_FILE)
        if isinstance(data, list):
            data = {"arrivals": data}
        if not isinstance(data, Mapping):
            raise RunDirError(f"{path / DELAYS_FILE}: expected an object or a list, got {type(data).__name__}")
        if data.get("arrivals") is not None:
            run.delays_arrivals = _float_array(data["arrivals"], f"{DELAYS_FILE}.arrivals")
            run.notes.append(f"delays (arrivals) from {DELAYS_FILE}")
        if data.get("seconds") is not None:
            run.delays_seconds = _float_array(data["seconds"], f"{DELAYS_FILE}.seconds")
        if data.get("bound") is not None:
            run.delay_bound = float(data["bound"])
    if (path / GRID_FILE).is_file():
        run.grid = load_grid(path / GRID_FILE)
    if (path / LDP_CURVES_FILE).is_file():
        run.ldp_curves = load_ldp_curves(path / LDP_CURVES_FILE)
    if (path / SIDE_ESTIMATES_FILE).is_file():
        run.side_estimates = load_side_estimates(path / SIDE_ESTIMATES_FILE)
    return run


# ------------------------------------------------------------------------------------------------- writing
def released_frame(releases: Sequence[Any], schema: Schema) -> pd.DataFrame:
    """``released.csv`` rows from engine ``Release`` objects (``kind == "class"`` only), in release order.

    Columns: ``record_id, class_id, <QIs as generalized strings>, <sensitive>, delay, delay_seconds``.
    """
    qis = [a.name for a in schema.qis]
    sens = [a.name for a in schema.sensitive]
    rows: list[dict[str, Any]] = []
    for r in releases:
        if r.kind != "class":
            continue
        n = len(r.record_ids)
        recs = r.records if len(r.records) == n else [{}] * n
        delays = r.delays if len(r.delays) == n else [None] * n
        secs = r.delays_seconds if len(r.delays_seconds) == n else [None] * n
        for rid, rec, d, ds in zip(r.record_ids, recs, delays, secs, strict=True):
            row = {"record_id": rid, "class_id": r.class_id}
            row.update({q: r.generalized.get(q, "*") for q in qis})
            row.update({s: rec.get(s, "") for s in sens})
            row["delay"] = d
            row["delay_seconds"] = ds
            rows.append(row)
    return pd.DataFrame(rows, columns=["record_id", "class_id", *qis, *sens, "delay", "delay_seconds"])


def write_run_dir(run_dir: str | Path, *, summary: Mapping[str, Any], releases: Sequence[Any] | None = None,
                  released: pd.DataFrame | None = None, schema: Schema | None = None,
                  delay_bound: float | None = None) -> Path:
    """Write ``summary.json`` and ``released.csv`` (from engine releases or a ready frame) into ``run_dir``.

    ``delay_bound`` (delta) also goes into ``delays.json`` so the report can draw the bound without
    looking into the summary.  Returns the run directory.
    """
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    if released is None:
        if releases is None:
            raise RunDirError("write_run_dir: give releases (engine Release objects) or released (a DataFrame)")
        released = released_frame(releases, schema or adult_schema())
    released.to_csv(d / RELEASED_FILE, index=False)
    (d / SUMMARY_FILE).write_text(json.dumps(dict(summary), indent=1, default=_json_default) + "\n", encoding="utf-8")
    if delay_bound is not None:
        (d / DELAYS_FILE).write_text(json.dumps({"bound": delay_bound}) + "\n", encoding="utf-8")
    return d


def _json_default(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)
