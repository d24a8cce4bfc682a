"""``stream-anon report RUN_DIR [--output PATH] [--compute-extras]``: the visual HTML report of a run."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from stream_anon.cli.arguments import one_line_errors
from stream_anon.core.defaults import REPORT_EPSILONS, REPORT_GRID_DELTAS, REPORT_GRID_KS

log = logging.getLogger(__name__)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def register(subparsers: Any) -> None:

    p = subparsers.add_parser(
        "report", help="write the HTML report of a run directory (plots of loss, delay, classes, LDP errors)",
        description="Write a self-contained HTML page (PNG plots embedded) for RUN_DIR, which holds summary.json "
                    "and released.csv (+ optional delays.json, grid.json, ldp_curves.json, side_estimates.json; "
                    "format in docs/deploy.md).")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (written by `stream-anon demo`)")
    p.add_argument("--output", "-o", default=None, help="HTML file to write (default RUN_DIR/report.html)")
    p.add_argument("--png-dir", default=None, help="also save every plot as a PNG file in this directory")
    p.add_argument("--overview-png", default=None, metavar="PATH",
                   help="also write one PNG stacking the delay, class-size, generalization and LDP plots")
    p.add_argument("--compute-extras", action="store_true",
                   help="first compute the missing grid.json (loss vs k and delta), ldp_curves.json (eps vs error) "
                        "and side_estimates.json with the run's own settings (config.json of RUN_DIR, else "
                        "summary.json, else the defaults) on the run's data (ADULT, --data, or the demo's "
                        "synthetic records); without them those sections are not shown")
    p.add_argument("--overwrite-extras", action="store_true", help="with --compute-extras: recompute existing files")
    p.add_argument("--adult", default=None, help="ADULT file for --compute-extras (default $STREAM_ANON_ADULT)")
    p.add_argument("--data", default=None, metavar="CSV",
                   help="the run's records for --compute-extras when its schema is not ADULT (a CSV of the run "
                        "directory's schema.yaml)")
    p.add_argument("--grid-records", type=int, default=None,
                   help="records per engine grid run (default: the run's records_in, all of them)")
    p.add_argument("--grid-k", type=_ints, default=list(REPORT_GRID_KS), help="k values of the grid, e.g. 5,10,25,50")
    p.add_argument("--grid-delta", type=_ints, default=list(REPORT_GRID_DELTAS),
                   help="delta values of the grid, e.g. 250,500,1000,2000")
    p.add_argument("--epsilons", type=_floats, default=list(REPORT_EPSILONS),
                   help="epsilons of the LDP curves, e.g. 0.25,0.5,1,2,4,8")
    p.add_argument("--repetitions", type=int, default=5, help="repetitions per LDP curve point (default 5)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the extras (engine and mechanisms; default: the run's anonymization.seed, else 0)")
    p.set_defaults(func=run_report)
    one_line_errors(p)


def _run_data(args: argparse.Namespace, settings: Any) -> Any:
    """The run's records as a DataFrame: ``--data`` (a CSV of the run's schema), the demo's synthetic records
    (regenerated: the same generator, seed and count), or ADULT for an ADULT run; None when none applies."""
    from stream_anon.core.datasets import read_adult, read_csv_with_schema

    if args.data is not None:
        return read_csv_with_schema(args.data, settings.schema)
    if settings.synthetic and settings.is_adult:
        import pandas as pd

        from stream_anon.replay.synthetic import synthetic_adult_records

        n = settings.records or 32561
        return pd.DataFrame(list(synthetic_adult_records(n, rng=settings.seed if settings.seed is not None else 0)))
    if settings.is_adult:
        return read_adult(args.adult)
    return None


def run_report(args: argparse.Namespace) -> int:
    from stream_anon.report.html import write_report
    from stream_anon.report.rundir import RunDirError

    if args.grid_records is not None and args.grid_records < 1:
        print(f"stream-anon report: --grid-records must be >= 1, got {args.grid_records}", file=sys.stderr)
        return 2
    if args.repetitions < 1:
        print(f"stream-anon report: --repetitions must be >= 1, got {args.repetitions}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        if args.compute_extras:
            from stream_anon.core.datasets import DatasetError
            from stream_anon.report.extras import compute_extras, run_settings

            if not (Path(args.run_dir) / "summary.json").is_file():
                raise RunDirError(f"run directory {args.run_dir}: required file summary.json is missing")
            settings = run_settings(args.run_dir)
            try:
                data = _run_data(args, settings)
            except DatasetError as e:
                print(f"stream-anon report: --compute-extras needs the run's data: {e}", file=sys.stderr)
                return 2
            if data is None:
                print(f"stream-anon report: --compute-extras: the run's schema {settings.schema.name!r} is not ADULT: "
                      f"give the run's records with --data CSV", file=sys.stderr)
                return 2
            eng = settings.engine
            print(f"computing the extras with the run's settings: k={eng['k']} delta={eng['delta']} "
                  f"beta={eng['beta']} mu={eng['mu']} {eng['algorithm']}/{eng['loss']} leftover={eng['leftover']} "
                  f"l={eng['l']} zeta={eng['zeta']} "
                  f"(from {', '.join(sorted(set(settings.sources.values())))}), schema {settings.schema.name!r}, "
                  f"{len(data):,} records", file=sys.stderr)
            seed = args.seed if args.seed is not None else (settings.seed if settings.seed is not None else 0)
            written = compute_extras(args.run_dir, data, settings=settings, grid_records=args.grid_records,
                                     ks=args.grid_k, deltas=args.grid_delta, epsilons=args.epsilons,
                                     repetitions=args.repetitions, seed=seed, overwrite=args.overwrite_extras)
            for path in written:
                print(f"computed {path}")
        out = write_report(args.run_dir, args.output, png_dir=args.png_dir, overview=args.overview_png)
    except RunDirError as e:
        print(f"stream-anon report: {e}", file=sys.stderr)
        return 2
    print(f"report written to {out} ({out.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)")
    return 0
