"""A follower's fetched bytes are CRC-checked once per round, not twice (issue #17, session 20).

The core scans what a Fetch brought (:class:`kraft.raft.driver.FetchedBatchScan`: CRC, magic, offsets) and
the driver appends those same bytes in the same step.  The scan keeps the headers it checked and hands
them to that append (``LogStore.append(checked=...)``), once and only for the very ``bytes`` object it
scanned; the segmented log then skips its own CRC pass but still checks its size cap, that the headers
tile the buffer, the offsets and the epochs, and the log's tail takes the same headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kraft.raft.driver import FetchedBatchScan, scan_kafka_batches
from kraft.raft.storage_adapters import SegmentedLogStore
from kraft.storage.batch import BatchHeader, build_batch, iter_batch_headers
from kraft.storage.errors import CorruptRecordError, InvalidAppendError, RecordTooLargeError
from kraft.storage.log import LogConfig, SegmentedLog


def _batches(base: int, count: int, records: int = 3, *, epoch: int = 1) -> bytes:
    out = b""
    for i in range(count):
        offset = base + i * records
        values = [(None, f"value-{offset + j}".encode()) for j in range(records)]
        out += build_batch(offset, values, leader_epoch=epoch, timestamp_ms=1_000 + offset)
    return out


def _headers(data: bytes) -> list[BatchHeader]:
    return [header for _, header in iter_batch_headers(data)]


def _corrupted(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # inside the last batch's records: covered by its CRC only
    return bytes(damaged)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentedLogStore]:
    opened = SegmentedLogStore.open(tmp_path / "log")
    yield opened
    opened.close()


def test_the_scan_hands_its_checked_headers_to_the_same_bytes_once() -> None:
    scan = FetchedBatchScan()
    data = _batches(0, 3)
    assert scan(data) == scan_kafka_batches(data)  # the core sees what it always saw
    assert scan.headers_for(bytes(bytearray(data))) is None  # equal bytes, another object: not these
    assert scan.headers_for(data) == _headers(data)
    assert scan.headers_for(data) is None  # once: a second append of the buffer checks it itself


def test_the_scan_hands_nothing_over_after_a_failed_scan_or_for_a_mutable_buffer() -> None:
    scan = FetchedBatchScan()
    data = _batches(0, 2)
    scan(data)
    with pytest.raises(CorruptRecordError):
        scan(_corrupted(_batches(6, 2)))
    assert scan.headers_for(data) is None  # the last scan failed: what it checked before is gone
    mutable = bytearray(_batches(0, 2))
    scan(mutable)  # type: ignore[arg-type]  # (a memory buffer could change between scan and append)
    assert scan.headers_for(mutable) is None  # type: ignore[arg-type]


def test_an_append_with_the_checked_headers_writes_and_keeps_what_the_checking_append_does(
    tmp_path: Path,
) -> None:
    checked_store = SegmentedLogStore.open(tmp_path / "checked")
    plain_store = SegmentedLogStore.open(tmp_path / "plain")
    try:
        scan = FetchedBatchScan()
        base = 0
        for count in (1, 4, 2):
            data = _batches(base, count)
            scan(data)
            checked_store.append(data, checked=scan.headers_for(data))
            plain_store.append(data)
            base += count * 3
        for store in (checked_store, plain_store):
            assert store.flush() == base
        assert checked_store.end_offset == plain_store.end_offset == base
        for offset in range(base):
            # From the tail (the headers handed over) and from the segment file alike.
            assert checked_store.read(offset, 1 << 20) == plain_store.read(offset, 1 << 20)
            assert checked_store.tail.read(offset, 200) == plain_store.tail.read(offset, 200)
    finally:
        checked_store.close()
        plain_store.close()
    checked_files = sorted(p.name for p in (tmp_path / "checked").iterdir())
    assert checked_files == sorted(p.name for p in (tmp_path / "plain").iterdir())
    for name in checked_files:
        if name.endswith(".log"):
            assert (tmp_path / "checked" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_checked_headers_must_tile_the_buffer_and_continue_the_log(store: SegmentedLogStore) -> None:
    data = _batches(0, 3)
    headers = _headers(data)
    with pytest.raises(InvalidAppendError, match="tile"):
        store.append(data, checked=headers[:-1])  # a batch's bytes unaccounted for
    with pytest.raises(InvalidAppendError, match="tile"):
        store.append(data, checked=[*headers, headers[-1]])  # more than the buffer holds
    later = _batches(3, 2)
    with pytest.raises(InvalidAppendError, match="does not continue"):
        store.append(later, checked=_headers(later))
    assert store.end_offset == 0
    assert store.tail.read(0, 1 << 20) is None  # nothing kept either
    store.append(data, checked=headers)
    assert store.end_offset == 9


def test_checked_headers_still_meet_the_logs_own_batch_size_cap(tmp_path: Path) -> None:
    data = _batches(0, 1, records=20)
    size = len(data)
    log = SegmentedLog.open(tmp_path / "log", LogConfig(max_batch_bytes=size - 1))
    try:
        with pytest.raises(RecordTooLargeError):
            log.append_batch(data, checked=_headers(data))
        assert log.end_offset == 0
    finally:
        log.close()
