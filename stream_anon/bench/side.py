"""``stream-anon bench side``: the LDP side paths on ADULT, pure and through a real broker.

``stream-anon bench side [--adult PATH] [--bootstrap-servers HOST:PORT] [--transports confluent-kafka,kafka-python]``
(an embedded Tansu broker when no bootstrap servers are given).  Prints:

* **pure**: :class:`~stream_anon.side.processor.SidePathProcessor` over all of ADULT in batches (records/s,
  messages/s and CPU microseconds per record; best of ``--repeat``) for the default (ChaCha20 noise, keyed
  pseudonyms) and, for their cost, with numpy's PCG64 instead of ChaCha20 and without pseudonyms (copies
  shuffled instead); then the estimate-error table of the final estimates (truth tracker on);
* **accuracy** of the defaults against the defaults before issue 19 (12 per record): per attribute, the total
  variation distance of the recovered distribution (0.5 x sum |f_hat - f| over the categories, raw unbiased
  estimates) or the absolute error of the mean, averaged over ``--accuracy-seeds`` seeded runs on all of ADULT;
* **raw send floor** per producer transport (and per ``--linger-ms`` / ``--batch-size`` / ``--partitions``):
  one :class:`~stream_anon.kafka_io.producer.OutputProducer` sending a real pre-encoded ``adult.krr`` copy 3 x 32,561
  times (distinct keys, header ``kind``) until all are acknowledged (``acks=all``, idempotent); messages/s and the
  equivalent records/s at 3 copies per record;
* **end to end** per transport: all ADULT records produced to a fresh input topic (+ end-of-stream controls), then
  the side app (its own consumer group, in a thread of this process): records/s from the first consumed record
  until every copy and the 7 k-means windows are acknowledged, and the CPU time of this process per record (the
  side app's thread and the producer client's threads; the embedded broker is another process).

Noise is seeded (a reproducible ChaCha20 stream) in the pure part only; the side app draws from OS entropy.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from stream_anon.bench import broker_problem
from stream_anon.config.settings import Config
from stream_anon.config.side_paths import (
    BLapConfig,
    KMeansConfig,
    KRRConfig,
    PersonBudgetConfig,
    RSConfig,
    SidePathConfig,
)
from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.formats.release import Pseudonymizer
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.kafka_io.producer import open_producer
from stream_anon.kafka_io.settings import PRODUCER_CLIENTS
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.replay.kafka_replay import ensure_topic
from stream_anon.side.app import SideStatus, run_side_paths
from stream_anon.side.processor import SidePathProcessor

KRR_COPY = (b'{"id":"3f0b5c2e9d41a8f7c6e5d4b3a2918070","mechanism":"krr","values":{"sex":"Male","race":"White",'
            b'"marital-status":"Separated","relationship":"Unmarried","workclass":"Never-worked"},"epsilon":{"sex":'
            b'1.000000000000909,"race":1.0000000000009095,"marital-status":1.0000000000009093,"relationship":'
            b'1.0000000000009095,"workclass":1.0000000000009093},"epsilon_total":5.000000000004547,'
            b'"epsilon_all_side_topics":12.000000000005961}')
"""A side copy as the side app publishes it at the defaults (pseudonym key and id, exact eps)."""
BENCH_SECRET = b"stream-anon-bench-secret-not-for-production"


# ============================================================================================ pure
def benchmark(records: Sequence[Mapping[str, Any]], *, batch_size: int = 2000, config: SidePathConfig | None = None,
              seed: int = 0, repeat: int = 1, generator: str = "chacha", label: str = "default") -> dict[str, float]:
    """Time ``process_batch_encoded`` over ``records`` in batches (best of ``repeat``, wall and CPU time); prints
    and returns records/s, messages/s and CPU microseconds per record.  ``generator``: ``chacha`` (the seeded
    ChaCha20 stream) or ``pcg64`` (numpy's default bit generator, for the cost of ChaCha20 only)."""
    cfg = config or SidePathConfig(estimates_every=5000)
    best = best_cpu = math.inf
    n_out = 0
    for _ in range(max(1, repeat)):
        rng = np.random.Generator(np.random.PCG64(seed)) if generator == "pcg64" else seed
        proc = SidePathProcessor(cfg, rng=rng, pseudonymize=Pseudonymizer(BENCH_SECRET))
        c0, t0 = time.process_time(), time.perf_counter()
        n_out = 0
        for i in range(0, len(records), batch_size):
            b = proc.process_batch_encoded(records[i:i + batch_size])
            n_out += sum(len(c) for c in b.copies) + len(b.outputs)
        n_out += len(proc.flush())
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    n = len(records)
    res = {"records": float(n), "seconds": best, "records_per_s": n / best, "messages_per_s": n_out / best,
           "cpu_us_per_record": 1e6 * best_cpu / n, "batch_size": float(batch_size)}
    print(f"side paths (pure, {label}): {n} records in {best:.3f} s = {res['records_per_s']:,.0f} records/s, "
          f"{res['messages_per_s']:,.0f} messages/s, {res['cpu_us_per_record']:.2f} CPU us/record (batch "
          f"{batch_size}, best of {max(1, repeat)})")
    return res


def benchmark_variants(records: Sequence[Mapping[str, Any]], *, batch_size: int = 2000, seed: int = 0,
                       repeat: int = 1) -> dict[str, dict[str, float]]:
    """The pure benchmark for the default and for the two things it pays for: ChaCha20 (vs PCG64) and the
    pseudonyms (vs none, copies shuffled)."""
    base = SidePathConfig(estimates_every=5000)
    return {
        "default": benchmark(records, batch_size=batch_size, config=base, seed=seed, repeat=repeat),
        "pcg64": benchmark(records, batch_size=batch_size, config=base, seed=seed, repeat=repeat, generator="pcg64",
                           label="PCG64 instead of ChaCha20"),
        "no-pseudonyms": benchmark(records, batch_size=batch_size, config=dataclasses.replace(base, pseudonyms=False),
                                   seed=seed, repeat=repeat, label="no pseudonyms, copies shuffled"),
    }


def estimate_error_table(records: Sequence[Mapping[str, Any]], *, config: SidePathConfig | None = None,
                         seed: int = 0, batch_size: int = 2000) -> list[dict[str, Any]]:
    """Run the side paths over ``records`` with the truth tracker and return, per (mechanism, attribute), the final
    estimate's n, eps, standard error and actual error (mean |f_hat - f| over categories, or |mean_hat - mean|)."""
    base = config or SidePathConfig()
    cfg = dataclasses.replace(base, truth=True, estimates_every=0, estimates_every_seconds=None,
                              kmeans=dataclasses.replace(base.kmeans, enabled=False))
    proc = SidePathProcessor(cfg, rng=seed, pseudonymize=Pseudonymizer(BENCH_SECRET))
    for i in range(0, len(records), batch_size):
        proc.process_batch(records[i:i + batch_size])
    rows = []
    for _t, _k, m in proc.emit_estimates():
        truth = m.get("truth", {})
        rows.append({"mechanism": m["mechanism"], "attribute": m["attribute"], "n": m["n"], "epsilon": m["epsilon"],
                     "categories": len(m["categories"]) if "categories" in m else None,
                     "standard_error": m["standard_error"], "abs_error": truth.get("abs_error"),
                     "max_abs_error": truth.get("max_abs_error", truth.get("abs_error")),
                     "max_z": truth.get("max_z", truth.get("z"))})
    return rows


def print_error_table(rows: Sequence[Mapping[str, Any]], n: int, seed: int) -> None:
    print(f"\nestimates on all of ADULT (n = {n}, seed {seed}): frequency rows give the mean / max absolute error of "
          f"the estimated frequencies over the categories and the largest frequency SE; mean rows give "
          f"|mean_hat - mean| and the SE of the mean; max |z| = largest |estimate - truth| / SE\n")
    print("| mechanism | attribute | eps | SE | abs error | max abs error | max abs z |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['attribute']} | {r['epsilon']:.3g} | {r['standard_error']:.4f} | "
              f"{r['abs_error']:.4f} | {r['max_abs_error']:.4f} | {r['max_z']:.2f} |")


BEFORE_ISSUE_19 = SidePathConfig(
    krr=KRRConfig(attributes=["sex", "race", "marital-status", "relationship", "workclass"], epsilon=1.0),
    rs=RSConfig(epsilon=1.0), blap=BLapConfig(attributes=["age", "hours-per-week", "education-num"], epsilon=1.0),
    kmeans=KMeansConfig(epsilon=1.0), person_budget=PersonBudgetConfig(cap_epsilon=None))
"""The side-path defaults before issue 19: eps 1 per attribute on 11 attributes, k-means 1: 12 per record, no cap."""


def accuracy_comparison(records: Sequence[Mapping[str, Any]], configs: Mapping[str, SidePathConfig], *,
                        seeds: int = 10, batch_size: int = 2000) -> list[dict[str, Any]]:
    """Per (mechanism, attribute) and configuration: the eps, and the mean over ``seeds`` runs of the total variation
    of the recovered distribution (frequency estimates) or of |mean_hat - mean| (means), with its SD over runs."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, cfg in configs.items():
        for seed in range(seeds):
            for r in estimate_error_table(records, config=cfg, seed=seed, batch_size=batch_size):
                row = rows.setdefault((r["mechanism"], r["attribute"]), {"mechanism": r["mechanism"],
                                                                         "attribute": r["attribute"]})
                # abs_error: mean |f_hat - f| over the k categories, so TV = k * abs_error / 2; a mean: |error|
                k = r.get("categories")
                err = r["abs_error"] * k / 2 if k else r["abs_error"]
                row.setdefault(name, {"epsilon": r["epsilon"], "errors": []})["errors"].append(err)
    out = []
    for row in rows.values():
        for name in configs:
            if name in row:
                errs = row[name].pop("errors")
                row[name].update(error=statistics.fmean(errs), sd=statistics.stdev(errs) if len(errs) > 1 else 0.0)
        out.append(row)
    return out


def print_accuracy(rows: Sequence[Mapping[str, Any]], configs: Mapping[str, SidePathConfig], seeds: int) -> None:
    totals = {name: cfg.check().epsilon_all for name, cfg in configs.items()}
    print(f"\naccuracy on all of ADULT, mean over {seeds} seeds (TV: total variation of the recovered distribution; "
          f"mean: |mean_hat - mean|); per-record total: " + ", ".join(f"{n} {e:.4g}" for n, e in totals.items()))
    print("\n| mechanism | attribute | measure | " + " | ".join(f"{n}: eps | {n}: error" for n in configs) + " |")
    print("|---|---|---|" + "---:|---:|" * len(configs))
    for r in rows:
        measure = "TV" if r["mechanism"] != "blap" else "mean"
        cells = []
        for n in configs:
            c = r.get(n)
            cells.append(f"{c['epsilon']:.3g} | {c['error']:.4f} (sd {c['sd']:.4f})" if c else "- | not published")
        print(f"| {r['mechanism']} | {r['attribute']} | {measure} | " + " | ".join(cells) + " |")


# ============================================================================================ through a broker
def bench_config(bootstrap: str, tag: str, side: SidePathConfig, **kafka: Any) -> Config:
    """A config whose topics and groups are all new (``<tag>.input`` ...)."""
    options: dict[str, Any] = {"kafka.bootstrap_servers": bootstrap, "kafka.group_id": f"g-{tag}",
                               "kafka.session_timeout_ms": 6000, "kafka.heartbeat_interval_ms": 1000,
                               **{f"kafka.{k}": v for k, v in kafka.items()}}
    for name in ("input", "anon", "krr", "rs", "blap", "estimates", "kmeans", "dlq", "suppressed"):
        options[f"topics.{name}"] = f"{tag}.{name}"
    cfg = Config.load(env={}, overrides=options)
    return dataclasses.replace(cfg, side_paths=side)


def raw_send_floor(bootstrap: str, n_messages: int, *, transport: str, linger_ms: int = 20,
                   batch_size: int = 262144, partitions: int = 1) -> dict[str, float]:
    """Messages/s of one :class:`OutputProducer` sending one pre-encoded side copy ``n_messages`` times (distinct
    keys, in chunks of 2,000 per partition as the side app does) until all are acknowledged."""
    tag = "raw" + uuid.uuid4().hex[:6]
    cfg = bench_config(bootstrap, tag, SidePathConfig(), producer_client=transport, linger_ms=linger_ms,
                       batch_size=batch_size)
    topic = cfg.topics.krr
    ensure_topic(bootstrap, topic, partitions)
    keys: list[bytes | None] = [f"adult-{i:05d}".encode() for i in range(n_messages)]
    values = [KRR_COPY] * n_messages
    headers = [("kind", b"krr")]
    producer = open_producer(cfg.kafka, label="side")
    try:
        for p in range(partitions):
            producer.partition_for(topic, p)  # topic metadata before the clock starts
        t0 = time.perf_counter()
        for j, i in enumerate(range(0, n_messages, 2000)):
            producer.send_values(topic, j % partitions, keys[i:i + 2000], values[i:i + 2000], headers)
        acked = producer.flush()
        seconds = time.perf_counter() - t0
    finally:
        producer.close()
    assert acked == n_messages, (acked, n_messages)
    rate = n_messages / seconds
    print(f"raw send floor ({transport}, linger_ms={linger_ms}, batch_size={batch_size}, partitions={partitions}): "
          f"{n_messages} messages in {seconds:.2f} s = {rate:,.0f} messages/s = {rate / 3:,.0f} records/s at 3 copies "
          f"per record")
    return {"messages": float(n_messages), "seconds": seconds, "messages_per_s": rate, "records_per_s": rate / 3,
            "linger_ms": float(linger_ms), "batch_size": float(batch_size), "partitions": float(partitions)}


def side_app_throughput(bootstrap: str, records: Sequence[Mapping[str, Any]], *, transport: str,
                        partitions: int = 1, timeout_s: float = 300.0) -> dict[str, float]:
    """All ``records`` through the side app (truth tracker on, estimates every 5000 records, k-means windows of
    5000): records/s from the first consumed record until every copy and k-means window is acknowledged."""
    tag = "sk" + uuid.uuid4().hex[:6]
    side = SidePathConfig(truth=True, estimates_every_seconds=None)
    cfg = bench_config(bootstrap, tag, side, producer_client=transport)
    ensure_topic(bootstrap, cfg.topics.input, partitions)
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for r in records:
        p.send(cfg.topics.input, key=str(r["id"]).encode(), value=json.dumps(r).encode())
    parts = sorted(p.partitions_for(cfg.topics.input))
    for part in parts:
        p.send(cfg.topics.input, value=b"", partition=part, headers=[(CONTROL_HEADER, CONTROL_FLUSH)])
    p.flush()
    p.close()
    status = SideStatus()
    stop = threading.Event()
    th = threading.Thread(target=run_side_paths, args=(cfg, ServiceMetrics(CollectorRegistry()), stop),
                          kwargs={"status": status}, daemon=True)
    th.start()
    n = len(records)
    k: KMeansConfig = side.kmeans
    windows = n // k.window + (1 if n % k.window >= k.min_partial_window else 0)
    deadline = time.monotonic() + timeout_s
    try:
        while status.consumed == 0:
            if status.error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"side app did not start: {status.error}")
            time.sleep(0.005)
        t0, c0 = time.perf_counter(), time.process_time()
        while any(status.published.get(t, 0) < n for t in (cfg.topics.krr, cfg.topics.rs, cfg.topics.blap)) \
                or status.control < len(parts) or status.published.get(cfg.topics.kmeans, 0) < windows:
            if status.error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"side app: {status.error or 'timeout'}; published {status.published}")
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        stop.set()
        th.join(30)
    rate = n / seconds
    print(f"side app end to end ({transport}, {partitions} partition(s)): {n} records -> {3 * n} copies + "
          f"{status.published.get(cfg.topics.estimates, 0)} estimates + {status.published.get(cfg.topics.kmeans, 0)} "
          f"k-means windows in {seconds:.2f} s = {rate:,.0f} records/s ({3 * rate:,.0f} copies/s), "
          f"{1e6 * cpu / n:.1f} CPU us/record in this process")
    return {"records": float(n), "seconds": seconds, "records_per_s": rate, "partitions": float(partitions),
            "cpu_us_per_record": 1e6 * cpu / n}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stream-anon bench side", description=__doc__.split("\n\n")[0])
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--bootstrap-servers", default=None,
                    help="a running broker, HOST:PORT (default: embedded Tansu); unreachable within --connect-timeout: "
                         "one line, exit 3")
    ap.add_argument("--seed", type=int, default=0, help="seed of the pure benchmark and the error table")
    ap.add_argument("--batch", type=int, default=2000, help="records per batch of the pure benchmark")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (pure: best; broker: median)")
    ap.add_argument("--transports", default=",".join(PRODUCER_CLIENTS), help="producer clients to measure")
    ap.add_argument("--linger-ms", type=_ints, default=[20], help="raw floor: kafka.linger_ms values (e.g. 20,100)")
    ap.add_argument("--batch-size", type=_ints, default=[262144], help="raw floor: kafka.batch_size values")
    ap.add_argument("--partitions", type=_ints, default=[1], help="raw floor and end to end: partition counts")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: pure, accuracy, raw, e2e")
    ap.add_argument("--accuracy-seeds", type=int, default=10, help="seeded runs per configuration (accuracy)")
    ap.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="with --bootstrap-servers: give up (exit 3, one line naming the address) when no broker "
                         "accepts a connection within this time (default 30)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    problem = broker_problem("stream-anon bench side", args.bootstrap_servers, args.connect_timeout)  # malformed 2, unreachable 3
    if problem:
        return problem
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    for t in transports:
        if t not in PRODUCER_CLIENTS:
            ap.error(f"--transports: expected names from {list(PRODUCER_CLIENTS)}, got {t!r}")
    records = list(iter_records(read_adult(args.adult)))
    results: dict[str, Any] = {"records": len(records)}
    if "pure" not in skip:
        results["pure"] = benchmark_variants(records, batch_size=args.batch, seed=args.seed, repeat=args.repeat)
        rows = estimate_error_table(records, seed=args.seed, batch_size=args.batch)
        print_error_table(rows, len(records), args.seed)
        results["estimates"] = rows
    if "accuracy" not in skip:
        configs = {"before (12)": BEFORE_ISSUE_19, "default": SidePathConfig()}
        acc = accuracy_comparison(records, configs, seeds=args.accuracy_seeds, batch_size=args.batch)
        print_accuracy(acc, configs, args.accuracy_seeds)
        results["accuracy"] = acc

    def run(bootstrap: str) -> None:
        if "raw" not in skip:
            results["raw"] = []
            for t, linger, size, parts in itertools.product(transports, args.linger_ms, args.batch_size,
                                                            args.partitions):
                runs = [raw_send_floor(bootstrap, 3 * len(records), transport=t, linger_ms=linger, batch_size=size,
                                       partitions=parts) for _ in range(max(1, args.repeat))]
                med = statistics.median(r["messages_per_s"] for r in runs)
                print(f"  median over {len(runs)}: {med:,.0f} messages/s")
                results["raw"].append({"transport": t, "linger_ms": linger, "batch_size": size, "partitions": parts,
                                       "messages_per_s": [r["messages_per_s"] for r in runs], "median": med})
        if "e2e" not in skip:
            results["e2e"] = []
            for t, parts in itertools.product(transports, args.partitions):
                runs = [side_app_throughput(bootstrap, records, transport=t, partitions=parts)
                        for _ in range(max(1, args.repeat))]
                med = statistics.median(r["records_per_s"] for r in runs)
                cpu = statistics.median(r["cpu_us_per_record"] for r in runs)
                print(f"  median over {len(runs)}: {med:,.0f} records/s, {cpu:.1f} CPU us/record")
                results["e2e"].append({"transport": t, "partitions": parts,
                                       "records_per_s": [r["records_per_s"] for r in runs], "median": med,
                                       "cpu_us_per_record": [r["cpu_us_per_record"] for r in runs]})

    if not skip >= {"raw", "e2e"}:
        if args.bootstrap_servers:
            run(args.bootstrap_servers)
        else:
            with EmbeddedBroker() as broker:
                run(broker.bootstrap_servers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
