"""The controller's bulk fast paths give exactly what the generic paths give.

- ``leave_change`` (a broker leaving an ISR, no protobuf replay) decides as ``build_change`` does and its
  registration is what replaying its record gives;
- the logic's speculative image, built with ``_Batch.add_partition`` (no replay), equals the image a
  follower gets by replaying the encoded records (create topics, controlled shutdown, fencing, unfencing);
- the active controller applies its own committed batches from the images it built (no replay): its
  committed image equals a replay of its log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import overload

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration
from kraft.metadata.isr_changes import alter_partition
from kraft.metadata.partition_change import build_change, leave_change
from kraft.raft.api import CommittedBatch, CommittedRecord
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .fake_raft import FakeRaft
from .test_controller import activate_broker, manual_clock, step, until

CLUSTER = "c1"

_ids = st.integers(min_value=1, max_value=6)


@settings(max_examples=400, deadline=None)
@given(
    replicas=st.lists(_ids, min_size=1, max_size=4, unique=True),
    isr=st.lists(_ids, min_size=1, max_size=4, unique=True),
    leader=st.integers(min_value=-1, max_value=6),
    acceptable=st.sets(_ids),
    broker=_ids,
    epochs=st.tuples(st.integers(0, 50), st.integers(0, 50)),
)
def test_leave_change_decides_as_build_change(
    replicas: list[int],
    isr: list[int],
    leader: int,
    acceptable: set[int],
    broker: int,
    epochs: tuple[int, int],
) -> None:
    current = PartitionRegistration(tuple(replicas), tuple(isr), leader, *epochs)
    expected = build_change("T", 3, current, acceptable.__contains__, remove_from_isr=broker)
    got = leave_change("T", 3, current, acceptable.__contains__, broker)
    if expected is None:
        assert got is None
        return
    assert got is not None
    record, registration = got
    assert record.partition_change == expected
    # the registration is what replaying the record gives
    base = MetadataDelta(MetadataImage.empty())
    base.replay(records.wrap(pb.TopicRecord(name="t", topic_id="T")))
    for pid in range(4):
        base.replay(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="T",
                    partition_id=pid,
                    replicas=replicas,
                    isr=isr,
                    leader=leader,
                    leader_epoch=epochs[0],
                    partition_epoch=epochs[1],
                )
            )
        )
    delta = MetadataDelta(base.apply())
    delta.replay(records.decode_value(records.encode_value(record)))
    replayed = delta.apply().partition("T", 3)
    assert replayed == registration
    assert (replayed.isr is replayed.replicas) == (registration.isr is registration.replicas)


def _logic(max_changes: int) -> ControllerLogic:
    ids = (f"topic-{i}" for i in itertools.count())
    return ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=max_changes),
        MetadataImage.empty(),
        0,
        new_topic_id=lambda: next(ids),
    )


def test_the_speculative_image_equals_a_replay_of_the_records() -> None:
    logic = _logic(max_changes=7)
    log: list[pb.MetadataRecord] = []

    def commit(out_records: list[pb.MetadataRecord]) -> None:
        log.extend(out_records)
        while logic.has_bulk_jobs():
            log.extend(logic.continue_bulk_jobs(len(log)))

    for broker_id in range(1, 7):
        request = cpb.RegisterBrokerRequest(
            cluster_id=CLUSTER, broker_id=broker_id, incarnation_id="i", rack=f"r{broker_id % 2}"
        )
        commit(logic.register_broker(request, 0, len(log)).records)
    fenced_broker = 6  # stays fenced: new partitions leave it out of their ISRs
    for broker_id in range(1, 6):
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=logic.image.brokers[broker_id].epoch,
            current_metadata_offset=99,
        )
        commit(logic.broker_heartbeat(beat, 0, len(log)).records)
    explicit = cpb.CreatableTopic(name="explicit")
    for p in range(30):
        explicit.assignments.add(partition=p, broker_ids=[1 + p % 6, 1 + (p + 1) % 6, 1 + (p + 2) % 6])
    placed = cpb.CreatableTopic(name="placed", num_partitions=40, replication_factor=3)
    commit(
        logic.create_topics(
            cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[explicit, placed]), len(log)
        ).records
    )
    commit(
        logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1), len(log)).records
    )
    fence = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER, broker_id=2, broker_epoch=logic.image.brokers[2].epoch, want_fence=True
    )
    commit(logic.broker_heartbeat(fence, 0, len(log)).records)
    back = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER,
        broker_id=fenced_broker,
        broker_epoch=logic.image.brokers[fenced_broker].epoch,
        current_metadata_offset=999,
    )
    commit(logic.broker_heartbeat(back, 0, len(log)).records)
    # Unfencing does not put it into ISRs (it may lack committed records); its leaders' AlterPartition does.
    assert not any(fenced_broker in p.isr for t in logic.image.topics_by_id.values() for p in t.partitions)
    topic_id, partition_id, partition = next(
        (t.topic_id, i, p)
        for t in logic.image.topics_by_id.values()
        for i, p in enumerate(t.partitions)
        if fenced_broker in p.replicas and p.leader >= 0
    )
    expand = cpb.AlterPartitionRequest(
        cluster_id=CLUSTER,
        broker_id=partition.leader,
        broker_epoch=logic.image.brokers[partition.leader].epoch,
        partitions=[
            cpb.AlterPartitionRequest.PartitionData(
                topic_id=topic_id,
                partition=partition_id,
                leader_epoch=partition.leader_epoch,
                partition_epoch=partition.partition_epoch,
                new_isr=[
                    cpb.AlterPartitionRequest.IsrMember(broker_id=b, broker_epoch=-1)
                    for b in (*partition.isr, fenced_broker)
                ],
            )
        ],
    )
    expanded = alter_partition(logic, expand, len(log))
    assert expanded.response.partitions[0].error_code == ErrorCode.NONE
    commit(expanded.records)

    delta = MetadataDelta(MetadataImage.empty())
    for offset, record in enumerate(log):
        delta.replay(records.decode_value(records.encode_value(record)), offset)
    replayed = delta.apply()
    assert not delta.replay_errors
    assert replayed.offset == logic.image.offset == len(log) - 1
    assert replayed.brokers == logic.image.brokers
    assert replayed.topic_ids_by_name == logic.image.topic_ids_by_name
    for topic_id, topic in replayed.topics_by_id.items():
        mine = logic.image.topics_by_id[topic_id]
        assert mine.partitions == topic.partitions
        for a, b in zip(mine.partitions, topic.partitions, strict=True):
            assert (a.isr is a.replicas) == (b.isr is b.replicas)
    assert logic.leader_count(1) == 0 and logic.leader_count(2) == 0
    assert any(fenced_broker in p.isr for t in replayed.topics_by_id.values() for p in t.partitions)


class _TrackedRecords(Sequence[CommittedRecord]):
    """A committed batch's records that note when a listener reads them (Raft decodes lazily)."""

    def __init__(self, batch: CommittedBatch, reads: set[int]) -> None:
        self._records = list(batch.records)
        self._last_offset = batch.last_offset
        self._reads = reads

    def _read(self) -> list[CommittedRecord]:
        self._reads.add(self._last_offset)
        return self._records

    def __len__(self) -> int:
        return len(self._read())

    @overload
    def __getitem__(self, index: int) -> CommittedRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[CommittedRecord]: ...

    def __getitem__(self, index: int | slice) -> CommittedRecord | Sequence[CommittedRecord]:
        return self._read()[index]

    def __iter__(self) -> Iterator[CommittedRecord]:
        return iter(self._read())


async def test_the_active_controller_commits_its_own_images_identical_to_a_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raft = FakeRaft(1)
    controller = QuorumController(
        raft,
        CLUSTER,
        {1: ("127.0.0.1", 9101)},
        ControllerOptions(noop_interval_ms=0, max_work_unit_records=50),
        clock=ManualClock(),
    )
    own_batches = 0
    own_image = controller.writes.own_image

    def counting(batch: CommittedBatch) -> MetadataImage | None:
        nonlocal own_batches
        image = own_image(batch)
        own_batches += image is not None
        return image

    monkeypatch.setattr(controller.writes, "own_image", counting)
    decoded: set[int] = set()  # last offsets of the batches whose records a listener read
    commit_batch = raft._commit_batch

    def lazily(values: list[bytes], control: bool = False) -> None:
        commit_batch(values, control)
        batch = raft.log[-1]
        raft.log[-1] = dataclasses.replace(batch, records=_TrackedRecords(batch, decoded))

    monkeypatch.setattr(raft, "_commit_batch", lazily)
    await controller.start()
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        for broker_id in (1, 2, 3, 4):
            await activate_broker(controller, broker_id)
        topics = [cpb.CreatableTopic(name=f"t{i}", num_partitions=40, replication_factor=3) for i in range(5)]
        created = await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=topics))
        assert all(t.error_code == 0 for t in created.topics)
        shutdown = await controller.shutdown_broker(
            cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1)
        )
        assert shutdown.error_code == 0 and shutdown.leaderships_remaining == 0
        await until(lambda: controller.committed.offset >= raft.end_offset - 1)
        await asyncio.sleep(0)
        never_decoded = {b.last_offset for b in raft.log if not b.control and b.last_offset not in decoded}

        delta = MetadataDelta(MetadataImage.empty())
        for batch in raft.log:
            for record in batch.records:
                delta.replay(records.decode_value(record.value), record.offset, batch.epoch)
        delta.offset = raft.log[-1].last_offset
        delta.epoch = raft.log[-1].epoch
        replayed = delta.apply()
        committed = controller.committed
        assert committed.offset == replayed.offset and committed.epoch == replayed.epoch
        assert committed.brokers == replayed.brokers
        assert {t: v.partitions for t, v in committed.topics_by_id.items()} == {
            t: v.partitions for t, v in replayed.topics_by_id.items()
        }
        assert not any(p.leader == 1 for t in committed.topics_by_id.values() for p in t.partitions)
        assert own_batches >= 5  # the bulk batches were not replayed
        # ... nor decoded (the controller kept the values it appended), yet it serves the same records:
        assert len(never_decoded) >= 5
        served = controller.fetches.window.read(0, 1_000_000)
        assert [(r.offset, r.value) for r in served] == [
            (r.offset, r.value) for b in raft.log for r in b.records
        ]
    finally:
        await controller.stop()


async def test_brokers_are_not_fenced_while_heartbeat_intake_collapses_but_a_silent_one_is() -> None:
    """Heartbeats that never reach the controller (gRPC starved) prove nothing: with many unfenced
    brokers and almost no heartbeats arriving, deadlines are extended (bounded); one silent broker among
    heartbeating ones is still fenced within the session timeout."""
    raft = FakeRaft(1)
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=400, heartbeat_interval_ms=50)
    controller = QuorumController(raft, CLUSTER, {1: ("127.0.0.1", 9101)}, options, clock=ManualClock())
    await controller.start()
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        brokers = list(range(1, 11))
        epochs = {b: await activate_broker(controller, b) for b in brokers}

        async def beat(broker_id: int) -> None:
            await controller.broker_heartbeat(
                cpb.BrokerHeartbeatRequest(
                    cluster_id=CLUSTER,
                    broker_id=broker_id,
                    broker_epoch=epochs[broker_id],
                    current_metadata_offset=1 << 40,
                )
            )

        clock = manual_clock(controller)

        # 1. broker 10 goes silent, the others keep heartbeating (one per broker per check interval):
        #    10 is fenced, nobody else
        start_ms = clock.now_ms
        while not controller.committed.brokers[10].fenced:
            assert clock.now_ms - start_ms <= 400 * 1.2, "the silent broker was not fenced"
            await asyncio.gather(*(beat(b) for b in brokers[:-1]))
            await step(controller, 50)
        assert not any(controller.committed.brokers[b].fenced for b in brokers[:-1])

        # 2. no heartbeat arrives at all (as when the controller's intake starves): no fencing for a
        #    while past the session timeout, then expiry resumes (a real mass failure is still fenced)
        silent_since_ms = clock.now_ms
        while clock.now_ms - silent_since_ms < 400 * 2:
            await step(controller, 50)
            assert not any(controller.committed.brokers[b].fenced for b in brokers[:-1])
        while not all(controller.committed.brokers[b].fenced for b in brokers):
            assert clock.now_ms - silent_since_ms < 10_000, "a mass failure was never fenced"
            await step(controller, 50)
        assert clock.now_ms - silent_since_ms > 400 * 2
    finally:
        await controller.stop()
