"""A graceful stop saves the image store at the commit the node knew of, not where its listener was.

A follower applies a commit ``controller.quorum.follower.listener.delay.ms`` after it learns it, so a
stop right after a commit used to save a store behind the node's own log (the session-12 flake of
tests/integration/test_broker_cluster.py::test_a_broker_far_behind_bootstraps_from_a_snapshot).
``QuorumController.stop`` now replays the batches below Raft's high watermark from the log first, within a
time budget on the controller's clock (here a ManualClock).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from google.protobuf.message import Message

from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata.commit_replay import replay_known_commits
from kraft.metadata.controller import STOP_CATCH_UP_BUDGET_MS, QuorumController
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.raft.api import CommittedBatch, CommittedSlice, LeaderAndEpoch, OffsetBelowLogStartError
from kraft.storage.batch import build_batch
from kraft.v1 import metadata_pb2 as pb

from .fake_raft import FakeRaft

CLUSTER = "c1"
ENDPOINTS = {1: ("127.0.0.1", 9101)}
OTHER_LEADER = 2


class LaggingRaft(FakeRaft):
    """A follower's Raft: batches committed while ``hold_delivery`` is set move the high watermark but
    reach the listener only later (as the follower listener delay does); :meth:`read_committed` serves
    the committed log as encoded batches, as the real driver does."""

    def __init__(self, clock: ManualClock, *, read_cost_ms: int = 0, batches_per_read: int = 0) -> None:
        super().__init__(1)
        self._clock = clock
        self.hold_delivery = False
        self.read_cost_ms = read_cost_ms
        """Manual time each read takes (the budget test)."""
        self.batches_per_read = batches_per_read
        """At most this many batches per read (0: all)."""
        self.reads = 0
        self.read_error: Exception | None = None
        self.driver_quiet = asyncio.Event()
        """What ``yield_turn`` waits for: a follower's driver done with its output (the fsync included)."""
        self.driver_quiet.set()
        self.learned_high_watermark: int | None = None
        """While set, the high watermark this follower knows (below the leader's): the commits above it
        are in its log, and the leader's next Fetch answer (:attr:`leader_answer`) tells it of them."""
        self.leader_answer = asyncio.Event()
        self.learn_calls = 0

    @property
    def high_watermark(self) -> int:
        if self.learned_high_watermark is not None:
            return self.learned_high_watermark
        return super().high_watermark

    def stop_learning(self) -> None:
        """From now on, commits reach this follower's log but not its high watermark."""
        self.learned_high_watermark = super().high_watermark

    async def learn_log_end_commit(self) -> int:
        self.learn_calls += 1
        if self.learned_high_watermark is None or self.learned_high_watermark >= super().high_watermark:
            return self.high_watermark
        await self.leader_answer.wait()
        self.learned_high_watermark = None
        return self.high_watermark

    async def yield_turn(self) -> None:
        await asyncio.sleep(0)
        await self.driver_quiet.wait()

    def follow(self, leader_id: int) -> None:
        self._leader = LeaderAndEpoch(leader_id, 1)

    def commit(self, *payloads: Message) -> int:
        """Commit one batch of metadata records (from the leader); returns its last offset."""
        self._commit_batch([records.encode_value(records.wrap(p)) for p in payloads])
        return self._hwm - 1  # the leader's high watermark, learned or not

    def _broadcast(self, item: object) -> None:
        if isinstance(item, CommittedBatch) and self.hold_delivery:
            return  # committed, not yet handed to the listener
        super()._broadcast(item)

    async def read_committed(self, offset: int, max_bytes: int) -> CommittedSlice:
        self.reads += 1
        self._clock.advance(self.read_cost_ms)
        if self.read_error is not None:
            raise self.read_error
        data = b""
        next_offset = offset
        served = 0
        for batch in self.log:
            if batch.base_offset < offset or batch.base_offset >= self.high_watermark:
                continue
            if self.batches_per_read and served == self.batches_per_read:
                break
            values = [(None, r.value) for r in batch.records] or [(None, b"control")]
            data += build_batch(
                batch.base_offset, values, leader_epoch=batch.epoch, timestamp_ms=0, is_control=batch.control
            )
            next_offset = batch.last_offset + 1
            served += 1
        return CommittedSlice(data, next_offset, self.high_watermark, 0)


def topic(name: str) -> pb.TopicRecord:
    return pb.TopicRecord(name=name, topic_id=f"id-{name}")


async def stored(path: Path) -> MetadataImage:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        return await store.load()
    finally:
        await store.close()


async def started(raft: LaggingRaft, path: Path, clock: ManualClock) -> QuorumController:
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, store_path=path, clock=clock)
    await controller.start()
    return controller


async def until_applied(controller: QuorumController, offset: int) -> None:
    for _ in range(1000):  # loop turns, bounded: the fake delivers on the next turns
        if controller.committed.offset >= offset:
            return
        await _turn()
    raise AssertionError(f"offset {offset} never applied (at {controller.committed.offset})")


async def _turn() -> None:
    await asyncio.sleep(0)


async def test_a_follower_stopped_right_after_a_commit_saves_the_store_at_that_commit(tmp_path: Path) -> None:
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    path = tmp_path / "metadata-image.sqlite"
    controller = await started(raft, path, clock)
    applied = raft.commit(topic("early"))
    await until_applied(controller, applied)

    raft.hold_delivery = True  # the commits below arrive inside the listener delay
    raft.commit(topic("late-1"))
    last = raft.commit(topic("late-2"), topic("late-3"))
    for _ in range(20):
        await _turn()
    assert controller.committed.offset == applied  # the listener has not seen them

    await controller.stop()
    image = await stored(path)
    assert image.offset == last == raft.high_watermark - 1
    assert {t.name for t in image.topics_by_id.values()} == {"early", "late-1", "late-2", "late-3"}


async def test_the_stop_catch_up_ends_at_its_time_budget(tmp_path: Path) -> None:
    clock = ManualClock()
    # Each read (one batch) takes 40% of the budget: reads at 0, 40% and 80% of it, then it ran out.
    raft = LaggingRaft(clock, read_cost_ms=STOP_CATCH_UP_BUDGET_MS * 2 // 5, batches_per_read=1)
    raft.follow(OTHER_LEADER)
    path = tmp_path / "metadata-image.sqlite"
    controller = await started(raft, path, clock)
    raft.hold_delivery = True
    offsets = [raft.commit(topic(f"t{i}")) for i in range(6)]

    await controller.stop()
    assert raft.reads == 3
    image = await stored(path)
    assert image.offset == offsets[2]
    assert {t.name for t in image.topics_by_id.values()} == {"t0", "t1", "t2"}


async def test_the_catch_up_never_saves_an_image_inside_an_open_transaction() -> None:
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    before = raft.commit(topic("a"))
    raft.commit(pb.BeginTransactionRecord(name="big"), topic("b"))
    raft.commit(topic("c"))
    empty = MetadataImage.empty()

    reached = await replay_known_commits(raft, empty, clock, STOP_CATCH_UP_BUDGET_MS)
    assert reached.stopped == "caught_up" and reached.batches == 3
    assert reached.image.offset == before  # the last image outside the transaction
    assert not reached.image.transaction

    raft.commit(pb.EndTransactionRecord(), topic("d"))
    reached = await replay_known_commits(raft, empty, clock, STOP_CATCH_UP_BUDGET_MS)
    assert reached.image.offset == raft.high_watermark - 1
    assert {t.name for t in reached.image.topics_by_id.values()} == {"a", "b", "c", "d"}


async def test_a_log_read_failure_or_an_unreplayable_record_keeps_the_image_reached() -> None:
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    first = raft.commit(topic("a"))
    raft.commit(pb.PartitionChangeRecord(topic_id="missing", partition_id=0))  # does not fit the image
    raft.commit(topic("b"))

    reached = await replay_known_commits(raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS)
    assert (reached.stopped, reached.batches, reached.image.offset) == ("unreplayable", 1, first)

    raft.read_error = OffsetBelowLogStartError(0, 5, None)
    reached = await replay_known_commits(raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS)
    assert (reached.stopped, reached.batches, reached.image.offset) == ("error", 0, -1)


async def test_the_catch_up_waits_for_the_driver_s_flush_in_flight_before_reading_the_high_watermark() -> (
    None
):
    """A follower learns a high watermark with the records whose fsync is then still in flight: the
    catch-up waits (Raft's yield_turn) until the driver's output ran to its end, then reads it."""
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    raft.commit(topic("a"))
    raft.driver_quiet.clear()  # the output that brought the next records is still running
    catch_up = asyncio.ensure_future(
        replay_known_commits(raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS)
    )
    for _ in range(20):
        await _turn()
    assert not catch_up.done() and raft.reads == 0
    last = raft.commit(topic("b"))  # what that output committed, flushed once it ends
    raft.driver_quiet.set()
    reached = await asyncio.wait_for(catch_up, 5)
    assert (reached.stopped, reached.image.offset, reached.high_watermark) == ("caught_up", last, last + 1)


async def test_a_driver_that_never_parks_ends_the_catch_up_at_its_budget_with_nothing_replayed() -> None:
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    raft.commit(topic("a"))
    raft.driver_quiet.clear()
    # (The wait is on the event loop's time: a short budget, so the test does not sit out the real one.)
    reached = await asyncio.wait_for(replay_known_commits(raft, MetadataImage.empty(), clock, 20), 5)
    assert (reached.stopped, reached.batches, reached.image.offset, raft.reads) == ("budget", 0, -1, 0)


async def test_a_follower_stopping_waits_for_commits_in_its_log_it_has_not_learned(tmp_path: Path) -> None:
    """Records the leader committed are in the follower's log, but the Fetch that committed them was
    answered before: the stop waits (within its budget) for the leader's next answer and saves them."""
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    path = tmp_path / "metadata-image.sqlite"
    controller = await started(raft, path, clock)
    raft.hold_delivery = True
    known = raft.commit(topic("known"))
    raft.stop_learning()
    last = raft.commit(topic("unlearned-1"), topic("unlearned-2"))
    assert raft.high_watermark == known + 1

    stop = asyncio.ensure_future(controller.stop())
    for _ in range(50):
        await _turn()
    assert not stop.done() and raft.learn_calls == 1  # waiting for the leader's answer
    raft.leader_answer.set()
    await asyncio.wait_for(stop, 5)
    image = await stored(path)
    assert image.offset == last
    assert {t.name for t in image.topics_by_id.values()} == {"known", "unlearned-1", "unlearned-2"}


async def test_no_answer_from_the_leader_ends_the_wait_at_the_budget_with_the_known_commits() -> None:
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    known = raft.commit(topic("known"))
    raft.stop_learning()
    raft.commit(topic("unlearned"))
    # (The wait is on the event loop's time: a short budget, so the test does not sit out the real one.)
    reached = await asyncio.wait_for(replay_known_commits(raft, MetadataImage.empty(), clock, 20), 5)
    assert (reached.stopped, reached.image.offset, reached.high_watermark) == ("budget", known, known + 1)
    assert reached.known_high_watermark == known + 1
    assert {t.name for t in reached.image.topics_by_id.values()} == {"known"}


async def test_the_wait_only_spends_what_the_known_commits_left_of_the_budget() -> None:
    """The known commits come first; with the budget spent on them nothing waits for the leader."""
    clock = ManualClock()
    raft = LaggingRaft(clock, read_cost_ms=STOP_CATCH_UP_BUDGET_MS, batches_per_read=1)
    raft.follow(OTHER_LEADER)
    first = raft.commit(topic("a"))
    raft.stop_learning()
    raft.commit(topic("b"))
    reached = await asyncio.wait_for(
        replay_known_commits(raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS), 5
    )
    assert (reached.stopped, reached.image.offset, raft.learn_calls) == ("budget", first, 0)


async def test_a_learned_commit_is_replayed_and_learn_false_does_not_wait() -> None:
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    known = raft.commit(topic("a"))
    raft.stop_learning()
    last = raft.commit(topic("b"))
    reached = await replay_known_commits(
        raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS, learn=False
    )
    assert (reached.stopped, reached.image.offset, raft.learn_calls) == ("caught_up", known, 0)
    raft.leader_answer.set()
    reached = await replay_known_commits(raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS)
    assert (reached.stopped, reached.image.offset, reached.high_watermark) == ("caught_up", last, last + 1)
    assert (reached.known_high_watermark, reached.batches, raft.learn_calls) == (known + 1, 2, 1)


async def test_after_the_leader_s_answer_the_catch_up_waits_for_the_driver_s_output_before_reading() -> None:
    """The answer that brings the commit may bring the next records too, their fsync then in flight."""
    clock = ManualClock()
    raft = LaggingRaft(clock)
    raft.follow(OTHER_LEADER)
    raft.commit(topic("a"))
    raft.stop_learning()
    raft.commit(topic("b"))
    catch_up = asyncio.ensure_future(
        replay_known_commits(raft, MetadataImage.empty(), clock, STOP_CATCH_UP_BUDGET_MS)
    )
    for _ in range(20):
        await _turn()
    reads = raft.reads
    raft.driver_quiet.clear()  # the output with the leader's answer is still running
    raft.leader_answer.set()
    for _ in range(20):
        await _turn()
    assert not catch_up.done() and raft.reads == reads
    raft.driver_quiet.set()
    reached = await asyncio.wait_for(catch_up, 5)
    assert {t.name for t in reached.image.topics_by_id.values()} == {"a", "b"}
