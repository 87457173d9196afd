"""Crash recovery: whatever happens to the segments the recovery point does not cover, reopening the log
either yields exactly a valid prefix of what was appended — never a corrupt batch, never less than what
lay before the damage, never less than the recovery point — or, when the damage lies below the recovery
point (flushed data), refuses to open with CorruptLogError naming a file of the log.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import LogModel, scan_batches, segment_files

from kraft.storage.batch import HEADER_SIZE, peek_batch_header
from kraft.storage.errors import CorruptLogError
from kraft.storage.log import RECOVERY_POINT_FILE, LogConfig, SegmentedLog

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=200)
# Small preallocation steps so appends keep crossing the zero-filled space's end.
PREALLOCATED = LogConfig(segment_bytes=2048, index_interval_bytes=200, preallocate_bytes=300)

append_op = st.tuples(st.just("append"), st.integers(1, 4), st.integers(0, 300), st.booleans())
ops_strategy = st.lists(
    st.one_of(append_op, st.just(("flush",)), st.just(("roll",))), min_size=1, max_size=25
)


def _run_ops(log: SegmentedLog, ops: list[tuple[object, ...]], model: LogModel) -> None:
    epoch = 1
    for op in ops:
        if op[0] == "append":
            _, count, size, bump = op
            assert isinstance(count, int) and isinstance(size, int)
            if bump:
                epoch += 1
            base = log.end_offset
            result = log.append_records(
                [(b"k", bytes([base % 251]) * size)] * count, leader_epoch=epoch, timestamp_ms=1000 + base
            )
            assert result.first_offset == base
            data = log.read(base, 1).records
            model.add(data, peek_batch_header(data))
        elif op[0] == "flush":
            assert log.flush() == log.end_offset
        else:
            log.roll()


def _batch_locations(directory: Path) -> list[tuple[Path, int, int]]:
    """(file, start, end) of every batch, in log order."""
    out: list[tuple[Path, int, int]] = []
    for path in segment_files(directory):
        data = path.read_bytes()
        position = 0
        # Stop at the end of the batches: a preallocated segment continues with zeros.
        while len(data) - position >= HEADER_SIZE and any(data[position : position + HEADER_SIZE]):
            size = peek_batch_header(data, position).size_in_bytes
            out.append((path, position, position + size))
            position += size
    return out


@pytest.mark.parametrize("config", [CONFIG, PREALLOCATED], ids=["plain", "preallocated"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, data=st.data())
def test_recovery_returns_exactly_a_valid_prefix_after_any_tail_damage(
    config: LogConfig, ops: list[tuple[object, ...]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        log = SegmentedLog.open(directory, config)
        model = LogModel()
        _run_ops(log, ops, model)
        recovery_point = log.recovery_point
        log.abandon()  # crash: no flush, no clean-shutdown marker

        lose_checkpoint = data.draw(st.booleans(), label="lose_checkpoint")
        all_files = segment_files(directory)
        protected = recovery_point
        if lose_checkpoint:
            (directory / RECOVERY_POINT_FILE).unlink()
            recovery_point = 0  # every segment is scanned: damage may go anywhere
            # Without the checkpoint only the newest segment may hold a torn tail: every older one is
            # protected (issue #14: a flipped byte in an old segment must not cut the log there).
            protected = int(all_files[-1].stem)
        # Segments wholly below the recovery point are not scanned on open (test_storage_corruption
        # covers them); damage goes to the segment holding the recovery point or a later one.
        files = [
            p
            for i, p in enumerate(all_files)
            if i + 1 == len(all_files) or int(all_files[i + 1].stem) > recovery_point
        ]
        locations = _batch_locations(directory)
        intact = len(locations)
        target = data.draw(st.sampled_from(files), label="file")
        size = target.stat().st_size
        position = data.draw(st.integers(0, max(size - 1, 0)), label="position")
        if data.draw(st.booleans(), label="truncate"):
            os.truncate(target, position)
        else:
            # In the segment holding the recovery point, the batches ending before the one ending just
            # below it are not CRC-checked on open (flushed, trusted like an older segment: reads check
            # them; test_storage_recovery_resume and test_storage_corruption cover garbage there), so
            # garbage goes from that batch on.  The header walk still sees any cut.
            floor = next(
                (
                    start
                    for (path, start, _end), batch in zip(locations, model.batches, strict=True)
                    if path == target and batch.next_offset == recovery_point
                ),
                0,
            )
            position = max(position, floor)
            garbage = data.draw(st.binary(min_size=1, max_size=80), label="garbage")
            with open(target, "r+b") as f:
                f.seek(position)
                f.write(garbage)
        for i, (path, _start, end) in enumerate(locations):
            if (path == target and end > position) or path > target:
                intact = i
                break
        index_damage = data.draw(st.sampled_from(["none", "delete", "garbage"]), label="index_damage")
        indexes = sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))
        if index_damage != "none" and indexes:
            victim = data.draw(st.sampled_from(indexes), label="index")
            if index_damage == "delete":
                victim.unlink()
            else:
                victim.write_bytes(data.draw(st.binary(min_size=1, max_size=40), label="index_bytes"))

        first_damaged = model.batches[intact].base_offset if intact < len(model.batches) else model.end_offset
        try:
            log = SegmentedLog.open(directory, config)
        except CorruptLogError as exc:
            # Only flushed data (below the recovery point) is worth refusing to open for.
            assert first_damaged < protected, exc
            assert Path(exc.path).parent == directory
            return
        try:
            survivors = scan_batches(log)
            assert [raw for _, raw in survivors] == [b.data for b in model.batches[: len(survivors)]]
            assert len(survivors) >= intact
            assert log.end_offset >= protected
            model.truncate_to(survivors[-1][0].next_offset if survivors else 0)
            assert log.end_offset == model.end_offset
            assert log.flushed_offset == log.end_offset
            assert log.epoch_entries() == model.epoch_entries()
            # Indexed reads agree with the full scan for every offset.
            for header, raw in survivors:
                for offset in range(header.base_offset, header.next_offset):
                    assert log.read(offset, 1).records == raw
            assert log.read(log.end_offset, 100).records == b""
            # The recovered log keeps working.
            log.append_records([(None, b"after")], leader_epoch=100, timestamp_ms=0)
            log.close()
            # A clean close leaves exactly the batches on disk (no preallocated zeros).
            assert sum(p.stat().st_size for p in segment_files(directory)) == sum(
                end - start for _path, start, end in _batch_locations(directory)
            )
            reopened = SegmentedLog.open(directory, config)
            assert reopened.end_offset == model.end_offset + 1
            reopened.close()
        finally:
            log.abandon()


@pytest.mark.parametrize("config", [CONFIG, PREALLOCATED], ids=["plain", "preallocated"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, data=st.data())
def test_deleted_or_corrupt_indexes_are_rebuilt_after_a_clean_shutdown(
    config: LogConfig, ops: list[tuple[object, ...]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        log = SegmentedLog.open(directory, config)
        model = LogModel()
        _run_ops(log, ops, model)
        log.close()
        indexes = sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))
        for victim in data.draw(st.lists(st.sampled_from(indexes), max_size=3), label="victims"):
            if data.draw(st.booleans(), label="delete") and victim.exists():
                victim.unlink()
            else:
                victim.write_bytes(data.draw(st.binary(max_size=48), label="garbage"))
        log = SegmentedLog.open(directory, config)
        try:
            survivors = scan_batches(log)
            assert [raw for _, raw in survivors] == [b.data for b in model.batches]
            for header, raw in survivors:
                assert log.read(header.base_offset, 1).records == raw
                assert log.read(header.next_offset - 1, 1).records == raw
        finally:
            log.close()
