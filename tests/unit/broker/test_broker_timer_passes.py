"""The replica manager's periodic passes over every hosted partition, in bounded loop turns (issue #17):
the ISR shrink check (``check_isr_shrinks_paced``) and the high-watermark checkpoint
(``write_checkpoints``) decide and write what their one-go forms do, whatever happens between their
turns.  Manual clocks; a pacer that yields at every look (and can act there) stands for a busy loop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from broker_fakes import (
    MemoryLogOpener,
    MemoryPartitionLog,
    SilentReplicaTransport,
    SwitchableLease,
    YieldingPacer,
)

from kraft.broker import heap, hwm_checkpoint, replication
from kraft.broker.image_adapter import local_assignments
from kraft.broker.partitions import PartitionManager
from kraft.broker.replication import ReplicaManager, ReplicationSettings
from kraft.broker.types import ProducedRecord, TopicPartition
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.replication.epochs import EpochEndOffset
from kraft.v1 import controller_pb2 as cpb

LAG_MS = 10_000
PARTITIONS = 200  # several turns of CHECK_EVERY (32) and of the checkpoint's steps
TOPIC = "t"
TOPIC_ID = "tid"


def _image(leaders: dict[int, int] | None = None) -> MetadataImage:
    """One topic of PARTITIONS partitions on brokers 1-3; partition p led by broker 1 when p is even,
    else by 2 (``leaders`` overrides)."""
    chosen = leaders or {}
    registrations = tuple(
        PartitionRegistration((1, 2, 3), (1, 2, 3), chosen.get(p, 1 if p % 2 == 0 else 2), 0, 0)
        for p in range(PARTITIONS)
    )
    return replace(
        MetadataImage.empty(),
        offset=0,
        topics_by_id={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, registrations)},
        topic_ids_by_name={TOPIC: TOPIC_ID},
    )


class _Broker:
    """Broker 1's replica manager over in-memory logs; every AlterPartition it sends is recorded and
    never answered (the proposal stays pending)."""

    def __init__(self, root: Path, lagging: set[int], lease: SwitchableLease | None = None) -> None:
        self.clock = ManualClock()
        self.alters: list[cpb.AlterPartitionRequest] = []
        self.manager = PartitionManager(1, [root], MemoryLogOpener())
        self.replicas = ReplicaManager(
            1,
            "c-1",
            self.manager,
            clock=self.clock,
            broker_epoch=lambda: 7,
            send_alter_partition=self._send,
            settings=ReplicationSettings(replica_lag_time_max_ms=LAG_MS),
            transport=SilentReplicaTransport(),
            lease=lease,
        )
        self.image = _image()
        self.manager.reconcile(local_assignments(self.image, 1))
        for p in lagging:  # the leader holds a record its followers never fetched
            log = self.log(p)
            log.append_records([ProducedRecord(None, b"x", 0)], 0)
            log.flush()
        self.replicas.on_image(self.image)
        for p in range(0, PARTITIONS, 2):  # the followers of the others fetched up to the leader's end
            state = self.replicas.leader_state(TopicPartition(TOPIC, p))
            assert state is not None
            if p not in lagging:
                for replica in (2, 3):
                    state.on_follower_fetch(replica, state.leader_end_offset, 0, self.clock.monotonic_ms())

    def log(self, p: int) -> MemoryPartitionLog:
        partition = self.manager.get(TopicPartition(TOPIC, p))
        assert partition is not None and isinstance(partition.log, MemoryPartitionLog)
        return partition.log

    async def _send(self, request: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
        self.alters.append(request)
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    def apply(self, image: MetadataImage) -> None:
        self.image = image
        self.manager.reconcile(local_assignments(image, 1))
        self.replicas.on_image(image)

    async def proposals(self) -> dict[int, list[int]]:
        """Partition → proposed ISR, once the proposals' sends ran."""
        for _ in range(5):
            await asyncio.sleep(0)
        return {
            data.partition: [m.broker_id for m in data.new_isr]
            for request in self.alters
            for data in request.partitions
        }


LAGGING = {0, 2, 64, 66, 130, 198, 1}  # led here (even) and one led by broker 2 (odd: not ours to shrink)


async def test_the_paced_isr_check_proposes_what_one_go_does(tmp_path: Path) -> None:
    one_go = _Broker(tmp_path / "a", LAGGING)
    paced = _Broker(tmp_path / "b", LAGGING)
    for broker in (one_go, paced):
        broker.clock.advance(LAG_MS)  # lagging exactly replica.lag.time.max.ms: still in sync
    one_go.replicas.check_isr_shrinks()
    pacer = YieldingPacer()
    await paced.replicas.check_isr_shrinks_paced(pacer)
    assert await one_go.proposals() == await paced.proposals() == {}
    for broker in (one_go, paced):
        broker.clock.advance(1)
    one_go.replicas.check_isr_shrinks()
    await paced.replicas.check_isr_shrinks_paced(pacer)
    expected = {p: [1] for p in LAGGING if p % 2 == 0}
    assert await one_go.proposals() == await paced.proposals() == expected
    assert pacer.pauses >= 2 * (PARTITIONS // 2 // 32)  # it did yield between its turns
    for broker in (one_go, paced):
        await broker.replicas.close()


async def test_a_paced_isr_check_skips_a_leadership_lost_between_its_turns(tmp_path: Path) -> None:
    """Partition 198 (last in the pass) lags, but broker 2 took its leadership while the pass yielded:
    this broker no longer proposes anything for it; partition 0, checked before, was proposed."""
    broker = _Broker(tmp_path, {0, 198})
    broker.clock.advance(LAG_MS + 1)
    old_state = broker.replicas.leader_state(TopicPartition(TOPIC, 198))

    async def at_turn(turn: int) -> None:
        if turn == 1:
            broker.apply(_image({198: 2}))

    await broker.replicas.check_isr_shrinks_paced(YieldingPacer(at_turn))
    assert await broker.proposals() == {0: [1]}
    assert old_state is not None and old_state.pending is None  # not even proposed on the dropped state
    assert broker.replicas.leader_state(TopicPartition(TOPIC, 198)) is None
    await broker.replicas.close()


async def test_a_paced_isr_check_ends_when_the_lease_lapses_between_its_turns(tmp_path: Path) -> None:
    lease = SwitchableLease()
    broker = _Broker(tmp_path, {0, 198}, lease)
    broker.clock.advance(LAG_MS + 1)

    async def at_turn(turn: int) -> None:
        lease.valid = False  # its followers lag because it refuses them: not theirs to pay for

    await broker.replicas.check_isr_shrinks_paced(YieldingPacer(at_turn))
    assert await broker.proposals() == {0: [1]}
    await broker.replicas.close()


def _stored(broker: _Broker, root: Path) -> dict[tuple[TopicPartition, str], int]:
    read = hwm_checkpoint.read_checked(root)
    assert read.problem == ""
    return read.entries


async def test_the_paced_checkpoint_writes_what_one_go_would_and_skips_an_unchanged_tick(
    tmp_path: Path,
) -> None:
    broker = _Broker(tmp_path, set())
    replicas = broker.replicas
    followed = replicas._followed[TopicPartition(TOPIC, 1)]
    followed.high_watermark = 5
    assert await replicas.write_checkpoints(YieldingPacer()) == 1
    expected = replicas._checkpoint_entries()[tmp_path]
    assert len(expected) == PARTITIONS and expected[(TopicPartition(TOPIC, 1), TOPIC_ID)] == 5
    assert _stored(broker, tmp_path) == expected
    assert await replicas.write_checkpoints(YieldingPacer()) == 0  # nothing moved: nothing written
    followed.high_watermark = 6
    assert await replicas.write_checkpoints(YieldingPacer()) == 1
    assert _stored(broker, tmp_path)[(TopicPartition(TOPIC, 1), TOPIC_ID)] == 6
    assert replicas.checkpoints.writes == 2
    await replicas.close()


async def test_a_high_watermark_lowered_by_an_unclean_truncation_mid_pass_is_written_lowered(
    tmp_path: Path,
) -> None:
    """The pass read 9 for partition 1; while it yielded, an unclean election's truncation lowered that
    high watermark to 0: the file says 0, never 9.  Turn 1 ends after the led partitions were collected
    (partition 1, followed, not yet), turn 2 after the followed ones (9 collected), turn 3 after the
    entries were encoded (they are encoded again)."""
    tp = TopicPartition(TOPIC, 1)
    for lowered_at in (1, 2, 3):
        root = tmp_path / str(lowered_at)
        broker = _Broker(root, set())
        followed = broker.replicas._followed[tp]
        followed.high_watermark = 9
        lowered: list[int] = []

        async def at_turn(
            turn: int, at: int = lowered_at, broker: _Broker = broker, lowered: list[int] = lowered
        ) -> None:
            if turn == at:
                state = broker.replicas._followed[tp]
                step = broker.replicas._truncate_below_high_watermark(state, tp, EpochEndOffset(0, 0), 1)
                lowered.append(step.offset)

        pacer = YieldingPacer(at_turn)
        assert await broker.replicas.write_checkpoints(pacer) == 1
        assert lowered == [0] and followed.high_watermark == 0
        assert pacer.pauses >= 3
        assert _stored(broker, root)[(tp, TOPIC_ID)] == 0
        await broker.replicas.close()


async def test_a_paced_checkpoint_overtaken_by_close_writes_nothing_after_the_final_write(
    tmp_path: Path,
) -> None:
    broker = _Broker(tmp_path, set())
    replicas = broker.replicas
    followed = replicas._followed[TopicPartition(TOPIC, 1)]
    followed.high_watermark = 3

    async def at_turn(turn: int) -> None:
        if turn == 2:
            followed.high_watermark = 4
            await replicas.close()  # the final write: HWM 4

    assert await replicas.write_checkpoints(YieldingPacer(at_turn)) == 0
    assert _stored(broker, tmp_path)[(TopicPartition(TOPIC, 1), TOPIC_ID)] == 4
    assert replicas.checkpoints.writes == 1


@pytest.mark.parametrize("count", [0, 1, 255, 256, 257, 1_000])
async def test_paced_encoding_and_comparison_match_their_one_go_forms(count: int) -> None:
    entries = {(TopicPartition(f"t{i % 7}", i), f"id-{i % 7}"): i * 3 for i in range(count)}
    assert await hwm_checkpoint.encode_paced(entries, YieldingPacer()) == hwm_checkpoint.encode(entries)
    assert hwm_checkpoint.decode(hwm_checkpoint.encode(entries)) == entries
    assert await hwm_checkpoint.same_paced(dict(entries), entries, YieldingPacer())
    assert not await hwm_checkpoint.same_paced(None, entries, YieldingPacer())
    if count:
        key = next(reversed(entries))
        moved = {**entries, key: entries[key] + 1}
        assert not await hwm_checkpoint.same_paced(moved, entries, YieldingPacer())
        fewer = dict(entries)
        del fewer[key]
        assert not await hwm_checkpoint.same_paced(fewer, entries, YieldingPacer())
        other = {**fewer, (TopicPartition("other", 0), "x"): 0}
        assert not await hwm_checkpoint.same_paced(other, entries, YieldingPacer())


async def test_an_image_s_visit_runs_inside_heap_big_change_with_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The visit of the partitions an image changed is what kraft.broker.heap sizes: the first image
    (every hosted partition) pauses the collector and freezes; one partition's change does not."""
    sizes: list[int] = []
    real = heap.big_change

    @contextmanager
    def recording(partitions: int) -> Iterator[None]:
        sizes.append(partitions)
        with real(partitions):
            yield

    monkeypatch.setattr(heap, "big_change", recording)
    monkeypatch.setattr(heap, "BIG_CHANGE", PARTITIONS)
    frozen = gc.get_freeze_count()
    try:
        broker = _Broker(tmp_path, set())
        assert sizes == [PARTITIONS] and gc.get_freeze_count() > frozen and gc.isenabled()
        broker.apply(_image({0: 2}))
        assert sizes == [PARTITIONS, 1]
        await broker.replicas.close()
    finally:
        gc.unfreeze()


class _Waiting:
    """An acks=all request waiting on every led partition (one record appended past what the followers
    have), as tasks."""

    def __init__(self, broker: _Broker) -> None:
        self.broker = broker
        self.led = list(range(0, PARTITIONS, 2))
        self.tasks: list[asyncio.Task[ErrorCode]] = []
        for p in self.led:
            log = broker.log(p)
            log.append_records([ProducedRecord(None, b"y", 0)], 0)
            log.flush()
            partition = broker.manager.get(TopicPartition(TOPIC, p))
            assert partition is not None
            waiter = broker.replicas.wait_for_acks(partition, log.log_end_offset)
            self.tasks.append(asyncio.ensure_future(waiter))

    def catch_up(self) -> None:
        """Every follower fetches up to its leader's end (recorded; the HWM moves unless held)."""
        now = self.broker.clock.monotonic_ms()
        for p in self.led:
            state = self.broker.replicas.leader_state(TopicPartition(TOPIC, p))
            assert state is not None
            state.on_leader_end_offset(self.broker.log(p).flushed_offset)
            for replica in (2, 3):
                state.on_follower_fetch(replica, state.leader_end_offset, 0, now)

    def high_watermarks(self) -> list[int]:
        states = [self.broker.replicas.leader_state(TopicPartition(TOPIC, p)) for p in self.led]
        return [state.high_watermark for state in states if state is not None]


async def test_a_lease_lapse_holds_every_high_watermark_at_once_and_fails_the_waiters_in_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 led partitions, 8 a turn: the lapse holds every high watermark in its own turn (a follower
    catching up moves none, no request succeeds), the walk fails every waiting request within its
    turns, and a new request is refused at once; the return's walk advances them all."""
    monkeypatch.setattr(replication, "LEASE_WALK_STEP", 8)
    lease = SwitchableLease()
    broker = _Broker(tmp_path, set(), lease)
    broker.replicas.lease_walk_pacer = YieldingPacer
    waiting = _Waiting(broker)
    await asyncio.sleep(0)  # (the requests are waiting)
    before = waiting.high_watermarks()
    lease.valid = False
    assert broker.replicas.check_lease() is False
    waiting.catch_up()  # recorded while held: the high watermarks stay
    assert waiting.high_watermarks() == before
    assert all(not t.done() for t in waiting.tasks)  # (the walk has not answered them yet)
    partition = broker.manager.get(TopicPartition(TOPIC, 0))
    assert partition is not None
    assert await broker.replicas.wait_for_acks(partition, 1) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    turns = 0
    while not all(t.done() for t in waiting.tasks):
        await asyncio.sleep(0)
        turns += 1
    assert turns >= len(waiting.led) // 8 - 1  # (in turns of 8)
    assert {t.result() for t in waiting.tasks} == {ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert waiting.high_watermarks() == before
    lease.valid = True
    assert broker.replicas.check_lease() is True
    await broker.replicas.wait_lease_applied()
    assert waiting.high_watermarks() == [1] * len(waiting.led)  # released: caught up
    await broker.replicas.close()


async def test_a_lease_back_before_the_lapse_walk_ended_fails_every_request_waiting_at_the_lapse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replication, "LEASE_WALK_STEP", 8)
    lease = SwitchableLease()
    broker = _Broker(tmp_path, set(), lease)
    broker.replicas.lease_walk_pacer = YieldingPacer
    waiting = _Waiting(broker)
    await asyncio.sleep(0)
    lease.valid = False
    broker.replicas.check_lease()
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # (the walk took a turn or two of the 13)
    states = list(broker.replicas._led.values())
    assert 0 < sum(not led.waiters for led in states) < len(waiting.led)
    lease.valid = True
    broker.replicas.check_lease()  # the rest of the lapse's walk, in this turn
    assert all(not led.waiters for led in states)
    assert set(await asyncio.gather(*waiting.tasks)) == {ErrorCode.NOT_LEADER_OR_FOLLOWER}
    waiting.catch_up()  # (after the return: each advances at once)
    assert waiting.high_watermarks() == [1] * len(waiting.led)
    await broker.replicas.close()
