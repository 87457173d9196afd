"""The controller simulation takes the leader's synchronous commit hand-over (``handle_commit_now``) as the
driver does (tests/sim/sim_raft_client.py's ``ListenerFeed`` asks ``kraft.raft.listeners.hand_over_now``):
a seed hands batches over in the step they commit, ends in the image the same seed reaches with every
batch through ``handle_commit``, replays exactly, and a controller whose fast path claims a batch without
applying it fails the simulation."""

from __future__ import annotations

import pytest

from kraft.metadata.controller import QuorumController
from kraft.metadata.image import MetadataImage
from kraft.raft.api import CommittedBatch
from sim.harness import InvariantViolation
from sim.test_controller_sim import SCENARIOS, ControllerSimulation, start_simulation

SCENARIO = "failover_never_fences_live_brokers"
SEED = 0


def _final(commit_now: bool) -> tuple[MetadataImage, int]:
    sim = ControllerSimulation(SEED, commit_now=commit_now)
    try:
        start_simulation(sim)
        SCENARIOS[SCENARIO](sim)
        return sim.leader_image(), sim.committed_now
    finally:
        sim.close()


def test_commits_go_synchronously_to_the_same_final_image() -> None:
    fast, taken = _final(commit_now=True)
    slow, none_taken = _final(commit_now=False)
    assert taken > 0, "no committed batch reached handle_commit_now"
    assert none_taken == 0
    assert fast == slow
    # Same seed, same history: the fast path keeps the simulation replayable.
    assert _final(commit_now=True) == (fast, taken)


def test_a_fast_path_that_skips_the_image_fails_the_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken only where the driver (and now the feed) calls ``handle_commit_now`` directly, not where
    ``handle_commit`` calls it: the simulation without the fast path cannot see it, with it it must."""
    handle_commit, handle_commit_now = QuorumController.handle_commit, QuorumController.handle_commit_now
    from_task: list[bool] = [False]

    async def task_path(self: QuorumController, batch: CommittedBatch) -> None:
        from_task[0] = True  # handle_commit calls handle_commit_now first, before it suspends
        await handle_commit(self, batch)

    def claims_without_applying(self: QuorumController, batch: CommittedBatch) -> bool:
        if from_task[0]:
            from_task[0] = False
            return handle_commit_now(self, batch)
        if batch.last_offset <= self.state.committed.offset:
            return True
        return self.writes.own_image(batch) is not None  # taken, but the image is never installed

    monkeypatch.setattr(QuorumController, "handle_commit", task_path)
    monkeypatch.setattr(QuorumController, "handle_commit_now", claims_without_applying)
    _final(commit_now=False)  # the break is out of the task path's reach
    with pytest.raises(InvariantViolation):
        _final(commit_now=True)
