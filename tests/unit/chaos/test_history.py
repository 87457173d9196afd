"""The history recorder and its SQLite store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.history import (
    HISTORY_FILE,
    EventType,
    History,
    HistoryError,
    HistoryStore,
    load_events,
    load_meta,
    pair_operations,
)


def _ticking_clock() -> Callable[[], int]:
    ticks = iter(range(0, 10_000, 10))
    return lambda: next(ticks)


def test_operations_pair_invocations_with_completions() -> None:
    history = History(_ticking_clock())
    a = history.invoke(1, "create", "t1")
    b = history.invoke(2, "delete", "t2")
    history.ok(b.op_id, "not_found")
    history.fail(a.op_id, "NOT_CONTROLLER")
    c = history.invoke(3, "create", "t3", value={"partitions": 1})
    ops = history.operations()
    assert [(o.f, o.key, o.outcome) for o in ops] == [
        ("create", "t1", EventType.FAIL),
        ("delete", "t2", EventType.OK),
        ("create", "t3", EventType.INFO),  # never completed
    ]
    assert ops[0].invoke_ns == 0 and ops[0].complete_ns == 30 and ops[0].error == "NOT_CONTROLLER"
    assert ops[1].result == "not_found" and ops[1].end_ns == 20
    assert ops[2].end_ns == float("inf") and ops[2].value == {"partitions": 1}
    assert c.op_id not in (a.op_id, b.op_id)


def test_a_process_has_at_most_one_operation_in_flight() -> None:
    history = History(_ticking_clock())
    first = history.invoke(1, "create", "t")
    with pytest.raises(HistoryError, match="already has"):
        history.invoke(1, "create", "u")
    history.info(first.op_id, "deadline exceeded")
    with pytest.raises(HistoryError, match="not in flight"):
        history.ok(first.op_id)
    history.invoke(1, "create", "u")
    assert history.operations()[0].outcome is EventType.INFO


async def test_store_persists_every_event_and_reloads_them(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    store = await HistoryStore.create(path, _ticking_clock())
    try:
        await store.set_meta("seed", 42)
        invoked = await store.invoke(7, "create", "topic-1", {"partitions": 3})
        await store.complete(invoked.op_id, EventType.OK, "created")
        pending = await store.invoke(8, "delete", "topic-1")
        await store.complete(pending.op_id, EventType.INFO, error="timeout")
    finally:
        await store.close()
    events = await load_events(path)
    assert events == store.history.events
    assert pair_operations(events) == store.history.operations()
    assert await load_meta(path) == {"seed": 42}


async def test_store_refuses_to_overwrite_a_previous_run(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    store = await HistoryStore.create(path)
    await store.close()
    with pytest.raises(HistoryError, match="already exists"):
        await HistoryStore.create(path)
