"""``--json`` on the rest of the printing commands (storage random-uuid|format, quorum add-|remove-controller,
acl add|remove, chaos run), ``--verbose`` retries of voter changes, ``cluster status --timeout`` and
``health --cluster-dir``.

Commands run in-process (``kraft.cli.main.run``) against small blocking gRPC servers in threads, or a
cluster directory whose nodes were never started."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import kraft.cli.main as cli_main
from kraft.cluster.manager import LocalCluster
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.storage.ids import parse_uuid
from kraft.storage.meta_properties import read_meta_properties
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc, raft_pb2, raft_pb2_grpc
from kraft.v1.common_pb2 import Endpoint, NodeRef

CLUSTER_ID = "json-cluster"
DIRECTORY_ID = "8xCd4lEkRcOvtdUSbkVc2g"


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    capsys.readouterr()
    code = cli_main.run(list(args))
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def ok_json(outcome: Outcome) -> Any:
    assert outcome.code == 0, outcome
    return json.loads(outcome.out)


@pytest.fixture(autouse=True)
def _no_cluster_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRAFT_CLUSTER_DIR", raising=False)


def _serve(register: Callable[[grpc.Server, int], None]) -> tuple[grpc.Server, str]:
    port = free_port()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    register(server, port)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, f"127.0.0.1:{port}"


# --- storage -----------------------------------------------------------------------------------------


def test_random_uuid_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(parse_uuid(ok_json(invoke(capsys, "storage", "random-uuid", "--json"))["cluster_id"])) == 16


def test_format_json_lists_every_dir_with_its_outcome(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "node.properties"
    config.write_text(
        "process.roles=broker\nnode.id=101\ncontroller.quorum.voters=1@127.0.0.1:9093\n"
        f"listeners=PLAINTEXT://127.0.0.1:9092\nlog.dirs={tmp_path / 'a'},{tmp_path / 'b'}\n",
        encoding="utf-8",
    )
    cluster_id = "MkU3OEVBNTcwNTJENDM2Qg"
    args = ["storage", "format", "-c", str(config), "-t", cluster_id, "--json"]
    first = ok_json(invoke(capsys, *args))
    assert (first["cluster_id"], first["node_id"]) == (cluster_id, 101)
    assert [(d["dir"], d["outcome"]) for d in first["dirs"]] == [
        (str(tmp_path / "a"), "formatted"),
        (str(tmp_path / "b"), "formatted"),
    ]
    assert first["dirs"][0]["directory_id"] == read_meta_properties(tmp_path / "a").directory_id
    again = ok_json(invoke(capsys, *args, "--ignore-formatted"))
    assert {d["outcome"] for d in again["dirs"]} == {"skipped"}


# --- quorum add-controller / remove-controller -------------------------------------------------------


class _Leader(raft_pb2_grpc.RaftServiceServicer):
    """Leader 1 of voters 1, 2, 3.  The first RemoveRaftVoter applies the change and then fails in transit
    (outcome unknown); its resend is refused VOTER_NOT_FOUND, which with the change in force is success."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.voters = [1, 2, 3]
        self.remove_calls = 0

    def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: Any
    ) -> raft_pb2.DescribeQuorumResponse:
        return raft_pb2.DescribeQuorumResponse(
            cluster_id=CLUSTER_ID,
            leader_id=1,
            leader_epoch=4,
            high_watermark=10,
            current_voters=[
                raft_pb2.ReplicaState(replica_id=v, directory_id=DIRECTORY_ID) for v in self.voters
            ],
            nodes=[NodeRef(node_id=1, endpoint=Endpoint(host="127.0.0.1", port=self.port))],
        )

    def AddRaftVoter(
        self, request: raft_pb2.AddRaftVoterRequest, context: Any
    ) -> raft_pb2.RaftVoterChangeResponse:
        assert request.cluster_id == CLUSTER_ID
        return raft_pb2.RaftVoterChangeResponse(offset=42, leader_id=1, leader_epoch=4)

    def RemoveRaftVoter(
        self, request: raft_pb2.RemoveRaftVoterRequest, context: Any
    ) -> raft_pb2.RaftVoterChangeResponse:
        self.remove_calls += 1
        if request.voter_id not in self.voters:
            return raft_pb2.RaftVoterChangeResponse(
                error_code=ErrorCode.VOTER_NOT_FOUND, error_message="gone"
            )
        self.voters.remove(request.voter_id)
        context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset after the append")
        raise AssertionError("unreachable")


@pytest.fixture
def leader() -> Iterator[tuple[_Leader, str]]:
    holder: list[_Leader] = []

    def register(server: grpc.Server, port: int) -> None:
        holder.append(_Leader(port))  # type: ignore[abstract]
        raft_pb2_grpc.add_RaftServiceServicer_to_server(holder[0], server)

    server, target = _serve(register)
    try:
        yield holder[0], target
    finally:
        server.stop(None)


def test_remove_controller_json_and_verbose_show_the_reconciled_retry(
    capsys: pytest.CaptureFixture[str], leader: tuple[_Leader, str]
) -> None:
    servicer, target = leader
    outcome = invoke(
        capsys, "quorum", "remove-controller", "--bootstrap-controller", target, "--controller-id", "3",
        "--controller-directory-id", DIRECTORY_ID, "--timeout", "10", "--json", "--verbose",
    )  # fmt: skip
    assert ok_json(outcome) == {
        "change": "removed",
        "controller_id": 3,
        "directory_id": DIRECTORY_ID,
        "voters_record_offset": None,
        "in_force_after_unknown_outcome": True,
    }
    assert servicer.remove_calls == 2
    retries = outcome.err.splitlines()
    assert len(retries) == 2 and all(line.startswith("retry: RemoveRaftVoter") for line in retries), retries
    assert "UNAVAILABLE" in retries[0] and "outcome is unknown" in retries[0]
    assert "VOTER_NOT_FOUND" in retries[1] and "in force" in retries[1]


def test_add_controller_json_names_the_joiner_and_the_record(
    capsys: pytest.CaptureFixture[str], leader: tuple[_Leader, str], tmp_path: Path
) -> None:
    _, target = leader
    cluster = LocalCluster.create(tmp_path / "kc", controllers=1, brokers=0)
    joiner = cluster.spec.controllers[0]
    config = cluster.layout.config_path(joiner)
    outcome = invoke(
        capsys, "quorum", "add-controller", "--bootstrap-controller", target, "--command-config", str(config),
        "--timeout", "10", "--json",
    )  # fmt: skip
    added = ok_json(outcome)
    assert added["change"] == "added" and added["controller_id"] == joiner.node_id
    assert added["directory_id"] == read_meta_properties(cluster.layout.data_dir(joiner)).directory_id
    assert added["endpoint"] == f"CONTROLLER://{joiner.target}"
    assert (added["voters_record_offset"], added["in_force_after_unknown_outcome"]) == (42, False)
    assert outcome.err == ""  # no --verbose: no retry lines


# --- acl add / remove --------------------------------------------------------------------------------


class _AclController(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self) -> None:
        self.acls: dict[str, cpb.AclBinding] = {}

    def DescribeCluster(self, request: Any, context: Any) -> cpb.DescribeClusterResponse:
        return cpb.DescribeClusterResponse(cluster_id=CLUSTER_ID)

    def CreateAcls(self, request: cpb.CreateAclsRequest, context: Any) -> cpb.CreateAclsResponse:
        results = []
        for binding in request.creations:
            acl_id = f"acl-{len(self.acls) + 1}"
            self.acls[acl_id] = binding
            results.append(cpb.AclCreationResult(id=acl_id))
        return cpb.CreateAclsResponse(results=results)

    def DeleteAcls(self, request: cpb.DeleteAclsRequest, context: Any) -> cpb.DeleteAclsResponse:
        matching = [cpb.AclDescription(id=i, binding=b) for i, b in sorted(self.acls.items())]
        self.acls.clear()
        return cpb.DeleteAclsResponse(filter_results=[cpb.DeleteAclsFilterResult(matching_acls=matching)])


@pytest.fixture
def acl_controller() -> Iterator[str]:
    servicer = _AclController()  # type: ignore[abstract]
    server, target = _serve(
        lambda s, _: controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, s)
    )
    try:
        yield target
    finally:
        server.stop(None)


def test_acl_add_and_remove_json(capsys: pytest.CaptureFixture[str], acl_controller: str) -> None:
    outcome = invoke(
        capsys, "acl", "add", "--bootstrap-controller", acl_controller, "--allow-principal", "User:alice",
        "--operation", "Read", "--operation", "Write", "--topic", "orders", "--json",
    )  # fmt: skip
    added = ok_json(outcome)
    assert added["failed"] == []
    assert [(a["id"], a["principal"], a["operation"], a["resource_name"]) for a in added["added"]] == [
        ("acl-1", "User:alice", "READ", "orders"),
        ("acl-2", "User:alice", "WRITE", "orders"),
    ]
    assert {a["permission_type"] for a in added["added"]} == {"ALLOW"}
    removed = ok_json(
        invoke(
            capsys, "acl", "remove", "--bootstrap-controller", acl_controller, "--topic", "orders", "--json"
        )
    )
    assert removed["count"] == 2 and [a["id"] for a in removed["removed"]] == ["acl-1", "acl-2"]


# --- chaos run ---------------------------------------------------------------------------------------


def test_chaos_run_json_has_verdicts_reports_and_reproduce_commands(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import chaos.runner
    import kraft.cli.chaos
    from chaos.checkers.verdict import Status, Verdict
    from chaos.report import RunReport

    async def run_scenario(options: chaos.runner.RunOptions, progress: Any) -> RunReport:
        # A stand-in for the real run (which starts a cluster): one checker passes, one finds a violation.
        verdicts = [
            Verdict("linearizable", Status.PASS, "ok"),
            Verdict("no-lost-writes", Status.FAIL, "lost 1"),
        ]
        return RunReport(options.scenario, options.seed, options.duration_s, 0.0, verdicts)

    monkeypatch.setattr(chaos.runner, "run_scenario", run_scenario)
    # The command binds its children to itself first (kraft.procutil): here that would install its
    # signal handlers and exit hook in the test process, so the call is only recorded.
    bound: list[bool] = []
    monkeypatch.setattr(kraft.cli.chaos, "reap_children_on_exit", lambda: bound.append(True))
    outcome = invoke(
        capsys, "chaos", "run", "--scenario", "kill", "--seed", "9", "--report", str(tmp_path), "--json"
    )
    assert bound == [True]
    assert outcome.code == 1  # a violation: the JSON first, then the one error line
    report = json.loads(outcome.out)
    assert report["seed"] == 9
    assert [(v["scenario"], v["checker"], v["status"]) for v in report["verdicts"]] == [
        ("kill", "linearizable", "PASS"),
        ("kill", "no-lost-writes", "FAIL"),
    ]
    assert report["reports"] == {"kill": str(tmp_path / "kill" / "report.html")}
    assert [v["scenario"] for v in report["violations"]] == ["kill"]
    assert "--seed 9" in report["violations"][0]["reproduce"]
    assert outcome.err.splitlines()[-1].startswith("error: violations found in kill")


# --- cluster status --timeout, health --cluster-dir -------------------------------------------------


def test_cluster_status_timeout_and_health_cluster_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    directory = tmp_path / "kc"
    LocalCluster.create(directory, controllers=1, brokers=1)
    status = ok_json(
        invoke(capsys, "cluster", "status", "--dir", str(directory), "--timeout", "0.5", "--json")
    )
    assert {n["state"] for n in status["nodes"]} == {"stopped"}
    health = invoke(capsys, "health", "--cluster-dir", str(directory), "--timeout", "0.5", "--json")
    assert health.code == 1  # nothing runs: every check UNREACHABLE, still printed as JSON
    checks = json.loads(health.out)["checks"]
    assert {c["node"] for c in checks} == {"controller-1", "broker-101"}
    assert {c["status"] for c in checks} == {"UNREACHABLE"}
