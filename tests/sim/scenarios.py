"""Simulation scenarios: each builds a cluster from a seed, injects faults, and asserts.

Every scenario ends with :meth:`Simulation.check_final` (heal, restart, converge, compare committed data,
no acknowledged append lost); invariants are checked after every event by the harness itself.
Kafka's seven (``RaftEventSimulationTest``) come first, then kraft's additions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from kraft.errors import ErrorCode
from kraft.raft.api import NotLeaderError, VoterChangeError
from kraft.raft.state import StateKind
from kraft.raft.voters import VoterSet
from sim.harness import InvariantViolation, SimNode, Simulation

ELECTION_BOUND_MS = 2000
"""Generous virtual-time bound for an election in the scaled-down timings (timeout 50-100 ms)."""


def _started(seed: int, voters: int = 3, observers: int = 0, **overrides: int) -> Simulation:
    sim = Simulation(seed, voters=voters, observers=observers, **overrides)
    sim.start_all()
    sim.start_workload()
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "the initial election")
    return sim


def _leader(sim: Simulation) -> SimNode:
    leader = sim.leader()
    if leader is None:
        raise InvariantViolation(f"seed {sim.seed}: no leader")
    return leader


def _wait_new_leader(sim: Simulation, old_epoch: int, exclude: set[int] | None = None) -> SimNode:
    excluded = exclude or set()

    def elected() -> bool:
        leader = sim.leader()
        if leader is None or leader.node_id in excluded:
            return False
        core = leader.live_core
        return core.epoch > old_epoch and core.high_watermark > core.epoch_start_offset

    sim.run_until_condition(elected, ELECTION_BOUND_MS, f"a new leader after epoch {old_epoch}")
    return _leader(sim)


def _fail(sim: Simulation, message: str) -> NoReturn:
    raise InvariantViolation(f"seed {sim.seed}: {message}")


# --------------------------------------------------------------------------- Kafka's seven


def initial_election(seed: int) -> None:
    sim = _started(seed, observers=1)
    acked = len(sim.acked)
    sim.run_for(300)
    if len(sim.acked) <= acked:
        _fail(sim, "no progress after the initial election")
    sim.check_final()


def leader_failure(seed: int) -> None:
    sim = _started(seed)
    sim.run_for(sim.rng.randint(20, 200))
    old = _leader(sim)
    old_epoch = old.live_core.epoch
    sim.crash(old.node_id)
    _wait_new_leader(sim, old_epoch, exclude={old.node_id})
    sim.run_for(200)
    sim.check_final()


def all_killed(seed: int) -> None:
    sim = _started(seed)
    sim.run_for(sim.rng.randint(50, 300))
    for node_id in sim.nodes:
        sim.crash(node_id)
    sim.run_for(100)
    for node_id in sim.nodes:
        sim.restart(node_id)
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "an election after a full restart")
    acked = len(sim.acked)
    sim.run_for(200)
    if len(sim.acked) <= acked:
        _fail(sim, "no progress after a full restart")
    sim.check_final()


def leader_partitioned_away(seed: int) -> None:
    sim = _started(seed)
    sim.run_for(sim.rng.randint(20, 200))
    old = _leader(sim)
    sim.router.isolate(old.node_id)
    _wait_new_leader(sim, old.live_core.epoch, exclude={old.node_id})
    sim.run_for(200)
    sim.check_final()


def majority_progresses_while_minority_cut(seed: int) -> None:
    sim = _started(seed, voters=5)
    leader = _leader(sim)
    followers = [node_id for node_id in sim.voter_ids if node_id != leader.node_id]
    minority = set(sim.rng.sample(followers, 2))
    sim.router.cut(minority, set(sim.nodes) - minority)
    acked = len(sim.acked)
    sim.run_for(400)
    if len(sim.acked) <= acked:
        _fail(sim, "the majority made no progress while a minority was cut off")
    sim.check_final()


def back_to_back_leader_failures(seed: int) -> None:
    sim = _started(seed, voters=5)
    first = _leader(sim)
    sim.crash(first.node_id)

    def someone_else_leads() -> bool:
        leader = sim.leader()
        return leader is not None and leader.live_core.epoch > first.election.epoch

    sim.run_until_condition(someone_else_leads, ELECTION_BOUND_MS, "a second leader")
    second = _leader(sim)
    sim.crash(second.node_id)  # at once, possibly before it committed anything
    _wait_new_leader(sim, second.election.epoch, exclude={first.node_id, second.node_id})
    sim.run_for(200)
    sim.check_final()


def committed_data_lost_on_one_node(seed: int) -> None:
    sim = _started(seed)
    sim.run_for(sim.rng.randint(100, 300))
    leader = _leader(sim)
    victim = sim.nodes[sim.rng.choice([n for n in sim.voter_ids if n != leader.node_id])]
    others = [sim.nodes[n] for n in sim.voter_ids if n != victim.node_id]

    def others_hold_everything_the_victim_has() -> bool:
        needed = max(sim.max_high_watermark, victim.log.durable_end)
        return all(node.log.durable_end >= needed for node in others)

    # Raft tolerates losing one copy only while the other copies are intact: the leader still counts
    # the victim's last reported offset (kraft has no directory ids to notice the wiped disk).
    sim.router.isolate(victim.node_id)
    sim.run_until_condition(
        others_hold_everything_the_victim_has, ELECTION_BOUND_MS, "the others catching up"
    )
    victim.wipe()
    sim.router.heal()
    victim.start()
    sim.run_for(300)
    sim.check_final()


# --------------------------------------------------------------------------- kraft's additions


def no_commit_without_majority(seed: int) -> None:
    sim = _started(seed, voters=5)
    leader = _leader(sim)
    follower = sim.rng.choice([n for n in sim.voter_ids if n != leader.node_id])
    minority = {leader.node_id, follower}
    sim.router.cut(minority, set(sim.nodes) - minority)
    # Every commit needs a node of the majority side, whose offsets the leader can no longer learn:
    # nothing past what the majority side already holds can commit on the minority side.
    frozen = max(sim.nodes[n].log.durable_end for n in sim.voter_ids if n not in minority)
    for _ in range(40):
        sim.run_for(10)
        for node_id in minority:
            if sim.nodes[node_id].high_watermark > frozen:
                _fail(sim, f"node {node_id} advanced its high watermark without a majority")
    sim.check_final()


def old_leader_uncommitted_entries_overwritten(seed: int) -> None:
    sim = _started(seed)
    old = _leader(sim)
    sim.router.isolate(old.node_id)
    sim.run_for(30)  # the isolated leader keeps appending entries that can never commit
    uncommitted_end = old.log.end_offset
    if uncommitted_end <= old.high_watermark:
        _fail(sim, "the isolated leader appended nothing")
    _wait_new_leader(sim, old.live_core.epoch, exclude={old.node_id})
    sim.run_for(100)
    sim.check_final()
    if old.stats.truncations == 0:
        _fail(sim, "the old leader never truncated its uncommitted entries")


def fast_backup_over_conflicting_entries(seed: int) -> None:
    sim = _started(seed, append_linger_ms=0)
    sim.append_interval_ms = 1000  # only the explicit appends below
    old = _leader(sim)
    sim.router.isolate(old.node_id)
    for index in range(60):
        old.client_append(b"conflict-%d" % index)
        sim.run_for(1)
    if old.log.end_offset - old.high_watermark < 50:
        _fail(sim, "fewer than 50 conflicting entries were appended")
    new = _wait_new_leader(sim, old.live_core.epoch, exclude={old.node_id})
    for index in range(60):
        new.client_append(b"winner-%d" % index)
    sim.run_for(50)
    old.stats.diverging_responses = 0
    sim.check_final()
    if old.stats.diverging_responses > 4:
        _fail(sim, f"backing up took {old.stats.diverging_responses} diverging round trips")


def figure8_churn_on_unreliable_network(seed: int) -> None:
    sim = _started(seed, voters=5, observers=1)
    sim.router.drop_probability = 0.05
    sim.router.duplicate_probability = 0.05
    sim.router.max_delay_ms = 8
    down: set[int] = set()
    for _ in range(12):
        action = sim.rng.random()
        candidates = [n for n in sim.voter_ids if n not in down]
        if action < 0.35 and len(down) < 2:
            victim = sim.rng.choice(candidates)
            sim.crash(victim)
            down.add(victim)
        elif action < 0.6 and down:
            revived = sim.rng.choice(sorted(down))
            sim.restart(revived)
            down.discard(revived)
        elif action < 0.8:
            sim.router.isolated = {sim.rng.choice(list(sim.nodes))}
        else:
            sim.router.isolated.clear()
            sim.router.blocked.clear()
        sim.run_for(sim.rng.randint(20, 150))
    sim.check_final()


def rejoining_node_cannot_depose_leader(seed: int) -> None:
    sim = _started(seed)
    leader = _leader(sim)
    epoch = leader.live_core.epoch
    loner = sim.nodes[sim.rng.choice([n for n in sim.voter_ids if n != leader.node_id])]
    sim.router.isolate(loner.node_id)
    sim.run_for(800)  # many election timeouts: only pre-votes, so no epoch bump
    if loner.live_core.epoch != epoch:
        _fail(sim, f"the isolated node bumped its epoch to {loner.live_core.epoch}")
    sim.router.heal()
    sim.run_for(400)
    current = _leader(sim)
    if current.node_id != leader.node_id or current.live_core.epoch != epoch:
        _fail(sim, "a rejoining node deposed a healthy leader")
    sim.check_final()


def isolated_leader_resigns(seed: int) -> None:
    sim = _started(seed)
    leader = _leader(sim)
    sim.router.isolate(leader.node_id)
    # check-quorum: 1.5 x fetch timeout (150 ms) plus slack for the last fetch before the cut
    sim.run_for(300)
    if leader.live_core.is_leader:
        _fail(sim, "an isolated leader did not resign")
    sim.check_final()


def follower_catches_up_by_snapshot(seed: int) -> None:
    sim = Simulation(seed)
    for node in sim.nodes.values():
        node.snapshot_every = 40
    sim.start_all()
    sim.start_workload()
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "the initial election")
    leader = _leader(sim)
    laggard = sim.nodes[sim.rng.choice([n for n in sim.voter_ids if n != leader.node_id])]
    sim.crash(laggard.node_id)
    sim.run_for(400)  # ~100 appends: the others snapshot and delete their logs below
    laggard.start()
    sim.run_for(200)
    sim.check_final()
    if laggard.stats.snapshots_installed == 0:
        _fail(sim, "the laggard caught up without a snapshot")


def graceful_resignation_hands_over_quickly(seed: int) -> None:
    sim = _started(seed)
    sim.run_for(sim.rng.randint(10, 100))
    old = _leader(sim)
    old_epoch = old.live_core.epoch
    old.process(old.live_core.resign(old.clock_ms()))
    # EndQuorumEpoch lets the preferred successor campaign at once: well under the 100 ms fetch timeout.
    resigned_at = sim.now_ms
    new = _wait_new_leader(sim, old_epoch, exclude={old.node_id})
    if sim.now_ms - resigned_at > 90:
        _fail(sim, f"hand-over took {sim.now_ms - resigned_at} ms")
    sim.crash(old.node_id)
    if new.live_core.epoch <= old_epoch:
        _fail(sim, "the successor did not bump the epoch")
    sim.run_for(100)
    sim.check_final()


def dead_leader_detected_before_fetch_timeout(seed: int) -> None:
    sim = _started(seed)
    sim.run_for(sim.rng.randint(10, 100))
    old = _leader(sim)
    old_epoch = old.live_core.epoch
    survivors = [node for node in sim.nodes.values() if node is not old]
    # A killed process refuses connections: after a few refused fetches and a randomized 25-50 ms
    # grace the followers pre-vote, well before the 100 ms fetch timeout would have let them (a split
    # vote may still follow, so only the campaign start is bounded tightly).
    sim.crash(old.node_id)

    def campaigning() -> bool:
        return any(node.live_core.state is not StateKind.FOLLOWER for node in survivors)

    sim.run_until_condition(campaigning, 75, "a pre-vote before the fetch timeout")
    _wait_new_leader(sim, old_epoch, exclude={old.node_id})
    sim.run_for(100)
    sim.check_final()


# --------------------------------------------------------------------------- dynamic quorum (KIP-853)

VOTER_CHANGE_BOUND_MS = 6000
"""Virtual-time bound for one voter change to commit, retried across elections and crashes."""


def _started_dynamic(seed: int, voters: int, observers: int, **overrides: int) -> Simulation:
    sim = Simulation.dynamic_quorum(seed, voters=voters, observers=observers, **overrides)
    sim.start_all()
    sim.start_workload()
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "the initial election")
    return sim


def _committed_voters(sim: Simulation) -> VoterSet | None:
    """The current leader's voter set once its last VotersRecord is committed, else None."""
    leader = sim.leader()
    if leader is None:
        return None
    core = leader.live_core
    history = core.voter_history
    if history.latest_offset >= core.high_watermark or core.high_watermark <= core.epoch_start_offset:
        return None
    return history.latest


def _change_voters(
    sim: Simulation, done: Callable[[VoterSet], bool], change: Callable[[], int], what: str
) -> None:
    """Ask the leader for ``change`` until its committed voter set satisfies ``done``: a change refused
    as "not yet" (epoch not committed, another change pending, the new voter not caught up), or lost
    with its leader, is asked again — as an operator's tool retries."""
    deadline = sim.now_ms + VOTER_CHANGE_BOUND_MS
    while True:
        voters = _committed_voters(sim)
        if voters is not None and done(voters):
            return
        if sim.now_ms >= deadline:
            _fail(sim, f"{what} did not commit within {VOTER_CHANGE_BOUND_MS} ms")
        leader = sim.leader()
        if leader is not None and not done(leader.live_core.voter_set):
            try:
                change()
            except NotLeaderError:
                pass
            except VoterChangeError as exc:
                if exc.code is not ErrorCode.REQUEST_TIMED_OUT:
                    raise
        sim.run_for(10)


def _add(sim: Simulation, node_id: int) -> None:
    node = sim.nodes[node_id]
    _change_voters(
        sim,
        lambda voters: voters.is_voter(node_id, node.directory_id),
        lambda: sim.add_voter(node_id),
        f"adding voter {node_id}",
    )


def _remove(sim: Simulation, node_id: int, directory_id: str) -> None:
    _change_voters(
        sim,
        lambda voters: not voters.is_voter(node_id, directory_id),
        lambda: sim.remove_voter(node_id, directory_id),
        f"removing voter {node_id}",
    )


def _check_voter_sets_agree(sim: Simulation) -> None:
    """After check_final every node has applied the same log: the same voter set is in force on all."""
    sets = {node.node_id: node.live_core.voter_set for node in sim.nodes.values()}
    if len(set(sets.values())) != 1:
        _fail(sim, f"voter sets differ after convergence: {sets}")


def dynamic_grow_one_to_three(seed: int) -> None:
    """Format one node standalone, add two observers one at a time while the leader writes, then the
    three-voter quorum survives the loss of its leader."""
    sim = _started_dynamic(seed, voters=1, observers=2)
    sim.run_for(sim.rng.randint(20, 100))
    _add(sim, 2)
    if sim.rng.random() < 0.5:
        sim.crash(2)  # the new voter restarts: it must rebuild the voter set from its own log
        sim.run_for(sim.rng.randint(5, 50))
        sim.nodes[2].start()
    _add(sim, 3)
    sim.run_for(sim.rng.randint(20, 100))
    old = _leader(sim)
    old_epoch = old.live_core.epoch
    sim.crash(old.node_id)
    _wait_new_leader(sim, old_epoch, exclude={old.node_id})
    sim.run_for(100)
    sim.check_final()
    _check_voter_sets_agree(sim)
    if sim.leader() is None or len(_leader(sim).live_core.voter_set) != 3:
        _fail(sim, "the quorum did not end with three voters")


def dynamic_removed_leader_hands_over(seed: int) -> None:
    """The leader removes itself: it keeps leading until the change commits (counting the others'
    majority only), then resigns; the remaining voters elect a leader and it stays an observer."""
    sim = _started_dynamic(seed, voters=3, observers=0)
    sim.run_for(sim.rng.randint(20, 100))
    old = _leader(sim)
    old_epoch = old.live_core.epoch
    _remove(sim, old.node_id, old.directory_id)
    new = _wait_new_leader(sim, old_epoch, exclude={old.node_id})
    if old.live_core.is_voter or old.live_core.is_leader:
        _fail(sim, "the removed leader still votes or leads")
    if len(new.live_core.voter_set) != 2:
        _fail(sim, f"expected two voters, got {new.live_core.voter_set.ids}")
    sim.run_for(200)
    sim.check_final()
    _check_voter_sets_agree(sim)


def dynamic_replace_wiped_voter(seed: int) -> None:
    """A voter loses its disk and is reformatted (new directory id): it rejoins as an observer and
    cannot vote or count toward the high watermark; removing its old key and adding the new one makes
    it a voter again, while the leader keeps writing."""
    sim = _started_dynamic(seed, voters=3, observers=0)
    sim.run_for(sim.rng.randint(50, 200))
    leader = _leader(sim)
    victim = sim.nodes[sim.rng.choice([n for n in sim.voter_ids if n != leader.node_id])]
    old_directory = victim.directory_id
    others = [sim.nodes[n] for n in sim.voter_ids if n != victim.node_id]

    def others_hold_everything_the_victim_has() -> bool:
        needed = max(sim.max_high_watermark, victim.log.durable_end)
        return all(node.log.durable_end >= needed for node in others)

    # Losing a disk loses that copy: only safe while the other copies are intact (as in
    # committed_data_lost_on_one_node).  What directory ids add: the wiped node no longer counts.
    sim.router.isolate(victim.node_id)
    sim.run_until_condition(
        others_hold_everything_the_victim_has, ELECTION_BOUND_MS, "the others catching up"
    )
    victim.wipe()
    sim.router.heal()
    victim.start()
    sim.run_for(sim.rng.randint(20, 100))
    if victim.live_core.is_voter:
        _fail(sim, "a wiped node is a voter under its new directory id")
    _remove(sim, victim.node_id, old_directory)
    _add(sim, victim.node_id)
    sim.run_for(100)
    if not victim.live_core.is_voter:
        _fail(sim, "the re-added node is not a voter")
    sim.check_final()
    _check_voter_sets_agree(sim)


def dynamic_membership_churn_under_faults(seed: int) -> None:
    """Adds and removes interleaved with crashes, partitions and snapshots: after each change the
    committed voter set is the one asked for, and everything stays safe (one leader per epoch, committed
    data durable on a majority of the set that committed it, identical logs)."""
    sim = Simulation.dynamic_quorum(seed, voters=3, observers=2)
    for node in sim.nodes.values():
        node.snapshot_every = 60
    sim.start_all()
    sim.start_workload()
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "the initial election")
    for _round in range(4):
        voters = _leader(sim).live_core.voter_set
        spares = [n for n in sim.nodes if n not in voters]
        fault = sim.rng.choice(["crash", "partition", "none"])
        victim = sim.rng.choice(list(sim.nodes))
        if fault == "crash":
            sim.crash(victim)
        elif fault == "partition":
            sim.router.isolate(victim)
        sim.run_for(sim.rng.randint(0, 40))
        # Heal before the change so a majority of old and new sets can be reached (liveness only).
        if fault == "crash":
            sim.nodes[victim].start()
        sim.router.heal()
        if spares and (len(voters) < 4 or sim.rng.random() < 0.5):
            _add(sim, sim.rng.choice(spares))
        else:
            gone = sim.rng.choice(voters.voters)
            _remove(sim, gone.node_id, gone.directory_id)
        sim.run_for(sim.rng.randint(20, 80))
    sim.check_final()
    _check_voter_sets_agree(sim)


def _append_change(sim: Simulation, change: Callable[[], int], what: str) -> tuple[SimNode, int]:
    """Ask the leader for ``change`` until it appends the VotersRecord (refusals "not yet" are retried,
    as an operator's tool does); returns that leader and the record's offset, still uncommitted."""
    deadline = sim.now_ms + VOTER_CHANGE_BOUND_MS
    while sim.now_ms < deadline:
        leader = sim.leader()
        if leader is not None:
            try:
                return leader, change()
            except NotLeaderError:
                pass
            except VoterChangeError as exc:
                if exc.code is not ErrorCode.REQUEST_TIMED_OUT:
                    raise
        sim.run_for(5)
    _fail(sim, f"{what} was never appended within {VOTER_CHANGE_BOUND_MS} ms")


def _lose_leader_before_commit(sim: Simulation, leader: SimNode, offset: int) -> None:
    """Crash or cut off ``leader`` while its VotersRecord at ``offset`` is uncommitted — at once or after
    a millisecond or two, so the record may have reached some followers, none or all — and bring it back
    later (a scheduled restart or heal, while the others elect and the operator retries)."""
    for _ in range(sim.rng.randint(0, 2)):
        if leader.live_core.high_watermark > offset:
            break
        sim.run_for(1)
    if leader.live_core.high_watermark > offset:
        return  # committed already: the change went through before any fault (rare)
    fault = sim.rng.choice(["crash", "partition"])
    back_after = sim.rng.randint(50, 400)
    if fault == "crash":
        sim.crash(leader.node_id)
        sim.schedule(back_after, lambda: None if leader.running else leader.start())
    else:
        sim.router.isolate(leader.node_id)
        sim.schedule(back_after, lambda: sim.router.isolated.discard(leader.node_id))


def _wipe_once_others_hold_its_log(sim: Simulation, victim: SimNode) -> bool:
    """Cut ``victim`` off and wipe its disk (new directory id) once every other node whose copy counts
    toward the high watermark holds everything the victim has (losing a disk loses that copy: only safe
    while the others are intact).  False, and no wipe, if that does not happen within the bound."""
    others = [sim.nodes[voter.node_id] for voter in sim.hwm_voters if voter.node_id != victim.node_id]
    sim.router.isolate(victim.node_id)
    deadline = sim.now_ms + ELECTION_BOUND_MS
    while True:
        needed = max(sim.max_high_watermark, victim.log.durable_end)
        if all(node.log.durable_end >= needed for node in others):
            break
        if sim.now_ms >= deadline:
            sim.router.isolated.discard(victim.node_id)
            return False
        sim.run_for(5)
    victim.wipe()
    sim.router.isolated.discard(victim.node_id)
    victim.start()
    return True


def _check_final_voters(sim: Simulation, expected: set[tuple[int, str]]) -> None:
    sim.check_final()
    _check_voter_sets_agree(sim)
    keys = {voter.key for voter in _leader(sim).live_core.voter_set}
    if keys != expected:
        _fail(sim, f"the quorum ended with voters {sorted(keys)}, expected {sorted(expected)}")


def dynamic_leader_lost_during_add(seed: int) -> None:
    """The leader appends a VotersRecord adding an observer, then crashes or is cut off before it
    commits; sometimes the joining node's disk is wiped meanwhile.  The others elect a leader with or
    without the record (the set in force is the last in each log), the old leader comes back and keeps
    or truncates it; the operator retries until the node is a voter under its current directory id —
    first removing a stale key if the add of the wiped copy committed."""
    sim = _started_dynamic(seed, voters=3, observers=1)
    sim.run_for(sim.rng.randint(20, 100))
    joiner = sim.nodes[4]
    joined_as = joiner.directory_id
    leader, offset = _append_change(sim, lambda: sim.add_voter(4), "adding voter 4")
    _lose_leader_before_commit(sim, leader, offset)
    wiped = sim.rng.random() < 0.4 and _wipe_once_others_hold_its_log(sim, joiner)
    if wiped:
        # The add of the old copy may commit: that key can never vote again; replace it.
        _remove(sim, 4, joined_as)
    _add(sim, 4)
    sim.run_for(sim.rng.randint(20, 100))
    _check_final_voters(sim, {(node.node_id, node.directory_id) for node in sim.nodes.values()})


def dynamic_leader_lost_during_remove(seed: int) -> None:
    """The leader appends a VotersRecord removing a follower or itself, then crashes or is cut off
    before it commits; sometimes the removed follower's disk is wiped meanwhile (replacing a failed
    controller during a failover).  The operator retries the removal until it commits under whichever
    leader, then adds the node back under its current directory id: three voters again."""
    sim = _started_dynamic(seed, voters=3, observers=0)
    sim.run_for(sim.rng.randint(20, 100))
    gone = sim.nodes[sim.rng.choice(sim.voter_ids)]  # the leader itself a third of the time
    gone_as = gone.directory_id
    leader, offset = _append_change(
        sim, lambda: sim.remove_voter(gone.node_id, gone_as), f"removing voter {gone.node_id}"
    )
    _lose_leader_before_commit(sim, leader, offset)
    if gone is not leader and sim.rng.random() < 0.4:
        _wipe_once_others_hold_its_log(sim, gone)
    _remove(sim, gone.node_id, gone_as)
    _add(sim, gone.node_id)
    sim.run_for(sim.rng.randint(20, 100))
    _check_final_voters(sim, {(node.node_id, node.directory_id) for node in sim.nodes.values()})


SCENARIOS: dict[str, Callable[[int], None]] = {
    "initial_election": initial_election,
    "leader_failure": leader_failure,
    "all_killed": all_killed,
    "leader_partitioned_away": leader_partitioned_away,
    "majority_progresses_while_minority_cut": majority_progresses_while_minority_cut,
    "back_to_back_leader_failures": back_to_back_leader_failures,
    "committed_data_lost_on_one_node": committed_data_lost_on_one_node,
    "no_commit_without_majority": no_commit_without_majority,
    "old_leader_uncommitted_entries_overwritten": old_leader_uncommitted_entries_overwritten,
    "fast_backup_over_conflicting_entries": fast_backup_over_conflicting_entries,
    "figure8_churn_on_unreliable_network": figure8_churn_on_unreliable_network,
    "rejoining_node_cannot_depose_leader": rejoining_node_cannot_depose_leader,
    "isolated_leader_resigns": isolated_leader_resigns,
    "follower_catches_up_by_snapshot": follower_catches_up_by_snapshot,
    "graceful_resignation_hands_over_quickly": graceful_resignation_hands_over_quickly,
    "dead_leader_detected_before_fetch_timeout": dead_leader_detected_before_fetch_timeout,
    "dynamic_grow_one_to_three": dynamic_grow_one_to_three,
    "dynamic_removed_leader_hands_over": dynamic_removed_leader_hands_over,
    "dynamic_replace_wiped_voter": dynamic_replace_wiped_voter,
    "dynamic_membership_churn_under_faults": dynamic_membership_churn_under_faults,
    "dynamic_leader_lost_during_add": dynamic_leader_lost_during_add,
    "dynamic_leader_lost_during_remove": dynamic_leader_lost_during_remove,
}
