"""How the service creates its topics on a cluster (issue 17): the replication factor follows the cluster's broker
count up to 3, ``min.insync.replicas`` 2 goes with 3 or more replicas, the ledger is compacted, and explicit options
win (docs/deploy.md, "On a replicated cluster").  The topics created on three real nodes are checked in
tests/test_apache_kafka_cluster_faults.py."""

from __future__ import annotations

import pytest

from stream_anon.config.settings import Config, ConfigError


def test_the_replication_factor_follows_the_cluster_up_to_three() -> None:
    layout = Config.load(env={}).topics.layout()
    assert [layout.replication(n) for n in (0, 1, 2, 3, 5)] == [1, 1, 2, 3, 3]
    fixed = Config.load(env={}, overrides={"topics.replication_factor": 2}).topics.layout()
    assert fixed.replication(5) == 2 and fixed.replication(1) == 2  # given: used as it is (a smaller cluster refuses)


def test_min_insync_replicas_two_with_three_replicas_and_never_above_the_replication() -> None:
    layout = Config.load(env={}).topics.layout()
    assert layout.replication_config(1) == {} and layout.replication_config(2) == {}  # the broker's default
    assert layout.replication_config(3) == {"min.insync.replicas": "2"}
    given = Config.load(env={}, overrides={"topics.replication_factor": 3, "topics.min_insync_replicas": 3})
    assert given.topics.layout().replication_config(3) == {"min.insync.replicas": "3"}
    two = Config.load(env={}, overrides={"topics.min_insync_replicas": 2}).topics.layout()
    assert two.replication_config(2) == {"min.insync.replicas": "2"} and two.replication_config(1) == {}


def test_the_ledger_is_created_compacted_and_replicated_the_outputs_replicated_only() -> None:
    topics = Config.load(env={}, overrides={"topics.input": "x.raw"}).topics
    layout = topics.layout()
    assert layout.topic_config("x.raw.ledger", 3) == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    assert layout.topic_config("x.anon", 3) == {"min.insync.replicas": "2"}
    assert layout.topic_config("x.anon", 1) == {}


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"topics.replication_factor": 0}, "topics.replication_factor"),
    ({"topics.replication_factor": 2, "topics.min_insync_replicas": 3}, "topics.min_insync_replicas"),
    ({"topics.min_insync_replicas": 0}, "topics.min_insync_replicas"),
])
def test_impossible_replication_options_are_refused_naming_the_option(overrides: dict[str, int], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config.load(env={}, overrides=overrides)
