"""The file log adapter answers a read of the leader's last built batch from the bytes it appended
(``SegmentedLogStore``'s tail: the parked Fetches and the listener read that batch back at once), and
every such answer is exactly what the log's own read gives — or the same error.  Each check below
compares against ``SegmentedLog.read`` itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kraft.raft.storage_adapters import SegmentedLogStore
from kraft.storage.batch import build_batch
from kraft.storage.errors import FatalStorageError, OffsetOutOfRangeError
from kraft.storage.log import SegmentedLog


def _batch(base: int, count: int, epoch: int = 1) -> bytes:
    return build_batch(
        base, [(None, b"r%d" % (base + i)) for i in range(count)], leader_epoch=epoch, timestamp_ms=0
    )


class CountingLog:
    """Counts the reads that reach the segmented log (the file)."""

    def __init__(self, store: SegmentedLogStore) -> None:
        self.log: SegmentedLog = store._log
        self.file_reads = 0
        read = self.log.read

        def counted(offset: int, max_bytes: int, *, max_offset: int | None = None) -> object:
            self.file_reads += 1
            return read(offset, max_bytes, max_offset=max_offset)

        self.log.read = counted  # type: ignore[method-assign,assignment]
        self._read = read

    def expected(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """The log's own answer (not counted)."""
        return self._read(offset, max_bytes, max_offset=max_offset).records


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentedLogStore]:
    opened = SegmentedLogStore.open(tmp_path / "log")
    yield opened
    opened.close()


def test_a_read_of_the_last_built_batch_is_answered_from_its_bytes(store: SegmentedLogStore) -> None:
    store.append(_batch(0, 2))
    own = _batch(2, 3)
    store.append(own, built=True)
    counting = CountingLog(store)
    assert store.read(2, 1 << 20) == own == counting.expected(2, 1 << 20)
    assert store.read(2, 1) == own  # at least one batch even past max_bytes, as the log
    assert store.read(2, 1 << 20, max_offset=5) == own == counting.expected(2, 1 << 20, max_offset=5)
    assert store.read(2, 1 << 20, max_offset=3) == own  # its base is below max_offset
    assert counting.file_reads == 0
    # anything else still goes to the file
    assert store.read(0, 1 << 20) == counting.expected(0, 1 << 20)
    assert store.read(2, 1 << 20, max_offset=2) == b"" == counting.expected(2, 1 << 20, max_offset=2)
    assert counting.file_reads == 2


def test_a_fetched_append_is_read_from_the_file(store: SegmentedLogStore) -> None:
    store.append(_batch(0, 2))
    counting = CountingLog(store)
    assert store.read(0, 1 << 20) == counting.expected(0, 1 << 20)
    assert counting.file_reads == 1


def test_the_tail_is_not_served_once_the_log_moved_past_it(store: SegmentedLogStore) -> None:
    store.append(_batch(0, 2), built=True)
    store.append(_batch(2, 1), built=True)  # a newer own batch: the read from 0 returns both
    store.append(_batch(3, 1))  # and a fetched one after it
    counting = CountingLog(store)
    assert store.read(2, 1 << 20) == counting.expected(2, 1 << 20) == _batch(2, 1) + _batch(3, 1)
    assert counting.file_reads == 1


def test_a_truncated_tail_is_not_served(store: SegmentedLogStore) -> None:
    store.append(_batch(0, 2))
    store.append(_batch(2, 2), built=True)
    store.truncate_to(2)
    with pytest.raises(OffsetOutOfRangeError):
        store.read(3, 1 << 20)
    assert store.read(2, 1 << 20) == b""  # the log's end: an empty read, not the truncated batch
    replaced = _batch(2, 1, epoch=2)
    store.append(replaced)  # another leader's batch at the same offset
    assert store.read(2, 1 << 20) == replaced


def test_a_failed_log_answers_no_read_from_the_tail(store: SegmentedLogStore) -> None:
    store.append(_batch(0, 2), built=True)
    log: SegmentedLog = store._log
    log._failed = FatalStorageError("injected")  # what a failed write or fsync leaves
    with pytest.raises(FatalStorageError):
        store.read(0, 1 << 20)


def test_a_closed_log_answers_no_read_from_the_tail(tmp_path: Path) -> None:
    opened = SegmentedLogStore.open(tmp_path / "log")
    opened.append(_batch(0, 2), built=True)
    opened.close()
    with pytest.raises(Exception, match="closed"):
        opened.read(0, 1 << 20)
