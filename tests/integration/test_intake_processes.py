"""Intake processes (``controller.intake.processes``) on real controller processes: many clients' TestAppend
calls committed with each caller's own offsets, admin calls and broker heartbeats through intake processes,
fail-stop when one dies, no process left behind however the node ends, and the caller's TLS identity and
address (Raft identity binding, ACLs) kept across an intake process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from conftest import TEST_PROFILE

from kraft.client.admin import AdminClient
from kraft.client.channel import ChannelSecurity, open_blocking_channel
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerProc, ControllerQuorum, QuorumFactory, run_kraft, wait_until
from kraft.cluster.spec import FIRST_BROKER_ID, ClusterLayout, certificate_principal, client_properties
from kraft.errors import ErrorCode
from kraft.node.intake_process import HOLD_CREATES_ENV
from kraft.node.supervisor import EXIT_FATAL
from kraft.security.principal import INTAKE_AUTH_KEY, INTAKE_PEER_KEY, encode_auth
from kraft.v1 import common_pb2, controller_pb2_grpc, raft_pb2, raft_pb2_grpc
from kraft.v1 import controller_pb2 as cpb

pytestmark = pytest.mark.integration

CONNECTIONS = 48
CALLS_PER_CLIENT = 8
TIMEOUT_S = 20.0
FORGED_CONNECTIONS = 12


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short base directory for this module's quorums: a node's intake socket
    (``<metadata.log.dir>/intake/node.sock``) must stay under the 107-byte unix socket limit, which
    pytest's own tmp dirs exceed under xdist (``/tmp/pytest-of-root/pytest-N/popen-gw0/<test name>0/...``);
    the node refuses such a path at start with a clear error."""
    base = Path(tempfile.mkdtemp(prefix="ki-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def intake(exclusive: bool = False, processes: int = 2) -> dict[str, str]:
    return {
        "controller.intake.processes": str(processes),
        "controller.intake.exclusive": "true" if exclusive else "false",
    }


def intake_pids(node: ControllerProc) -> list[int]:
    """The pids the node logged at start (``intake_processes_started pids=…``), latest start last."""
    found = re.findall(r"event=intake_processes_started .*?pids=([\d,]+)", node.log_path.read_text())
    assert found, node.log_tail(30)
    return [int(pid) for pid in found[-1].split(",")]


def gone(pid: int) -> bool:
    """No such process (or only a zombie nobody reaped yet: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def wait_gone(pids: list[int], what: str) -> None:
    wait_until(lambda: all(gone(pid) for pid in pids) or None, 15, what)


async def _many_clients_append(target: str, cluster_id: str) -> list[tuple[int, int, int]]:
    """``CONNECTIONS`` clients, each on a TCP connection of its own (so the kernel spreads them over the
    node's sockets), each appending ``CALLS_PER_CLIENT`` times 1 to 3 values; (base, last, count) per call."""
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CONNECTIONS)
    ]
    try:

        async def client(index: int) -> list[tuple[int, int, int]]:
            stub = raft_pb2_grpc.RaftTestServiceStub(channels[index])
            done = []
            for call in range(CALLS_PER_CLIENT):
                count = 1 + (index + call) % 3
                values = [b"c%d-%d-%d" % (index, call, i) for i in range(count)]
                request = raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=values)
                answer = await stub.TestAppend(request, timeout=TIMEOUT_S)
                assert answer.error_code == ErrorCode.NONE, answer
                done.append((answer.base_offset, answer.last_offset, count))
            return done

        results = await asyncio.gather(*(client(index) for index in range(CONNECTIONS)))
    finally:
        for channel in channels:
            await channel.close(None)
    return [call for calls in results for call in calls]


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared-port", "exclusive"])
def test_a_quorum_with_intake_processes_commits_every_callers_writes_at_its_own_offsets(
    quorum_factory: QuorumFactory, exclusive: bool
) -> None:
    quorum = quorum_factory(overrides=intake(exclusive))
    quorum.start()
    leader = quorum.wait_for_leader(30)
    before = quorum.append([b"first"])[1]
    calls = asyncio.run(_many_clients_append(quorum.nodes[leader.node_id].target, quorum.cluster_id))
    offsets: list[int] = []
    for base, last, count in calls:
        assert last - base + 1 == count, (base, last, count)
        offsets.extend(range(base, last + 1))
    total = sum(count for _, _, count in calls)
    # every value at an offset of its own, none reused, none skipped (no other writer ran meanwhile)
    assert sorted(offsets) == list(range(before + 1, before + 1 + total))
    digests = quorum.wait_converged(30)
    assert {d.record_count for d in digests.values()} == {total + 1}

    pids = {node_id: intake_pids(node) for node_id, node in quorum.nodes.items()}
    assert all(len(found) == 2 for found in pids.values())
    for node_id, node in quorum.nodes.items():
        assert quorum.terminate(node_id) == 0, node.log_tail(30)
        wait_gone(pids[node_id], f"node {node_id}'s intake processes gone after its graceful stop")
    stopped = re.findall(
        r"event=intake_process_stopped .*?batches=(\d+) batched_calls=(\d+)",
        quorum.nodes[leader.node_id].log_path.read_text(),
    )
    assert len(stopped) == 2, quorum.nodes[leader.node_id].log_tail(40)
    batches = sum(int(b) for b, _ in stopped)
    batched_calls = sum(int(c) for _, c in stopped)
    assert batched_calls > 0, "some connections landed on the leader's intake processes"
    if exclusive:  # no connection reached the node's own process: every call came through a batch
        assert batched_calls == len(calls) + 1, stopped  # + the quorum helper's first append
    assert batches < batched_calls, "concurrent callers share batches"


async def _brokers_and_admin(quorum: ControllerQuorum) -> None:
    targets = [node.target for node in quorum.nodes.values()]
    async with AdminClient(targets, timeout_s=30, clock=SystemClock()) as client:
        cluster = await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
        assert cluster.cluster_id == quorum.cluster_id
        epochs: dict[int, int] = {}
        for broker_id in (1, 2, 3):
            registered = await client.call(
                lambda s: s.RegisterBroker,
                cpb.RegisterBrokerRequest(
                    cluster_id=quorum.cluster_id,
                    broker_id=broker_id,
                    incarnation_id=f"incarnation-{broker_id}",
                    listeners=[
                        common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=19000 + broker_id)
                    ],
                ),
            )
            epochs[broker_id] = registered.broker_epoch
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            answers = [
                await client.call(
                    lambda s: s.BrokerHeartbeat,
                    cpb.BrokerHeartbeatRequest(
                        cluster_id=quorum.cluster_id,
                        broker_id=broker_id,
                        broker_epoch=epoch,
                        current_metadata_offset=1 << 40,
                    ),
                )
                for broker_id, epoch in epochs.items()
            ]
            assert all(answer.error_code == ErrorCode.NONE for answer in answers), answers
            if not any(answer.is_fenced for answer in answers):
                break
            assert time.monotonic() < deadline, "brokers not unfenced through intake processes"
            await asyncio.sleep(0.2)
        bootstrap = ",".join(targets)
        created = await asyncio.to_thread(
            run_kraft,
            ["topic", "create", "orders", "-p", "3", "-r", "3", "--bootstrap-controller", bootstrap],
        )
        assert created.returncode == 0, created.stderr
        fetched = await client.call(
            lambda s: s.MetadataFetch, cpb.MetadataFetchRequest(cluster_id=quorum.cluster_id, fetch_offset=0)
        )
        assert len(fetched.records) > 0
        described = await asyncio.to_thread(
            run_kraft, ["quorum", "describe", "--bootstrap-controller", bootstrap, "--status"]
        )
        assert described.returncode == 0, described.stderr


def test_admin_calls_heartbeats_and_raft_work_when_every_connection_goes_through_an_intake_process(
    quorum_factory: QuorumFactory,
) -> None:
    # exclusive: the nodes' own processes do not listen on the network at all, so every admin call,
    # heartbeat, MetadataFetch, health check and Raft RPC between the controllers crosses an intake process
    quorum = quorum_factory(overrides=intake(exclusive=True), test_append=False)
    quorum.start()
    quorum.wait_for_leader(30)
    asyncio.run(_brokers_and_admin(quorum))


MANY_BROKERS = 40
BATCHED_TOPICS = 12


async def _many_brokers_and_topics(quorum: ControllerQuorum, target: str) -> None:
    """``MANY_BROKERS`` brokers, each on a connection of its own to the active controller, register and
    heartbeat at the same time until every one is unfenced; then ``BATCHED_TOPICS`` CreateTopics at once on
    one connection (so they reach one intake process, which holds their turn: ``HOLD_CREATES_ENV``)."""
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(MANY_BROKERS)
    ]
    try:
        stubs = [controller_pb2_grpc.ControllerServiceStub(channel) for channel in channels]

        async def broker(index: int) -> None:
            broker_id = FIRST_BROKER_ID + index
            registered = await stubs[index].RegisterBroker(
                cpb.RegisterBrokerRequest(
                    cluster_id=quorum.cluster_id,
                    broker_id=broker_id,
                    incarnation_id=f"incarnation-{broker_id}",
                    listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=20000 + index)],
                ),
                timeout=TIMEOUT_S,
            )
            assert registered.error_code == ErrorCode.NONE, registered
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                beat = await stubs[index].BrokerHeartbeat(
                    cpb.BrokerHeartbeatRequest(
                        cluster_id=quorum.cluster_id,
                        broker_id=broker_id,
                        broker_epoch=registered.broker_epoch,
                        current_metadata_offset=1 << 40,
                    ),
                    timeout=TIMEOUT_S,
                )
                assert beat.error_code == ErrorCode.NONE, beat
                if not beat.is_fenced:
                    break
                assert time.monotonic() < deadline, (
                    f"broker {broker_id} not unfenced through intake processes"
                )
                await asyncio.sleep(0.05)
            # a heartbeat with a wrong epoch is answered as such, beside the others' good ones
            stale = await stubs[index].BrokerHeartbeat(
                cpb.BrokerHeartbeatRequest(
                    cluster_id=quorum.cluster_id,
                    broker_id=broker_id,
                    broker_epoch=registered.broker_epoch + 1,
                ),
                timeout=TIMEOUT_S,
            )
            assert stale.error_code == ErrorCode.STALE_BROKER_EPOCH, stale

        await asyncio.gather(*(broker(index) for index in range(MANY_BROKERS)))

        async def create(index: int) -> cpb.CreateTopicsResponse:
            return await stubs[0].CreateTopics(
                cpb.CreateTopicsRequest(
                    cluster_id=quorum.cluster_id,
                    topics=[
                        cpb.CreatableTopic(name=f"batched-{index}", num_partitions=4, replication_factor=3)
                    ],
                ),
                timeout=TIMEOUT_S,
            )

        created = await asyncio.gather(*(create(index) for index in range(BATCHED_TOPICS)))
        assert [c.topics[0].error_code for c in created] == [ErrorCode.NONE] * BATCHED_TOPICS, created
        again = await create(0)  # each caller its own answer: a second create of the same name fails alone
        assert again.topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS, again
        described = await stubs[0].DescribeTopics(
            cpb.DescribeTopicsRequest(cluster_id=quorum.cluster_id), timeout=TIMEOUT_S
        )
        names = {topic.name for topic in described.topics}
        assert {f"batched-{index}" for index in range(BATCHED_TOPICS)} <= names
    finally:
        for channel in channels:
            await channel.close(None)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "proxied"])
def test_many_brokers_heartbeats_and_concurrent_create_topics_go_through_intake_processes_in_batches(
    quorum_factory: QuorumFactory, batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The intake processes (children of the nodes, which inherit this environment) hold the first turn with a
    # CreateTopics open until all BATCHED_TOPICS wait in it: whether concurrent calls share a batch is then
    # behaviour, not timing (kraft.node.intake_process.HeldTurnCallBatcher).
    monkeypatch.setenv(HOLD_CREATES_ENV, str(BATCHED_TOPICS))
    overrides = intake(exclusive=True)
    overrides["controller.intake.batch.controller.calls"] = str(batched).lower()
    quorum = quorum_factory(overrides=overrides, test_append=False)
    quorum.start()
    quorum.wait_for_leader(30)
    active = _active_controller(quorum)
    asyncio.run(_many_brokers_and_topics(quorum, quorum.nodes[active].target))
    node = quorum.nodes[active]
    assert quorum.terminate(active) == 0, node.log_tail(30)
    log = node.log_path.read_text()
    stopped = re.findall(
        r"event=intake_process_stopped .*?controller_batches=(\d+) controller_calls=(\d+)", log
    )
    assert len(stopped) == 2, node.log_tail(40)
    batches = sum(int(b) for b, _ in stopped)
    calls = sum(int(c) for _, c in stopped)
    if not batched:  # the switch off: every call proxied on its own, answered the same
        assert (batches, calls) == (0, 0), stopped
        return
    # every heartbeat (>= 2 per broker) and CreateTopics crossed a CallBatch; the BATCHED_TOPICS concurrent
    # CreateTopics, held in one turn, shared ONE (so at least BATCHED_TOPICS - 1 calls fewer batches than
    # calls).  Without the hold this was timing: grpc.aio hands an intake process few new calls per turn, and
    # on a quiet host every call had a turn of its own (93 calls in 93 batches, session 16's full run).
    assert calls >= MANY_BROKERS * 2 + BATCHED_TOPICS, stopped
    assert 1 <= batches <= calls - (BATCHED_TOPICS - 1), stopped
    assert "intake_counters_not_reported" not in log, node.log_tail(40)


def _active_controller(quorum: ControllerQuorum) -> int:
    """The active controller's id (the Raft leader once its metadata layer answers)."""
    leader = quorum.wait_for_leader(30)

    async def active() -> bool:
        async with grpc.aio.insecure_channel(quorum.nodes[leader.node_id].target) as channel:
            answer = await controller_pb2_grpc.ControllerServiceStub(channel).DescribeCluster(
                cpb.DescribeClusterRequest(cluster_id=quorum.cluster_id), timeout=TIMEOUT_S
            )
            return answer.error_code == ErrorCode.NONE

    wait_until(lambda: asyncio.run(active()) or None, 30, "the active controller answers")
    return leader.node_id


def test_an_intake_process_that_dies_takes_its_node_down_with_one_fatal_line_and_no_orphan(
    quorum_factory: QuorumFactory,
) -> None:
    quorum = quorum_factory(size=1, overrides=intake())
    quorum.start()
    quorum.wait_for_leader(30)
    node = quorum.nodes[1]
    victim, sibling = intake_pids(node)
    os.kill(victim, signal.SIGKILL)
    assert node.wait_exit(timeout_s=30) == EXIT_FATAL, node.log_tail(30)
    fatal = [line for line in node.log_path.read_text().splitlines() if " event=fatal " in line]
    assert len(fatal) == 1, node.log_tail(30)
    assert "reason=intake_process_died" in fatal[0] and f"pid={victim}" in fatal[0], fatal[0]
    assert "exit_status=-9" in fatal[0], fatal[0]
    wait_gone([victim, sibling], "the node's other intake process gone with it")


def test_intake_processes_die_with_a_node_killed_by_sigkill_and_come_back_with_its_restart(
    quorum_factory: QuorumFactory,
) -> None:
    quorum = quorum_factory(size=1, overrides=intake())
    quorum.start()
    quorum.wait_for_leader(30)
    first = intake_pids(quorum.nodes[1])
    quorum.kill(1)
    wait_gone(first, "intake processes gone after their node was SIGKILLed (death signal)")
    quorum.restart(1)
    quorum.wait_for_leader(30)
    second = intake_pids(quorum.nodes[1])
    assert not set(first) & set(second) and not any(gone(pid) for pid in second)
    assert quorum.append([b"after restart"])[1] >= 0


def test_a_node_with_intake_processes_refuses_a_port_another_process_listens_on(
    quorum_factory: Callable[..., ControllerQuorum],
) -> None:
    # SO_REUSEPORT would let the node share its port with a stranger that set it too: refused instead
    quorum = quorum_factory(size=1, overrides=intake())
    quorum.prepare()
    with socket.socket() as stranger:
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        stranger.bind(("127.0.0.1", quorum.nodes[1].port))
        stranger.listen()
        quorum.nodes[1].start()
        code = quorum.nodes[1].wait_exit(timeout_s=30)
    assert code == 1, quorum.nodes[1].log_tail(20)
    assert f"cannot listen on 127.0.0.1:{quorum.nodes[1].port}" in quorum.nodes[1].log_path.read_text()


def _describe_cluster(target: str, security: ChannelSecurity, cluster_id: str) -> cpb.DescribeClusterResponse:
    with open_blocking_channel(target, [("grpc.use_local_subchannel_pool", 1)], security=security) as channel:
        answer: cpb.DescribeClusterResponse = controller_pb2_grpc.ControllerServiceStub(
            channel
        ).DescribeCluster(cpb.DescribeClusterRequest(cluster_id=cluster_id), timeout=10)
        return answer


def test_acls_through_intake_processes_match_the_callers_principal_and_host(tmp_path: Path) -> None:
    # exclusive: every call reaches the nodes through an intake process, so the authorizer only ever sees
    # forwarded principals and hosts
    controllers = [f"controller-{node_id}" for node_id in (1, 2, 3)]
    overrides = {
        **TEST_PROFILE,
        **intake(exclusive=True),
        "authorizer.class.name": "kraft",
        "super.users": ";".join(certificate_principal(name) for name in [*controllers, "admin"]),
    }
    with ControllerQuorum(tmp_path / "q", size=3, overrides=overrides, tls=True, test_append=False) as quorum:
        quorum.start()
        leader = quorum.nodes[quorum.wait_for_leader(30).leader_id]
        client_config = tmp_path / "client.properties"
        client_config.write_text(
            "".join(f"{k}={v}\n" for k, v in client_properties(ClusterLayout(quorum.base_dir)).items())
        )
        broker = f"broker-{FIRST_BROKER_ID}"
        outsider = quorum.client_security(broker)
        with pytest.raises(grpc.RpcError) as denied:
            _describe_cluster(leader.target, outsider, quorum.cluster_id)
        assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert certificate_principal(broker) in (denied.value.details() or "")

        def allow_from(host: str) -> None:
            added = run_kraft(
                ["acl", "add", "--bootstrap-controller", leader.target,
                 "--command-config", str(client_config), "--allow-principal", certificate_principal(broker),
                 "--operation", "Describe", "--cluster", "--host", host]
            )  # fmt: skip
            assert added.returncode == 0, added.stderr

        def listed_hosts() -> set[str]:
            listed = run_kraft(
                ["acl", "list", "--json", "--bootstrap-controller", leader.target,
                 "--command-config", str(client_config)]
            )  # fmt: skip
            assert listed.returncode == 0, listed.stderr
            return {str(row.get("host")) for row in json.loads(listed.stdout)}

        # an ACL for another host does not match: the host the node sees is the caller's, not the
        # intake process's (which would be empty: only host * ACLs would match then).  Checked once the
        # leader's image (which the authorizer decides on) lists the ACL.
        allow_from("10.0.0.1")
        wait_until(lambda: "10.0.0.1" in listed_hosts() or None, 15, "the 10.0.0.1 ACL applied")
        with pytest.raises(grpc.RpcError) as still_denied:
            _describe_cluster(leader.target, outsider, quorum.cluster_id)
        assert still_denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
        allow_from("127.0.0.1")
        described = wait_until(
            lambda: _allowed(leader.target, outsider, quorum.cluster_id), 15, "the 127.0.0.1 ACL in force"
        )
        assert described.cluster_id == quorum.cluster_id


def _allowed(target: str, security: ChannelSecurity, cluster_id: str) -> cpb.DescribeClusterResponse | None:
    try:
        return _describe_cluster(target, security, cluster_id)
    except grpc.RpcError:
        return None


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared-port", "exclusive"])
def test_a_tls_quorum_through_intake_processes_keeps_every_callers_identity(
    tmp_path: Path, exclusive: bool
) -> None:
    # Raft between the controllers crosses intake processes (all of it when exclusive); it only forms if
    # each controller's certificate identity reaches the node through them.  Shared port: the forged
    # calls below land on the node's own network port too (the kernel spreads the connections).
    overrides = {**TEST_PROFILE, **intake(exclusive)}
    with ControllerQuorum(tmp_path / "q", size=3, overrides=overrides, tls=True) as quorum:
        quorum.start()
        before = quorum.wait_for_leader(30)
        _, last = quorum.append([b"over tls"])
        assert last >= 0
        leader = quorum.nodes[before.leader_id]
        follower = next(n for n in quorum.nodes.values() if n.node_id != before.leader_id)
        impostor = next(
            n for n in quorum.nodes.values() if n.node_id not in (before.leader_id, follower.node_id)
        )
        forged_vote = raft_pb2.VoteRequest(
            cluster_id=quorum.cluster_id,
            candidate_id=follower.node_id,
            candidate_epoch=before.leader_epoch + 1,
            voter_id=before.leader_id,
            last_offset_epoch=before.leader_epoch,
            last_offset=before.high_watermark + 1000,
        )
        # A certificate that names no controller, claiming one in the intake process's own headers: the
        # intake process drops them and the node's network port ignores them — refused on every path.
        forged_headers = (
            (INTAKE_AUTH_KEY, encode_auth({"transport_security_type": [b"ssl"],
                                           "x509_subject": [f"CN=controller-{follower.node_id}".encode()]})),
            (INTAKE_PEER_KEY, "ipv4:10.1.1.1:1"),
        )  # fmt: skip
        outsider = quorum.client_security(f"broker-{FIRST_BROKER_ID}")
        for _ in range(FORGED_CONNECTIONS):  # each a connection of its own: most land on intake processes
            with open_blocking_channel(
                leader.target, [("grpc.use_local_subchannel_pool", 1)], security=outsider
            ) as channel:
                stub = raft_pb2_grpc.RaftServiceStub(channel)
                for metadata in ((), forged_headers):
                    with pytest.raises(grpc.RpcError) as denied:
                        stub.Vote(forged_vote, metadata=metadata, timeout=5)
                    assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
        # a controller's certificate cannot speak for another voter through an intake process either
        with open_blocking_channel(
            leader.target,
            [("grpc.use_local_subchannel_pool", 1)],
            security=quorum.client_security(f"controller-{impostor.node_id}"),
        ) as channel:
            answer = raft_pb2_grpc.RaftServiceStub(channel).Vote(forged_vote, timeout=5)
        assert ErrorCode.from_wire(answer.error_code) is ErrorCode.INVALID_REQUEST
        after = quorum.wait_for_leader(10)
        assert (after.leader_id, after.leader_epoch) == (before.leader_id, before.leader_epoch)
