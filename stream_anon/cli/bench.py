"""``stream-anon bench NAME``: benchmarks that print what they measured (records/s, values/s, loss)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

# bench name -> module with ``main(argv: list[str]) -> int``
BENCHES: dict[str, str] = {
    "engine": "stream_anon.bench.engine",               # CASTLE/UBDSA engine on ADULT, peer config, grid
    "decoder": "stream_anon.bench.decoder",             # input decoding + validation (RecordDecoder) on ADULT
    "ldp-categorical": "stream_anon.bench.ldp_categorical",  # k-RR, random substitution, l-extended tables
    "ldp-numeric": "stream_anon.bench.ldp_numeric",      # bounded Laplace speed, eps selection, DP k-means
    "service": "stream_anon.bench.service",             # end-to-end throughput through the real broker
    "udp-loss": "stream_anon.bench.udp_loss",           # UDP loss on loopback at several rates
    "side": "stream_anon.bench.side",                   # LDP side paths: pure, raw send floor, end to end
    "side-kafka": "stream_anon.bench.side",             # the same (its former name)
    "release-path": "stream_anon.bench.release_path",   # pre-publish gate / ledger cost, CASTLE reuse on ADULT
    "diversity": "stream_anon.bench.diversity",         # l-diversity models and t-closeness on ADULT: loss, disclosure
    "release-timing": "stream_anon.bench.release_timing",  # the expiring member's pin rate, ticks' latency
}


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print what it measured",
                       description="Benchmarks: " + ", ".join(BENCHES) + ", or 'mechanisms' for both LDP benches.")
    p.add_argument("name", choices=[*BENCHES, "mechanisms"])
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark (see NAME --help)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    names = ["ldp-categorical", "ldp-numeric"] if args.name == "mechanisms" else [args.name]
    rc = 0
    for n in names:
        module = importlib.import_module(BENCHES[n])
        rc = max(rc, int(module.main(list(args.args)) or 0))
    return rc
