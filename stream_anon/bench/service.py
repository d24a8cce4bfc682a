"""``stream-anon bench service``: the main path end to end through a real broker, against passthrough baselines of
both Python clients, on one broker or several (``--bootstrap-servers`` repeated; ``--embedded`` adds the embedded
Tansu broker, the default when none is given).

Per broker:

1. **Throughput** (records/s sustained): ADULT x ``--loops`` is loaded into an input topic first; then, in each of
   ``--repeat`` rounds and in this order under the same load, each consumes it from the beginning in its own consumer
   group: (a) a *passthrough* over **kafka-python** (consume, JSON decode + encode, produce, commit; no
   anonymization), (b) the same passthrough over **confluent-kafka** (librdkafka: the fastest Python client here),
   and (c) the *main path* (``MainPath``: decode, validate, CASTLE k=10 delta=1000 beta=50, ledger, produce
   classes, flush, commit watermarks; ``kafka.consumer_client`` and ``kafka.producer_client`` as configured, e.g.
   ``--set kafka.consumer_client=kafka-python``).  Time runs from the first record consumed to the last output
   acknowledged and its offset committed (without release ticks unless ``--set release.tick_seconds=...``: the last
   classes would wait for the end of their tick).  The medians and the ratios main path / each passthrough are printed.
2. **Latency** at 50% of the measured main-path maximum: a replay *process* sends ADULT at that rate while the
   main path runs, for ``--latency-seconds`` (the first records of ADULT when fewer than a pass, else whole
   passes); ingest-to-release latency = release time in the pipeline - the input message's timestamp (producer
   create time, same machine, from the ledger), and ingest-to-publish latency = the class message's
   Kafka timestamp (the end of its release tick, ``release.tick_seconds``; with 0: produced once its ledger entry
   is acknowledged) - the input message's timestamp;
   p50/p99/max over the released records sent after the main path recovered its partitions (the steady state; a
   partition recovers when its first record comes, and what is consumed meanwhile waits for the ledger scan:
   reported apart, over all records).  Two runs: release ticks of 0 (the path's own
   latency) and of the configured length (5 s by default: a class waits for the end of its tick, the defence
   against the release-timing attack); only one with ``--set release.tick_seconds=...``.

The last lines are one table with a row per broker: both passthroughs, the main path, the ratios, ingest-to-publish
p50/p99 at half the maximum rate for both tick lengths; then the CPU per record of the bench's own processes; then
what each run cost the whole machine, the broker included (/proc/stat's busy time over the run's window: CPU us per
record, cores busy, the CPU ceiling) beside the CPU per record the goal of 33,000 records/s and of 0.8 of the
confluent-kafka passthrough allows (``--json`` writes everything).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import multiprocessing
import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from stream_anon.bench import broker_problem
from stream_anon.config.settings import Config
from stream_anon.core.datasets import DatasetError, iter_adult_records, resolve_adult_path
from stream_anon.core.defaults import DEFAULTS
from stream_anon.core.engine import warm_up
from stream_anon.core.schema import adult_schema
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.kafka_io.lifecycle import quiet_client_libraries
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.replay.kafka_replay import ensure_topic
from stream_anon.service.app import MainPath
from stream_anon.service.audit import collect_outputs, read_topic_with_headers, send_flush_markers
from stream_anon.service.wiring import load_schema, make_engine_factory

log = logging.getLogger(__name__)

PASSTHROUGHS = ("kafka-python", "confluent-kafka")


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread: librdkafka's too) and of its live child processes (the pipeline
    worker): with the wall-clock rate, how much of the machine a run took (on a loaded machine the wall-clock rates
    fall, the CPU per record much less)."""
    return sum(cpu_split())


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a running process (``/proc/<pid>/stat``); raises OSError when it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_split() -> tuple[float, float]:
    """(this process, its live child processes) CPU seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = 0.0
    for child in multiprocessing.active_children():
        try:
            children += process_cpu_seconds(child.pid)  # type: ignore[arg-type]
        except (OSError, IndexError, ValueError):
            pass
    return own.ru_utime + own.ru_stime, children


def machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, every process (the broker's too): user + nice + system +
    irq + softirq of /proc/stat's ``cpu`` line (idle, iowait and steal left out); 0.0 where there is no /proc/stat.
    Its delta over a run's window, per record, is what the run cost the machine, so ``cpus * 1e6 / it`` is the most
    records per second this machine can give that run (its CPU ceiling)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def machine_figures(records: int, seconds: float, busy_seconds: float) -> dict[str, float]:
    """What a run of ``records`` in ``seconds`` cost the whole machine (``busy_seconds`` of
    :func:`machine_busy_seconds` over the same window): CPU microseconds per record, busy cores on average, and the
    CPU ceiling ``cpus * 1e6 / (us per record)`` (records/s with every core busy on this work alone)."""
    us = busy_seconds / max(1, records) * 1e6
    cpus = os.cpu_count() or 1
    return {"machine_cpu_us_per_record": us, "busy_cores": busy_seconds / seconds if seconds > 0 else 0.0,
            "cpu_ceiling_records_per_second": cpus * 1e6 / us if us > 0 else float("nan")}


MACHINE_FIGURES = ("machine_cpu_us_per_record", "busy_cores", "cpu_ceiling_records_per_second")


def _machine_note(run: dict[str, Any]) -> str:
    """``; the machine ...`` of a run's line: what it cost the whole machine, the broker included."""
    if not run.get("machine_cpu_us_per_record"):
        return ""
    return (f"; the whole machine (broker included): {run['machine_cpu_us_per_record']:.1f} CPU us/record, "
            f"{run['busy_cores']:.2f} cores busy, CPU ceiling {run['cpu_ceiling_records_per_second']:,.0f} records/s")


def _metered(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` with its CPU microseconds per record added (``cpu_us_per_record``) unless it measured them, and
    what it cost the machine (:func:`machine_figures`) when it measured ``machine_busy_seconds`` over its window."""
    c0 = cpu_seconds()
    out = fn()
    out.setdefault("cpu_us_per_record", (cpu_seconds() - c0) / max(1, out["records"]) * 1e6)
    if "machine_busy_seconds" in out:
        out.update(machine_figures(out["records"], out["seconds"], out["machine_busy_seconds"]))
    return out


ADULT_RECORDS = 32561
"""Records in ADULT (one pass of the replay)."""


def _replay(bs: str, topic: str, adult: str, *, rate: float = 0.0, loops: int = 1, partitions: int = 1,
            limit: int | None = None) -> None:
    cmd = [sys.executable, "-m", "replay_tools", "kafka", "--adult", adult, "--topic", topic,
           "--bootstrap-servers", bs, "--rate", str(rate), "--loop", str(loops), "--partitions", str(partitions),
           "--no-progress", *(["--limit", str(limit)] if limit is not None else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def passthrough(bs: str, topic: str, out_topic: str, n: int, *, max_records: int, commit_interval_s: float,
                linger_ms: int) -> dict[str, Any]:
    """kafka-python: consume -> json.loads -> json.dumps -> produce -> (flush, commit); seconds and records/s."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bs, group_id=f"pass-{uuid.uuid4().hex[:6]}",
                             enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
                             heartbeat_interval_ms=2000, max_poll_records=max_records)
    producer = KafkaProducer(bootstrap_servers=bs, acks="all", linger_ms=linger_ms, batch_size=262144)
    seen = 0
    t0: float | None = None
    m0 = 0.0
    last_commit = time.monotonic()
    positions: dict[TopicPartition, int] = {}
    try:
        while seen < n:
            batch = consumer.poll(timeout_ms=200, max_records=max_records)
            if batch and t0 is None:
                t0, m0 = time.perf_counter(), machine_busy_seconds()
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
                consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in positions.items()})
                last_commit = time.monotonic()
        producer.flush()
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in positions.items()})
        seconds = time.perf_counter() - (t0 or time.perf_counter())
        busy = machine_busy_seconds() - m0
    finally:
        consumer.close()
        producer.close()
    return {"records": seen, "seconds": seconds, "records_per_second": seen / seconds, "machine_busy_seconds": busy}


def passthrough_confluent(bs: str, topic: str, out_topic: str, n: int, *, max_records: int,
                          commit_interval_s: float, linger_ms: int) -> dict[str, Any]:
    """confluent-kafka: consume -> json.loads -> json.dumps -> produce -> (flush, commit); the same work as
    :func:`passthrough` (acks=all, idempotent producer as the service's)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bs, "group.id": f"passc-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "isolation.level": "read_uncommitted"})
    producer = confluent_kafka.Producer({"bootstrap.servers": bs, "acks": "all", "enable.idempotence": True,
                                         "linger.ms": linger_ms, "batch.size": 262144,
                                         "queue.buffering.max.messages": 1_000_000})
    consumer.subscribe([topic])
    seen = 0
    t0: float | None = None
    m0 = 0.0
    last_commit = time.monotonic()
    positions: dict[int, int] = {}
    produce, loads, dumps = producer.produce, json.loads, json.dumps

    def commit() -> None:
        producer.flush()
        if positions:
            consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, p, o) for p, o in positions.items()],
                            asynchronous=False)

    try:
        while seen < n:
            msgs = consumer.consume(max_records, 0)  # (with a timeout it waits for max_records messages)
            if not msgs:
                first = consumer.poll(0.2)
                msgs = [] if first is None else [first, *consumer.consume(max_records - 1, 0)]
            if msgs and t0 is None:
                t0, m0 = time.perf_counter(), machine_busy_seconds()
            for m in msgs:
                if m.error() is not None:
                    continue
                value = m.value()
                positions[m.partition()] = m.offset() + 1  # type: ignore[index,operator]
                if not value:
                    continue  # end-of-stream marker
                seen += 1
                while True:
                    try:
                        produce(out_topic, dumps(loads(value)).encode(), m.key(), m.partition())  # type: ignore[arg-type]
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
            if time.monotonic() - last_commit >= commit_interval_s:
                commit()
                last_commit = time.monotonic()
        commit()
        seconds = time.perf_counter() - (t0 or time.perf_counter())
        busy = machine_busy_seconds() - m0
    finally:
        consumer.close()
    return {"records": seen, "seconds": seconds, "records_per_second": seen / seconds, "machine_busy_seconds": busy}


def _config(bs: str, prefix: str, args: argparse.Namespace, input_topic: str | None = None,
            consumer_client: str | None = None) -> Config:
    extra = {}
    for item in args.set:
        key, _, raw = item.partition("=")
        extra[key.strip()] = raw
    if consumer_client is not None:
        extra["kafka.consumer_client"] = consumer_client
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
    """Run ``MainPath`` in a thread until ``n`` records are accounted for and committed (stopped on any way out).
    ``recovered_at``: the wall-clock time (s) when every partition of the input was recovered and owned (a
    partition recovers when its first record comes: the records consumed before wait for the ledger scan)."""
    main = MainPath(cfg, metrics=ServiceMetrics(CollectorRegistry()))
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    try:
        if not main.ready.wait(60):
            raise RuntimeError("main path did not start")
        if during is not None:
            if not main.assigned.wait(60):
                raise RuntimeError("main path got no partitions")
            during()
        t = main.totals
        deadline = time.monotonic() + timeout_s
        t0: float | None = None
        recovered_at: float | None = None
        cpu0 = (0.0, 0.0)
        m0 = 0.0
        while True:
            if t0 is None and t.consumed > 0:
                t0 = time.perf_counter()
                cpu0 = cpu_split()  # (the worker's start-up is not counted, nor the first batch: as the time)
                m0 = machine_busy_seconds()
            if recovered_at is None and len(main.states) >= cfg.topics.partitions:
                recovered_at = time.time()
            done = t.released + t.suppressed + t.dead_lettered
            if done >= n and main.states and all(p.buffered == 0 and main.committed.get(i) == p.next_offset
                                                 for i, p in main.states.items()):
                break
            if time.monotonic() > deadline or not th.is_alive():
                raise RuntimeError(f"main path did not finish: {t}")
            time.sleep(0.002)
        seconds = time.perf_counter() - (t0 or time.perf_counter())
        cpu1 = cpu_split()
        busy = machine_busy_seconds() - m0
    finally:
        main.stop_event.set()
        th.join(30)
    per = 1e6 / max(1, done)
    return {"records": done, "seconds": seconds, "records_per_second": done / seconds if seconds else 0.0,
            "cpu_us_per_record": (sum(cpu1) - sum(cpu0)) * per, "cpu_us_main_process": (cpu1[0] - cpu0[0]) * per,
            "cpu_us_workers": (cpu1[1] - cpu0[1]) * per, "machine_busy_seconds": busy,
            "released": t.released, "suppressed": t.suppressed, "gt_loss": t.gt_loss, "classes": t.classes,
            "recovered_at": recovered_at}


def engine_alone(args: argparse.Namespace, adult: str) -> dict[str, float]:
    """The engine of the main-path runs (same options) on ADULT without Kafka, decoding or ledger: records/s of
    wall and of CPU time, the ceiling of a main path with one partition (its pipeline runs in one process)."""
    cfg = _config("127.0.0.1:9", "engine", args)  # never connected to
    schema = load_schema(cfg)
    engine = make_engine_factory(cfg, schema)(0)
    warm_up()  # as the service's executors do at their start: numba's import and cache load are not timed
    records = [schema.validate(dict(r)) for r in iter_adult_records(adult)]
    for i, r in enumerate(records):
        r[schema.record_id or "id"] = i
    qis = [a.name for a in schema.qis]
    now = time.time()
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(0, len(records), args.max_records):
        chunk = records[s:s + args.max_records]
        rows = engine.encode_many({q: [r[q] for r in chunk] for q in qis})
        for j, r in enumerate(chunk):
            engine.push_encoded(r, rows[j], now)
    engine.flush(now)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"records": len(records), "records_per_second": len(records) / wall,
            "records_per_cpu_second": len(records) / cpu}


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def bench_broker(bs: str, name: str, args: argparse.Namespace, adult: str) -> dict[str, Any]:
    """Throughput (both passthroughs and the main path, ``args.repeat`` rounds) and latency on one broker."""
    results: dict[str, Any] = {"broker": name, "bootstrap_servers": bs}
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    cfg = _config(bs, prefix, args)
    n = 32561 * args.loops
    t = time.perf_counter()
    _replay(bs, cfg.topics.input, adult, loops=args.loops, partitions=args.partitions)
    p = KafkaProducer(bootstrap_servers=bs)
    send_flush_markers(p, cfg.topics.input, list(range(args.partitions)))
    p.close()
    print(f"[{name}] loaded {n:,} records (ADULT x {args.loops}) into {cfg.topics.input} in "
          f"{time.perf_counter() - t:.1f} s")
    runs = []
    pass_fns = {"kafka-python": passthrough, "confluent-kafka": passthrough_confluent}
    consumers = args.consumer_clients.split(",") if args.consumer_clients else [cfg.kafka.consumer_client]
    for rep in range(args.repeat):
        run: dict[str, Any] = {}
        for client in PASSTHROUGHS:
            out_topic = f"{prefix}.pass{rep}{client[0]}"
            ensure_topic(bs, out_topic, args.partitions)  # (a broker's auto-created topic may have fewer partitions)
            pt = _metered(functools.partial(
                pass_fns[client], bs, cfg.topics.input, out_topic, n,
                max_records=args.max_records, commit_interval_s=args.commit_interval_ms / 1000.0,
                linger_ms=args.linger_ms))
            run[f"passthrough_{client}"] = pt
            print(f"[{name} {rep + 1}/{args.repeat}] passthrough {client} (consume, JSON decode/encode, produce, "
                  f"commit): {pt['records']:,} records in {pt['seconds']:.2f} s = {pt['records_per_second']:,.0f} "
                  f"records/s, {pt['cpu_us_per_record']:.1f} CPU us/record{_machine_note(pt)}")
        for i, client in enumerate(consumers):
            rcfg = _config(bs, f"{prefix}r{rep}c{i}", args, input_topic=cfg.topics.input,
                           consumer_client=client)  # fresh group and outputs
            if not any(o.startswith("release.tick_seconds") for o in args.set):  # the run ends at the last commit,
                rcfg = rcfg.with_options({"release.tick_seconds": 0})  # which a release tick would only delay
            mp = _metered(functools.partial(main_path_run, rcfg, n))
            run["main_path" if i == 0 else f"main_path_{client}"] = mp
            ratios = {c: mp["records_per_second"] / run[f"passthrough_{c}"]["records_per_second"]
                      for c in PASSTHROUGHS}
            print(f"[{name} {rep + 1}/{args.repeat}] main path (k={args.k}, delta={args.delta}, beta={args.beta}, "
                  f"workers={rcfg.service.workers}, consumer {rcfg.kafka.consumer_client}, producer "
                  f"{rcfg.kafka.producer_client}): {mp['records']:,} records in {mp['seconds']:.2f} s = "
                  f"{mp['records_per_second']:,.0f} records/s, {mp['cpu_us_per_record']:.1f} CPU us/record "
                  f"(main process {mp['cpu_us_main_process']:.1f}, pipeline workers {mp['cpu_us_workers']:.1f})"
                  f"{_machine_note(mp)} "
                  f"(released {mp['released']:,}, suppressed "
                  f"{mp['suppressed']:,}, GT loss {mp['gt_loss']:.4f}); / passthrough "
                  + ", ".join(f"{c} {r:.2f}" for c, r in ratios.items()))
        runs.append(run)
    keys = ("main_path", *(f"passthrough_{c}" for c in PASSTHROUGHS))
    rates = {key: _median([r[key]["records_per_second"] for r in runs]) for key in keys}
    cpu = {key: _median([r[key]["cpu_us_per_record"] for r in runs]) for key in keys}
    ratios = {c: _median([r["main_path"]["records_per_second"] / r[f"passthrough_{c}"]["records_per_second"]
                          for r in runs]) for c in PASSTHROUGHS}
    machine = {key: {m: _median([r[key][m] for r in runs]) for m in MACHINE_FIGURES} for key in keys}
    for client in consumers[1:]:
        rates[f"main_path_{client}"] = _median([r[f"main_path_{client}"]["records_per_second"] for r in runs])
        print(f"[{name}] main path with consumer {client}: median {rates[f'main_path_{client}']:,.0f} records/s")
    print(f"[{name}] median over {len(runs)} rounds: passthrough kafka-python {rates['passthrough_kafka-python']:,.0f}"
          f", confluent-kafka {rates['passthrough_confluent-kafka']:,.0f}, main path {rates['main_path']:,.0f} "
          f"records/s; main path / passthrough: kafka-python {ratios['kafka-python']:.2f}, confluent-kafka "
          f"{ratios['confluent-kafka']:.2f}; CPU us/record (this process and the pipeline worker, not the broker): "
          + ", ".join(f"{k.removeprefix('passthrough_')} {v:.1f}" for k, v in cpu.items()))
    results.update(runs=runs, rates=rates, ratios=ratios, cpu_us_per_record=cpu, machine=machine, consumer_client=cfg.kafka.consumer_client,
                   producer_client=cfg.kafka.producer_client, workers=cfg.service.workers)
    if not args.skip_latency:
        ticks = latency_ticks(cfg, args)
        results["latency"] = latency_run(bs, name, args, adult, rate=0.5 * rates["main_path"], tick_seconds=ticks[0])
        if len(ticks) > 1:
            results["latency_default_tick"] = latency_run(bs, name, args, adult, rate=0.5 * rates["main_path"],
                                                          tick_seconds=ticks[1])
    return results


def latency_ticks(cfg: Config, args: argparse.Namespace) -> list[float]:
    """The ``release.tick_seconds`` of the latency runs: 0 (the path's own latency, as in the throughput runs) and
    then the configured tick (5 s by default: class messages wait for the end of their tick, a defence against the
    release-timing attack, docs/threat-model.md); only the one given with ``--set release.tick_seconds=...``."""
    if any(o.startswith("release.tick_seconds") for o in args.set):
        return [cfg.release.tick_seconds]
    return [0.0] if cfg.release.tick_seconds == 0 else [0.0, cfg.release.tick_seconds]


def latency_records(rate: float, seconds: float) -> tuple[int, int | None, int]:
    """What a latency run of ``seconds`` at ``rate`` replays: (passes over ADULT, records per pass or None for whole
    passes, records in all).  The first records of ADULT when that is fewer than a pass, else whole passes (until
    2026-11-28 always at least a whole pass: the test's 1 s runs sent 32,561 records for 9 s each)."""
    wanted = max(1, int(np.ceil(rate * seconds)))
    loops = max(1, int(np.ceil(wanted / ADULT_RECORDS)))
    if loops == 1:
        return 1, wanted, wanted
    return loops, None, ADULT_RECORDS * loops


def latency_run(bs: str, name: str, args: argparse.Namespace, adult: str, *, rate: float,
                tick_seconds: float) -> dict[str, Any]:
    """Ingest-to-release and ingest-to-publish latency of the main path while a replay process sends ADULT at
    ``rate``, class messages leaving at the end of ``tick_seconds`` ticks: over the records sent after the partitions'
    recovery (the steady state) and over all (``*_all``)."""
    lat_prefix = f"bench{uuid.uuid4().hex[:6]}lat"
    lcfg = _config(bs, lat_prefix, args).with_options({"release.tick_seconds": tick_seconds})
    loops, limit, n_lat = latency_records(rate, args.latency_seconds)

    def replay_at_rate() -> None:
        def go() -> None:
            _replay(bs, lcfg.topics.input, adult, rate=rate, loops=loops, partitions=args.partitions, limit=limit)
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
    ingest_ms = {(m.partition, m.offset): m.timestamp for m in read_topic_with_headers(bs, lt.input)}
    ingested = np.array([ingest_ms[(p, o)] for p, o in zip(regular.src_partition, regular.src_offset, strict=True)],
                        dtype=float)
    # the steady state: records sent after every partition was recovered (a partition recovers when its first
    # record comes; what is consumed meanwhile waits for the ledger scan: reported apart, as "all")
    steady = ingested >= (lr["recovered_at"] or 0.0) * 1000.0
    reg_lat = regular["latency_s"].to_numpy(dtype=float)
    published = (regular["published_ms"].to_numpy(dtype=float) - ingested) / 1000.0

    def pct(xs: np.ndarray, q: float) -> float:
        xs = xs[~np.isnan(xs)]
        return float(np.percentile(xs, q)) if len(xs) else float("nan")

    latency = {"rate": rate, "records": n_lat, "steady_records": int(steady.sum()),
               "p50": pct(reg_lat[steady], 50), "p99": pct(reg_lat[steady], 99), "max": pct(reg_lat[steady], 100),
               "publish_p50": pct(published[steady], 50), "publish_p99": pct(published[steady], 99),
               "publish_max": pct(published[steady], 100),
               "p50_all": pct(lat, 50), "p99_all": pct(lat, 99),
               "publish_p50_all": pct(published, 50), "publish_p99_all": pct(published, 99),
               "expected_delay_s": args.delta / rate, "throughput": lr["records_per_second"],
               "tick_seconds": tick_seconds}
    print(f"[{name}] latency with release ticks of {tick_seconds:g} s at {rate:,.0f} records/s (50% of max, "
          f"{n_lat:,} records, main path throughput {lr['records_per_second']:,.0f}/s), the {latency['steady_records']:,} "
          f"records sent after the partitions' recovery: ingest-to-release p50 {latency['p50'] * 1000:.0f} ms, "
          f"p99 {latency['p99'] * 1000:.0f} ms, max {latency['max'] * 1000:.0f} ms; ingest-to-publish "
          f"p50 {latency['publish_p50'] * 1000:.0f} ms, p99 {latency['publish_p99'] * 1000:.0f} ms, max "
          f"{latency['publish_max'] * 1000:.0f} ms (delta/rate = {latency['expected_delay_s'] * 1000:.0f} ms "
          f"is the delay bound in time); all records, those that waited for the start's recovery too: "
          f"ingest-to-publish p50 {latency['publish_p50_all'] * 1000:.0f} ms, p99 "
          f"{latency['publish_p99_all'] * 1000:.0f} ms")
    return latency


def summary_table(all_results: list[dict[str, Any]]) -> str:
    """One row per broker: both passthroughs, the main path, the ratios, ingest-to-publish p50/p99 at half the
    maximum rate with release ticks of 0 and of the configured length (markdown)."""
    lines = ["| broker | passthrough kafka-python | passthrough confluent-kafka | main path | main / kafka-python | "
             "main / confluent-kafka | at 50 % rate | ingest-to-publish p50 / p99, ticks 0 | same, configured ticks |",
             "|---|---|---|---|---|---|---|---|---|"]
    cpu_lines = ["", "CPU us per record (this process and its pipeline worker; the broker not counted):", "",
                 "| broker | passthrough kafka-python | passthrough confluent-kafka | main path |", "|---|---|---|---|"]

    def cell(lat: dict[str, Any] | None) -> str:
        if not lat:
            return "-"
        return (f"{lat['publish_p50'] * 1000:,.0f} / {lat['publish_p99'] * 1000:,.0f} ms "
                f"(ticks {lat['tick_seconds']:g} s)")

    def rate_cell(lat: dict[str, Any] | None) -> str:
        return f"{lat['rate']:,.0f}/s" if lat else "-"

    for r in all_results:
        rates, ratios, lat = r["rates"], r["ratios"], r.get("latency")
        lines.append(f"| {r['broker']} | {rates['passthrough_kafka-python']:,.0f} | "
                     f"{rates['passthrough_confluent-kafka']:,.0f} | {rates['main_path']:,.0f} | "
                     f"{ratios['kafka-python']:.2f} | {ratios['confluent-kafka']:.2f} | "
                     f"{rate_cell(lat)} | {cell(lat)} | "
                     f"{cell(r.get('latency_default_tick'))} |")
        cpu = r["cpu_us_per_record"]
        cpu_lines.append(f"| {r['broker']} | {cpu['passthrough_kafka-python']:.1f} | "
                         f"{cpu['passthrough_confluent-kafka']:.1f} | {cpu['main_path']:.1f} |")
    return "\n".join(lines + cpu_lines + machine_table(all_results))


def machine_table(all_results: list[dict[str, Any]]) -> list[str]:
    """Lines of the table of what each run cost the whole machine, the broker included (:func:`machine_figures`),
    beside the CPU per record the issue's goal for the main path allows: at most ``cpus * 1e6 / rate`` us for a rate
    of 33,000 records/s and for 0.8 of the confluent-kafka passthrough's rate (both with every core busy on it)."""
    cpus = os.cpu_count() or 1
    out = ["", f"What each run cost the whole machine ({cpus} CPUs; the broker included): CPU us per record, cores "
           "busy, CPU ceiling = CPUs x 1e6 / (us per record); last columns: the most CPU per record the main path may "
           "take for 33,000 records/s and for 0.8 of the confluent-kafka passthrough:", "",
           "| broker | passthrough kafka-python | passthrough confluent-kafka | main path | budget at 33,000/s | "
           "budget at 0.8 x confluent |", "|---|---|---|---|---|---|"]

    def cell(m: dict[str, float]) -> str:
        return (f"{m['machine_cpu_us_per_record']:.1f} us, {m['busy_cores']:.2f} cores, "
                f"ceiling {m['cpu_ceiling_records_per_second']:,.0f}/s")

    for r in all_results:
        m = r.get("machine") or {}
        if not all(m.get(k, {}).get("machine_cpu_us_per_record") for k in ("main_path", *(
                f"passthrough_{c}" for c in PASSTHROUGHS))):
            continue  # no /proc/stat here
        goal = 0.8 * r["rates"]["passthrough_confluent-kafka"]
        out.append(f"| {r['broker']} | {cell(m['passthrough_kafka-python'])} | "
                   f"{cell(m['passthrough_confluent-kafka'])} | {cell(m['main_path'])} | "
                   f"{cpus * 1e6 / 33000:.1f} us | {cpus * 1e6 / goal:.1f} us |")
    return out if len(out) > 5 else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stream-anon bench service", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", action="append", default=[],
                    help="a broker to measure (repeat for several); default: the embedded Tansu broker; one unreachable within "
                         "--connect-timeout: one line, exit 3")
    ap.add_argument("--embedded", action="store_true", help="also measure the embedded Tansu broker")
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
    ap.add_argument("--repeat", type=int, default=3, help="rounds of passthroughs + main path (median reported)")
    ap.add_argument("--latency-seconds", type=float, default=10.0,
                    help="length of each 50%%-rate latency run: that many seconds of records at that rate (the first "
                         "records of ADULT when fewer than a pass, else whole passes)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--consumer-clients", default=None, metavar="CLIENT[,CLIENT]",
                    help="main path once per consumer client each round (e.g. confluent-kafka,kafka-python; the "
                         "first is the one in the table); default: kafka.consumer_client")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="service option for the main-path runs (e.g. service.workers=0)")
    ap.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="with --bootstrap-servers: give up (exit 3, one line naming the address) when no broker "
                         "accepts a connection within this time (default 30)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    quiet_client_libraries()  # the client libraries' own lines only at DEBUG
    for bs in args.bootstrap_servers:
        problem = broker_problem("stream-anon bench service", bs, args.connect_timeout)  # malformed 2, unreachable 3
        if problem:
            return problem
    try:
        adult = str(resolve_adult_path(args.adult))
    except DatasetError as e:
        print(f"stream-anon bench service: {e}", file=sys.stderr)
        return 2
    targets: list[tuple[str, str | None]] = [(f"kafka {bs}", bs) for bs in args.bootstrap_servers]
    if args.embedded or not targets:
        targets.insert(0, ("tansu (embedded)", None))
    all_results: list[dict[str, Any]] = []
    for name, bs in targets:
        broker = EmbeddedBroker().start() if bs is None else None
        try:
            all_results.append(bench_broker(bs or broker.bootstrap_servers, name, args, adult))  # type: ignore[union-attr]
        finally:
            if broker is not None:
                broker.stop()
    engine = engine_alone(args, adult)
    meta = {"k": args.k, "delta": args.delta, "beta": args.beta, "mu": args.mu, "partitions": args.partitions,
            "loops": args.loops, "repeat": args.repeat, "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "engine_alone": engine}
    print(f"\nstream-anon bench service: ADULT x {args.loops} ({32561 * args.loops:,} records), {args.partitions} "
          f"partition(s), k={args.k}, delta={args.delta}, beta={args.beta}; medians of {args.repeat} rounds; load "
          f"average now {meta['load_average'][0]:.1f} on {meta['cpus']} CPUs")
    print(f"engine alone (the same options, all of ADULT, no Kafka, no decoding, no ledger: a one-partition main "
          f"path's ceiling): {engine['records_per_second']:,.0f} records/s, {engine['records_per_cpu_second']:,.0f} "
          f"records per CPU second")
    print(summary_table(all_results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "brokers": all_results}, f, indent=2)
    return 0
