"""The event-loop choice for long-running processes (kraft.runtime)."""

from __future__ import annotations

import asyncio

import pytest

from kraft.runtime import EVENT_LOOP_ENV, EventLoopChoiceError, loop_factory, run_server, running_loop_name


async def _loop_name() -> str:
    await asyncio.sleep(0)
    await asyncio.to_thread(lambda: None)  # the worker-thread hop the Raft driver's fsyncs rely on
    return running_loop_name()


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert loop_factory() is not None
    assert run_server(_loop_name()) == "uvloop"


def test_the_standard_loop_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    assert loop_factory() is None
    assert run_server(_loop_name()) == "asyncio"


def test_an_unknown_loop_is_an_error_and_the_coroutine_is_not_left_dangling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    coroutine = _loop_name()
    with pytest.raises(
        EventLoopChoiceError, match=r"KRAFT_EVENT_LOOP='trio': must be one of uvloop, asyncio"
    ):
        run_server(coroutine)
    assert coroutine.cr_frame is None  # closed, so no "never awaited" warning
