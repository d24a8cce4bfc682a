"""``stream-anon anonymize`` (stream a file through the engine) and ``stream-anon verify`` (check a release).

Exit codes: 0 success; 1 verification found violations; 2 bad input or parameter (the message names the
parameter or field, the allowed range and the value received).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from stream_anon.core.datasets import ADULT_COLUMNS, DatasetError, read_adult, read_csv_with_schema
from stream_anon.core.engine import Engine, EngineConfig, EngineConfigError, Release
from stream_anon.core.schema import Schema, SchemaError, adult_schema


class UsageError(ValueError):
    """Bad command-line input: reported on stderr, exit code 2."""


# ============================================================================ input
def detect_format(path: Path) -> str:
    """``adult`` for the UCI layout (no header, 15 ", "-separated fields), else ``csv`` (with a header)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    fields = [x.strip() for x in first.split(",")]
    if len(fields) == len(ADULT_COLUMNS) and fields[0].isdigit():
        return "adult"
    return "csv"


def load_stream(path: Path, fmt: str, schema: Schema) -> pd.DataFrame:
    """The input records in arrival (file) order, every record validated against ``schema``."""
    if fmt == "adult":
        df = read_adult(path, check_count=False)
        rid = schema.record_id or "id"
        if rid != "id":
            df = df.rename(columns={"id": rid})
        cols = {c: df[c].tolist() for c in df.columns}
        for i in range(len(df)):
            rec = {c: cols[c][i] for c in cols}
            try:
                schema.validate(rec, allow_extra=True)
            except SchemaError as e:
                raise DatasetError(f"{path}: line {i + 1}: {e}") from e
        return df
    return read_csv_with_schema(path, schema)


def build_schema(args: argparse.Namespace) -> Schema:
    schema = Schema.load(args.schema) if args.schema else adult_schema()
    qis = [q.strip() for q in args.qi.split(",") if q.strip()] if args.qi else None
    if qis is not None and not qis:
        raise UsageError("--qi: expected a comma-separated list of attribute names, got an empty list")
    if qis is not None or args.sensitive is not None:
        schema = schema.with_roles(qis=qis, sensitive=args.sensitive)
    if not schema.qis:
        raise UsageError("--qi: no quasi-identifier selected")
    return schema


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        k=args.k, delta=args.delta, beta=args.beta, mu=args.mu, algorithm=args.algorithm, loss=args.loss,
        leftover=args.leftover, delta_leftover=args.delta_leftover, l=args.l, zeta=args.zeta, max_age=args.max_age,
        adaptive_delay=args.adaptive_delay, delta_min=args.delta_min, seed=args.seed, age_weight=args.age_weight,
        release_slack=args.release_slack,
    )


# ============================================================================ running
def run_engine(engine: Engine, df: pd.DataFrame) -> tuple[list[Release], float]:
    """Stream the frame through the engine in row order; returns (releases, engine seconds).

    Record dicts are built before the clock starts (file handling); the clock covers the bulk QI encoding
    and every push/flush.
    """
    cols = {c: df[c].tolist() for c in df.columns}
    names = list(cols)
    records = [dict(zip(names, row, strict=True)) for row in zip(*cols.values(), strict=True)]
    gc.collect()
    gc.freeze()  # the input records are long-lived: keep them out of the cyclic collector's scans
    t0 = time.perf_counter()
    vectors = engine.encode_many(cols)
    out: list[Release] = []
    push = engine.push_encoded
    for rec, v in zip(records, vectors, strict=True):
        out += push(rec, v, 0.0)
    out += engine.flush(0.0)
    seconds = time.perf_counter() - t0
    gc.unfreeze()
    return out, seconds


def delay_stats(releases: Sequence[Release]) -> dict[str, Any]:
    all_d = [d for r in releases for d in r.delays]
    rel_d = [d for r in releases if r.kind == "class" for d in r.delays]
    sup_d = [d for r in releases if r.kind == "suppressed" for d in r.delays]
    return {
        "max_delay": max(all_d) if all_d else 0,
        "mean_delay": sum(all_d) / len(all_d) if all_d else 0.0,
        "max_delay_released": max(rel_d) if rel_d else 0,
        "mean_delay_released": sum(rel_d) / len(rel_d) if rel_d else 0.0,
        "max_delay_suppressed": max(sup_d) if sup_d else 0,
    }


def summarize(engine: Engine, releases: Sequence[Release], seconds: float) -> dict[str, Any]:
    """The summary JSON: loss metrics (core/loss.py), delays, counts, throughput, parameters."""
    from stream_anon.core.loss import summarize_releases

    cfg = engine.config
    loss = summarize_releases(releases, engine.schema, cfg.k).as_dict()
    n_in = engine.records_in
    out: dict[str, Any] = {
        "records_in": n_in,
        "records_released": engine.records_released,
        "records_suppressed": engine.records_suppressed,
        "records_reused": sum(len(r.record_ids) for r in releases if r.reused),
        "records_via_leftover": sum(len(r.record_ids) for r in releases if r.leftover and r.kind == "class"),
    }
    for key in ("gt_loss", "lm_loss", "lm_loss_normalized", "lm_loss_per_attribute", "ubdsa_loss", "castle_loss",
                "castle_loss_with_suppressed", "discernibility", "c_avg", "classes", "min_class_size",
                "distinct_generalizations"):
        out[key] = loss[key]
    out.update(delay_stats(releases))
    out["late_records"] = sum(1 for r in releases for d in r.delays if d > cfg.delta)
    out["max_buffered_records"] = engine.max_buffered
    out["seconds"] = seconds
    out["records_per_second"] = n_in / seconds if seconds > 0 else None
    out["parameters"] = {**cfg.as_dict(), "qi": [a.name for a in engine.schema.qis],
                         "sensitive": engine.sensitive, "person_id": engine.person_id}
    return out


def write_release_csv(path: str | os.PathLike[str], schema: Schema, releases: Sequence[Release]) -> int:
    """One row per released record: record_id, class_id, QIs (schema order) as released strings, sensitive."""
    qis = [a.name for a in schema.attributes if a.is_qi]
    sens = schema.sensitive[0].name if schema.sensitive else None
    header = ["record_id", "class_id", *qis] + ([sens] if sens else [])
    rid_field = schema.record_id or "id"
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in releases:
            if r.kind != "class":
                continue
            gen = [r.generalized[q] for q in qis]
            for rec in r.records:
                row = [rec.get(rid_field), r.class_id, *gen]
                if sens:
                    row.append(rec[sens])
                w.writerow(row)
                n += 1
    return n


# ============================================================================ commands
def cmd_anonymize(args: argparse.Namespace) -> int:
    try:
        path = Path(args.input) if args.input else None
        if path is None:
            env = os.environ.get("STREAM_ANON_ADULT")
            if not env:
                raise UsageError("--input: no input file given and $STREAM_ANON_ADULT is not set")
            path = Path(env)
        if not path.is_file():
            raise UsageError(f"--input: file {str(path)!r} does not exist")
        schema = build_schema(args)
        config = config_from_args(args)
        engine = Engine(schema, config)
        fmt = args.format or detect_format(path)
        df = load_stream(path, fmt, schema)
    except (UsageError, EngineConfigError, SchemaError, DatasetError, ValueError) as e:
        print(f"stream-anon anonymize: error: {e}", file=sys.stderr)
        return 2
    releases, seconds = run_engine(engine, df)
    summary = summarize(engine, releases, seconds)
    summary["input"] = str(path)
    summary["format"] = fmt
    if args.output:
        write_release_csv(args.output, schema, releases)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"{summary['records_in']} records in, {summary['records_released']} released in "
          f"{summary['classes']} classes, {summary['records_suppressed']} suppressed; "
          f"GT loss {summary['gt_loss']:.4f}, max delay {summary['max_delay']}, "
          f"{summary['records_per_second']:.0f} records/s (engine)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from stream_anon.core.verify import verify_release_file

    try:
        if args.k < 1:
            raise UsageError(f"--k: must be an integer >= 1, got {args.k}")
        if args.l is not None and args.l < 1:
            raise UsageError(f"--l: must be an integer >= 1, got {args.l}")
        qis = [q.strip() for q in args.qi.split(",") if q.strip()] if args.qi else None
        schema = Schema.load(args.schema) if args.schema else (adult_schema() if args.adult_schema else None)
        report = verify_release_file(args.input, args.k, args.l, qis, args.sensitive, schema=schema)
    except (UsageError, ValueError, OSError) as e:
        print(f"stream-anon verify: error: {e}", file=sys.stderr)
        return 2
    if report.ok:
        print(f"OK: {report.records} records in {report.classes} classes, smallest class {report.min_class_size} "
              f"(k={args.k}{'' if args.l is None else f', l={args.l}'})")
        return 0
    print(f"VIOLATIONS in {args.input}:")
    for v in report.violations:
        print(f"  {v}")
    return 1


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=int, default=10, help="k: distinct individuals per released class (>= 2; default 10)")
    p.add_argument("--delta", type=int, default=1000, help="delay bound in arrivals (>= k; default 1000)")
    p.add_argument("--beta", type=int, default=50, help="max open clusters (>= 1; default 50)")
    p.add_argument("--mu", type=int, default=100, help="recent released clusters that set tau (>= 1; default 100)")
    p.add_argument("--algorithm", choices=["castle", "ubdsa"], default="castle")
    p.add_argument("--loss", choices=["gt", "lm", "ubdsa"], default="gt", help="loss scoring the cluster choice")
    p.add_argument("--leftover", choices=["suppress", "leftover"], default="suppress")
    p.add_argument("--delta-leftover", type=int, default=None, help="max further wait in the leftover cluster")
    p.add_argument("--l", type=int, default=None, help="l-diversity: distinct sensitive values per class")
    p.add_argument("--zeta", type=int, default=1000, help="released clusters kept for reuse (0: no reuse)")
    p.add_argument("--max-age", type=int, default=None, help="drop reuse clusters older than this many arrivals")
    p.add_argument("--adaptive-delay", action="store_true", help="adapt the delay within [delta-min, delta]")
    p.add_argument("--delta-min", type=int, default=None, help="lower bound of the adaptive delay")
    p.add_argument("--age-weight", type=float, default=0.5, help="UBDSA: weight of the age pressure")
    p.add_argument("--release-slack", type=float, default=1.0,
                   help="UBDSA: early release when loss <= tau * (1 + slack * age)")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's random choices (default 0)")


def register(sub: Any) -> None:
    p = sub.add_parser("anonymize", help="stream a file through the k-anonymity engine",
                       description="Stream a file (ADULT format or CSV with a schema) through CASTLE/UBDSA in "
                                   "arrival order; write the released table and a JSON summary.")
    p.add_argument("--input", default=None, help="input file (default $STREAM_ANON_ADULT)")
    p.add_argument("--format", choices=["adult", "csv"], default=None, help="input format (default: detected)")
    p.add_argument("--schema", default=None, help="schema YAML/JSON (default: the shipped ADULT schema)")
    p.add_argument("--qi", default=None, help="comma-separated quasi-identifiers (default: the schema's)")
    p.add_argument("--sensitive", default=None, help="sensitive attribute (default: the schema's)")
    add_engine_arguments(p)
    p.add_argument("--output", default=None, help="released CSV")
    p.add_argument("--summary", default=None, help="summary JSON")
    p.set_defaults(func=cmd_anonymize)

    v = sub.add_parser("verify", help="check a released CSV for k-anonymity (and l-diversity)",
                       description="Check a released CSV independently of the engine; exit 1 on any violation.")
    v.add_argument("--input", required=True, help="released CSV (anonymize --output)")
    v.add_argument("--k", type=int, required=True)
    v.add_argument("--l", type=int, default=None)
    v.add_argument("--qi", default=None, help="QI columns (default: all but record_id, class_id and the last)")
    v.add_argument("--sensitive", default=None, help="sensitive column (default: the last column)")
    v.add_argument("--schema", default=None, help="schema to check the released strings against")
    v.add_argument("--adult-schema", action="store_true", help="check the strings against the ADULT schema")
    v.set_defaults(func=cmd_verify)
