"""What scaling out does to information loss: the engine run once per input partition, as the service does.

The service keeps one engine per input partition (state moves with the partition on a rebalance), so with P
partitions each engine sees only the records Kafka's default partitioner puts there: murmur2(key) mod P, key =
record id (what ``replay_tools`` sends).  The delay bound delta counts arrivals *of that partition*.

``python -m stream_anon.report.scaleout [--records N] [--partitions 1,2,4,8] [--k 10] [--delta 1000]`` prints,
for each P: the GT loss of the union of the P released tables (a) with the same delta per partition and (b)
with delta / P per partition (the same total buffer, i.e. the same wall-clock delay at a fixed input rate),
plus suppression and the engine's records/s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_anon.core.schema import Schema, adult_schema


def kafka_partition(key: str, partitions: int) -> int:
    """Kafka's default partitioner for a keyed message (Java client and kafka-python): murmur2 of the key bytes."""
    from kafka.partitioner.default import murmur2

    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions


def run_partitioned(records: Sequence[dict[str, Any]], schema: Schema, *, partitions: int, k: int, delta: int,
                    beta: int = 50, mu: int = 100, seed: int = 0) -> dict[str, Any]:
    """One engine per partition over ``records`` split by record id; loss of the union of the releases."""
    from stream_anon.core.engine import Engine, EngineConfig
    from stream_anon.core.loss import summarize_releases

    rid = schema.record_id or "id"
    parts = np.array([kafka_partition(str(r[rid]), partitions) for r in records])
    releases: list[Any] = []
    t0 = time.perf_counter()
    for p in range(partitions):
        engine = Engine(schema, EngineConfig(k=k, delta=delta, beta=beta, mu=mu, seed=seed + p))
        for i in np.flatnonzero(parts == p):
            out = engine.push(records[int(i)])
            # class ids are per engine: make them unique across partitions, as the service's are
            releases.extend(out if partitions == 1 else [_tag(r, p) for r in out])
        releases.extend(engine.flush() if partitions == 1 else [_tag(r, p) for r in engine.flush()])
    seconds = time.perf_counter() - t0
    s = summarize_releases(releases, schema, k)
    total = s.records_released + s.records_suppressed
    return {"partitions": partitions, "k": k, "delta_per_partition": delta, "gt_loss": float(s.gt_loss),
            "suppressed_fraction": s.records_suppressed / total if total else 0.0, "classes": s.classes,
            "records_per_second": len(records) / seconds if seconds > 0 else float("inf")}


def _tag(release: Any, partition: int) -> Any:
    from dataclasses import replace

    return replace(release, class_id=f"p{partition}-{release.class_id}")


def main(argv: Sequence[str] | None = None) -> int:
    from stream_anon.core.datasets import iter_records, read_adult

    ap = argparse.ArgumentParser(prog="python -m stream_anon.report.scaleout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--records", type=int, default=32561, help="first N ADULT records (default: all)")
    ap.add_argument("--partitions", default="1,2,4,8", help="partition counts, comma-separated")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--delta", type=int, default=1000)
    args = ap.parse_args(argv)
    schema = adult_schema()
    records = [schema.validate(r) for r in iter_records(read_adult(args.adult).head(args.records))]
    print(f"ADULT first {len(records):,} records, k={args.k}, delta={args.delta}; one CASTLE engine per partition, "
          "records split by Kafka's murmur2(record id)")
    print("| partitions | delta per partition | GT loss | suppressed | classes | engine records/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for p in (int(x) for x in args.partitions.split(",")):
        for delta in sorted({args.delta, max(args.k, args.delta // p)}, reverse=True):
            r = run_partitioned(records, schema, partitions=p, k=args.k, delta=delta)
            print(f"| {p} | {delta} | {r['gt_loss']:.4f} | {r['suppressed_fraction']:.2%} | {r['classes']:,} | "
                  f"{r['records_per_second']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
