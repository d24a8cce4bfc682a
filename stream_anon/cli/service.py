"""``stream-anon run`` (the service) and ``stream-anon demo`` (embedded broker + service + ADULT replay).

Operator mistakes stop both commands before anything starts (no broker, no process, no thread), with one line
on stderr naming the option or file and exit code 2: invalid options (:class:`~stream_anon.config.settings.Config`
validates them at load), a metrics port already in use or an address that is not this machine's
(:func:`preflight`), topic names Kafka refuses, Kafka security options the client libraries would refuse with a
traceback, a missing, malformed or short ADULT file (``demo``; the message says whether the path came from
``--adult`` or ``$STREAM_ANON_ADULT``), and argparse's own errors (a bad number).

When ``run`` starts the embedded broker (no ``kafka.bootstrap_servers``) and ``service.idle_flush_seconds`` is
not set anywhere (flag, ``--set``, environment, config file), it is :data:`EMBEDDED_IDLE_FLUSH_SECONDS`: that
broker keeps everything in memory, so a finite replay sent without its end-of-stream marker would otherwise
leave up to ``delta`` records buffered, and lost when the service stops.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from stream_anon.cli.arguments import one_line_errors
from stream_anon.core.defaults import DEFAULTS

if TYPE_CHECKING:  # the configuration (numpy, yaml, the mechanisms) is imported when a command runs
    from stream_anon.config.settings import Config

# flag -> dotted option (every option is also reachable with --set section.field=value)
COMMON_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--bootstrap-servers", "kafka.bootstrap_servers", str,
     "Kafka bootstrap servers (host:port,...); without it an embedded Tansu broker is started"),
    ("--group-id", "kafka.group_id", str, "consumer group of the main path"),
    ("--security-protocol", "kafka.security_protocol", str, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ("--input-topic", "topics.input", str, "input topic (default adult.raw); the output, dead-letter, suppressed "
     "and side topics default to <input without .raw>.anon, .dlq, .suppressed, .krr, ... and the ledger to "
     "<input>.ledger (each overridable with --set topics.<name>=...)"),
    ("--partitions", "topics.partitions", int, "partitions of topics the service creates (default 1)"),
    ("--schema", "anonymization.schema", str, "schema file (default: the shipped ADULT schema); the side paths "
     "take the attributes it declares for them"),
    ("--k", "anonymization.k", int, f"k: every released class holds >= k records (default {DEFAULTS.k})"),
    ("--delta", "anonymization.delta", int, f"delay bound in arrivals (default {DEFAULTS.delta})"),
    ("--beta", "anonymization.beta", int, f"maximum open clusters (default {DEFAULTS.beta})"),
    ("--mu", "anonymization.mu", int, f"recent released-cluster losses that set tau (default {DEFAULTS.mu})"),
    ("--algorithm", "anonymization.algorithm", str, f"castle or ubdsa (default {DEFAULTS.algorithm})"),
    ("--loss", "anonymization.loss", str, f"gt, lm or ubdsa (default {DEFAULTS.loss})"),
    ("--leftover", "anonymization.leftover", str, f"suppress or leftover (default {DEFAULTS.leftover})"),
    ("--l", "anonymization.l", str, f"l of the l-diversity model (default {DEFAULTS.l}; an integer; entropy: any "
     f"number >= 1; null: none); cluster reuse stays off (zeta {DEFAULTS.zeta})"),
    ("--diversity", "anonymization.diversity", str,
     f"l-diversity model: distinct, entropy or recursive (default {DEFAULTS.diversity})"),
    ("--c", "anonymization.c", str, "c of recursive (c, l)-diversity"),
    ("--t-closeness", "anonymization.t_closeness", str,
     f"t-closeness against the stream's running distribution (default {DEFAULTS.t_closeness}; null: off)"),
    ("--seed", "anonymization.seed", int, "engine seed (default: OS entropy)"),
    ("--max-message-bytes", "service.max_message_bytes", int, "larger inputs go to the DLQ"),
    ("--metrics-port", "service.metrics_port", int, "Prometheus endpoint port on 127.0.0.1 (0 = off)"),
    ("--metrics-addr", "service.metrics_addr", str, "address the metrics endpoint binds (default 127.0.0.1)"),
    ("--idle-flush-seconds", "service.idle_flush_seconds", float,
     "flush a partition's buffer after this long without input (0 = never; default 0, or 5 with the "
     "embedded broker of `run`)"),
)

EMBEDDED_IDLE_FLUSH_SECONDS = 5.0
"""``service.idle_flush_seconds`` of ``run`` with its embedded (in-memory) broker, unless set: long beside the
gaps of a replay (milliseconds; 0.2 s at ``--rate 5``), short beside an operator's wait before stopping it."""

BOOTSTRAP_ENV = "STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS"  # env_name("kafka.bootstrap_servers"): the config's name
DEPRECATED_BOOTSTRAP_ENV = "STREAM_ANON_BOOTSTRAP_SERVERS"
"""The name the replay tools and ``udp-bridge`` used to read: still accepted everywhere, with a warning."""

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_warned: set[str] = set()


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


def bootstrap_servers_from_env(prog: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Kafka bootstrap servers from ``$STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS`` (the config's name), else from the
    deprecated ``$STREAM_ANON_BOOTSTRAP_SERVERS`` with a one-line warning on stderr (once per process)."""
    env = os.environ if environ is None else environ
    value, old = env.get(BOOTSTRAP_ENV) or None, env.get(DEPRECATED_BOOTSTRAP_ENV) or None
    if old is not None:
        _deprecated(prog, f"ignored: ${BOOTSTRAP_ENV} is set too" if value is not None else "used")
    return value if value is not None else old


def _deprecated(prog: str, what: str) -> None:
    if DEPRECATED_BOOTSTRAP_ENV not in _warned:
        _warned.add(DEPRECATED_BOOTSTRAP_ENV)
        print(f"{prog}: warning: ${DEPRECATED_BOOTSTRAP_ENV} is deprecated ({what}); set ${BOOTSTRAP_ENV} "
              f"instead", file=sys.stderr)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted option -> value, from ``--set`` and the flags (flags last: they win)."""
    from stream_anon.config.settings import ConfigError

    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected SECTION.FIELD=VALUE")
        key, raw = item.split("=", 1)
        overrides[key.strip().replace("-", "_")] = raw  # text: converted by the option's type
    for name, value in vars(args).items():
        if name.startswith("opt_") and value is not None:
            overrides[name[4:].replace("__", ".")] = value
    if getattr(args, "no_side_paths", False):
        overrides["side_paths.enabled"] = False
    return overrides


def config_from_args(args: argparse.Namespace, *, prog: str = "stream-anon") -> Config:
    """The config of ``run``/``demo``: flags and ``--set``, then ``STREAM_ANON_*`` variables (the deprecated
    ``$STREAM_ANON_BOOTSTRAP_SERVERS`` among them, with a warning), then ``--config``, then defaults."""
    from stream_anon.config.settings import Config

    overrides = _overrides(args)
    old = os.environ.get(DEPRECATED_BOOTSTRAP_ENV) or None
    if old is not None:
        if "kafka.bootstrap_servers" in overrides:
            _deprecated(prog, "ignored: --bootstrap-servers is given")
        elif os.environ.get(BOOTSTRAP_ENV):
            _deprecated(prog, f"ignored: ${BOOTSTRAP_ENV} is set too")
        else:
            _deprecated(prog, "used")
            overrides = {"kafka.bootstrap_servers": old, **overrides}  # environment precedence (beats the file)
    return Config.load(args.config, overrides=overrides)


def option_given(args: argparse.Namespace, dotted: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the operator set ``dotted`` anywhere: flag, ``--set``, environment variable or config file."""
    import yaml

    from stream_anon.config.settings import env_name
    from stream_anon.core.schema import load_yaml

    if dotted in _overrides(args):
        return True
    if env_name(dotted) in (os.environ if environ is None else environ):
        return True
    if args.config:
        try:
            data = load_yaml(Path(args.config).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            return False  # Config.load has already refused such a file
        node: Any = data
        for part in dotted.split("."):
            if not isinstance(node, Mapping):
                return False
            keys = {str(k).replace("-", "_"): v for k, v in node.items()}
            if part not in keys:
                return False
            node = keys[part]
        return True
    return False


def embedded_broker_defaults(cfg: Config, args: argparse.Namespace) -> tuple[Config, list[str]]:
    """``run`` with its embedded broker: :data:`EMBEDDED_IDLE_FLUSH_SECONDS` unless the operator set
    ``service.idle_flush_seconds``; and the notes to print."""
    if cfg.kafka.bootstrap_servers or option_given(args, "service.idle_flush_seconds"):
        return cfg, []
    cfg = cfg.with_options({"service.idle_flush_seconds": EMBEDDED_IDLE_FLUSH_SECONDS}, origin="embedded broker")
    return cfg, [f"embedded broker: a partition quiet for {EMBEDDED_IDLE_FLUSH_SECONDS:g} s is flushed "
                 f"(service.idle_flush_seconds; its records are in memory only)"]


def preflight(cfg: Config) -> None:
    """What the running service would trip over with a traceback, checked before anything starts: raises
    :class:`ConfigError` or :class:`MetricsEndpointError` (one line naming the option)."""
    from stream_anon.config.settings import ConfigError
    from stream_anon.metrics.endpoint import check_metrics_endpoint

    s, k, t = cfg.service, cfg.kafka, cfg.topics
    side_process = cfg.side_paths.enabled and s.side_paths_mode == "process" and s.side_metrics_port != 0
    if s.metrics_port and side_process and s.metrics_port == s.side_metrics_port:
        raise ConfigError(f"options service.metrics_port and service.side_metrics_port: both {s.metrics_port}; the "
                          f"main and side-path endpoints need different ports (0 turns one off)")
    side = ("krr", "rs", "blap", "estimates", "kmeans") if cfg.side_paths.enabled and s.side_paths_mode != "off" else ()
    for name in ("input", "anon", "suppressed", "dlq", *side):
        topic = getattr(t, name)
        if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            raise ConfigError(f"option topics.{name}: expected a Kafka topic name (1-249 ASCII letters, digits, "
                              f"'.', '_', '-'; not '.' or '..'), got {topic!r}")
    if k.security_protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"option kafka.security_protocol: expected {', '.join(SECURITY_PROTOCOLS)}, "
                          f"got {k.security_protocol!r}")
    if k.sasl_mechanism is not None and k.sasl_mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"option kafka.sasl_mechanism: expected {', '.join(SASL_MECHANISMS)} (or unset), "
                          f"got {k.sasl_mechanism!r}")
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile"):
        path = getattr(k, name)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"option kafka.{name}: file {path!r} does not exist")
    check_kafka_options(cfg)
    # the ports last: a bad option is reported as such even while another process holds a port
    if s.metrics_port:
        check_metrics_endpoint(s.metrics_port, s.metrics_addr)
    if side_process:
        check_metrics_endpoint(s.side_metrics_port, s.metrics_addr, port_option="service.side_metrics_port")


def check_kafka_options(cfg: Config) -> None:
    """The numeric and named ``kafka.*`` options the client libraries would refuse (kafka-python raises
    ``KafkaConfigurationError`` when a consumer is made, librdkafka ``KafkaException`` when the producer is):
    :class:`ConfigError` naming the option, checked before anything starts."""
    from stream_anon.config.settings import ConfigError

    k = cfg.kafka
    checks: list[tuple[str, bool, str, Any]] = [
        ("session_timeout_ms", k.session_timeout_ms > 100, "an integer > 100", k.session_timeout_ms),
        ("heartbeat_interval_ms", k.heartbeat_interval_ms >= 1, "an integer >= 1", k.heartbeat_interval_ms),
        ("max_poll_interval_ms", k.max_poll_interval_ms >= 1, "an integer >= 1", k.max_poll_interval_ms),
        ("fetch_max_wait_ms", 0 <= k.fetch_max_wait_ms < k.request_timeout_ms,
         f"an integer >= 0 below kafka.request_timeout_ms ({k.request_timeout_ms})", k.fetch_max_wait_ms),
        ("request_timeout_ms", 1 <= k.request_timeout_ms < 540000, "an integer in [1, 539999] (kafka-python: "
         "below its connections_max_idle_ms, 540000)", k.request_timeout_ms),
        ("fetch_max_bytes", k.fetch_max_bytes >= 1000, "an integer >= 1000 (librdkafka's smallest)",
         k.fetch_max_bytes),
        ("max_partition_fetch_bytes", k.max_partition_fetch_bytes >= 1, "an integer >= 1",
         k.max_partition_fetch_bytes),
        ("receive_max_bytes", k.fetch_max_bytes + max(512, k.max_partition_fetch_bytes) <= k.receive_max_bytes
         <= 2147483647, f"an integer in [kafka.fetch_max_bytes + kafka.max_partition_fetch_bytes (at least 512), "
         f"2147483647] = [{k.fetch_max_bytes + max(512, k.max_partition_fetch_bytes)}, 2147483647]",
         k.receive_max_bytes),
        ("linger_ms", 0 <= k.linger_ms <= 900000, "an integer in [0, 900000]", k.linger_ms),
        ("batch_size", k.batch_size >= 1, "an integer >= 1", k.batch_size),
        ("max_request_size", 1000 <= k.max_request_size <= 1000000000, "an integer in [1000, 1000000000]",
         k.max_request_size),
        ("compression_type", k.compression_type in (None, "gzip", "snappy", "lz4", "zstd"),
         "gzip, snappy, lz4, zstd (or unset)", k.compression_type),
        ("connect_timeout_ms", k.connect_timeout_ms >= 1, "an integer >= 1", k.connect_timeout_ms),
        ("startup_retry_seconds", k.startup_retry_seconds >= 0, "a number >= 0 (0 = forever)", k.startup_retry_seconds),
        ("retry_backoff_max_seconds", k.retry_backoff_max_seconds > 0, "a number > 0", k.retry_backoff_max_seconds),
    ]
    for name, ok, allowed, value in checks:
        if not ok:
            raise ConfigError(f"option kafka.{name}: expected {allowed}, got {value!r}")
    if k.group_instance_id is not None and (not _TOPIC_NAME.fullmatch(k.group_instance_id)
                                            or k.group_instance_id in (".", "..")):
        raise ConfigError(f"option kafka.group_instance_id: expected 1-249 ASCII letters, digits, '.', '_', '-' "
                          f"(or unset), got {k.group_instance_id!r}")


def _at_least(minimum: float, kind: type[int] | type[float], *, above: bool = False) -> Any:
    """argparse ``type``: a number >= ``minimum`` (> with ``above``), one-line error otherwise."""

    def convert(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or (value <= minimum if above else value < minimum):  # NaN too
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} "
                                             f"{'>' if above else '>='} {minimum:g}, got {text!r}")
        return value

    return convert


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the streaming anonymization service (Kafka consumer)",
                       description="Consume JSON records, release delay-bounded k-anonymous classes, publish the "
                                   "LDP side topics. Precedence: flags > STREAM_ANON_* env > --config file > "
                                   "defaults. Without --bootstrap-servers an embedded broker is started (then "
                                   f"service.idle_flush_seconds defaults to {EMBEDDED_IDLE_FLUSH_SECONDS:g}).")
    add_config_flags(p)
    p.add_argument("--new-budget", action="store_true",
                   help="start a NEW side-path budget for the input topic (a new generation: every record may spend "
                        "its lifetime cap again); needed when the budget state is missing or stale; logged as a "
                        "WARNING and recorded in the budget topic (docs/side-paths.md)")
    p.set_defaults(func=_run)
    one_line_errors(p)

    d = sub.add_parser("demo", help="embedded broker + service + ADULT replay, then a summary (the main command)",
                       description="Start an embedded broker, the service and its metrics endpoint, replay ADULT, "
                                   "wait until every record is released and print a summary.")
    add_config_flags(d)
    d.add_argument("--adult", metavar="PATH", help="ADULT file (default: $STREAM_ANON_ADULT, else download)")
    d.add_argument("--records", type=_at_least(1, int), default=None, help="replay only the first N records")
    d.add_argument("--rate", type=_at_least(0, float), default=0.0,
                   help="replay rate in records/s (0 = as fast as possible)")
    d.add_argument("--run-dir", default=None, help="where to write summary.json and released.csv "
                                                   "(default runs/demo-<timestamp>)")
    d.add_argument("--synthetic", action="store_true", help="use the synthetic ADULT-shaped generator")
    d.add_argument("--no-download", action="store_true", help="never try to download ADULT")
    d.add_argument("--timeout", type=_at_least(0, float, above=True), default=600.0,
                   help="give up after this many seconds")
    d.add_argument("--connect-timeout", type=_at_least(0, float, above=True), default=30.0, metavar="SECONDS",
                   help="with --bootstrap-servers: give up (exit 3, one line naming the address) when the broker does "
                        "not accept a connection within this time (default 30)")
    d.set_defaults(func=_demo)
    one_line_errors(d)


def _install_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT stop the service (``stop``); SIGUSR1 writes every thread's stack to stderr."""
    from stream_anon.kafka_io.lifecycle import dump_stacks_on_signal

    dump_stacks_on_signal()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    from stream_anon.config.settings import ConfigError
    from stream_anon.metrics.endpoint import MetricsEndpointError
    from stream_anon.runtime.run import run_service  # the service's clients: imported when the command runs

    try:
        cfg = config_from_args(args, prog="stream-anon run")
        cfg, notes = embedded_broker_defaults(cfg, args)
        preflight(cfg)
    except (ConfigError, MetricsEndpointError) as e:
        print(f"stream-anon run: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"stream-anon run: {note}", file=sys.stderr)
    stop = threading.Event()
    _install_signals(stop)
    return run_service(cfg, stop_event=stop, new_budget=args.new_budget)


def _demo(args: argparse.Namespace) -> int:
    from stream_anon.config.settings import ConfigError
    from stream_anon.core.datasets import DatasetError  # pandas: imported when the command runs
    from stream_anon.metrics.endpoint import MetricsEndpointError
    from stream_anon.runtime.demo import run_demo  # the service's clients: imported when the command runs

    try:
        cfg = config_from_args(args, prog="stream-anon demo")
        if args.run_dir is not None:
            try:
                Path(args.run_dir).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"--run-dir: cannot create directory {args.run_dir!r} ({e.strerror or e})") from None
        preflight(cfg)  # the metrics ports last: a bad option is named even while a port is busy
    except (ConfigError, MetricsEndpointError) as e:
        print(f"stream-anon demo: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    _install_signals(stop)
    try:
        return run_demo(cfg, adult=args.adult, records=args.records, rate=args.rate, run_dir=args.run_dir,
                        synthetic=args.synthetic, download=not args.no_download, timeout=args.timeout,
                        stop_event=stop, connect_timeout=args.connect_timeout)
    except DatasetError as e:  # the ADULT file: missing, malformed or short (read before anything starts)
        print(f"stream-anon demo: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
