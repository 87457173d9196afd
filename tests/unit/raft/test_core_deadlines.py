"""The core never hands out a deadline that stays due.

The driver polls the core again as soon as the deadline the last output named has passed.  A deadline
that a poll does not move (a timer armed in a state whose poll ignores it) would be polled forever at the
same instant; before the driver learnt to yield between such polls that froze the whole process (no log
line, no SIGTERM handling).  Found: a non-voter (KIP-853 lets it vote) that granted a vote armed its
election timer, which an unattached observer's poll never looked at.  The property drives cores of a
static and of a dynamic quorum, voters and observers, through random requests, responses, failures and
polls, and checks after every step that polling at the same instant settles within a few polls.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_dynamic_voters import CLUSTER, make_core, voters

from kraft.errors import ErrorCode
from kraft.raft.core import RaftCore
from kraft.raft.core_output import OutboundRequest, Output
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)

SETTLE_POLLS = 8
"""Polls at one instant within which the deadline must move past it (each one does real work)."""

DYNAMIC = voters((1, "d1"), (2, "d2"), (3, "d3"))


def _core(shape: str) -> RaftCore:
    if shape == "static-voter":
        return make_core(1, "d1", None, static=(1, 2, 3))
    if shape == "dynamic-voter":
        return make_core(1, "d1", DYNAMIC)
    return make_core(4, "d4", DYNAMIC)  # an observer of a dynamic quorum


def _settles(core: RaftCore, out: Output, now_ms: int, outstanding: list[OutboundRequest]) -> None:
    polls = 0
    while out.next_deadline_ms <= now_ms:
        polls += 1
        assert polls <= SETTLE_POLLS, (
            f"deadline {out.next_deadline_ms} stays due at {now_ms} in {core.state.name} "
            f"(epoch {core.epoch}, election {core.election})"
        )
        out = core.poll(now_ms)
        _remember(out, outstanding)


def _remember(out: Output, outstanding: list[OutboundRequest]) -> None:
    outstanding.extend(m for m in [*out.send_now, *out.send_after_persist] if isinstance(m, OutboundRequest))


def _response_to(request: Any, rng: random.Random, epoch: int) -> Any:
    leader = rng.choice([-1, 1, 2, 3])
    code = rng.choice([ErrorCode.NONE, ErrorCode.NONE, ErrorCode.FENCED_LEADER_EPOCH])
    if isinstance(request, VoteRequest):
        return VoteResponse(code, "", -1, request.candidate_epoch, rng.random() < 0.6, request.pre_vote)
    if isinstance(request, BeginQuorumEpochRequest):
        return BeginQuorumEpochResponse(code, "", request.leader_id, request.leader_epoch)
    if isinstance(request, FetchRequest):
        return FetchResponse(code, "", leader, epoch + rng.choice([0, 0, 1]), high_watermark=-1)
    return None


# The regression found: an observer grants a standard vote (seed 305: candidate 2), then its election
# timeout passes.
@example(shape="dynamic-observer", steps=[(1, 0, 305), (0, 150, 0)])
@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    shape=st.sampled_from(["static-voter", "dynamic-voter", "dynamic-observer"]),
    steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 400), st.integers(0, 2**16)), max_size=60),
)
def test_polling_at_one_instant_always_moves_the_deadline_past_it(
    shape: str, steps: list[tuple[int, int, int]]
) -> None:
    core = _core(shape)
    outstanding: list[OutboundRequest] = []
    now = 0
    out = core.start(now)
    _remember(out, outstanding)
    _settles(core, out, now, outstanding)
    request_id = 1
    for action, advance_ms, seed in steps:
        rng = random.Random(seed)
        now += advance_ms
        epoch = core.epoch
        peer = rng.choice([1, 2, 3, 4])
        if action == 0:
            out = core.poll(now)
        elif action == 1:  # a (pre-)vote from another replica, at our epoch or a little above
            pre_vote = rng.random() < 0.5
            candidate_epoch = epoch + rng.choice([0, 1, 2])
            request = VoteRequest(
                CLUSTER, candidate_epoch, peer, core.node_id, 0, 0, pre_vote, f"d{peer}", ""
            )
            out = core.handle_request(request_id, request, now, peer_id=peer)
        elif action == 2:  # a leader announces itself
            leader = rng.choice([1, 2, 3])
            request_b = BeginQuorumEpochRequest(CLUSTER, leader, epoch + rng.choice([0, 1]), core.node_id)
            out = core.handle_request(request_id, request_b, now, peer_id=leader)
        elif action == 3:  # a leader resigns
            leader = rng.choice([1, 2, 3])
            request_e = EndQuorumEpochRequest(CLUSTER, leader, epoch, core.node_id, (core.node_id,))
            out = core.handle_request(request_id, request_e, now, peer_id=leader)
        elif action == 4 and outstanding:  # an answer to one of our requests
            sent = outstanding.pop(rng.randrange(len(outstanding)))
            response = _response_to(sent.request, rng, epoch)
            if response is None:
                continue
            out = core.handle_response(sent.correlation_id, response, now)
        elif outstanding:  # one of our requests failed
            sent = outstanding.pop(rng.randrange(len(outstanding)))
            out = core.handle_send_failure(sent.correlation_id, now, unreachable=rng.random() < 0.5)
        else:
            out = core.poll(now)
        request_id += 1
        _remember(out, outstanding)
        _settles(core, out, now, outstanding)
