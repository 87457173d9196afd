"""Committed data that no longer verifies when Raft reads it (issue #14): the driver reports it as fatal
(``RaftDriver.on_fatal``, which the node's supervisor turns into one ``event=fatal`` line and exit 70)
instead of answering around it — a leader whose follower Fetch hits a CorruptLogError used to answer
empty records forever, and a broker's MetadataFetch read raised without stopping anything."""

from __future__ import annotations

import asyncio

from raft_helpers import LoopbackCluster, wait_until

from kraft.raft.api import RaftShutdownError
from kraft.raft.memory import MemoryLogStore
from kraft.storage.errors import CorruptLogError, OffsetOutOfRangeError


class DamagedLog(MemoryLogStore):
    """A log whose reads fail once ``damaged`` is set, as the file log's read verification does."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = None

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        if self.error is not None:
            raise self.error
        return super().read(offset, max_bytes, max_offset)


async def _cluster_with_damaged_leader_log() -> tuple[LoopbackCluster, int, DamagedLog, list[str]]:
    cluster = LoopbackCluster(3)
    logs = {node_id: DamagedLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id].log = log
    await cluster.start_all()
    leader = await cluster.elect()
    await cluster.complete(leader.append([b"a", b"b"]), "first append")
    reasons: list[str] = []
    leader.on_fatal(lambda reason, error: reasons.append(f"{reason}: {error}"))
    return cluster, leader.node_id, logs[leader.node_id], reasons


async def test_a_corrupt_read_for_a_follower_fetch_fails_the_leader() -> None:
    cluster, leader_id, log, reasons = await _cluster_with_damaged_leader_log()
    try:
        log.error = CorruptLogError("00000000000000000000.log", 61, "CRC-32C mismatch on read", offset=1)
        leader = cluster.drivers[leader_id]
        # New records: the followers' next Fetch makes the leader read them back from its log.
        leader.schedule_append([b"c"])
        await cluster.run_until(lambda: bool(reasons), "the leader's fatal report", 2000)
        assert reasons[0].startswith(
            "raft_driver_failed: KAFKA_STORAGE_ERROR: corrupt 00000000000000000000.log"
        )
        try:
            leader.schedule_append([b"d"])
        except RaftShutdownError as exc:
            assert "raft failed" in str(exc)
        else:
            raise AssertionError("a failed driver accepted an append")
    finally:
        await cluster.close()


async def test_a_log_that_moved_under_a_fetch_is_answered_empty_not_fatal() -> None:
    cluster, leader_id, log, reasons = await _cluster_with_damaged_leader_log()
    try:
        log.error = OffsetOutOfRangeError("offset 0 is below the log start 5")
        leader = cluster.drivers[leader_id]
        leader.schedule_append([b"c"])
        for _ in range(20):  # the followers fetch again and again, answered empty
            await asyncio.sleep(0.005)
        assert reasons == [] and leader.high_watermark == 3
        log.error = None
        await cluster.run_until(lambda: leader.high_watermark == 4, "the append committed", 2000)
        assert reasons == []
    finally:
        log.error = None
        await cluster.close()


async def test_a_corrupt_read_of_committed_records_is_fatal() -> None:
    """What MetadataFetch reads for brokers (``read_committed``)."""
    cluster, leader_id, log, reasons = await _cluster_with_damaged_leader_log()
    try:
        log.error = CorruptLogError("00000000000000000000.log", 0, "CRC-32C mismatch on read", offset=0)
        try:
            await cluster.drivers[leader_id].read_committed(0, 1 << 20)
        except CorruptLogError:
            pass
        else:
            raise AssertionError("a corrupt read was served")
        await wait_until(lambda: bool(reasons), 2, "the fatal report")
        assert reasons[0].startswith("raft_log_corrupt: KAFKA_STORAGE_ERROR: corrupt")
    finally:
        log.error = None
        await cluster.close()
