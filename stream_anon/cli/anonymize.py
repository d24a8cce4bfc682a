"""``stream-anon anonymize`` (stream a file through the engine) and ``stream-anon verify`` (check a release).

The release (``anonymize --output``) has the public layout by default: an opaque random class id, the
generalized QIs and the sensitive value(s), no record id, the rows of a class and the classes in random
order (release order is timing); ``--keep-ids`` writes the internal layout (record id, engine class ids,
release order), outside the threat model.  Beside it, ``<output>.meta.json`` names each column's role, so
``verify`` never has to guess (docs/offline-tools.md).

Exit codes: 0 success; 1 verification found violations; 2 bad input or parameter (one line naming the
option or file, the allowed values and the value received).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_anon.cli.arguments import (
    UsageError,
    comma_list,
    guarded,
    input_file,
    load_schema,
    one_line_errors,
    output_file,
    write_text,
)
from stream_anon.core.defaults import DEFAULTS, DIVERSITY_MODELS, T_DISTANCES

if TYPE_CHECKING:  # pandas, numpy and the engine are imported when a command runs, not for --help
    import pandas as pd

    from stream_anon.core.diversity import DiversityRequirement
    from stream_anon.core.engine import Engine, EngineConfig, Release
    from stream_anon.core.schema import Schema
    from stream_anon.core.verify import ReleaseRoles

ADULT_ENV = "STREAM_ANON_ADULT"  # stream_anon.core.datasets.ADULT_ENV (not imported: pandas)

CLASS_ID_COLUMN = "class_id"
RECORD_ID_COLUMN = "record_id"
OPAQUE_ID_BITS = 64


# ============================================================================ input
def build_schema(args: argparse.Namespace) -> Schema:
    """The schema of ``--schema`` (default ADULT) with the roles of ``--qi`` / ``--sensitive``."""
    from stream_anon.core.schema import SchemaError

    schema = load_schema("--schema", args.schema)
    qis = comma_list("--qi", args.qi)
    if qis is not None or args.sensitive is not None:
        try:
            schema = schema.with_roles(qis=qis, sensitive=args.sensitive)
        except SchemaError as e:
            option = {"qi": "--qi", "sensitive": "--sensitive"}.get(str(e.field), "--qi")
            raise UsageError(f"{option}: {e}") from None
    if not schema.qis:
        raise UsageError(f"--qi: no quasi-identifier selected (schema {schema.name!r} has none; name them with --qi)")
    taken = {CLASS_ID_COLUMN, RECORD_ID_COLUMN}
    clash = [a.name for a in schema.attributes if a.name in taken and (a.is_qi or a.role.value == "sensitive")]
    if clash:
        raise UsageError(f"--schema: attribute(s) {clash} would collide with the release's "
                         f"{CLASS_ID_COLUMN!r}/{RECORD_ID_COLUMN!r} columns; rename them")
    return schema


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine parameters; an invalid one names its option (``--k: must be an integer >= 2, got 1``)."""
    from stream_anon.core.engine import EngineConfig, EngineConfigError

    try:
        return EngineConfig(
            k=args.k, delta=args.delta, beta=args.beta, mu=args.mu, algorithm=args.algorithm, loss=args.loss,
            leftover=args.leftover, delta_leftover=args.delta_leftover, l=args.l, diversity=args.diversity,
            c=args.c, t_closeness=args.t_closeness, t_distance=args.t_distance,
            t_reference_every=args.t_reference_every, zeta=args.zeta,
            max_age=args.max_age, adaptive_delay=args.adaptive_delay, delta_min=args.delta_min, seed=args.seed,
            age_weight=args.age_weight, release_slack=args.release_slack,
        )
    except EngineConfigError as e:
        raise UsageError(f"--{e.parameter.replace('_', '-')}: must be {e.allowed}, got {e.value!r}") from None


def build_engine(schema: Schema, config: EngineConfig) -> Engine:
    from stream_anon.core.engine import Engine, EngineConfigError

    if not schema.sensitive and ((config.l is not None and config.l > 1) or config.t_closeness is not None):
        option, what, default = (("--l", "l-diversity", DEFAULTS.l) if config.l is not None and config.l > 1
                                 else ("--t-closeness", "t-closeness", DEFAULTS.t_closeness))
        raise UsageError(f"{option}: {what} (default {default}) needs a sensitive attribute and schema "
                         f"{schema.name!r} has none; pass --l none --t-closeness none to release k-anonymous "
                         f"classes without it")
    try:
        return Engine(schema, config)
    except EngineConfigError as e:
        raise UsageError(f"--{e.parameter.replace('_', '-')}: must be {e.allowed}, got {e.value!r}") from None
    except MemoryError:
        raise UsageError(f"--delta {config.delta}: the engine's buffer of delta records (plus --delta-leftover) "
                         f"does not fit in memory") from None


def load_input(path: Path, schema: Schema, fmt: str | None, *, schema_given: bool) -> tuple[pd.DataFrame, str]:
    """The validated records of ``path``; duplicate record ids are refused (see ``check_record_ids``)."""
    from stream_anon.core.datasets import DatasetError, check_record_ids, read_records

    try:
        df, fmt = read_records(path, schema, fmt)
        check_record_ids(df, schema, where=str(path))
    except DatasetError as e:
        hint = "" if schema_given or "required by schema" not in str(e) else (
            " (without --schema the input must be ADULT; give --schema for another data set)")
        raise UsageError(f"--input: {e}{hint}") from None
    return df, fmt


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
    """The summary JSON: loss metrics (core/loss.py), delays, counts, throughput, parameters (no per-record data)."""
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
    if engine.sensitive is not None:
        out["sensitive_disclosure"] = sensitive_disclosure(releases, engine.sensitive)
    out["max_buffered_records"] = engine.max_buffered
    out["seconds"] = seconds
    out["records_per_second"] = n_in / seconds if seconds > 0 else None
    out["parameters"] = {**cfg.as_dict(), "qi": [a.name for a in engine.schema.qis],
                         "sensitive": engine.sensitive, "person_id": engine.person_id}
    return out


def sensitive_disclosure(releases: Sequence[Release], sensitive: str) -> dict[str, Any]:
    """:func:`~stream_anon.core.diversity.disclosure_figures` of the released classes (reused records counted in
    their class) with the prior over every input record (released or suppressed)."""
    from stream_anon.core.diversity import disclosure_figures

    classes: dict[str, dict[Any, int]] = {}
    prior: dict[Any, int] = {}
    for r in releases:
        for rec in r.records:
            v = rec[sensitive]
            prior[v] = prior.get(v, 0) + 1
            if r.kind == "class":
                c = classes.setdefault(r.class_id, {})
                c[v] = c.get(v, 0) + 1
    return disclosure_figures(classes.values(), prior)


def release_rng(seed: int | None) -> random.Random:
    """The generator of the public release's class ids and row order: the OS's CSPRNG (``random.SystemRandom``).

    ``seed`` (tests only) gives a reproducible, hence predictable, ``random.Random``.
    """
    return random.SystemRandom() if seed is None else random.Random(seed)


def release_table(releases: Sequence[Release], schema: Schema, *, keep_ids: bool = False,
                  rng: random.Random | None = None,
                  references: dict[str, tuple[tuple[Any, int], ...]] | None = None
                  ) -> tuple[pd.DataFrame, ReleaseRoles]:
    """The released table of the engine's releases (``kind == "class"``) and the roles of its columns.

    Public layout (default): ``class_id`` (an opaque random id of 64 bits, drawn from ``rng``, default the
    OS's CSPRNG: not derived from row numbers, record ids, engine class numbers or time), the QIs (schema
    order) as released strings, the sensitive value(s).  All rows of an engine class (including records
    released later under it by CASTLE's reuse) share one id; classes and the rows within each class are
    shuffled, so the file's order says nothing about arrival or release times.

    ``keep_ids``: the internal layout: ``record_id``, the person id column (when the schema has one), the
    engine's class id, QIs, sensitive value(s), in release order.

    ``references`` (t-closeness): filled with the reference each class of the table was checked against,
    by the table's class id (for the meta file).
    """
    import pandas as pd

    from stream_anon.core.verify import ReleaseRoles

    qis = [a.name for a in schema.attributes if a.is_qi]
    sens = [a.name for a in schema.sensitive]
    rid_field = schema.record_id or "id"
    pid = schema.person_id
    if keep_ids:
        id_cols = [RECORD_ID_COLUMN] + ([pid] if pid else [])
        rows: list[list[Any]] = []
        for r in releases:
            if r.kind != "class":
                continue
            released = [r.generalized[q] for q in qis]
            for rec in r.records:
                ids = [rec.get(rid_field)] + ([rec.get(pid)] if pid else [])
                rows.append([*ids, r.class_id, *released, *(rec[c] for c in sens)])
            if references is not None and r.reference is not None:
                references.setdefault(r.class_id, r.reference)
        roles = ReleaseRoles(class_id=CLASS_ID_COLUMN, quasi_identifiers=tuple(qis), sensitive=tuple(sens),
                             record_id=RECORD_ID_COLUMN, person_id=pid, source="anonymize --keep-ids")
        return pd.DataFrame(rows, columns=[*id_cols, CLASS_ID_COLUMN, *qis, *sens]), roles
    rng = rng if rng is not None else release_rng(None)
    classes: dict[tuple[str, tuple[str, ...]], list[list[Any]]] = {}
    refs: dict[tuple[str, tuple[str, ...]], tuple[tuple[Any, int], ...]] = {}
    for r in releases:
        if r.kind != "class":
            continue
        # keyed by the generalization too: a reuse under a class id with another generalization (an engine
        # bug) stays a class of its own, which verify then sees, instead of being relabelled
        key = (r.class_id, tuple(r.generalized[q] for q in qis))
        members = classes.setdefault(key, [])
        members.extend([rec[c] for c in sens] for rec in r.records)
        if r.reference is not None:
            refs.setdefault(key, r.reference)
    opaque: set[str] = set()
    blocks: list[tuple[str, tuple[str, ...], list[list[Any]]]] = []
    for key, members in classes.items():
        gen = key[1]
        cid = f"{rng.getrandbits(OPAQUE_ID_BITS):0{OPAQUE_ID_BITS // 4}x}"
        while cid in opaque:  # a collision is astronomically unlikely; ids stay unique in the file anyway
            cid = f"{rng.getrandbits(OPAQUE_ID_BITS):0{OPAQUE_ID_BITS // 4}x}"
        opaque.add(cid)
        if references is not None and key in refs:
            references[cid] = refs[key]
        rng.shuffle(members)
        blocks.append((cid, gen, members))
    rng.shuffle(blocks)
    rows = [[cid, *gen, *values] for cid, gen, members in blocks for values in members]
    roles = ReleaseRoles(class_id=CLASS_ID_COLUMN, quasi_identifiers=tuple(qis), sensitive=tuple(sens),
                         source="anonymize", withheld_person_id=pid)
    return pd.DataFrame(rows, columns=[CLASS_ID_COLUMN, *qis, *sens]), roles


def write_release(path: Path, table: pd.DataFrame, roles: ReleaseRoles, schema: Schema,
                  config: EngineConfig, *, requirement: DiversityRequirement | None = None,
                  references: dict[str, tuple[tuple[Any, int], ...]] | None = None) -> Path:
    """Write the released CSV and its meta file ``<path>.meta.json``; returns the meta file's path."""
    from stream_anon.core.verify import diversity_meta, write_release_meta

    try:
        table.to_csv(path, index=False)
        return write_release_meta(
            path, roles, schema=schema.name, k=config.k,
            l=requirement.min_distinct if requirement is not None and requirement.l_active else None,
            **diversity_meta(requirement, references), records=len(table),
            classes=int(table[roles.class_id].nunique()),
            class_size_counts="distinct persons" if roles.person_id else (
                "records" if roles.withheld_person_id is None else
                f"records (the schema's person id {roles.withheld_person_id!r} is not released)"),
            row_order="release order" if roles.layout == "with-ids" else "random (classes and rows within a class)",
            class_ids="engine class ids" if roles.layout == "with-ids" else "opaque random 64-bit ids",
        )
    except OSError as e:
        raise UsageError(f"--output: cannot write {str(path)!r}: {e.strerror or e}") from None


# ============================================================================ commands
@guarded("stream-anon anonymize")
def cmd_anonymize(args: argparse.Namespace) -> int:
    path = input_file("--input", args.input, env=ADULT_ENV)
    schema = build_schema(args)
    config = config_from_args(args)
    out = output_file("--output", args.output, inputs=(path,)) if args.output else None
    summary_path = output_file("--summary", args.summary, inputs=(path,)) if args.summary else None
    if out is not None and summary_path is not None and out.resolve() == summary_path.resolve():
        raise UsageError(f"--summary: {str(summary_path)!r} is also the --output file; choose another path")
    if out is None and args.keep_ids:
        raise UsageError("--keep-ids: only with --output (it sets the released file's layout)")
    engine = build_engine(schema, config)
    df, fmt = load_input(path, schema, args.format, schema_given=args.schema is not None)
    releases, seconds = run_engine(engine, df)
    summary = summarize(engine, releases, seconds)
    summary["input"] = str(path)
    summary["format"] = fmt
    if out is not None:
        references: dict[str, tuple[tuple[Any, int], ...]] = {}
        table, roles = release_table(releases, schema, keep_ids=args.keep_ids, rng=release_rng(args.release_seed),
                                     references=references)
        meta = write_release(out, table, roles, schema, config, requirement=engine.diversity,
                             references=references)
        summary["release"] = {"layout": roles.layout, "file": str(out), "meta": str(meta)}
        if args.keep_ids:
            print("stream-anon anonymize: warning: --keep-ids: the release carries record ids, engine class ids "
                  "and release order; it is an internal file, outside the threat model (docs/offline-tools.md)",
                  file=sys.stderr)
    if summary_path is not None:
        write_text("--summary", summary_path, json.dumps(summary, indent=2) + "\n")
    rate = summary["records_per_second"]
    print(f"{summary['records_in']} records in, {summary['records_released']} released in "
          f"{summary['classes']} classes, {summary['records_suppressed']} suppressed; "
          f"GT loss {summary['gt_loss']:.4f}, max delay {summary['max_delay']}"
          + (f", {rate:.0f} records/s (engine)" if rate else ""))
    return 0


@guarded("stream-anon verify", ValueError)  # core.verify.RolesError is a ValueError
def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every check passes, 1 on a violation, 2 when the roles or the input are unclear."""
    from stream_anon.core.diversity import DiversityParameterError, DiversityRequirement
    from stream_anon.core.schema import adult_schema
    from stream_anon.core.verify import verify_release_file

    if args.k < 2:
        raise UsageError(f"--k: must be an integer >= 2 (k=1 holds for any table), got {args.k}")
    try:
        requirement = DiversityRequirement(model=args.diversity, l=args.l, c=args.c, t=args.t_closeness)
    except DiversityParameterError as e:
        raise UsageError(f"--{e.parameter.replace('_', '-')}: must be {e.allowed}, got {e.value!r}") from None
    path = input_file("--input", args.input)
    if args.schema and args.adult_schema:
        raise UsageError("--schema and --adult-schema: give one of them, not both")
    if args.meta is not None and args.no_meta:
        raise UsageError("--meta and --no-meta: give one of them, not both")
    schema = load_schema("--schema", args.schema) if args.schema else (adult_schema() if args.adult_schema else None)
    meta: Path | bool = input_file("--meta", args.meta) if args.meta is not None else not args.no_meta
    qis = comma_list("--qi", args.qi)
    report = verify_release_file(path, args.k, None, qis, args.sensitive, person_id=args.person_id,
                                 schema=schema, meta=meta, requirement=requirement if requirement.active else None,
                                 t_distance=args.t_distance)
    roles = report.roles
    assert roles is not None
    print(roles.describe())
    if roles.withheld_person_id:
        print(f"note: the release does not carry the person id {roles.withheld_person_id!r}: class sizes count "
              f"records, and a class of k records may hold fewer than k individuals")
    params = f"k={args.k}{'' if not requirement.active else ', ' + requirement.describe()}"
    for note in report.notes:
        print(f"note: {note}")
    if report.ok:
        print(f"OK: {report.records} records in {report.classes} classes, smallest class {report.min_class_size} "
              f"{report.size_unit} ({params})")
        return 0
    print(f"VIOLATIONS in {path} ({params}):")
    for v in report.violations:
        print(f"  {v}")
    return 1


def optional_number(text: str) -> int | float | None:
    """argparse ``type``: ``2`` -> 2, ``1.5`` -> 1.5, ``none`` -> None (the option off)."""
    if text.strip().lower() in ("none", "null", "off"):
        return None
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None
    return int(v) if v.is_integer() else v


def optional_float(text: str) -> float | None:
    """argparse ``type``: a number, or ``none`` (the option off)."""
    if text.strip().lower() in ("none", "null", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None


def add_diversity_arguments(p: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """--l, --diversity, --c, --t-closeness, --t-distance: ``anonymize`` starts from the shared defaults
    (:mod:`stream_anon.core.defaults`), ``verify`` checks only what it is asked to."""
    d = DEFAULTS
    l_default, t_default = (d.l, d.t_closeness) if with_defaults else (None, None)
    shown = (lambda v: f"; default {v if v is not None else 'none'}, as the service") if with_defaults else (
        lambda v: "")
    p.add_argument("--l", type=optional_number, default=l_default,
                   help=f"l of the l-diversity model: distinct sensitive values per class (an integer; with "
                        f"--diversity entropy any number >= 1; 'none': off{shown(l_default)})")
    p.add_argument("--diversity", choices=list(DIVERSITY_MODELS), default=d.diversity,
                   help="l-diversity model: distinct (>= l values), entropy (entropy >= log l) or recursive "
                        f"(r1 < c (r_l + ... + r_m), needs --c); default {d.diversity}")
    p.add_argument("--c", type=float, default=None, help="c of recursive (c, l)-diversity (> 0)")
    p.add_argument("--t-closeness", type=optional_float, default=t_default,
                   help="t-closeness: EMD of every class's sensitive distribution to the reference <= t ('none': "
                        f"off{shown(t_default)})")
    p.add_argument("--t-distance", choices=list(T_DISTANCES), default=d.t_distance,
                   help="ground distance of t-closeness: auto (ordered if numeric, else equal), equal, ordered")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The engine's options, with the defaults every command shares (:mod:`stream_anon.core.defaults`)."""
    d = DEFAULTS
    p.add_argument("--k", type=int, default=d.k, help=f"k: distinct individuals per released class (>= 2; default "
                                                      f"{d.k})")
    p.add_argument("--delta", type=int, default=d.delta, help=f"delay bound in arrivals (>= k; default {d.delta})")
    p.add_argument("--beta", type=int, default=d.beta, help=f"max open clusters (>= 1; default {d.beta})")
    p.add_argument("--mu", type=int, default=d.mu, help=f"recent released clusters that set tau (>= 1; default {d.mu})")
    p.add_argument("--algorithm", choices=["castle", "ubdsa"], default=d.algorithm,
                   help=f"default {d.algorithm}")
    p.add_argument("--loss", choices=["gt", "lm", "ubdsa"], default=d.loss,
                   help=f"loss scoring the cluster choice (default {d.loss})")
    p.add_argument("--leftover", choices=["suppress", "leftover"], default=d.leftover, help=f"default {d.leftover}")
    p.add_argument("--delta-leftover", type=int, default=None, help="max further wait in the leftover cluster")
    add_diversity_arguments(p, with_defaults=True)
    p.add_argument("--t-reference-every", type=int, default=None,
                   help="t-closeness: freeze the running distribution every this many arrivals (default: delta)")
    p.add_argument("--zeta", type=int, default=d.zeta,
                   help=f"released clusters kept for CASTLE's reuse (default {d.zeta}: no reuse, as the service; "
                        f"reuse publishes single records, docs/threat-model.md)")
    p.add_argument("--max-age", type=int, default=None, help="drop reuse clusters older than this many arrivals")
    p.add_argument("--adaptive-delay", action="store_true", help="adapt the delay within [delta-min, delta]")
    p.add_argument("--delta-min", type=int, default=None, help="lower bound of the adaptive delay")
    p.add_argument("--age-weight", type=float, default=0.5, help="UBDSA: weight of the age pressure")
    p.add_argument("--release-slack", type=float, default=1.0,
                   help="UBDSA: early release when loss <= tau * (1 + slack * age)")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's random choices (default 0)")


def register(sub: Any) -> None:
    p = one_line_errors(sub.add_parser(
        "anonymize", help="stream a file through the k-anonymity engine",
        description="Stream a file (ADULT format or CSV with a schema) through CASTLE/UBDSA in arrival order; "
                    "write the released table (public layout: opaque class ids, random order, no record ids), "
                    "its meta file <output>.meta.json and a JSON summary. See docs/offline-tools.md."))
    p.add_argument("--input", default=None, help=f"input file (default ${ADULT_ENV})")
    p.add_argument("--format", choices=["adult", "csv"], default=None, help="input format (default: detected)")
    p.add_argument("--schema", default=None, help="schema YAML/JSON (default: the shipped ADULT schema)")
    p.add_argument("--qi", default=None, help="comma-separated quasi-identifiers (default: the schema's)")
    p.add_argument("--sensitive", default=None, help="sensitive attribute (default: the schema's)")
    add_engine_arguments(p)
    p.add_argument("--output", default=None,
                   help="released CSV (public layout); its roles go to OUTPUT.meta.json beside it")
    p.add_argument("--keep-ids", action="store_true",
                   help="internal layout instead: record_id (and the person id), engine class ids, release order; "
                        "outside the threat model")
    p.add_argument("--release-seed", type=int, default=None,
                   help="tests only: seed of the release's class ids and row order (default: the OS's CSPRNG; "
                        "a seeded release is predictable)")
    p.add_argument("--summary", default=None, help="summary JSON (engine figures)")
    p.set_defaults(func=cmd_anonymize)

    v = one_line_errors(sub.add_parser(
        "verify", help="check a released CSV for k-anonymity (and l-diversity)",
        description="Check a released CSV independently of the engine; exit 1 on any violation, 2 when the "
                    "column roles are unknown. Roles come from --qi/--sensitive, else the release's meta file "
                    "(<input>.meta.json, or --meta), else --schema; verify never guesses."))
    v.add_argument("--input", required=True, help="released CSV (anonymize --output), either layout")
    v.add_argument("--k", type=int, required=True, help="every class must hold >= k distinct individuals (>= 2)")
    add_diversity_arguments(v, with_defaults=False)
    v.add_argument("--qi", default=None, help="comma-separated QI columns (overrides the meta file and the schema)")
    v.add_argument("--sensitive", default=None, help="the sensitive column (overrides the meta file and the schema)")
    v.add_argument("--person-id", default=None, help="column of person ids: class sizes count distinct persons")
    v.add_argument("--meta", default=None, help="the release's meta file (default: INPUT.meta.json when it exists)")
    v.add_argument("--no-meta", action="store_true", help="ignore INPUT.meta.json")
    v.add_argument("--schema", default=None, help="schema: roles (when no meta file) and a parse check of the "
                                                  "released strings")
    v.add_argument("--adult-schema", action="store_true", help="as --schema with the shipped ADULT schema")
    v.set_defaults(func=cmd_verify)
