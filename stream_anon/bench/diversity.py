"""``stream-anon bench diversity``: what each diversity model costs and what it protects, on all of ADULT.

The offline engine with the service's defaults (k=10, delta=1000, beta=50, mu=100, reuse off: zeta=0) streams
every ADULT record once per model: no l-diversity, distinct l=2, entropy l=2 and l=1.5, recursive (c, 2) for
c in {2, 3, 4}, t-closeness t in {0.1, 0.15, 0.2, 0.3}, and distinct l=2 with t in {0.15, 0.2, 0.3}.  For each it prints:

* GT loss (suppressed records count 1), suppressed records, classes, engine records/s;
* ``>=90 %``: the share of released records in classes where one sensitive value has >= 90 % of the class;
* ``guess``: the majority-guess rate: an attacker who places a record in its class and guesses the class's most
  frequent value is right for this share of released records; beside the prior (the overall most frequent
  value, without the release: over all records and over the released ones);
* for t-closeness, the largest EMD of a class to the reference it was checked against and to the final
  distribution of the released records.

``--sensitive occupation`` runs the same with a many-valued sensitive attribute (occupation then is no QI);
``--models`` picks models by name; ``--seeds 0,1,2`` averages over engine seeds; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_anon.core.datasets import read_adult
from stream_anon.core.diversity import disclosure_figures, emd, sorted_values
from stream_anon.core.engine import Engine, EngineConfig, Release
from stream_anon.core.loss import summarize_releases
from stream_anon.core.schema import adult_schema

SERVICE_DEFAULTS: dict[str, Any] = {"k": 10, "delta": 1000, "beta": 50, "mu": 100, "zeta": 0}
MODELS: dict[str, dict[str, Any]] = {
    "none": {},
    "distinct-2": {"l": 2},
    "entropy-2": {"diversity": "entropy", "l": 2},
    "entropy-1.5": {"diversity": "entropy", "l": 1.5},
    "recursive-2-2": {"diversity": "recursive", "c": 2, "l": 2},
    "recursive-3-2": {"diversity": "recursive", "c": 3, "l": 2},
    "recursive-4-2": {"diversity": "recursive", "c": 4, "l": 2},
    "t-0.1": {"t_closeness": 0.1},
    "t-0.15": {"t_closeness": 0.15},
    "t-0.2": {"t_closeness": 0.2},
    "t-0.3": {"t_closeness": 0.3},
    "distinct-2+t-0.15": {"l": 2, "t_closeness": 0.15},
    "distinct-2+t-0.2": {"l": 2, "t_closeness": 0.2},
    "distinct-2+t-0.3": {"l": 2, "t_closeness": 0.3},
}


def run_model(records: list[dict[str, Any]], cols: dict[str, list[Any]], sensitive: str, qis: Sequence[str] | None,
              options: dict[str, Any], seed: int) -> dict[str, Any]:
    """One pass of the engine over the records; the figures of the module docstring."""
    schema = adult_schema()
    if sensitive != "income" or qis is not None:
        schema = schema.with_roles(qis=qis, sensitive=sensitive)
    cfg = EngineConfig(**SERVICE_DEFAULTS, seed=seed, **options)
    eng = Engine(schema, cfg)
    out: list[Release] = []
    t0 = time.perf_counter()
    push = eng.push_encoded
    for rec, v in zip(records, eng.encode_many(cols), strict=True):
        out += push(rec, v, 0.0)
    out += eng.flush(0.0)
    seconds = time.perf_counter() - t0
    summary = summarize_releases(out, schema, cfg.k)
    classes: dict[str, dict[Any, int]] = {}
    refs: dict[str, tuple[tuple[Any, int], ...]] = {}
    prior: dict[Any, int] = {}
    for r in out:
        for member in r.records:
            v = member[sensitive]
            prior[v] = prior.get(v, 0) + 1
            if r.kind == "class":
                c = classes.setdefault(r.class_id, {})
                c[v] = c.get(v, 0) + 1
        if r.kind == "class" and r.reference is not None:
            refs.setdefault(r.class_id, r.reference)
    fig = disclosure_figures(classes.values(), prior)
    row: dict[str, Any] = {
        "gt_loss": float(summary.gt_loss), "suppressed": eng.records_suppressed,
        "suppressed_share": eng.records_suppressed / max(eng.records_in, 1), "classes": len(classes),
        "share_dominated": fig["share_dominated"], "majority_guess": fig["majority_guess"],
        "prior": fig.get("prior", 0.0), "prior_released": fig["prior_released"],
        "records_per_second": eng.records_in / seconds if seconds > 0 else None,
    }
    req = eng.diversity
    if req is not None and req.t is not None and classes:
        ids = list(classes)
        values = sorted_values(prior)  # every value of a class or a reference arrived, so it is in the prior
        index = {v: j for j, v in enumerate(values)}
        full = np.zeros((len(ids), len(values)))
        ref = np.zeros((len(ids), len(values)))
        for i, cid in enumerate(ids):
            for v, n in classes[cid].items():
                full[i, index[v]] = n
            for v, n in refs[cid]:
                ref[i, index[v]] = n
        row["max_emd_reference"] = float(emd(full, ref, req.distance).max())
        row["max_emd_released"] = float(emd(full, full.sum(axis=0), req.distance).max())
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stream-anon bench diversity", description=__doc__.split("\n\n")[0])
    p.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    p.add_argument("--seeds", default="0", help="comma-separated engine seeds (figures are averaged)")
    p.add_argument("--sensitive", default="income", help="sensitive attribute (default income)")
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    args = p.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(f"stream-anon bench diversity: --models: unknown {unknown}; known {list(MODELS)}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    df = read_adult(args.adult)
    cols = {c: df[c].tolist() for c in df.columns}
    keys = list(cols)
    records = [dict(zip(keys, row, strict=True)) for row in zip(*cols.values(), strict=True)]
    qis = None
    if args.sensitive != "income":
        qis = [a.name for a in adult_schema().qis if a.name != args.sensitive]
    print(f"ADULT, {len(records)} records, sensitive {args.sensitive!r}, engine k=10 delta=1000 beta=50 mu=100 "
          f"zeta=0 (service defaults), seeds {seeds}")
    print("| model | GT loss | suppressed | classes | >=90 % one value | majority guess | prior (all / released) "
          "| max EMD (reference / released) | records/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        runs = [run_model(records, cols, args.sensitive, qis, MODELS[name], s) for s in seeds]
        avg = {k: float(np.mean([r[k] for r in runs])) for k in runs[0] if runs[0][k] is not None}
        rows.append({"model": name, "options": MODELS[name], "seeds": seeds, **avg})
        emds = (f"{avg['max_emd_reference']:.3f} / {avg['max_emd_released']:.3f}"
                if "max_emd_reference" in avg else "")
        print(f"| {name} | {avg['gt_loss']:.4f} | {avg['suppressed']:.0f} ({avg['suppressed_share'] * 100:.2f} %) | "
              f"{avg['classes']:.0f} | {avg['share_dominated'] * 100:.1f} % | {avg['majority_guess'] * 100:.1f} % | "
              f"{avg['prior'] * 100:.1f} % / {avg['prior_released'] * 100:.1f} % | {emds} | "
              f"{avg.get('records_per_second', 0):,.0f} |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
