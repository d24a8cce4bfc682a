"""The work of ``stream-anon perturb`` and ``stream-anon estimate`` (their options: :mod:`stream_anon.cli.privacy`,
which imports this module when the command runs, so that ``--help`` needs neither numpy nor pandas)."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.cli.arguments import (
    UsageError,
    comma_list,
    input_file,
    load_schema,
    output_file,
    write_text,
)
from stream_anon.core.datasets import ADULT_ENV, DatasetError, read_records
from stream_anon.core.schema import Attribute, Kind, Role, Schema
from stream_anon.privacy.base import PrivacyParameterError, secure_rng
from stream_anon.privacy.budget import (
    BudgetAccountant,
    sequential_composition,
    split_budget,
)
from stream_anon.privacy.display import format_epsilon
from stream_anon.privacy.frequency import FrequencyEstimate
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import (
    VARIANTS,
    LExtendedSubstitution,
    RandomSubstitution,
    gamma_for_epsilon,
)

MECHANISMS = ("krr", "rs", "rs-l", "blap")  # the choices of stream_anon.cli.privacy (its own copy: no numpy)
MAX_INTEGER_DOMAIN = 1000  # numeric columns with at most this many integer values may be used as categories


# ============================================================================ helpers
def _columns(arg: str | None, schema: Schema, mechanism: str) -> list[str]:
    cols = comma_list("--columns", arg)
    if cols is None:
        if mechanism == "blap":
            cols = [a.name for a in schema.attributes if a.role is not Role.IDENTIFIER]
        else:
            cols = [a.name for a in schema.attributes if a.kind is Kind.CATEGORICAL and a.role is not Role.IDENTIFIER]
        if not cols:
            raise UsageError(f"--columns: schema {schema.name!r} has no {'non-identifier' if mechanism == 'blap' else 'categorical'} "
                             f"column to perturb by default; name them with --columns")
        return cols
    for c in cols:
        if c not in schema:
            raise UsageError(f"--columns: unknown column {c!r}; allowed: {', '.join(schema.names)}")
    return cols


def categories_of(attr: Attribute) -> list[Any]:
    """The public categorical domain of a column (numeric integer columns: every integer in the domain)."""
    if attr.kind is Kind.CATEGORICAL:
        vals = list(attr.domain_values)
        if len(vals) < 2:
            raise UsageError(f"column {attr.name!r}: no public categorical domain in the schema (declare its "
                             f"'values' or a 'hierarchy'; got {len(vals)} value(s))")
        return vals
    if attr.integer and attr.lo is not None and attr.hi is not None and attr.hi - attr.lo + 1 <= MAX_INTEGER_DOMAIN:
        return list(range(int(attr.lo), int(attr.hi) + 1))
    raise UsageError(f"column {attr.name!r}: numeric with domain [{attr.lo}, {attr.hi}] has more than "
                     f"{MAX_INTEGER_DOMAIN} values; use --mechanism blap for it")


def _column_epsilons(args: argparse.Namespace, cols: list[str]) -> dict[str, float | None]:
    """Per-column eps from --epsilon (per attribute, or split from a per-record total); None = from --gamma."""
    if args.gamma is not None:
        if args.mechanism not in ("rs", "rs-l"):
            raise UsageError(f"--gamma: only for --mechanism rs or rs-l, got --mechanism {args.mechanism}")
        if args.epsilon is not None:
            raise UsageError("give --epsilon or --gamma, not both")
        if args.budget == "per-record":
            raise UsageError("--budget per-record splits --epsilon; it cannot be used with --gamma")
        return dict.fromkeys(cols)
    if args.epsilon is None:
        raise UsageError("--epsilon is required (or --gamma for rs / rs-l)")
    if args.budget == "per-record":
        parts = split_budget(args.epsilon, {c: 1.0 for c in cols})
        assert isinstance(parts, dict)
        return {c: float(parts[c]) for c in cols}
    return dict.fromkeys(cols, float(args.epsilon))


def build_mechanism(mechanism: str, attr: Attribute, *, epsilon: float | None, gamma: float | None, l: int,  # noqa: E741
                    variant: str, rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
    """The mechanism for one column and the parameters that describe it (eps is exact)."""
    if mechanism == "blap":
        if epsilon is None:
            raise UsageError("--mechanism blap needs --epsilon")
        from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace

        if attr.kind is Kind.NUMERIC:
            if attr.lo is None or attr.hi is None:
                raise UsageError(f"column {attr.name!r}: numeric column without public bounds in the schema")
            blap = BoundedLaplace(epsilon=epsilon, lower=float(attr.lo), upper=float(attr.hi), rng=rng)
            return blap, {"mechanism": "bounded-laplace", "epsilon": blap.epsilon, "lower": blap.lower,
                          "upper": blap.upper, "scale": blap.scale}
        dblap = DiscretizedBoundedLaplace(epsilon=epsilon, categories=categories_of(attr), rng=rng)
        return dblap, {"mechanism": "discretized-bounded-laplace", "epsilon": dblap.epsilon, "k": dblap.m}
    cats = categories_of(attr)
    if mechanism == "krr":
        if epsilon is None:
            raise UsageError("--mechanism krr needs --epsilon")
        krr = KRandomizedResponse(epsilon=epsilon, categories=cats, rng=rng)
        return krr, {"mechanism": "krr", "epsilon": krr.epsilon, "k": krr.k, "p": krr.p, "q": krr.q}
    if mechanism == "rs":
        rs = RandomSubstitution(categories=cats, gamma=gamma, epsilon=None if gamma is not None else epsilon, rng=rng)
        return rs, {"mechanism": "rs", "epsilon": rs.epsilon, "k": rs.k, "gamma": rs.gamma}
    if mechanism == "rs-l":
        if variant not in VARIANTS:
            raise UsageError(f"--variant: must be one of {', '.join(VARIANTS)}, got {variant!r}")
        g = gamma if gamma is not None else gamma_for_epsilon(len(cats), float(epsilon or 0.0), l, variant)  # type: ignore[arg-type]
        m = LExtendedSubstitution(categories=cats, gamma=g, l=l, variant=variant, rng=rng)  # type: ignore[arg-type]
        info = {"mechanism": "rs-l", "epsilon": m.epsilon, "k": m.k, "gamma": m.gamma, "l": m.l,
                "variant": m.variant}
        if variant == "no-repeat":
            info["epsilon_if_draw_order"] = m.epsilon_draw_order
            info["output"] = "shuffled set of l distinct values"
        return m, info
    raise UsageError(f"--mechanism: must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")


def describe_mechanism(info: dict[str, Any]) -> str:
    """One-cell description of a column's mechanism, written beside the reports (``mechanism.<column>``)."""
    parts = [str(info["mechanism"])]
    for key in ("variant", "l", "gamma"):
        if key in info:
            parts.append(f"{key}={info[key]!r}" if key == "gamma" else f"{key}={info[key]}")
    return ";".join(parts)


def parse_mechanism(text: str) -> dict[str, Any]:
    head, *rest = text.split(";")
    out: dict[str, Any] = {"mechanism": head}
    for item in rest:
        key, _, value = item.partition("=")
        out[key] = int(value) if key == "l" else float(value) if key == "gamma" else value
    return out


def _column_values(df: pd.DataFrame, attr: Attribute) -> np.ndarray:
    values = df[attr.name].to_numpy()
    if attr.kind is Kind.NUMERIC and values.dtype == object:
        values = pd.to_numeric(df[attr.name]).to_numpy()
    return values


# ============================================================================ input
def read_input(option: str, path: Path, schema: Schema, fmt: str | None, *, schema_given: bool) -> pd.DataFrame:
    """The validated records of ``path`` (any CSV of ``schema``, or the UCI ADULT layout)."""
    try:
        df, _ = read_records(path, schema, fmt)
    except DatasetError as e:
        hint = "" if schema_given or "required by schema" not in str(e) else (
            " (without --schema the input must be ADULT; give --schema for another data set)")
        raise UsageError(f"{option}: {e}{hint}") from None
    return df


# ============================================================================ perturb
def run_perturb(args: argparse.Namespace) -> int:
    schema = load_schema("--schema", args.schema)
    path = input_file("--input", args.input, env=None if args.schema else ADULT_ENV)
    output = output_file("--output", args.output, inputs=(path,))
    summary_path = output_file("--summary", args.summary, inputs=(path, output)) if args.summary else None
    if summary_path is not None and summary_path.resolve() == output.resolve():
        raise UsageError(f"--summary: {str(summary_path)!r} is also the --output file; choose another path")
    cols = _columns(args.columns, schema, args.mechanism)
    eps_by_col = _column_epsilons(args, cols)
    rng = secure_rng(args.seed)
    info: dict[str, dict[str, Any]] = {}
    mechs: dict[str, Any] = {}
    for c in cols:
        try:
            mechs[c], info[c] = build_mechanism(args.mechanism, schema[c], epsilon=eps_by_col[c], gamma=args.gamma,
                                                l=args.l, variant=args.variant or "independent", rng=rng)
        except PrivacyParameterError as e:
            raise UsageError(f"column {c!r} ({len(categories_of(schema[c])) if args.mechanism != 'blap' else ''}"
                             f"{' categories' if args.mechanism != 'blap' else schema[c].describe_domain()}): {e}"
                             ) from None
    # per-record sequential composition, checked against the record budget before anything is released
    record_eps = sequential_composition({c: info[c]["epsilon"] for c in cols})
    budget_total = args.record_budget if args.record_budget is not None else (
        args.epsilon if args.budget == "per-record" else record_eps)
    accountant = BudgetAccountant(total_epsilon=budget_total)
    for c in cols:
        accountant.spend(info[c]["epsilon"], f"column {c!r}")
    df = read_input("--input", path, schema, args.format, schema_given=args.schema is not None)
    n = len(df)
    rid = schema.record_id or "id"
    out = pd.DataFrame({rid: df[rid]}) if args.keep_ids else pd.DataFrame(index=pd.RangeIndex(n))
    total_time = 0.0
    total_values = 0
    for c in cols:
        attr = schema[c]
        values = _column_values(df, attr)
        t0 = time.perf_counter()
        reports = mechs[c].randomise_many(values)
        dt = time.perf_counter() - t0
        total_time += dt
        total_values += n
        if args.mechanism == "rs-l":
            for j in range(reports.shape[1]):
                out[f"{c}#{j + 1}"] = reports[:, j]
            info[c]["draws_used"] = int(mechs[c].draws_used)
            info[c]["draws_per_record"] = mechs[c].draws_used / max(n, 1)
        else:
            out[c] = reports
        info[c]["seconds"] = dt
        info[c]["values_per_s"] = n / dt if dt > 0 else math.inf
    if not args.keep_ids:  # the public layout: no id, and the row order (arrival, file position) hidden
        out = out.iloc[rng.permutation(n)].reset_index(drop=True)
    for c in cols:
        out[f"mechanism.{c}"] = describe_mechanism(info[c])
    for c in cols:
        out[f"epsilon.{c}"] = info[c]["epsilon"]
    out["epsilon.record"] = record_eps
    try:
        out.to_csv(output, index=False, float_format="%.10g" if args.mechanism == "blap" else None)
    except OSError as e:
        raise UsageError(f"--output: cannot write {str(output)!r}: {e.strerror or e}") from None
    summary = {
        "command": "perturb", "mechanism": args.mechanism, "input": str(path), "schema": schema.name,
        "output": str(output), "n_records": n, "columns": info, "budget": args.budget,
        "epsilon_per_record": record_eps, "record_budget": budget_total,
        "composition": "sequential: eps per record = sum of the columns' eps",
        "values_per_s": total_values / total_time if total_time > 0 else math.inf,
        "perturb_seconds": total_time, "seed": args.seed,
    }
    if summary_path is not None:
        write_text("--summary", summary_path, json.dumps(summary, indent=2))
    per_col = ", ".join(f"{c}={format_epsilon(info[c]['epsilon'])}" for c in cols)
    print(f"perturbed {n:,} records x {len(cols)} column(s) with {args.mechanism}: eps per record "
          f"{format_epsilon(record_eps)} ({per_col}); {summary['values_per_s']:,.0f} values/s -> {output}")
    return 0


# ============================================================================ estimate
def _read_reports(path: Path, schema: Schema, mechanism: str, cols_arg: str | None
                  ) -> tuple[pd.DataFrame, list[str]]:
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UsageError(f"--input: {str(path)!r} is not a readable CSV: {e}") from None
    cols = comma_list("--columns", cols_arg)
    if cols is None:
        cols = [c[len("epsilon."):] for c in df.columns if c.startswith("epsilon.") and c != "epsilon.record"]
    for c in cols:
        if c not in schema:
            raise UsageError(f"--columns: unknown column {c!r} (schema {schema.name!r}); allowed: "
                             f"{', '.join(schema.names)}")
        if f"epsilon.{c}" not in df.columns:
            raise UsageError(f"--input: {str(path)!r} has no column 'epsilon.{c}': is it a 'stream-anon perturb' "
                             f"output for {c!r}?")
        present = c in df.columns if mechanism != "rs-l" else f"{c}#1" in df.columns
        if not present:
            raise UsageError(f"--input: {str(path)!r} has no reports for column {c!r} (mechanism {mechanism}); "
                             f"found {list(df.columns)}")
    if not cols:
        raise UsageError(f"--input: {str(path)!r} has no perturbed columns (expected 'epsilon.<column>' columns)")
    if len(df) == 0:
        raise UsageError(f"--input: {str(path)!r} holds no reports (a header only)")
    return df, cols


def _bad_value(path: Path, column: str, series: pd.Series, bad: np.ndarray, allowed: str) -> UsageError:
    i = int(np.flatnonzero(bad)[0])
    return UsageError(f"--input: {str(path)!r} row {i + 1}, column {column!r}: {series.iloc[i]!r} is not a possible "
                      f"report; expected {allowed}")


def _reports(path: Path, column: str, series: pd.Series, attr: Attribute, mechanism: str) -> np.ndarray:
    """The reports of one column, typed and checked against the public domain (a clear error otherwise)."""
    if attr.kind is Kind.NUMERIC and mechanism == "blap":
        num = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(num)
        assert attr.lo is not None and attr.hi is not None
        bad |= (num < attr.lo) | (num > attr.hi)
        if bad.any():
            raise _bad_value(path, column, series, bad, f"a number in [{attr.lo:g}, {attr.hi:g}] "
                                                         f"(bounded Laplace reports stay in the public domain)")
        return num
    cats = categories_of(attr)
    if attr.kind is Kind.NUMERIC:
        num = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(num) & (num == np.round(num)) & (num >= cats[0]) & (num <= cats[-1])
        if not ok.all():
            raise _bad_value(path, column, series, ~ok, attr.describe_domain())
        return num.astype(np.int64)
    values = series.to_numpy(dtype=object)
    ok = np.isin(values, np.asarray(cats, dtype=object))
    if not ok.all():
        raise _bad_value(path, column, series, ~ok, attr.describe_domain())
    return values


def _constant(path: Path, df: pd.DataFrame, column: str) -> float:
    values = pd.to_numeric(df[column], errors="coerce").unique()
    if len(values) != 1 or not np.isfinite(values[0]) or values[0] <= 0:
        raise UsageError(f"--input: {str(path)!r} column {column!r} must hold one positive eps for all rows, got "
                         f"{list(df[column].unique()[:5])}; estimate one release at a time")
    return float(values[0])


def run_estimate(args: argparse.Namespace) -> int:
    schema = load_schema("--schema", args.schema)
    path = input_file("--input", args.input)
    truth_path = input_file("--truth", args.truth) if args.truth else None
    output = output_file("--output", args.output, inputs=tuple(p for p in (path, truth_path) if p is not None))
    df, cols = _read_reports(path, schema, args.mechanism, args.columns)
    truth = (read_input("--truth", truth_path, schema, args.format, schema_given=args.schema is not None)
             if truth_path is not None else None)
    if truth is not None and len(truth) != len(df):
        raise UsageError(f"--truth: {str(truth_path)!r} has {len(truth)} records but --input {str(path)!r} has "
                         f"{len(df)}")
    rng = secure_rng(0)  # estimators draw no randomness; the generator is only required by the constructors
    result: dict[str, Any] = {"command": "estimate", "mechanism": args.mechanism, "input": str(path),
                              "n_records": len(df), "columns": {}}
    for c in cols:
        attr = schema[c]
        eps = _constant(path, df, f"epsilon.{c}")
        stated: dict[str, Any] = {}
        if f"mechanism.{c}" in df.columns:
            descs = df[f"mechanism.{c}"].unique()
            if len(descs) != 1:
                raise UsageError(f"--input: {str(path)!r} column 'mechanism.{c}' is not constant; estimate one release at a time")
            stated = parse_mechanism(str(descs[0]))
            family = {"bounded-laplace": "blap", "discretized-bounded-laplace": "blap"}.get(
                stated["mechanism"], stated["mechanism"])
            if family != args.mechanism:
                raise UsageError(f"column {c!r}: the reports were made with {stated['mechanism']!r}, "
                                 f"not --mechanism {args.mechanism}")
            if args.variant is not None and stated.get("variant", args.variant) != args.variant:
                raise UsageError(f"column {c!r}: the reports were made with variant {stated['variant']!r}, "
                                 f"not --variant {args.variant}")
        if args.mechanism == "rs-l":
            n_reports = sum(1 for name in df.columns if name.startswith(f"{c}#"))
            variant = str(stated.get("variant") or args.variant or "independent")
            if variant not in VARIANTS:
                raise UsageError(f"column {c!r}: unknown variant {variant!r}; expected one of {VARIANTS}")
            cats = categories_of(attr)
            g = args.gamma if args.gamma is not None else stated.get("gamma") or gamma_for_epsilon(
                len(cats), eps, n_reports, variant)  # type: ignore[arg-type]
            mech, info = build_mechanism("rs-l", attr, epsilon=None, gamma=g, l=n_reports, variant=variant, rng=rng)
            if not math.isclose(info["epsilon"], eps, rel_tol=1e-6):
                raise UsageError(f"column {c!r}: the reports state eps={eps:.6g} but rs-l with gamma={g:.6g}, "
                                 f"l={n_reports}, variant={variant} has eps={info['epsilon']:.6g}: check --gamma/--variant")
            reports = np.stack([_reports(path, f"{c}#{j + 1}", df[f"{c}#{j + 1}"], attr, "rs-l")
                                for j in range(n_reports)], axis=1)
        else:
            gamma = (stated.get("gamma") or math.exp(eps)) if args.mechanism == "rs" else None
            mech, info = build_mechanism(args.mechanism, attr, epsilon=None if gamma else eps, gamma=gamma, l=1,
                                         variant="independent", rng=rng)
            reports = _reports(path, c, df[c], attr, args.mechanism)
        entry: dict[str, Any] = {"parameters": info}
        if args.mechanism == "blap" and attr.kind is Kind.NUMERIC:
            mean, se = mech.estimate_mean(reports)
            entry.update({"kind": "numeric", "estimated_mean": float(mean), "std_error": float(se)})
            if truth is not None:
                true_mean = float(truth[c].to_numpy(dtype=float).mean())
                entry["truth"] = {"mean": true_mean, "abs_error": abs(float(mean) - true_mean),
                                  "error_in_std_errors": abs(float(mean) - true_mean) / float(se) if se > 0 else None}
        else:
            est: FrequencyEstimate = mech.estimate_counts(reports)
            entry.update({"kind": "categorical", **est.to_json()})
            if truth is not None:
                cats = list(est.categories)
                true_counts = truth[c].value_counts().reindex(cats, fill_value=0).to_numpy(dtype=float)
                entry["truth"] = {"counts": [float(v) for v in true_counts], **est.compare(true_counts)}
        result["columns"][c] = entry
        if "truth" in entry:
            t = entry["truth"]
            msg = (f"abs error of mean {t['abs_error']:.4g} ({t['error_in_std_errors']:.2f} SE)" if "mean" in t
                   else f"max |freq error| {t['max_abs_frequency_error']:.4f}, TV {t['total_variation']:.4f}")
            print(f"{c}: eps={format_epsilon(info['epsilon'])}, {msg}")
    result["epsilon_per_record"] = sequential_composition(
        [result["columns"][c]["parameters"]["epsilon"] for c in cols])
    write_text("--output", output, json.dumps(result, indent=2))
    print(f"estimated {len(cols)} column(s) from {len(df):,} records -> {output}")
    return 0
