"""A bootstrap list where nothing answers at all (a mistyped address, nothing running): the quorum and
broker clients give up after ``unreachable_timeout_s`` naming the list, as the admin client does, instead
of retrying to the caller's deadline; without it (callers waiting for a cluster to start) they wait; and a
partition whose leader cannot be learned says why.  Every address refuses connections (a free port), so
nothing waits on a timeout but the ones under test, each bounded by the call's own deadline."""

from __future__ import annotations

import pytest

from kraft.client.broker import BrokerClient
from kraft.client.quorum import describe_quorum, remove_controller
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port


def _refusing() -> list[str]:
    return [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]


def test_describe_quorum_gives_up_early_when_no_controller_answers_at_all() -> None:
    targets = _refusing()
    with pytest.raises(KraftError) as info:
        describe_quorum(targets, timeout_s=20.0, unreachable_timeout_s=0.3)
    assert info.value.code is ErrorCode.LEADER_NOT_AVAILABLE
    assert f"no controller reachable at {','.join(targets)} for 0.3s" in info.value.message
    assert "is --bootstrap-controller right" in info.value.message


def test_describe_quorum_without_an_unreachable_limit_waits_to_its_deadline() -> None:
    with pytest.raises(KraftError, match=r"no quorum leader found within 0\.5 s"):
        describe_quorum(_refusing(), timeout_s=0.5)


def test_a_voter_change_gives_up_early_too() -> None:
    with pytest.raises(KraftError, match="no controller reachable at"):
        remove_controller(_refusing(), 1, "AAAAAAAAAAAAAAAAAAAAAA", timeout_s=20.0, unreachable_timeout_s=0.3)


async def test_produce_gives_up_early_when_no_broker_answers_at_all() -> None:
    targets = _refusing()
    async with BrokerClient(targets, cluster_id="kc", unreachable_timeout_s=0.3) as client:
        with pytest.raises(KraftError) as info:
            await client.produce("t", 0, [(None, b"x")], deadline_s=20.0)
    assert info.value.code is ErrorCode.BROKER_NOT_AVAILABLE
    assert f"no broker reachable at {','.join(targets)} for 0.3s" in info.value.message
    assert "is --bootstrap-server right" in info.value.message


async def test_without_a_limit_the_deadline_error_says_why_no_leader_is_known() -> None:
    async with BrokerClient(_refusing(), cluster_id="kc") as client:
        with pytest.raises(KraftError) as info:
            await client.list_offset("t", 0, -1, deadline_s=0.5)
    assert info.value.code is ErrorCode.REQUEST_TIMED_OUT
    assert "no leader known for t-0: no broker could answer Metadata" in info.value.message
