"""``stream-anon perturb`` (client side: locally randomize columns) and ``stream-anon estimate`` (server side).

perturb: reads any CSV described by ``--schema`` (like ``anonymize``; without ``--schema`` the file is ADULT,
  in the UCI layout or as a CSV with ADULT's columns, ``--input`` defaulting to ``$STREAM_ANON_ADULT``),
  perturbs ``--columns`` with one mechanism (``krr`` k-RR, ``rs`` FRAPP random substitution, ``rs-l``
  l-extended substitution, ``blap`` bounded Laplace / its discretized form for categories), writes
  ``--output`` CSV (the perturbed values, ``epsilon.<column>`` and ``epsilon.record`` per row, rows in random
  order and no record id: the public layout; ``--keep-ids`` adds the schema's record id column and keeps the
  input order, for a collector that may know who sent each report) and a ``--summary`` JSON (eps per column and per record = sequential composition, values/s).
estimate: reads that CSV (with the same ``--schema``) and recovers each column's distribution (categorical:
  unbiased counts with standard errors; numeric blap: the mean with its standard error); with ``--truth``
  (the original file) also the error against the true data (max abs count/frequency error, total
  variation, relative L2 error; numeric: abs error of the mean).

Domains are public: categorical = the schema's hierarchy leaves / values; numeric = the schema's domain.
Every input value is checked against them (an error names the file, row, column, allowed values and the
value received).  Exit codes: 0 success, 2 bad input or parameter (one line naming the option or file),
3 privacy budget exhausted.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

from stream_anon.cli.arguments import UsageError, fail, one_line_errors

MECHANISMS = ("krr", "rs", "rs-l", "blap")
VARIANTS = ("independent", "no-repeat")  # stream_anon.privacy.substitution.VARIANTS (not imported: numpy)
ADULT_ENV = "STREAM_ANON_ADULT"


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


def _guarded(prog: str, command: str) -> Callable[[argparse.Namespace], int]:
    """``command`` of :mod:`stream_anon.cli.privacy_commands` (imported when it runs); exit 3 on an exhausted
    privacy budget; exit 2 with one line for every operator mistake."""
    def run(args: argparse.Namespace) -> int:
        from stream_anon.cli import privacy_commands
        from stream_anon.core.datasets import DatasetError
        from stream_anon.privacy.base import PrivacyParameterError
        from stream_anon.privacy.budget import BudgetExhaustedError

        try:
            return int(getattr(privacy_commands, command)(args))
        except BudgetExhaustedError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 3
        except (UsageError, PrivacyParameterError, DatasetError) as e:
            return fail(prog, e)
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
    p.add_argument("--columns", default=None,
                   help="comma-separated columns (default: every categorical non-identifier column; blap: every "
                        "non-identifier column)")
    p.add_argument("--schema", default=None, help="schema YAML/JSON of the data (default: the shipped ADULT schema)")
    p.add_argument("--format", choices=["adult", "csv"], default=None,
                   help="format of the data file (--input of perturb, --truth of estimate; default: detected)")


def register(sub: Any) -> None:
    p = one_line_errors(sub.add_parser(
        "perturb", help="locally randomize columns of a CSV with a schema (default ADULT): k-RR, substitution, "
                        "bounded Laplace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    _add_mechanism_args(p)
    p.add_argument("--epsilon", type=_positive_float, default=None,
                   help="eps per column (--budget per-attribute) or per record, split equally (--budget per-record); "
                        "rs-l: the exact eps of the l reports")
    p.add_argument("--budget", choices=["per-attribute", "per-record"], default="per-attribute",
                   help="how --epsilon is read (default per-attribute: the record spends the sum)")
    p.add_argument("--record-budget", type=_positive_float, default=None,
                   help="refuse (exit 3) if a record's composed eps would exceed this")
    p.add_argument("--input", default=None,
                   help=f"input file: a CSV of --schema, or ADULT without --schema (default ${ADULT_ENV})")
    p.add_argument("--output", required=True, help="perturbed CSV")
    p.add_argument("--summary", default=None, help="summary JSON (eps per column and per record, values/s)")
    p.add_argument("--keep-ids", action="store_true",
                   help="write the schema's record id column and keep the input order (default: no id, rows "
                        "shuffled: joining two outputs by id composes their eps, and the order reveals positions)")
    p.add_argument("--seed", type=int, default=None, help="seed (tests only; default OS entropy)")
    p.set_defaults(func=_guarded("stream-anon perturb", "run_perturb"))

    e = one_line_errors(sub.add_parser(
        "estimate", help="recover per-column distributions from a perturb output",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    _add_mechanism_args(e)
    e.add_argument("--input", required=True, help="CSV written by 'stream-anon perturb'")
    e.add_argument("--truth", default=None, help="the original file (of --schema, default ADULT), to report the "
                                                 "estimation error")
    e.add_argument("--output", required=True, help="estimates JSON")
    e.set_defaults(func=_guarded("stream-anon estimate", "run_estimate"))
