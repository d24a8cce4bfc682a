"""``stream-anon run`` (the service) and ``stream-anon demo`` (embedded broker + service + ADULT replay)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from stream_anon.service.config import Config, ConfigError

# flag -> dotted option (every option is also reachable with --set section.field=value)
COMMON_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--bootstrap-servers", "kafka.bootstrap_servers", str,
     "Kafka bootstrap servers (host:port,...); without it an embedded Tansu broker is started"),
    ("--group-id", "kafka.group_id", str, "consumer group of the main path"),
    ("--security-protocol", "kafka.security_protocol", str, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ("--input-topic", "topics.input", str, "input topic (default adult.raw)"),
    ("--partitions", "topics.partitions", int, "partitions of topics the service creates"),
    ("--schema", "anonymization.schema", str, "schema file (default: the shipped ADULT schema)"),
    ("--k", "anonymization.k", int, "k (every released class holds >= k records)"),
    ("--delta", "anonymization.delta", int, "delay bound in arrivals"),
    ("--beta", "anonymization.beta", int, "maximum open clusters"),
    ("--mu", "anonymization.mu", int, "recent released-cluster losses that set tau"),
    ("--algorithm", "anonymization.algorithm", str, "castle or ubdsa"),
    ("--loss", "anonymization.loss", str, "gt, lm or ubdsa"),
    ("--leftover", "anonymization.leftover", str, "suppress or leftover"),
    ("--l", "anonymization.l", int, "l-diversity of the sensitive attribute"),
    ("--seed", "anonymization.seed", int, "engine seed (default: OS entropy)"),
    ("--max-message-bytes", "service.max_message_bytes", int, "larger inputs go to the DLQ"),
    ("--metrics-port", "service.metrics_port", int, "Prometheus endpoint port on 127.0.0.1 (0 = off)"),
    ("--metrics-addr", "service.metrics_addr", str, "address the metrics endpoint binds (default 127.0.0.1)"),
    ("--idle-flush-seconds", "service.idle_flush_seconds", float,
     "flush a partition's buffer after this long without input (0 = never)"),
)


def add_config_flags(p: argparse.ArgumentParser, *, include: tuple[str, ...] | None = None) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config file (lowest precedence after defaults)")
    p.add_argument("--set", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                   help="set any option, e.g. --set side_paths.krr.epsilon=0.5 (repeatable; beats env and file)")
    p.add_argument("--no-side-paths", action="store_true", help="do not start the LDP side paths")
    for flag, dotted, typ, help_ in COMMON_FLAGS:
        if include is not None and flag not in include:
            continue
        p.add_argument(flag, dest="opt_" + dotted.replace(".", "__"), type=typ, default=None, help=help_,
                       metavar=flag.lstrip("-").upper().replace("-", "_"))


def config_from_args(args: argparse.Namespace) -> Config:
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected SECTION.FIELD=VALUE")
        key, raw = item.split("=", 1)
        overrides[key.strip()] = raw  # text: converted by the option's type
    for name, value in vars(args).items():
        if name.startswith("opt_") and value is not None:
            overrides[name[4:].replace("__", ".")] = value
    if getattr(args, "no_side_paths", False):
        overrides["side_paths.enabled"] = False
    return Config.load(args.config, overrides=overrides)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the streaming anonymization service (Kafka consumer)",
                       description="Consume JSON records, release delay-bounded k-anonymous classes, publish the "
                                   "LDP side topics. Precedence: flags > STREAM_ANON_* env > --config file > "
                                   "defaults. Without --bootstrap-servers an embedded broker is started.")
    add_config_flags(p)
    p.set_defaults(func=_run)

    d = sub.add_parser("demo", help="embedded broker + service + ADULT replay, then a summary (the main command)",
                       description="Start an embedded broker, the service and its metrics endpoint, replay ADULT, "
                                   "wait until every record is released and print a summary.")
    add_config_flags(d)
    d.add_argument("--adult", metavar="PATH", help="ADULT file (default: $STREAM_ANON_ADULT, else download)")
    d.add_argument("--records", type=int, default=None, help="replay only the first N records")
    d.add_argument("--rate", type=float, default=0.0, help="replay rate in records/s (0 = as fast as possible)")
    d.add_argument("--run-dir", default=None, help="where to write summary.json and released.csv "
                                                   "(default runs/demo-<timestamp>)")
    d.add_argument("--synthetic", action="store_true", help="use the synthetic ADULT-shaped generator")
    d.add_argument("--no-download", action="store_true", help="never try to download ADULT")
    d.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    d.set_defaults(func=_demo)


def _install_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    from stream_anon.service.app import run_service  # the service's clients: imported when the command runs

    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"stream-anon run: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    _install_signals(stop)
    return run_service(cfg, stop_event=stop)


def _demo(args: argparse.Namespace) -> int:
    from stream_anon.service.demo import run_demo  # the service's clients: imported when the command runs

    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"stream-anon demo: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    _install_signals(stop)
    return run_demo(cfg, adult=args.adult, records=args.records, rate=args.rate, run_dir=args.run_dir,
                    synthetic=args.synthetic, download=not args.no_download, timeout=args.timeout, stop_event=stop)
