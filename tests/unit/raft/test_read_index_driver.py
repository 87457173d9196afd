"""``RaftDriver.confirm_leadership`` over the loopback network on a manual clock: a live majority confirms
without waiting for a long poll; a leader cut off from its majority never confirms, and its callers fail
with NotLeaderError once check-quorum deposes it; followers are refused at once."""

from __future__ import annotations

import asyncio
import logging

import pytest
from metric_reads import family_sample, series_value
from raft_helpers import LoopbackCluster

from kraft.observability.logging import KeyValueFormatter
from kraft.observability.metrics import RAFT_CONFIRMATION_ROUND_SECONDS, RAFT_LEADERSHIP_CONFIRMATIONS
from kraft.raft.api import NotLeaderError


async def test_a_live_majority_confirms_within_one_fetch_round_trip_not_a_long_poll() -> None:
    cluster = LoopbackCluster(3, fetch_max_wait_ms=5000, fetch_timeout_ms=20_000, election_timeout_ms=10_000)
    try:
        await cluster.start_all()
        leader = await cluster.elect(max_ms=60_000, step_ms=100)
        await cluster.complete(leader.append([b"x"]), "a committed append", max_ms=1000)
        # Followers' long polls wait up to 5 s; a round answers them at once, so no clock needs to move.
        callers = [asyncio.ensure_future(leader.confirm_leadership()) for _ in range(3)]
        await cluster.settle()
        assert all(caller.done() for caller in callers)
        for caller in callers:
            await caller
        follower = next(d for d in cluster.drivers.values() if d is not leader)
        with pytest.raises(NotLeaderError):
            await follower.confirm_leadership()
    finally:
        await cluster.close()


async def test_a_leader_without_its_majority_never_confirms_and_fails_its_callers_when_deposed() -> None:
    cluster = LoopbackCluster(3)
    try:
        await cluster.start_all()
        leader = await cluster.elect()
        for node_id in [n for n in cluster.drivers if n != leader.node_id]:
            await cluster.stop(node_id)
        caller = asyncio.ensure_future(leader.confirm_leadership())
        await cluster.advance(100)  # a third of check-quorum's 1.5 fetch timeouts: still leader
        assert not caller.done() and leader.leader_and_epoch.leader_id == leader.node_id
        await cluster.run_until(caller.done, "the caller's failure", 1000)
        with pytest.raises(NotLeaderError):
            await caller
    finally:
        await cluster.close()


async def test_the_lease_answers_at_once_and_a_leader_that_lost_it_waits_for_a_round() -> None:
    """``confirm_leadership(lease=True)`` (issue #17): done in the call while a majority echoed a round
    started less than the lease ago; once the lease ended (no clock-free renewal when the majority is
    gone) the caller waits for a round like any other — and a leader without its majority never answers."""
    cluster = LoopbackCluster(3, fetch_max_wait_ms=5000, fetch_timeout_ms=2000, election_timeout_ms=1000)
    try:
        await cluster.start_all()
        leader = await cluster.elect(max_ms=60_000, step_ms=100)
        await cluster.complete(leader.append([b"x"]), "a committed append", max_ms=1000)
        await cluster.complete(leader.confirm_leadership(), "a confirmed round", max_ms=1000)
        assert leader.confirm_leadership(lease=True).done()  # no clock moved: the lease holds
        for node_id in [n for n in cluster.drivers if n != leader.node_id]:
            await cluster.stop(node_id)
        await cluster.advance(400)  # the lease: 0.8 x min(2000, 1000 // 2) = 400 ms since the round's start
        caller = leader.confirm_leadership(lease=True)
        await cluster.settle()
        assert not caller.done() and leader.leader_and_epoch.leader_id == leader.node_id
        await cluster.run_until(caller.done, "the caller's failure", 5000)
        with pytest.raises(NotLeaderError):
            await caller
    finally:
        await cluster.close()


async def test_confirmations_are_counted_by_how_they_were_answered(caplog: pytest.LogCaptureFixture) -> None:
    """``kraft_raft_leadership_confirmations_total{how}`` (issue #17, session 11): a lease hit, a lease
    caller that found the lease lapsed, and a caller that always waits for a round are told apart, and
    each round a caller waited on is timed once it confirms (a round that never does is not timed)."""
    cluster = LoopbackCluster(3, fetch_max_wait_ms=5000, fetch_timeout_ms=2000, election_timeout_ms=1000)
    try:
        await cluster.start_all()
        leader = await cluster.elect(max_ms=60_000, step_ms=100)
        node = str(leader.node_id)
        await cluster.complete(leader.append([b"x"]), "a committed append", max_ms=1000)
        caplog.set_level(logging.INFO, logger="kraft.raft")
        # a lease caller before any lease hit: a round, and no lease_lapsed line (nothing was lost)
        await cluster.complete(leader.confirm_leadership(lease=True), "a confirmed round", max_ms=1000)

        def counts() -> tuple[float, ...]:
            return (
                *(series_value(RAFT_LEADERSHIP_CONFIRMATIONS, node=node, how=how) for how in HOWS),
                family_sample(
                    RAFT_CONFIRMATION_ROUND_SECONDS, "kraft_raft_confirmation_round_seconds_count", node=node
                )
                or 0.0,
            )

        start = counts()
        await cluster.complete(leader.confirm_leadership(), "a confirmed round", max_ms=1000)
        assert [b - a for a, b in zip(start, counts(), strict=True)] == [0, 0, 1, 1]
        assert leader.confirm_leadership(lease=True).done()  # the round just confirmed renewed the lease
        assert [b - a for a, b in zip(start, counts(), strict=True)] == [1, 0, 1, 1]
        for node_id in [n for n in cluster.drivers if n != leader.node_id]:
            await cluster.stop(node_id)
        await cluster.advance(400)  # the lease (0.8 x min(2000, 1000 // 2) ms) ended with no echo since
        caller = leader.confirm_leadership(lease=True)
        again = leader.confirm_leadership(lease=True)
        assert not caller.done() and not again.done()
        assert [b - a for a, b in zip(start, counts(), strict=True)] == [1, 2, 1, 1]
        # one line for the lease lost while in use (the caller before was answered from it), not per caller
        lines = [KeyValueFormatter().format(r) for r in caplog.records if r.getMessage() == "lease_lapsed"]
        assert len(lines) == 1, lines
        assert "last_hit_age_ms=400" in lines[0] and "latest_round_age_ms=400" in lines[0]
        await cluster.run_until(caller.done, "the caller's failure", 5000)
        for waiting in (caller, again):
            with pytest.raises(NotLeaderError):
                await waiting
        # a round that failed (deposed) is not timed
        assert [b - a for a, b in zip(start, counts(), strict=True)] == [1, 2, 1, 1]
    finally:
        await cluster.close()


HOWS = ("lease", "lease_lapsed", "round")


async def test_a_lease_hit_that_changes_nothing_costs_no_driver_turn_and_the_renewal_still_runs() -> None:
    """Issue #17, session 12: at 500 heartbeats a second each lease hit queued a driver turn (an empty
    output and a new sleep).  Now only a hit that changes the core's output or deadline queues one: the
    first lease caller, which arms the renewal timer, does — and that timer then renews the lease with no
    caller and the followers' long polls parked (5 s) — while the hits after it do not."""
    cluster = LoopbackCluster(3, fetch_max_wait_ms=5000, fetch_timeout_ms=2000, election_timeout_ms=1000)
    try:
        await cluster.start_all()
        leader = await cluster.elect(max_ms=60_000, step_ms=100)
        await cluster.complete(leader.append([b"x"]), "a committed append", max_ms=1000)
        await cluster.complete(leader.confirm_leadership(), "a confirmed round", max_ms=1000)
        await cluster.settle()
        core = leader._core
        expiry = core.leader_lease_expiry_ms()
        started = core._leader.read_round_started if core._leader is not None else -1
        assert not leader._wakeup_queued
        # The first lease caller arms the renewal timer: a driver turn takes the new deadline.
        assert leader.confirm_leadership(lease=True).done()
        assert leader._wakeup_queued
        await cluster.settle()
        # The next ones change nothing: answered, no turn queued.
        for _ in range(3):
            assert leader.confirm_leadership(lease=True).done()
            assert not leader._wakeup_queued
        # The renewal comes from the armed timer alone (a quarter of the 400 ms lease spent): a round
        # answers the parked long polls and their echoes move the lease on.
        await cluster.advance(110)
        await cluster.settle()
        assert core._leader is not None and core._leader.read_round_started > started
        assert core.leader_lease_expiry_ms() > expiry
    finally:
        await cluster.close()
