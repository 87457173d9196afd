"""Process helpers shared by the benchmarks."""

from __future__ import annotations

import contextlib
import subprocess


def reap(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Wait for an already signalled process; SIGKILL it if it has not exited within ``timeout_s``."""
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
