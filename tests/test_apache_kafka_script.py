"""``scripts/apache_kafka.py`` itself: the command line (fetch from the cache without Maven, start prints a bootstrap
address that serves, status, stop leaves no process), and no orphan JVM when the Python process that started a
cluster is killed with ``kill -9``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apache_kafka_support import PROJECT_ROOT
from durable_broker import child_env, pid_alive
from kafka import KafkaAdminClient

SCRIPT = str(PROJECT_ROOT / "scripts" / "apache_kafka.py")


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or child_env())


def wait_dead(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_fetch_start_status_stop_from_the_command_line(tmp_path: Path) -> None:
    fetched = run("fetch")
    assert fetched.returncode == 0, fetched.stderr
    no_maven = {**child_env(), "PATH": "/nonexistent"}  # cached: the second fetch needs neither Maven nor network
    again = subprocess.run([sys.executable, SCRIPT, "fetch"], capture_output=True, text=True, timeout=60, env=no_maven)
    assert again.returncode == 0 and "jars in" in again.stdout, again.stderr
    archive = fetched.stdout.split("class-data archive: ", 1)[1].split(" (", 1)[0]
    assert archive.endswith(".jsa") and Path(archive).is_file(), fetched.stdout  # made once, for this JDK
    run_dir = tmp_path / "run"
    started = run("start", "--dir", str(run_dir), "--jvm", "light")
    pids: list[int] = []
    try:
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip()
        assert bootstrap.startswith("127.0.0.1:") and "ready in" in started.stderr
        state = json.loads((run_dir / "state.json").read_text())
        pids = [m["pid"] for m in state["members"]]
        assert state["bootstrap_servers"] == bootstrap and all(pid_alive(p) for p in pids)
        assert os.getpgid(pids[0]) == pids[0]  # its own process group
        maps = Path(f"/proc/{pids[0]}/maps").read_text()
        assert str(Path(archive).resolve()) in maps, "the node did not map the class-data archive"
        assert "-XX:TieredStopAtLevel=1" in Path(f"/proc/{pids[0]}/cmdline").read_text().split("\0")
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        assert admin.describe_cluster()["brokers"]
        admin.close()
        status = run("status", "--dir", str(run_dir))
        assert status.returncode == 0 and f"bootstrap: {bootstrap}" in status.stdout
        assert run("start", "--dir", str(run_dir)).returncode == 1  # already running: refused
        stopped = run("stop", "--dir", str(run_dir), "--timeout", "30")
        assert stopped.returncode == 0 and "stopped 1 node(s)" in stopped.stderr
        assert wait_dead(pids, 5)
        assert run("status", "--dir", str(run_dir)).returncode == 1
    finally:
        for p in pids:
            if pid_alive(p):
                os.killpg(p, signal.SIGKILL)


STARTER = """
import json, sys, signal
sys.path.insert(0, sys.argv[1])
from apache_kafka import KafkaCluster
from pathlib import Path
c = KafkaCluster(Path(sys.argv[2]), nodes=1)
c.start()
print(json.dumps({"pids": [n.pid for n in c.members.values()]}), flush=True)
signal.pause()
"""


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_kill_9_of_the_starting_process_takes_its_nodes_down(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", STARTER, str(PROJECT_ROOT / "scripts"), str(tmp_path / "c")],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the starter exited with {proc.wait()}"
        pids = json.loads(line)["pids"]
        assert all(pid_alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_dead(pids, 60), "a Kafka node outlived the process that started it"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in pids:
            if pid_alive(p):
                os.killpg(p, signal.SIGKILL)
