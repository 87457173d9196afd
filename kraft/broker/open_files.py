"""Raise the process's open-file limit before the broker opens its partition logs.

Every hosted partition keeps one file descriptor per log segment, so the common soft limit of 1,024 is
exhausted by a few hundred partitions (a 100,000-partition topic over three brokers ended every broker
with "Too many open files").  Raising the soft limit to the hard limit needs no privilege; the limit the
broker ends up with is logged so an operator can compare it with ``max.broker.partitions``.
"""

from __future__ import annotations

import resource
from typing import NamedTuple

from kraft.observability.logging import get_logger


class OpenFileLimit(NamedTuple):
    before: int
    after: int
    hard: int


def raise_open_file_limit() -> OpenFileLimit:
    """Set the soft RLIMIT_NOFILE to the hard limit (logs ``open_file_limit`` with before/after)."""
    log = get_logger("broker.open_files")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        # Linux refuses an infinite soft limit for files; nr_open is the real ceiling.
        target = _nr_open() or soft
    after = soft
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            after = target
        except (ValueError, OSError) as err:
            log.warning("open_file_limit_not_raised", soft=soft, hard=hard, error=str(err))
    log.info("open_file_limit", before=soft, after=after, hard=hard)
    return OpenFileLimit(soft, after, hard)


def _nr_open() -> int | None:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
