"""The core's log bookkeeping: epoch cache lookups, truncation, prefix deletion, snapshots."""

from __future__ import annotations

import pytest

from kraft.raft.core_fetcher import continues_log, truncation_offset
from kraft.raft.core_log import EpochEntry, LogInvariantError, LogMeta
from kraft.raft.core_types import BatchInfo
from kraft.raft.messages import EpochEndOffset, SnapshotId


def _log() -> LogMeta:
    log = LogMeta()
    log.append(0, 4, 1)
    log.append(5, 7, 3)
    log.append(8, 9, 3)
    return log


def test_end_offset_for_epoch_answers_with_the_largest_epoch_not_above_it() -> None:
    log = _log()
    assert log.end_offset_for_epoch(1) == EpochEndOffset(1, 5)
    assert log.end_offset_for_epoch(2) == EpochEndOffset(1, 5)
    assert log.end_offset_for_epoch(3) == EpochEndOffset(3, 10)
    assert log.end_offset_for_epoch(9) == EpochEndOffset(3, 10)
    assert log.end_offset_for_epoch(0) == EpochEndOffset(0, 0)  # empty prefix before epoch 1


def test_appends_must_continue_the_log_with_non_decreasing_epochs() -> None:
    log = _log()
    with pytest.raises(LogInvariantError):
        log.append(11, 12, 3)
    with pytest.raises(LogInvariantError):
        log.append(10, 10, 2)


def test_truncation_drops_epochs_and_unflushed_marks() -> None:
    log = _log()
    log.mark_flushed(10)
    log.truncate_to(5)
    assert (log.end_offset, log.flushed_end, log.last_epoch) == (5, 5, 1)
    assert log.epochs == [EpochEntry(1, 0)]


def test_prefix_deletion_keeps_the_epoch_that_spans_the_new_start() -> None:
    log = _log()
    log.snapshot = SnapshotId(7, 3)
    log.advance_start(7)
    assert log.start_offset == 7
    assert log.epochs == [EpochEntry(3, 7)]
    assert log.epoch_at(6) == 3  # the snapshot vouches for its last offset
    assert log.end_offset_for_epoch(1) is None  # below the snapshot: only a snapshot can help


def test_a_log_reset_to_a_snapshot_takes_the_snapshot_epoch() -> None:
    log = _log()
    log.reset_to_snapshot(SnapshotId(50, 4))
    assert (log.start_offset, log.end_offset, log.flushed_end, log.last_epoch) == (50, 50, 50, 4)
    assert log.end_offset_for_epoch(4) == EpochEndOffset(4, 50)


def test_truncation_offset_takes_the_smaller_end_and_protects_the_high_watermark() -> None:
    log = _log()
    assert truncation_offset(log, EpochEndOffset(1, 7), high_watermark=0) == 5
    assert truncation_offset(log, EpochEndOffset(3, 8), high_watermark=0) == 8
    with pytest.raises(LogInvariantError):
        truncation_offset(log, EpochEndOffset(1, 5), high_watermark=6)


def test_fetched_batches_must_continue_the_log() -> None:
    assert continues_log([BatchInfo(10, 12, 3), BatchInfo(13, 13, 4)], 10, 3, 4)
    assert not continues_log([], 10, 3, 4)
    assert not continues_log([BatchInfo(11, 12, 3)], 10, 3, 4)  # gap
    assert not continues_log([BatchInfo(10, 12, 2)], 10, 3, 4)  # epoch goes back
    assert not continues_log([BatchInfo(10, 12, 5)], 10, 3, 4)  # newer than the leader
