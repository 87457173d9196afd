"""The asyncio driver over in-memory ports: single voter, a 3-node loopback cluster, snapshots, restarts."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest
from raft_helpers import LoopbackCluster, RecordingListener, settle, wait_until

from kraft.clock import Clock, ManualClock, SystemClock
from kraft.errors import ErrorCode
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, OffsetBelowLogStartError, RaftShutdownError
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import (
    LoopbackNetwork,
    MemoryElectionStore,
    MemoryLogStore,
    MemorySnapshotStore,
)
from kraft.raft.messages import (
    DescribeQuorumRequest,
    FetchRequest,
    RaftRequest,
    RaftResponse,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import StateKind
from kraft.raft.storage_adapters import FileElectionStore, FileSnapshotStore, SegmentedLogStore
from kraft.raft.transport import TransportError
from kraft.storage.batch import iter_batches


def _single_voter(
    log: MemoryLogStore | None = None,
    elections: MemoryElectionStore | None = None,
    snapshots: MemorySnapshotStore | None = None,
    clock: Clock | None = None,
    append_linger_ms: int = 1,
) -> RaftDriver:
    return RaftDriver(
        RaftConfig(node_id=1, voters=(1,), cluster_id="c1", append_linger_ms=append_linger_ms),
        transport=LoopbackNetwork().transport(1),
        log=log or MemoryLogStore(),
        elections=elections or MemoryElectionStore(),
        snapshots=snapshots or MemorySnapshotStore(),
        clock=clock or SystemClock(),
        rng=random.Random(7),
    )


async def test_single_voter_elects_itself_and_commits_appends() -> None:
    driver = _single_voter()
    listener = RecordingListener()
    driver.register_listener(listener)
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        last = await driver.append([b"a", b"b"])
        assert last == 2  # offset 0 is the LeaderChange control batch
        assert driver.high_watermark == 3
        await wait_until(lambda: listener.next_offset == 3, 5, "listener catch-up")
        assert listener.values == {1: b"a", 2: b"b"}
        assert listener.control_offsets == [0]
        assert listener.leaders[-1].leader_id == 1
    finally:
        await driver.stop()


async def test_appends_within_the_linger_share_one_batch() -> None:
    log = MemoryLogStore()
    driver = _single_voter(log=log)
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        first = driver.schedule_append([b"x"])
        second = await driver.append([b"y"])
        assert second == first + 1
        batches = list(iter_batches(log.read(1, 1 << 20)))
        assert [(b.base_offset, len(b.records)) for b in batches] == [(1, 2)]
    finally:
        await driver.stop()


async def test_a_big_batch_is_committed_and_delivered_in_order() -> None:
    log = MemoryLogStore()
    driver = _single_voter(log=log)
    listener = RecordingListener()
    driver.register_listener(listener)
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        big = [b"%05d" % i * 20 for i in range(768)]  # ~75 KiB in one batch
        last_big = await driver.append(big)
        last_small = await driver.append([b"tail"])
        assert last_small == last_big + 1
        await wait_until(lambda: listener.next_offset == last_small + 1, 10, "listener catch-up")
        assert [listener.values[offset] for offset in range(1, last_big + 1)] == big
        assert listener.values[last_small] == b"tail"
        assert sum(len(b.records) for b in iter_batches(log.read(1, 1 << 22))) == len(big) + 1
    finally:
        await driver.stop()


async def test_snapshot_deletes_the_log_below_it_and_new_listeners_load_it() -> None:
    log = MemoryLogStore()
    driver = _single_voter(log=log)
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        last = await driver.append([b"a", b"b", b"c"])
        writer = driver.create_snapshot(last + 1, driver.leader_and_epoch.epoch, 123)
        writer.append([b"state"])
        snapshot_id = await writer.freeze()
        assert driver.latest_snapshot_id() == snapshot_id
        assert log.start_offset == last + 1
        with pytest.raises(OffsetBelowLogStartError):
            await driver.read_committed(0, 1024)
        await driver.append([b"d"])
        late = RecordingListener()
        driver.register_listener(late)
        await wait_until(lambda: late.next_offset == last + 2, 5, "snapshot load + tail")
        assert late.snapshot_values == [b"state"]
        assert late.snapshots[0].last_contained_timestamp_ms == 123
        assert late.values == {last + 1: b"d"}
        chunk = await driver.read_snapshot(snapshot_id, 0, 1 << 20)
        assert chunk.size == len(chunk.data) > 0
    finally:
        await driver.stop()


async def test_snapshot_beyond_the_high_watermark_is_refused() -> None:
    driver = _single_voter()
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        await driver.append([b"a"])
        with pytest.raises(ValueError, match="high watermark"):
            driver.create_snapshot(50, 1, 0)
        with pytest.raises(ValueError, match="epoch"):
            driver.create_snapshot(2, 7, 0)
    finally:
        await driver.stop()


async def test_restart_keeps_committed_records_and_never_reuses_the_epoch() -> None:
    log, elections, snapshots = MemoryLogStore(), MemoryElectionStore(), MemorySnapshotStore()
    first = _single_voter(log, elections, snapshots)
    await first.start()
    await wait_until(lambda: first.leader_and_epoch.leader_id == 1, 5, "self-election")
    await first.append([b"kept"])
    epoch = first.leader_and_epoch.epoch
    await first.shutdown(1000)
    first.close()
    second = _single_voter(log, elections, snapshots)
    listener = RecordingListener()
    second.register_listener(listener)
    await second.start()
    try:
        await wait_until(lambda: second.leader_and_epoch.leader_id == 1, 5, "re-election")
        assert second.leader_and_epoch.epoch > epoch
        await second.append([b"new"])
        await wait_until(lambda: b"new" in listener.values.values(), 5, "listener")
        assert list(listener.values.values()) == [b"kept", b"new"]
    finally:
        await second.stop()


async def test_requests_after_shutdown_fail_clearly() -> None:
    driver = _single_voter()
    await driver.start()
    await driver.stop()
    with pytest.raises(RaftShutdownError):
        await driver.handle_request(DescribeQuorumRequest("c1"))
    with pytest.raises(RaftShutdownError):
        driver.schedule_append([b"x"])


async def test_wrong_cluster_id_is_answered_with_an_error_code() -> None:
    driver = _single_voter()
    await driver.start()
    try:
        response = await driver.handle_request(VoteRequest("other", 5, 2, 1, 0, 0))
        assert response.error_code is ErrorCode.INCONSISTENT_CLUSTER_ID
    finally:
        await driver.stop()


class _ManualPeer:
    """A request handler that answers only when the test resolves its pending futures."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[RaftResponse]] = []
        self.cancelled = 0

    async def handle_request(self, request: RaftRequest, peer_id: int | None = None) -> RaftResponse:
        future: asyncio.Future[RaftResponse] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def _move_network_clock(clock: ManualClock, network: LoopbackNetwork, delta_ms: int) -> None:
    clock.advance(delta_ms)
    network.recheck_timers()
    await settle([], network=network)


_VOTE = VoteRequest("c1", 1, 1, 2, 0, 0)


async def test_loopback_requests_time_out_on_the_network_clock() -> None:
    clock = ManualClock()
    network = LoopbackNetwork(clock)
    peer = _ManualPeer()
    network.register(2, peer)
    transport = network.transport(1)
    late = asyncio.ensure_future(transport.send(2, _VOTE, 200))
    answered = asyncio.ensure_future(transport.send(2, _VOTE, 200))
    await settle([], network=network)
    assert len(peer.pending) == 2
    await _move_network_clock(clock, network, 199)
    assert not late.done() and not answered.done(), "a request timed out before its deadline"
    peer.pending[1].set_result(VoteResponse(ErrorCode.NONE, "", 1, 1, True))
    await settle([], network=network)
    assert answered.result().error_code is ErrorCode.NONE  # answered in time: no clock movement needed
    await _move_network_clock(clock, network, 1)
    assert late.done(), "the request outlived its 200 ms deadline on the network's clock"
    with pytest.raises(TransportError, match="DEADLINE_EXCEEDED"):
        late.result()
    assert peer.cancelled == 1  # the handler stops waiting, as a gRPC server call does at its deadline


async def test_an_unreachable_peer_fails_after_the_unreachable_delay_on_the_network_clock() -> None:
    clock = ManualClock()
    network = LoopbackNetwork(clock, unreachable_delay_ms=50)
    peer = _ManualPeer()
    network.register(2, peer)
    network.isolate(2)
    call = asyncio.ensure_future(network.transport(1).send(2, _VOTE, 200))
    await settle([], network=network)
    await _move_network_clock(clock, network, 49)
    assert not call.done(), "an unreachable peer failed before the delay"
    await _move_network_clock(clock, network, 1)
    assert call.done(), "an unreachable peer still pending after the 50 ms delay on the network's clock"
    with pytest.raises(TransportError, match="UNAVAILABLE"):
        call.result()
    assert peer.pending == []  # nothing reached the isolated node


async def test_three_nodes_replicate_and_fail_over() -> None:
    cluster = LoopbackCluster(3)
    listeners = {node_id: RecordingListener() for node_id in cluster.voters}
    try:
        await cluster.start_all()
        for node_id, driver in cluster.drivers.items():
            driver.register_listener(listeners[node_id])
        leader = await cluster.elect()
        last = await cluster.complete(leader.append([b"one", b"two"]), "committed append")
        follower = next(d for d in cluster.drivers.values() if d is not leader)
        with pytest.raises(NotLeaderError) as not_leader:
            await cluster.complete(follower.append([b"nope"]), "refused append")
        assert not_leader.value.leader.leader_id == leader.node_id
        await cluster.run_until(
            lambda: all(lst.next_offset > last for lst in listeners.values()), "replication to all", 1000
        )
        described = leader.describe_quorum()
        assert described.error_code is ErrorCode.NONE
        assert [v.replica_id for v in described.current_voters] == [1, 2, 3]
        assert follower.describe_quorum().error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER

        old_id = leader.node_id
        await cluster.stop(old_id)
        new_leader = await cluster.elect(exclude=old_id)
        last = await cluster.complete(new_leader.append([b"three"]), "post-failover append")
        survivors = [listeners[n] for n in cluster.drivers]
        await cluster.run_until(
            lambda: all(lst.next_offset > last for lst in survivors), "post-failover commit", 1000
        )
        for lst in survivors:
            assert [v for v in lst.values.values()] == [b"one", b"two", b"three"]
    finally:
        await cluster.close()


async def test_graceful_shutdown_hands_leadership_over_without_waiting_for_a_timeout() -> None:
    clock = ManualClock()
    cluster = LoopbackCluster(3, clock=clock, election_timeout_ms=2000, fetch_timeout_ms=4000)
    try:
        await cluster.start_all()
        leader = await cluster.elect(max_ms=6000)
        old_id = leader.node_id
        await cluster.complete(leader.append([b"x"]), "committed append", max_ms=500)
        resigned_at_ms = clock.monotonic_ms()
        # The clock stands still from here: EndQuorumEpoch lets the preferred successor run at once, so
        # the handover needs no timer at all (without it: the 4 s fetch timeout, or a 2-4 s election one).
        await asyncio.wait_for(leader.shutdown(3000), 10)
        cluster.drivers.pop(old_id)
        cluster.network.unregister(old_id)
        await cluster.settle()
        assert cluster.elected(exclude=old_id)
        assert clock.monotonic_ms() == resigned_at_ms
    finally:
        await cluster.close()


async def test_shutdown_gives_up_waiting_for_a_successor_at_its_deadline_on_the_driver_clock() -> None:
    clock = ManualClock()
    # Election timeouts far beyond the shutdown timeout: the resigned leader's state stays put while
    # it waits, so nothing but the clock can end the wait (a state change would also wake it).
    cluster = LoopbackCluster(3, clock=clock, election_timeout_ms=100_000, fetch_timeout_ms=200_000)
    try:
        await cluster.start_all()
        leader = await cluster.elect(max_ms=300_000, step_ms=1000)
        cluster.network.isolate(leader.node_id)  # it can never hear of a successor
        shutdown = asyncio.ensure_future(leader.shutdown(60_000))
        await cluster.settle()  # it has resigned and taken its deadline from the clock
        assert leader.state is StateKind.RESIGNED
        await cluster.advance(59_999)  # settles the leader's shutdown() too: recheck_timers woke it
        assert not shutdown.done(), "shutdown gave up before its deadline"
        assert leader.state is StateKind.RESIGNED
        clock.advance(1)
        leader.recheck_timers()
        # A real-time bound far below the 60 s timeout: only the manual clock can have ended the wait.
        await asyncio.wait_for(shutdown, 5)
        with pytest.raises(RaftShutdownError):
            leader.schedule_append([b"late"])
    finally:
        await cluster.close()


async def test_lagging_follower_catches_up_from_a_snapshot() -> None:
    cluster = LoopbackCluster(3)
    try:
        await cluster.start_all()
        leader = await cluster.elect()
        laggard_id = next(n for n in cluster.voters if n != leader.node_id)
        await cluster.stop(laggard_id)
        last = 0
        for index in range(20):
            last = await cluster.complete(leader.append([b"v%d" % index]), "committed append")
        writer = leader.create_snapshot(last + 1, leader.leader_and_epoch.epoch, 0)
        writer.append([b"image-at-%d" % last])
        await asyncio.wait_for(writer.freeze(), 10)  # a worker-thread write: no manual time involved
        tail = await cluster.complete(leader.append([b"after"]), "committed append")
        listener = RecordingListener()
        laggard = await cluster.start(laggard_id)
        laggard.register_listener(listener)
        await cluster.run_until(lambda: laggard.high_watermark > tail, "laggard catch-up", 2000)
        # The listener loads the snapshot in a worker thread; that needs no manual time, only real time.
        await wait_until(lambda: listener.next_offset > tail, 10, "laggard's listener catch-up")
        assert listener.snapshot_values == [b"image-at-%d" % last]
        assert listener.values == {tail: b"after"}
        assert cluster.stores[laggard_id].log.start_offset == last + 1
    finally:
        await cluster.close()


async def test_fetch_from_an_unknown_epoch_gets_an_epoch_error() -> None:
    cluster = LoopbackCluster(3)
    try:
        await cluster.start_all()
        leader = await cluster.elect()
        epoch = leader.leader_and_epoch.epoch
        response = await leader.handle_request(FetchRequest("test-cluster", 2, epoch + 5, 0, 0))
        assert response.error_code is ErrorCode.UNKNOWN_LEADER_EPOCH
    finally:
        await cluster.close()


class _LeaderChangeProbe(RecordingListener):
    """Remembers how far it had read when each leader change arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.offset_at_change: list[tuple[int, int]] = []

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.offset_at_change.append((leader.leader_id, self.next_offset))
        await super().handle_leader_change(leader)


async def test_a_new_leader_is_reported_only_after_the_previous_epochs_are_applied() -> None:
    cluster = LoopbackCluster(3)
    probes = {node_id: _LeaderChangeProbe() for node_id in cluster.voters}
    try:
        await cluster.start_all()
        for node_id, driver in cluster.drivers.items():
            driver.register_listener(probes[node_id])
        leader = await cluster.elect()
        last = await cluster.complete(leader.append([b"a", b"b", b"c"]), "committed append")
        await cluster.stop(leader.node_id)
        successor = await cluster.elect(exclude=leader.node_id)
        probe = probes[successor.node_id]
        await cluster.run_until(
            lambda: any(lid == successor.node_id for lid, _ in probe.offset_at_change), "report", 1000
        )
        offset_when_told = next(off for lid, off in probe.offset_at_change if lid == successor.node_id)
        assert offset_when_told > last  # everything of the old epoch, and its own LeaderChange, applied
    finally:
        await cluster.close()


async def test_read_committed_serves_whole_committed_batches_only() -> None:
    driver = _single_voter()
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        last = await driver.append([b"a", b"b"])
        committed = await driver.read_committed(0, 1 << 20)
        assert committed.next_offset == last + 1 == committed.high_watermark
        values = [r.value for b in iter_batches(committed.records) for r in b.records if not b.is_control]
        assert values == [b"a", b"b"]
        empty = await driver.read_committed(committed.next_offset, 1024)
        assert empty.records == b"" and empty.next_offset == committed.next_offset
    finally:
        await driver.stop()


async def test_an_idle_leader_writes_a_lone_append_without_lingering() -> None:
    # Group commit: with no flush in flight there is nothing to gather appends for, so even a 400 ms
    # linger bound does not delay a lone append; on the manual clock no time passes at all.  (The bound
    # itself is a core rule with explicit times: tests/unit/raft/test_group_commit.py.)
    clock = ManualClock()
    log = MemoryLogStore()
    driver = _single_voter(log=log, clock=clock, append_linger_ms=400)
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        started_ms = clock.monotonic_ms()
        offset = await driver.append([b"alone"])
        await settle([driver])
        assert log.end_offset == offset + 1 and driver.high_watermark == offset + 1
        assert clock.monotonic_ms() == started_ms  # written, flushed and committed without waiting
    finally:
        await driver.stop()


async def test_no_voter_campaigns_before_its_election_timeout() -> None:
    clock = ManualClock()
    cluster = LoopbackCluster(3, clock=clock, election_timeout_ms=1000, fetch_timeout_ms=2000)
    try:
        await cluster.start_all()
        await cluster.advance(999)  # every random election timeout lies in [1000, 2000) ms
        assert [d.state for d in cluster.drivers.values()] == [StateKind.UNATTACHED] * 3
        assert all(d.leader_and_epoch.epoch == 0 for d in cluster.drivers.values())
        await cluster.run_until(cluster.elected, "elected leader", max_ms=2000)
        elected_at_ms = clock.monotonic_ms()
        assert 1000 <= elected_at_ms < 2000 + 10  # within the first timeout's 10 ms step
        leader = cluster.leader()
        assert leader is not None and leader.leader_and_epoch.epoch >= 1

        # DescribeQuorum shows fetch times on the wall clock (Kafka's epoch ms), not the monotonic one.
        def all_fetched() -> bool:
            voters = leader.describe_quorum().current_voters
            return all(v.last_fetch_timestamp_ms >= 0 for v in voters if v.replica_id != leader.node_id)

        await cluster.run_until(all_fetched, "fetch from every follower", max_ms=500)
        wall_offset_ms = clock.wall_ms() - clock.monotonic_ms()
        for voter in leader.describe_quorum().current_voters:
            if voter.replica_id != leader.node_id:
                fetched_at_ms = voter.last_fetch_timestamp_ms - wall_offset_ms
                assert elected_at_ms <= fetched_at_ms <= clock.monotonic_ms(), voter
    finally:
        await cluster.close()


def _on_disk(directory: Path) -> RaftDriver:
    return RaftDriver(
        RaftConfig(node_id=1, voters=(1,), cluster_id="c1", append_linger_ms=1),
        transport=LoopbackNetwork().transport(1),
        log=SegmentedLogStore.open(directory),
        elections=FileElectionStore(directory),
        snapshots=FileSnapshotStore(directory),
        clock=SystemClock(),
        rng=random.Random(5),
    )


async def test_on_disk_stores_survive_a_restart_with_a_snapshot(tmp_path: Path) -> None:
    first = _on_disk(tmp_path)
    await first.start()
    try:
        await wait_until(lambda: first.leader_and_epoch.leader_id == 1, 5, "self-election")
        last = await first.append([b"a", b"b"])
        writer = first.create_snapshot(last + 1, first.leader_and_epoch.epoch, 7)
        writer.append([b"image"])
        await writer.freeze()
        await first.append([b"tail"])
    finally:
        await first.shutdown(1000)
        first.close()
    second = _on_disk(tmp_path)
    listener = RecordingListener()
    second.register_listener(listener)
    await second.start()
    try:
        await wait_until(lambda: second.leader_and_epoch.leader_id == 1, 5, "re-election")
        await wait_until(lambda: b"tail" in listener.values.values(), 5, "snapshot + tail")
        assert listener.snapshot_values == [b"image"]
        assert second.leader_and_epoch.epoch > 1  # the restarted leader never reuses its epoch
    finally:
        await second.shutdown(1000)
        second.close()


async def test_a_core_that_keeps_asking_to_be_polled_never_starves_the_loop_and_is_reported(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node resumed from SIGSTOP once went silent with no log line and ignored SIGTERM.  Whatever the
    # core's deadlines say, the driver must yield to the event loop between polls (signal handlers, the
    # gRPC server and logging run there), and a deadline that stays due must be reported.
    import kraft.raft.driver as driver_module
    from kraft.raft.core_output import Output

    monkeypatch.setattr(driver_module, "SPIN_REPORT_POLLS", 50)
    caplog.set_level(logging.ERROR, logger="kraft.raft")
    clock = ManualClock()
    driver = _single_voter(clock=clock)
    await driver.start()
    try:
        polls = 0

        def always_due(now_ms: int) -> Output:
            nonlocal polls
            polls += 1
            return Output(next_deadline_ms=now_ms)  # "poll me again now", forever

        monkeypatch.setattr(driver._core, "poll", always_due)
        driver._wake.set()
        turns = 0
        for _ in range(200):  # other tasks keep getting turns while the core spins
            await asyncio.sleep(0)
            turns += 1
        assert turns == 200 and polls >= 50
        spinning = [r for r in caplog.records if "raft_poll_spinning" in r.getMessage()]
        assert len(spinning) == 1, [r.getMessage() for r in caplog.records]
    finally:
        monkeypatch.undo()
        await driver.stop()
