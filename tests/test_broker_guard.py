"""The broker data-loss signals (``stream_anon.service.broker_guard``): pure comparisons, and the metadata view of
a real broker before and after a memory-storage restart."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError

from stream_anon.config.settings import Config
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.service.broker_guard import (
    BrokerDataLossError,
    BrokerGuard,
    OffsetFloors,
    TopicState,
    compare_topics,
)


def test_compare_topics_names_a_gone_recreated_or_resized_topic_and_nothing_else() -> None:
    before = {"a": TopicState("id-a", 2), "b": TopicState("id-b", 2), "c": TopicState("id-c", 2),
              "d": TopicState("id-d", 2), "e": TopicState(None, 2)}
    now: dict[str, TopicState | None] = {"a": TopicState("id-a", 2), "b": None, "c": TopicState("id-x", 4),
                                         "d": TopicState("id-d", 3), "e": TopicState("id-e", 2)}
    assert compare_topics(before, now) == [
        "topic b is gone",
        "topic c was recreated (topic id id-c -> id-x, 2 -> 4 partitions)",
        "topic d has 3 partitions, 2 at start",
    ]  # a: unchanged; e: no id known at start, same partitions
    assert compare_topics(before, {}) == []  # not asked: not checked


def test_offset_floors_never_go_down_and_flag_a_highwater_below_them() -> None:
    floors = OffsetFloors()
    floors.raise_to("in", 0, 100, "committed")
    floors.raise_to("in", 0, 40, "committed")  # an older commit: the floor stays
    assert floors.floor("in", 0) == 100 and floors.floor("in", 1) is None
    assert floors.check("in", 0, 100) is None and floors.check("in", 0, None) is None
    assert floors.check("in", 1, 0) is None
    assert floors.check("in", 0, 99) == ("in[0] ends at offset 99, below offset 100 this service committed: records "
                                         "the broker had are gone")


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_the_guard_sees_a_memory_broker_restart_and_not_an_unreachable_broker(tmp_path: Any) -> None:
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        bs = broker.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic("g.in", 2, 1), NewTopic("g.out", 2, 1)])
        admin.close()
        cfg = Config.load(env={}, overrides={"kafka.bootstrap_servers": bs, "kafka.request_timeout_ms": 2000,
                                             "kafka.connect_timeout_ms": 1000})
        guard = BrokerGuard(cfg, ["g.in", "g.out"])
        guard.start()
        assert set(guard.baseline) == {"g.in", "g.out"} and all(s.partitions == 2 for s in guard.baseline.values())
        assert guard.check_topics() is None
        broker.stop()
        assert isinstance(guard.check_topics(), (KafkaError, OSError))  # unreachable: an outage, not a loss
        broker.start()  # memory storage: everything is gone
        with pytest.raises(BrokerDataLossError, match="topic g.in is gone; topic g.out is gone"):
            guard.check_topics()
        guard.close()
