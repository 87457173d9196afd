"""Issue #15 in the simulation: a forger on the network next to a healthy quorum under workload.

Node 4 is an observer that also forges: Fetch requests naming non-voters with offsets far past the log
(they must never move the high watermark), Fetch requests impersonating voters under its authenticated
identity (refused, never counted), and — as an unauthenticated peer — standard votes claiming a voter id
at the next epoch (a live leader and its fetching followers refuse them).  Through it all the leader and
its epoch stay, the high watermark never passes what a majority of voters has durably, and the final
check finds every node with the same committed log.
"""

from __future__ import annotations

import pytest

from kraft.raft.messages import FetchRequest, RaftRequest, VoteRequest
from kraft.raft.quorum import majority_offset
from sim.harness import SimNode, Simulation

FORGER = 4
SEEDS = range(40)


def _inject(target: SimNode, forger: SimNode, request: RaftRequest, peer_id: int | None) -> None:
    """Deliver ``request`` to ``target`` as if ``forger`` sent it (answers go back to the forger, whose
    core ignores correlation ids it never issued)."""
    request_id = target.next_request_id
    target.next_request_id += 1
    target.pending_requests[request_id] = (forger.node_id, forger.incarnation, 1_000_000 + request_id)
    target.process(target.live_core.handle_request(request_id, request, target.sim.now_ms, peer_id=peer_id))


def _durable_majority(sim: Simulation) -> int:
    return majority_offset([sim.nodes[v].live_core.log.flushed_end for v in sim.voter_ids])


@pytest.mark.parametrize("seed", SEEDS)
def test_forged_requests_never_move_the_hwm_or_depose_the_leader(seed: int) -> None:
    sim = Simulation(seed, voters=3, observers=1)
    sim.start_all()
    sim.start_workload()
    sim.run_until_condition(sim.has_stable_leader, 3000, "the initial election")
    sim.run_for(300)  # every follower has fetched from the leader
    leader = sim.leader()
    assert leader is not None
    leader_id, epoch = leader.node_id, leader.live_core.epoch
    forger = sim.nodes[FORGER]
    cluster = leader.live_core.config.cluster_id
    rng = sim.rng
    for _ in range(60):
        sim.run_for(rng.randint(1, 25))
        core = leader.live_core
        far = core.log.end_offset + rng.randint(1, 1 << 40)
        for replica_id in (FORGER, 99, rng.choice(sim.voter_ids)):
            fetch = FetchRequest(cluster, replica_id, epoch, far, epoch, 0)
            # A non-voter's own id, or anyone's id under the forger's authenticated identity.
            _inject(leader, forger, fetch, FORGER)
            if replica_id not in sim.voter_ids:
                _inject(leader, forger, fetch, None)  # plaintext claims of a non-voter id
        for target_id in sim.voter_ids:
            target = sim.nodes[target_id]
            candidate = rng.choice([v for v in sim.voter_ids if v != target_id])
            log = target.live_core.log
            vote = VoteRequest(cluster, epoch + 1, candidate, target_id, log.last_epoch, log.end_offset)
            _inject(target, forger, vote, None)  # plaintext: claims a voter id
        assert leader.live_core.high_watermark <= _durable_majority(sim)
        current = sim.leader()
        assert current is not None and (current.node_id, current.live_core.epoch) == (leader_id, epoch)
    sim.check_final()
