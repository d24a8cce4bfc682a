"""``python -m stream_anon.bench.release_path``: the cost of the release path and of CASTLE's cluster reuse.

``gate`` (default): the engine releases ADULT with the service defaults (k=10, delta=1000, beta=50, mu=100,
reuse off, l=2; ``--l 1`` for none); then, over all its classes, CPU time (``time.process_time``, best and median of ``--repeat``) per
class and per record of (1) the pre-publish gate, (2) the public class message, (3) the whole ledger path
(gate + class message + ledger entry + its bytes), each against the main path's ~80 us per record.

``pipeline``: the service's pipeline exactly as a worker runs it (``workers.Pipelines``: decode, validate, engine,
gate, ledger entries, in batches of 1,000) over ADULT with the service's configuration, once with the gate and once
without (``EntryFactory.gate = None``), alternating, CPU seconds per record (best and median of ``--repeat``).
``--once {gate,no-gate}`` runs one pass only, to count instructions under
``valgrind --tool=callgrind python -m stream_anon.bench.release_path pipeline --once gate`` (subtract a run with
``--records 0``: start-up).

``reuse``: reuse releases (CASTLE's Omega: one record under an earlier class's generalization) the engine makes
on ADULT with the service defaults and zeta = the engine default, and what zeta = 0 costs (GT loss with
suppressed records at 1, suppressions, classes), for ``--seeds``; with ``--l-diversity`` also zeta = 0 and
l = 2, and for each the records released in classes whose members all share one income value.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from stream_anon.config.settings import Config
from stream_anon.core.datasets import iter_adult_records, read_adult
from stream_anon.core.defaults import DEFAULTS
from stream_anon.core.engine import DEFAULT_ZETA, Engine, EngineConfig, Release
from stream_anon.core.schema import Schema, adult_schema
from stream_anon.formats.release import ClassEncoder
from stream_anon.kafka_io.limits import FALLBACK_MESSAGE_MAX_BYTES
from stream_anon.service.gate import PrePublishGate
from stream_anon.service.ledger import EntryFactory
from stream_anon.service.wiring import (
    load_schema,
    make_engine_factory,
    make_entry_factory,
    pipeline_settings,
    with_release_secret,
)
from stream_anon.service.workers import CreatePartition, Pipelines, ProcessBatch, RawMessage

SERVICE_DEFAULTS: dict[str, Any] = {"k": DEFAULTS.k, "delta": DEFAULTS.delta, "beta": DEFAULTS.beta,
                                    "mu": DEFAULTS.mu}  # every command's (stream_anon.core.defaults)
MAIN_PATH_US_PER_RECORD = 80.0
"""The main path's cost per record, all included (~12,500 records/s in ``bench service``)."""


def adult_releases(schema: Schema, zeta: int, seed: int, adult: str | None,
                   l: int | None = None) -> tuple[list[Release], list[str], int]:  # noqa: E741
    """All releases of the engine on ADULT; records tracked by position (as the service tracks offsets)."""
    df = read_adult(adult)
    cols = {c: df[c].tolist() for c in df.columns}
    names = list(cols)
    records = [dict(zip(names, row, strict=True)) for row in zip(*cols.values(), strict=True)]
    ids = [r["id"] for r in records]
    for i, r in enumerate(records):
        r["id"] = i
    eng = Engine(schema, EngineConfig(**SERVICE_DEFAULTS, zeta=zeta, seed=seed, l=l))
    out: list[Release] = []
    for rec, v in zip(records, eng.encode_many(cols), strict=True):
        out += eng.push_encoded(rec, v, 0.0)
    out += eng.flush(0.0)
    return out, ids, len(records)


def _time(fn: Callable[[], None], repeat: int) -> tuple[float, float]:
    cpu = []
    for _ in range(repeat):
        gc.collect()
        c0 = time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
    return min(cpu), statistics.median(cpu)


def bench_gate(args: argparse.Namespace) -> int:
    schema = adult_schema()
    l_ = args.l if args.l > 1 else None
    out, ids, _ = adult_releases(schema, 0, 0, args.adult, l=l_)
    classes = [r for r in out if r.kind == "class"]
    args_ = [(r.generalized, r.records, [ids[o] for o in r.record_ids], [int(o) for o in r.record_ids], r)
             for r in classes]
    n_rec = sum(len(a[1]) for a in args_)
    qis = [a.name for a in schema.qis]
    sens = [a.name for a in schema.sensitive]

    def gate_only() -> None:
        gate = PrePublishGate(schema, k=10, l=l_)  # a cold interval cache every repeat
        for g, m, rid, _, _ in args_:
            gate.check(g, m, rid)

    def message_only() -> None:
        enc = ClassEncoder(qis=qis, sensitive=sens, k=10, l=l_)
        for g, m, _, _, r in args_:
            enc.encode(generalized=g, members=m, size=r.size, loss=r.loss)

    ledger_bound = FALLBACK_MESSAGE_MAX_BYTES  # what the service bounds messages at when the broker does not say

    def ledger_path() -> None:
        f = EntryFactory(input_topic="adult.raw", partition=0, incarnation="bench",
                         classes=ClassEncoder(qis=qis, sensitive=sens, k=10, l=l_), secret=b"b" * 32,
                         gate=PrePublishGate(schema, k=10, l=l_), max_message_bytes=ledger_bound)
        for g, m, rid, offs, r in args_:
            entries, _ = f.released_class(offsets=offs, record_ids=rid, members=m, generalized=g, size=r.size,
                                          loss=r.loss, horizon=max(offs))
            for e in entries:
                e.ledger_messages(ledger_bound)

    gate = PrePublishGate(schema, k=10, l=l_)
    refused = sum(not gate.check(g, m, rid).ok for g, m, rid, _, _ in args_)
    homogeneous = [r for r in classes if len({m[sens[0]] for m in r.records}) == 1]
    print(f"ADULT, engine k=10 delta=1000 beta=50 mu=100 zeta=0 l={l_} seed=0: {len(classes)} classes, {n_rec} records; "
          f"gate refused {refused}; classes with a single {sens[0]!r} value (disclosed to anyone who places a "
          f"member in the class; l=2 would refuse them): {len(homogeneous)} holding "
          f"{sum(r.n_records for r in homogeneous)} records")
    print(f"CPU seconds (process_time), best / median of {args.repeat}; share of a {MAIN_PATH_US_PER_RECORD:.0f} us/record "
          f"main path")
    for name, fn in (("gate", gate_only), ("class message", message_only),
                     ("gate + message + ledger entry", ledger_path)):
        best, med = _time(fn, args.repeat)
        print(f"  {name:30s} per class {best / len(classes) * 1e6:7.2f} / {med / len(classes) * 1e6:7.2f} us, "
              f"per record {best / n_rec * 1e6:6.3f} / {med / n_rec * 1e6:6.3f} us "
              f"({best / n_rec * 1e6 / MAIN_PATH_US_PER_RECORD * 100:.2f} % / "
              f"{med / n_rec * 1e6 / MAIN_PATH_US_PER_RECORD * 100:.2f} %)")
    return 0


def _pipeline_pass(cfg: Config, schema: Schema, msgs: list[RawMessage], gate: bool) -> float:
    """One pass of the worker's pipeline over ``msgs``; returns CPU seconds."""
    make = make_entry_factory(cfg, schema)

    def entries(partition: int, incarnation: str) -> EntryFactory:
        f = make(partition, incarnation)
        if not gate:
            f.gate = None
        return f

    pipes = Pipelines(schema, pipeline_settings(cfg), make_engine_factory(cfg, schema), entries)
    pipes.create(CreatePartition(0, 0, (), -1, "bench"))
    gc.collect()
    c0 = time.process_time()
    for i in range(0, len(msgs), 1000):
        pipes.run(ProcessBatch(0, tuple(msgs[i:i + 1000]), 2000.0))
    return time.process_time() - c0


def bench_pipeline(args: argparse.Namespace) -> int:
    cfg, _ = with_release_secret(Config.load(env={}, overrides={"anonymization.seed": 1, "anonymization.l": args.l
                                                                if args.l > 1 else None}))
    schema = load_schema(cfg)
    adult = iter_adult_records(args.adult)
    msgs: list[RawMessage] = [(i, json.dumps(r).encode(), None, (), 1000 + i, None)
                              for i, r in zip(range(args.records), adult, strict=False)]
    if args.once:
        cpu = _pipeline_pass(cfg, schema, msgs, args.once == "gate")
        print(f"pipeline ({args.once}), {len(msgs)} records: {cpu:.3f} CPU s")
        return 0
    runs: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeat):
        for g in (False, True):
            runs[g].append(_pipeline_pass(cfg, schema, msgs, g) / len(msgs) * 1e6)
    a = cfg.anonymization
    print(f"the worker's pipeline on {len(msgs)} ADULT records (k={a.k}, l={a.l}, delta={a.delta}), CPU us per record, "
          f"best / median of {args.repeat} (alternating):")
    for g in (False, True):
        print(f"  {'with the gate' if g else 'without the gate':18s} {min(runs[g]):6.2f} / {statistics.median(runs[g]):6.2f}")
    print(f"  the gate's share: {(1 - min(runs[False]) / min(runs[True])) * 100:.1f} % (best), "
          f"{(1 - statistics.median(runs[False]) / statistics.median(runs[True])) * 100:.1f} % (median)")
    return 0


def bench_reuse(args: argparse.Namespace) -> int:
    schema = adult_schema()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"ADULT, engine k=10 delta=1000 beta=50 mu=100 castle gt leftover=suppress, seeds {seeds}")
    variants: list[tuple[int, int | None]] = [(DEFAULT_ZETA, None), (0, None)]
    if args.l_diversity:
        variants.append((0, 2))
    for zeta, l_ in variants:
        rows = []
        name = f"zeta={zeta}" + (f" l={l_}" if l_ else "")
        for seed in seeds:
            out, _, n = adult_releases(schema, zeta, seed, args.adult, l=l_)
            reuse = sum(1 for r in out if r.kind == "class" and r.reused)
            classes = sum(1 for r in out if r.kind == "class" and not r.reused)
            supp = sum(r.n_records for r in out if r.kind == "suppressed")
            loss = sum(r.loss * r.n_records for r in out if r.kind == "class")
            homog = sum(r.n_records for r in out if r.kind == "class" and not r.reused
                        and len({m["income"] for m in r.records}) == 1)
            rows.append((reuse, classes, supp, (loss + supp) / n, homog))
            print(f"  {name} seed={seed}: reuse releases {reuse:4d} (single-record messages), classes "
                  f"{classes}, suppressed {supp}, GT loss {rows[-1][3]:.4f}, records in single-income classes "
                  f"{homog}")
        m = [statistics.mean(c) for c in zip(*rows, strict=True)]
        print(f"{name}: mean reuse releases {m[0]:.1f} ({m[0] / n * 100:.2f} % of records), classes {m[1]:.1f}, "
              f"suppressed {m[2]:.1f} ({m[2] / n * 100:.2f} %), GT loss {m[3]:.4f} "
              f"(range {min(r[3] for r in rows):.4f}-{max(r[3] for r in rows):.4f}), records in single-income "
              f"classes {m[4]:.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stream-anon bench release-path", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=["gate", "pipeline", "reuse"], default="gate")
    ap.add_argument("--adult", default=None, help="ADULT file (default: $STREAM_ANON_ADULT)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--l", type=int, default=DEFAULTS.l, help="gate: l of the engine and the gate (default 2, the service's; "
                                                     "1: none)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--l-diversity", action="store_true", help="reuse: also zeta=0 with l=2 (no single-income class)")
    ap.add_argument("--records", type=int, default=32561, help="pipeline: records of ADULT (default all)")
    ap.add_argument("--once", choices=["gate", "no-gate"], default=None, help="pipeline: one pass (for callgrind)")
    args = ap.parse_args(argv)
    return {"gate": bench_gate, "pipeline": bench_pipeline, "reuse": bench_reuse}[args.what](args)


if __name__ == "__main__":
    raise SystemExit(main())
