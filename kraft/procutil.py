"""Child-process helpers shared by ``kraft cluster``, the integration-test quorum and the benchmarks.

One way to start a node-like child (own session, output appended to a log file), to stop one
(SIGTERM, then SIGKILL if it overstays) and to quote the end of its log in an error message.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def spawn_logged(
    command: Sequence[str],
    log_path: Path,
    *,
    banner: str,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` with stdout and stderr appended to ``log_path`` after a ``banner`` line.

    The child leads its own session, so a Ctrl-C in the terminal that started it (a test run, ``kraft
    cluster up``) does not reach it before its owner stops it, and its process group can be signalled
    as a whole.  Python children run unbuffered so the log is current when a failure quotes it.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    with log_path.open("ab") as log:
        log.write(f"{banner}\n".encode())
        log.flush()
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )


def reap(
    process: subprocess.Popen[bytes], timeout_s: float = 10.0, kill_wait_s: float | None = None
) -> int | None:
    """Wait for an already signalled process; SIGKILL it if it has not exited within ``timeout_s``.

    Returns its exit code, or None if it outlived SIGKILL by ``kill_wait_s`` (default ``timeout_s``): an
    uninterruptible sleep, nothing more can be done from here.
    """
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.wait(timeout=timeout_s if kill_wait_s is None else kill_wait_s)
    return None


def log_tail(log_path: Path, lines: int) -> str:
    """The last ``lines`` lines of ``log_path`` (for failure messages); a note when there is no log."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return f"(no log at {log_path})"
    return "\n".join(text.splitlines()[-lines:])
