"""``scripts/profile_main_path.py summarize``: a py-spy raw profile split into the main path's thread and the pipeline
worker, the bench's waiting loop left out, shares of samples per entry (docs/service.md, "Where the time goes")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_main_path.py"
spec = importlib.util.spec_from_file_location("profile_main_path", SCRIPT)
assert spec is not None and spec.loader is not None
profile_main_path = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_main_path)

MAIN = 'process 1:"python run";thread (0x1):"Thread-1";run (threading.py:975);MainPath.run (/x/stream_anon/service/app.py:150)'
WORKER = 'process 1:"python run";process 2:"worker";_worker_main (/x/stream_anon/service/workers.py:230)'
BENCH = 'process 1:"python run";thread (0x2):"MainThread";main_path_run (/x/stream_anon/bench/service.py:240)'


def test_summary_splits_the_two_processes_and_leaves_out_the_bench(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "main.raw"
    raw.write_text("\n".join([
        f"{MAIN};MainLoop._loop (/x/stream_anon/service/loop.py:200);ConfluentPoller.poll "
        f"(/x/stream_anon/kafka_io/confluent_poller.py:190) 30",
        f"{MAIN};MainLoop._loop (/x/stream_anon/service/loop.py:200);LedgerOutbox.write "
        f"(/x/stream_anon/service/outbox.py:80) 10",
        f"{WORKER};Engine._best_selection (/x/stream_anon/core/engine/castle.py:295) 75",
        f"{WORKER};raw_decode (/usr/lib/python3.11/json/decoder.py:343) 25",
        f"{BENCH};MainPath.states (/x/stream_anon/service/app.py:125) 500",  # the bench's own loop: not counted
    ]) + "\n")
    assert profile_main_path.summarize(raw, top=5) == 0
    out = capsys.readouterr().out
    main_part, worker_part = out.split("pipeline worker process")
    assert "main process, main-path thread: 40 samples" in main_part
    assert "75.0 %  ConfluentPoller.poll (stream_anon/kafka_io/confluent_poller.py)" in main_part
    assert "25.0 %  LedgerOutbox.write (stream_anon/service/outbox.py)" in main_part
    assert ": 100 samples" in worker_part
    assert "75.0 %  Engine._best_selection (stream_anon/core/engine/castle.py)" in worker_part
    assert "25.0 %  raw_decode (json/decoder.py)" in worker_part
    assert "MainPath.states" not in out
