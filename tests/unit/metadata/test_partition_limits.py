"""CreateTopics limits checked by the controller logic before any record is written: Kafka's topic-name
rules at 249 characters, partition directory names that must fit 255 bytes, ``max.partitions`` (the
cluster) and ``max.broker.partitions`` (one broker), the same for ``validate_only``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kraft.errors import ErrorCode, KraftError
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.metadata.topic_rules import (
    check_partition_dir_names,
    validate_topic_configs,
    validate_topic_name,
)
from kraft.v1 import controller_pb2 as cpb

CLUSTER = "c1"


def _logic(brokers: int = 3, **limits: Any) -> tuple[ControllerLogic, list[int]]:
    ids = (f"topic-{i}" for i in itertools.count())
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, **limits), MetadataImage.empty(), 0, new_topic_id=lambda: next(ids)
    )
    offset = [0]
    for broker_id in range(1, brokers + 1):
        out = logic.register_broker(
            cpb.RegisterBrokerRequest(
                cluster_id=CLUSTER, broker_id=broker_id, incarnation_id=f"i{broker_id}"
            ),
            0,
            offset[0],
        )
        offset[0] += len(out.records)
    for broker_id in range(1, brokers + 1):
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=logic.image.brokers[broker_id].epoch,
            current_metadata_offset=99,
        )
        offset[0] += len(logic.broker_heartbeat(beat, 0, offset[0]).records)
    return logic, offset


def _create(
    logic: ControllerLogic, offset: list[int], *topics: tuple[str, int, int], validate_only: bool = False
) -> tuple[list[cpb.CreatableTopicResult], int]:
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        validate_only=validate_only,
        topics=[cpb.CreatableTopic(name=n, num_partitions=p, replication_factor=rf) for n, p, rf in topics],
    )
    out = logic.create_topics(request, offset[0])
    offset[0] += len(out.records)
    return list(out.response.topics), len(out.records)


# --- names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "." * 3, "a" * 249, "A-z_0.9", "..a"])
def test_kafka_legal_names_are_accepted(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "a b", "a/b", "é", "a\x00"])
def test_kafka_illegal_names_are_refused(name: str) -> None:
    with pytest.raises(KraftError) as refused:
        validate_topic_name(name)
    assert refused.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION


def test_partition_ids_must_leave_the_directory_name_within_255_bytes() -> None:
    check_partition_dir_names("a" * 249, 100_000)  # last id 99999: "-99999" → 255 bytes
    with pytest.raises(KraftError) as refused:
        check_partition_dir_names("a" * 249, 100_001)
    assert refused.value.code is ErrorCode.INVALID_PARTITIONS
    assert "at most 100000 partitions" in refused.value.message
    check_partition_dir_names("a" * 248, 1_000_000)


def test_a_249_character_topic_is_created_and_too_many_partitions_for_it_are_refused() -> None:
    logic, offset = _logic(brokers=3, max_broker_partitions=1_000_000)
    (ok,), written = _create(logic, offset, ("x" * 249, 3, 3))
    assert ok.error_code == ErrorCode.NONE and written > 0
    (refused,), written = _create(logic, offset, ("y" * 249, 100_001, 1))
    assert refused.error_code == ErrorCode.INVALID_PARTITIONS and written == 0
    (too_long,), _ = _create(logic, offset, ("z" * 250, 1, 1))
    assert too_long.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_topic_config_integers_are_bounded_like_kafkas() -> None:
    assert validate_topic_configs([("max.message.bytes", "2147483647")], 1) == {
        "max.message.bytes": "2147483647"
    }
    for bad in ("2147483648", "-1", "1_000", " 5", "1e6"):
        with pytest.raises(KraftError) as refused:
            validate_topic_configs([("max.message.bytes", bad)], 1)
        assert refused.value.code is ErrorCode.INVALID_CONFIG


def test_unclean_leader_election_takes_a_boolean_on_a_topic() -> None:
    for value in ("false", "true", "TRUE"):
        assert validate_topic_configs([("unclean.leader.election.enable", value)], 1) == {
            "unclean.leader.election.enable": value
        }
    with pytest.raises(KraftError) as refused:
        validate_topic_configs([("unclean.leader.election.enable", "yes")], 1)
    assert refused.value.code is ErrorCode.INVALID_CONFIG
    assert "true or false" in refused.value.message


# --- partition limits -------------------------------------------------------------------------------------


def test_max_partitions_bounds_the_cluster_before_anything_is_written() -> None:
    logic, offset = _logic(brokers=3, max_partitions=10)
    (first,), _ = _create(logic, offset, ("a", 6, 1))
    assert first.error_code == ErrorCode.NONE
    (at_limit, over), written = _create(logic, offset, ("b", 4, 3), ("c", 1, 1))
    assert at_limit.error_code == ErrorCode.NONE
    assert over.error_code == ErrorCode.POLICY_VIOLATION
    assert (
        "max.partitions=10" in over.error_message
        and "add 1 partitions to the cluster's 10" in over.error_message
    )
    assert logic.image.partition_count() == 10 and logic.image.topic("c") is None and written > 0


def test_max_broker_partitions_bounds_each_broker() -> None:
    logic, offset = _logic(brokers=3, max_broker_partitions=4)
    (ok,), _ = _create(logic, offset, ("a", 6, 2))  # 12 replicas over 3 brokers: 4 each
    assert ok.error_code == ErrorCode.NONE
    (refused,), written = _create(logic, offset, ("b", 1, 1))
    assert refused.error_code == ErrorCode.POLICY_VIOLATION and written == 0
    assert "max.broker.partitions=4" in refused.error_message and "hosts 4" in refused.error_message
    assert logic.image.topic("b") is None


def test_the_reported_overload_is_refused_with_the_limit_and_the_request() -> None:
    """``topic create -p 100000 -r 1`` on 3 brokers took every broker down (Too many open files)."""
    logic, offset = _logic(brokers=3)
    (refused,), written = _create(logic, offset, ("big", 100_000, 1))
    assert refused.error_code == ErrorCode.POLICY_VIOLATION and written == 0
    assert "max.broker.partitions=10000" in refused.error_message
    assert "33334 partition replicas" in refused.error_message


def test_validate_only_is_bounded_the_same_way_and_counts_earlier_topics_of_the_request() -> None:
    logic, offset = _logic(brokers=2, max_broker_partitions=5)
    (a, b), written = _create(logic, offset, ("a", 5, 2), ("b", 1, 1), validate_only=True)
    assert a.error_code == ErrorCode.NONE and b.error_code == ErrorCode.POLICY_VIOLATION and written == 0
    (real_a, real_b), written = _create(logic, offset, ("a", 5, 2), ("b", 1, 1))
    assert (real_a.error_code, real_b.error_code) == (ErrorCode.NONE, ErrorCode.POLICY_VIOLATION)
    assert written > 0 and logic.image.topic("b") is None


def test_explicit_assignments_count_against_the_named_brokers() -> None:
    logic, offset = _logic(brokers=3, max_broker_partitions=2)
    topic = cpb.CreatableTopic(
        name="pinned",
        num_partitions=-1,
        replication_factor=-1,
        assignments=[cpb.ReplicaAssignment(partition=p, broker_ids=[1]) for p in range(3)],
    )
    out = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), offset[0])
    assert out.records == [] and out.response.topics[0].error_code == ErrorCode.POLICY_VIOLATION
    assert "broker 1" in out.response.topics[0].error_message


def test_a_partition_count_out_of_range_is_invalid_partitions_not_a_policy_violation() -> None:
    logic, offset = _logic(brokers=3)
    (refused,), written = _create(logic, offset, ("many", 2_000_000, 1))
    assert refused.error_code == ErrorCode.INVALID_PARTITIONS and written == 0
