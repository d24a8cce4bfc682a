"""``stream-anon udp-bridge``: UDP datagrams (one record each, with sequence numbers) -> Kafka topic."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from stream_anon.cli.arguments import one_line_errors
from stream_anon.cli.service import bootstrap_servers_from_env

if TYPE_CHECKING:  # the bridge, Kafka and Prometheus are imported when the command runs, not for --help
    from stream_anon.service.udp_bridge import RecordSink

DEFAULT_BRIDGE_METRICS_PORT = 9466
DEFAULT_WINDOW = 65_536  # stream_anon.service.udp_bridge.DEFAULT_WINDOW (checked by the tests)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "udp-bridge", help="forward UDP record datagrams to a Kafka topic, counting gaps and duplicates",
        description="Receive one-record UDP datagrams ({\"stream\", \"seq\", \"record\"} JSON, then an EOS datagram; "
                    "see docs/replay.md), forward the records to Kafka keyed by record id, and count gaps, "
                    "duplicates and malformed datagrams (Prometheus stream_anon_udp_* metrics).")
    p.add_argument("--listen", default="127.0.0.1:9999", help="UDP HOST:PORT to receive on (default 127.0.0.1:9999)")
    p.add_argument("--topic", default="adult.raw", help="Kafka topic to forward to (default adult.raw)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="Kafka bootstrap servers; without it an embedded Tansu broker is started "
                        "(env STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--partitions", type=int, default=1, help="partitions when the topic must be created (default 1)")
    p.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="give up (exit 3, one line naming the address) when no broker accepts a connection within "
                        "this time (default 30)")
    p.add_argument("--sink", choices=["kafka", "null"], default="kafka",
                   help="'null' counts and discards (measures UDP reception alone)")
    p.add_argument("--metrics-port", type=int, default=DEFAULT_BRIDGE_METRICS_PORT,
                   help=f"Prometheus port (default {DEFAULT_BRIDGE_METRICS_PORT}; 0 = no endpoint)")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="Prometheus bind address (default 127.0.0.1)")
    p.add_argument("--exit-on-eos", action="store_true", help="stop after the first end-of-stream datagram")
    p.add_argument("--eos-grace", type=float, default=0.5,
                   help="seconds to keep receiving late datagrams after EOS before closing the stream (default 0.5)")
    p.add_argument("--idle-close", type=float, default=None, metavar="SECONDS",
                   help="close a stream after this many seconds without datagrams (its EOS was lost); "
                        "with --exit-on-eos, then exit")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"reordering window in sequence numbers (default {DEFAULT_WINDOW})")
    p.add_argument("--rcvbuf", type=int, default=8 * 1024 * 1024, help="socket receive buffer bytes (default 8 MiB)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--report-json", default=None, help="also write the final report as JSON to this path ('-' = stdout)")
    p.set_defaults(func=run_udp_bridge)
    one_line_errors(p)


def run_udp_bridge(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from stream_anon.kafka_io.broker import EmbeddedBroker
    from stream_anon.kafka_io.lifecycle import quiet_client_libraries
    from stream_anon.metrics.definitions import UDP, ServiceMetrics
    from stream_anon.metrics.endpoint import MetricsEndpointError, serve_metrics
    from stream_anon.replay.kafka_replay import (
        BrokerUnreachableError,
        ReplayInputError,
        ensure_topic,
    )
    from stream_anon.service.udp_bridge import KafkaSink, NullSink, UdpBridge, parse_listen

    try:
        host, port = parse_listen(args.listen)
    except ValueError as e:
        print(f"stream-anon udp-bridge: {e}", file=sys.stderr)
        return 2
    quiet_client_libraries()  # the client libraries' own lines only at DEBUG
    metrics = ServiceMetrics(CollectorRegistry(), parts=frozenset({UDP}))  # the bridge's own metrics only
    with contextlib.ExitStack() as stack:
        sink: RecordSink
        if args.sink == "null":
            sink = NullSink()
        else:
            bootstrap = args.bootstrap_servers or bootstrap_servers_from_env("udp-bridge")
            if not bootstrap:
                broker = stack.enter_context(EmbeddedBroker())
                bootstrap = broker.bootstrap_servers
                print(f"udp-bridge: started embedded broker on {bootstrap}", file=sys.stderr, flush=True)
            try:  # a malformed address: exit 2; no broker within the connect timeout: one line, exit 3
                ensure_topic(bootstrap, args.topic, args.partitions, connect_timeout_s=args.connect_timeout)
            except ReplayInputError as e:
                print(f"stream-anon udp-bridge: {e}", file=sys.stderr)
                return 2
            except BrokerUnreachableError as e:
                print(f"stream-anon udp-bridge: {e}", file=sys.stderr)
                return 3
            kafka_sink = KafkaSink(bootstrap, args.topic, metrics=metrics)
            stack.callback(kafka_sink.close)
            sink = kafka_sink
        if args.metrics_port:
            try:
                serve_metrics(metrics.registry, args.metrics_port, addr=args.metrics_addr,
                              port_option="--metrics-port", addr_option="--metrics-addr")
            except MetricsEndpointError as e:
                print(f"stream-anon udp-bridge: {e}", file=sys.stderr, flush=True)
                return 2
        bridge = UdpBridge(host, port, sink, metrics, window=args.window, exit_on_eos=args.exit_on_eos,
                           eos_grace_s=args.eos_grace, idle_close_s=args.idle_close,
                           rcvbuf_bytes=args.rcvbuf)
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        metrics_note = (f", metrics http://{args.metrics_addr}:{args.metrics_port}/metrics"
                        if args.metrics_port else "")
        print(f"udp-bridge: listening on udp://{bridge.host}:{bridge.port} -> "
              f"{'topic ' + repr(args.topic) if args.sink == 'kafka' else 'null sink'}{metrics_note}",
              file=sys.stderr, flush=True)
        try:
            report = bridge.serve(stop=stop, max_seconds=args.max_seconds)
        except KeyboardInterrupt:
            report = bridge.report
        print(report.summary(), file=sys.stderr, flush=True)
        if args.report_json:
            text = json.dumps(report.to_dict())
            if args.report_json == "-":
                print(text, flush=True)
            else:
                with open(args.report_json, "w", encoding="utf-8") as f:
                    f.write(text + "\n")
    return 0
