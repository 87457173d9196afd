"""Listeners get a batch's records decoded on first use (kraft.raft.listeners.LazyRecords)."""

from __future__ import annotations

from kraft.raft.api import CommittedRecord
from kraft.raft.listeners import LazyRecords
from kraft.storage.batch import build_batch


def test_records_are_decoded_on_first_use_and_read_like_a_list() -> None:
    first = build_batch(10, [(None, b"a"), (None, b"b")], leader_epoch=3, timestamp_ms=1)
    second = build_batch(12, [(None, b"c"), (None, b""), (None, b"e")], leader_epoch=3, timestamp_ms=2)
    data = first + second
    lazy = LazyRecords(data, len(first))
    assert lazy._records is None  # nothing decoded yet
    assert len(lazy) == 3
    assert lazy._data == b""  # the read buffer is let go once decoded
    assert lazy[0] == CommittedRecord(12, b"c") and lazy[-1] == CommittedRecord(14, b"e")
    assert list(lazy[1:]) == [CommittedRecord(13, b""), CommittedRecord(14, b"e")]
    assert list(lazy) == [CommittedRecord(12, b"c"), CommittedRecord(13, b""), CommittedRecord(14, b"e")]
    assert list(LazyRecords(data, 0)) == [CommittedRecord(10, b"a"), CommittedRecord(11, b"b")]
