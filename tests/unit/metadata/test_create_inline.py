"""A lone small CreateTopics runs its event in the request's own task when the event queue is empty
(``INLINE_CREATE_MAX_PARTITIONS``, ``ControllerEventQueue.run``'s ``inline_when_idle``); anything larger,
or anything arriving while the queue holds an event, goes through the queue's runner in the queue's order
(raft-performance.md, "A lone CreateTopics' hops, traced again (session 17)")."""

from __future__ import annotations

import asyncio

import pytest

from kraft.errors import ErrorCode
from kraft.metadata.controller import INLINE_CREATE_MAX_PARTITIONS, ControllerOptions, QuorumController
from kraft.metadata.event_queue import EventPriority
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER, activate_broker, started, until


def _record_event_tasks(
    controller: QuorumController, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, str]]:
    """(event name, name of the task it ran in) for every write event from now on."""
    seen: list[tuple[str, str]] = []
    writes = controller.writes
    run_event = writes._run_event

    def recorded(build: object) -> object:
        task = asyncio.current_task()
        seen.append(("write", task.get_name() if task is not None else "?"))
        return run_event(build)  # type: ignore[arg-type]

    monkeypatch.setattr(writes, "_run_event", recorded)
    return seen


async def _create(
    controller: QuorumController, name: str, partitions: int, queued: list[str] | None = None
) -> None:
    """CreateTopics in a task named "request"; with ``queued``, a normal event is queued in the same step
    right before the request reaches the queue (it lands in ``queued`` when it runs)."""
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)],
    )

    async def call() -> cpb.CreateTopicsResponse:
        if queued is not None:
            controller.writes.queue.submit(EventPriority.NORMAL, "queued", lambda: queued.append("queued"))
        return await controller.create_topics(request)

    response = await asyncio.create_task(call(), name="request")
    assert response.error_code == ErrorCode.NONE and response.topics[0].error_code == ErrorCode.NONE


async def test_only_a_small_create_on_an_empty_queue_runs_in_the_requests_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=100)
    raft, controller = await started(options)
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        await activate_broker(controller, 1)
        seen = _record_event_tasks(controller, monkeypatch)
        await _create(controller, "one", 1)
        await _create(controller, "four", INLINE_CREATE_MAX_PARTITIONS)  # at the bound
        await _create(controller, "five", INLINE_CREATE_MAX_PARTITIONS + 1)  # more partitions than the bound
        assert [task for _, task in seen] == ["request", "request", "controller-event-queue"]
        seen.clear()
        # an event already queued: the small create goes behind it, through the runner
        ran: list[str] = []
        await _create(controller, "behind", 1, queued=ran)
        assert ran == ["queued"]
        assert [task for _, task in seen] == ["controller-event-queue"]
        assert controller.writes.queue.processed[-2:] == ["queued", "create-topics"]
    finally:
        await controller.stop()


async def test_a_small_create_whose_records_exceed_a_work_unit_goes_through_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=2)
    raft, controller = await started(options)
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        await activate_broker(controller, 1)
        seen = _record_event_tasks(controller, monkeypatch)
        await _create(controller, "one", 1)  # 2 records: within the unit
        await _create(controller, "two", 2)  # 3 records: bulk work at this unit
        assert [task for _, task in seen][:2] == ["request", "controller-event-queue"]
    finally:
        await controller.stop()
