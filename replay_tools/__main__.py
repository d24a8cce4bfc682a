"""``python -m replay_tools kafka|udp|synthetic|udp-loss-bench ...`` (see docs/replay.md)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from stream_anon.cli.service import bootstrap_servers_from_env
from stream_anon.core.datasets import ADULT_ENV
from stream_anon.kafka_io.lifecycle import quiet_client_libraries
from stream_anon.replay.interrupts import InterruptGuard, ReplayInterrupted


class ReplaySourceError(ValueError):
    """The records to replay cannot be loaded as asked (missing file or flag); the command exits 2."""


def load_records(*, adult: str | None = None, csv: str | None = None, schema: str | None = None,
                 synthetic: int | None = None, seed: int | None = None, limit: int | None = None,
                 allow_synthetic_fallback: bool = False) -> tuple[Any, str]:
    """The records to replay and a label: ADULT (flag or ``$STREAM_ANON_ADULT``), a CSV with a schema, or synthetic.

    ``synthetic=0`` gives an unbounded iterator (with ``limit``: that many).  ADULT and CSV records are
    returned as a list (so they can be looped and shuffled).  CSV records hold exactly the schema's fields
    (record id field named by the schema, values typed by it): what the service's decoder accepts.
    """
    from replay_tools.schema_records import schema_records
    from stream_anon.core.datasets import iter_adult_records
    from stream_anon.core.schema import Schema
    from stream_anon.replay.synthetic import synthetic_adult_records

    if synthetic is not None:
        n = limit if synthetic == 0 else (min(synthetic, limit) if limit is not None else synthetic)
        it = synthetic_adult_records(n, rng=seed, adult_path=adult)
        return (list(it) if n is not None else it), "synthetic ADULT-shaped"
    if csv is not None:
        if schema is None:
            raise ReplaySourceError("--csv needs --schema PATH (YAML/JSON schema file)")
        return list(schema_records(csv, Schema.load(schema), limit=limit)), f"CSV {os.path.basename(csv)}"
    path = adult or os.environ.get(ADULT_ENV)
    if not path or not os.path.isfile(path):
        if allow_synthetic_fallback:
            print(f"ADULT file not found (--adult / ${ADULT_ENV}): using SYNTHETIC ADULT-shaped records",
                  file=sys.stderr)
            return list(synthetic_adult_records(limit or 32_561, rng=seed)), "synthetic ADULT-shaped"
        raise ReplaySourceError(f"no ADULT file: pass --adult PATH or set ${ADULT_ENV}, or use --csv/--synthetic N")
    return list(itertools.islice(iter_adult_records(path), limit)), "ADULT"


def _add_source(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("records (default: ADULT from --adult or $STREAM_ANON_ADULT)")
    g.add_argument("--adult", default=None, help="the UCI adult.data file")
    g.add_argument("--csv", default=None, help="any CSV described by --schema")
    g.add_argument("--schema", default=None, help="schema YAML/JSON for --csv")
    g.add_argument("--synthetic", type=int, default=None, metavar="N",
                   help="N synthetic ADULT-shaped records (0 = unbounded; ids synth-000000...)")
    g.add_argument("--limit", type=int, default=None, help="send at most this many records (per pass for files)")


def _source_id_field(args: argparse.Namespace) -> str | None:
    """The field holding the record id: the schema's ``record_id`` for --csv, ``id`` for ADULT and synthetic."""
    from stream_anon.core.schema import Schema

    return Schema.load(args.schema).record_id if args.csv else "id"


def _load(args: argparse.Namespace) -> tuple[Any, str, str | None]:
    """(records, label, record id field) for the source flags; a bad file or flag is a ReplaySourceError."""
    from stream_anon.core.datasets import DatasetError
    from stream_anon.core.schema import SchemaError
    from stream_anon.replay.synthetic import MarginalsError

    try:
        records, label = load_records(adult=args.adult, csv=args.csv, schema=args.schema, synthetic=args.synthetic,
                                      seed=args.seed, limit=args.limit)
        return records, label, _source_id_field(args)
    except OSError as e:
        flags = {args.csv: "--csv", args.schema: "--schema", args.adult: "--adult"}
        flag = flags.get(e.filename, "a source file") if e.filename is not None else "a source file"
        raise ReplaySourceError(f"cannot read {e.filename!r} ({flag}): {e.strerror or e}") from None
    except (DatasetError, SchemaError, MarginalsError) as e:
        raise ReplaySourceError(str(e)) from None


def _positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (a bad one: exit 2 naming the value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}") from None
    if not (0.0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _check_address(bootstrap_servers: str) -> None:
    """A malformed ``--bootstrap-servers`` is a :class:`ReplaySourceError` (exit 2), found before anything else."""
    from stream_anon.kafka_io.settings import BootstrapAddressError, parse_bootstrap_servers

    try:
        parse_bootstrap_servers(bootstrap_servers)
    except BootstrapAddressError as e:
        raise ReplaySourceError(f"--bootstrap-servers: {e}") from None


def _cmd_kafka(args: argparse.Namespace, interrupts: InterruptGuard) -> int:
    from stream_anon.replay.kafka_replay import ensure_topic, replay_records

    args.bootstrap_servers = args.bootstrap_servers or bootstrap_servers_from_env("kafka")
    if not args.bootstrap_servers:
        print("kafka: --bootstrap-servers (or $STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS) is required", file=sys.stderr)
        return 2
    _check_address(args.bootstrap_servers)  # malformed: exit 2 before the records are loaded
    records, label, id_field = _load(args)
    if not isinstance(records, list) and (args.loop > 1 or args.shuffle):
        print("kafka: --loop/--shuffle need a finite source (give --synthetic N with N > 0 or --limit)",
              file=sys.stderr)
        return 2
    partitions = ensure_topic(args.bootstrap_servers, args.topic, args.partitions,
                              connect_timeout_s=args.connect_timeout)
    print(f"replaying {label} records to {args.topic!r} on {args.bootstrap_servers} (key: record id field "
          f"{id_field!r}{'; end-of-stream flush after the last record' if args.flush else ''})", file=sys.stderr)
    stats = replay_records(records, args.topic, args.bootstrap_servers, args.rate, loop=args.loop,
                           shuffle=args.shuffle, seed=args.seed, partitions=partitions, create_topic=False,
                           id_field=id_field, progress=not args.no_progress, end_of_stream=args.flush,
                           connect_timeout_s=args.connect_timeout, flush_timeout_s=args.ack_timeout,
                           interrupts=interrupts)
    if stats.interrupted:
        print(stats.interrupted_summary(), file=sys.stderr)
        return 128 + signal.Signals[stats.interrupted].value
    print(stats.summary())
    return 0 if stats.complete else 1


def _cmd_udp(args: argparse.Namespace, interrupts: InterruptGuard) -> int:
    from replay_tools.bridge_metrics import scrape_bridge_counters, wait_for_stream_loss
    from stream_anon.replay.udp_sender import send_udp
    from stream_anon.service.udp_bridge import parse_listen

    try:
        host, port = parse_listen(args.target)
    except ValueError as e:
        raise ReplaySourceError(str(e).replace("--listen", "--target")) from None
    records, label, id_field = _load(args)
    before = scrape_bridge_counters(args.bridge_metrics) if args.bridge_metrics else None
    print(f"sending {label} records over UDP to {host}:{port}", file=sys.stderr)
    if id_field != "id":
        print(f"note: the records carry their id in {id_field!r}; the bridge must key records by that field",
              file=sys.stderr)
    stats = send_udp(records, host, port, args.rate, stream_id=args.stream_id, eos=not args.no_eos,
                     eos_repeats=args.eos_repeats, progress=not args.no_progress,
                     total=len(records) if isinstance(records, list) else None, interrupts=interrupts)
    if stats.interrupted:
        print(stats.interrupted_summary(), file=sys.stderr)
        return 128 + signal.Signals[stats.interrupted].value
    print(stats.summary())
    if before is not None:
        loss = wait_for_stream_loss(args.bridge_metrics, before, stats.records, timeout_s=args.bridge_wait)
        print(loss.summary())
    return 1 if stats.send_errors else 0


def _cmd_flush(args: argparse.Namespace, interrupts: InterruptGuard) -> int:
    from stream_anon.replay.kafka_replay import make_producer, send_end_of_stream, topic_exists

    args.bootstrap_servers = args.bootstrap_servers or bootstrap_servers_from_env("flush")
    if not args.bootstrap_servers:
        print("flush: --bootstrap-servers (or $STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS) is required", file=sys.stderr)
        return 2
    _check_address(args.bootstrap_servers)
    if not topic_exists(args.bootstrap_servers, args.topic, connect_timeout_s=args.connect_timeout):
        print(f"flush: topic {args.topic!r} does not exist on {args.bootstrap_servers} (--topic)", file=sys.stderr)
        return 2
    producer = make_producer(args.bootstrap_servers, connect_timeout_s=args.connect_timeout)
    try:
        parts = send_end_of_stream(producer, args.topic)
    finally:
        producer.close(timeout=10)
    print(f"end-of-stream control message (stream-anon-control: flush) acknowledged on {len(parts)} partition(s) "
          f"of {args.topic!r}: {parts}")
    return 0


def _write_jsonl(records: Iterable[dict[str, Any]], out: Any) -> int:
    n = 0
    for r in records:
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
        n += 1
    return n


def _cmd_synthetic(args: argparse.Namespace, interrupts: InterruptGuard) -> int:
    from stream_anon.replay.synthetic import (
        ADULT_MARGINALS_PATH,
        Marginals,
        SyntheticGenerator,
        adult_marginals,
    )

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
    k.add_argument("--topic", default="adult.raw",
                   help="the topic to replay into: the service's input topic (default adult.raw; created with "
                        "--partitions partitions when missing)")
    k.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap servers (env STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS)")
    k.add_argument("--rate", type=float, default=0.0, help="records/s (0 = as fast as possible)")
    k.add_argument("--loop", type=int, default=1, help="passes over the records; pass i >= 1 suffixes ids with #i")
    k.add_argument("--shuffle", action="store_true", help="shuffle each pass (deterministic with --seed)")
    k.add_argument("--seed", type=int, default=None, help="shuffle / synthetic seed")
    k.add_argument("--partitions", type=int, default=1, help="partitions if the topic is created (default 1)")
    k.add_argument("--flush", action=argparse.BooleanOptionalAction, default=True,
                   help="after the last record is acknowledged, send the end-of-stream control message "
                        "(header stream-anon-control: flush) to every partition, so the service releases what "
                        "it buffers (default: on; --no-flush when more records will follow on the topic)")
    k.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="give up (exit 3) when no broker answers within this time (default 30)")
    k.add_argument("--ack-timeout", type=_positive_seconds, default=60.0, metavar="SECONDS",
                   help="after the last record, wait at most this long for the broker to acknowledge what is "
                        "not yet acknowledged (and as long for the end-of-stream markers); then exit 1 naming "
                        "how many are not (default 60)")
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
    u.add_argument("--bridge-metrics", default=None, metavar="URL",
                   help="the bridge's metrics endpoint (e.g. 127.0.0.1:9466): read its counters before and after "
                        "the stream and print the loss it measured (the sender itself cannot see losses)")
    u.add_argument("--bridge-wait", type=float, default=10.0, metavar="SECONDS",
                   help="with --bridge-metrics: wait at most this long for the bridge to close the stream "
                        "(default 10)")
    u.add_argument("--no-progress", action="store_true")
    u.set_defaults(func=_cmd_udp)

    f = sub.add_parser("flush", help="send the end-of-stream control message to every partition of a topic "
                                     "(e.g. after a UDP stream, once the bridge has exited)")
    f.add_argument("--topic", default="adult.raw",
                   help="the topic whose partitions get the marker: the service's input topic (default adult.raw)")
    f.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap servers (env STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS)")
    f.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="give up (exit 3) when no broker answers within this time (default 30)")
    f.set_defaults(func=_cmd_flush)

    s = sub.add_parser("synthetic", help="synthetic ADULT-shaped records (JSON lines) and their throughput")
    s.add_argument("--count", type=int, default=100_000, help="records to generate (default 100000)")
    s.add_argument("--seed", type=int, default=None, help="seed (default: OS entropy)")
    s.add_argument("--output", default=None, help="JSON-lines file ('-' = stdout; default: only measure throughput)")
    s.add_argument("--marginals", default=None, help="marginals JSON (default: from the ADULT file if available, "
                                                     "else the shipped stream_anon/replay/data/adult_marginals.json)")
    s.add_argument("--adult", default=None, help="ADULT file to compute the marginals from")
    s.add_argument("--write-marginals", default=None, metavar="PATH",
                   help="compute ADULT's marginals from the real file and write them as JSON, then exit")
    s.set_defaults(func=_cmd_synthetic)

    sub.add_parser("udp-loss-bench", help="measure UDP loss on loopback at several rates (see its --help)")
    parser.epilog = ("Exit codes: 0 done; 1 some records were not acknowledged / not sent; 2 a bad option or file; "
                     "3 no broker reachable; 130/143 stopped by SIGINT/SIGTERM (one line: records sent and "
                     "acknowledged so far).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; operator mistakes and an unreachable broker end in one line on stderr, no traceback."""
    from replay_tools.bridge_metrics import BridgeMetricsError
    from stream_anon.replay.kafka_replay import BrokerUnreachableError, ReplayInputError

    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "python -m replay_tools"
    quiet_client_libraries()  # the client libraries' own lines only at DEBUG
    with InterruptGuard() as interrupts:
        try:
            if argv[:1] == ["udp-loss-bench"]:  # its own parser (argparse REMAINDER does not take leading options)
                from stream_anon.bench.udp_loss import main as bench_main

                return bench_main(argv[1:])
            args = build_parser().parse_args(argv)
            return int(args.func(args, interrupts) or 0)
        except ReplayInterrupted as e:
            nothing = " before the first record was sent" if argv[:1] in (["kafka"], ["udp"]) else ""
            print(f"{prog}: interrupted by {e.signal_name}{nothing}", file=sys.stderr)
            return e.exit_code
        except BrokerUnreachableError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 3
        except (ReplaySourceError, ReplayInputError, BridgeMetricsError) as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
