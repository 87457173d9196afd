"""kraft's threads carry their names to the kernel (kraft/observability/thread_names.py), so per-thread CPU
reports (``/proc/<pid>/task/<tid>/comm``, ``bench.controller --cpu``, ``top -H``) tell them apart."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

from kraft.node.intake import GRPC_POLLER_NAME, IntakeLoop, name_grpc_poller
from kraft.observability.thread_names import named_target, native_name
from kraft.raft.sync_worker import SyncWorker

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names: Linux")


def _comm(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


def test_the_native_name_drops_the_shared_prefix_and_fits_the_kernels_15_bytes() -> None:
    assert native_name("kraft-loop-stall-monitor") == b"loop-stall-moni"
    assert native_name("grpc-intake") == b"grpc-intake"
    assert native_name("kraft-") == b"kraft-"
    # cut on a character boundary: no half of a multi-byte character left at the end
    assert native_name("raft-fsync-ü" + "x" * 10) == "raft-fsync-ü".encode()[:15] + b"xx"
    assert native_name("abcdefghijklmn€") == b"abcdefghijklmn"


@linux_only
def test_a_named_target_names_its_thread_to_the_kernel_before_it_runs() -> None:
    seen: list[str] = []

    def work() -> None:
        seen.append(_comm(threading.get_native_id()))

    thread = threading.Thread(target=named_target("kraft-probe-thread", work))
    thread.start()
    thread.join(timeout=10)
    assert seen == ["probe-thread"]


@linux_only
def test_the_intake_loop_and_the_fsync_worker_are_named_to_the_kernel() -> None:
    intake = IntakeLoop()
    intake.start()
    try:

        async def where() -> int:
            return threading.get_native_id()

        tid = asyncio.run_coroutine_threadsafe(where(), intake.loop).result(timeout=10)
        assert _comm(tid) == "grpc-intake"
    finally:
        intake.close()

    async def fsync_thread() -> str:
        worker = SyncWorker("raft-fsync-7")
        try:
            return await asyncio.wait_for(worker.run(lambda: _comm(threading.get_native_id())), 10)
        finally:
            worker.stop()
            worker.join(10)

    assert asyncio.run(fsync_thread()) == "raft-fsync-7"


@linux_only
def test_grpcs_poller_started_from_the_intake_thread_is_renamed_not_a_second_intake_thread() -> None:
    """gRPC starts its poller thread (``Thread-N (_poll_wrapper)``) from the thread that builds the first aio
    server: on an intake loop it inherited the kernel name ``grpc-intake``.  A stand-in started the same way
    (from the intake thread, CPython's name for a ``_poll_wrapper`` target) keeps the rule independent of
    whether this process's real poller already exists."""
    intake = IntakeLoop()
    intake.start()
    release = threading.Event()
    try:

        async def start_poller() -> threading.Thread:
            poller = threading.Thread(target=release.wait, args=(10.0,), name="Thread-9 (_poll_wrapper)")
            poller.start()
            return poller

        poller = asyncio.run_coroutine_threadsafe(start_poller(), intake.loop).result(timeout=10)
        assert poller.native_id is not None
        assert _comm(poller.native_id) == "grpc-intake"  # inherited
        name_grpc_poller()
        assert _comm(poller.native_id) == GRPC_POLLER_NAME
    finally:
        release.set()
        intake.close()
    poller.join(timeout=10)
