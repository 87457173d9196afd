"""The fail-stop supervisor (issue #14): one ``fatal`` line, bounded cleanup, exit status 70."""

from __future__ import annotations

import asyncio
import errno
import io
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

from kraft.errors import ErrorCode, KraftError
from kraft.node.supervisor import EXIT_FATAL, Supervisor, error_fields
from kraft.observability.logging import configure_logging, get_logger


class Exited(BaseException):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def fake_exit(code: int) -> NoReturn:
    raise Exited(code)


class ManualWatchdog:
    """Records the armed deadline; the test fires it by hand (no real timer thread)."""

    def __init__(self) -> None:
        self.armed: list[float] = []
        self.fire: Callable[[], None] | None = None
        self.cancelled = False

    def __call__(self, deadline_s: float, fire: Callable[[], None]) -> ManualWatchdog:
        self.armed.append(deadline_s)
        self.fire = fire
        return self

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    try:
        yield stream
    finally:
        configure_logging("INFO")


def fatal_lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if " event=fatal " in line]


def make(watchdog: ManualWatchdog, cleanup_timeout_s: float = 0.5) -> Supervisor:
    return Supervisor(
        get_logger("test", node=1),
        exit_process=fake_exit,
        start_watchdog=watchdog,
        cleanup_timeout_s=cleanup_timeout_s,
        hard_deadline_s=0.9,
    )


async def test_a_failing_task_fails_the_process_with_one_fatal_line(log_stream: io.StringIO) -> None:
    watchdog = ManualWatchdog()
    supervisor = make(watchdog)

    async def broken() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/meta/00000000000000000042.log")

    supervisor.watch(asyncio.create_task(broken()), "raft-driver")
    stop = asyncio.Event()
    failure = await asyncio.wait_for(supervisor.wait(stop.wait()), 5)
    assert failure is not None and failure.reason == "task_failed"
    cleaned: list[bool] = []

    async def cleanup() -> None:
        cleaned.append(True)

    with pytest.raises(Exited) as exited:
        await supervisor.fail_stop(cleanup)
    assert exited.value.code == EXIT_FATAL == 70
    assert cleaned == [True]
    assert watchdog.armed == [0.9] and watchdog.cancelled
    [line] = fatal_lines(log_stream)
    assert "reason=task_failed" in line and "task=raft-driver" in line
    assert "errno=ENOSPC" in line and "file=/data/meta/00000000000000000042.log" in line
    assert "exit_code=70" in line


async def test_a_forever_task_that_returns_is_fatal_but_not_during_a_stop() -> None:
    supervisor = make(ManualWatchdog())

    async def quits() -> None:
        return None

    supervisor.watch(asyncio.create_task(quits()), "metadata-fetcher")
    failure = await asyncio.wait_for(supervisor.wait(asyncio.Event().wait()), 5)
    assert failure is not None and failure.reason == "task_exited"
    assert failure.fields == {"task": "metadata-fetcher"}

    calm = make(ManualWatchdog())
    task = asyncio.create_task(asyncio.Event().wait())
    calm.watch(task, "heartbeats")
    calm.begin_stop()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert calm.failure is None


async def test_a_stop_request_wins_when_nothing_failed() -> None:
    supervisor = make(ManualWatchdog())
    stop = asyncio.Event()
    stop.set()
    assert await asyncio.wait_for(supervisor.wait(stop.wait()), 5) is None


async def test_the_first_report_wins() -> None:
    supervisor = make(ManualWatchdog())
    supervisor.fail("raft_driver_failed", KraftError(ErrorCode.KAFKA_STORAGE_ERROR, "fsync failed"))
    supervisor.fail("task_failed", RuntimeError("later"))
    failure = supervisor.failure
    assert failure is not None and failure.reason == "raft_driver_failed"
    assert failure.fields["code"] == "KAFKA_STORAGE_ERROR"


async def test_a_hung_cleanup_is_abandoned_and_the_process_still_exits(log_stream: io.StringIO) -> None:
    watchdog = ManualWatchdog()
    supervisor = make(watchdog, cleanup_timeout_s=0.01)
    supervisor.fail("raft_listener_failed", ValueError("bad checkpoint CRC"))

    async def hangs() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Exited) as exited:
        await asyncio.wait_for(supervisor.fail_stop(hangs), 5)
    assert exited.value.code == EXIT_FATAL
    assert len(fatal_lines(log_stream)) == 1


def test_the_watchdog_exits_even_when_the_loop_never_comes_back() -> None:
    watchdog = ManualWatchdog()
    supervisor = make(watchdog)
    supervisor.fail("raft_driver_failed", OSError(errno.EIO, "Input/output error"))

    async def blocked_loop() -> None:
        # Simulates cleanup stuck in a blocking call: the watchdog (a thread in production) fires.
        assert watchdog.fire is not None
        watchdog.fire()

    async def main() -> None:
        await supervisor.fail_stop(blocked_loop)

    with pytest.raises(Exited) as exited:
        asyncio.run(main())
    assert exited.value.code == EXIT_FATAL


def test_error_fields_follow_the_cause_chain_to_the_os_error() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/d/x.log")
        except OSError as exc:
            raise KraftError(ErrorCode.KAFKA_STORAGE_ERROR, "append failed") from exc
    except KraftError as wrapped:
        fields = error_fields(wrapped)
    assert fields["errno"] == "ENOSPC" and fields["file"] == "/d/x.log"
    assert fields["code"] == "KAFKA_STORAGE_ERROR"
    assert str(fields["error"]).startswith("KraftError")
