"""``stream-anon perturb`` (client side: locally randomize columns) and ``stream-anon estimate`` (server side).

perturb: reads ADULT (``--input``, default ``$STREAM_ANON_ADULT``), perturbs ``--columns`` with one mechanism
  (``krr`` k-RR, ``rs`` FRAPP random substitution, ``rs-l`` l-extended substitution, ``blap`` bounded
  Laplace / its discretized form for categories), writes ``--output`` CSV (record id, the perturbed values,
  ``epsilon.<column>`` and ``epsilon.record`` per row) and a ``--summary`` JSON (eps per column and per record
  = sequential composition, values/s).
estimate: reads that CSV and recovers each column's distribution (categorical: unbiased counts with standard
  errors; numeric blap: the mean with its standard error); with ``--truth`` also the error against the true
  data (max abs count/frequency error, total variation, relative L2 error; numeric: abs error of the mean).

Domains are public: categorical = the schema's hierarchy leaves / values; numeric = the schema's domain.
Exit codes: 0 success, 2 bad input or parameter (message names it), 3 privacy budget exhausted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.core.datasets import DatasetError, read_adult
from stream_anon.core.schema import Attribute, Kind, Schema, adult_schema
from stream_anon.privacy.base import PrivacyParameterError, secure_rng
from stream_anon.privacy.budget import (
    BudgetAccountant,
    BudgetExhaustedError,
    sequential_composition,
    split_budget,
)
from stream_anon.privacy.frequency import FrequencyEstimate
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import (
    VARIANTS,
    LExtendedSubstitution,
    RandomSubstitution,
    gamma_for_epsilon,
)

MECHANISMS = ("krr", "rs", "rs-l", "blap")
MAX_INTEGER_DOMAIN = 1000  # numeric columns with at most this many integer values may be used as categories


class UsageError(ValueError):
    """Bad command-line input (exit code 2)."""


# ============================================================================ helpers
def _columns(arg: str | None, schema: Schema, mechanism: str) -> list[str]:
    if not arg:
        if mechanism == "blap":
            return [a.name for a in schema.attributes if a.role.value != "identifier"]
        return [a.name for a in schema.attributes if a.kind is Kind.CATEGORICAL]
    cols = [c.strip() for c in arg.split(",") if c.strip()]
    for c in cols:
        if c not in schema:
            raise UsageError(f"--columns: unknown column {c!r}; allowed: {', '.join(schema.names)}")
    if len(set(cols)) != len(cols):
        raise UsageError(f"--columns: each column at most once, got {arg!r}")
    return cols


def categories_of(attr: Attribute) -> list[Any]:
    """The public categorical domain of a column (numeric integer columns: every integer in the domain)."""
    if attr.kind is Kind.CATEGORICAL:
        vals = list(attr.domain_values)
        if len(vals) < 2:
            raise UsageError(f"column {attr.name!r}: no public categorical domain in the schema")
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


# ============================================================================ perturb
def run_perturb(args: argparse.Namespace) -> int:
    schema = adult_schema()
    df = read_adult(args.input)
    cols = _columns(args.columns, schema, args.mechanism)
    eps_by_col = _column_epsilons(args, cols)
    rng = secure_rng(args.seed)
    out = pd.DataFrame({"id": df["id"]})
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
    n = len(df)
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
    for c in cols:
        out[f"mechanism.{c}"] = describe_mechanism(info[c])
    for c in cols:
        out[f"epsilon.{c}"] = info[c]["epsilon"]
    out["epsilon.record"] = record_eps
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.output, index=False, float_format="%.10g" if args.mechanism == "blap" else None)
    summary = {
        "command": "perturb", "mechanism": args.mechanism, "input": str(args.input or "$STREAM_ANON_ADULT"),
        "output": str(args.output), "n_records": n, "columns": info, "budget": args.budget,
        "epsilon_per_record": record_eps, "record_budget": budget_total,
        "composition": "sequential: eps per record = sum of the columns' eps",
        "values_per_s": total_values / total_time if total_time > 0 else math.inf,
        "perturb_seconds": total_time, "seed": args.seed,
    }
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    per_col = ", ".join("{}={:.4g}".format(c, info[c]["epsilon"]) for c in cols)
    print(f"perturbed {n:,} records x {len(cols)} column(s) with {args.mechanism}: eps per record "
          f"{record_eps:.6g} ({per_col}); {summary['values_per_s']:,.0f} values/s -> {args.output}")
    return 0


# ============================================================================ estimate
def _read_reports(path: str, schema: Schema, mechanism: str, cols_arg: str | None
                  ) -> tuple[pd.DataFrame, list[str]]:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    if cols_arg:
        cols = [c.strip() for c in cols_arg.split(",") if c.strip()]
    else:
        cols = [c[len("epsilon."):] for c in df.columns if c.startswith("epsilon.") and c != "epsilon.record"]
    for c in cols:
        if c not in schema:
            raise UsageError(f"--columns: unknown column {c!r}; allowed: {', '.join(schema.names)}")
        if f"epsilon.{c}" not in df.columns:
            raise UsageError(f"{path}: column 'epsilon.{c}' missing: is this a 'stream-anon perturb' output for {c!r}?")
        present = c in df.columns if mechanism != "rs-l" else f"{c}#1" in df.columns
        if not present:
            raise UsageError(f"{path}: no reports for column {c!r} (mechanism {mechanism}); found {list(df.columns)}")
    if not cols:
        raise UsageError(f"{path}: no perturbed columns found (expected 'epsilon.<column>' columns)")
    return df, cols


def _typed(series: pd.Series, attr: Attribute, as_float: bool = False) -> np.ndarray:
    if attr.kind is Kind.NUMERIC:
        num = pd.to_numeric(series, errors="raise")
        return num.to_numpy(dtype=float) if as_float else num.to_numpy(dtype=np.int64)
    return series.to_numpy(dtype=object)


def run_estimate(args: argparse.Namespace) -> int:
    schema = adult_schema()
    df, cols = _read_reports(args.input, schema, args.mechanism, args.columns)
    truth = read_adult(args.truth) if args.truth else None
    if truth is not None and len(truth) != len(df):
        raise UsageError(f"--truth has {len(truth)} records but {args.input} has {len(df)}")
    rng = secure_rng(0)  # estimators draw no randomness; the generator is only required by the constructors
    result: dict[str, Any] = {"command": "estimate", "mechanism": args.mechanism, "input": str(args.input),
                              "n_records": len(df), "columns": {}}
    for c in cols:
        attr = schema[c]
        eps_values = pd.to_numeric(df[f"epsilon.{c}"]).unique()
        if len(eps_values) != 1:
            raise UsageError(f"{args.input}: column 'epsilon.{c}' is not constant ({eps_values[:5]}); "
                             f"estimate one release at a time")
        eps = float(eps_values[0])
        stated: dict[str, Any] = {}
        if f"mechanism.{c}" in df.columns:
            descs = df[f"mechanism.{c}"].unique()
            if len(descs) != 1:
                raise UsageError(f"{args.input}: column 'mechanism.{c}' is not constant; estimate one release at a time")
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
            reports = np.stack([_typed(df[f"{c}#{j + 1}"], attr) for j in range(n_reports)], axis=1)
        else:
            gamma = (stated.get("gamma") or math.exp(eps)) if args.mechanism == "rs" else None
            mech, info = build_mechanism(args.mechanism, attr, epsilon=None if gamma else eps, gamma=gamma, l=1,
                                         variant="independent", rng=rng)
            reports = _typed(df[c], attr, as_float=args.mechanism == "blap")
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
            print(f"{c}: eps={info['epsilon']:.4g}, {msg}")
    result["epsilon_per_record"] = sequential_composition(
        [result["columns"][c]["parameters"]["epsilon"] for c in cols])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"estimated {len(cols)} column(s) from {len(df):,} records -> {args.output}")
    return 0


# ============================================================================ wiring
def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (v > 0) or math.isinf(v):
        raise argparse.ArgumentTypeError(f"expected a number in (0, inf), got {text!r}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def _guarded(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except BudgetExhaustedError as e:
            print(f"error: {e}", file=sys.stderr)
            return 3
        except (UsageError, PrivacyParameterError, DatasetError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return run


def _add_mechanism_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mechanism", required=True, choices=MECHANISMS,
                   help="krr: k-randomized response; rs: FRAPP random substitution; rs-l: l-extended substitution; "
                        "blap: bounded Laplace (numeric) / discretized bounded Laplace (categorical)")
    p.add_argument("--gamma", type=_positive_float, default=None,
                   help="rs / rs-l: gamma of the gamma-diagonal matrix instead of --epsilon")
    p.add_argument("--l", type=_positive_int, default=1, help="rs-l: reports per record (default 1)")
    p.add_argument("--variant", choices=VARIANTS, default=None,
                   help="rs-l: independent draws (eps = l ln gamma; the default) or no-repeat (the paper's; shuffled "
                        "set); estimate: taken from the reports' 'mechanism.<column>' if not given")
    p.add_argument("--columns", default=None, help="comma-separated columns (default: all categorical; blap: all)")


def register(sub: Any) -> None:
    p = sub.add_parser("perturb", help="locally randomize columns of ADULT (k-RR, substitution, bounded Laplace)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_mechanism_args(p)
    p.add_argument("--epsilon", type=_positive_float, default=None,
                   help="eps per column (--budget per-attribute) or per record, split equally (--budget per-record); "
                        "rs-l: the exact eps of the l reports")
    p.add_argument("--budget", choices=["per-attribute", "per-record"], default="per-attribute",
                   help="how --epsilon is read (default per-attribute: the record spends the sum)")
    p.add_argument("--record-budget", type=_positive_float, default=None,
                   help="refuse (exit 3) if a record's composed eps would exceed this")
    p.add_argument("--input", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    p.add_argument("--output", required=True, help="perturbed CSV")
    p.add_argument("--summary", default=None, help="summary JSON (eps per column and per record, values/s)")
    p.add_argument("--seed", type=int, default=None, help="seed (tests only; default OS entropy)")
    p.set_defaults(func=_guarded(run_perturb))

    e = sub.add_parser("estimate", help="recover per-column distributions from a perturb output",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_mechanism_args(e)
    e.add_argument("--input", required=True, help="CSV written by 'stream-anon perturb'")
    e.add_argument("--truth", default=None, help="the original ADULT file, to report the estimation error")
    e.add_argument("--output", required=True, help="estimates JSON")
    e.set_defaults(func=_guarded(run_estimate))
