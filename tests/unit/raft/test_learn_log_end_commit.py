"""``RaftDriver.learn_log_end_commit``: a follower waits for the high watermark to cover its log end.

A follower's Fetch that reports its progress past new records is what commits them at the leader.  Before
session 15 the leader parked that Fetch (nothing new to send), so the follower learned the commit only
with the leader's next answer — the next records, or the long poll's end (``fetch_max_wait_ms``).  A
graceful stop's catch-up (``commit_replay.replay_known_commits``) waits for that answer, within its
budget, so the image store it saves covers what the leader already counts as committed (issue #17,
session 14).  Leaders now answer such a Fetch at once (``LeaderRole._owes_high_watermark``), but a rolling
upgrade still meets the old behaviour (an older leader, or an older follower whose Fetch arrives after
another one committed), so these tests emulate an older leader
(:func:`raft_helpers.park_commits_like_an_older_leader`) — except the first, which shows today's leader.
"""

from __future__ import annotations

import asyncio

import pytest
from raft_helpers import (
    FAST_TIMINGS,
    HeldFetches,
    LoopbackCluster,
    park_commits_like_an_older_leader,
    wait_until,
)

from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import MemoryLogStore

GATE_TIMEOUT_S = 5.0
FETCH_MAX_WAIT_MS = FAST_TIMINGS["fetch_max_wait_ms"]
HIGH_WATERMARK_WAIT_MS = RaftConfig(node_id=1, voters=(1,), cluster_id="c").fetch_high_watermark_wait_ms
assert HIGH_WATERMARK_WAIT_MS < FETCH_MAX_WAIT_MS


class CountedLog(MemoryLogStore):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> int:
        end = super().flush()
        self.flushes += 1
        return end


async def _committed_by_a_follower(
    cluster: LoopbackCluster, logs: dict[int, CountedLog]
) -> tuple[RaftDriver, RaftDriver, int]:
    """A 2-voter cluster where the follower's progress Fetch commits a record (it reaches the leader
    after the leader's own fsync of it), with no manual time passing after.  Returns the leader, the
    follower and the record's offset."""
    fetches = HeldFetches(cluster)
    await cluster.start_all()
    leader = await cluster.elect()
    follower = next(d for n, d in cluster.drivers.items() if n != leader.node_id)
    await cluster.settle()
    # Hold the follower's progress Fetch until the leader flushed the record itself, so that Fetch is
    # what commits it (and parks), not the leader's fsync answering a Fetch taken during it.
    flushed = logs[leader.node_id].flushes
    fetches.hold({follower.node_id})
    offset = leader.schedule_append([b"a"])
    await wait_until(
        lambda: (
            logs[leader.node_id].flushes > flushed
            and any(f.fetch_offset > offset for f in fetches.held.get(follower.node_id, ()))
        ),
        GATE_TIMEOUT_S,
        "the leader's fsync done and the follower's progress Fetch held",
    )
    await cluster.settle()
    fetches.release()
    await cluster.settle()  # no manual time passes: a parked Fetch stays parked
    assert leader.high_watermark > offset
    return leader, follower, offset


async def _unlearned_commit(cluster: LoopbackCluster, logs: dict[int, CountedLog]) -> tuple[RaftDriver, int]:
    """The follower holds a record the leader committed and the follower does not know committed (its
    progress Fetch parked at an older leader).  Returns the follower and the offset."""
    _leader, follower, offset = await _committed_by_a_follower(cluster, logs)
    assert follower.high_watermark <= offset < follower.log_end_offset
    return follower, offset


def _cluster() -> tuple[LoopbackCluster, dict[int, CountedLog]]:
    cluster = LoopbackCluster(2)  # one follower: its Fetch alone moves the high watermark
    logs = {node_id: CountedLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id].log = log
    return cluster, logs


async def test_the_fetch_that_commits_is_answered_soon_so_the_follower_knows_without_the_long_poll() -> None:
    cluster, logs = _cluster()
    try:
        _leader, follower, offset = await _committed_by_a_follower(cluster, logs)
        # The leader holds that Fetch only for the next batch, a short bound (not the long poll's 50 ms).
        await cluster.advance(HIGH_WATERMARK_WAIT_MS)
        assert follower.high_watermark > offset
        learned = await asyncio.wait_for(follower.learn_log_end_commit(), GATE_TIMEOUT_S)
        assert learned > offset
    finally:
        await cluster.close()


async def test_a_follower_learns_the_commit_of_its_log_end_with_the_leaders_next_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    park_commits_like_an_older_leader(monkeypatch)
    cluster, logs = _cluster()
    try:
        follower, offset = await _unlearned_commit(cluster, logs)
        learn = asyncio.ensure_future(follower.learn_log_end_commit())
        await cluster.settle()
        assert not learn.done()  # nothing answered yet: the long poll is parked at the leader
        await cluster.advance(FETCH_MAX_WAIT_MS)  # the long poll ends: its answer carries the commit
        learned = await asyncio.wait_for(learn, GATE_TIMEOUT_S)
        assert learned > offset
        assert follower.high_watermark == learned
    finally:
        await cluster.close()


async def test_a_leader_or_a_caught_up_follower_answers_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    park_commits_like_an_older_leader(monkeypatch)
    cluster, logs = _cluster()
    try:
        follower, offset = await _unlearned_commit(cluster, logs)
        leader = cluster.leader()
        assert leader is not None
        assert await asyncio.wait_for(leader.learn_log_end_commit(), GATE_TIMEOUT_S) == leader.high_watermark
        await cluster.advance(FETCH_MAX_WAIT_MS)
        assert follower.high_watermark >= follower.log_end_offset
        # Nothing above the high watermark: no wait (no manual time passes here).
        assert await asyncio.wait_for(follower.learn_log_end_commit(), GATE_TIMEOUT_S) > offset
    finally:
        await cluster.close()


async def test_a_stop_or_a_cancelled_wait_leaves_no_waiter_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    park_commits_like_an_older_leader(monkeypatch)
    cluster, logs = _cluster()
    try:
        follower, offset = await _unlearned_commit(cluster, logs)
        bounded = asyncio.ensure_future(asyncio.wait_for(follower.learn_log_end_commit(), 0.01))
        try:
            await bounded
        except TimeoutError:
            pass
        else:
            raise AssertionError("learned without any answer from the leader")
        assert not follower._log_end_waiters  # the timed-out caller's entry is gone
        learn = asyncio.ensure_future(follower.learn_log_end_commit())
        await cluster.settle()
        assert not learn.done()
        await cluster.stop(follower.node_id)  # a stop answers it with what is known: no hang
        assert await asyncio.wait_for(learn, GATE_TIMEOUT_S) <= offset
    finally:
        await cluster.close()


async def test_a_new_leader_answers_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the old leader counted as committed may never be known here: the wait ends with it."""
    park_commits_like_an_older_leader(monkeypatch)
    cluster, logs = _cluster()
    try:
        follower, _offset = await _unlearned_commit(cluster, logs)
        old = follower.leader_and_epoch
        learn = asyncio.ensure_future(follower.learn_log_end_commit())
        await cluster.settle()
        assert not learn.done()
        await cluster.stop(old.leader_id)  # the follower's Fetches time out; it stands for election
        await cluster.run_until(lambda: follower.leader_and_epoch != old, "a leader change", 5000)
        await asyncio.wait_for(learn, GATE_TIMEOUT_S)
    finally:
        await cluster.close()
