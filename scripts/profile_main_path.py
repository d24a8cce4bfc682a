"""Profile the main path alone (docs/service.md, "Where the time goes"): run it, then summarize a py-spy profile.

``run``: ADULT x ``--loops`` is loaded into a topic of an embedded Tansu broker, then ``bench service``'s
``main_path_run`` consumes it (release ticks of 0, the bench's options) and prints records/s and the CPU per record
of the main process and of the pipeline worker (start included).  It uses only what ``stream_anon.bench.service``
has had since before the consumer-client change, so an older checkout on ``PYTHONPATH`` profiles the "before".

``summarize RAW``: the top self and inclusive entries of a ``py-spy record --subprocesses --format raw`` profile of
``run``, for the main process's main-path thread and for the pipeline worker process apart.

    pip install py-spy
    py-spy record -r 250 --subprocesses --format raw -o main.raw -- python scripts/profile_main_path.py run
    python scripts/profile_main_path.py summarize main.raw
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import resource
import sys
import threading
from pathlib import Path

ADULT_RECORDS = 32561
WORKER_MARK = "_worker_main"
MAIN_MARKS = ("MainPath.run ", "MainLoop.")  # the main path's thread (not the bench's waiting loop)
BENCH_WAIT = "main_path_run"


def run(loops: int, adult: str | None) -> int:
    from kafka import KafkaProducer

    from stream_anon.bench import service as bench
    from stream_anon.core.datasets import resolve_adult_path
    from stream_anon.kafka_io.broker import EmbeddedBroker

    path = str(resolve_adult_path(adult))
    args = argparse.Namespace(set=[], max_records=5000, linger_ms=20, partitions=1, k=10, delta=1000, beta=50,
                              mu=100, commit_interval_ms=500)
    broker = EmbeddedBroker().start()
    try:
        cfg = bench._config(broker.bootstrap_servers, "profile", args)
        cfg = cfg.with_options({"release.tick_seconds": 0})
        bench._replay(broker.bootstrap_servers, cfg.topics.input, path, loops=loops, partitions=1)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        bench.send_flush_markers(producer, cfg.topics.input, [0])
        producer.close()
        workers: dict[int, float] = {}
        done = threading.Event()

        def watch_workers() -> None:  # a worker's CPU seconds, read until the main path stops it
            tick = os.sysconf("SC_CLK_TCK")
            while not done.is_set():
                for child in multiprocessing.active_children():
                    try:
                        fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    workers[child.pid or 0] = (int(fields[11]) + int(fields[12])) / tick
                done.wait(0.05)

        watcher = threading.Thread(target=watch_workers, daemon=True)
        watcher.start()
        own0 = resource.getrusage(resource.RUSAGE_SELF)
        result = bench.main_path_run(cfg, ADULT_RECORDS * loops)
        own1 = resource.getrusage(resource.RUSAGE_SELF)
        done.set()
        watcher.join()
    finally:
        broker.stop()
    n = ADULT_RECORDS * loops
    own = (own1.ru_utime + own1.ru_stime) - (own0.ru_utime + own0.ru_stime)
    print(f"main path: {result['records']:,} records in {result['seconds']:.2f} s = "
          f"{result['records_per_second']:,.0f} records/s; CPU us per record, start included: main process "
          f"{own / n * 1e6:.1f}, pipeline worker {sum(workers.values()) / n * 1e6:.1f}")
    return 0


def _short(frame: str) -> str:
    m = re.match(r"(.*) \((.*?):(\d+)\)$", frame)
    if not m:
        return frame
    fn, path, _ = m.groups()
    path = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", path)
    path = re.sub(r".*/stream_anon/", "stream_anon/", path)
    return f"{fn} ({path})"


def summarize(raw: Path, top: int) -> int:
    groups: dict[str, list[tuple[list[str], int]]] = {"main process, main-path thread": [],
                                                      "pipeline worker process": []}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if any(WORKER_MARK in f for f in frames):
            groups["pipeline worker process"].append((frames, int(count)))
        elif any(mark in f for f in frames for mark in MAIN_MARKS) and not any(BENCH_WAIT in f for f in frames):
            groups["main process, main-path thread"].append((frames, int(count)))
    for name, stacks in groups.items():
        total = sum(n for _, n in stacks) or 1
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        for frames, n in stacks:
            own[_short(frames[-1])] += n
            for f in {_short(x) for x in frames}:
                inclusive[f] += n
        print(f"{name}: {total} samples\n  self:")
        for f, n in own.most_common(top):
            print(f"  {100 * n / total:5.1f} %  {f}")
        print("  inclusive (stream_anon and the Kafka clients):")
        shown = [(f, n) for f, n in inclusive.most_common() if ("stream_anon/" in f or "kafka/" in f)
                 and not any(skip in f for skip in ("bench/", "app.py", "workers.py", WORKER_MARK))]
        for f, n in shown[:top]:
            print(f"  {100 * n / total:5.1f} %  {f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the main path alone on ADULT x --loops (embedded Tansu)")
    r.add_argument("--loops", type=int, default=3)
    r.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    s = sub.add_parser("summarize", help="top entries of a py-spy raw profile of 'run'")
    s.add_argument("raw", type=Path)
    s.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    if args.command == "run":
        return run(args.loops, args.adult)
    return summarize(args.raw, args.top)


if __name__ == "__main__":
    sys.exit(main())
