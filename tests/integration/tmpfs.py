"""A small tmpfs to fill up (disk-full tests); skipped with the reason where mounting is not allowed."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs to fill ({exc}); needs root or CAP_SYS_ADMIN")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill: {mounted.stderr.strip()}; needs root or CAP_SYS_ADMIN")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10, check=False)


def fill(directory: Path) -> None:
    """Write a filler file until the file system says ENOSPC."""
    chunk = b"\0" * (64 * 1024)
    try:
        with (directory / "filler").open("wb") as out:
            while True:
                out.write(chunk)
                out.flush()
    except OSError as exc:  # possibly already at open: the node's own preallocated segments filled it
        assert exc.errno == errno.ENOSPC, exc
