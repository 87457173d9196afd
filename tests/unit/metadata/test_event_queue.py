"""The controller's event queue (kraft/metadata/event_queue.py): urgent events (heartbeats, registrations)
run before queued normal ones, a bulk operation that enqueues its next slice after each one lets every
urgent event that arrived meanwhile go first, errors reach the submitter, cancelled events are skipped,
and closing fails what is still queued.  Pure asyncio, no clock: the order depends only on submissions."""

from __future__ import annotations

import asyncio

import pytest

from kraft.metadata.event_queue import (
    URGENT_BURST,
    ControllerEventQueue,
    EventPriority,
    EventQueueClosedError,
)

URGENT, NORMAL = EventPriority.URGENT, EventPriority.NORMAL


async def test_urgent_events_run_before_queued_normal_ones() -> None:
    queue = ControllerEventQueue()
    ran: list[str] = []
    futures = [queue.submit(NORMAL, f"n{i}", lambda i=i: ran.append(f"n{i}")) for i in range(3)]  # type: ignore[misc]
    futures.append(queue.submit(URGENT, "u0", lambda: ran.append("u0")))
    futures.append(queue.submit(NORMAL, "n3", lambda: ran.append("n3")))
    futures.append(queue.submit(URGENT, "u1", lambda: ran.append("u1")))
    await asyncio.gather(*futures)
    assert ran == ["u0", "u1", "n0", "n1", "n2", "n3"]
    assert queue.processed == ran
    await queue.close()


async def test_a_heartbeat_behind_a_bulk_operation_runs_before_its_remaining_slices() -> None:
    queue = ControllerEventQueue()
    ran: list[str] = []
    heartbeat: list[asyncio.Future[str]] = []

    def beat() -> str:
        ran.append("heartbeat")
        return "answered"

    def bulk_slice(index: int) -> int:
        ran.append(f"slice{index}")
        if index == 0:
            # A heartbeat arrives while the first slice runs: it is queued behind the bulk operation.
            heartbeat.append(queue.submit(URGENT, "heartbeat", beat))
        return index

    async def bulk() -> None:
        for index in range(4):  # each slice is its own event, enqueued after the previous one ran
            assert await queue.run(NORMAL, "bulk-slice", lambda i=index: bulk_slice(i)) == index  # type: ignore[misc]

    await bulk()
    assert await heartbeat[0] == "answered"
    assert ran == ["slice0", "heartbeat", "slice1", "slice2", "slice3"]
    await queue.close()


async def test_an_other_task_submitting_normal_work_does_not_overtake_urgent_work() -> None:
    queue = ControllerEventQueue()
    ran: list[str] = []
    normal = [queue.submit(NORMAL, "admin", lambda: ran.append("admin"))]
    urgent = [queue.submit(URGENT, f"beat{i}", lambda i=i: ran.append(f"beat{i}")) for i in range(3)]  # type: ignore[misc]
    normal.append(queue.submit(NORMAL, "admin2", lambda: ran.append("admin2")))
    await asyncio.gather(*normal, *urgent)
    assert ran == ["beat0", "beat1", "beat2", "admin", "admin2"]
    await queue.close()


async def test_errors_reach_the_submitter_and_the_queue_goes_on() -> None:
    queue = ControllerEventQueue()

    def fail() -> None:
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        await queue.run(NORMAL, "fails", fail)
    assert await queue.run(NORMAL, "after", lambda: 42) == 42
    await queue.close()


async def test_a_cancelled_event_is_skipped() -> None:
    queue = ControllerEventQueue()
    ran: list[str] = []
    first = queue.submit(NORMAL, "first", lambda: ran.append("first"))
    skipped = queue.submit(NORMAL, "skipped", lambda: ran.append("skipped"))
    skipped.cancel()
    await first
    await queue.run(NORMAL, "last", lambda: ran.append("last"))
    assert ran == ["first", "last"]
    await queue.close()


async def test_closing_fails_queued_events_and_refuses_new_ones() -> None:
    queue = ControllerEventQueue()
    queued = queue.submit(NORMAL, "queued", lambda: 1)  # the runner has not had a turn yet
    await queue.close()
    with pytest.raises(EventQueueClosedError):
        await queued
    with pytest.raises(EventQueueClosedError):
        await queue.submit(URGENT, "late", lambda: 2)


async def test_a_burst_of_urgent_events_yields_the_loop_between_bursts() -> None:
    queue = ControllerEventQueue()
    turns = 0
    seen: list[int] = []

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    futures = [queue.submit(URGENT, f"u{i}", lambda: seen.append(turns)) for i in range(URGENT_BURST * 2)]
    await asyncio.gather(*futures)
    counter.cancel()
    # the first burst runs in one loop turn, the second in a later one: other tasks ran in between
    assert len(set(seen[:URGENT_BURST])) == 1 and len(set(seen[URGENT_BURST:])) == 1
    assert seen[URGENT_BURST] > seen[0]
    await queue.close()


async def test_an_urgent_event_with_none_queued_runs_at_once_in_the_callers_task() -> None:
    """Re-landed from 481808f (issue #17): no loop turn to hand a heartbeat to the runner and back."""
    queue = ControllerEventQueue()
    ran: list[str] = []
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    queued = queue.submit(NORMAL, "bulk-slice", lambda: ran.append("bulk-slice"))  # not run yet
    before = turns

    def beat() -> str:
        ran.append("heartbeat")
        return "answered"

    assert await queue.run(URGENT, "heartbeat", beat) == "answered"
    assert turns == before  # no loop turn: not handed to the runner task and back
    assert ran == ["heartbeat"]  # ahead of the queued normal event, as the queue would order it
    await queued
    assert ran == ["heartbeat", "bulk-slice"]
    assert queue.processed == ran
    counter.cancel()
    await queue.close()


async def test_an_urgent_event_goes_behind_urgent_events_already_queued() -> None:
    queue = ControllerEventQueue()
    ran: list[str] = []
    earlier = [queue.submit(URGENT, f"beat{i}", lambda i=i: ran.append(f"beat{i}")) for i in range(2)]  # type: ignore[misc]
    await queue.run(URGENT, "late", lambda: ran.append("late"))
    await asyncio.gather(*earlier)
    assert ran == ["beat0", "beat1", "late"]
    await queue.close()


async def test_urgent_events_are_refused_once_closed_and_errors_of_inline_ones_reach_the_caller() -> None:
    queue = ControllerEventQueue()

    def fail() -> None:
        raise ValueError("stale epoch")

    with pytest.raises(ValueError, match="stale epoch"):
        await queue.run(URGENT, "beat", fail)
    assert queue.processed == ["beat"]
    await queue.close()
    with pytest.raises(EventQueueClosedError):
        await queue.run(URGENT, "after-close", lambda: None)
