"""``stream-anon audit``: account for every input offset from the internal ledger, and check every promised output
against its topic (:mod:`stream_anon.service.audit`); with ``--run-dir``, also write the run directory that
``verify`` and ``report`` read (:mod:`stream_anon.runtime.export`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stream_anon.cli.arguments import one_line_errors
from stream_anon.cli.service import config_from_args

DEFAULT_CONNECT_SECONDS = 30.0  # stream_anon.kafka_io.address.DEFAULT_CONNECT_SECONDS (checked by the tests)
EXIT_UNREACHABLE = 3


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="account for every input record from the ledger (exit 1 if one is not)",
                       description="Read the ledger <input>.ledger and the anon, suppressed and dlq topics: every "
                                   "input offset must be released, suppressed, dead-lettered or an end-of-stream "
                                   "marker exactly once, and every promised output published exactly once. Run it "
                                   "against the service's broker once the service has drained its input (offsets "
                                   "it has not reached yet are reported as not accounted); the topics are named as "
                                   "the service names them (the same --input-topic, --config, --set). Exit 0: all "
                                   "holds; 1: it does not; 2: usage (a malformed address among them); 3: no broker "
                                   "answered within --connect-timeout.")
    p.add_argument("--bootstrap-servers", dest="opt_kafka__bootstrap_servers", metavar="HOST:PORT", default=None,
                   help="the broker the service uses (required here, or kafka.bootstrap_servers in --config / "
                        "$STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--input-topic", dest="opt_topics__input", metavar="TOPIC", default=None,
                   help="the service's input topic (default adult.raw); the ledger and output topics follow from it "
                        "as in the service")
    p.add_argument("--schema", dest="opt_anonymization__schema", metavar="FILE", default=None,
                   help="the service's schema file (default: the shipped ADULT schema): its QIs and sensitive "
                        "attribute name the released table's columns")
    p.add_argument("--config", metavar="FILE", help="the service's YAML config file (topic names, schema, Kafka "
                                                    "security options)")
    p.add_argument("--set", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                   help="any service option, as for `run` (e.g. --set topics.anon=visits.public)")
    p.add_argument("--connect-timeout", type=_seconds, default=DEFAULT_CONNECT_SECONDS, metavar="SECONDS",
                   help=f"give up (exit 3, one line naming the address) when no broker accepts a connection within "
                        f"this time (default {DEFAULT_CONNECT_SECONDS:g})")
    p.add_argument("--run-dir", metavar="DIR", default=None,
                   help="also write a run directory there: the public released table released.csv with its meta "
                        "file (what `stream-anon verify --input DIR/released.csv` checks), summary.json, delays.json, "
                        "schema.yaml and config.json (what `stream-anon report DIR` draws)")
    p.set_defaults(func=_audit)
    one_line_errors(p)


def _audit(args: argparse.Namespace) -> int:
    from stream_anon.config.settings import ConfigError
    from stream_anon.kafka_io.address import BrokerUnreachableError, wait_for_broker

    prog = "stream-anon audit"
    try:
        cfg = config_from_args(args, prog=prog)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    bs = cfg.kafka.bootstrap_servers
    if not bs:
        print(f"{prog}: --bootstrap-servers (or kafka.bootstrap_servers) is required: the broker the service uses",
              file=sys.stderr)
        return 2
    try:
        wait_for_broker(bs, args.connect_timeout)
    except BrokerUnreachableError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    from kafka.errors import KafkaError

    from stream_anon.kafka_io.lifecycle import quiet_client_libraries, quiet_closing_clients
    from stream_anon.service.audit import audit_lines, collect_outputs, partition_ends

    quiet_client_libraries()
    quiet_closing_clients()
    schema = cfg.anonymization.load_schema()
    t, opts = cfg.topics, cfg.kafka.security_options()
    try:
        ends = partition_ends(bs, t.input, client_options=opts)
        if not ends:
            print(f"{prog}: topic {t.input!r} does not exist on {bs} (--input-topic)", file=sys.stderr)
            return 2
        snap = collect_outputs(bs, input_topic=t.input, ledger=t.ledger_topic(), anon=t.anon, suppressed=t.suppressed,
                               dlq=t.dlq, qis=[a.name for a in schema.qis],
                               sensitive=[a.name for a in schema.sensitive], input_ends=ends, client_options=opts)
    except KafkaError as e:  # a port that answers but is no Kafka broker, or one that went away meanwhile
        print(f"{prog}: broker {bs} did not answer as a Kafka broker ({type(e).__name__}: "
              f"{' '.join(str(e).split())})", file=sys.stderr)
        return EXIT_UNREACHABLE
    print("\n".join(audit_lines(snap)))
    if args.run_dir is not None:
        from stream_anon.runtime.export import write_run_directory

        out = write_run_directory(args.run_dir, cfg, schema, snap, source=f"stream-anon audit of {t.input} on {bs}")
        print(f"run directory: {out} (released.csv, summary.json; `stream-anon verify --input {out}/released.csv "
              f"--k {cfg.anonymization.k}`, `stream-anon report {out}`)")
    return 0 if snap.ok else 1
