"""Issue 20, item 5: stops that say what they left.  The final line of ``run`` and ``demo`` gives consumed,
released, suppressed, dead-lettered and left for the next start, consistent with each other; with the embedded
in-memory broker it says those records are lost and how to keep them, and that the broker is gone; an interrupted
demo's run folder says so in its summary.json."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from pathlib import Path

import pytest
from ops_support import (
    KAFKA_LOGGER_LINE,
    QUIET_PORTS,
    embedded_address,
    run_cli,
    running,
    start_cli,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

from stream_anon.kafka_io.broker import free_port
from stream_anon.service.accounting import StopCounts, stop_line

N = 2500
STOP = re.compile(r"stopped: consumed ([\d,]+), released ([\d,]+), suppressed ([\d,]+), dead-lettered ([\d,]+), "
                  r"(?:skipped ([\d,]+) \(accounted by an earlier run\), )?left for the next start ([\d,]+) "
                  r"\(buffered, not yet released(; LOST with the embedded in-memory broker: to keep them, run against "
                  r"an external broker \(--bootstrap-servers\) or on durable storage, or end the input with an "
                  r"end-of-stream marker before stopping)?\)$")


def _num(text: str | None) -> int:
    return int((text or "0").replace(",", ""))


def _consumed(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "stream_anon_records_consumed_total":
                return s.value
    return 0.0


def test_the_stop_line_is_consistent_by_construction() -> None:
    c = StopCounts(consumed=1000, released=900, suppressed=20, dead_lettered=5, skipped=10, left=60)
    assert c.handed_over == 5
    line = stop_line(c, memory_broker=True)
    assert line.startswith("consumed 1,000, released 900, suppressed 20, dead-lettered 5, skipped 10 (accounted by "
                           "an earlier run), handed to other members at rebalances 5, left for the next start 60")
    assert "LOST with the embedded in-memory broker" in line
    quiet = stop_line(StopCounts(consumed=10, released=10, suppressed=0, dead_lettered=0, skipped=0, left=0),
                      memory_broker=True)
    assert quiet == "consumed 10, released 10, suppressed 0, dead-lettered 0, left for the next start 0 (buffered, " \
                    "not yet released)"  # nothing left: nothing lost


def _replay(bs: str, topic: str, n: int, *, flush: bool) -> None:
    out = run_cli("kafka", "--synthetic", str(n), "--seed", "3", "--topic", topic, "--bootstrap-servers", bs,
                  "--no-progress", *([] if flush else ["--no-flush"]), module="replay_tools", timeout=180)
    assert out.returncode == 0, out.stderr


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_run_with_its_embedded_broker_says_what_it_left_and_that_the_broker_is_gone(tmp_path: Path) -> None:
    port = free_port()
    args = ["run", "--metrics-port", str(port), "--set", "service.side_metrics_port=0", "--no-side-paths",
            "--idle-flush-seconds", "0"]  # no idle flush: what is buffered stays buffered
    with running(tmp_path / "run.log", *args) as run:
        bs = wait_until("the main path", lambda: embedded_address(run.text())
                        if "main path: consuming" in run.text() else None, 120, proc=run)
        _replay(bs, "adult.raw", N, flush=False)  # no end-of-stream marker: up to delta records stay buffered
        wait_until("every record consumed", lambda: _consumed(port) >= N, 120, proc=run)
        run.interrupt()
        assert run.wait(60) == 0, run.text()[-3000:]
    lines = [line for line in run.text().splitlines() if line.strip()]
    assert lines[-2] == (f"stream-anon run: the embedded broker {bs} is gone, with its topics: `stream-anon audit` "
                         f"cannot read them any more (audit while `run` runs, or run against an external broker with "
                         f"--bootstrap-servers)")
    m = STOP.search(lines[-1])
    assert m and lines[-1].startswith("stream-anon run: stopped: "), lines[-1]
    consumed, released, suppressed, dead, skipped, left = (_num(m.group(i)) for i in range(1, 7))
    assert consumed == N and skipped == 0 and dead == 0
    assert released + suppressed + left == consumed and 0 < left <= 1000  # at most delta records wait
    assert m.group(7), "the records left are lost with the in-memory broker: the line says so"
    assert "Traceback" not in run.text() and not KAFKA_LOGGER_LINE.search(run.text())


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_what_run_left_is_read_again_by_the_next_start(broker, tmp_path: Path) -> None:
    prefix = f"os{uuid.uuid4().hex[:6]}"
    bs, port = broker.bootstrap_servers, free_port()
    args = ["run", "--bootstrap-servers", bs, "--input-topic", f"{prefix}.raw", "--group-id", f"{prefix}-main",
            "--metrics-port", str(port), "--set", "service.side_metrics_port=0", "--no-side-paths",
            "--set", "kafka.session_timeout_ms=6000"]
    with running(tmp_path / "first.log", *args) as run:
        wait_until("the main path", lambda: "main path: consuming" in run.text(), 120, proc=run)
        _replay(bs, f"{prefix}.raw", N, flush=False)
        wait_until("every record consumed", lambda: _consumed(port) >= N, 120, proc=run)
        run.interrupt()
        assert run.wait(60) == 0, run.text()[-3000:]
    first = STOP.search(run.text().strip().splitlines()[-1])
    assert first and not first.group(7)  # an external broker keeps them: nothing is lost
    left = _num(first.group(6))
    assert left > 0 and _num(first.group(2)) + _num(first.group(3)) + left == N
    with running(tmp_path / "second.log", *args) as run2:
        wait_until("the main path again", lambda: "main path: consuming" in run2.text(), 120, proc=run2)
        marker = run_cli("flush", "--topic", f"{prefix}.raw", "--bootstrap-servers", bs, module="replay_tools")
        assert marker.returncode == 0, marker.stderr  # the end-of-stream marker only
        audit = ["audit", "--bootstrap-servers", bs, "--input-topic", f"{prefix}.raw"]
        wait_until("audit OK", lambda: run_cli(*audit).returncode == 0, 120, proc=run2, step_s=1.0)
        run2.interrupt()
        assert run2.wait(60) == 0, run2.text()[-3000:]
    second = STOP.search(run2.text().strip().splitlines()[-1])
    assert second, run2.text()[-2000:]
    consumed, released, suppressed, _dead, skipped, left2 = (_num(second.group(i)) for i in range(1, 7))
    # the next start read again from the committed watermark: the records left, and those after the watermark the
    # ledger already accounts for (skipped)
    assert left2 == 0 and released + suppressed == left and consumed == left + skipped


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_an_interrupted_demo_says_what_it_left_in_its_last_line_and_its_run_folder(adult_path: Path,
                                                                                  tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    demo = start_cli(tmp_path / "demo.log", "demo", "--adult", str(adult_path), "--run-dir", str(run_dir), "--rate",
                     "2000", *QUIET_PORTS)
    try:
        wait_until("records released", lambda: re.search(r"released \[[#.]+\] [1-9][\d,]*/", demo.text()), 300,
                   proc=demo, step_s=0.2)
        demo.interrupt()
        rc = demo.wait(60)
    finally:
        demo.stop()
    text = demo.text()
    assert rc == 1, text[-3000:]
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last.startswith("demo: stopped (a signal) before every record was released: consumed "), last
    m = STOP.search("stopped: " + last.split("released: ", 1)[1])
    assert m, last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["reason"] == "stopped (a signal)"
    assert summary["records_in"] == 32561 and summary["stop"] == last.split("released: ", 1)[1]
    assert summary["records_consumed"] == _num(m.group(1)) == (
        summary["records_released"] + summary["records_suppressed"] + summary["records_dead_lettered"]
        + summary["records_left_buffered"] + summary["records_handed_over"] + summary["records_skipped"])
    assert "\r" not in text  # the progress into a file: plain lines
    assert "Traceback" not in text and not KAFKA_LOGGER_LINE.search(text), text[-3000:]
    rep = run_cli("report", str(run_dir))
    assert rep.returncode == 2 and "required file released.csv is missing" in rep.stderr
