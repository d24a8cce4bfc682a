"""``stream-anon demo``: embedded broker, the service (main path + side paths, in threads of this process,
each with its own consumer group), ADULT replayed into ``adult.raw``, then a verified summary.

Data: ``--adult PATH`` / ``$STREAM_ANON_ADULT``; else the UCI file is downloaded (sha256-checked against
``datasets.ADULT_SHA256``) into ``~/.cache/stream-anon``; offline, the synthetic ADULT-shaped generator of
``stream_anon.replay.synthetic`` is used and the summary says so.

The summary reads the internal ledger (:mod:`stream_anon.service.audit`): every input record accounted exactly
once, every promised output published exactly once, the public classes verified independently (k, l, QI strings)
and, joined with the original records through the ledger's record ids, every generalization covering its members.

The run directory (``--run-dir``, default ``runs/demo-<timestamp>``) receives ``summary.json``,
``released.csv`` in the public layout of ``anonymize --output`` (class_id, QIs..., sensitive: what a reader of the
anon topic gets, no record ids) with its meta file ``released.csv.meta.json``, ``delays.json`` (the released
records' delays, sorted) and ``config.json`` (passwords and the release secret redacted); ``stream-anon report
RUN_DIR`` reads it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.core.datasets import (
    ADULT_ENV,
    ADULT_SHA256,
    ADULT_URL,
    iter_records,
    read_adult_for_replay,
    sha256_of,
)
from stream_anon.core.loss import summarize_release_frame
from stream_anon.core.schema import Schema
from stream_anon.core.verify import ReleaseRoles, diversity_meta, verify_release_frame, write_release_meta
from stream_anon.kafka_io.address import DEFAULT_CONNECT_SECONDS, BrokerUnreachableError, wait_for_broker
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.kafka_io.lifecycle import (
    CLOSE_TIMEOUT_SECONDS,
    STOP_GRACE_SECONDS,
    quiet_client_libraries,
    quiet_closing_clients,
)
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.privacy.display import format_epsilon
from stream_anon.replay.interrupts import InterruptGuard
from stream_anon.replay.kafka_replay import ReplayStats, replay_records
from stream_anon.replay.synthetic import synthetic_adult_records
from stream_anon.runtime.run import exported_parts, start_metrics, stop_counts, without_idle_side_paths
from stream_anon.runtime.supervisor import SidePaths
from stream_anon.service.accounting import StopCounts, stop_line
from stream_anon.service.app import LOOP_REQUEST_TIMEOUT_MS, MainPath, MainPathTotals
from stream_anon.service.audit import (
    collect_outputs,
    partition_ends,
    read_topic_with_headers,
)
from stream_anon.service.liveness import LoopHeartbeat
from stream_anon.service.wiring import load_schema, with_release_secret

log = logging.getLogger(__name__)

REPLAY_STOP_SECONDS = 1.0
"""On a stop, how long the replay may flush what it handed to its producer before closing it."""
PLAIN_PROGRESS_SECONDS = 10.0
"""Into a file or a pipe (not a terminal) the progress is a plain line at most this often."""

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stream-anon"


def obtain_records(adult: str | None, *, records: int | None, synthetic: bool, download: bool,
                   seed: int | None) -> tuple[list[dict[str, Any]], str, pd.DataFrame | None]:
    """(records, description of the source, original frame for the coverage check or None).

    Raises :class:`~stream_anon.core.datasets.DatasetError` (one line naming the file, where its path came from:
    ``--adult`` or ``$STREAM_ANON_ADULT``, and what is wrong) for a missing, malformed or short ADULT file.
    """
    origin = "--adult" if adult else f"${ADULT_ENV}"
    path = adult or os.environ.get(ADULT_ENV) or None
    if not synthetic and not path:
        cached = CACHE_DIR / "adult.data"
        if cached.is_file() and sha256_of(cached) == ADULT_SHA256:
            path, origin = str(cached), "the download cache"
        elif download:
            try:
                path, origin = str(download_adult(cached)), f"the download from {ADULT_URL}"
            except OSError as e:
                print(f"demo: no ADULT file (--adult / ${ADULT_ENV}) and the download from {ADULT_URL} failed "
                      f"({e}); falling back to SYNTHETIC ADULT-shaped records", file=sys.stderr)
                synthetic = True
        else:
            print(f"demo: no ADULT file (--adult / ${ADULT_ENV}) and --no-download: using SYNTHETIC records",
                  file=sys.stderr)
            synthetic = True
    if synthetic or not path:
        n = records or 32561
        recs = list(synthetic_adult_records(n, rng=seed if seed is not None else 0))
        return recs, f"SYNTHETIC ADULT-shaped records ({n:,}, independent marginals of ADULT; not real data)", None
    df, warning = read_adult_for_replay(path, origin=origin, records=records)
    if warning:
        print(f"demo: {warning}", file=sys.stderr)
    source = (f"UCI ADULT {path} ({len(df):,} records)" if warning is None else
              f"ADULT-format file {path} ({len(df):,} records; not the UCI file, its sha256 differs)")
    return list(iter_records(df)), source, df


def download_adult(target: Path, timeout_s: float = 20.0) -> Path:
    """Download the UCI ADULT file and check its sha256 (raises OSError on any failure)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    print(f"demo: downloading ADULT from {ADULT_URL} ...", file=sys.stderr)
    with urllib.request.urlopen(ADULT_URL, timeout=timeout_s) as resp, open(tmp, "wb") as f:  # noqa: S310
        f.write(resp.read())
    digest = sha256_of(tmp)
    if digest != ADULT_SHA256:
        tmp.unlink(missing_ok=True)
        raise OSError(f"sha256 mismatch: got {digest}, expected {ADULT_SHA256}")
    tmp.replace(target)
    return target


def _percentiles(values: pd.Series, population: str) -> dict[str, Any]:
    """p50/p99/max/mean of the numeric values, with ``n`` and the ``population`` they describe."""
    v = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=float)
    if v.size == 0:
        return {"p50": None, "p99": None, "max": None, "mean": None, "n": 0, "population": population}
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "max": float(v.max()),
            "mean": float(v.mean()), "n": int(v.size), "population": population}


def run_demo(cfg: Config, *, adult: str | None = None, records: int | None = None, rate: float = 0.0,
             run_dir: str | None = None, synthetic: bool = False, download: bool = True, timeout: float = 600.0,
             stop_event: threading.Event | None = None, progress: bool = True,
             connect_timeout: float = DEFAULT_CONNECT_SECONDS) -> int:
    """The demo (see the module docstring); returns the exit code: 0 all verified, 1 not (or stopped before the
    end: the run directory's summary.json then says ``"interrupted": true`` and what was left), 3 the broker of
    ``--bootstrap-servers`` did not accept a connection within ``connect_timeout`` seconds."""
    t_start = time.monotonic()
    quiet_client_libraries()  # the client libraries' lines never reach the operator (but at DEBUG)
    quiet_closing_clients()
    stop_event = stop_event or threading.Event()
    out_dir = Path(run_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    recs, source, original = obtain_records(adult, records=records, synthetic=synthetic, download=download,
                                            seed=cfg.anonymization.seed)
    n = len(recs)
    print(f"demo: data: {source}", file=sys.stderr)
    broker: EmbeddedBroker | None = None
    if cfg.kafka.bootstrap_servers:
        try:  # one line naming the address, before anything starts; a Ctrl-C ends the wait at once
            wait_for_broker(cfg.kafka.bootstrap_servers, connect_timeout, stop=stop_event.is_set)
        except BrokerUnreachableError as e:
            print(f"demo: {e}", file=sys.stderr)
            _write_interrupted(out_dir, n, source, f"not started: {e}", None)
            return 3
        except InterruptedError:
            _write_interrupted(out_dir, n, source, "stopped while waiting for the broker", None)
            return 1
    else:
        broker = EmbeddedBroker(log_path=out_dir / "tansu.log").start()
        cfg = cfg.with_options({"kafka.bootstrap_servers": broker.bootstrap_servers,  # fast group join (half of it):
                                "kafka.session_timeout_ms": min(cfg.kafka.session_timeout_ms, 6000)})
        print(f"demo: embedded Tansu broker on {broker.bootstrap_servers}", file=sys.stderr)
    bs = cfg.kafka.bootstrap_servers
    assert bs is not None
    # the side paths' exact statistics beside the estimates, to print estimate errors (demo only: NOT private)
    cfg = dataclasses.replace(cfg, side_paths=dataclasses.replace(cfg.side_paths, truth=True))
    cfg = without_idle_side_paths(cfg)
    cfg, secret = with_release_secret(cfg)  # once, for the main path, its workers and the side paths
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry, parts=exported_parts(cfg))
    heartbeat = LoopHeartbeat(cfg.service.healthz_stall_seconds)
    main_thread: threading.Thread | None = None
    main: MainPath | None = None
    side: SidePaths | None = None
    stopped: str | None = None  # why the demo stopped before every record was released
    replay_thread: threading.Thread | None = None
    replay_guard = InterruptGuard()  # not installed: a stop sets its pending signal, the replay ends at its next record
    try:
        try:
            start_metrics(cfg, registry, heartbeat)
            if cfg.service.metrics_port:
                print(f"demo: metrics on http://{cfg.service.metrics_addr}:{cfg.service.metrics_port}/metrics",
                      file=sys.stderr)
        except OSError as e:
            print(f"demo: metrics endpoint not started ({e}); continuing without it", file=sys.stderr)
        schema = load_schema(cfg)
        main = MainPath(cfg, metrics=metrics, schema=schema, stop_event=stop_event,
                        secret_generated=secret.generated, heartbeat=heartbeat)
        main_thread = threading.Thread(target=main.run, name="main-path", daemon=True)
        main_thread.start()
        side = _start_side(cfg, metrics, stop_event)
        while not main.ready.wait(0.1):  # a stop, or the main path giving up on the broker, ends the wait at once
            if stop_event.is_set() or not main_thread.is_alive():
                stopped = ("stopped before the main path started" if stop_event.is_set() else
                           f"the main path did not start (broker {bs}: see the line above)")
                print(f"demo: {stopped}", file=sys.stderr)
                return 1
        # replay in a thread; this thread draws the progress bar
        replay_stats: dict[str, ReplayStats] = {}

        def replay() -> None:  # the end-of-stream markers after the last record; a stop ends it at its next record
            replay_stats["stats"] = replay_records(
                recs, cfg.topics.input, bs, rate, partitions=cfg.topics.partitions, end_of_stream=True,
                producer_config={**cfg.kafka.security_options()}, interrupts=replay_guard,
                interrupt_flush_timeout_s=REPLAY_STOP_SECONDS)

        t_replay = time.monotonic()
        rt = replay_thread = threading.Thread(target=replay, name="replay", daemon=True)
        rt.start()
        t = main.totals
        deadline = time.monotonic() + timeout
        bar = ProgressLine(n, sys.stderr) if progress else None
        while True:
            done = t.released + t.suppressed + t.dead_lettered
            side_now = side.progress() if side is not None else None
            side_done = side is None or not side.alive or (
                side_now is not None and side_now["processed"] + sum(side_now.get("skipped", {}).values()) >= n)
            if bar is not None:
                bar.update(done, t, side_now, time.monotonic() - t_replay)
            if done >= n and side_done and "stats" in replay_stats and not replay_stats["stats"].interrupted:
                break
            if stop_event.is_set() or time.monotonic() > deadline or not main_thread.is_alive():
                stopped = ("stopped (a signal)" if stop_event.is_set() else
                           f"gave up after --timeout {timeout:g} s" if time.monotonic() > deadline else
                           "the main path ended (see the lines above)")
                if bar is not None:
                    bar.close()
                return 1
            time.sleep(0.05)
        seconds_to_release = time.monotonic() - t_replay
        if bar is not None:
            bar.update(t.released + t.suppressed + t.dead_lettered, t, side_now, seconds_to_release, final=True)
            bar.close()
        time.sleep(cfg.service.commit_interval_ms / 1000.0 + 0.2)  # let the last watermark commit
        stop_event.set()
        side_summary = (side.stop() or {}) if side is not None else {}
        main_thread.join(30)
        summary = _summarize(cfg, schema, bs, n, source, original, out_dir, main, side_summary,
                             replay_stats["stats"], seconds_to_release, time.monotonic() - t_start)
    finally:
        stop_event.set()
        if replay_thread is not None and replay_thread.is_alive():  # its producer closes before the broker goes
            replay_guard.pending = signal.SIGINT
            replay_thread.join(REPLAY_STOP_SECONDS + CLOSE_TIMEOUT_SECONDS)
        # the same order as `run`: the side paths and the main path stop (each bounded), the broker last
        if side is not None:
            side.stop()
        if main_thread is not None:
            main_thread.join(STOP_GRACE_SECONDS + 4 * CLOSE_TIMEOUT_SECONDS + LOOP_REQUEST_TIMEOUT_MS / 1000.0)
        if broker is not None:
            broker.stop(timeout_s=CLOSE_TIMEOUT_SECONDS)
        if stopped is not None and main is not None and main.ready.is_set():  # all stopped: what was left
            counts = stop_counts(main)
            line = stop_line(counts, memory_broker=broker is not None and not broker.durable)
            print(f"demo: {stopped} before every record was released: {line}", file=sys.stderr, flush=True)
            _write_interrupted(out_dir, n, source, stopped, counts, line)
        elif stopped is not None:
            _write_interrupted(out_dir, n, source, stopped, None)
    _print_summary(summary, out_dir)
    try:
        from stream_anon.report.html import write_report  # matplotlib: imported only when a report is written

        report = write_report(out_dir)
        print(f"  report:        {report}  (open it in a browser)")
    except Exception as e:  # the report is a convenience: never fail the demo on it
        log.warning("demo: report not written: %s", e)
    ok = summary["k_anonymity"]["verified"] and summary["accounting"]["ok"] and summary["records_unaccounted"] == 0
    return 0 if ok else 1


def _write_interrupted(out_dir: Path, n: int, source: str, reason: str, counts: StopCounts | None,
                       line: str | None = None) -> None:
    """``summary.json`` of a demo that stopped before every record was released: it says so, why, and what the
    main path consumed, released, suppressed, dead-lettered and left (no released table: ``report`` refuses the
    folder, ``summary.json`` explains it)."""
    summary: dict[str, Any] = {"interrupted": True, "reason": reason, "data_source": source, "records_in": n,
                               "files": {"tansu_log": "tansu.log"} if (out_dir / "tansu.log").is_file() else {}}
    if counts is not None:
        summary.update({"records_consumed": counts.consumed, "records_released": counts.released,
                        "records_suppressed": counts.suppressed, "records_dead_lettered": counts.dead_lettered,
                        "records_skipped": counts.skipped, "records_left_buffered": counts.left,
                        "records_handed_over": counts.handed_over, "stop": line})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


class ProgressLine:
    """The demo's progress: on a terminal one line redrawn in place (``\\r``) every 0.2 s; into a file or a pipe
    a plain line every :data:`PLAIN_PROGRESS_SECONDS` (no ``\\r`` updates in logs)."""

    def __init__(self, n: int, stream: Any) -> None:
        self.n = n
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, t: MainPathTotals, side: dict[str, Any] | None, elapsed: float,
               final: bool = False) -> None:
        every = 0.2 if self.tty else PLAIN_PROGRESS_SECONDS
        if not final and time.monotonic() - self._last < every:
            return
        self._last = time.monotonic()
        width = 30
        frac = min(done / self.n, 1.0) if self.n else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        side_txt = f" | side {side['processed']:,}" if side is not None else ""
        text = (f"released [{bar}] {done:,}/{self.n:,} {frac:4.0%} (anon {t.released:,}, suppressed "
                f"{t.suppressed:,}, dlq {t.dead_lettered:,}){side_txt} {elapsed:5.1f} s")
        self.stream.write(f"\r{text} " if self.tty else f"demo: {text}\n")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def _start_side(cfg: Config, metrics: ServiceMetrics, stop_event: threading.Event) -> SidePaths | None:
    if not cfg.side_paths.enabled or cfg.service.side_paths_mode == "off":
        return None
    side = SidePaths(cfg, metrics, stop_event)
    return side if side.mode != "off" else None


def _summarize(cfg: Config, schema: Schema, bs: str, n: int, source: str, original: pd.DataFrame | None,
               out_dir: Path, main: MainPath, side: dict[str, Any], replay: ReplayStats, seconds_to_release: float,
               seconds_total: float) -> dict[str, Any]:
    qis = [a.name for a in schema.qis]
    sens = [a.name for a in schema.sensitive]
    a, t = cfg.anonymization, cfg.topics
    ends = partition_ends(bs, t.input, client_options=cfg.kafka.security_options())  # records + end-of-stream markers
    snap = collect_outputs(bs, input_topic=t.input, ledger=t.ledger_topic(), anon=t.anon, suppressed=t.suppressed,
                           dlq=t.dlq, qis=qis, sensitive=sens, input_ends=ends,
                           client_options=cfg.kafka.security_options())
    df = snap.records
    released = df[df.outcome == "released"]
    rep_acc = snap.accounting
    # the public table: what a reader of the anon topic gets (verified for k, l and the QI strings)
    table = snap.public
    table.to_csv(out_dir / "released.csv", index=False)
    roles = ReleaseRoles(class_id="class_id", quasi_identifiers=tuple(qis), sensitive=tuple(sens),
                         source="stream-anon demo", withheld_person_id=schema.person_id)
    req = a.requirement(schema)
    write_release_meta(out_dir / "released.csv", roles, schema=schema.name, k=a.k, l=a.l, records=len(table),
                       **diversity_meta(req, {c: tuple(r.items()) for c, r in snap.references.items()}),
                       classes=snap.classes, class_size_counts="records", row_order="release order of the classes; "
                       "rows of a class by sensitive value", class_ids="opaque random 128-bit ids (the anon topic's)")
    n_supp = rep_acc.outcomes.get("suppressed", 0)
    members = released[["record_id", "class_id", *qis]].astype({"record_id": str})  # internal: ids from the ledger
    loss = summarize_release_frame(members, schema, a.k, records_suppressed=n_supp)
    rep = verify_release_frame(table, qis, a.k, None, sens[0] if sens else None, record_id=None, schema=schema,
                               requirement=req, references=snap.references if req is not None and req.t is not None
                               else None)
    violations = list(rep.violations)
    coverage = None
    if original is not None and len(released):  # each member's original values, joined through the ledger's ids
        coverage = verify_release_frame(members, qis, a.k, schema=schema, original=original,
                                        original_id=schema.record_id or "id")
        violations += coverage.violations
    published_ok = all(c.ok for c in snap.published.values())
    summary: dict[str, Any] = {
        "data_source": source,
        "synthetic": original is None,
        "bootstrap_servers": bs,
        "parameters": {"k": a.k, "delta": a.delta, "beta": a.beta, "mu": a.mu, "algorithm": a.algorithm,
                       "loss": a.loss, "leftover": a.leftover, "l": a.l, "zeta": a.zeta,
                       "partitions": replay.partitions},
        "records_in": n,
        "records_replayed": replay.records_acked,
        "records_released": rep_acc.outcomes.get("released", 0),
        "records_suppressed": n_supp,
        "records_dead_lettered": rep_acc.outcomes.get("dead_lettered", 0),
        "suppressed_reasons": dict(rep_acc.suppressed_reasons),
        "dead_letter_reasons": dict(rep_acc.dlq_reasons),
        "records_unaccounted": len(rep_acc.missing),
        "records_duplicated": len(rep_acc.duplicates),
        "end_of_stream_markers": rep_acc.outcomes.get("control", 0),
        "classes": snap.classes,
        "accounting": {"ok": bool(snap.ok), "source": f"ledger {t.ledger_topic()}",
                       "published_exactly_once": {role: c.ok for role, c in snap.published.items()},
                       "problems": snap.problems[:20]},
        "loss": loss.as_dict(),
        "gt_loss": float(loss.gt_loss),
        "lm_loss": float(loss.lm_loss),
        "lm_loss_normalized": float(loss.lm_loss_normalized),
        "delay_arrivals": _percentiles(released["delay"], "released records"),
        "delay_positions": _percentiles(released["position_delay"], "released records"),
        "latency_seconds": _percentiles(released["latency_s"], "released records"),
        "k_anonymity": {"verified": bool(rep.ok and (coverage is None or coverage.ok) and published_ok),
                        "violations": violations[:20], "classes": rep.classes, "min_class_size": rep.min_class_size,
                        "l": a.l, "coverage_checked": coverage is not None},
        "side_paths": side,
        "replay_records_per_second": replay.rate_achieved,
        "seconds_replay_to_all_released": seconds_to_release,
        "seconds_total": seconds_total,
        "records_per_second_end_to_end": n / seconds_to_release if seconds_to_release > 0 else None,
        "topics": {"input": t.input, **t.outputs(), "ledger": t.ledger_topic(), **t.side()},
        "files": {"released_csv": "released.csv", "released_meta": "released.csv.meta.json",
                  "config": "config.json"},
    }
    delays: dict[str, Any] = {"bound": a.delta, "population": "released records, sorted"}
    if len(released):
        delays["arrivals"] = sorted(int(x) for x in released["delay"].dropna())
        secs = released["latency_s"].dropna()
        if len(secs):
            delays["seconds"] = sorted(float(x) for x in secs)
    (out_dir / "delays.json").write_text(json.dumps(delays))
    estimates = _latest_side_estimates(bs, cfg)
    if estimates:
        (out_dir / "side_estimates.json").write_text(json.dumps(estimates, indent=1, default=_json_default))
        summary["files"]["side_estimates"] = "side_estimates.json"
    summary["files"]["delays"] = "delays.json"
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default))
    (out_dir / "config.json").write_text(json.dumps(cfg.redacted(), indent=2, default=str))
    return summary


def _latest_side_estimates(bs: str, cfg: Config) -> list[dict[str, Any]]:
    """The last estimate per (mechanism, attribute) on the estimates topic, in the report's
    ``side_estimates.json`` layout (estimated vs true; the truth comes from the demo-only truth tracker)."""
    if not cfg.side_paths.enabled or cfg.service.side_paths_mode == "off":
        return []
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for m in read_topic_with_headers(bs, cfg.topics.estimates, timeout_s=10.0, idle_s=0.3,
                                     client_options=cfg.kafka.security_options()):
        try:
            msg = json.loads(m.value)
        except (TypeError, ValueError):
            continue
        if isinstance(msg, dict) and "attribute" in msg and "truth" in msg:
            latest[(str(msg.get("source_topic", msg.get("mechanism"))), str(msg["attribute"]))] = msg
    out: list[dict[str, Any]] = []
    for (topic, attr), msg in sorted(latest.items()):
        truth = msg["truth"]
        if msg.get("type") == "frequency" and "frequencies" in truth:
            out.append({"topic": topic, "attribute": attr, "kind": "frequency", "categories": msg["categories"],
                        "estimated": msg["frequencies"], "true": truth["frequencies"],
                        "std_errors": msg.get("frequency_std_errors"), "epsilon": msg.get("epsilon")})
        elif msg.get("type") == "mean" and "mean" in truth:
            out.append({"topic": topic, "attribute": attr, "kind": "mean", "estimated": msg["mean"],
                        "true": truth["mean"], "std_error": msg.get("std_error"), "epsilon": msg.get("epsilon")})
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    return str(o)


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _side_summary_lines(side: dict[str, Any]) -> list[str]:
    """The demo summary's side-path lines (``side``: :meth:`SideStatus.summary`; none when the side paths were off)."""
    if not side:
        return []
    lines: list[str] = []
    eps = side.get("epsilon_per_record", {})
    pubs = side.get("published", {})
    lines.append("  side paths (local DP, independent consumer group):")
    for topic, e in eps.items():
        lines.append(f"    {topic:<18} eps per record {format_epsilon(e)}  messages {pubs.get(topic, 0):,}")
    skipped = side.get("skipped") or {}
    if skipped:
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(skipped.items()))
        why = (" (person_budget: refused by the lifetime cap's count-min sketch, which may refuse a record never seen;"
               " docs/side-paths.md \"Sizing\")" if "person_budget" in skipped else "")
        lines.append(f"    records without side copies: {reasons}{why}")
    if side.get("epsilon_all_side_topics"):
        window = side.get("epsilon_kmeans_window") or 0.0
        lines.append(f"    one record over all side outputs: eps {format_epsilon(side['epsilon_all_side_topics'])}"
                     + (f" (k-means: {format_epsilon(window)}, the one window it is in)" if window else ""))
    for name, est in sorted(side.get("estimates", {}).items()):
        err = est.get("abs_error")
        se = est.get("standard_error")
        lines.append(f"    estimate {name:<28} abs error {_fmt(err, 4)}  std error {_fmt(se, 4)}")
    if side.get("kmeans_windows"):
        budget = side.get("kmeans_budget")
        lines.append(f"    k-means windows released: {side['kmeans_windows']}" + (
            f"; lifetime budget used {format_epsilon(budget['used'])} of {format_epsilon(budget['total'])}"
            if budget else ""))
    if side.get("error"):
        lines.append(f"    side-path error: {side['error']}")
    return lines


def _print_summary(s: dict[str, Any], out_dir: Path) -> None:
    p = s["parameters"]
    d, pd_, lat = s["delay_arrivals"], s["delay_positions"], s["latency_seconds"]
    lines = [
        "",
        "stream-anon demo summary",
        f"  data:        {s['data_source']}",
        f"  parameters:  k={p['k']} delta={p['delta']} beta={p['beta']} mu={p['mu']} {p['algorithm']}/{p['loss']}"
        f" leftover={p['leftover']} partitions={p['partitions']}",
        f"  records:     in {s['records_in']:,}  released {s['records_released']:,}  suppressed "
        f"{s['records_suppressed']:,}  dead-lettered {s['records_dead_lettered']:,}  unaccounted "
        f"{s['records_unaccounted']:,}  duplicated {s['records_duplicated']:,}",
        f"  classes:     {s['classes']:,} (min size {s['k_anonymity']['min_class_size']}); k-anonymity"
        f"{' and l=' + str(s['k_anonymity']['l']) + '-diversity' if s['k_anonymity']['l'] else ''} "
        f"{'VERIFIED' if s['k_anonymity']['verified'] else 'VIOLATED'} by the independent checker"
        f"{' (with coverage of the originals)' if s['k_anonymity']['coverage_checked'] else ''}",
        f"  accounting:  {'every record accounted once in the ledger, every output published once' if s['accounting']['ok'] else 'NOT OK: ' + '; '.join(s['accounting']['problems'][:3])}",
        f"  loss:        GT {s['gt_loss']:.4f}  LM {s['lm_loss']:.3f} ({s['lm_loss_normalized']:.4f} per QI)",
        f"  delay:       arrivals p50 {_fmt(d.get('p50'), 0)} p99 {_fmt(d.get('p99'), 0)} max {_fmt(d.get('max'), 0)}"
        f" (partition positions max {_fmt(pd_.get('max'), 0)}); ingest-to-release seconds p50 "
        f"{_fmt(lat.get('p50'), 3)} p99 {_fmt(lat.get('p99'), 3)} max {_fmt(lat.get('max'), 3)}",
        f"  speed:       {s['records_in']:,} records replayed and released in {s['seconds_replay_to_all_released']:.1f} s"
        f" ({_fmt(s['records_per_second_end_to_end'], 0)} rec/s end to end); total {s['seconds_total']:.1f} s",
    ]
    lines.extend(_side_summary_lines(s.get("side_paths") or {}))
    lines.append(f"  run directory: {out_dir}  (summary.json, released.csv; `stream-anon report {out_dir}`)")
    print("\n".join(lines))
