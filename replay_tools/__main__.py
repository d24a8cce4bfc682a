"""``python -m replay_tools kafka|udp|synthetic|udp-loss-bench ...`` (see docs/replay.md)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from stream_anon.core.datasets import ADULT_ENV


def load_records(*, adult: str | None = None, csv: str | None = None, schema: str | None = None,
                 synthetic: int | None = None, seed: int | None = None, limit: int | None = None,
                 allow_synthetic_fallback: bool = False) -> tuple[Any, str]:
    """The records to replay and a label: ADULT (flag or ``$STREAM_ANON_ADULT``), a CSV with a schema, or synthetic.

    ``synthetic=0`` gives an unbounded iterator (with ``limit``: that many).  ADULT and CSV records are
    returned as a list (so they can be looped and shuffled).
    """
    from replay_tools.synthetic import synthetic_adult_records
    from stream_anon.core.datasets import iter_adult_records, iter_records, read_csv_with_schema
    from stream_anon.core.schema import Schema

    if synthetic is not None:
        n = limit if synthetic == 0 else (min(synthetic, limit) if limit is not None else synthetic)
        it = synthetic_adult_records(n, rng=seed, adult_path=adult)
        return (list(it) if n is not None else it), "synthetic ADULT-shaped"
    if csv is not None:
        if schema is None:
            raise SystemExit("--csv needs --schema PATH (YAML/JSON schema file)")
        df = read_csv_with_schema(csv, Schema.load(schema))
        return list(itertools.islice(iter_records(df), limit)), f"CSV {os.path.basename(csv)}"
    path = adult or os.environ.get(ADULT_ENV)
    if not path or not os.path.isfile(path):
        if allow_synthetic_fallback:
            print(f"ADULT file not found (--adult / ${ADULT_ENV}): using SYNTHETIC ADULT-shaped records",
                  file=sys.stderr)
            return list(synthetic_adult_records(limit or 32_561, rng=seed)), "synthetic ADULT-shaped"
        raise SystemExit(f"no ADULT file: pass --adult PATH or set ${ADULT_ENV}, or use --csv/--synthetic N")
    return list(itertools.islice(iter_adult_records(path), limit)), "ADULT"


def _add_source(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("records (default: ADULT from --adult or $STREAM_ANON_ADULT)")
    g.add_argument("--adult", default=None, help="the UCI adult.data file")
    g.add_argument("--csv", default=None, help="any CSV described by --schema")
    g.add_argument("--schema", default=None, help="schema YAML/JSON for --csv")
    g.add_argument("--synthetic", type=int, default=None, metavar="N",
                   help="N synthetic ADULT-shaped records (0 = unbounded; ids synth-000000...)")
    g.add_argument("--limit", type=int, default=None, help="send at most this many records (per pass for files)")


def _cmd_kafka(args: argparse.Namespace) -> int:
    from replay_tools.kafka_replay import replay_records

    if not args.bootstrap_servers:
        print("kafka: --bootstrap-servers (or $STREAM_ANON_BOOTSTRAP_SERVERS) is required", file=sys.stderr)
        return 2
    records, label = load_records(adult=args.adult, csv=args.csv, schema=args.schema, synthetic=args.synthetic,
                                  seed=args.seed, limit=args.limit)
    if not isinstance(records, list) and (args.loop > 1 or args.shuffle):
        print("kafka: --loop/--shuffle need a finite source (give --synthetic N with N > 0 or --limit)",
              file=sys.stderr)
        return 2
    print(f"replaying {label} records to {args.topic!r} on {args.bootstrap_servers}", file=sys.stderr)
    stats = replay_records(records, args.topic, args.bootstrap_servers, args.rate, loop=args.loop,
                           shuffle=args.shuffle, seed=args.seed, partitions=args.partitions,
                           progress=not args.no_progress)
    print(stats.summary())
    return 0 if stats.errors == 0 and stats.records_acked == stats.records_sent else 1


def _cmd_udp(args: argparse.Namespace) -> int:
    from replay_tools.udp_sender import send_udp
    from stream_anon.service.udp_bridge import parse_listen

    host, port = parse_listen(args.target)
    records, label = load_records(adult=args.adult, csv=args.csv, schema=args.schema, synthetic=args.synthetic,
                                  seed=args.seed, limit=args.limit)
    print(f"sending {label} records over UDP to {host}:{port}", file=sys.stderr)
    stats = send_udp(records, host, port, args.rate, stream_id=args.stream_id, eos=not args.no_eos,
                     eos_repeats=args.eos_repeats, progress=not args.no_progress,
                     total=len(records) if isinstance(records, list) else None)
    print(stats.summary())
    return 1 if stats.send_errors else 0


def _write_jsonl(records: Iterable[dict[str, Any]], out: Any) -> int:
    n = 0
    for r in records:
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
        n += 1
    return n


def _cmd_synthetic(args: argparse.Namespace) -> int:
    from replay_tools.synthetic import ADULT_MARGINALS_PATH, Marginals, SyntheticGenerator, adult_marginals

    if args.write_marginals:
        m = Marginals.from_adult_file(args.adult)
        m.save(args.write_marginals)
        print(f"wrote marginals of {m.source} to {args.write_marginals}", file=sys.stderr)
        return 0
    marginals = Marginals.load(args.marginals) if args.marginals else adult_marginals(args.adult)
    source = marginals.source or str(args.marginals or ADULT_MARGINALS_PATH)
    gen = SyntheticGenerator(marginals, rng=args.seed)
    t0 = time.perf_counter()
    if args.output in (None, "-") or args.output == "/dev/null":
        if args.output is None:  # throughput only
            done = 0
            while done < args.count:
                done += len(gen.records(min(gen.batch_size, args.count - done)))
            n = done
        else:
            n = _write_jsonl(itertools.islice(gen, args.count), sys.stdout)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            n = _write_jsonl(itertools.islice(gen, args.count), f)
    dt = time.perf_counter() - t0
    print(f"synthetic: {n:,} SYNTHETIC ADULT-shaped records (marginals: {source}; seed {args.seed}) "
          f"in {dt:.2f} s: {n / dt if dt > 0 else 0:,.0f} records/s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m replay_tools",
                                     description="Replay records into Kafka or over UDP; synthetic ADULT-shaped data.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    k = sub.add_parser("kafka", help="replay records into a Kafka topic (JSON values, key = record id)")
    _add_source(k)
    k.add_argument("--topic", default="adult.raw")
    k.add_argument("--bootstrap-servers", default=os.environ.get("STREAM_ANON_BOOTSTRAP_SERVERS"))
    k.add_argument("--rate", type=float, default=0.0, help="records/s (0 = as fast as possible)")
    k.add_argument("--loop", type=int, default=1, help="passes over the records; pass i >= 1 suffixes ids with #i")
    k.add_argument("--shuffle", action="store_true", help="shuffle each pass (deterministic with --seed)")
    k.add_argument("--seed", type=int, default=None, help="shuffle / synthetic seed")
    k.add_argument("--partitions", type=int, default=1, help="partitions if the topic is created (default 1)")
    k.add_argument("--no-progress", action="store_true")
    k.set_defaults(func=_cmd_kafka)

    u = sub.add_parser("udp", help="send records over UDP, one per datagram with a sequence number, then EOS")
    _add_source(u)
    u.add_argument("--target", default="127.0.0.1:9999", help="HOST:PORT of the udp-bridge (default 127.0.0.1:9999)")
    u.add_argument("--rate", type=float, default=0.0, help="records/s (0 = as fast as possible)")
    u.add_argument("--stream-id", default=None, help="stream id in every datagram (default: random)")
    u.add_argument("--eos-repeats", type=int, default=5,
                   help="how many times the EOS datagram is sent, 10/40/160/640 ms apart (default 5)")
    u.add_argument("--no-eos", action="store_true", help="do not send an end-of-stream datagram")
    u.add_argument("--seed", type=int, default=None, help="seed for --synthetic")
    u.add_argument("--no-progress", action="store_true")
    u.set_defaults(func=_cmd_udp)

    s = sub.add_parser("synthetic", help="synthetic ADULT-shaped records (JSON lines) and their throughput")
    s.add_argument("--count", type=int, default=100_000, help="records to generate (default 100000)")
    s.add_argument("--seed", type=int, default=None, help="seed (default: OS entropy)")
    s.add_argument("--output", default=None, help="JSON-lines file ('-' = stdout; default: only measure throughput)")
    s.add_argument("--marginals", default=None, help="marginals JSON (default: from the ADULT file if available, "
                                                     "else the shipped replay_tools/data/adult_marginals.json)")
    s.add_argument("--adult", default=None, help="ADULT file to compute the marginals from")
    s.add_argument("--write-marginals", default=None, metavar="PATH",
                   help="compute ADULT's marginals from the real file and write them as JSON, then exit")
    s.set_defaults(func=_cmd_synthetic)

    sub.add_parser("udp-loss-bench", help="measure UDP loss on loopback at several rates (see its --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["udp-loss-bench"]:  # its own parser (argparse REMAINDER does not take leading options)
        from replay_tools.udp_bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
