"""KIP-853 in the core: voters are (id, directory id), the voter set lives in the log, and voter changes
follow the safety rules (one at a time, caught-up joiners, the leader's epoch committed first, a removed
leader hands over once the change commits)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.raft.api import NotLeaderError, VoterChangeError
from kraft.raft.control_codec import voter_control_messages, voters_in_snapshot, voters_record_of
from kraft.raft.core import RaftCore
from kraft.raft.core_log import LogMeta
from kraft.raft.core_output import AppendVoters, OutboundRequest, OutboundResponse, Output
from kraft.raft.core_rules import vote_request_error
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import scan_kafka_batches, voter_history_of
from kraft.raft.memory import MemoryLogStore, MemorySnapshotStore
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind
from kraft.raft.storage_adapters import FileSnapshotStore
from kraft.raft.voters import Endpoint, Voter, VoterSet, VoterSetError, VoterSetHistory
from kraft.storage.batch import build_batch, build_control_batch, iter_batches
from kraft.storage.control import KRaftVersionRecord, decode_control_message, encode_control_message
from kraft.storage.ids import random_uuid

CLUSTER = "c1"
FETCH_TIMEOUT_MS = 200


class FixedRng:
    def random(self) -> float:
        return 0.5


def voters(*keys: tuple[int, str]) -> VoterSet:
    return VoterSet(tuple(Voter(node_id, directory) for node_id, directory in keys))


def make_core(
    node_id: int, directory_id: str, base: VoterSet | None, static: tuple[int, ...] = ()
) -> RaftCore:
    settings: dict[str, Any] = {
        "election_timeout_ms": 100,
        "fetch_timeout_ms": FETCH_TIMEOUT_MS,
        "request_timeout_ms": 50,
        "append_linger_ms": 0,
        "fetch_max_wait_ms": 30,
    }
    config = RaftConfig(
        node_id=node_id, voters=static, cluster_id=CLUSTER, directory_id=directory_id, **settings
    )
    log = LogMeta(voters=VoterSetHistory(base) if base is not None else None)
    return RaftCore(config, FixedRng(), scan_kafka_batches, ElectionState(0), log)


def state_of(core: RaftCore) -> StateKind:
    return core.state


def responses(out: Output) -> list[OutboundResponse]:
    return [m for m in [*out.send_now, *out.send_after_persist] if isinstance(m, OutboundResponse)]


def requests(out: Output, kind: type[Any]) -> list[OutboundRequest]:
    return [
        m
        for m in [*out.send_now, *out.send_after_persist]
        if isinstance(m, OutboundRequest) and isinstance(m.request, kind)
    ]


END = 2
"""A sole leader's log end once it opened its first epoch: LeaderChange at 0, then the bootstrap voter
set at 1 (the first leader writes the set it was formatted with, so joining nodes learn it by fetching)."""


def sole_leader(base: VoterSet) -> tuple[RaftCore, int]:
    """Node 1 ("d1"), the only voter of ``base``: leader with its first two records committed."""
    core = make_core(1, "d1", base)
    core.start(0)
    out = core.poll(1)
    assert state_of(core) is StateKind.LEADER
    assert [op.base_offset for op in out.log_ops if isinstance(op, AppendVoters)] == [1]
    assert core.voter_history.entries() == [(1, base)]
    core.on_flushed(END, 2)
    assert core.high_watermark == END
    return core, 2


def fetch(
    core: RaftCore, replica_id: int, directory_id: str, offset: int, now_ms: int, request_id: int = 7
) -> Output:
    request = FetchRequest(
        CLUSTER, replica_id, core.epoch, offset, core.log.last_epoch, 0, 1 << 20, directory_id
    )
    return core.handle_request(request_id, request, now_ms, peer_id=replica_id)


# ------------------------------------------------------------------ VoterSet and its history


def test_a_voter_without_a_directory_id_matches_any_and_one_with_matches_only_its_own() -> None:
    assert Voter(1).matches(1, "anything") and Voter(1).matches(1, "")
    assert Voter(1, "d1").matches(1, "d1")
    assert not Voter(1, "d1").matches(1, "d2") and not Voter(1, "d1").matches(1, "")
    assert not Voter(1, "d1").matches(2, "d1")
    with pytest.raises(VoterSetError):
        voters((1, "a"), (1, "b"))
    with pytest.raises(VoterSetError):
        VoterSet(())


def test_consecutive_voter_sets_may_differ_by_one_voter_only() -> None:
    history = VoterSetHistory(voters((1, "a")))
    history.add_at(3, voters((1, "a"), (2, "b")))
    with pytest.raises(VoterSetError):
        history.add_at(5, voters((1, "a"), (2, "b"), (3, "c"), (4, "d")))  # two at once
    with pytest.raises(VoterSetError):
        history.add_at(6, voters((1, "a"), (2, "c")))  # a replaced directory is a removal and an add
    with pytest.raises(VoterSetError):
        history.add_at(3, voters((1, "a")))  # not after the last entry


_KEYS = [(n, f"d{n}") for n in range(1, 7)]


@st.composite
def history_ops(draw: st.DrawFn) -> list[tuple[str, int]]:
    return draw(
        st.lists(
            st.tuples(st.sampled_from(["change", "truncate", "compact", "gap"]), st.integers(0, 40)),
            max_size=40,
        )
    )


@given(history_ops())
def test_voter_set_history_agrees_with_a_list_of_sets_by_offset(ops: list[tuple[str, int]]) -> None:
    """Model: the list of (offset, set) in log order over a base.  Whatever the interleaving of
    appends, truncations (a diverging log) and compactions (snapshots), the history answers
    ``voters_at`` and ``latest`` like the model, and consecutive sets keep overlapping majorities."""
    base = voters(_KEYS[0])
    history = VoterSetHistory(base)
    model: list[tuple[int, VoterSet]] = []
    model_base = base
    end = 0  # the log end
    start = 0  # the log start
    for op, value in ops:
        current = model[-1][1] if model else model_base
        if op == "change":
            members = {v.key for v in current}
            key = _KEYS[value % len(_KEYS)]
            if key in members and len(members) > 1:
                members.discard(key)
            elif key[0] not in current:
                members.add(key)
            new = VoterSet(tuple(Voter(*k) for k in members))
            history.add_at(end, new)
            model.append((end, new))
            end += 1
        elif op == "gap":
            end += value % 5 + 1
        elif op == "truncate":
            cut = max(start, end - value % 6)
            history.truncate_to(cut)
            model = [(o, s) for o, s in model if o < cut]
            end = cut
        else:
            new_start = min(end, start + value % 6)
            history.compact_before(new_start)
            below = [(o, s) for o, s in model if o < new_start]
            if below:
                model_base = below[-1][1]
            model = [(o, s) for o, s in model if o >= new_start]
            start = new_start
        assert history.latest == (model[-1][1] if model else model_base)
        for offset in range(start, end + 1):
            expected = model_base
            for o, s in model:
                if o <= offset:
                    expected = s
            assert history.voters_at(offset) == expected
        chain = [model_base] + [s for _, s in model]
        assert all(a.overlaps_majority(b) for a, b in itertools.pairwise(chain))


def test_truncating_the_log_reverts_the_voter_set() -> None:
    base = voters((1, "d1"))
    log = LogMeta(voters=VoterSetHistory(base))
    log.append(0, 4, 1)
    grown = voters((1, "d1"), (2, "d2"))
    log.append(5, 5, 1, grown)
    assert log.voter_history.latest == grown
    log.truncate_to(5)
    assert log.voter_history.latest == base


# ------------------------------------------------------------------ directory ids in the rules


def test_a_vote_for_a_stale_directory_id_is_refused_and_a_wiped_voter_is_an_observer() -> None:
    in_log = voters((1, "d1"), (2, "old"), (3, "d3"))
    core = make_core(2, "new", in_log)  # node 2's disk was wiped: it was formatted again
    core.start(0)
    assert not core.is_voter and core.kraft_version == 1
    stale = VoteRequest(CLUSTER, 1, 1, 2, 0, 0, False, "d1", "old")
    out = core.handle_request(1, stale, 10, peer_id=1)
    [answer] = responses(out)
    assert isinstance(answer.response, VoteResponse)
    assert answer.response.error_code is ErrorCode.INVALID_VOTER_KEY and not answer.response.vote_granted
    assert out.election_state is None and not core.election.has_voted


def test_a_candidate_that_is_a_voter_only_under_another_directory_id_gets_no_vote() -> None:
    config = RaftConfig(node_id=1, voters=(), cluster_id=CLUSTER, directory_id="d1")
    history = VoterSetHistory(voters((1, "d1"), (2, "old"), (3, "d3")))
    wiped_candidate = VoteRequest(CLUSTER, 4, 2, 1, 0, 0, False, "new", "d1")
    assert vote_request_error(wiped_candidate, config, 3, voters=history) == (
        ErrorCode.INVALID_VOTER_KEY,
        "candidate 2 is a voter with another directory id",
    )
    newly_added = VoteRequest(CLUSTER, 4, 9, 1, 0, 0, False, "d9", "d1")  # not yet in our log
    assert vote_request_error(newly_added, config, 3, voters=history) is None
    static = RaftConfig(node_id=1, voters=(1, 2, 3), cluster_id=CLUSTER)
    assert vote_request_error(newly_added, static, 3) == (
        ErrorCode.INCONSISTENT_VOTER_SET,
        "candidate or receiver is not a voter",
    )


def test_a_fetch_under_another_directory_id_never_counts_toward_the_high_watermark() -> None:
    core = make_core(1, "d1", voters((1, "d1"), (2, "d2"), (3, "d3")))
    core.start(0)
    out = core.poll(150)  # FixedRng: the election timeout is 150 ms
    assert state_of(core) is StateKind.PROSPECTIVE
    for _ in range(2):  # the pre-vote, then the vote: node 2 grants both
        sent = next(r for r in requests(out, VoteRequest) if r.dest == 2)
        assert isinstance(sent.request, VoteRequest)
        assert (sent.request.candidate_directory_id, sent.request.voter_directory_id) == ("d1", "d2")
        granted = VoteResponse(ErrorCode.NONE, "", -1, core.epoch, True, sent.request.pre_vote)
        out = core.handle_response(sent.correlation_id, granted, 150)
    assert core.is_leader
    start = core.epoch_start_offset
    core.on_flushed(start + 1, 401)
    fetch(core, 2, "wiped", start + 1, 402)
    assert core.high_watermark == 0  # node 2 under a new directory is an observer
    fetch(core, 2, "d2", start + 1, 403, request_id=8)
    assert core.high_watermark == start + 1
    described = core.describe_quorum(404)
    assert [(r.replica_id, r.directory_id) for r in described.current_voters] == [
        (1, "d1"),
        (2, "d2"),
        (3, "d3"),
    ]


# ------------------------------------------------------------------ voter changes on the leader


def test_a_static_quorum_refuses_voter_changes() -> None:
    core = make_core(1, "d1", None, static=(1,))
    core.start(0)
    core.poll(1)
    core.on_flushed(1, 2)
    with pytest.raises(VoterChangeError) as refused:
        core.add_voter(Voter(2, "d2"), 3)
    assert refused.value.code is ErrorCode.UNSUPPORTED_VERSION


def test_only_the_leader_changes_voters() -> None:
    core = make_core(2, "d2", voters((1, "d1"), (2, "d2"), (3, "d3")))
    core.start(0)
    with pytest.raises(NotLeaderError):
        core.remove_voter(3, "d3", 1)


def test_a_leader_changes_voters_only_once_it_committed_its_epoch() -> None:
    core = make_core(1, "d1", voters((1, "d1")))
    core.start(0)
    core.poll(1)
    assert core.is_leader and core.high_watermark == 0  # LeaderChange not yet flushed
    fetch(core, 2, "d2", 0, 1)
    with pytest.raises(VoterChangeError, match="not committed its epoch") as refused:
        core.add_voter(Voter(2, "d2"), 2)
    assert refused.value.code is ErrorCode.REQUEST_TIMED_OUT


def test_adding_a_voter_waits_for_it_to_catch_up_then_puts_the_new_set_in_force_at_once() -> None:
    core, now = sole_leader(voters((1, "d1")))
    with pytest.raises(VoterChangeError, match="has not caught up"):
        core.add_voter(Voter(2, "d2"), now)
    fetch(core, 2, "other", END, now)  # caught up, but under another directory id
    with pytest.raises(VoterChangeError, match="has not caught up"):
        core.add_voter(Voter(2, "d2"), now)
    fetch(core, 2, "d2", END, now, request_id=8)
    offset = core.add_voter(Voter(2, "d2", (Endpoint("CONTROLLER", "h2", 9092),)), now)
    out = core.take_output(now)
    [op] = [op for op in out.log_ops if isinstance(op, AppendVoters)]
    assert op.base_offset == offset == END and op.voters.ids == (1, 2)
    assert core.voter_set.ids == (1, 2)  # in force before it commits (KIP-853)
    with pytest.raises(VoterChangeError, match="another voter change"):
        core.remove_voter(2, "d2", now)
    with pytest.raises(VoterChangeError) as duplicate:
        core.on_flushed(END + 1, now)
        fetch(core, 2, "d2", END + 1, now + 1, request_id=9)
        core.add_voter(Voter(2, "d3"), now + 1)
    assert duplicate.value.code is ErrorCode.DUPLICATE_VOTER
    assert core.high_watermark == END + 1  # the leader alone no longer commits: node 2 counted


def test_the_new_set_needs_the_new_voter_for_a_majority() -> None:
    core, now = sole_leader(voters((1, "d1")))
    fetch(core, 2, "d2", END, now)
    core.add_voter(Voter(2, "d2"), now)
    core.take_output(now)
    core.on_flushed(END + 1, now)
    assert core.high_watermark == END  # {1, 2} needs both: the VotersRecord at END is not committed yet
    fetch(core, 2, "d2", END + 1, now + 1, request_id=8)
    assert core.high_watermark == END + 1


def test_a_removed_leader_leads_until_the_removal_commits_then_resigns() -> None:
    core, now = sole_leader(voters((1, "d1")))
    fetch(core, 2, "d2", END, now)
    core.add_voter(Voter(2, "d2"), now)
    core.take_output(now)
    core.on_flushed(END + 1, now)
    fetch(core, 2, "d2", END + 1, now + 1, request_id=8)
    with pytest.raises(VoterChangeError) as unknown:
        core.remove_voter(1, "wrong", now + 1)
    assert unknown.value.code is ErrorCode.VOTER_NOT_FOUND
    offset = core.remove_voter(1, "d1", now + 1)
    core.take_output(now + 1)
    assert core.is_leader and not core.is_voter and core.voter_set.ids == (2,)
    core.on_flushed(offset + 1, now + 1)
    assert core.is_leader  # its own flush no longer counts
    out = fetch(core, 2, "d2", offset + 1, now + 2, request_id=9)
    assert core.high_watermark == offset + 1
    assert state_of(core) is StateKind.RESIGNED
    assert [r.dest for r in requests(out, EndQuorumEpochRequest)] == [2]


def test_the_last_voter_cannot_be_removed() -> None:
    core, now = sole_leader(voters((1, "d1")))
    with pytest.raises(VoterChangeError, match="last voter"):
        core.remove_voter(1, "d1", now)


def test_a_follower_learns_the_voter_set_from_a_fetched_voters_record_and_reverts_on_truncation() -> None:
    d1, d2, d3 = (random_uuid() for _ in range(3))  # on the wire: real directory ids
    base = voters((1, d1), (2, d2))
    core = make_core(2, d2, base)
    core.start(0)
    grown = voters((1, d1), (2, d2), (3, d3))
    data = build_batch(0, [(None, b"x")], leader_epoch=1, timestamp_ms=0) + build_control_batch(
        1, [voters_record_of(grown)], leader_epoch=1, timestamp_ms=0
    )
    begin = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 1, 2, d2), 1, peer_id=1)
    [sent] = requests(begin, FetchRequest)
    assert isinstance(sent.request, FetchRequest) and sent.request.replica_directory_id == d2
    core.handle_response(sent.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 1, 0, 0, data), 2)
    assert core.voter_set == grown and core.log.end_offset == 2
    core.log.truncate_to(1)  # what a diverging leader's truncation does to the history
    assert core.voter_set == base


# ------------------------------------------------------------------ the byte format and restarts


def test_voters_and_kraft_version_records_round_trip() -> None:
    grown = VoterSet(
        (
            Voter(1, "AAAAAAAAAAAAAAAAAAAAAw", (Endpoint("CONTROLLER", "h1", 9093),)),
            Voter(2, "", ()),
        )
    )
    for message in [*voter_control_messages(grown)]:
        key, value = encode_control_message(message)
        assert decode_control_message(key, value) == message
    assert voter_control_messages(grown)[0] == KRaftVersionRecord(1)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_snapshot_holds_the_voter_set_and_a_restart_rebuilds_the_history(kind: str, tmp_path: Path) -> None:
    snapshots: MemorySnapshotStore | FileSnapshotStore = (
        MemorySnapshotStore() if kind == "memory" else FileSnapshotStore(tmp_path)
    )
    at_snapshot = voters((1, "AAAAAAAAAAAAAAAAAAAAAw"), (2, "AAAAAAAAAAAAAAAAAAAABA"))
    snapshot_id = SnapshotId(3, 1)
    snapshots.write(snapshot_id, 5, [b"a", b"b"], 0, at_snapshot)
    assert snapshots.read_voters(snapshot_id) == at_snapshot
    assert snapshots.read_records(snapshot_id) == (5, [b"a", b"b"])
    static = SnapshotId(4, 1)
    snapshots.write(static, 5, [b"a"], 0)
    assert snapshots.read_voters(static) is None
    log = MemoryLogStore()
    log.reset_to(3)
    grown = voters(
        (1, "AAAAAAAAAAAAAAAAAAAAAw"), (2, "AAAAAAAAAAAAAAAAAAAABA"), (3, "AAAAAAAAAAAAAAAAAAAABQ")
    )
    log.append(build_batch(3, [(None, b"c")], leader_epoch=1, timestamp_ms=0))
    log.append(build_control_batch(4, [voters_record_of(grown)], leader_epoch=1, timestamp_ms=0))
    history = voter_history_of(log, snapshots, snapshot_id)
    assert history is not None
    assert history.base == at_snapshot and history.entries() == [(4, grown)]
    assert voter_history_of(MemoryLogStore(), snapshots, None) is None  # static: nothing in the log
    data = build_control_batch(0, voter_control_messages(grown), leader_epoch=1, timestamp_ms=0)
    assert voters_in_snapshot(data) == grown and len(list(iter_batches(data))) == 1


def test_a_bootstrap_checkpoint_at_offset_zero_is_the_base_of_the_history(tmp_path: Path) -> None:
    """Kafka's layout for ``kafka-storage format --standalone/--initial-controllers``: a
    ``00000000000000000000-0000000000.checkpoint`` holding only KRaftVersion and Voters."""
    snapshots = FileSnapshotStore(tmp_path)
    formatted = voters((1, random_uuid()))
    snapshots.write(SnapshotId(0, 0), -1, [], 0, formatted)
    assert (tmp_path / "00000000000000000000-0000000000.checkpoint").exists()
    history = voter_history_of(MemoryLogStore(), snapshots, snapshots.latest())
    assert history is not None and history.latest == formatted and not history.static
    with pytest.raises(ValueError, match="at least one voter"):
        make_core(1, formatted.voters[0].directory_id, None)  # neither a voter set nor static voters


def test_a_joiner_with_an_unknown_voter_set_takes_the_first_set_it_fetches_whatever_its_size() -> None:
    """--no-initial-controllers: the base is empty; the first VotersRecord may name any number of voters
    (it is the quorum's current set, not a change), later ones still change one voter at a time."""
    history = VoterSetHistory(VoterSet.unknown())
    assert history.latest.ids == () and not history.latest.is_voter(1, "")
    three = VoterSet.static((1, 2, 3))
    history.add_at(5, three)
    assert history.latest == three
    with pytest.raises(VoterSetError, match="more than one"):
        history.add_at(9, VoterSet.static((1,)))
    with pytest.raises(VoterSetError, match="empty"):
        history.add_at(9, VoterSet.unknown())
    history.truncate_to(5)
    assert history.latest.ids == ()


def test_next_append_offset_counts_pending_records_and_the_leaders_own_voters_record() -> None:
    """The controller predicts its records' offsets from ``next_append_offset``: it must move past the
    records waiting for the next batch and past a VotersRecord the leader appends itself."""
    core, now = sole_leader(voters((1, "d1")))
    assert core.next_append_offset == END
    assert core.append([b"a", b"b"], now) == END + 1
    assert core.next_append_offset == END + 2  # accumulated, not cut yet
    fetch(core, 2, "d2", END, now)
    offset = core.add_voter(Voter(2, "d2"), now)
    assert offset == END + 2  # pending records are cut first, the VotersRecord follows them
    assert core.next_append_offset == END + 3
    assert core.append([b"c"], now) == core.next_append_offset - 1 == END + 3


def two_voter_leader() -> tuple[RaftCore, int]:
    """Node 1 leads {1: d1, 2: d2} (grown from standalone), every record committed, 2 fetching."""
    core, now = sole_leader(voters((1, "d1")))
    fetch(core, 2, "d2", END, now)
    core.add_voter(Voter(2, "d2"), now)
    core.take_output(now)
    core.on_flushed(END + 1, now)
    fetch(core, 2, "d2", END + 1, now + 1, request_id=8)
    assert core.high_watermark == END + 1 and core.voter_set.ids == (1, 2)
    return core, now + 1


@pytest.mark.parametrize("answer", ["fenced", "unreachable"])
def test_a_live_leader_announces_itself_to_a_refused_higher_epoch_candidate_outside_its_voter_set(
    answer: str,
) -> None:
    # Node 3 was removed by a VotersRecord its log never got; a pre-vote granted just before a partition
    # healed took it to candidate at epoch 2.  The live leader refuses its vote (KIP-996 stickiness) and
    # would never announce to a non-voter: without this announcement node 3 stays at epoch 2 for good.
    core, now = two_voter_leader()
    epoch = core.epoch
    vote = VoteRequest(CLUSTER, epoch + 1, 3, 1, epoch, END, False, "d3", "d1")
    out = core.handle_request(20, vote, now, peer_id=3)
    [refusal] = responses(out)
    assert isinstance(refusal.response, VoteResponse) and not refusal.response.vote_granted
    assert core.is_leader and core.epoch == epoch and out.election_state is None
    [announce] = requests(core.poll(now + 1), BeginQuorumEpochRequest)
    assert isinstance(announce.request, BeginQuorumEpochRequest)
    assert announce.dest == 3 and announce.request.leader_epoch == epoch
    if answer == "fenced":
        fenced = BeginQuorumEpochResponse(ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch", -1, epoch + 1)
        core.handle_response(announce.correlation_id, fenced, now + 2)
        assert state_of(core) is StateKind.UNATTACHED and core.epoch == epoch + 1
    else:
        core.handle_send_failure(announce.correlation_id, now + 2, unreachable=True)
        later = core.poll(now + 2 + FETCH_TIMEOUT_MS)
        to_3 = [r for r in requests(later, BeginQuorumEpochRequest) if r.dest == 3]
        assert to_3 == [], "a non-voter is told once, not chased"
        assert core.is_leader
