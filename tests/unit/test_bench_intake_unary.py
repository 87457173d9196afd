"""bench.intake_unary's stand-ins for Raft: the ``kraft_bridge`` variant measures kraft's real
:class:`~kraft.node.intake.AppendBridge`, so its stub driver must keep the driver's contract (one commit
callback per hand-off, the last offset of the hand-off's records) or the variant measures something else.
No timing is asserted: the bench's numbers are read by people, not checked here."""

from __future__ import annotations

import asyncio

from bench.intake_unary import _AnswerAt, _StubDriver
from kraft.node.intake import AppendBridge

TIMEOUT_S = 5.0


def test_the_stub_driver_commits_each_hand_off_with_every_caller_at_its_own_offset() -> None:
    async def scenario() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        bridge = AppendBridge(loop, _StubDriver(commit_s=0.0))
        # three calls in one loop turn share one hand-off, as calls of one intake-loop turn do
        answers = await asyncio.wait_for(
            asyncio.gather(bridge.append([b"a"]), bridge.append([b"b", b"c"]), bridge.append([b"d"])),
            TIMEOUT_S,
        )
        later = await asyncio.wait_for(bridge.append([b"e"]), TIMEOUT_S)
        return [offset for offset, _ in answers] + [later[0]], bridge.handoffs

    offsets, handoffs = asyncio.run(scenario())
    assert offsets == [1, 3, 4, 5]  # each caller's last record, in arrival order, none reused
    assert handoffs == 2


def test_the_answer_stand_in_numbers_records_like_a_log() -> None:
    async def scenario() -> list[int]:
        appends = _AnswerAt(wait_s=0.0)
        first = await appends.append([b"a", b"b"])
        second = await appends.append([b"c"])
        leader = await appends.leader_and_epoch()
        assert leader.has_leader
        return [first[0], second[0]]

    assert asyncio.run(scenario()) == [2, 3]
