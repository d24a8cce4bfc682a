"""``bench service``'s machine-wide CPU accounting (:func:`stream_anon.bench.service.machine_busy_seconds` and
:func:`~stream_anon.bench.service.machine_figures`): what a run cost the whole machine, the broker included."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stream_anon.bench.service import machine_busy_seconds, machine_figures


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine-wide figures read Linux's /proc/stat")
def test_the_machine_busy_time_counts_this_processs_own_cpu_time() -> None:
    m0, c0 = machine_busy_seconds(), time.process_time()
    while time.process_time() - c0 < 0.3:  # burn 0.3 s of CPU (a deadline on CPU time, not on the wall clock)
        sum(range(1000))
    burned = time.process_time() - c0
    busy = machine_busy_seconds() - m0
    # /proc/stat counts every process's time in clock ticks (10 ms): ours is in it, others can only add
    assert busy >= burned - 0.05


def test_machine_figures_are_cpu_per_record_busy_cores_and_the_ceiling() -> None:
    cpus = os.cpu_count() or 1
    m = machine_figures(records=10_000, seconds=2.0, busy_seconds=1.5)
    assert m["machine_cpu_us_per_record"] == pytest.approx(150.0)
    assert m["busy_cores"] == pytest.approx(0.75)
    assert m["cpu_ceiling_records_per_second"] == pytest.approx(cpus * 1e6 / 150.0)


def test_without_proc_stat_the_figures_say_nothing_rather_than_divide_by_zero() -> None:
    m = machine_figures(records=0, seconds=0.0, busy_seconds=0.0)
    assert m["machine_cpu_us_per_record"] == 0.0 and m["busy_cores"] == 0.0
    assert m["cpu_ceiling_records_per_second"] != m["cpu_ceiling_records_per_second"]  # nan


def test_a_latency_run_replays_its_length_at_its_rate_or_whole_passes() -> None:
    """``--latency-seconds`` at the run's rate: the first records of ADULT when fewer than a pass (a short run stays
    short), else whole passes of ADULT (32,561 records each)."""
    from stream_anon.bench.service import ADULT_RECORDS, latency_records

    assert latency_records(3511.2, 5) == (1, 17556, 17556)
    assert latency_records(3000, 10) == (1, 30000, 30000)
    assert latency_records(8000, 10) == (3, None, 3 * ADULT_RECORDS)
    assert latency_records(0.1, 1) == (1, 1, 1)
