"""The new leader/follower states of an image that brings thousands of them (the first image after
start-up, a bulk creation) are built in loop turns (issue #17): the result equals the one-go build; no
partition is led or fetched before its state exists; an image applied mid-way, a checkpoint written
mid-way and a close mid-way leave nothing wrong.  Manual clock; a pacer that yields at every look (and
can act there) stands for a busy loop."""

from __future__ import annotations

import asyncio
import gc
import threading
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from broker_fakes import (
    MemoryLogOpener,
    MemoryPartitionLog,
    SilentReplicaTransport,
    SwitchableLease,
    YieldingPacer,
)

from kraft.broker import heap, hwm_checkpoint
from kraft.broker.image_adapter import local_assignments
from kraft.broker.partitions import PartitionManager
from kraft.broker.replication import ReplicaManager
from kraft.broker.types import ProducedRecord, ReplicaRole, TopicPartition
from kraft.clock import ManualClock
from kraft.metadata.image import ConfigKey, MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.records import ConfigResourceType
from kraft.v1 import controller_pb2 as cpb

PARTITIONS = 300
STEP = 16  # states a turn: ~19 turns for the topic
RECORDS = 5  # in every log, so a checkpointed high watermark of up to 5 is kept as it is
TOPIC = "t"
TOPIC_ID = "tid"


def _image(leaders: dict[int, int] | None = None, partitions: int = PARTITIONS) -> MetadataImage:
    """One topic on brokers 1-3; partition p led by broker 1 when p % 3 == 0, else by 2 or 3."""
    chosen = leaders or {}
    registrations = tuple(
        PartitionRegistration((1, 2, 3), (1, 2, 3), chosen.get(p, 1 + p % 3), 0, 0) for p in range(partitions)
    )
    return replace(
        MetadataImage.empty(),
        offset=0,
        topics_by_id={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, registrations)},
        topic_ids_by_name={TOPIC: TOPIC_ID},
    )


class _Broker:
    """Broker 1 over in-memory logs holding RECORDS flushed records each; ``stepped``: new states are
    built in turns of STEP from 100 new states on (else at once)."""

    def __init__(self, root: Path, *, stepped: bool, lease: SwitchableLease | None = None) -> None:
        self.root = root
        self.clock = ManualClock(1_000)
        self.opener = MemoryLogOpener()
        self.manager = PartitionManager(1, [root], self.opener)
        self.replicas = ReplicaManager(
            1,
            "c-1",
            self.manager,
            clock=self.clock,
            broker_epoch=lambda: 7,
            send_alter_partition=self._send,
            transport=SilentReplicaTransport(),
            lease=lease,
        )
        if stepped:
            self.replicas.stepped_build_min = 100
            self.replicas.build_step = STEP
        else:
            self.replicas.stepped_build_min = 1 << 30

    async def _send(self, request: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    def host(self, image: MetadataImage) -> None:
        """The partition manager applies ``image``; new logs get their records."""
        self.manager.reconcile(local_assignments(image, 1))
        for partition in self.manager.partitions():
            log = partition.log
            assert isinstance(log, MemoryPartitionLog)
            if log.log_end_offset == 0:
                log.append_records([ProducedRecord(None, b"x", 0)] * RECORDS, 0)
                log.flush()

    def apply(self, image: MetadataImage) -> None:
        self.host(image)
        self.replicas.on_image(image)

    def snapshot(self) -> dict[str, object]:
        r = self.replicas
        gauges = {
            name: getattr(r.metrics, name)._value.get()
            for name in ("leader_count", "partition_count", "under_replicated_partitions")
        }
        return {
            "led": {
                tp: (led.assignment, led.state.high_watermark, led.state.isr, led.state._min_isr)
                for tp, led in r._led.items()
            },
            "followed": {tp: (f.leader, f.leader_epoch, f.high_watermark) for tp, f in r._followed.items()},
            "by_leader": {leader: sorted(group) for leader, group in r._by_leader.items()},
            "by_topic": {topic: sorted(group) for topic, group in r._led_by_topic.items()},
            "fetchers": sorted(leader for leader, task in r._fetchers.items() if not task.done()),
            "gauges": gauges,
        }

    def check_serving(self) -> None:
        """Nothing is led or fetched without its state: a hosted partition is led iff its leader state
        exists for it, fetched iff its follower state exists; those not built yet have neither."""
        r = self.replicas
        waiting = r._pending | r._taken
        for partition in self.manager.partitions():
            tp = partition.tp
            assert r.leads(partition) == (tp in r._led)
            if tp in waiting:
                assert tp not in r._led and tp not in r._followed
            if tp in r._led:
                assert partition.role is ReplicaRole.LEADER
        assert {tp for group in r._by_leader.values() for tp in group} == set(r._followed)


async def test_a_stepped_build_equals_one_go_and_leads_nothing_before_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heap, "BIG_CHANGE", 100)  # (as for 4,096 new states: the collector paused)
    one_go, stepped = _Broker(tmp_path / "a", stepped=False), _Broker(tmp_path / "b", stepped=True)
    built: list[int] = []

    async def at_turn(turn: int) -> None:
        stepped.check_serving()
        built.append(len(stepped.replicas._led) + len(stepped.replicas._followed))
        assert gc.isenabled() is False  # (the collector is paused for the whole build)

    stepped.replicas.build_pacer = lambda: YieldingPacer(at_turn)
    image = _image()
    one_go.apply(image)
    stepped.apply(image)
    assert stepped.replicas.building and not stepped.replicas._led and not stepped.replicas._followed
    await stepped.replicas.wait_built()
    assert gc.isenabled()
    assert not stepped.replicas.building
    # One step of STEP states a turn, every turn:
    assert all(0 <= after - before <= STEP for before, after in pairwise(built))
    assert len(built) >= PARTITIONS // STEP
    stepped.check_serving()
    assert stepped.snapshot() == one_go.snapshot()
    assert list(stepped.replicas._led) == list(one_go.replicas._led)  # (and in the same order)
    assert list(stepped.replicas._followed) == list(one_go.replicas._followed)
    for broker in (one_go, stepped):
        await broker.replicas.close()


async def test_an_image_applied_mid_build_ends_as_both_applied_at_once(tmp_path: Path) -> None:
    one_go, stepped = _Broker(tmp_path / "a", stepped=False), _Broker(tmp_path / "b", stepped=True)
    # The second image: partitions 0-59 (built by then) and 240-299 (not yet) change leaders — led here
    # becomes followed, followed becomes led — the topic's last 30 go, and min.insync.replicas changes.
    moved = {p: (2 if p % 3 == 0 else 1) for p in [*range(60), *range(240, PARTITIONS - 30)]}
    second = _image(moved, PARTITIONS - 30)
    second = replace(
        second, configs={ConfigKey(ConfigResourceType.TOPIC, TOPIC): {"min.insync.replicas": "2"}}
    )

    async def at_turn(turn: int) -> None:
        stepped.check_serving()
        if turn == 7:  # (in_order took no turn: 300 partitions are one sort run)
            assert 60 <= len(stepped.replicas._led) + len(stepped.replicas._followed) < 200
            stepped.apply(second)
            stepped.check_serving()

    stepped.replicas.build_pacer = lambda: YieldingPacer(at_turn)
    one_go.apply(_image())
    one_go.apply(second)
    stepped.apply(_image())
    await stepped.replicas.wait_built()
    stepped.check_serving()
    assert stepped.snapshot() == one_go.snapshot()
    assert len(stepped.replicas._led) == len(one_go.replicas._led) > 0
    for broker in (one_go, stepped):
        await broker.replicas.close()


async def test_a_checkpoint_or_a_close_mid_build_keeps_the_unbuilt_partitions_high_watermarks(
    tmp_path: Path,
) -> None:
    stepped = _Broker(tmp_path, stepped=True)
    image = _image()
    stepped.host(image)
    restored = {(p.tp, TOPIC_ID): 1 + p.tp.partition % RECORDS for p in stepped.manager.partitions()}
    hwm_checkpoint.write(tmp_path, restored)
    pacer_turns: list[int] = []

    async def at_turn(turn: int) -> None:
        pacer_turns.append(turn)
        if turn == 5:  # part built: a paced checkpoint pass, then one in one go
            assert 0 < len(stepped.replicas._led) + len(stepped.replicas._followed) < PARTITIONS
            hwm_checkpoint.write(tmp_path, {})  # (what the pass writes is seen)
            assert await stepped.replicas.write_checkpoints(YieldingPacer()) == 1
            assert hwm_checkpoint.read(tmp_path) == restored
            assert stepped.replicas._checkpoint_entries() == {tmp_path: restored}  # (the close's)
        if turn == 9:
            assert stepped.replicas._checkpoint_entries() == {tmp_path: restored}
            reached.set()
            await asyncio.Event().wait()  # (until the close cancels the build here)

    reached = asyncio.Event()
    stepped.replicas.build_pacer = lambda: YieldingPacer(at_turn)
    stepped.replicas.on_image(image)
    await reached.wait()
    await stepped.replicas.close()
    await stepped.replicas.wait_built()
    assert max(pacer_turns) == 9 and gc.isenabled()
    assert hwm_checkpoint.read(tmp_path) == restored  # the close's write: built and unbuilt alike
    assert not stepped.replicas._led and not stepped.replicas._followed
    # A later image sets up every hosted partition again (the close left them to be revisited).
    assert {p.tp for p in stepped.manager.partitions()} <= stepped.replicas._revisit


async def test_states_built_after_the_lease_lapsed_start_held(tmp_path: Path) -> None:
    lease = SwitchableLease()
    stepped = _Broker(tmp_path, stepped=True, lease=lease)

    async def at_turn(turn: int) -> None:
        if turn == 3:
            lease.valid = False

    stepped.replicas.build_pacer = lambda: YieldingPacer(at_turn)
    stepped.apply(_image())
    await stepped.replicas.wait_built()
    states = [led.state for led in stepped.replicas._led.values()]
    assert len(states) == PARTITIONS // 3
    assert all(state.high_watermark_held for state in states)
    await stepped.replicas.close()


async def test_a_stepped_build_reads_the_stored_checkpoint_on_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a checkpoint of 100,000 lines is 0.1-0.3 s of Python: not in one of the build's turns."""
    stepped = _Broker(tmp_path, stepped=True)
    image = _image()
    stepped.host(image)
    hwm_checkpoint.write(tmp_path, {(p.tp, TOPIC_ID): 2 for p in stepped.manager.partitions()})
    read = hwm_checkpoint.read
    threads: list[str] = []

    def reading(log_dir: Path) -> dict[tuple[TopicPartition, str], int]:
        threads.append(threading.current_thread().name)
        return read(log_dir)

    monkeypatch.setattr(hwm_checkpoint, "read", reading)
    stepped.replicas.on_image(image)
    await stepped.replicas.wait_built()
    assert len(threads) == 1 and threads[0] != threading.main_thread().name
    assert {led.state.high_watermark for led in stepped.replicas._led.values()} == {2}
    assert {f.high_watermark for f in stepped.replicas._followed.values()} == {2}
    await stepped.replicas.close()
