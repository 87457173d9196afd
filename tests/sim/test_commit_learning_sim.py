"""How soon followers learn a commit, in the deterministic Raft simulation, over many seeds.

A lone write on a quiet 3-voter cluster: the leader appends it and answers both followers' parked long
polls with it; each follower appends, flushes and fetches again from its new log end — and that Fetch is
what commits the write at the leader (with the leader's own flush).  Nothing new is left to send, so
before session 15 such a Fetch parked, and a follower learned the commit only with the leader's next
answer: the next write, or the long poll's end (``fetch_max_wait_ms``).  Kafka answers it at once
(``KafkaRaftClient.handleFetchRequest``, KIP-1166); kraft's leader now answers it within
``fetch_high_watermark_wait_ms`` (10 ms: the next batch may carry it; docs/internals/raft.md "Long polls
and the high watermark").  Bound: that, a few message delays and flushes, far below the long poll.
"""

from __future__ import annotations

from sim.harness import Simulation

LONG_POLL_MS = 500
"""The followers' ``fetch_max_wait_ms``: far above every bound here, so a parked answer shows."""
LEARN_BOUND_MS = 40
"""Virtual time from the write until every follower's core knows it committed: a handful of message
delays (1-3 ms each) and flushes (0-2 ms each), with the nodes' clocks drifting apart."""
ELECTION_BOUND_MS = 5000


def _late_followers(seed: int) -> dict[int, int]:
    """Run one seed: the followers that learned the lone write's commit later than the bound, with the
    virtual time each took (empty: every follower learned in time)."""
    sim = Simulation(
        seed,
        voters=3,
        fetch_max_wait_ms=LONG_POLL_MS,
        fetch_timeout_ms=4 * LONG_POLL_MS,  # a parked long poll is no silence
        election_timeout_ms=LONG_POLL_MS,
    )
    sim.start_all()
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "a stable leader")
    leader = sim.leader()
    assert leader is not None
    # Let the election's own commit settle so the followers' long polls are parked, idle.
    sim.run_for(50)
    followers = [node for node in sim.nodes.values() if node is not leader]
    offset = leader.client_append(b"lone write")
    start_ms = sim.now_ms
    learned_at: dict[int, int] = {}

    def all_learned() -> bool:
        for node in followers:
            if node.node_id not in learned_at and node.live_core.high_watermark > offset:
                learned_at[node.node_id] = sim.now_ms - start_ms
        return len(learned_at) == len(followers)

    while not all_learned() and sim.now_ms - start_ms < 2 * LONG_POLL_MS:
        sim.run_for(1)
    assert leader.live_core.is_leader  # the same epoch throughout: nothing else to explain a delay
    return {node_id: took for node_id, took in learned_at.items() if took > LEARN_BOUND_MS} | {
        node.node_id: -1 for node in followers if node.node_id not in learned_at
    }


def test_both_followers_learn_a_lone_commit_within_a_few_message_delays(sim_seeds: list[int]) -> None:
    late = {seed: found for seed in sim_seeds[:50] if (found := _late_followers(seed))}
    assert not late, f"followers (node: ms after the write) that learned the commit late, by seed: {late}"
