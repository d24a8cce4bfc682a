"""``stream-anon bench decoder``: :class:`~stream_anon.formats.decoding.RecordDecoder` on valid ADULT messages.

The message values are the exact bytes the replay tools send (``stream_anon.replay.kafka_replay.encode_record``:
compact UTF-8 JSON, one object per record).  Each repeat decodes every message once (bytes -> validated
record); prints records/s (wall) and records per CPU second of the best repeat, and the median.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.formats.decoding import DeadLetter, RecordDecoder
from stream_anon.replay.kafka_replay import encode_record


def time_decode(decoder: RecordDecoder, values: list[bytes | None]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, dead letters) of one pass over ``values``."""
    decode = decoder.decode
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    bad = 0
    for v in values:
        if isinstance(decode(v), DeadLetter):
            bad += 1
    return time.perf_counter() - t0, time.process_time() - c0, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stream-anon bench decoder", description=__doc__)
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--repeat", type=int, default=5, help="passes over the file (best and median reported)")
    ap.add_argument("--max-message-bytes", type=int, default=65536)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat: expected an integer >= 1, got {args.repeat}")
    values: list[bytes | None] = [encode_record(r) for r in iter_records(read_adult(args.adult))]
    decoder = RecordDecoder(adult_schema(), args.max_message_bytes)
    walls, cpus = [], []
    for i in range(args.repeat):
        wall, cpu, bad = time_decode(decoder, values)
        if bad:
            print(f"bench decoder: {bad} valid ADULT messages were dead-lettered", file=sys.stderr)
            return 1
        walls.append(wall)
        cpus.append(cpu)
        print(f"[{i + 1}/{args.repeat}] {len(values):,} records in {wall:.3f} s: {len(values) / wall:,.0f} records/s "
              f"({len(values) / cpu:,.0f} per CPU second)")
    n = len(values)
    print(f"decoder on valid ADULT messages: best {n / min(walls):,.0f} records/s "
          f"({n / min(cpus):,.0f} per CPU second), median {n / statistics.median(walls):,.0f} records/s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
