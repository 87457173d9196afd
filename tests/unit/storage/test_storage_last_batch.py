"""A segment keeps the position of its last batch (issue #17, session 11): a read at the log's end — a
Fetch answer, the leader's own listener — skips the index lookup and the header walk.

What must hold: the kept (position, header) is always the segment's real last batch, whatever happens to
the log (appends, rolls, truncations, reopening cleanly or after a crash, a rebuilt index); after a reopen
it is known only once a verified header walk (or an append) found it; and every read answers exactly what
the file holds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import LogModel

from kraft.storage.batch import BatchHeader, iter_batch_headers, peek_batch_header
from kraft.storage.index import OffsetIndex
from kraft.storage.log import LogConfig, SegmentedLog
from kraft.storage.segment import LogSegment

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=200)
PREALLOCATED = LogConfig(segment_bytes=2048, index_interval_bytes=200, preallocate_bytes=300)


def _real_last(segment: LogSegment) -> tuple[int, BatchHeader] | None:
    """The segment's last batch by a full CRC-checked scan of its bytes (independent of any index)."""
    found: tuple[int, BatchHeader] | None = None
    for position, header in iter_batch_headers(segment.read_all()):
        found = (position, header)
    return found


def _check_kept(log: SegmentedLog) -> None:
    for segment in log._segments:
        kept = segment._last
        if kept is not None:
            assert kept == _real_last(segment), segment.log_path


def _append(log: SegmentedLog, model: LogModel, count: int, size: int, epoch: int) -> None:
    base = log.end_offset
    log.append_records(
        [(b"k", bytes([base % 251]) * size)] * count, leader_epoch=epoch, timestamp_ms=1000 + base
    )
    data = log.read(base, 1).records
    model.add(data, peek_batch_header(data))


def _check_reads(log: SegmentedLog, model: LogModel) -> None:
    """Every live batch reads back as appended — the last ones through the kept position, the others
    through the index — and a read at the end leaves the kept position equal to the real last batch."""
    for batch in model.batches:
        if batch.next_offset <= log.start_offset:
            continue
        for offset in {max(batch.base_offset, log.start_offset), batch.next_offset - 1}:
            assert log.read(offset, 1).records == batch.data
    _check_kept(log)


append_op = st.tuples(st.just("append"), st.integers(1, 4), st.integers(0, 300), st.booleans())
ops_strategy = st.lists(
    st.one_of(
        append_op,
        st.just(("flush",)),
        st.just(("roll",)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.just(("reopen",)),
        st.tuples(st.just("crash"), st.booleans()),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("config", [CONFIG, PREALLOCATED], ids=["plain", "preallocated"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_the_kept_last_batch_is_always_the_real_one(config: LogConfig, ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        log = SegmentedLog.open(directory, config)
        model = LogModel()
        epoch = 1
        try:
            for op in ops:
                if op[0] == "append":
                    _, count, size, bump = op
                    assert isinstance(count, int) and isinstance(size, int)
                    epoch += 1 if bump else 0
                    _append(log, model, count, size, epoch)
                elif op[0] == "flush":
                    log.flush()
                elif op[0] == "roll":
                    log.roll()
                elif op[0] == "truncate":
                    fraction = op[1]
                    assert isinstance(fraction, float)
                    target = int(log.end_offset * fraction)
                    log.truncate_to(target)
                    model.truncate_to(log.end_offset)
                elif op[0] == "reopen":
                    log.close()
                    log = SegmentedLog.open(directory, config)
                    # Reopened: nothing is known until a verified walk or an append finds it.
                    assert all(segment._last is None for segment in log._segments)
                else:
                    if op[1]:
                        log.flush()
                    # A crash (no clean-shutdown marker): the open rescans what the recovery point does
                    # not cover.  The page cache keeps unflushed bytes, so everything appended survives.
                    log.abandon()
                    log = SegmentedLog.open(directory, config)
                    assert all(segment._last is None for segment in log._segments)
                _check_kept(log)
                _check_reads(log, model)
        finally:
            log.close()


def test_a_read_at_the_end_skips_the_index_after_an_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentedLog.open(tmp_path / "t-0", CONFIG)
    model = LogModel()
    for i in range(8):
        _append(log, model, 2, 40, 1 + i // 4)
    assert len(log._segments) == 1
    segment = log._segments[-1]
    assert len(segment.index) > 0  # without the kept position the index is consulted for every read

    def refuse(_index: OffsetIndex, _offset: int) -> tuple[int | None, int]:
        raise AssertionError("the index was looked up for the last batch")

    with monkeypatch.context() as patch:
        patch.setattr(OffsetIndex, "lookup_entry", refuse)
        last = model.batches[-1]
        assert log.read(last.base_offset, 1).records == last.data
        assert log.read(last.next_offset - 1, 1).records == last.data
    # An earlier batch still goes through the index.
    assert log.read(model.batches[-3].base_offset, 1).records == model.batches[-3].data
    log.close()


def test_after_a_reopen_the_position_comes_from_a_verified_walk(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = SegmentedLog.open(directory, CONFIG)
    model = LogModel()
    for _ in range(8):
        _append(log, model, 3, 40, 1)
    log.close()
    log = SegmentedLog.open(directory, CONFIG)
    segment = log._segments[-1]
    assert segment._last is None
    last = model.batches[-1]
    assert log.read(last.base_offset, 1).records == last.data
    assert segment._last == _real_last(segment)
    # A read in the middle finds a batch that is not the last: nothing kept changes.
    kept = segment._last
    assert log.read(model.batches[2].base_offset, 1).records == model.batches[2].data
    assert segment._last == kept
    log.close()


def test_truncation_and_roll_move_the_position(tmp_path: Path) -> None:
    log = SegmentedLog.open(tmp_path / "t-0", CONFIG)
    model = LogModel()
    for _ in range(6):
        _append(log, model, 2, 50, 1)
    segment = log._segments[-1]
    log.truncate_to(model.batches[3].base_offset)
    model.truncate_to(log.end_offset)
    # Truncation re-walks the tail; whatever is kept is the new last batch, and the end reads right.
    assert segment._last is None or segment._last == _real_last(segment)
    assert log.read(model.batches[-1].base_offset, 1).records == model.batches[-1].data
    assert segment._last == _real_last(segment)
    log.roll()
    _append(log, model, 1, 10, 2)
    new = log._segments[-1]
    assert new is not segment
    assert new._last == _real_last(new) == (0, peek_batch_header(model.batches[-1].data))
    assert segment._last == _real_last(segment)  # the rolled segment's last batch did not change
    log.close()


def test_a_stale_position_is_never_served(tmp_path: Path) -> None:
    """Defence in depth: an entry that does not end at the segment's end is dropped, not used."""
    log = SegmentedLog.open(tmp_path / "t-0", CONFIG)
    model = LogModel()
    for _ in range(4):
        _append(log, model, 2, 30, 1)
    segment = log._segments[-1]
    real = _real_last(segment)
    assert real is not None and segment._last == real
    first = peek_batch_header(model.batches[0].data)
    segment._last = (0, first._replace(base_offset=model.batches[-1].base_offset))
    assert log.read(model.batches[-1].base_offset, 1).records == model.batches[-1].data
    assert segment._last == real
    log.close()


def test_a_rebuilt_index_keeps_the_log_readable_at_its_end(tmp_path: Path) -> None:
    log = SegmentedLog.open(tmp_path / "t-0", CONFIG)
    model = LogModel()
    for _ in range(10):
        _append(log, model, 2, 40, 1)
    segment = log._segments[-1]
    segment._rebuild_index()
    # The rescan forgets the position (recovery state reset) and the next read at the end finds it.
    assert segment._last is None
    assert log.read(model.batches[-1].base_offset, 1).records == model.batches[-1].data
    assert segment._last == _real_last(segment)
    log.close()
