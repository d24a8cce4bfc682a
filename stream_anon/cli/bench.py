"""``stream-anon bench NAME``: benchmarks that print what they measured (records/s, values/s, loss)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from stream_anon.cli.arguments import one_line_errors
from stream_anon.core.defaults import DEFAULTS

# bench name -> (module with ``main(argv: list[str]) -> int``, what it measures); README.md lists the same names
BENCHES: dict[str, tuple[str, str]] = {
    "engine": ("stream_anon.bench.engine", "CASTLE/UBDSA engine on ADULT (records/s, loss, memory), the peer "
               "configuration, the stream paper's grid"),
    "decoder": ("stream_anon.bench.decoder", "input decoding and validation (RecordDecoder) on ADULT"),
    "diversity": ("stream_anon.bench.diversity", "l-diversity models and t-closeness on ADULT: loss, suppression, "
                  "disclosure"),
    "ldp-categorical": ("stream_anon.bench.ldp_categorical", "k-RR, random substitution, l-extended tables"),
    "ldp-numeric": ("stream_anon.bench.ldp_numeric", "bounded Laplace speed, eps selection, DP k-means"),
    "mechanisms": ("", "both LDP benchmarks: ldp-categorical, then ldp-numeric"),
    "release-path": ("stream_anon.bench.release_path", "pre-publish gate and ledger cost, CASTLE reuse on ADULT"),
    "release-timing": ("stream_anon.bench.release_timing", "does a class's timestamp name its expiring member: "
                       "the attack with and without release ticks, and their latency cost"),
    "service": ("stream_anon.bench.service", "end-to-end throughput and latency through a real broker"),
    "side": ("stream_anon.bench.side", "LDP side paths: pure, raw send floor, end to end"),
    "udp-loss": ("stream_anon.bench.udp_loss", "UDP loss on loopback at several rates"),
}
GROUPS: dict[str, tuple[str, ...]] = {"mechanisms": ("ldp-categorical", "ldp-numeric")}


def register(sub: Any) -> None:
    listing = "; ".join(f"{name}: {what}" for name, (_, what) in BENCHES.items())
    p = sub.add_parser("bench", help="run a benchmark and print what it measured",
                       description=f"Benchmarks ({listing}). `stream-anon bench NAME --help` lists a benchmark's "
                                   f"options; the engine's defaults are every command's ({DEFAULTS.describe()}).")
    p.add_argument("name", metavar="NAME", choices=list(BENCHES), help=f"one of {', '.join(BENCHES)}")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark (see NAME --help)")
    p.set_defaults(func=_run)
    one_line_errors(p)


def _run(args: argparse.Namespace) -> int:
    rc = 0
    for n in GROUPS.get(args.name, (args.name,)):
        module = importlib.import_module(BENCHES[n][0])
        rc = max(rc, int(module.main(list(args.args)) or 0))
    return rc
