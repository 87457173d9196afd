"""A replica on a log dir its broker took offline is never elected, across a controller failover.

A broker whose log dir fails (JBOD) stays live and unfenced and names the partitions it had there in every
heartbeat.  Those replicas leave the ISR and, like any departing member, join the ELR (the data is
unreachable, not known lost).  Before, the controller only had that report in memory and checked nothing
at election time: an election from the ELR, or an unclean one ("first live replica"), could pick the broker
as leader of a partition whose data it cannot reach — and a new active controller knew nothing of the
offline dir until the next heartbeat.  Now the registration carries them
(``BrokerRegistrationChangeRecord.offline_replicas`` → ``BrokerRegistration.offline_replicas``, in
snapshots and the image store), every election skips them, and a re-registration (a restart on repaired
dirs) clears them, so the replica, still in the ELR, is electable again.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from kraft.broker.image_adapter import image_digest
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.config_control import incremental_alter_configs
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import LEADER_RECOVERING, NO_PARTITION_LEADER, MetadataImage
from kraft.metadata.image_records import image_records, image_values
from kraft.metadata.isr_changes import alter_partition
from kraft.metadata.store import SqliteImageStore
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_elr_unclean_failover import CLUSTER, Cluster, _leaders_from

PARTITIONS = 8  # more than one slice (3 changes per write): elections run in bulk jobs


class DirCluster(Cluster):
    def heartbeat(
        self, broker_id: int, want_fence: bool = False, offline: Sequence[tuple[str, int]] = ()
    ) -> cpb.BrokerHeartbeatResponse:
        self.now_ms += 1
        request = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=self.image.brokers[broker_id].epoch,
            current_metadata_offset=self.next_offset - 1,
            want_fence=want_fence,
        )
        if offline:
            request.offline_log_dirs.append("/data/b")
            for topic, partition in offline:
                request.offline_partitions.add(topic=topic, partition=partition)
        outcome = self.logic.broker_heartbeat(request, self.now_ms, self.next_offset)
        self.commit(outcome.records)
        return outcome.response

    def settle(
        self, broker_id: int, want_fence: bool = False, offline: Sequence[tuple[str, int]] = ()
    ) -> cpb.BrokerHeartbeatResponse:
        """A heartbeat, then every bulk job it started run to the end."""
        response = self.heartbeat(broker_id, want_fence, offline)
        self.drain()
        return response

    def state(self) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
        topic = self.image.topic("t")
        assert topic is not None
        return [(p.leader, p.isr, p.elr) for p in topic.partitions]


def _cluster(unclean_election: bool = False) -> DirCluster:
    """Brokers 1-3 unfenced; topic t with PARTITIONS partitions on (1, 2, 3), min ISR 2."""
    c = DirCluster()
    for broker_id in (1, 2, 3):
        c.register(broker_id, f"inc-{broker_id}")
        c.drain()
    for broker_id in (1, 2, 3):
        assert not c.settle(broker_id).is_fenced
    topic = cpb.CreatableTopic(name="t")
    for p in range(PARTITIONS):
        topic.assignments.add(partition=p, broker_ids=[1, 2, 3])
    if unclean_election:
        topic.configs.add(name="unclean.leader.election.enable", value="true")
    created = c.logic.create_topics(
        cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), c.next_offset
    )
    assert created.response.topics[0].error_code == ErrorCode.NONE
    c.commit(created.records)
    return c


OFFLINE = [("t", p) for p in range(PARTITIONS)]


def _two_on_an_offline_dir(failover: bool) -> DirCluster:
    """3 fenced (ISR 1, 2), then 2's dir with every partition of t goes offline: ISR (1,), ELR (2,)."""
    c = _cluster()
    c.settle(3, want_fence=True)
    assert c.state() == [(1, (1, 2), ())] * PARTITIONS
    assert not c.settle(2, offline=OFFLINE).is_fenced  # it serves its other dirs
    assert c.state() == [(1, (1,), (2,))] * PARTITIONS
    assert c.image.brokers[2].offline_replicas == {(c.image.topic_ids_by_name["t"], p) for p in range(8)}
    if failover:
        c.failover()
    return c


def test_an_elr_election_skips_a_replica_on_an_offline_dir() -> None:
    c = _two_on_an_offline_dir(failover=False)
    start = c.next_offset
    c.settle(1, want_fence=True)  # the ISR empties: 1 joins 2 in the ELR; 2 is live but its dir is not
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    c.settle(3)  # 3 returns (its unfence runs elections): not eligible, and 2 still is not electable
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    assert 2 not in set(_leaders_from(c.log[start:]))
    c.settle(1)  # an eligible replica on an online dir returns: it leads
    assert c.state() == [(1, (1,), (2,))] * PARTITIONS


def test_the_offline_dir_survives_a_controller_failover() -> None:
    """The new active controller knows the offline replicas from the log, before any heartbeat."""
    c = _two_on_an_offline_dir(failover=True)
    assert not c.logic.has_bulk_jobs()
    start = c.next_offset
    c.settle(1, want_fence=True)
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    c.failover()  # the activation's resume scan elects nothing either
    c.drain()
    c.settle(3)
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    assert 2 not in set(_leaders_from(c.log[start:]))


def test_unclean_election_skips_a_replica_on_an_offline_dir() -> None:
    """With unclean.leader.election.enable, the first live replica is elected when no eligible one is
    acceptable — but not one whose dir is offline: 2 is the only live broker, so nobody leads."""
    c = _cluster(unclean_election=True)
    assert not c.settle(2, offline=OFFLINE).is_fenced  # ISR (1, 3): 2 left at min ISR, not eligible
    assert c.state() == [(1, (1, 3), ())] * PARTITIONS
    c.failover()
    start = c.next_offset
    c.settle(1, want_fence=True)
    assert c.state() == [(3, (3,), (1,))] * PARTITIONS
    c.settle(3, want_fence=True)  # nobody eligible is live: the unclean election finds only 2
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 3))] * PARTITIONS
    assert 2 not in set(_leaders_from(c.log[start:]))
    # a live replica on an online dir is elected uncleanly as before: 2 restarts on repaired dirs and
    # is elected (RECOVERING) — it was never eligible, unlike the ELR members 1 and 3 still fenced
    c.register(2, "inc-2-repaired", previous="inc-2")
    c.drain()
    assert c.image.brokers[2].offline_replicas == frozenset()
    assert not c.settle(2).is_fenced
    topic = c.image.topic("t")
    assert topic is not None
    assert {(p.leader, p.isr, p.leader_recovery_state) for p in topic.partitions} == {
        (2, (2,), LEADER_RECOVERING)
    }


def test_turning_unclean_election_on_does_not_elect_a_replica_on_an_offline_dir() -> None:
    c = _cluster()
    c.settle(3, want_fence=True)
    c.settle(1, want_fence=True)  # ISR (2,), ELR (1,)
    assert c.state() == [(2, (2,), (1,))] * PARTITIONS
    c.settle(2, offline=OFFLINE)  # 2 was the last in sync: offline, eligible, not electable
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    c.failover()
    start = c.next_offset
    alter = cpb.IncrementalAlterConfigsRequest(cluster_id=CLUSTER)
    item = alter.resources.add()
    item.resource.resource_type = 2  # TOPIC
    item.resource.resource_name = "t"
    item.configs.add(name="unclean.leader.election.enable", op=0, value="true")
    outcome = incremental_alter_configs(c.logic, alter, c.next_offset)
    assert all(r.error_code == ErrorCode.NONE for r in outcome.response.results)
    c.commit(outcome.records)
    c.drain()
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    assert 2 not in set(_leaders_from(c.log[start:]))
    c.settle(3)  # a live replica on an online dir: elected uncleanly (the config's trade)
    assert {leader for leader, _, _ in c.state()} == {3}


def test_a_restart_on_repaired_dirs_makes_the_replica_electable_again() -> None:
    c = _two_on_an_offline_dir(failover=True)
    c.settle(1, want_fence=True)
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    # 2 restarts: the same dirs (it names inc-2), the failed one repaired — it kept its place in the ELR
    assert c.register(2, "inc-2-restarted", previous="inc-2").error_code == ErrorCode.NONE
    c.drain()
    assert not c.image.brokers[2].unclean_shutdown
    assert c.image.brokers[2].offline_replicas == frozenset()
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    c.failover()  # and a new active controller agrees
    assert not c.settle(2).is_fenced
    assert c.state() == [(2, (2,), (1,))] * PARTITIONS


def test_a_restart_with_the_dir_still_broken_reports_it_before_its_unfence() -> None:
    """The heartbeat that unfences also carries the report: the registration lists the replicas before
    the unfence's elections run, so they elect nobody."""
    c = _two_on_an_offline_dir(failover=False)
    c.settle(1, want_fence=True)
    c.register(2, "inc-2-restarted", previous="inc-2")
    c.drain()
    assert not c.settle(2, offline=OFFLINE).is_fenced
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    assert len(c.image.brokers[2].offline_replicas) == PARTITIONS


def test_a_fenced_broker_s_report_is_recorded_too() -> None:
    """A fenced broker is in no ISR but may be in ELRs: its report is kept all the same."""
    c = _cluster()
    c.settle(3, want_fence=True)
    c.settle(2, want_fence=True)  # ISR (1,), ELR (2,)
    c.heartbeat(2, want_fence=True, offline=[("t", 0)])
    assert c.image.brokers[2].offline_replicas == {(c.image.topic_ids_by_name["t"], 0)}
    c.settle(1, want_fence=True)
    c.settle(2)  # 2 unfenced: it leads every partition but 0
    leaders = [leader for leader, _, _ in c.state()]
    assert leaders == [NO_PARTITION_LEADER] + [2] * (PARTITIONS - 1)


def test_reports_are_idempotent_and_only_name_replicas_of_the_broker() -> None:
    c = _cluster()
    c.settle(2, offline=[("t", 0), ("t", 1), ("no-such-topic", 0), ("t", 99)])
    logged = c.next_offset
    c.settle(2, offline=[("t", 0), ("t", 1)])
    assert c.next_offset == logged
    topic_id = c.image.topic_ids_by_name["t"]
    assert c.image.brokers[2].offline_replicas == {(topic_id, 0), (topic_id, 1)}
    c.settle(2, offline=[("t", 0), ("t", 1), ("t", 2)])  # another dir: only the new one is written
    change = c.log[logged].broker_registration_change
    assert [(o.topic_id, list(o.partitions)) for o in change.offline_replicas] == [(topic_id, [2])]
    assert len(c.image.brokers[2].offline_replicas) == 3


def test_alter_partition_refuses_a_replica_on_an_offline_dir() -> None:
    c = _cluster()
    c.settle(2, offline=[("t", 0)])
    topic = c.image.topic("t")
    assert topic is not None
    partition = topic.partitions[0]
    assert (partition.leader, partition.isr) == (1, (1, 3))
    request = cpb.AlterPartitionRequest(
        cluster_id=CLUSTER,
        broker_id=1,
        broker_epoch=c.image.brokers[1].epoch,
        partitions=[
            cpb.AlterPartitionRequest.PartitionData(
                topic_id=topic.topic_id,
                partition=0,
                leader_epoch=partition.leader_epoch,
                partition_epoch=partition.partition_epoch,
                new_isr=[
                    cpb.AlterPartitionRequest.IsrMember(broker_id=b, broker_epoch=c.image.brokers[b].epoch)
                    for b in (1, 2, 3)
                ],
            )
        ],
    )
    outcome = alter_partition(c.logic, request, c.next_offset)
    assert outcome.records == []
    assert outcome.response.partitions[0].error_code == ErrorCode.INELIGIBLE_REPLICA
    assert "offline log dir" in outcome.response.partitions[0].error_message


# ---- the offline replicas in every form the image takes ----


def _image_with_offline_replicas() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for broker_id in (1, 2):
        delta.replay(
            records.wrap(
                pb.RegisterBrokerRecord(
                    broker_id=broker_id,
                    incarnation_id=f"inc-{broker_id}",
                    broker_epoch=broker_id,
                    fenced=False,
                )
            ),
            broker_id,
        )
    change = pb.BrokerRegistrationChangeRecord(
        broker_id=2,
        broker_epoch=2,
        offline_replicas=records.offline_replicas_records([("b-topic", 4), ("a-topic", 1), ("a-topic", 0)]),
    )
    delta.replay(records.wrap(change), 3)
    delta.offset = 3
    return delta.apply()


def test_the_record_adds_and_a_registration_clears() -> None:
    image = _image_with_offline_replicas()
    assert image.brokers[2].offline_replicas == {("a-topic", 0), ("a-topic", 1), ("b-topic", 4)}
    assert image.brokers[1].offline_replicas == frozenset()
    delta = MetadataDelta(image)
    more = pb.BrokerRegistrationChangeRecord(
        broker_id=2,
        broker_epoch=2,
        offline_replicas=[pb.OfflineReplicas(topic_id="a-topic", partitions=[1, 7])],
    )
    delta.replay(records.wrap(more), 4)
    delta.replay(records.wrap(pb.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, fenced=1)), 5)
    grown = delta.apply()
    assert grown.brokers[2].offline_replicas == {
        ("a-topic", 0),
        ("a-topic", 1),
        ("a-topic", 7),
        ("b-topic", 4),
    }
    delta = MetadataDelta(grown)
    delta.replay(
        records.wrap(pb.RegisterBrokerRecord(broker_id=2, incarnation_id="inc-2b", broker_epoch=6)), 6
    )
    assert delta.apply().brokers[2].offline_replicas == frozenset()


def test_offline_replicas_survive_snapshots_the_image_store_and_change_the_digest(tmp_path: Path) -> None:
    image = _image_with_offline_replicas()
    encoded = list(image_values(image))
    assert encoded == [records.encode_value(r) for r in image_records(image)]
    delta = MetadataDelta(MetadataImage.empty())
    for value in encoded:
        delta.replay(records.decode_value(value))
    assert not delta.replay_errors
    assert delta.apply().brokers == image.brokers
    shown = records.describe_value(encoded[-1])["data"]
    assert shown["offline_replicas"] == [
        {"topic_id": "a-topic", "partitions": [0, 1]},
        {"topic_id": "b-topic", "partitions": [4]},
    ]
    # a snapshot of brokers without offline replicas has the bytes it had before the field existed
    plain = [records.decode_value(v) for v in encoded if records.decode_value(v).HasField("register_broker")]
    assert len(encoded) == len(plain) + 1
    cleared = MetadataDelta(image)
    cleared.replay(records.wrap(pb.RegisterBrokerRecord(broker_id=2, incarnation_id="inc-2", broker_epoch=2)))
    assert image_digest(cleared.apply()) != image_digest(image)

    async def stored() -> None:
        path = tmp_path / "store.sqlite"
        store = await SqliteImageStore.open(path, clock=ManualClock())
        await store.save(image)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        loaded = await store.load()
        assert store.discarded is None and loaded.brokers == image.brokers
        await store.close()
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT broker_id, offline_replicas FROM brokers ORDER BY 1").fetchall()
        assert rows == [(1, "[]"), (2, '[["a-topic", 0], ["a-topic", 1], ["b-topic", 4]]')]

    asyncio.run(stored())


def test_an_image_store_without_the_column_is_discarded_once(tmp_path: Path) -> None:
    """A store of the previous build (it has ``unclean_shutdown`` but no ``offline_replicas``) may have
    replayed records whose offline replicas it dropped: rebuilt from the log."""
    path = tmp_path / "store.sqlite"
    image = _image_with_offline_replicas()

    async def saved() -> None:
        store = await SqliteImageStore.open(path, clock=ManualClock())
        await store.save(image)
        await store.close()

    asyncio.run(saved())
    with sqlite3.connect(path) as db:
        columns = "broker_id, epoch, incarnation_id, rack, fenced, in_controlled_shutdown, endpoints, "
        columns += "features, log_dirs, unclean_shutdown"
        db.execute(f"CREATE TABLE older AS SELECT {columns} FROM brokers")
        db.execute("DROP TABLE brokers")
        db.execute("ALTER TABLE older RENAME TO brokers")

    async def reopened() -> None:
        store = await SqliteImageStore.open(path, clock=ManualClock())
        assert (await store.load()).offset == -1
        await store.save(image)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        assert (await store.load()).brokers == image.brokers and store.discarded is None
        await store.close()

    asyncio.run(reopened())


def test_an_unclean_elect_leaders_request_skips_a_replica_on_an_offline_dir() -> None:
    """ElectLeaders UNCLEAN (the operator's consent) still never picks a replica whose dir is offline:
    with 2 the only live replica, the answer is ELIGIBLE_LEADERS_NOT_AVAILABLE and nothing is written."""
    c = _cluster()
    c.settle(3, want_fence=True)
    c.settle(1, want_fence=True)  # ISR (2,), ELR (1,)
    c.settle(2, offline=OFFLINE)  # offline, eligible, not electable
    assert c.state() == [(NO_PARTITION_LEADER, (), (1, 2))] * PARTITIONS
    c.failover()
    request = cpb.ElectLeadersRequest(cluster_id=CLUSTER, election_type=1)  # UNCLEAN
    request.topic_partitions.add(topic="t")
    outcome = c.logic.elect_leaders(request, c.next_offset)
    assert outcome.records == []
    results = [p.error_code for t in outcome.response.topics for p in t.partitions]
    assert results == [ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE] * PARTITIONS
