"""The side-path process: started non-daemonic, reports over its pipe, stopped explicitly, and gone when the
service that started it dies (real broker, real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from config_support import hermetic_config
from prometheus_client import CollectorRegistry
from waiting import wait_for

from stream_anon.config.settings import Config
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.runtime.supervisor import SidePaths

pytestmark = pytest.mark.integration


def _config(bootstrap: str) -> Config:
    tag = f"sup{uuid.uuid4().hex[:6]}"
    options: dict[str, Any] = {"kafka.group_id": f"{tag}-main", "kafka.session_timeout_ms": 6000}
    for name in ("input", "anon", "krr", "rs", "blap", "estimates", "kmeans", "dlq", "suppressed"):
        options[f"topics.{name}"] = f"{tag}.{name}"
    return hermetic_config(bootstrap, options)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its dead parent's reaper) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_side_process_reports_and_stops_when_asked(broker: Any) -> None:
    stop = threading.Event()
    side = SidePaths(_config(broker.bootstrap_servers), ServiceMetrics(CollectorRegistry()), stop)
    assert side.mode == "process" and side._process is not None
    assert side._process.daemon is False  # stopped explicitly, never by multiprocessing's daemon clean-up

    def reported() -> dict[str, Any] | None:
        summary = side.progress()
        return summary if summary is not None and summary["group_id"] else None

    summary = wait_for(reported, 60, "the side-path process to report its group", alive=lambda: side.alive)
    assert summary["group_id"].endswith("-main-ldp") and summary["error"] is None
    stop.set()
    final = side.stop(timeout=30)
    assert final is not None and final["error"] is None
    assert side.exit_code == 0 and not side.alive


PARENT = textwrap.dedent("""
    import sys, threading, time
    from prometheus_client import CollectorRegistry
    from stream_anon.config.settings import Config
    from stream_anon.metrics.definitions import ServiceMetrics
    from stream_anon.runtime.supervisor import SidePaths

    if __name__ == "__main__":
        cfg = Config.load(env={}, overrides={"kafka.bootstrap_servers": sys.argv[1], "service.side_metrics_port": 0,
                                             "kafka.group_id": sys.argv[2]})
        side = SidePaths(cfg, ServiceMetrics(CollectorRegistry()), threading.Event())
        print(side._process.pid, flush=True)
        time.sleep(600)
""")


@pytest.mark.timeout(120)
def test_side_process_stops_on_its_own_when_the_service_dies(broker: Any, tmp_path: Path) -> None:
    """kill -9 of the service: the side-path process sees its pipe close and exits (no orphan)."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), broker.bootstrap_servers, f"orphan{uuid.uuid4().hex[:6]}"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        time.sleep(2.0)  # let it start its clients (any moment would do)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: not _alive(child), 60, f"side-path process {child} to stop after its parent died")
    finally:
        if parent.poll() is None:
            parent.kill()
