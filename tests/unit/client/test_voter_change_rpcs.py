"""AddRaftVoter / RemoveRaftVoter over gRPC: the servicer asks the leader again while the answer is "not
yet", maps refusals to error codes, and the admin client and ``kraft quorum add-controller |
remove-controller`` find the leader and report one line."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc.aio
import pytest

import kraft.cli.main as cli_main
from kraft.client.quorum import ControllerEndpoint, add_controller, remove_controller
from kraft.cluster.formatting import format_node_storage
from kraft.config import load_config
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port
from kraft.raft import messages as m
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, VoterChangeError
from kraft.raft.grpc_server import RaftServicer, add_raft_service
from kraft.raft.voters import Endpoint, Voter, VoterSet
from kraft.security.principal import (
    PRINCIPAL_TYPE_USER,
    Principal,
    TlsPrincipalExtractor,
    install_principal_extractor,
)
from kraft.storage.meta_properties import read_meta_properties
from kraft.v1 import raft_pb2, raft_pb2_grpc

CLUSTER = "AAAAAAAAAAAAAAAAAAAAAg"
DIR_1 = "3JYSPKIBRe-ipK1M2Xq7Lg"
DIR_2 = "x4Q2ZLnyQKq7mYwV-8Kc3g"


@dataclass
class FakeLeader:
    """Node 1 leading epoch 3: a DescribeQuorum handler and a VoterChangeHandler with scripted refusals."""

    not_yet: int = 0
    """How many calls answer REQUEST_TIMED_OUT ("not caught up") before one succeeds."""
    refuse: VoterChangeError | NotLeaderError | None = None
    lose_after_append: bool = False
    """The first change is put in force, then answered NOT_LEADER (appended, then leadership lost); a
    retry is refused as the real leader refuses it (DUPLICATE_VOTER, VOTER_NOT_FOUND)."""
    calls: list[tuple[str, object]] = field(default_factory=list)
    voters: VoterSet = field(default_factory=lambda: VoterSet((Voter(1, DIR_1),)))

    @property
    def voter_set(self) -> VoterSet:
        return self.voters

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        return LeaderAndEpoch(1, 3)

    async def handle_request(self, request: m.RaftRequest, *, peer_id: int | None = None) -> m.RaftResponse:
        assert isinstance(request, m.DescribeQuorumRequest)
        states = tuple(m.ReplicaState(v.node_id, 10, 0, 0, v.directory_id) for v in self.voters)
        return m.DescribeQuorumResponse(ErrorCode.NONE, "", 1, 3, 10, states)

    def _answer(self, action: str, subject: object) -> int:
        self.calls.append((action, subject))
        if self.refuse is not None:
            raise self.refuse
        if self.not_yet > 0:
            self.not_yet -= 1
            raise VoterChangeError(ErrorCode.REQUEST_TIMED_OUT, "not caught up")
        return 11

    async def add_voter(self, voter: Voter) -> int:
        if self.lose_after_append:
            if voter.node_id in self.voters:
                self.calls.append(("add", voter))
                raise VoterChangeError(ErrorCode.DUPLICATE_VOTER, f"node {voter.node_id} is already a voter")
            self.voters = self.voters.with_voter(voter)
            self.calls.append(("add", voter))
            raise NotLeaderError(LeaderAndEpoch(-1, 3))
        return self._answer("add", voter)

    async def remove_voter(self, node_id: int, directory_id: str) -> int:
        if self.lose_after_append:
            self.calls.append(("remove", (node_id, directory_id)))
            if not self.voters.is_voter(node_id, directory_id):
                raise VoterChangeError(
                    ErrorCode.VOTER_NOT_FOUND, f"({node_id}, {directory_id}) is not a voter"
                )
            self.voters = self.voters.without_voter(node_id, directory_id)
            raise NotLeaderError(LeaderAndEpoch(-1, 3))
        return self._answer("remove", (node_id, directory_id))

    async def update_voter(self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...]) -> int:
        return self._answer("update", (node_id, directory_id, endpoints))


@dataclass
class Running:
    leader: FakeLeader
    target: str


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    port = free_port()
    leader = FakeLeader()
    server = grpc.aio.server()
    servicer = RaftServicer(
        leader, cluster_id=CLUSTER, endpoints={1: ("127.0.0.1", port)}, voter_changes=leader
    )
    add_raft_service(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield Running(leader, f"127.0.0.1:{port}")
    finally:
        await server.stop(grace=None)


async def test_add_is_asked_again_while_the_new_voter_catches_up(running: Running) -> None:
    running.leader.not_yet = 2
    endpoint = ControllerEndpoint("CONTROLLER", "h2", 9094)
    offset = await asyncio.to_thread(add_controller, [running.target], 2, DIR_2, [endpoint], 5.0)
    assert offset == 11
    expected = Voter(2, DIR_2, (Endpoint("CONTROLLER", "h2", 9094),))
    assert running.leader.calls == [("add", expected)] * 3


async def test_a_change_put_in_force_by_an_attempt_whose_answer_was_lost_is_success(
    running: Running,
) -> None:
    """The leader appended the VotersRecord, then lost leadership and answered NOT_LEADER; the retry is
    refused because the change is in force.  The operator asked for exactly that state: success, once
    DescribeQuorum shows it (CI: add-controller failed with DUPLICATE_VOTER after such a resignation)."""
    running.leader.lose_after_append = True
    endpoint = ControllerEndpoint("CONTROLLER", "h2", 9094)
    assert await asyncio.to_thread(add_controller, [running.target], 2, DIR_2, [endpoint], 5.0) is None
    assert [action for action, _ in running.leader.calls] == ["add", "add"]
    assert await asyncio.to_thread(remove_controller, [running.target], 2, DIR_2, 5.0) is None
    assert running.leader.voters.ids == (1,)


async def test_a_refusal_without_an_earlier_lost_answer_is_an_error_even_if_in_force(
    running: Running,
) -> None:
    running.leader.lose_after_append = True
    running.leader.voters = running.leader.voters.with_voter(Voter(2, DIR_2))
    endpoint = ControllerEndpoint("CONTROLLER", "h2", 9094)
    with pytest.raises(KraftError) as refused:
        await asyncio.to_thread(add_controller, [running.target], 2, DIR_2, [endpoint], 5.0)
    assert refused.value.code is ErrorCode.DUPLICATE_VOTER


async def test_a_refusal_comes_back_as_its_error_code(running: Running) -> None:
    running.leader.refuse = VoterChangeError(ErrorCode.VOTER_NOT_FOUND, "(3, x) is not a voter")
    with pytest.raises(KraftError) as refused:
        await asyncio.to_thread(remove_controller, [running.target], 3, DIR_2, 2.0)
    assert refused.value.code is ErrorCode.VOTER_NOT_FOUND and "not a voter" in refused.value.message


async def test_a_not_leader_answer_names_the_controllers_and_a_bad_cluster_id_is_refused(
    running: Running,
) -> None:
    running.leader.refuse = NotLeaderError(LeaderAndEpoch(-1, 3))
    async with grpc.aio.insecure_channel(running.target) as channel:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        answer = await stub.RemoveRaftVoter(
            raft_pb2.RemoveRaftVoterRequest(
                cluster_id=CLUSTER, voter_id=1, voter_directory_id=DIR_1, timeout_ms=500
            ),
            timeout=5,
        )
        assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert [n.node_id for n in answer.nodes] == [1]
        wrong = await stub.AddRaftVoter(
            raft_pb2.AddRaftVoterRequest(cluster_id="other", voter_id=2), timeout=5
        )
        assert wrong.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
        empty = await stub.AddRaftVoter(raft_pb2.AddRaftVoterRequest(voter_id=2), timeout=5)
        assert empty.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID, "an empty cluster id is no wildcard"


async def test_a_change_that_never_stops_being_not_yet_times_out(running: Running) -> None:
    running.leader.not_yet = 1_000
    async with grpc.aio.insecure_channel(running.target) as channel:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        request = raft_pb2.AddRaftVoterRequest(
            cluster_id=CLUSTER, voter_id=2, voter_directory_id=DIR_2, timeout_ms=300
        )
        answer = await stub.AddRaftVoter(request, timeout=5)
    assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT and answer.offset == -1


def _controller_config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "controller-2.properties"
    path.write_text(
        "process.roles=controller\n"
        "node.id=2\n"
        f"controller.quorum.voters=1@127.0.0.1:{port},2@127.0.0.1:9094\n"
        "listeners=CONTROLLER://127.0.0.1:9094\n"
        f"metadata.log.dir={tmp_path / 'meta'}\n",
        encoding="utf-8",
    )
    format_node_storage(load_config(path), CLUSTER, ignore_formatted=False)
    return path


async def test_the_cli_adds_the_controller_its_config_describes(
    running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _controller_config(tmp_path, int(running.target.rsplit(":", 1)[1]))
    directory_id = read_meta_properties(tmp_path / "meta").directory_id
    argv = [
        "quorum",
        "add-controller",
        "--bootstrap-controller",
        running.target,
        "--command-config",
        str(config),
    ]
    assert await asyncio.to_thread(cli_main.run, argv) == 0
    assert running.leader.calls == [
        ("add", Voter(2, directory_id, (Endpoint("CONTROLLER", "127.0.0.1", 9094),)))
    ]
    assert f"Added controller 2 with directory id {directory_id}" in capsys.readouterr().out


async def test_the_cli_reports_a_refused_removal_on_one_line(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    running.leader.refuse = VoterChangeError(ErrorCode.INVALID_REQUEST, "cannot remove the last voter")
    argv = [
        "quorum",
        "remove-controller",
        "--bootstrap-controller",
        running.target,
        "--controller-id",
        "1",
        "--controller-directory-id",
        DIR_1,
    ]
    assert await asyncio.to_thread(cli_main.run, argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "cannot remove the last voter" in err[0]
    bad = ["quorum", "remove-controller", "--bootstrap-controller", running.target, "--controller-id", "1"]
    assert await asyncio.to_thread(cli_main.run, [*bad, "--controller-directory-id", "nope"]) == 1
    assert "--controller-directory-id" in capsys.readouterr().err


class TlsContext:
    """A servicer context of a call over mTLS (the principal comes from the installed extractor)."""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"transport_security_type": [b"ssl"]}

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted {code}: {details}")


async def test_on_tls_a_voter_updates_only_its_own_endpoint() -> None:
    leader = FakeLeader()
    servicer = RaftServicer(leader, cluster_id=CLUSTER, endpoints={}, voter_changes=leader)
    request = raft_pb2.UpdateRaftVoterRequest(
        cluster_id=CLUSTER,
        voter_id=2,
        voter_directory_id=DIR_2,
        listeners=[raft_pb2.RaftVoterEndpoint(name="CONTROLLER", host="h2", port=9094)],
        timeout_ms=500,
    )
    try:
        install_principal_extractor(lambda context: Principal(PRINCIPAL_TYPE_USER, "CN=controller-3,O=kraft"))
        forged = await servicer.UpdateRaftVoter(request, TlsContext())  # type: ignore[arg-type]
        assert forged.error_code == ErrorCode.INVALID_REQUEST and "only its own" in forged.error_message
        assert leader.calls == []
        install_principal_extractor(lambda context: Principal(PRINCIPAL_TYPE_USER, "CN=controller-2,O=kraft"))
        own = await servicer.UpdateRaftVoter(request, TlsContext())  # type: ignore[arg-type]
        assert own.error_code == ErrorCode.NONE
        assert leader.calls == [("update", (2, DIR_2, (Endpoint("CONTROLLER", "h2", 9094),)))]
    finally:
        install_principal_extractor(TlsPrincipalExtractor())
