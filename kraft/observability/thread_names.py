"""Native names for kraft's own threads, so ``/proc/<pid>/task/<tid>/comm``, ``top -H`` and the benchmarks'
per-thread CPU (``bench.controller --cpu``) say which thread is the intake loop, the fsync worker, …

CPython (before 3.14) names a thread only in Python: every thread of a controller shows ``python`` to the
kernel, and the per-thread CPU reports of sessions 10 to 14 had to guess which unnamed thread was which.
``named_target`` wraps a thread's target so the thread sets its own kernel name (``PR_SET_NAME``, at most
15 bytes) as its first step; where that is not available (not Linux, no libc) the thread runs unnamed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from typing import Any

_PR_SET_NAME = 15  # <linux/prctl.h>
_COMM_BYTES = 15  # TASK_COMM_LEN 16, with the NUL
_PREFIX = "kraft-"


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] | None = getattr(libc, "prctl", None)
    return prctl


_prctl = _load_prctl()


def native_name(name: str) -> bytes:
    """The kernel name for a thread called ``name``: without the ``kraft-`` prefix every kraft thread
    shares, cut to 15 bytes (the kernel's limit) on a character boundary."""
    short = name[len(_PREFIX) :] if name.startswith(_PREFIX) and len(name) > len(_PREFIX) else name
    encoded = short.encode("utf-8")[:_COMM_BYTES]
    return encoded.decode("utf-8", "ignore").encode("utf-8")


def set_native_name(name: str) -> bool:
    """Give the calling thread the kernel name for ``name``; False where it could not be set."""
    if _prctl is None:
        return False
    return _prctl(_PR_SET_NAME, ctypes.c_char_p(native_name(name)), 0, 0, 0) == 0


def named_target(name: str, target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` run by a thread that first names itself ``name`` to the kernel."""

    def run(*args: Any, **kwargs: Any) -> Any:
        set_native_name(name)
        return target(*args, **kwargs)

    return run


def rename_native_thread(native_id: int, name: str) -> bool:
    """Give another thread of this process the kernel name for ``name`` (``/proc/self/task/<tid>/comm``
    is writable for any thread of the same process); False where it could not be set (not Linux, the
    thread ended)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(f"/proc/self/task/{native_id}/comm", "wb") as comm:
            comm.write(native_name(name))
    except OSError:
        return False
    return True
