"""The driver's ports: small Protocols for everything outside the Raft core.

Each has a real adapter (:mod:`kraft.raft.storage_adapters`, over ``kraft.storage``) and an in-memory fake
(:mod:`kraft.raft.memory`); ``tests/unit/raft/test_raft_ports_contract.py`` runs one suite against both so the
fakes cannot drift.  Methods are synchronous: the metadata log is small and local, so the driver calls
them inline, except :meth:`LogStore.flush` and the snapshot/quorum-state writes, which it runs in
worker threads (the flush on its own one, ``kraft.raft.sync_worker``; the others through
``asyncio.to_thread``) to keep fsyncs off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kraft.raft.messages import SnapshotId
from kraft.raft.state import ElectionState
from kraft.raft.voters import VoterSet

if TYPE_CHECKING:  # a port names the header type; the core's import closure stays free of kraft.storage
    from kraft.storage.batch import BatchHeader


class LogStore(Protocol):
    """The replicated log: whole Kafka v2 record batches."""

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    def epoch_entries(self) -> list[tuple[int, int]]:
        """(epoch, start offset) of every epoch in the log, ascending."""
        ...

    def append(
        self, data: bytes, *, built: bool = False, checked: Sequence[BatchHeader] | None = None
    ) -> None:
        """Append whole batches starting at ``end_offset`` (buffered; durable after :meth:`flush`).

        ``built``: the driver encoded ``data`` itself a moment ago (a leader's own batch), so a store
        that checks fetched bytes (CRC, header chain) may skip that check; offsets must still continue
        the log.  Bytes from the network are always appended with ``built=False``.  ``checked``: the
        headers of ``data``'s batches, each CRC-checked by the driver's scan of these very bytes
        (:class:`kraft.raft.driver.FetchedBatchScan`): a store may take them instead of checking the
        CRCs again; offsets, epochs, its size cap and that they tile ``data`` it still checks."""
        ...

    def flush(self) -> int:
        """fsync everything appended; returns the durable end offset.  May run in a worker thread."""
        ...

    def truncate_to(self, end_offset: int) -> None: ...

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one starting at ``offset``: at least one if any, then more while they
        fit in ``max_bytes``; only batches starting below ``max_offset`` when given."""
        ...

    def delete_before(self, offset: int) -> int:
        """Drop the log below ``offset`` (after a snapshot); returns the new start offset."""
        ...

    def reset_to(self, start_offset: int) -> None:
        """Delete everything; the log restarts empty at ``start_offset`` (snapshot install)."""
        ...

    def close(self) -> None: ...


class ElectionStore(Protocol):
    """The ``quorum-state`` file."""

    def read(self) -> ElectionState | None: ...

    def write(self, state: ElectionState) -> None:
        """Atomically replace the stored state (durable on return)."""
        ...


class SnapshotStore(Protocol):
    """Snapshot files: Kafka layout (SnapshotHeader batch, data batches, SnapshotFooter batch)."""

    def latest(self) -> SnapshotId | None: ...

    def size(self, snapshot_id: SnapshotId) -> int:
        """Bytes in the snapshot file; ``KeyError`` when it does not exist."""
        ...

    def read_chunk(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        """Raw bytes at ``position``; ``KeyError`` when missing, ``ValueError`` outside the file."""
        ...

    def read_records(self, snapshot_id: SnapshotId) -> tuple[int, list[bytes]]:
        """(last contained log timestamp, every data record value) of a frozen snapshot."""
        ...

    def read_voters(self, snapshot_id: SnapshotId) -> VoterSet | None:
        """The voter set a frozen snapshot holds (KIP-853), None for a static quorum's snapshot."""
        ...

    def write(
        self,
        snapshot_id: SnapshotId,
        last_contained_timestamp_ms: int,
        records: Sequence[bytes],
        now_ms: int,
        voters: VoterSet | None = None,
    ) -> None:
        """Write and freeze a snapshot from record values (and, with a dynamic quorum, the voter set at
        its end offset: KRaftVersion and Voters control records after the header, as Kafka writes)."""
        ...

    def write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None:
        """Receive downloaded bytes (position 0 starts a new download of ``snapshot_id``)."""
        ...

    def finish_download(self, snapshot_id: SnapshotId) -> None:
        """Validate and freeze the downloaded snapshot; raises on corrupt data (download discarded)."""
        ...

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        """Delete every snapshot older than ``snapshot_id``."""
        ...
