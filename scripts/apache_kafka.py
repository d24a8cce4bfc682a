#!/usr/bin/env python3
"""Apache Kafka (KRaft) from Maven Central as a test and run target: fetch, start, stop, status.

    python scripts/apache_kafka.py fetch                 # resolve the pinned release into the cache (idempotent),
                                                         # and make its class-data archive for this JDK
    python scripts/apache_kafka.py start [--nodes 3]     # format + start; prints the bootstrap address
    python scripts/apache_kafka.py status                # the nodes of the last start, alive or not
    python scripts/apache_kafka.py stop                  # SIGTERM, SIGKILL after a bounded wait; no orphans

**Release.**  :data:`KAFKA_VERSION` of ``org.apache.kafka:kafka_2.13`` and its runtime dependencies (plus the
Log4j 2 binding of SLF4J, which the broker's POM leaves to the distribution) are copied by Maven
(``mvn dependency:copy-dependencies`` on a generated throwaway ``pom.xml``) into
``<cache>/<version>/libs`` (default cache ``.cache/apache-kafka`` under the project, gitignored; ``--cache-dir``
or ``$STREAM_ANON_KAFKA_CACHE``).  Once there, nothing is downloaded again (a ``.complete`` marker lists the jars),
so tests run offline; Maven's own ``~/.m2`` also keeps the artifacts.

**Nodes.**  One combined broker/controller, or a cluster of three (each broker + controller, static voter list,
``default.replication.factor=3``, ``min.insync.replicas=2``, unclean leader election off), every listener on a
free loopback port chosen at start (never a fixed one), KRaft storage formatted once per node, a Log4j 2
configuration that logs to ``<node>/server.log`` (the JVM's own output goes to ``<node>/stdout.log``), a 512 MiB
heap per node and ``group.initial.rebalance.delay.ms=0``.  The JVMs map a class-data archive of the broker's
classes made once per JDK (:func:`class_archive`, in the cache) and run ``kafka-run-class.sh``'s options, or
the ``light`` profile (``--jvm light``, the tests': cheaper to start on two cores, :data:`JVM_PROFILES`).  Each
JVM runs in its own session (own process group): a Ctrl-C in the starter's terminal does not reach it, and
``stop`` signals the whole group.  The command line writes ``<dir>/state.json`` (pids, ports, bootstrap address)
so that ``stop`` and ``status`` find the nodes.

**As a module** (the tests, ``tests/apache_kafka_support.py``)::

    with KafkaCluster(tmp_path / "kafka", nodes=3) as cluster:   # fetch + format + start + wait until ready
        cluster.bootstrap_servers                                # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
        leader = cluster.leader_of("t", 0)                       # node id leading t[0]
        cluster.kill(leader); cluster.start_node(leader)         # kill -9, start again on the same storage
        cluster.restart_node(leader)                             # the same in one call (returns seconds to ready)
        with cluster.frozen(leader): ...                         # SIGSTOP ... SIGCONT
        cluster.stop_node(2); cluster.wipe_node(2); cluster.start_node(2)   # a node back with empty storage
        cluster.wait_in_sync(["t"])                              # every replica back in the ISR

Started from the main thread, the JVMs of a module user also get SIGTERM when that thread dies
(``PR_SET_PDEATHSIG``, Linux), so a ``kill -9`` of a test run leaves no broker behind.  Waits poll with a
deadline (metadata, a produce to a readiness topic); nothing sleeps for a fixed time to "let it start".
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KAFKA_VERSION = "4.4.0"
"""The pinned Apache Kafka release (``org.apache.kafka:kafka_2.13``), the newest 4.x on Maven Central here."""
SCALA_VERSION = "2.13"
LOG4J_SLF4J_VERSION = "2.25.5"
"""``log4j-slf4j-impl`` (SLF4J 1.x -> Log4j 2): the version of the ``log4j-core`` the broker's POM brings."""
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = PROJECT_ROOT / ".cache" / "apache-kafka"
DEFAULT_RUN_DIR = DEFAULT_CACHE / "run"
CACHE_ENV = "STREAM_ANON_KAFKA_CACHE"
HEAP_MB = 512
READY_TOPIC = "__stream_anon_ready"
JVM_OPTS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true")
"""What ``bin/kafka-run-class.sh`` passes (its ``KAFKA_JVM_PERFORMANCE_OPTS``), without the GC log."""
JVM_PROFILES: dict[str, tuple[str, ...]] = {
    "server": JVM_OPTS,
    "light": ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Djava.awt.headless=true"),
}
"""``server``: :data:`JVM_OPTS` (G1, both JIT compilers: the broker's best steady state).  ``light``: the client
compiler only and the serial collector, for a small machine where starting costs more than serving (the tests).
Without the class-data archive a node took 5.3 s of CPU to be ready instead of 9.1 s, idled at 1.4 s of CPU per
30 s instead of 1.8 s and spent 0.8 s instead of 1.4 s on 20,000 records produced and consumed (measured by
``python scripts/kafka_start_cost.py --no-class-data``).  Either maps the class-data archive (:func:`class_archive`)."""

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class KafkaSetupError(RuntimeError):
    """Java or Maven missing, the release could not be resolved, or a node did not start (the message says
    which, with the log to read)."""


# ------------------------------------------------------------------------------------------------ fetch
def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Flag beats environment variable beats the default (``.cache/apache-kafka`` under the project)."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else DEFAULT_CACHE


POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.stream-anon</groupId>
  <artifactId>apache-kafka-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def fetch(version: str = KAFKA_VERSION, cache_dir: str | Path | None = None, *, quiet: bool = True) -> Path:
    """The folder of the release's jars, resolving them with Maven first if they are not cached yet
    (idempotent; concurrent callers wait on a file lock).  Raises :class:`KafkaSetupError`."""
    root = cache_root(cache_dir) / version
    libs = root / "libs"
    marker = libs / ".complete"
    if marker.is_file():
        return libs
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaSetupError("mvn not found: install Maven (Debian: apt-get install maven; scripts/test.sh "
                                  "does it as root) to resolve Apache Kafka from Maven Central")
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=root))
        try:
            (work / "pom.xml").write_text(POM.format(scala=SCALA_VERSION, version=version, log4j=LOG4J_SLF4J_VERSION))
            cmd = [mvn, "-B", *(["-q"] if quiet else []), "-f", str(work / "pom.xml"),
                   f"{DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
                   f"-DoutputDirectory={work / 'libs'}"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:  # no network: everything may still be in ~/.m2
                offline = subprocess.run([*cmd[:2], "-o", *cmd[2:]], capture_output=True, text=True)
                if offline.returncode != 0:
                    raise KafkaSetupError(f"resolving org.apache.kafka:kafka_{SCALA_VERSION}:{version} failed "
                                          f"(exit {res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}")
            jars = sorted(p.name for p in (work / "libs").glob("*.jar"))
            if f"kafka_{SCALA_VERSION}-{version}.jar" not in jars:
                raise KafkaSetupError(f"Maven resolved {len(jars)} jars without kafka_{SCALA_VERSION}-{version}.jar")
            (work / "libs" / ".complete").write_text("\n".join(jars) + "\n")
            if libs.exists():
                shutil.rmtree(libs)
            (work / "libs").rename(libs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH (Kafka 4.x needs Java 17 or newer)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaSetupError("java not found: install a Java 17+ runtime (Debian: apt-get install "
                              "openjdk-17-jre-headless; scripts/test.sh does it as root)")
    return java


# ------------------------------------------------------------------------------------------------ class data
def class_archive_path(libs: Path, java: str) -> Path:
    """Where the release's class-data archive for this JDK lives: beside ``libs``, named after the JDK (its
    resolved ``java`` and the size and time of its ``libjvm.so``), so that another JDK makes its own."""
    real = Path(java).resolve()
    jvm = real.parent.parent / "lib" / "server" / "libjvm.so"
    st = (jvm if jvm.is_file() else real).stat()
    tag = hashlib.sha256(f"{real}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return libs.parent / f"classes-{tag}.jsa"


def class_archive(libs: Path, version: str = KAFKA_VERSION, *, timeout_s: float = 180.0) -> Path | None:
    """The dynamic class-data archive (AppCDS, JEP 350) of the broker's classes for this JDK, made once if absent
    (concurrent callers wait on a file lock): a one-node broker of its own starts with
    ``-XX:ArchiveClassesAtExit``, takes the readiness produce and stops (SIGTERM: the JVM writes the archive as it
    exits).  Nodes started with it load the classes mapped from it instead of parsing and verifying every jar
    again: a ``light`` node was ready in 3.3 s instead of 7.5 s after 2.9 s of CPU instead of 5.3 s, its storage
    format took 1.3 s of CPU instead of 2.1 s (``python scripts/kafka_start_cost.py``).  None when it cannot be
    made: the reason stays in ``<archive>.failed`` (delete it to try again) and nodes start without it; a JVM also
    ignores an archive that does not match it (``-Xshare:auto``)."""
    path = class_archive_path(libs, java_binary())
    failed = path.with_suffix(".failed")
    if path.is_file():
        return path
    if failed.is_file():
        return None
    with open(libs.parent / ".cds.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        if failed.is_file():
            return None
        with tempfile.TemporaryDirectory(prefix="cds-", dir=libs.parent) as tmp:
            part = Path(tmp) / "classes.jsa"
            node = KafkaCluster(Path(tmp) / "node", nodes=1, version=version, cache_dir=libs.parent.parent,
                                jvm="light", class_data=False, jvm_extra=(f"-XX:ArchiveClassesAtExit={part}",))
            try:
                node.start(timeout_s)
            except KafkaSetupError as e:
                failed.write_text(f"the archiving node did not start: {e}\n")
                return None
            finally:
                node.stop(timeout_s=60)
            if not part.is_file() or part.stat().st_size == 0:
                out = Path(tmp) / "node" / "node-1" / "stdout.log"
                failed.write_text("the JVM wrote no archive at exit:\n" +
                                  (out.read_text(errors="replace")[-3000:] if out.is_file() else "") + "\n")
                return None
            os.replace(part, path)
    return path


# ------------------------------------------------------------------------------------------------ nodes
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_cluster_id() -> str:
    """A Kafka ``Uuid`` in its base64url form, as ``kafka-storage.sh random-uuid`` prints (no JVM needed).  Like
    Kafka's ``Uuid.randomUuid()``, never one starting with ``-``: the storage tool's argument parser would read it
    as an option (1 start in 64 failed with "argument --cluster-id/-t: expected one argument")."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _die_with_parent() -> None:  # preexec_fn: SIGTERM when the starting thread dies
    parent = os.getppid()
    assert _LIBC is not None
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != b"Z"


LOG4J2 = """status = warn
name = kafka
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass
class KafkaNode:
    """One combined broker/controller: its id, ports and folder (``data/`` is its ``log.dirs``)."""

    node_id: int
    port: int
    controller_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # also set for a node found through the state file (no Popen)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None or not pid_alive(self.pid):
            return False
        try:  # a pid from the state file: only if it is still this node's JVM (pids are reused)
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.dir / "server.properties").encode() in cmdline


@dataclass
class KafkaCluster:
    """One or three Apache Kafka nodes (KRaft, every node broker + controller) under ``base_dir``.

    ``extra_config`` adds or overrides ``server.properties`` lines of every node (e.g. ``log.cleaner.backoff.ms``).
    ``die_with_parent``: the JVMs get SIGTERM when the starting thread dies (module use; the command line turns it
    off so that the nodes outlive ``start``).  ``jvm``: a key of :data:`JVM_PROFILES`; ``class_data``: map the
    class-data archive (:func:`class_archive`, made on the first start if absent); ``jvm_extra``: more JVM
    options for the nodes (not for the storage tool that formats them)."""

    base_dir: Path
    nodes: int = 1
    version: str = KAFKA_VERSION
    cache_dir: str | Path | None = None
    heap_mb: int = HEAP_MB
    extra_config: Mapping[str, str] = field(default_factory=dict)
    die_with_parent: bool = True
    jvm: str = "server"
    class_data: bool = True
    jvm_extra: tuple[str, ...] = ()
    cluster_id: str = field(default_factory=random_cluster_id)
    members: dict[int, KafkaNode] = field(default_factory=dict)
    libs: Path | None = None
    archive: Path | None = None  # the class-data archive the JVMs map (class_archive), once started
    started_in_s: float | None = None  # seconds from spawning the JVMs until ready (the last start)

    def __post_init__(self) -> None:
        if self.nodes not in (1, 3):
            raise ValueError(f"nodes: 1 or 3, got {self.nodes}")
        if self.jvm not in JVM_PROFILES:
            raise ValueError(f"jvm: one of {sorted(JVM_PROFILES)}, got {self.jvm!r}")
        self.base_dir = Path(self.base_dir)

    # ------------------------------------------------------------------ configuration
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.members.values())

    @property
    def state_path(self) -> Path:
        return self.base_dir / "state.json"

    def _plan(self) -> None:
        if self.members:
            return
        self.members = {i: KafkaNode(i, free_port(), free_port(), self.base_dir / f"node-{i}")
                        for i in range(1, self.nodes + 1)}

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        n = self.nodes
        rf, isr = ("3", "2") if n == 3 else ("1", "1")
        voters = ",".join(f"{m.node_id}@127.0.0.1:{m.controller_port}" for m in self.members.values())
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.data_dir),
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "5",  # 50 by default: slow to create on two cores
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),  # 128 MiB by default: a quarter of the heap
        }
        props.update({k: str(v) for k, v in self.extra_config.items()})
        return props

    def _write_config(self, node: KafkaNode) -> Path:
        node.dir.mkdir(parents=True, exist_ok=True)
        path = node.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties(node).items()))
        (node.dir / "log4j2.properties").write_text(LOG4J2.format(log=node.log_path))
        return path

    def _java(self, node: KafkaNode, main: str, *args: str) -> list[str]:
        assert self.libs is not None
        archive = (f"-XX:SharedArchiveFile={self.archive}",) if self.archive is not None else ()
        extra = self.jvm_extra if main == "kafka.Kafka" else ()  # the archiving node: not the format tool's classes
        return [java_binary(), f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", *JVM_PROFILES[self.jvm], *archive,
                *extra,
                f"-Dlog4j2.configurationFile={node.dir / 'log4j2.properties'}", f"-Dkafka.logs.dir={node.dir}",
                "-cp", f"{self.libs}/*", main, *args]

    def _format(self, nodes: Sequence[KafkaNode]) -> None:
        """``kafka-storage.sh format`` for each of ``nodes`` whose storage is not formatted (in parallel)."""
        procs = []
        for node in nodes:
            if (node.data_dir / "meta.properties").is_file():
                continue
            cfg = self._write_config(node)
            out = open(node.dir / "format.log", "wb")  # noqa: SIM115
            procs.append((node, out, subprocess.Popen(
                self._java(node, "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(cfg)),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)))
        for node, out, p in procs:
            rc = p.wait(timeout=300)
            out.close()
            if rc != 0:
                raise KafkaSetupError(f"formatting node {node.node_id} failed (exit {rc}): "
                                      f"{(node.dir / 'format.log').read_text(errors='replace')[-3000:]}")

    # ------------------------------------------------------------------ processes
    def _spawn(self, node: KafkaNode) -> None:
        cfg = self._write_config(node)
        main = threading.current_thread() is threading.main_thread()
        preexec = _die_with_parent if self.die_with_parent and main and _LIBC is not None else None
        with open(node.dir / "stdout.log", "ab") as out:
            node.proc = subprocess.Popen(self._java(node, "kafka.Kafka", str(cfg)), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=preexec)
        node.pid = node.proc.pid

    def start(self, timeout_s: float = 180.0, port_attempts: int = 3) -> float:
        """Fetch, format what is not formatted, start every node that is not running and wait until ready
        (:meth:`wait_ready`); returns the seconds from spawning the JVMs until ready.  A port taken by another
        process between choosing it and the JVM's bind (another test on this machine) is chosen again, up to
        ``port_attempts`` times (the ports live in ``server.properties`` only, not in the formatted storage)."""
        self.libs = fetch(self.version, self.cache_dir)
        if self.class_data and self.archive is None:
            self.archive = class_archive(self.libs, self.version)
        self._plan()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._format(list(self.members.values()))
        for attempt in range(1, port_attempts + 1):
            t0 = time.monotonic()
            for node in self.members.values():
                if not node.alive():
                    self._spawn(node)
            self.write_state()
            try:
                self.wait_ready(timeout_s)
            except KafkaSetupError:
                self.stop(timeout_s=10)
                if attempt == port_attempts or not self._port_taken():
                    raise
                self.members = {i: KafkaNode(i, free_port(), free_port(), n.dir) for i, n in self.members.items()}
                continue
            except BaseException:
                self.stop(timeout_s=10)
                raise
            self.started_in_s = time.monotonic() - t0
            return self.started_in_s
        raise AssertionError("unreachable")

    def _port_taken(self) -> bool:
        """Whether a node's start failed because its port was in use."""
        for n in self.members.values():
            out = n.dir / "stdout.log"
            text = (out.read_text(errors="replace") if out.exists() else "") + \
                (n.log_path.read_text(errors="replace") if n.log_path.exists() else "")
            if "Address already in use" in text:
                return True
        return False

    def node(self, node_id: int) -> KafkaNode:
        return self.members[node_id]

    def _signal(self, node: KafkaNode, sig: int) -> None:
        """``sig`` to the node's process group (its own session), falling back to the pid."""
        if node.pid is None:
            return
        try:
            os.killpg(node.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, sig)

    def _wait_exit(self, node: KafkaNode, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while node.alive():
            if time.monotonic() > deadline:
                return False
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=0.1)
            else:
                time.sleep(0.1)
        return True

    def kill(self, node_id: int) -> None:
        """``kill -9`` of one node (its data stays)."""
        node = self.members[node_id]
        self._signal(node, signal.SIGKILL)
        self._wait_exit(node, 30)

    def stop_node(self, node_id: int, timeout_s: float = 30.0) -> None:
        """SIGTERM (and SIGCONT, in case it is frozen), SIGKILL after ``timeout_s``."""
        self._stop_nodes([self.members[node_id]], timeout_s)

    def _stop_nodes(self, nodes: Sequence[KafkaNode], timeout_s: float) -> None:
        for node in nodes:
            if node.alive():
                self._signal(node, signal.SIGTERM)
                self._signal(node, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            if not self._wait_exit(node, max(0.0, deadline - time.monotonic())):
                self._signal(node, signal.SIGKILL)
                self._wait_exit(node, 30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every node (SIGTERM together, SIGKILL to those still running after ``timeout_s``)."""
        self._stop_nodes(list(self.members.values()), timeout_s)
        self.write_state()

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> float:
        """Start a stopped node on its storage (formatted anew if it was wiped) and wait until it is registered
        and serves metadata; returns the seconds from spawning it."""
        node = self.members[node_id]
        if node.alive():
            raise KafkaSetupError(f"node {node_id} is running")
        self._format([node])
        t0 = time.monotonic()
        self._spawn(node)
        self.write_state()
        self.wait_registered([node_id], timeout_s)
        return time.monotonic() - t0

    def restart_node(self, node_id: int, *, hard: bool = True, timeout_s: float = 120.0) -> float:
        """``kill -9`` (``hard``) or SIGTERM, then start again on the same storage; seconds to registered."""
        if hard:
            self.kill(node_id)
        else:
            self.stop_node(node_id)
        return self.start_node(node_id, timeout_s)

    def wipe_node(self, node_id: int) -> None:
        """Delete a stopped node's storage (the next :meth:`start_node` formats it with the same cluster id)."""
        node = self.members[node_id]
        if node.alive():
            raise KafkaSetupError(f"node {node_id} is running: stop or kill it first")
        shutil.rmtree(node.data_dir, ignore_errors=True)

    def freeze(self, node_id: int) -> None:
        self._signal(self.members[node_id], signal.SIGSTOP)

    def thaw(self, node_id: int) -> None:
        self._signal(self.members[node_id], signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self, node_id: int) -> Iterator[None]:
        """SIGSTOP the node for the block (a node that hangs), SIGCONT after it."""
        self.freeze(node_id)
        try:
            yield
        finally:
            self.thaw(node_id)

    # ------------------------------------------------------------------ readiness and metadata
    def _check_alive(self, node_ids: Sequence[int] | None = None) -> None:
        for i in node_ids or list(self.members):
            node = self.members[i]
            if not node.alive():
                rc = node.proc.poll() if node.proc is not None else None
                tail = (node.dir / "stdout.log").read_text(errors="replace")[-2000:] \
                    if (node.dir / "stdout.log").exists() else ""
                raise KafkaSetupError(f"node {i} exited (code {rc}); see {node.log_path}:\n{tail}")

    def _admin(self, servers: str | None = None, timeout_ms: int = 5000) -> Any:
        from kafka import KafkaAdminClient
        return KafkaAdminClient(bootstrap_servers=servers or self.bootstrap_servers, request_timeout_ms=timeout_ms,
                                bootstrap_timeout_ms=timeout_ms)

    def registered(self, servers: str | None = None) -> set[int]:
        """Node ids of the brokers the cluster lists as registered and not fenced (empty when nobody answers)."""
        from kafka.errors import KafkaError
        try:
            admin = self._admin(servers)
        except (KafkaError, OSError):
            return set()
        try:
            return {int(b["broker_id"]) for b in admin.describe_cluster()["brokers"] if not b.get("is_fenced")}
        except (KafkaError, OSError):
            return set()
        finally:
            admin.close()

    def wait_registered(self, node_ids: Sequence[int], timeout_s: float) -> None:
        """Until every node of ``node_ids`` answers metadata itself and every running node is registered."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive(node_ids)
            running = {i for i, n in self.members.items() if n.alive()}
            if all(running <= self.registered(self.members[i].address) for i in node_ids):
                return
            if time.monotonic() > deadline:
                raise KafkaSetupError(f"nodes {list(node_ids)} not registered after {timeout_s:.0f} s; see "
                                      f"{[str(self.members[i].log_path) for i in node_ids]}")
            time.sleep(0.2)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until every node is registered and a produce with ``acks=all`` to a topic replicated on every node
        (:data:`READY_TOPIC`, created here) is acknowledged."""
        from kafka import KafkaProducer
        from kafka.admin import NewTopic
        from kafka.errors import KafkaError, TopicAlreadyExistsError
        deadline = time.monotonic() + timeout_s
        self.wait_registered(list(self.members), timeout_s)
        last: BaseException | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                admin = self._admin()
                try:
                    with contextlib.suppress(TopicAlreadyExistsError):
                        admin.create_topics([NewTopic(READY_TOPIC, 1, self.nodes)])
                finally:
                    admin.close()
                producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, acks="all", retries=0,
                                         request_timeout_ms=5000, max_block_ms=5000)
                try:
                    producer.send(READY_TOPIC, b"ready").get(timeout=10)
                    return
                finally:
                    producer.close(timeout=5)
            except (KafkaError, OSError) as e:
                last = e
                time.sleep(0.2)
        raise KafkaSetupError(f"cluster not writable after {timeout_s:.0f} s (last error {last!r})")

    def describe(self, topic: str, servers: str | None = None) -> list[dict[str, Any]]:
        """The partitions of ``topic`` as the metadata (of ``servers``, default any node) describes them:
        ``partition``, ``leader`` (-1: none), ``replicas``, ``isr``, ``leader_epoch``, sorted by partition (empty:
        no such topic)."""
        admin = self._admin(servers)
        try:
            d = admin.describe_topics([topic])[0]
        finally:
            admin.close()
        return sorted(({"partition": int(p["partition_index"]), "leader": int(p["leader_id"]),
                        "replicas": list(p["replica_nodes"]), "isr": list(p["isr_nodes"]),
                        "leader_epoch": int(p["leader_epoch"])} for p in d.get("partitions") or []),
                      key=lambda p: p["partition"])

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``topic[partition]`` (-1: none, e.g. during an election)."""
        for p in self.describe(topic):
            if p["partition"] == partition:
                return int(p["leader"])
        raise KafkaSetupError(f"{topic}[{partition}] not found")

    def wait_in_sync(self, topics: Sequence[str], timeout_s: float = 120.0) -> None:
        """Until every partition of ``topics`` has a leader and all its replicas in the ISR, in the metadata of
        every running node (a topic just created reaches the other nodes' metadata a little later)."""
        from kafka.errors import KafkaError
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                views = [[p for t in topics for p in self.describe(t, n.address)]
                         for n in self.members.values() if n.alive()]
                if views and all(parts and len(parts) == len(views[0]) and all(
                        p["leader"] >= 0 and set(p["isr"]) == set(p["replicas"]) for p in parts) for parts in views):
                    return
            except (KafkaError, OSError, IndexError):
                pass
            if time.monotonic() > deadline:
                raise KafkaSetupError(f"{list(topics)} not in sync after {timeout_s:.0f} s")
            time.sleep(0.2)

    # ------------------------------------------------------------------ state file (the command line)
    def write_state(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        state = {"version": self.version, "cluster_id": self.cluster_id, "nodes": self.nodes,
                 "bootstrap_servers": self.bootstrap_servers,
                 "members": [{"node_id": n.node_id, "port": n.port, "controller_port": n.controller_port,
                              "dir": str(n.dir), "pid": n.pid if n.alive() else None}
                             for n in self.members.values()]}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1) + "\n")
        tmp.rename(self.state_path)

    @classmethod
    def from_state(cls, base_dir: Path) -> KafkaCluster:
        state = json.loads((Path(base_dir) / "state.json").read_text())
        c = cls(Path(base_dir), nodes=int(state["nodes"]), version=state["version"], die_with_parent=False,
                cluster_id=state["cluster_id"])
        c.members = {int(m["node_id"]): KafkaNode(int(m["node_id"]), int(m["port"]), int(m["controller_port"]),
                                                  Path(m["dir"]), pid=m["pid"]) for m in state["members"]}
        return c

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apache_kafka.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", help=f"where releases are cached (default: ${CACHE_ENV} or {DEFAULT_CACHE})")
    ap.add_argument("--version", default=KAFKA_VERSION, help="Apache Kafka release (default %(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="resolve the release's jars from Maven Central into the cache")
    for name in ("start", "stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR, help="nodes' folders and state.json "
                       "(default %(default)s)")
        if name == "start":
            p.add_argument("--nodes", type=int, choices=(1, 3), default=1)
            p.add_argument("--heap-mb", type=int, default=HEAP_MB)
            p.add_argument("--jvm", choices=sorted(JVM_PROFILES), default="server",
                           help="server: kafka-run-class's options (default); light: the client JIT and the serial "
                                "collector, cheaper to start on a small machine (what the tests use)")
            p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                           help="an extra server.properties line for every node (repeatable)")
            p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait until ready")
        if name == "stop":
            p.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "fetch":
            t0 = time.monotonic()
            libs = fetch(args.version, args.cache_dir, quiet=False)
            try:  # an optional speed-up: the jars are what fetch is for
                archive = class_archive(libs, args.version)
                made = f"{archive}" if archive else "none (the reason: <archive>.failed in the cache)"
            except KafkaSetupError as e:
                made = f"none ({e})"
            print(f"Apache Kafka {args.version}: {len(list(libs.glob('*.jar')))} jars in {libs}; class-data archive: "
                  f"{made} ({time.monotonic() - t0:.1f} s)")
            return 0
        if args.cmd == "start":
            return _start(args)
        if args.cmd == "stop":
            return _stop(args)
        return _status(args)
    except KafkaSetupError as e:
        print(f"apache_kafka.py: {e}", file=sys.stderr)
        return 1


def _start(args: argparse.Namespace) -> int:
    if (args.dir / "state.json").exists():
        old = KafkaCluster.from_state(args.dir)
        if any(n.alive() for n in old.members.values()):
            print(f"apache_kafka.py: already running ({old.bootstrap_servers}); stop it first", file=sys.stderr)
            return 1
        shutil.rmtree(args.dir)
    extra = dict(kv.split("=", 1) for kv in args.set)
    cluster = KafkaCluster(args.dir, nodes=args.nodes, version=args.version, cache_dir=args.cache_dir,
                           heap_mb=args.heap_mb, extra_config=extra, die_with_parent=False, jvm=args.jvm)
    seconds = cluster.start(args.timeout)
    print(f"Apache Kafka {cluster.version}, {cluster.nodes} node(s) ready in {seconds:.1f} s; logs in "
          f"{args.dir}/node-*/server.log", file=sys.stderr)
    print(cluster.bootstrap_servers)
    return 0


def _stop(args: argparse.Namespace) -> int:
    if not (args.dir / "state.json").exists():
        print(f"apache_kafka.py: nothing started in {args.dir}", file=sys.stderr)
        return 0
    cluster = KafkaCluster.from_state(args.dir)
    running = [n.node_id for n in cluster.members.values() if n.alive()]
    cluster.stop(args.timeout)
    print(f"stopped {len(running)} node(s) {running}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    if not (args.dir / "state.json").exists():
        print(f"nothing started in {args.dir}")
        return 1
    cluster = KafkaCluster.from_state(args.dir)
    for n in cluster.members.values():
        print(f"node {n.node_id}: {'running pid ' + str(n.pid) if n.alive() else 'stopped'}, {n.address}")
    alive = any(n.alive() for n in cluster.members.values())
    print(f"bootstrap: {cluster.bootstrap_servers}" if alive else "not running")
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
