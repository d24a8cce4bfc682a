"""Helpers of the issue-20 tests (tests/test_ops_*.py): the real commands as subprocesses, a user schema with an
ARX hierarchy, addresses that refuse or never answer, and deadline waits (never fixed sleeps)."""

from __future__ import annotations

import contextlib
import csv
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
QUIET_PORTS = ["--metrics-port", "0", "--set", "service.side_metrics_port=0"]  # hermetic: no fixed port
KAFKA_LOGGER_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (kafka|librdkafka)[.:]", re.M)


def env() -> dict[str, str]:
    """The environment of the subprocesses: this checkout first on the path."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def wait_until(what: str, predicate: Callable[[], Any], timeout_s: float, *, proc: Proc | None = None,
               step_s: float = 0.1) -> Any:
    """Poll ``predicate`` until it is truthy (returned) or ``timeout_s`` passes (assertion naming ``what``); a
    ``proc`` that ends meanwhile fails at once with its output."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.p.poll() is not None:
            raise AssertionError(f"{what}: the process ended (rc {proc.p.returncode}):\n{proc.text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s" + (f"\n{proc.text()[-3000:]}" if proc else ""))
        time.sleep(step_s)


def run_cli(*args: str, timeout: float = 120, module: str = "stream_anon", cwd: Path | None = None,
            **kw: Any) -> subprocess.CompletedProcess[str]:
    """``python -m stream_anon ARGS`` (or ``module``) to its end; stdout and stderr captured as text."""
    return subprocess.run([PY, "-m", module, *args], capture_output=True, text=True, timeout=timeout, env=env(),
                          cwd=cwd or ROOT, **kw)


@dataclass
class Proc:
    """A command running in the background, its output (stdout and stderr together) in ``log``."""

    p: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        self.p.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout=timeout)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)


def start_cli(log: Path, *args: str, module: str = "stream_anon", cwd: Path | None = None) -> Proc:
    out = open(log, "wb")  # noqa: SIM115 - the child writes it; closed with the process
    p = subprocess.Popen([PY, "-m", module, *args], stdout=out, stderr=subprocess.STDOUT, env=env(),
                         cwd=cwd or ROOT)
    return Proc(p, log)


@contextlib.contextmanager
def running(log: Path, *args: str, **kw: Any) -> Iterator[Proc]:
    proc = start_cli(log, *args, **kw)
    try:
        yield proc
    finally:
        proc.stop()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released: a connection there is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def silent_address() -> Iterator[tuple[str, int]]:
    """A loopback address that never answers: a listening socket whose one-entry accept queue is full, so the
    kernel drops further connection requests (the connecting socket stays in SYN_SENT until its timeout)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = int(srv.getsockname()[1])
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        yield f"127.0.0.1:{port}", port
    finally:
        filler.close()
        srv.close()


def connecting_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a TCP socket in SYN_SENT towards loopback ``port`` (it waits on a connect)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    except OSError:
        return False
    want = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) > 9 and cols[2] == want and cols[3] == "02" and cols[9] in inodes:
            return True
    return False


# ------------------------------------------------------------------------------------------------ a user schema
USER_SCHEMA = """\
name: visits
record_id: visit
person_id: patient
attributes:
  - {name: age, role: quasi_identifier, type: numeric, domain: [0, 120], integer: true, side_paths: [blap, kmeans],
     source: "the intake form: ages 0-120"}
  - {name: city, role: quasi_identifier, type: categorical, hierarchy: hierarchies/city.csv, side_paths: [krr]}
  - {name: diagnosis, role: sensitive, type: categorical, values: [flu, cold, asthma], side_paths: [blap]}
"""
CITY_HIERARCHY = """\
Lyon;FR;Europe;*
Paris;FR;Europe;*
Rome;IT;Europe;*
Milan;IT;Europe;*
Tokyo;JP;Asia;*
Osaka;JP;Asia;*
"""
CITIES = ("Lyon", "Paris", "Rome", "Milan", "Tokyo", "Osaka")


def user_schema(folder: Path, *, side_paths: bool = True) -> Path:
    """``visits.yaml`` (person id, a numeric and a categorical QI with an ARX hierarchy CSV beside it, a sensitive
    attribute; with ``side_paths`` the attributes declare side paths) in ``folder``; its path."""
    (folder / "hierarchies").mkdir(parents=True, exist_ok=True)
    (folder / "hierarchies" / "city.csv").write_text(CITY_HIERARCHY, encoding="utf-8")
    text = USER_SCHEMA if side_paths else re.sub(r",? side_paths: \[[a-z, ]+\]", "", USER_SCHEMA)
    path = folder / "visits.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def user_records(path: Path, n: int, seed: int = 7) -> Path:
    """``n`` visits (record id, patient id, age, city, diagnosis) as a CSV at ``path``."""
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["visit", "patient", "age", "city", "diagnosis"])
        for i in range(n):
            w.writerow([f"v{i}", f"p{rng.randrange(n * 2)}", rng.randrange(0, 121), rng.choice(CITIES),
                        rng.choice(("flu", "cold", "asthma"))])
    return path


def embedded_address(text: str) -> str | None:
    """The address of the embedded broker ``run`` started, from its output."""
    m = re.search(r"embedded Tansu broker on (127\.0\.0\.1:\d+)", text)
    return m.group(1) if m else None
