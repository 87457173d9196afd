"""Corruption at every boundary: damage every region of every kind of file a log directory holds and
check that opening it ends in exactly one of two ways —

- it opens with nothing below the recovery point lost, and every read returns the bytes that were
  written or raises CorruptLogError (damage in a segment that open does not scan), or
- it refuses with the typed error naming the damaged file;

never "opened with less data than was flushed" and never "served corrupt data".
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import segment_files

from kraft.storage.batch import LeaderChangeMessage, peek_batch_header, with_leader_epoch
from kraft.storage.errors import CorruptLogError, StorageStateError
from kraft.storage.ids import random_uuid
from kraft.storage.log import (
    LEGACY_OFFSETS_CHECKPOINT_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    LogConfig,
    SegmentedLog,
)
from kraft.storage.meta_properties import (
    META_PROPERTIES_FILE,
    MetaProperties,
    read_meta_properties,
    write_meta_properties,
)
from kraft.storage.quorum_state import QUORUM_STATE_FILE, QuorumState, QuorumStateStore
from kraft.storage.snapshot import SnapshotDirectory, SnapshotFileId

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=512)
PAYLOAD = 240
BATCHES = 45

# Byte ranges of a v2 batch header (Kafka's DefaultRecordBatch), then the records.
REGIONS: dict[str, tuple[int, int | None]] = {
    "base_offset": (0, 8),
    "length": (8, 12),
    "leader_epoch": (12, 16),
    "magic": (16, 17),
    "crc": (17, 21),
    "attributes": (21, 23),
    "last_offset_delta": (23, 27),
    "timestamps": (27, 43),
    "producer": (43, 57),
    "record_count": (57, 61),
    "payload": (61, None),
}
KINDS = ("flip", "zero", "truncate", "extend")


@dataclass(frozen=True)
class Batch:
    base_offset: int
    next_offset: int
    data: bytes


@dataclass(frozen=True)
class Pristine:
    directory: Path
    batches: tuple[Batch, ...]
    recovery_point: int
    end_offset: int
    epochs: tuple[tuple[int, int], ...]


def _fill(log: SegmentedLog) -> list[Batch]:
    """Flushed batches over several segments, a new epoch (opened by a LeaderChange control batch, as a
    Raft leader writes it) every ten batches."""
    batches: list[Batch] = []
    epoch = 1
    for i in range(BATCHES):
        base = log.end_offset
        if i % 10 == 0:
            epoch += 1
            log.append_control(
                [LeaderChangeMessage(leader_id=1, voters=(1,))], leader_epoch=epoch, timestamp_ms=i
            )
        else:
            log.append_records([(b"k", bytes([i]) * PAYLOAD)] * 2, leader_epoch=epoch, timestamp_ms=1000 + i)
        raw = log.read(base, 1).records
        batches.append(Batch(base, peek_batch_header(raw).next_offset, raw))
        log.flush()
    return batches


@functools.cache
def _pristine(clean: bool) -> Pristine:
    """Built once per mode, copied for every example (building costs one fsync per batch)."""
    directory = Path(tempfile.mkdtemp(prefix="kraft-corruption-")) / "t-0"
    log = SegmentedLog.open(directory, CONFIG)
    batches = _fill(log)
    epochs = tuple(log.epoch_entries())
    end = log.end_offset
    if clean:
        log.close()
        recovery_point = end
    else:
        recovery_point = log.recovery_point
        log.abandon()  # crash: no clean-shutdown marker
    assert len(segment_files(directory)) >= 3
    assert 0 < recovery_point <= end
    return Pristine(directory, tuple(batches), recovery_point, end, epochs)


def _copy(pristine: Pristine, root: Path) -> Path:
    target = root / pristine.directory.name
    shutil.copytree(pristine.directory, target)
    return target


def _locations(directory: Path) -> list[tuple[Path, int, int]]:
    """(file, start, end) of every batch in log order."""
    out: list[tuple[Path, int, int]] = []
    for path in segment_files(directory):
        data = path.read_bytes()
        position = 0
        while position < len(data):
            size = peek_batch_header(data, position).size_in_bytes
            out.append((path, position, position + size))
            position += size
    return out


def _damage(path: Path, start: int, end: int, kind: str, mask: int) -> bool:
    """Damage ``path[start:end]``; True if the file's bytes changed."""
    before = path.read_bytes()
    data = bytearray(before)
    if kind == "flip":
        data[start] ^= mask
    elif kind == "zero":
        data[start:end] = bytes(end - start)
    elif kind == "truncate":
        del data[start:]
    else:
        data += bytes([mask]) * 7
    path.write_bytes(bytes(data))
    return bytes(data) != before


def _check_log(directory: Path, pristine: Pristine, *, damaged_offset: int, protected: bool) -> str:
    """The oracle.  ``damaged_offset``: first offset whose batch was touched; ``protected``: whether it
    lies below the recovery point (or the log was closed cleanly, which protects everything)."""
    try:
        log = SegmentedLog.open(directory, CONFIG)
    except CorruptLogError as exc:
        assert protected, f"damage above the recovery point must be truncated, not refused: {exc}"
        assert Path(exc.path).parent == directory and exc.path in str(exc)
        assert "\n" not in str(exc)
        return "refused"
    try:
        assert log.end_offset >= min(pristine.recovery_point, pristine.end_offset)
        if protected:
            # Nothing below the recovery point is ever truncated.
            assert log.end_offset == pristine.end_offset
        else:
            assert log.end_offset >= damaged_offset
        read_refused = False
        for batch in pristine.batches:
            if batch.next_offset > log.end_offset:
                assert not protected
                break
            try:
                records = log.read(batch.base_offset, 1).records
            except CorruptLogError as exc:
                assert protected and batch.base_offset >= damaged_offset, exc
                assert Path(exc.path).parent == directory
                read_refused = True
                continue
            assert records == batch.data
        assert log.epoch_entries() == [e for e in pristine.epochs if e[1] < log.end_offset]
        return "refused on read" if read_refused else "opened"
    finally:
        log.abandon()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clean=st.booleans(),
    region=st.sampled_from(sorted(REGIONS)),
    kind=st.sampled_from(KINDS),
    mask=st.integers(1, 255),
    data=st.data(),
)
def test_segment_damage_is_truncated_above_the_recovery_point_and_refused_below_it(
    clean: bool, region: str, kind: str, mask: int, data: st.DataObject
) -> None:
    pristine = _pristine(clean)
    with tempfile.TemporaryDirectory() as tmp:
        directory = _copy(pristine, Path(tmp))
        locations = _locations(directory)
        index = data.draw(st.integers(0, len(locations) - 1), label="batch")
        path, batch_start, batch_end = locations[index]
        if kind == "extend":
            # Garbage after the last batch of the file that holds the chosen batch.
            index = max(i for i, loc in enumerate(locations) if loc[0] == path)
            batch_start = batch_end = locations[index][2]
            damaged_offset = pristine.batches[index].next_offset
        else:
            damaged_offset = pristine.batches[index].base_offset
        low, high = REGIONS[region]
        start = batch_start + low
        end = batch_end if high is None else batch_start + high
        start = data.draw(st.integers(start, end - 1), label="position") if kind != "extend" else start
        changed = _damage(path, start, end, kind, mask)
        protected = clean or damaged_offset < pristine.recovery_point
        outcome = _check_log(directory, pristine, damaged_offset=damaged_offset, protected=protected)
        if not changed:
            assert outcome == "opened"
        elif protected:
            assert outcome != "opened", "flushed data was damaged and nothing noticed"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clean=st.booleans(), kind=st.sampled_from(KINDS), mask=st.integers(1, 255), data=st.data())
def test_index_damage_is_rebuilt_without_losing_or_refusing_anything(
    clean: bool, kind: str, mask: int, data: st.DataObject
) -> None:
    pristine = _pristine(clean)
    with tempfile.TemporaryDirectory() as tmp:
        directory = _copy(pristine, Path(tmp))
        indexes = [p for p in sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))]
        indexes = [p for p in indexes if p.stat().st_size > 0]
        if not indexes:
            return
        victim = data.draw(st.sampled_from(indexes), label="index")
        size = victim.stat().st_size
        position = data.draw(st.integers(0, size - 1), label="position")
        _damage(victim, position, min(size, position + 8), kind, mask)
        assert _check_log(directory, pristine, damaged_offset=0, protected=True) == "opened"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), mask=st.integers(1, 255), data=st.data())
def test_recovery_point_damage_scans_more_or_refuses_naming_it_but_never_loses_data(
    kind: str, mask: int, data: st.DataObject
) -> None:
    pristine = _pristine(False)
    with tempfile.TemporaryDirectory() as tmp:
        directory = _copy(pristine, Path(tmp))
        checkpoint = directory / RECOVERY_POINT_FILE
        size = checkpoint.stat().st_size
        position = data.draw(st.integers(0, size - 1), label="position")
        _damage(checkpoint, position, size, kind, mask)
        try:
            log = SegmentedLog.open(directory, CONFIG)
        except CorruptLogError as exc:
            # Only a recovery point raised above the log's end can do this; the error says so.
            assert RECOVERY_POINT_FILE in str(exc)
            return
        try:
            assert log.end_offset == pristine.end_offset
            assert log.read_all_batches() == b"".join(b.data for b in pristine.batches)
        finally:
            log.abandon()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clean=st.booleans(), kind=st.sampled_from(KINDS), mask=st.integers(1, 255), data=st.data())
def test_epoch_checkpoint_damage_is_rebuilt_or_refused_never_believed(
    clean: bool, kind: str, mask: int, data: st.DataObject
) -> None:
    """The leader-epoch-checkpoint is derived data: unreadable → rebuilt by a full scan; readable but
    wrong → a batch it disagrees with is refused (at open or on read), naming the checkpoint."""
    pristine = _pristine(clean)
    with tempfile.TemporaryDirectory() as tmp:
        directory = _copy(pristine, Path(tmp))
        checkpoint = directory / "leader-epoch-checkpoint"
        size = checkpoint.stat().st_size
        position = data.draw(st.integers(0, size - 1), label="position")
        _damage(checkpoint, position, size, kind, mask)
        try:
            log = SegmentedLog.open(directory, CONFIG)
        except CorruptLogError as exc:
            assert "leader-epoch-checkpoint" in str(exc)
            return
        try:
            # A batch the checkpoint disagrees with is treated as damaged: above the recovery point that
            # means truncated there (logged), exactly as for any other bad batch.
            assert log.end_offset >= pristine.recovery_point
            try:
                for batch in pristine.batches:
                    if batch.next_offset > log.end_offset:
                        break
                    assert log.read(batch.base_offset, 1).records == batch.data
            except CorruptLogError as exc:
                assert "leader-epoch-checkpoint" in str(exc)
                return
            # Every batch read back and agreed with the cache: the cache is right.
            assert log.epoch_entries() == [e for e in pristine.epochs if e[1] < log.end_offset]
        finally:
            log.abandon()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    region=st.sampled_from(sorted(REGIONS)),
    kind=st.sampled_from(KINDS),
    mask=st.integers(1, 255),
    data=st.data(),
)
def test_a_damaged_snapshot_is_refused_naming_the_file(
    tmp_path_factory: pytest.TempPathFactory, region: str, kind: str, mask: int, data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("snap")
    store = SnapshotDirectory(directory)
    snapshot_id = SnapshotFileId(100, 3)
    with store.create(snapshot_id, last_contained_log_timestamp=5, timestamp_ms=6) as writer:
        for i in range(4):
            writer.append_records([(None, bytes([i]) * 100)] * 3)
        path = writer.freeze()
    pristine = path.read_bytes()
    batches = [(pos, pos + peek_batch_header(pristine, pos).size_in_bytes) for pos in _positions(pristine)]
    batch_start, batch_end = data.draw(st.sampled_from(batches), label="batch")
    low, high = REGIONS[region]
    start, end = batch_start + low, (batch_end if high is None else batch_start + high)
    if kind == "extend":
        start = end = len(pristine)
    else:
        start = data.draw(st.integers(start, end - 1), label="position")
    changed = _damage(path, start, end, kind, mask)
    fresh = SnapshotDirectory(directory)
    if not changed:
        fresh.open(snapshot_id).close()
        return
    with pytest.raises(CorruptLogError) as caught:
        fresh.open(snapshot_id)
    assert caught.value.path == str(path)
    with pytest.raises(CorruptLogError):
        fresh.read_verified(snapshot_id)


def _positions(data: bytes) -> list[int]:
    out: list[int] = []
    position = 0
    while position < len(data):
        out.append(position)
        position += peek_batch_header(data, position).size_in_bytes
    return out


def _meta(tmp_path: Path) -> tuple[MetaProperties, bytes]:
    props = MetaProperties(cluster_id=random_uuid(), node_id=3, directory_id=random_uuid())
    write_meta_properties(tmp_path, props)
    return props, (tmp_path / META_PROPERTIES_FILE).read_bytes()


@pytest.mark.parametrize("mask", [0x01, 0x02, 0x20, 0x80])
def test_every_flipped_byte_of_meta_properties_is_refused(tmp_path: Path, mask: int) -> None:
    _props, pristine = _meta(tmp_path)
    path = tmp_path / META_PROPERTIES_FILE
    for position in range(len(pristine)):
        damaged = bytearray(pristine)
        damaged[position] ^= mask
        path.write_bytes(bytes(damaged))
        with pytest.raises(StorageStateError, match="corrupt"):
            read_meta_properties(tmp_path)


def test_zeroed_truncated_or_extended_meta_properties_is_refused_or_still_the_same(tmp_path: Path) -> None:
    props, pristine = _meta(tmp_path)
    path = tmp_path / META_PROPERTIES_FILE
    variants = [pristine[:i] + b"\x00" + pristine[i + 1 :] for i in range(len(pristine))]
    variants += [pristine[:i] for i in range(len(pristine))]
    variants += [pristine + extra for extra in (b"\n", b"#x\n", b"node.id=4\n", b"garbage", b"\x00" * 4)]
    for variant in variants:
        path.write_bytes(variant)
        try:
            assert read_meta_properties(tmp_path) == props, variant
        except StorageStateError as exc:
            assert "corrupt" in exc.message or "not formatted" in exc.message


def test_a_flipped_cluster_id_that_is_still_a_valid_uuid_is_caught(tmp_path: Path) -> None:
    props, pristine = _meta(tmp_path)
    text = pristine.decode()
    other = "A" if props.cluster_id[0] != "A" else "B"
    (tmp_path / META_PROPERTIES_FILE).write_text(text.replace(props.cluster_id, other + props.cluster_id[1:]))
    with pytest.raises(StorageStateError, match="CRC-32C mismatch"):
        read_meta_properties(tmp_path)


def test_meta_properties_without_a_checksum_line_is_still_accepted(tmp_path: Path) -> None:
    props, pristine = _meta(tmp_path)
    older = b"\n".join(line for line in pristine.split(b"\n") if not line.startswith(b"#crc32c="))
    (tmp_path / META_PROPERTIES_FILE).write_bytes(older)
    assert read_meta_properties(tmp_path) == props


# --- the measured failures, and what must be logged -----------------------------------------------


def test_flipped_payload_byte_in_an_old_segment_drops_nothing_and_is_refused_on_read(tmp_path: Path) -> None:
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    path, start, end = _locations(directory)[3]  # in the first segment, far below the recovery point
    _damage(path, start + 100, end, "flip", 0x10)
    with SegmentedLog.open(directory, CONFIG) as log:
        assert log.end_offset == pristine.end_offset  # before: truncated here, dropping the rest
        with pytest.raises(CorruptLogError, match="CRC-32C mismatch") as caught:
            log.read(pristine.batches[3].base_offset, 1)
        assert caught.value.path == str(path) and caught.value.position == start


def test_a_decreasing_leader_epoch_is_corruption(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Epoch 1024 followed by 26: the epoch is outside the CRC, so only order and the cache catch it."""
    pristine = _pristine(False)
    cases = {
        "trusted": 5,  # wholly below the recovery point: refused on read
        "tail": len(pristine.batches) - 2,  # above it: truncated there, logged
    }
    for name, index in cases.items():
        directory = _copy(pristine, tmp_path / name)
        path, start, end = _locations(directory)[index]
        data = path.read_bytes()
        path.write_bytes(data[:start] + with_leader_epoch(data[start:end], 1024) + data[end:])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kraft.storage"):
            log = SegmentedLog.open(directory, CONFIG)
        try:
            base = pristine.batches[index].base_offset
            if name == "trusted":
                assert log.end_offset == pristine.end_offset
                with pytest.raises(CorruptLogError, match="leader epoch 1024"):
                    log.read(base, 1)
            else:
                assert base >= pristine.recovery_point
                assert log.end_offset == base
                (record,) = [r for r in caplog.records if r.getMessage() == "log_truncated"]
                fields = record.kraft_fields  # type: ignore[attr-defined]
                assert fields["file"] == str(path) and fields["offset"] == base
                assert fields["bytes_dropped"] > 0 and "epoch" in fields["reason"]
        finally:
            log.abandon()


def test_a_decreasing_epoch_below_the_recovery_point_is_refused_at_open(tmp_path: Path) -> None:
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    locations = _locations(directory)
    # The batch just below the recovery point lives in the segment holding it (scanned on open).
    index = max(i for i, b in enumerate(pristine.batches) if b.next_offset <= pristine.recovery_point)
    path, start, end = locations[index]
    assert path == segment_files(directory)[-1]
    data = path.read_bytes()
    path.write_bytes(data[:start] + with_leader_epoch(data[start:end], 1) + data[end:])
    with pytest.raises(CorruptLogError, match="leader epoch 1 refused: below the previous batch's epoch"):
        SegmentedLog.open(directory, CONFIG)


def test_a_missing_recovery_point_scans_everything_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    (directory / RECOVERY_POINT_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="kraft.storage"):
        log = SegmentedLog.open(directory, CONFIG)
    with log:
        assert log.end_offset == pristine.end_offset
        assert log.recovery_point == pristine.end_offset
    assert [r.getMessage() for r in caplog.records] == ["recovery_point_unknown"]


def test_a_short_log_below_its_recovery_point_is_refused(tmp_path: Path) -> None:
    pristine = _pristine(True)  # clean close: the recovery point is the end
    directory = _copy(pristine, tmp_path)
    newest = segment_files(directory)[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: _positions(data)[-1]])  # cut at a batch boundary: every batch still valid
    (directory / ".kraft_cleanshutdown").unlink()
    with pytest.raises(CorruptLogError, match="below its recovery point"):
        SegmentedLog.open(directory, CONFIG)


def test_a_log_whose_segments_all_vanished_is_refused(tmp_path: Path) -> None:
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    for path in directory.glob("*.log"):
        path.unlink()
    with pytest.raises(CorruptLogError, match="no segment files"):
        SegmentedLog.open(directory, CONFIG)


def test_the_recovery_point_follows_flushes_and_is_kafkas_file_format(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1 << 20, recovery_point_interval_bytes=2000)
    directory = tmp_path / "orders-3"
    log = SegmentedLog.open(directory, config)
    assert (directory / RECOVERY_POINT_FILE).read_text() == "0\n1\norders 3 0\n"
    log.append_records([(None, b"x" * 1500)], leader_epoch=1, timestamp_ms=0)
    log.flush()
    assert log.recovery_point == 0  # fewer than recovery_point_interval_bytes since the last checkpoint
    log.append_records([(None, b"x" * 1500)], leader_epoch=1, timestamp_ms=0)
    log.flush()
    assert log.recovery_point == 2
    assert (directory / RECOVERY_POINT_FILE).read_text() == "0\n1\norders 3 2\n"
    log.truncate_to(1)
    assert log.recovery_point <= log.end_offset == 1
    log.close()
    assert (directory / RECOVERY_POINT_FILE).read_text() == "0\n1\norders 3 1\n"
    assert (directory / LOG_START_OFFSET_FILE).read_text() == "0\n1\norders 3 0\n"


def test_a_legacy_offsets_checkpoint_is_read_once_then_replaced(tmp_path: Path) -> None:
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    (directory / RECOVERY_POINT_FILE).unlink()
    (directory / LOG_START_OFFSET_FILE).unlink()
    (directory / LEGACY_OFFSETS_CHECKPOINT_FILE).write_text(f"0\n0\n{pristine.recovery_point}\n")
    with SegmentedLog.open(directory, CONFIG) as log:
        assert log.end_offset == pristine.end_offset
    assert not (directory / LEGACY_OFFSETS_CHECKPOINT_FILE).exists()
    assert (directory / RECOVERY_POINT_FILE).exists()


# --- quorum-state ---------------------------------------------------------------------------------


def _quorum_state(tmp_path: Path) -> tuple[QuorumState, bytes]:
    state = QuorumState(leader_epoch=1234, leader_id=None, voted_id=2, voted_directory_id=random_uuid())
    QuorumStateStore(tmp_path).write(state)
    return state, (tmp_path / QUORUM_STATE_FILE).read_bytes()


@pytest.mark.parametrize("mask", [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF])
def test_every_flipped_byte_of_quorum_state_is_refused_or_harmless(tmp_path: Path, mask: int) -> None:
    """A flipped digit in the epoch or the vote is still valid JSON: the checksum catches it.  The only
    flips that may pass are those that leave the same state (whitespace JSON also accepts)."""
    state, pristine = _quorum_state(tmp_path)
    path = tmp_path / QUORUM_STATE_FILE
    refused = 0
    for position in range(len(pristine)):
        damaged = bytearray(pristine)
        damaged[position] ^= mask
        path.write_bytes(bytes(damaged))
        try:
            assert QuorumStateStore(tmp_path).read() == state, bytes(damaged)
        except StorageStateError as exc:
            assert "corrupt" in exc.message and str(path) in exc.message and "\n" not in exc.message
            refused += 1
        assert path.read_bytes() == bytes(damaged)  # never reset or rewritten
    assert refused >= len(pristine) - 8  # only a few whitespace flips can be harmless


def test_a_changed_epoch_or_vote_in_quorum_state_fails_its_checksum(tmp_path: Path) -> None:
    _state, pristine = _quorum_state(tmp_path)
    path = tmp_path / QUORUM_STATE_FILE
    for old, new in ((b"1234", b"1235"), (b'"votedId": 2', b'"votedId": 3'), (b"1234", b"4")):
        path.write_bytes(pristine.replace(old, new))
        with pytest.raises(StorageStateError, match="CRC-32C mismatch"):
            QuorumStateStore(tmp_path).read()


def test_truncated_zeroed_or_extended_quorum_state_is_refused_or_the_same(tmp_path: Path) -> None:
    state, pristine = _quorum_state(tmp_path)
    path = tmp_path / QUORUM_STATE_FILE
    variants = [pristine[:i] for i in range(len(pristine))]
    variants += [pristine[:i] + b"\x00" + pristine[i + 1 :] for i in range(len(pristine))]
    variants += [pristine + extra for extra in (b"\n", b" ", b"}", b"x", b"\x00")]
    for variant in variants:
        path.write_bytes(variant)
        try:
            assert QuorumStateStore(tmp_path).read() == state, variant
        except StorageStateError as exc:
            assert "corrupt" in exc.message


def test_quorum_state_without_a_checksum_is_accepted_only_with_known_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An older kraft's (or Kafka's) file has no checksum; a damaged key name cannot pass as one."""
    path = tmp_path / QUORUM_STATE_FILE
    path.write_text('{"leaderId": 1, "leaderEpoch": 7, "votedId": -1, "data_version": 1}')
    with caplog.at_level(logging.WARNING, logger="kraft.storage"):
        assert QuorumStateStore(tmp_path).read() == QuorumState(leader_epoch=7, leader_id=1)
    assert [r.getMessage() for r in caplog.records] == ["quorum_state_unchecked"]
    path.write_text('{"leaderId": 1, "leaderEpoch": 7, "votedId": -1, "data_version": 1, "crc32s": 5}')
    with pytest.raises(StorageStateError, match="unknown field 'crc32s'"):
        QuorumStateStore(tmp_path).read()


# --- recovery without a recovery point; torn tails --------------------------------------------------


def test_without_a_recovery_point_damage_in_an_old_segment_stops_the_open(tmp_path: Path) -> None:
    """Issue #14's measured failure: no clean-shutdown marker, a flipped byte in an old segment, and the
    log was cut there (~31,000 committed records gone, nothing logged).  Even with the recovery point
    lost, only the newest segment may hold a torn tail: older damage refuses the open, naming the file."""
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    (directory / RECOVERY_POINT_FILE).unlink()
    path, start, end = _locations(directory)[3]  # the first segment
    assert path != segment_files(directory)[-1]
    before = [p.read_bytes() for p in segment_files(directory)]
    _damage(path, start + 100, end, "flip", 0x10)
    with pytest.raises(CorruptLogError, match="CRC-32C mismatch") as caught:
        SegmentedLog.open(directory, CONFIG)
    assert caught.value.path == str(path) and caught.value.position == start
    # Nothing was truncated or deleted: the operator can still restore or re-replicate.
    after = [p.read_bytes() for p in segment_files(directory)]
    assert len(after) == len(before) and all(len(a) == len(b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize("recovery_point", ["kept", "lost"])
def test_a_torn_tail_is_truncated_with_a_line_naming_file_offset_and_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, recovery_point: str
) -> None:
    pristine = _pristine(False)
    directory = _copy(pristine, tmp_path)
    if recovery_point == "lost":
        (directory / RECOVERY_POINT_FILE).unlink()
    path, start, end = _locations(directory)[-1]  # the newest batch, above the recovery point
    last = pristine.batches[-1]
    assert last.base_offset >= pristine.recovery_point
    cut = start + (end - start) // 2
    with path.open("r+b") as out:
        out.truncate(cut)  # a torn write: half a batch
    with caplog.at_level(logging.INFO, logger="kraft.storage"):
        log = SegmentedLog.open(directory, CONFIG)
    with log:
        assert log.end_offset == last.base_offset
        assert log.read_all_batches() == b"".join(b.data for b in pristine.batches[:-1])
    [record] = [r for r in caplog.records if r.getMessage() == "log_truncated"]
    fields = record.kraft_fields  # type: ignore[attr-defined]
    assert fields["file"] == str(path) and fields["offset"] == last.base_offset
    assert fields["position"] == start and fields["bytes_dropped"] == cut - start
    assert "torn batch" in fields["reason"]
