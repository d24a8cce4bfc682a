"""Shared fixtures: the ADULT path (required, never skipped), a real Tansu broker per session, and a durable
Tansu broker (S3 storage on a private s3rver) per test for restart tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_anon.kafka_io.broker import EmbeddedBroker, S3rverNotFoundError, find_s3rver, node_binary

pytest_plugins = ["apache_kafka_support"]  # Apache Kafka fixtures: apache_kafka, kafka_cluster, any_broker (issue 17)


@pytest.fixture(scope="session")
def adult_path() -> Path:
    """The UCI ADULT file from $STREAM_ANON_ADULT (or ../shared); a missing file fails, it does not skip."""
    env = os.environ.get("STREAM_ANON_ADULT")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "datasets" / "adult" / "adult.data")
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"ADULT data not found: set STREAM_ANON_ADULT (tried {[str(c) for c in candidates]})")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A real Tansu broker (memory storage) on a free loopback port, shared by the session's tests."""
    log_path = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with EmbeddedBroker(log_path=log_path) as b:
        yield b


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A Tansu broker on S3 storage (a private s3rver with its files under ``tmp_path``) whose ``restart()`` (or a
    stop and a start) keeps topics, records and committed offsets.  No node or s3rver fails the test (never a
    skip): ``scripts/test.sh`` installs s3rver into ``.cache/npm``."""
    try:
        node_binary()
        find_s3rver()
    except S3rverNotFoundError as e:
        pytest.fail(str(e))
    with EmbeddedBroker(storage="s3", data_dir=tmp_path / "s3", log_path=tmp_path / "tansu.log") as b:
        yield b
