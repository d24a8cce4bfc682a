"""UDP loss on loopback: send N records at several rates to ``stream-anon udp-bridge`` and count what arrived.

The bridge runs in its own process (as deployed), the sender in this one with pre-encoded datagrams.
For each rate it prints records sent, received (forwarded by the bridge), lost (sent - received),
loss %, the gaps the bridge counted by sequence number (equal to lost when an EOS copy got through),
the achieved send rate and the kernel's ``RcvbufErrors`` delta (``/proc/net/snmp``: datagrams dropped
because the receiver's socket buffer was full, which is where loopback loses them).

    python -m replay_tools udp-loss-bench --rates 10000,50000,100000,0 --sink null
    python -m replay_tools udp-loss-bench --sink kafka        # bridge forwards into an embedded broker
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_anon.core.datasets import ADULT_ENV, iter_adult_records
from stream_anon.replay.kafka_replay import loop_record_id
from stream_anon.replay.synthetic import synthetic_adult_records
from stream_anon.replay.udp_sender import send_udp
from stream_anon.service.udp_bridge import free_udp_port


@dataclass
class LossRow:
    target_rate: float
    sent: int
    received: int
    lost: int  # sent - received
    gaps_counted: int  # the bridge's count (== lost unless every EOS copy was lost)
    duplicates: int
    send_rate: float
    bridge_seconds: float
    rcvbuf_errors: int | None

    @property
    def loss_pct(self) -> float:
        return 100.0 * self.lost / self.sent if self.sent else 0.0


def rcvbuf_errors() -> int | None:
    """The kernel's UDP ``RcvbufErrors`` counter (Linux), or None."""
    try:
        with open("/proc/net/snmp", encoding="ascii") as f:
            udp = [line.split() for line in f if line.startswith("Udp:")]
        return int(udp[1][udp[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return None


def _start_bridge(port: int, sink: str, bootstrap: str | None, topic: str, rcvbuf: int,
                  timeout_s: float = 30.0) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "stream_anon", "--log-level", "WARNING", "udp-bridge",
           "--listen", f"127.0.0.1:{port}", "--sink", sink, "--exit-on-eos", "--metrics-port", "0",
           "--report-json", "-", "--rcvbuf", str(rcvbuf), "--topic", topic, "--eos-grace", "0.3",
           "--idle-close", "5"]
    if bootstrap:
        cmd += ["--bootstrap-servers", bootstrap]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    for line in proc.stderr:  # wait for "listening on"
        if "listening on" in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"udp-bridge did not start: {' '.join(cmd)}")


def udp_loss_bench(records: Sequence[Mapping[str, Any]], rates: Sequence[float], *, sink: str = "null",
                   bootstrap_servers: str | None = None, topic: str = "udp.bench",
                   rcvbuf_bytes: int = 8 * 1024 * 1024) -> list[LossRow]:
    """One bridge process per rate; returns a row per rate (rate 0 = as fast as the sender goes)."""
    rows = []
    for rate in rates:
        port = free_udp_port()
        proc = _start_bridge(port, sink, bootstrap_servers, f"{topic}.{int(rate)}", rcvbuf_bytes)
        try:
            before = rcvbuf_errors()
            stats = send_udp(records, "127.0.0.1", port, rate, preencode=True)
            out, err = proc.communicate(timeout=120)
            after = rcvbuf_errors()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"udp-bridge exited with {proc.returncode}: {err[-2000:]}")
        report = json.loads(lines[-1])
        received = report["records_forwarded"]
        rows.append(LossRow(target_rate=rate, sent=stats.records, received=received,
                            lost=stats.records - received, gaps_counted=report["gaps"], duplicates=report["duplicates"], send_rate=stats.rate_achieved,
                            bridge_seconds=report["seconds"],
                            rcvbuf_errors=(after - before) if before is not None and after is not None else None))
    return rows


def format_table(rows: Sequence[LossRow], sink: str) -> str:
    out = ["| target rate (rec/s) | achieved send rate | sent | received | lost | loss % | gaps counted by bridge "
           "| kernel RcvbufErrors | bridge sink |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        target = f"{r.target_rate:,.0f}" if r.target_rate > 0 else "max"
        kern = f"{r.rcvbuf_errors:,}" if r.rcvbuf_errors is not None else "n/a"
        out.append(f"| {target} | {r.send_rate:,.0f} | {r.sent:,} | {r.received:,} | {r.lost:,} | "
                   f"{r.loss_pct:.2f} | {r.gaps_counted:,} | {kern} | {sink} |")
    return "\n".join(out)


def _adult_or_synthetic(adult: str | None, limit: int | None) -> tuple[list[dict[str, Any]], str]:
    """ADULT (``adult`` or ``$STREAM_ANON_ADULT``), else synthetic ADULT-shaped records (said on stderr)."""
    path = adult or os.environ.get(ADULT_ENV)
    if path and os.path.isfile(path):
        return list(itertools.islice(iter_adult_records(path), limit)), "ADULT"
    print(f"ADULT file not found (--adult / ${ADULT_ENV}): using SYNTHETIC ADULT-shaped records", file=sys.stderr)
    return list(synthetic_adult_records(limit or 32_561, rng=None)), "synthetic ADULT-shaped"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m replay_tools udp-loss-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="10000,50000,100000,0",
                   help="comma-separated records/s; 0 = as fast as possible (default 10000,50000,100000,0)")
    p.add_argument("--records", type=int, default=None, help="records per rate (default: all of ADULT, 32,561; more loops the file)")
    p.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT; synthetic if missing)")
    p.add_argument("--sink", choices=["null", "kafka"], default="null",
                   help="bridge sink: null (UDP reception only) or kafka (forward into the broker)")
    p.add_argument("--bootstrap-servers", default=None, help="Kafka for --sink kafka (default: embedded broker)")
    p.add_argument("--rcvbuf", type=int, default=8 * 1024 * 1024, help="bridge socket receive buffer bytes")
    args = p.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    records, label = _adult_or_synthetic(args.adult, args.records)
    if args.records is not None and args.records > len(records):  # more than the file: loop it (ids <id>#<pass>)
        base = records
        records = [{**r, "id": loop_record_id(str(r["id"]), i // len(base))}
                   for i, r in ((i, base[i % len(base)]) for i in range(args.records))]
    print(f"udp-loss-bench: {len(records):,} {label} records per rate, rates {args.rates}, sink {args.sink}",
          file=sys.stderr)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        if args.sink == "kafka" and not bootstrap:
            from stream_anon.kafka_io.broker import EmbeddedBroker

            bootstrap = stack.enter_context(EmbeddedBroker()).bootstrap_servers
        rows = udp_loss_bench(records, rates, sink=args.sink, bootstrap_servers=bootstrap, rcvbuf_bytes=args.rcvbuf)
    print(format_table(rows, args.sink))
    return 0
