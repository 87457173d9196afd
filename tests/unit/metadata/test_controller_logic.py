"""Table tests for the controller state machines: every broker lifecycle transition and every error."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest
from google.protobuf.message import Message

from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings, Outcome
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import NO_PARTITION_LEADER, BrokerRegistrationState, MetadataImage, TopicImage
from kraft.metadata.isr_changes import alter_partition
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

R = TypeVar("R", bound=Message)

CLUSTER = "cluster-A"
SESSION_MS = 9000


class Harness:
    """The logic plus a log: every outcome's records are appended at the offsets the logic chose."""

    def __init__(self) -> None:
        ids = (f"topic-{i}" for i in itertools.count())
        self.now_ms = 1_000
        self.logic = ControllerLogic(
            ControllerSettings(CLUSTER, session_timeout_ms=SESSION_MS, default_replication_factor=1),
            MetadataImage.empty(),
            self.now_ms,
            new_topic_id=lambda: next(ids),
        )
        self.next_offset = 0
        self.log: list[pb.MetadataRecord] = []
        self.commit(self.logic.bootstrap_records(self.next_offset))

    def commit(self, records: Sequence[pb.MetadataRecord]) -> None:
        """Append records, then the chunks of any broker still leaving its ISRs (as the shell does)."""
        self.log.extend(records)
        self.next_offset += len(records)
        while self.logic.has_bulk_jobs():
            more = self.logic.continue_bulk_jobs(self.next_offset)
            self.log.extend(more)
            self.next_offset += len(more)

    def run(self, outcome: Outcome[R]) -> R:
        if outcome.records:
            assert outcome.first_offset == self.next_offset
        self.commit(outcome.records)
        return outcome.response

    @property
    def image(self) -> MetadataImage:
        return self.logic.image

    def register(
        self, broker_id: int, incarnation: str = "", rack: str | None = None
    ) -> cpb.RegisterBrokerResponse:
        req = cpb.RegisterBrokerRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            incarnation_id=incarnation or f"inc-{broker_id}",
            listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
            log_dirs=["/data"],
        )
        if rack is not None:
            req.rack = rack
        out = self.logic.register_broker(req, self.now_ms, self.next_offset)
        return self.run(out)

    def heartbeat(
        self,
        broker_id: int,
        epoch: int | None = None,
        offset: int | None = None,
        want_fence: bool = False,
        want_shut_down: bool = False,
        offline: Sequence[tuple[str, int]] = (),
    ) -> cpb.BrokerHeartbeatResponse:
        broker = self.image.brokers.get(broker_id)
        req = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=epoch if epoch is not None else (broker.epoch if broker else 0),
            current_metadata_offset=offset if offset is not None else self.next_offset - 1,
            want_fence=want_fence,
            want_shut_down=want_shut_down,
        )
        if offline:
            req.offline_log_dirs.append("/data")
            for topic, partition in offline:
                req.offline_partitions.add(topic=topic, partition=partition)
        return self.run(self.logic.broker_heartbeat(req, self.now_ms, self.next_offset))

    def active_brokers(self, *ids: int) -> None:
        for broker_id in ids:
            self.register(broker_id, rack=f"r{broker_id % 3}")
        for broker_id in ids:
            assert not self.heartbeat(broker_id).is_fenced

    def topic(self, name: str) -> TopicImage:
        topic = self.image.topic(name)
        assert topic is not None
        return topic

    def create(
        self,
        name: str,
        partitions: int = 1,
        rf: int = 1,
        assignments: Sequence[cpb.ReplicaAssignment] = (),
        configs: Sequence[cpb.TopicConfig] = (),
    ) -> cpb.CreatableTopicResult:
        topic = cpb.CreatableTopic(
            name=name,
            num_partitions=partitions,
            replication_factor=rf,
            assignments=assignments,
            configs=configs,
        )
        response = self.run(
            self.logic.create_topics(
                cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), self.next_offset
            )
        )
        return response.topics[0]


@pytest.fixture
def h() -> Harness:
    return Harness()


# ---- registration ----


def test_registration_gets_the_offset_of_its_record_as_epoch_and_starts_fenced(h: Harness) -> None:
    expected = h.next_offset
    response = h.register(1)
    assert response.error_code == ErrorCode.NONE
    assert response.broker_epoch == expected
    assert h.log[expected].register_broker.broker_id == 1
    assert h.image.brokers[1].fenced


def test_same_incarnation_keeps_its_epoch_and_writes_nothing(h: Harness) -> None:
    first = h.register(1).broker_epoch
    before = h.next_offset
    assert h.register(1).broker_epoch == first
    assert h.next_offset == before


def test_different_incarnation_while_session_lives_is_a_duplicate(h: Harness) -> None:
    h.active_brokers(1)
    response = h.register(1, incarnation="other")
    assert response.error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION


def test_different_incarnation_after_session_expiry_replaces_the_registration(h: Harness) -> None:
    h.active_brokers(1)
    old = h.image.brokers[1].epoch
    h.now_ms += SESSION_MS + 1
    response = h.register(1, incarnation="other")
    assert response.error_code == ErrorCode.NONE and response.broker_epoch > old
    assert h.image.brokers[1].incarnation_id == "other" and h.image.brokers[1].fenced


def test_different_incarnation_of_a_fenced_broker_registers_at_once(h: Harness) -> None:
    h.register(1)
    assert h.register(1, incarnation="second").error_code == ErrorCode.NONE


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda r: setattr(r, "cluster_id", "other"), ErrorCode.INCONSISTENT_CLUSTER_ID),
        (lambda r: setattr(r, "incarnation_id", ""), ErrorCode.INVALID_REGISTRATION),
        (lambda r: r.log_dirs.append(""), ErrorCode.INVALID_REGISTRATION),
        (lambda r: setattr(r, "broker_id", -1), ErrorCode.INVALID_REQUEST),
        (lambda r: r.listeners.add(name="X", host="h", port=0), ErrorCode.INVALID_REGISTRATION),
        (
            lambda r: r.features.add(
                name="metadata.version", min_supported_version=5, max_supported_version=9
            ),
            ErrorCode.UNSUPPORTED_VERSION,
        ),
    ],
)
def test_bad_registrations_are_rejected_without_records(
    h: Harness, mutate: Callable[[cpb.RegisterBrokerRequest], object], code: ErrorCode
) -> None:
    req = cpb.RegisterBrokerRequest(cluster_id=CLUSTER, broker_id=1, incarnation_id="i", log_dirs=["/d"])
    mutate(req)
    out = h.logic.register_broker(req, h.now_ms, h.next_offset)
    assert out.response.error_code == code and out.response.error_message
    assert out.records == []


# ---- heartbeats: the transition table ----


def test_fenced_broker_is_unfenced_once_caught_up_to_its_registration(h: Harness) -> None:
    epoch = h.register(1).broker_epoch
    behind = h.heartbeat(1, offset=epoch - 1)
    assert behind.is_fenced and not behind.is_caught_up
    caught_up = h.heartbeat(1, offset=epoch)
    assert caught_up.is_caught_up and not caught_up.is_fenced
    assert not h.image.brokers[1].fenced


def test_fenced_broker_that_wants_fence_stays_fenced(h: Harness) -> None:
    h.register(1)
    assert h.heartbeat(1, want_fence=True).is_fenced
    assert h.image.brokers[1].fenced


def test_fenced_broker_that_wants_shutdown_is_told_to_shut_down(h: Harness) -> None:
    h.register(1)
    response = h.heartbeat(1, want_shut_down=True)
    assert response.should_shut_down and response.is_fenced


def test_unfenced_broker_that_wants_fence_is_fenced_and_leaves_isrs(h: Harness) -> None:
    h.active_brokers(1, 2)
    h.create("t", partitions=2, rf=2)
    assert h.heartbeat(1, want_fence=True).is_fenced
    topic = h.image.topic("t")
    assert topic is not None
    for partition in topic.partitions:
        assert partition.isr == (2,) and partition.leader == 2


def test_unfenced_broker_leading_nothing_shuts_down_now(h: Harness) -> None:
    h.active_brokers(1)
    response = h.heartbeat(1, want_shut_down=True)
    assert response.should_shut_down and response.is_fenced
    assert h.image.brokers[1].fenced


def test_controlled_shutdown_moves_leaderships_first_then_says_shut_down(h: Harness) -> None:
    h.active_brokers(1, 2, 3)
    h.create("t", partitions=6, rf=3)
    assert h.logic.leader_count(1) > 0
    first = h.heartbeat(1, want_shut_down=True)
    assert not first.should_shut_down and not first.is_fenced
    assert h.logic.leader_count(1) == 0
    assert h.image.brokers[1].in_controlled_shutdown
    assert h.logic.broker_state(h.image.brokers[1], h.now_ms) == BrokerRegistrationState.CONTROLLED_SHUTDOWN
    # the others have not reported the shutdown offset yet
    assert not h.heartbeat(1, want_shut_down=True).should_shut_down
    h.heartbeat(2)
    h.heartbeat(3)
    done = h.heartbeat(1, want_shut_down=True)
    assert done.should_shut_down and done.is_fenced


def test_operator_shutdown_of_an_active_broker_enters_controlled_shutdown(h: Harness) -> None:
    h.active_brokers(1, 2)
    h.create("t", partitions=4, rf=2)
    response = h.run(
        h.logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1), h.next_offset)
    )
    assert response.error_code == ErrorCode.NONE and response.leaderships_remaining == 0
    h.heartbeat(2)
    assert h.heartbeat(1).should_shut_down


def test_session_expiry_fences_one_broker_at_a_time(h: Harness) -> None:
    h.active_brokers(1, 2, 3)
    h.create("t", partitions=3, rf=3)
    h.now_ms += SESSION_MS // 2
    h.heartbeat(3)
    h.now_ms += SESSION_MS // 2 + 1
    fenced, records = h.logic.fence_expired(h.now_ms, h.next_offset)
    h.commit(records)
    assert fenced in (1, 2) and records
    second, records = h.logic.fence_expired(h.now_ms, h.next_offset)
    h.commit(records)
    assert {fenced, second} == {1, 2}
    assert h.logic.fence_expired(h.now_ms, h.next_offset) == (-1, [])
    topic = h.image.topic("t")
    assert topic is not None and all(p.leader == 3 and p.isr == (3,) for p in topic.partitions)
    assert h.logic.broker_state(h.image.brokers[1], h.now_ms) == BrokerRegistrationState.OFFLINE


def test_a_newly_active_controller_gives_every_broker_a_fresh_session(h: Harness) -> None:
    h.active_brokers(1)
    h.now_ms += SESSION_MS * 3
    h.logic.reset(h.image, h.now_ms)
    assert h.logic.fence_expired(h.now_ms, h.next_offset) == (-1, [])
    h.now_ms += SESSION_MS + 1
    assert h.logic.fence_expired(h.now_ms, h.next_offset)[0] == 1


@pytest.mark.parametrize(("epoch_delta", "broker_id"), [(-1, 1), (1, 1), (0, 42)])
def test_heartbeats_with_a_wrong_epoch_or_unknown_broker_are_stale(
    h: Harness, epoch_delta: int, broker_id: int
) -> None:
    h.active_brokers(1)
    response = h.heartbeat(broker_id, epoch=h.image.brokers[1].epoch + epoch_delta)
    assert response.error_code == ErrorCode.STALE_BROKER_EPOCH


def test_a_zombie_incarnation_is_rejected_by_epoch_after_re_registration(h: Harness) -> None:
    h.active_brokers(1)
    old_epoch = h.image.brokers[1].epoch
    h.now_ms += SESSION_MS + 1
    h.register(1, incarnation="new")
    assert h.heartbeat(1, epoch=old_epoch).error_code == ErrorCode.STALE_BROKER_EPOCH


def test_an_unfenced_broker_is_not_put_back_into_isrs_its_leader_adds_it(h: Harness) -> None:
    """Unfencing runs elections but adds nothing to ISRs: the replica may lack committed records, so only
    the partition leader's AlterPartition (once it caught up) brings it back (issue #16)."""
    h.active_brokers(1, 2)
    h.create("t", assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2])], partitions=-1, rf=-1)
    h.heartbeat(1, want_fence=True)
    partition = h.image.partition(h.image.topic_ids_by_name["t"], 0)
    assert partition is not None and partition.leader == 2 and partition.isr == (2,)
    epochs = (partition.leader_epoch, partition.partition_epoch)
    h.heartbeat(1)
    assert not h.image.brokers[1].fenced
    partition = h.image.partition(h.image.topic_ids_by_name["t"], 0)
    assert partition is not None and partition.leader == 2 and partition.isr == (2,)
    assert (partition.leader_epoch, partition.partition_epoch) == epochs
    expand = cpb.AlterPartitionRequest(
        cluster_id=CLUSTER,
        broker_id=2,
        broker_epoch=h.image.brokers[2].epoch,
        partitions=[
            cpb.AlterPartitionRequest.PartitionData(
                topic_id=h.image.topic_ids_by_name["t"],
                partition=0,
                leader_epoch=partition.leader_epoch,
                partition_epoch=partition.partition_epoch,
                new_isr=[
                    cpb.AlterPartitionRequest.IsrMember(broker_id=b, broker_epoch=h.image.brokers[b].epoch)
                    for b in (1, 2)
                ],
            )
        ],
    )
    assert h.run(alter_partition(h.logic, expand, h.next_offset)).partitions[0].error_code == ErrorCode.NONE
    partition = h.image.partition(h.image.topic_ids_by_name["t"], 0)
    assert partition is not None and partition.leader == 2 and partition.isr == (1, 2)
    assert partition.leader_epoch > epochs[0] and partition.partition_epoch > epochs[1]


def test_fencing_the_last_isr_member_leaves_the_partition_offline_with_it_eligible(h: Harness) -> None:
    """KIP-966: the last member leaves the ISR (empty) for the ELR; its return elects it from there."""
    h.active_brokers(1)
    h.create("t", partitions=1, rf=1)
    h.heartbeat(1, want_fence=True)
    partition = h.topic("t").partitions[0]
    assert partition.leader == NO_PARTITION_LEADER and partition.isr == () and partition.elr == (1,)
    h.heartbeat(1)
    partition = h.topic("t").partitions[0]
    assert (partition.leader, partition.isr, partition.elr) == (1, (1,), ())


def test_replicas_on_an_offline_log_dir_lose_leadership_and_isr_and_nothing_else_moves(h: Harness) -> None:
    """Kafka's handleDirectoriesOffline: the heartbeat names the partitions of the broker's offline dir;
    those (and only those) get another leader from their ISR, or none when the broker was the last."""
    h.active_brokers(1, 2, 3)
    h.create(
        "t",
        assignments=[
            cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2]),
            cpb.ReplicaAssignment(partition=1, broker_ids=[2, 1]),
            cpb.ReplicaAssignment(partition=2, broker_ids=[1, 3]),
        ],
        partitions=-1,
        rf=-1,
    )
    h.create("solo", partitions=-1, rf=-1, assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[1])])
    before = h.topic("t").partitions[2]
    h.heartbeat(1, offline=[("t", 0), ("t", 1), ("solo", 0), ("gone", 0), ("t", 9)])
    p0, p1, p2 = h.topic("t").partitions
    assert (p0.leader, p0.isr) == (2, (2,))
    assert (p1.leader, p1.isr) == (2, (2,))
    assert p2 == before  # on a dir still online: untouched
    solo = h.topic("solo").partitions[0]
    # offline, the replica still eligible (KIP-966: out of the ISR, into the ELR)
    assert (solo.leader, solo.isr, solo.elr) == (NO_PARTITION_LEADER, (), (1,))
    assert not h.image.brokers[1].fenced  # the broker serves its other partitions
    logged = len(h.log)
    h.heartbeat(1, offline=[("t", 0), ("t", 1), ("solo", 0)])
    assert len(h.log) == logged  # idempotent: repeated reports write nothing


def test_unregister_removes_the_broker_and_unknown_ids_are_reported(h: Harness) -> None:
    h.active_brokers(1, 2)
    h.create("t", partitions=2, rf=2)
    response = h.run(
        h.logic.unregister_broker(cpb.UnregisterBrokerRequest(cluster_id=CLUSTER, broker_id=1), h.next_offset)
    )
    assert response.error_code == ErrorCode.NONE
    assert 1 not in h.image.brokers
    assert all(1 not in p.isr for p in h.topic("t").partitions)
    again = h.logic.unregister_broker(
        cpb.UnregisterBrokerRequest(cluster_id=CLUSTER, broker_id=1), h.next_offset
    )
    assert again.response.error_code == ErrorCode.BROKER_ID_NOT_REGISTERED


# ---- topics ----


def test_create_topic_spreads_replicas_and_leaders_evenly_across_racks(h: Harness) -> None:
    h.active_brokers(1, 2, 3, 4, 5, 6)
    result = h.create("spread", partitions=60, rf=3)
    assert result.error_code == ErrorCode.NONE and result.num_partitions == 60
    topic = h.image.topic("spread")
    assert topic is not None
    leaders = [p.leader for p in topic.partitions]
    assert {leaders.count(b) for b in range(1, 7)} == {10}
    for partition in topic.partitions:
        assert len({r % 3 for r in partition.replicas}) == 3  # racks r0, r1, r2
        assert partition.leader == partition.replicas[0] and partition.isr == partition.replicas


@pytest.mark.parametrize(
    ("name", "partitions", "rf", "code"),
    [
        ("", 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("..", 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("a" * 250, 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("bad name", 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("ok", 0, 1, ErrorCode.INVALID_PARTITIONS),
        ("ok", -5, 1, ErrorCode.INVALID_PARTITIONS),
        ("ok", 1, 0, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("ok", 1, 4, ErrorCode.INVALID_REPLICATION_FACTOR),
    ],
)
def test_invalid_topic_requests_are_rejected(
    h: Harness, name: str, partitions: int, rf: int, code: ErrorCode
) -> None:
    h.active_brokers(1, 2, 3)
    before = h.next_offset
    result = h.create(name, partitions=partitions, rf=rf)
    assert result.error_code == code and result.error_message
    assert h.next_offset == before


def test_existing_and_colliding_topic_names_are_rejected(h: Harness) -> None:
    h.active_brokers(1)
    assert h.create("a.b").error_code == ErrorCode.NONE
    assert h.create("a.b").error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert h.create("a_b").error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


@pytest.mark.parametrize(
    ("configs", "ok"),
    [
        ([("retention.ms", "1000"), ("cleanup.policy", "compact")], True),
        ([("no.such.config", "1")], False),
        ([("retention.ms", "soon")], False),
        ([("min.insync.replicas", "3")], False),
        ([("retention.ms", "1"), ("retention.ms", "2")], False),
    ],
)
def test_topic_configs_are_validated_and_stored(h: Harness, configs: list[tuple[str, str]], ok: bool) -> None:
    h.active_brokers(1, 2)
    result = h.create("c", partitions=1, rf=2, configs=[cpb.TopicConfig(name=n, value=v) for n, v in configs])
    assert (result.error_code == ErrorCode.NONE) == ok
    if ok:
        assert dict(h.image.topic_configs("c")) == dict(configs)
    else:
        assert result.error_code == ErrorCode.INVALID_CONFIG


def test_validate_only_answers_without_records(h: Harness) -> None:
    h.active_brokers(1)
    topic = cpb.CreatableTopic(name="v", num_partitions=3, replication_factor=1)
    out = h.logic.create_topics(
        cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic], validate_only=True), h.next_offset
    )
    assert out.records == [] and out.response.topics[0].num_partitions == 3
    assert h.image.topic("v") is None


def test_explicit_assignment_is_checked(h: Harness) -> None:
    h.active_brokers(1, 2)
    bad = [cpb.ReplicaAssignment(partition=0, broker_ids=[1, 9])]
    assert (
        h.create("x", assignments=bad, partitions=-1, rf=-1).error_code
        == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    )
    gap = [cpb.ReplicaAssignment(partition=1, broker_ids=[1])]
    assert (
        h.create("x", assignments=gap, partitions=-1, rf=-1).error_code
        == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    )
    good = [cpb.ReplicaAssignment(partition=0, broker_ids=[2, 1])]
    assert h.create("x", assignments=good, partitions=-1, rf=-1).error_code == ErrorCode.NONE
    assert h.topic("x").partitions[0].leader == 2


def test_duplicate_names_in_one_request_are_rejected(h: Harness) -> None:
    h.active_brokers(1)
    topics = [cpb.CreatableTopic(name="d", num_partitions=1, replication_factor=1)] * 2
    out = h.logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=topics), h.next_offset)
    assert [t.error_code for t in out.response.topics] == [ErrorCode.INVALID_REQUEST] * 2


def test_delete_topics(h: Harness) -> None:
    h.active_brokers(1)
    h.create("gone")
    response = h.run(
        h.logic.delete_topics(
            cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["gone", "never"]), h.next_offset
        )
    )
    codes = [t.error_code for t in response.topics]
    assert codes == [ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert h.image.topic("gone") is None


def test_preferred_leader_election(h: Harness) -> None:
    h.active_brokers(1, 2)
    h.create("p", assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2])], partitions=-1, rf=-1)
    request = cpb.ElectLeadersRequest(
        cluster_id=CLUSTER, topic_partitions=[cpb.TopicPartitions(topic="p", partitions=[0])]
    )
    response = h.run(h.logic.elect_leaders(request, h.next_offset))
    assert response.topics[0].partitions[0].error_code == ErrorCode.ELECTION_NOT_NEEDED
    h.heartbeat(1, want_fence=True)
    response = h.run(h.logic.elect_leaders(request, h.next_offset))
    assert response.topics[0].partitions[0].error_code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    missing = cpb.ElectLeadersRequest(
        cluster_id=CLUSTER, topic_partitions=[cpb.TopicPartitions(topic="nope", partitions=[0])]
    )
    response = h.run(h.logic.elect_leaders(missing, h.next_offset))
    assert response.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(
    "method", ["create_topics", "delete_topics", "elect_leaders", "unregister_broker", "shutdown_broker"]
)
@pytest.mark.parametrize("cluster_id", ["wrong", ""])
def test_every_request_checks_the_cluster_id(h: Harness, method: str, cluster_id: str) -> None:
    request_type = {
        "create_topics": cpb.CreateTopicsRequest,
        "delete_topics": cpb.DeleteTopicsRequest,
        "elect_leaders": cpb.ElectLeadersRequest,
        "unregister_broker": cpb.UnregisterBrokerRequest,
        "shutdown_broker": cpb.ShutdownBrokerRequest,
    }[method]
    out = getattr(h.logic, method)(request_type(cluster_id=cluster_id), h.next_offset)
    assert out.response.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID and out.records == []


def test_reset_drops_pending_state(h: Harness) -> None:
    h.active_brokers(1)
    committed = h.image
    h.create("pending")
    assert h.image.topic("pending") is not None
    h.logic.reset(committed, h.now_ms)
    assert h.image.topic("pending") is None


def test_describe_brokers_reports_state_and_counts(h: Harness) -> None:
    h.active_brokers(1, 2)
    h.register(3)
    h.create("t", partitions=4, rf=2)
    described = {b.broker_id: b for b in h.logic.describe_brokers(h.image, h.now_ms, h.next_offset)}
    assert described[1].state == "ACTIVE" and described[3].state == "FENCED"
    assert described[1].leader_count + described[2].leader_count == 4
    assert described[1].replica_count == 4
    assert described[1].last_heartbeat_ms_ago == 0 and described[1].rack == "r1"


def test_describe_brokers_shows_a_metadata_offset_the_log_does_not_hold_as_unknown(h: Harness) -> None:
    """A heartbeat's claim at or past the log's next offset (the fleet benchmark's brokers claim 2**50)
    is described as -1, Kafka's "unknown", not echoed; an offset the log holds is shown as reported."""
    h.active_brokers(1, 2, 3)
    last = h.next_offset - 1
    h.heartbeat(1, offset=last)
    h.heartbeat(2, offset=2**50)
    h.heartbeat(3, offset=h.next_offset)  # the offset the next record gets: not written yet

    def offsets() -> dict[int, int]:
        return {
            b.broker_id: b.metadata_offset for b in h.logic.describe_brokers(h.image, h.now_ms, h.next_offset)
        }

    assert offsets() == {1: last, 2: -1, 3: -1}


def test_describe_brokers_counts_from_the_rejoin_index_equal_a_recount(h: Harness) -> None:
    """The index's per-broker counts (read when it is current for the image, as after a controlled
    shutdown moved every leadership) are the recount's: describe_brokers answers the same either way."""
    h.active_brokers(1, 2, 3)
    h.create("t", partitions=12, rf=3)
    h.create("u", partitions=5, rf=2)
    h.heartbeat(1, want_fence=True)  # leaves every ISR: leaderships move, ISRs shrink

    def counts() -> dict[int, tuple[int, int]]:
        return {
            b.broker_id: (b.leader_count, b.replica_count)
            for b in h.logic.describe_brokers(h.image, h.now_ms, h.next_offset)
        }

    h.logic.leader_count(1)  # the index is built for the current image on use
    assert h.logic.rejoin_index.current_for is h.image.topics_by_id
    # nothing left to recount in slices: the shell's count_some loops end at once
    assert h.logic.count_some(None, 1) and h.logic.count_some(h.image, 1)
    from_index = counts()
    h.logic.rejoin_index.invalidate()
    recounted = counts()
    assert from_index == recounted
    assert recounted[1][0] == 0 and sum(leaders for leaders, _ in recounted.values()) == 17


def test_a_broker_leaves_big_isr_sets_in_bounded_chunks() -> None:
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=2),
        MetadataImage.empty(),
        0,
        new_topic_id=lambda: "T",
    )
    offset = 0
    for broker_id in (1, 2):
        request = cpb.RegisterBrokerRequest(cluster_id=CLUSTER, broker_id=broker_id, incarnation_id="i")
        offset += len(logic.register_broker(request, 0, offset).records)
        epoch = logic.image.brokers[broker_id].epoch
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER, broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=offset
        )
        offset += len(logic.broker_heartbeat(beat, 0, offset).records)
    topic = cpb.CreatableTopic(name="t", num_partitions=-1, replication_factor=-1)
    for p in range(6):
        topic.assignments.add(partition=p, broker_ids=[1, 2])
    offset += len(
        logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), offset).records
    )
    fence = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER, broker_id=1, broker_epoch=logic.image.brokers[1].epoch, want_fence=True
    )
    first = logic.broker_heartbeat(fence, 0, offset)
    assert len(first.records) <= 2 and logic.has_bulk_jobs()
    offset += len(first.records)
    # while it is leaving, the broker can neither be unfenced nor chosen as a leader
    back = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER,
        broker_id=1,
        broker_epoch=logic.image.brokers[1].epoch,
        current_metadata_offset=offset,
    )
    assert logic.broker_heartbeat(back, 0, offset).response.is_fenced
    chunks = 0
    while logic.has_bulk_jobs():
        more = logic.continue_bulk_jobs(offset)
        assert 0 < len(more) <= 2
        offset += len(more)
        chunks += 1
    assert chunks >= 2
    partitions = logic.image.topic("t").partitions  # type: ignore[union-attr]
    assert all(p.leader == 2 and p.isr == (2,) for p in partitions)


def test_a_new_active_controller_finishes_an_interrupted_isr_removal(h: Harness) -> None:
    h.active_brokers(1, 2)
    h.create("t", partitions=4, rf=2)
    # the previous controller wrote the fence but died before moving any partition
    delta = MetadataDelta(h.image)
    delta.replay(
        records.wrap(
            pb.BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=h.image.brokers[1].epoch, fenced=1)
        )
    )
    interrupted = delta.apply()
    assert any(p.leader == 1 for p in interrupted.topic("t").partitions)  # type: ignore[union-attr]
    h.logic.reset(interrupted, h.now_ms)
    assert h.logic.has_bulk_jobs()
    h.commit(h.logic.continue_bulk_jobs(h.next_offset))
    assert all(p.leader == 2 and p.isr == (2,) for p in h.topic("t").partitions)
