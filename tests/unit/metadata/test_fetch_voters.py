"""MetadataFetch carries a dynamic quorum's voter set to brokers (KIP-853): the active controller answers
with its voter set in force when the broker's ``known_voters`` is older — by leader epoch first, then the
offset of the VotersRecord — and never to a broker that did not ask (an older one) or on a static quorum."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.raft.voters import Endpoint, Voter, VoterSet
from kraft.v1 import controller_pb2 as cpb

from .fake_raft import FakeRaft

CLUSTER = "c1"


def voter(node_id: int, port: int) -> Voter:
    return Voter(
        node_id, f"dir{node_id}".ljust(22, "A"), (Endpoint("CONTROLLER", f"10.0.0.{node_id}", port),)
    )


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def fetch(known: tuple[int, int] | None) -> cpb.MetadataFetchRequest:
    request = cpb.MetadataFetchRequest(cluster_id=CLUSTER, fetch_offset=0, max_wait_ms=0)
    if known is not None:
        request.known_voters.CopyFrom(cpb.VoterSetVersion(leader_epoch=known[0], offset=known[1]))
    return request


def sent(response: cpb.MetadataFetchResponse) -> tuple[tuple[int, int], dict[int, str]] | None:
    if not response.HasField("voters"):
        return None
    version = response.voters.version
    return (version.leader_epoch, version.offset), {
        v.node_id: ",".join(f"{e.name}://{e.host}:{e.port}" for e in v.endpoints)
        for v in response.voters.voters
    }


async def test_the_active_controller_sends_a_newer_voter_set_and_only_then() -> None:
    in_force: list[tuple[int, VoterSet] | None] = [(-1, VoterSet((voter(1, 9001), voter(2, 9002))))]
    raft = FakeRaft(1)
    controller = QuorumController(
        raft,
        CLUSTER,
        {},
        ControllerOptions(noop_interval_ms=0),
        clock=ManualClock(),
        voters_in_force=lambda: in_force[0],
    )
    await controller.start()
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = controller.state.leader.epoch

        first = await controller.metadata_fetch(fetch((-1, -1)))
        assert first.error_code == ErrorCode.NONE
        assert sent(first) == (
            (epoch, -1),
            {1: "CONTROLLER://10.0.0.1:9001", 2: "CONTROLLER://10.0.0.2:9002"},
        )
        # The broker holds it now: not sent again; an older broker (no known_voters) never gets one.
        assert sent(await controller.metadata_fetch(fetch((epoch, -1)))) is None
        assert sent(await controller.metadata_fetch(fetch(None))) is None
        # A set the broker got from a later leadership is not replaced by this (older) one.
        assert sent(await controller.metadata_fetch(fetch((epoch + 1, -1)))) is None

        # A voter change (VotersRecord at offset 40): newer within the same leadership.
        in_force[0] = (40, VoterSet((voter(2, 9002), voter(3, 9003))))
        changed = sent(await controller.metadata_fetch(fetch((epoch, -1))))
        assert changed is not None and changed[0] == (epoch, 40) and sorted(changed[1]) == [2, 3]
        # A snapshot folded that record into the base (offset -1), same set: not newer than (epoch, 40).
        in_force[0] = (-1, in_force[0][1])  # type: ignore[index]
        assert sent(await controller.metadata_fetch(fetch((epoch, 40)))) is None

        # A later leadership's set wins over what the broker got from an earlier one, whatever the offsets
        # (a deposed leader's uncommitted voter change may have been truncated away).
        raft.lose_leadership(2)
        await until(lambda: not controller.is_active)
        raft.elect()
        await until(lambda: controller.is_active)
        later = controller.state.leader.epoch
        assert later > epoch
        again = sent(await controller.metadata_fetch(fetch((epoch, 40))))
        assert again is not None and again[0] == (later, -1) and sorted(again[1]) == [2, 3]

        # A static quorum sends none.
        in_force[0] = None
        assert sent(await controller.metadata_fetch(fetch((-1, -1)))) is None
    finally:
        await controller.stop()
