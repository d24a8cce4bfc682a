"""``stream-anon bench service``: the main path end to end through a real broker with kafka-python.

1. **Throughput** (records/s sustained): ADULT x ``--loops`` is loaded into an input topic first; then
   (a) a *passthrough* pipeline (consume, JSON decode + encode, produce, commit; no anonymization) and
   (b) the *main path* (``MainPath``: decode, validate, CASTLE k=10 delta=1000 beta=50, produce classes,
   flush, commit watermarks) each consume it from the beginning in their own consumer group, one after the
   other, in this process.  Time runs from the first record consumed to the last output acknowledged and
   its offset committed (without release ticks unless ``--set release.tick_seconds=...``: the last classes would
   wait for the end of their tick).  The ratio main/passthrough is printed.
2. **Latency** at 50% of the measured main-path maximum: a replay *process* sends ADULT at that rate while the
   main path runs; ingest-to-release latency = release time in the pipeline - the input message's timestamp
   (producer create time, same machine, from the ledger), and ingest-to-publish latency = the class message's
   Kafka timestamp (the end of its release tick, ``release.tick_seconds``; with 0: produced once its ledger entry
   is acknowledged) - the input message's timestamp;
   p50/p99/max over every released record.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from stream_anon.bench import broker_problem
from stream_anon.config.settings import Config
from stream_anon.core.datasets import resolve_adult_path
from stream_anon.core.defaults import DEFAULTS
from stream_anon.core.schema import adult_schema
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.kafka_io.lifecycle import quiet_client_libraries
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.replay.kafka_replay import ensure_topic
from stream_anon.service.app import MainPath
from stream_anon.service.audit import collect_outputs, read_topic_with_headers, send_flush_markers

log = logging.getLogger(__name__)


def _replay(bs: str, topic: str, adult: str, *, rate: float = 0.0, loops: int = 1, partitions: int = 1) -> None:
    cmd = [sys.executable, "-m", "replay_tools", "kafka", "--adult", adult, "--topic", topic,
           "--bootstrap-servers", bs, "--rate", str(rate), "--loop", str(loops), "--partitions", str(partitions),
           "--no-progress"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def passthrough(bs: str, topic: str, out_topic: str, n: int, *, max_records: int, commit_interval_s: float,
                linger_ms: int) -> dict[str, float]:
    """Consume -> json.loads -> json.dumps -> produce -> (flush, commit) ; returns seconds and records/s."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bs, group_id=f"pass-{uuid.uuid4().hex[:6]}",
                             enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
                             heartbeat_interval_ms=2000, max_poll_records=max_records)
    producer = KafkaProducer(bootstrap_servers=bs, acks="all", linger_ms=linger_ms, batch_size=262144)
    seen = 0
    t0: float | None = None
    last_commit = time.monotonic()
    positions: dict[TopicPartition, int] = {}
    try:
        while seen < n:
            batch = consumer.poll(timeout_ms=200, max_records=max_records)
            if batch and t0 is None:
                t0 = time.perf_counter()
            for tp, recs in batch.items():
                for r in recs:
                    if not r.value:
                        continue  # end-of-stream marker
                    seen += 1
                    producer.send(out_topic, value=json.dumps(json.loads(r.value)).encode(), key=r.key,
                                  partition=tp.partition)
                positions[tp] = recs[-1].offset + 1
            if time.monotonic() - last_commit >= commit_interval_s:
                producer.flush()
                consumer.commit({tp: OffsetAndMetadata(o, None, -1) for tp, o in positions.items()})
                last_commit = time.monotonic()
        producer.flush()
        consumer.commit({tp: OffsetAndMetadata(o, None, -1) for tp, o in positions.items()})
        seconds = time.perf_counter() - (t0 or time.perf_counter())
    finally:
        consumer.close()
        producer.close()
    return {"records": seen, "seconds": seconds, "records_per_second": seen / seconds}


def _config(bs: str, prefix: str, args: argparse.Namespace, input_topic: str | None = None) -> Config:
    extra = {}
    for item in args.set:
        key, _, raw = item.partition("=")
        extra[key.strip()] = raw
    return Config.load(env={}, overrides={**extra,
        "kafka.bootstrap_servers": bs, "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "kafka.max_poll_records": args.max_records, "kafka.linger_ms": args.linger_ms,
        "topics.input": input_topic or f"{prefix}.raw", "topics.ledger": f"{prefix}.ledger",
        "topics.anon": f"{prefix}.anon", "topics.suppressed": f"{prefix}.suppressed",
        "topics.dlq": f"{prefix}.dlq", "topics.partitions": args.partitions, "anonymization.k": args.k,
        "anonymization.delta": args.delta, "anonymization.beta": args.beta, "anonymization.mu": args.mu,
        "anonymization.seed": 1, "service.commit_interval_ms": args.commit_interval_ms, "service.metrics_port": 0,
        "side_paths.enabled": False, **extra,
    })


def main_path_run(cfg: Config, n: int, *, during: Callable[[], None] | None = None,
                  timeout_s: float = 600.0) -> dict[str, Any]:
    """Run ``MainPath`` in a thread until ``n`` records are accounted for and committed."""
    main = MainPath(cfg, metrics=ServiceMetrics(CollectorRegistry()))
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    if not main.ready.wait(60):
        raise RuntimeError("main path did not start")
    if during is not None:
        if not main.assigned.wait(60):
            raise RuntimeError("main path got no partitions")
        during()
    t = main.totals
    deadline = time.monotonic() + timeout_s
    t0: float | None = None
    while True:
        if t0 is None and t.consumed > 0:
            t0 = time.perf_counter()
        done = t.released + t.suppressed + t.dead_lettered
        if done >= n and main.states and all(p.buffered == 0 and main.committed.get(i) == p.next_offset
                                             for i, p in main.states.items()):
            break
        if time.monotonic() > deadline or not th.is_alive():
            raise RuntimeError(f"main path did not finish: {t}")
        time.sleep(0.002)
    seconds = time.perf_counter() - (t0 or time.perf_counter())
    main.stop_event.set()
    th.join(30)
    return {"records": done, "seconds": seconds, "records_per_second": done / seconds if seconds else 0.0,
            "released": t.released, "suppressed": t.suppressed, "gt_loss": t.gt_loss, "classes": t.classes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stream-anon bench service", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", default=None,
                    help="a running broker, HOST:PORT (default: an embedded Tansu broker); unreachable within "
                         "--connect-timeout: one line, exit 3")
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--loops", type=int, default=3, help="ADULT passes loaded for the throughput runs (default 3)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--k", type=int, default=DEFAULTS.k, help=f"default {DEFAULTS.k} (the service's other engine "
                    f"defaults apply: l={DEFAULTS.l}, zeta={DEFAULTS.zeta})")
    ap.add_argument("--delta", type=int, default=DEFAULTS.delta, help=f"default {DEFAULTS.delta}")
    ap.add_argument("--beta", type=int, default=DEFAULTS.beta, help=f"default {DEFAULTS.beta}")
    ap.add_argument("--mu", type=int, default=DEFAULTS.mu, help=f"default {DEFAULTS.mu}")
    ap.add_argument("--max-records", type=int, default=5000, help="poll batch size")
    ap.add_argument("--linger-ms", type=int, default=20)
    ap.add_argument("--commit-interval-ms", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3, help="passthrough/main-path pairs (median reported)")
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="length of the 50%%-rate latency run")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="service option for the main-path runs (e.g. service.workers=0)")
    ap.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="with --bootstrap-servers: give up (exit 3, one line naming the address) when no broker "
                         "accepts a connection within this time (default 30)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    quiet_client_libraries()  # the client libraries' own lines only at DEBUG
    problem = broker_problem("stream-anon bench service", args.bootstrap_servers, args.connect_timeout)  # malformed 2, unreachable 3
    if problem:
        return problem
    adult = str(resolve_adult_path(args.adult))
    broker = None
    bs = args.bootstrap_servers
    if not bs:
        broker = EmbeddedBroker().start()
        bs = broker.bootstrap_servers
    results: dict[str, Any] = {"k": args.k, "delta": args.delta, "beta": args.beta, "mu": args.mu,
                               "partitions": args.partitions, "cpus": os.cpu_count()}
    try:
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        cfg = _config(bs, prefix, args)
        n = 32561 * args.loops
        t = time.perf_counter()
        _replay(bs, cfg.topics.input, adult, loops=args.loops, partitions=args.partitions)
        p = KafkaProducer(bootstrap_servers=bs)
        send_flush_markers(p, cfg.topics.input, list(range(args.partitions)))
        p.close()
        print(f"loaded {n:,} records (ADULT x {args.loops}) into {cfg.topics.input} in {time.perf_counter() - t:.1f} s")
        runs = []
        for rep in range(args.repeat):
            pt = passthrough(bs, cfg.topics.input, f"{prefix}.pass{rep}", n, max_records=args.max_records,
                             commit_interval_s=args.commit_interval_ms / 1000.0, linger_ms=args.linger_ms)
            print(f"[{rep + 1}/{args.repeat}] passthrough (consume, JSON decode/encode, produce, commit): "
                  f"{pt['records']:,} records in {pt['seconds']:.2f} s = {pt['records_per_second']:,.0f} records/s")
            rcfg = _config(bs, f"{prefix}r{rep}", args, input_topic=cfg.topics.input)  # fresh group and outputs
            if not any(o.startswith("release.tick_seconds") for o in args.set):  # the run ends at the last commit,
                rcfg = rcfg.with_options({"release.tick_seconds": 0})  # which a release tick would only delay
            mp = main_path_run(rcfg, n)
            print(f"[{rep + 1}/{args.repeat}] main path (k={args.k}, delta={args.delta}, beta={args.beta}, "
                  f"workers={rcfg.service.workers}): {mp['records']:,} records in {mp['seconds']:.2f} s = "
                  f"{mp['records_per_second']:,.0f} records/s (released {mp['released']:,}, suppressed "
                  f"{mp['suppressed']:,}, GT loss {mp['gt_loss']:.4f}); ratio "
                  f"{mp['records_per_second'] / pt['records_per_second']:.2f}")
            runs.append((pt, mp))
        ratios = sorted(m["records_per_second"] / p["records_per_second"] for p, m in runs)
        ratio = float(np.median(ratios))
        pt_rate = float(np.median([p["records_per_second"] for p, _ in runs]))
        mp_rate = float(np.median([m["records_per_second"] for _, m in runs]))
        mp = dict(runs[-1][1], records_per_second=mp_rate)
        pt = dict(runs[-1][0], records_per_second=pt_rate)
        print(f"median over {len(runs)} runs: passthrough {pt_rate:,.0f} records/s, main path {mp_rate:,.0f} "
              f"records/s, main path / passthrough = {ratio:.2f} (per run {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"target >= 0.70); main path {'>=' if mp_rate >= 10000 else '<'} 10,000 records/s target")
        results["runs"] = [{"passthrough": p, "main_path": m} for p, m in runs]
        results.update(passthrough=pt, main_path=mp, ratio=ratio)
        if not args.skip_latency:
            rate = 0.5 * mp["records_per_second"]
            lat_prefix = f"{prefix}lat"
            lcfg = _config(bs, lat_prefix, args)
            loops = max(1, int(np.ceil(rate * args.latency_seconds / 32561)))
            n_lat = 32561 * loops

            def replay_at_rate() -> None:
                def go() -> None:
                    _replay(bs, lcfg.topics.input, adult, rate=rate, loops=loops, partitions=args.partitions)
                    pr = KafkaProducer(bootstrap_servers=bs)
                    send_flush_markers(pr, lcfg.topics.input, list(range(args.partitions)))
                    pr.close()

                threading.Thread(target=go, daemon=True).start()

            # the topic must exist before the main path subscribes
            ensure_topic(bs, lcfg.topics.input, args.partitions)
            lr = main_path_run(lcfg, n_lat, during=replay_at_rate)
            s = adult_schema()
            lt = lcfg.topics
            snap = collect_outputs(bs, input_topic=lt.input, ledger=lt.ledger_topic(), anon=lt.anon,
                                   suppressed=lt.suppressed, dlq=lt.dlq,
                                   qis=[a.name for a in s.qis], sensitive=["income"])
            body = snap.records[snap.records.outcome == "released"]
            lat = body["latency_s"].dropna().to_numpy(dtype=float)
            # records released by the end-of-stream flush waited for the marker, not for delta: leave them out
            end_marker = snap.records.groupby("src_partition")["src_offset"].transform("max") + 1
            regular = body[body.release_offset < end_marker.loc[body.index]]
            reg_lat = regular["latency_s"].dropna().to_numpy(dtype=float)
            ingest_ms = {(m.partition, m.offset): m.timestamp for m in read_topic_with_headers(bs, lt.input)}
            published = (regular["published_ms"] - [ingest_ms[(p, o)] for p, o in zip(
                regular.src_partition, regular.src_offset, strict=True)]).dropna().to_numpy(dtype=float) / 1000.0
            latency = {"rate": rate, "records": n_lat, "p50": float(np.percentile(reg_lat, 50)),
                       "p99": float(np.percentile(reg_lat, 99)), "max": float(reg_lat.max()),
                       "p50_all": float(np.percentile(lat, 50)), "p99_all": float(np.percentile(lat, 99)),
                       "publish_p50": float(np.percentile(published, 50)),
                       "publish_p99": float(np.percentile(published, 99)), "publish_max": float(published.max()),
                       "expected_delay_s": args.delta / rate}
            results["latency"] = latency
            print(f"latency at {rate:,.0f} records/s (50% of max, {n_lat:,} records, main path throughput "
                  f"{lr['records_per_second']:,.0f}/s): ingest-to-release p50 {latency['p50'] * 1000:.0f} ms, "
                  f"p99 {latency['p99'] * 1000:.0f} ms, max {latency['max'] * 1000:.0f} ms; ingest-to-publish "
                  f"p50 {latency['publish_p50'] * 1000:.0f} ms, p99 {latency['publish_p99'] * 1000:.0f} ms, max "
                  f"{latency['publish_max'] * 1000:.0f} ms (delta/rate = {latency['expected_delay_s'] * 1000:.0f} ms "
                  f"is the delay bound in time)")
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
