"""The driver's ports over ``kraft.storage``: the segmented log, ``quorum-state`` and snapshot files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kraft.raft.control_codec import voter_control_messages, voters_in_snapshot
from kraft.raft.log_tail import DEFAULT_TAIL_BYTES, LogTail
from kraft.raft.memory import decode_snapshot
from kraft.raft.messages import NO_LEADER, SnapshotId
from kraft.raft.state import ElectionState
from kraft.raft.voters import VoterSet
from kraft.storage.batch import BatchHeader
from kraft.storage.errors import StorageStateError
from kraft.storage.log import LogConfig, SegmentedLog
from kraft.storage.quorum_state import QuorumState, QuorumStateStore
from kraft.storage.snapshot import RawSnapshotWriter, SnapshotDirectory, SnapshotFileId


class SegmentedLogStore:
    """The segmented log as the driver's :class:`~kraft.raft.ports.LogStore`.  Reads of the newest batches
    (a leader's answers to its followers, the listeners' reads of what just committed) are answered from
    the bytes the appends wrote (:class:`~kraft.raft.log_tail.LogTail`, ``tail_bytes`` of them; 0: none)."""

    def __init__(self, log: SegmentedLog, *, tail_bytes: int = DEFAULT_TAIL_BYTES) -> None:
        self._log = log
        self.tail = LogTail(tail_bytes)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> SegmentedLogStore:
        return cls(SegmentedLog.open(directory, config), tail_bytes=tail_bytes)

    @property
    def start_offset(self) -> int:
        return self._log.start_offset

    @property
    def end_offset(self) -> int:
        return self._log.end_offset

    def epoch_entries(self) -> list[tuple[int, int]]:
        return self._log.epoch_entries()

    def append(
        self, data: bytes, *, built: bool = False, checked: Sequence[BatchHeader] | None = None
    ) -> None:
        # Fetched bytes come from the network: the log validates CRC and offsets before writing.  A batch
        # the driver just built (a leader's own) skips the CRC pass — one checksum over the whole batch
        # on a lone write's path; offsets and epochs are still checked by append_batch.  Fetched bytes
        # the driver's scan CRC-checked a moment ago come with those headers (``checked``): the log does
        # not check them twice, and the tail takes the same headers.
        try:
            appended = self._log.append_batch(data, validate=not built, checked=checked)
        except BaseException:
            self.tail.clear()  # the log may have failed part-way: its end is no longer the tail's
            raise
        self.tail.appended(data, appended.first_offset, checked)

    def flush(self) -> int:
        return self._log.flush()

    def truncate_to(self, end_offset: int) -> None:
        self.tail.clear()  # rare (a follower's divergence): the next append starts a new tail
        self._log.truncate_to(end_offset)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        log = self._log
        # Below the start the log raises whatever the tail still holds; a failed log raises (fail-stop).
        if offset >= log.start_offset and log.usable:
            cached = self.tail.read(offset, max_bytes, max_offset)
            if cached is not None:
                return cached
        return log.read(offset, max_bytes, max_offset=max_offset).records

    def delete_before(self, offset: int) -> int:
        self._log.delete_before(offset)
        return self._log.start_offset

    def reset_to(self, start_offset: int) -> None:
        self.tail.clear()
        self._log.truncate_fully_and_start_at(start_offset)

    def close(self) -> None:
        self.tail.clear()
        self._log.close()


class FileElectionStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._store = QuorumStateStore(directory)

    def read(self) -> ElectionState | None:
        stored = self._store.read()
        if stored is None:
            return None
        return ElectionState(
            stored.leader_epoch,
            NO_LEADER if stored.leader_id is None else stored.leader_id,
            NO_LEADER if stored.voted_id is None else stored.voted_id,
        )

    def write(self, state: ElectionState) -> None:
        self._store.write(
            QuorumState(
                leader_epoch=state.epoch,
                leader_id=state.leader_id if state.has_leader else None,
                voted_id=state.voted_id if state.has_voted else None,
            )
        )


def _storage_id(snapshot_id: SnapshotId) -> SnapshotFileId:
    return SnapshotFileId(snapshot_id.end_offset, snapshot_id.epoch)


class FileSnapshotStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._files = SnapshotDirectory(directory)
        self._download: RawSnapshotWriter | None = None

    def latest(self) -> SnapshotId | None:
        latest = self._files.latest()
        return None if latest is None else SnapshotId(latest.end_offset, latest.epoch)

    def _path(self, snapshot_id: SnapshotId) -> Path:
        path = self._files.path(_storage_id(snapshot_id))
        if not path.exists():
            raise KeyError(snapshot_id)
        return path

    def size(self, snapshot_id: SnapshotId) -> int:
        return self._path(snapshot_id).stat().st_size

    def read_chunk(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        self._path(snapshot_id)
        try:
            with self._files.open(_storage_id(snapshot_id)) as reader:
                return reader.read_chunk(position, max_bytes)
        except StorageStateError as exc:
            raise ValueError(str(exc)) from exc

    def read_records(self, snapshot_id: SnapshotId) -> tuple[int, list[bytes]]:
        self._path(snapshot_id)
        return decode_snapshot(self._files.read_verified(_storage_id(snapshot_id)))

    def read_voters(self, snapshot_id: SnapshotId) -> VoterSet | None:
        self._path(snapshot_id)
        return voters_in_snapshot(self._files.read_verified(_storage_id(snapshot_id)))

    def write(
        self,
        snapshot_id: SnapshotId,
        last_contained_timestamp_ms: int,
        records: Sequence[bytes],
        now_ms: int,
        voters: VoterSet | None = None,
    ) -> None:
        writer = self._files.create(
            _storage_id(snapshot_id),
            last_contained_log_timestamp=last_contained_timestamp_ms,
            timestamp_ms=now_ms,
        )
        try:
            if voters is not None:
                writer.append_control(voter_control_messages(voters))
            if records:
                writer.append_records([(None, value) for value in records])
            writer.freeze()
        except BaseException:
            writer.abort()
            raise

    def write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None:
        if position == 0:
            if self._download is not None:
                self._download.abort()
            self._download = self._files.create_raw(_storage_id(snapshot_id))
        download = self._download
        if download is None or download.snapshot_id != _storage_id(snapshot_id):
            raise ValueError(f"snapshot chunk at {position} does not continue a download of {snapshot_id}")
        download.write(position, data)

    def finish_download(self, snapshot_id: SnapshotId) -> None:
        download = self._download
        if download is None or download.snapshot_id != _storage_id(snapshot_id):
            raise ValueError(f"no download of {snapshot_id} in progress")
        self._download = None
        download.freeze()

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        self._files.delete_before(_storage_id(snapshot_id))
