"""The broker's file descriptors: raise the open-file limit, size the LRU of open segment files.

A segment kept its file open for the life of the log, so the common soft limit of 1,024 was exhausted by
a few hundred partitions (a 100,000-partition topic over three brokers ended every broker with "Too many
open files").  Now (issue #14) the broker's partition logs share one
:class:`~kraft.storage.open_files.OpenFileCache` of :func:`open_segment_files_capacity` files, so an idle
partition costs no descriptor, and the soft limit is still raised to the hard limit at start (no
privilege needed; logged) for the sockets and files around them.
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


MIN_OPEN_SEGMENT_FILES = 64
MAX_AUTO_OPEN_SEGMENT_FILES = 16_384


def open_segment_files_capacity(configured: int) -> int:
    """How many segment files a broker keeps open (``log.open.segment.files.max``; 0 = auto): auto is half
    the current soft RLIMIT_NOFILE (the rest is for sockets, the image store, checkpoints), between
    :data:`MIN_OPEN_SEGMENT_FILES` and :data:`MAX_AUTO_OPEN_SEGMENT_FILES`."""
    if configured > 0:
        return configured
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_AUTO_OPEN_SEGMENT_FILES
    return max(MIN_OPEN_SEGMENT_FILES, min(soft // 2, MAX_AUTO_OPEN_SEGMENT_FILES))


def _nr_open() -> int | None:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
