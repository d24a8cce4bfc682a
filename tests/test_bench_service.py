"""``stream-anon bench service`` end to end on a real broker: every phase runs and what it prints is what it measured.

One small run (ADULT once, one round, a short latency run) on the session's Tansu broker: the passthroughs of both
clients, the main path, the ratios, the latency runs with release ticks of 0 and of the default length, the engine
alone, the summary table and the JSON.  The figures themselves are the closing note's (an idle machine); here they
must only be consistent with each other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_anon.config.settings import DEFAULT_TICK_SECONDS
from stream_anon.kafka_io.broker import EmbeddedBroker

ADULT_RECORDS = 32561
# each latency run sends this many seconds of records at its rate: enough for records sent after the partitions'
# recovery (the steady state, which starts ~1-2 s into the run), fewer than ADULT (until 2026-11-28 the bench sent a
# whole pass for any length: 1 s took 9 s per run)
LATENCY_SECONDS = 5


@pytest.mark.integration
def test_bench_service_measures_every_phase_and_reports_it(broker: EmbeddedBroker, adult_path: Path,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "stream_anon", "bench", "service", "--bootstrap-servers", broker.bootstrap_servers,
         "--adult", str(adult_path), "--loops", "1", "--repeat", "1", "--latency-seconds", str(LATENCY_SECONDS), "--json", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (b,) = result["brokers"]
    rates = b["rates"]
    for key in ("main_path", "passthrough_kafka-python", "passthrough_confluent-kafka"):
        assert rates[key] > 0, key
    run = b["runs"][0]
    assert run["main_path"]["records"] == ADULT_RECORDS  # every record accounted: released + suppressed + dead
    assert run["main_path"]["released"] + run["main_path"]["suppressed"] == ADULT_RECORDS
    assert b["ratios"]["confluent-kafka"] == pytest.approx(
        rates["main_path"] / rates["passthrough_confluent-kafka"])
    # two latency runs: the path's own (ticks of 0) and the default ticks; the steady state is what was sent after
    # the partitions' recovery (most of the run), the start's wait is in the figures over all records
    lat, lat_default = b["latency"], b["latency_default_tick"]
    assert lat["tick_seconds"] == 0 and lat_default["tick_seconds"] == DEFAULT_TICK_SECONDS
    for one in (lat, lat_default):
        assert 0 < one["steady_records"] < ADULT_RECORDS
        assert 0 < one["publish_p50"] <= one["publish_p99"] <= one["publish_max"]
        assert one["publish_p99_all"] >= one["publish_p50_all"] > 0
        assert one["rate"] == pytest.approx(0.5 * rates["main_path"])
    # a class message leaves at the end of its tick: with the default ticks no record is published sooner than
    # its class's release, and the median wait includes part of a tick
    assert lat_default["publish_p50"] >= lat_default["p50"]
    assert result["engine_alone"]["records"] == ADULT_RECORDS and result["engine_alone"]["records_per_second"] > 0
    assert "| broker | passthrough kafka-python | passthrough confluent-kafka | main path |" in proc.stdout
    # what each run cost the whole machine (the broker included): at least what the bench's own processes took,
    # busy cores within the machine, and the ceiling is what that CPU per record allows on its cores
    cpus = result["cpus"]
    for key in ("main_path", "passthrough_kafka-python", "passthrough_confluent-kafka"):
        m = run[key]
        assert m["machine_cpu_us_per_record"] > 0, key
        assert 0 < m["busy_cores"] <= cpus * 1.05, key  # (jiffies: 10 ms steps)
        assert m["cpu_ceiling_records_per_second"] == pytest.approx(cpus * 1e6 / m["machine_cpu_us_per_record"])
        assert b["machine"][key]["machine_cpu_us_per_record"] == m["machine_cpu_us_per_record"]  # one round
    assert "| broker | passthrough kafka-python | passthrough confluent-kafka | main path | budget at 33,000/s |" \
        in proc.stdout
    assert f"(ticks {DEFAULT_TICK_SECONDS:g} s)" in proc.stdout
