"""A leader appends the batches it builds itself without the log's CRC pass; fetched bytes keep it
(issue #17, "A lone write's path": one checksum less on every write's path).

``LogStore.append(data, built=True)`` is the driver saying "I encoded this a moment ago": the segmented
log then skips ``check_batch`` (CRC-32C over the batch) but still checks that the offsets continue the
log and the epochs do not go back.  A follower's append of what it fetched is never ``built``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from raft_helpers import LoopbackCluster, NodeStores

from kraft.raft.memory import MemoryLogStore
from kraft.raft.storage_adapters import SegmentedLogStore
from kraft.storage.batch import BatchHeader, build_batch, iter_batch_headers
from kraft.storage.errors import CorruptRecordError, InvalidAppendError


class RecordingLog(MemoryLogStore):
    """Remembers, per append, whether the driver said it built the bytes, and the checked headers it
    handed over (``None``: none)."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[bool] = []
        self.checked: list[tuple[list[BatchHeader] | None, list[BatchHeader]]] = []
        """(headers handed over, the data's own headers) per append."""

    def append(
        self, data: bytes, *, built: bool = False, checked: Sequence[BatchHeader] | None = None
    ) -> None:
        self.appends.append(built)
        own = [header for _, header in iter_batch_headers(data)]
        self.checked.append((None if checked is None else list(checked), own))
        super().append(data, built=built, checked=checked)


async def test_the_leader_appends_its_own_batches_as_built_and_followers_their_fetched_ones_not() -> None:
    cluster = LoopbackCluster(3)
    logs = {node_id: RecordingLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        for log in logs.values():
            log.appends.clear()
            log.checked.clear()
        offset = leader.schedule_append([b"a", b"b"])
        await cluster.settle()
        assert leader.high_watermark > offset
        assert logs[leader.node_id].appends == [True]
        for node_id, log in logs.items():
            if node_id != leader.node_id:
                assert log.appends and not any(log.appends), node_id
                # The fetched bytes come with the headers the core's scan checked: exactly theirs
                # (session 20: one CRC pass per round).  The leader's own batch comes with none.
                assert all(handed == own for handed, own in log.checked), node_id
            else:
                assert [handed for handed, _ in log.checked] == [None]
    finally:
        await cluster.close()


def _corrupted(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # inside the records: covered by the CRC, not by any header check
    return bytes(damaged)


def test_segmented_store_skips_only_the_crc_pass_for_built_bytes() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SegmentedLogStore.open(Path(tmp) / "log")
        try:
            bad = _corrupted(build_batch(0, [(None, b"value")], leader_epoch=1, timestamp_ms=0))
            with pytest.raises(CorruptRecordError):
                store.append(bad)  # fetched bytes: CRC-checked, nothing written
            assert store.end_offset == 0
            # Built bytes are not checksummed again (the point of the flag), but must still continue
            # the log: a batch at the wrong offset is refused either way.
            with pytest.raises(InvalidAppendError):
                store.append(build_batch(5, [(None, b"v")], leader_epoch=1, timestamp_ms=0), built=True)
            store.append(build_batch(0, [(None, b"v")], leader_epoch=1, timestamp_ms=0), built=True)
            assert store.end_offset == 1
        finally:
            store.close()
