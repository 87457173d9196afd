"""Recovery of a large active segment starts its CRC scan at the recovery point, not at byte 0 (issue #14
benchmark: a crash of a log of one 1 GiB segment rescanned all of it).

Whatever is damaged — the unflushed tail, a batch below the recovery point, the batch at it, the index
files (stale, garbage, missing) — reopening after a crash ends in one of:

- opened with nothing below the recovery point lost, the tail a valid prefix of what was appended, and
  every read returning the bytes written or raising CorruptLogError (damage below the recovery point
  that only a read's CRC check sees, as in any segment wholly below it), or
- refused with CorruptLogError naming a file of the log (damage below the recovery point).

And when the position of the recovery point is sound, the open CRC-checks only the bytes from the batch
ending just before it (``recovered_bytes_scanned``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import LogModel, segment_files

from kraft.storage.batch import peek_batch_header
from kraft.storage.errors import CorruptLogError
from kraft.storage.log import LogConfig, SegmentedLog

# One segment holds the whole log; the recovery point follows every flush.
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256, recovery_point_interval_bytes=0)
PREALLOCATED = LogConfig(
    segment_bytes=1 << 20, index_interval_bytes=256, recovery_point_interval_bytes=0, preallocate_bytes=512
)

# Where the damage goes, relative to the recovery point R.
DAMAGE = (
    "none",
    "tail",  # garbage or a cut anywhere after the batch at R (unflushed: may be cut)
    "at_recovery_point",  # the batch starting at R (unflushed: may be cut)
    "before_recovery_point",  # the batch ending at R - 1: its CRC vouches for R's position
    "below_payload",  # past byte 21 of an older flushed batch: refused on read (its offset delta: at open)
    "below_header",  # base offset / length / magic of an older flushed batch
)
INDEX_DAMAGE = ("none", "delete", "garbage", "stale")


def _append(log: SegmentedLog, model: LogModel, count: int, size: int, epoch: int) -> None:
    base = log.end_offset
    log.append_records([(b"k", bytes([base % 251]) * size)] * count, leader_epoch=epoch, timestamp_ms=base)
    data = log.read(base, 1).records
    model.add(data, peek_batch_header(data))


def _locations(model: LogModel) -> list[tuple[int, int]]:
    """(start, end) in the one segment file of every batch of the model."""
    out = []
    position = 0
    for batch in model.batches:
        out.append((position, position + len(batch.data)))
        position += len(batch.data)
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    preallocated=st.booleans(),
    sizes=st.lists(st.integers(0, 400), min_size=3, max_size=60),
    flushed=st.integers(1, 60),
    damage=st.sampled_from(DAMAGE),
    index_damage=st.sampled_from(INDEX_DAMAGE),
    data=st.data(),
)
def test_recovery_scans_from_the_recovery_point_inside_a_large_segment(
    preallocated: bool,
    sizes: list[int],
    flushed: int,
    damage: str,
    index_damage: str,
    data: st.DataObject,
) -> None:
    config = PREALLOCATED if preallocated else CONFIG
    flushed = min(flushed, len(sizes) - 1)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        model = LogModel()
        log = SegmentedLog.open(directory, config)
        stale_at = data.draw(st.integers(1, flushed), label="stale_at") if index_damage == "stale" else None
        for i, size in enumerate(sizes[:flushed]):
            _append(log, model, 1 + size % 3, size, epoch=1 + i // 7)
            if stale_at == i + 1:
                # A clean close writes the segment's index; what is appended after it leaves it stale.
                log.close()
                log = SegmentedLog.open(directory, config)
        log.flush()
        recovery_point = log.recovery_point
        assert recovery_point == model.end_offset
        for i, size in enumerate(sizes[flushed:], start=flushed):
            _append(log, model, 1 + size % 3, size, epoch=1 + i // 7)
        log.abandon()  # crash: the tail was never flushed
        (segment,) = segment_files(directory)
        locations = _locations(model)
        before_r = flushed - 1  # the batch ending at R - 1

        damaged_batch: int | None = None  # first batch whose bytes changed
        # A flip inside the CRC'd part can still hit a field the open's header walk reads: the last offset
        # delta (bytes 23-26) of a batch below the recovery point breaks the offset chain, which is header
        # damage below R — refused like "below_header", not left for the read's CRC check.
        walked_field = False
        if damage == "tail" and flushed + 1 < len(locations):
            damaged_batch = data.draw(st.integers(flushed + 1, len(locations) - 1), label="tail_batch")
        elif damage == "at_recovery_point":
            damaged_batch = flushed
        elif damage == "before_recovery_point":
            damaged_batch = before_r
        elif damage in ("below_payload", "below_header") and before_r > 0:
            damaged_batch = data.draw(st.integers(0, before_r - 1), label="below_batch")
        if damaged_batch is not None:
            start, end = locations[damaged_batch]
            if damage == "below_header":
                position = start + data.draw(st.sampled_from([0, 7, 8, 11, 16]), label="header_byte")
            else:
                # Past the fields outside the CRC (base offset, length, epoch, magic, crc).
                position = data.draw(st.integers(start + 21, end - 1), label="position")
                walked_field = damage == "below_payload" and start + 23 <= position < start + 27
            if damage in ("tail", "at_recovery_point") and data.draw(st.booleans(), label="cut"):
                os.truncate(segment, position)
            else:
                with open(segment, "r+b") as f:
                    f.seek(position)
                    byte = f.read(1)
                    f.seek(position)
                    f.write(bytes([byte[0] ^ data.draw(st.integers(1, 255), label="mask")]))
        index = segment.with_suffix(".index")
        if index_damage == "delete":
            index.unlink(missing_ok=True)
        elif index_damage == "garbage":
            index.write_bytes(data.draw(st.binary(min_size=1, max_size=64), label="index_bytes"))
        file_size = segment.stat().st_size

        try:
            log = SegmentedLog.open(directory, config)
        except CorruptLogError as exc:
            # Only damage below the recovery point is refused (the walk could not vouch for R's position
            # and the whole-segment scan found flushed data damaged).
            assert damage in ("before_recovery_point", "below_header") or walked_field, exc
            assert Path(exc.path).parent == directory
            return
        try:
            assert damage not in ("before_recovery_point", "below_header") or damaged_batch is None
            assert not walked_field
            # Nothing below the recovery point is lost; the tail is a valid prefix of what was written.
            assert log.end_offset >= recovery_point
            survivors = [b for b in model.batches if b.next_offset <= log.end_offset]
            assert log.end_offset == (survivors[-1].next_offset if survivors else 0)
            if damaged_batch is None or damage == "below_payload":
                assert log.end_offset == model.end_offset
            else:
                assert len(survivors) >= damaged_batch
            for i, batch in enumerate(survivors):
                try:
                    assert log.read(batch.base_offset, 1).records == batch.data
                    assert log.read(batch.next_offset - 1, 1).records == batch.data
                except CorruptLogError:
                    # Only the flushed batch whose payload was flipped, which open does not CRC-check.
                    assert damage == "below_payload" and i == damaged_batch
            model.truncate_to(log.end_offset)
            assert log.epoch_entries() == model.epoch_entries()
            # The scan started at the batch ending just before the recovery point — unless the batch at
            # it was refused, which sends the open back to the whole-segment scan.
            if damage == "at_recovery_point":
                assert log.recovered_bytes_scanned == file_size
            else:
                assert log.recovered_bytes_scanned == file_size - locations[before_r][0]
            # The recovered log keeps working and reopens cleanly.
            log.append_records([(None, b"after")], leader_epoch=100, timestamp_ms=0)
            end = log.end_offset
            log.close()
            reopened = SegmentedLog.open(directory, config)
            assert reopened.end_offset == end
            reopened.close()
        finally:
            log.abandon()
