"""ControllerNode assembly in-process: storage checks, a one-voter node serving its RPCs, clean stop."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from kraft.client.channel import open_channel
from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode, StartupError, check_storage, peer_addresses, raft_config
from kraft.observability.health import RAFT_SERVICE, HealthStatus, check_health
from kraft.observability.stall_sampler import LOOP_LAG, SAMPLER_WAKEUP_DELAY
from kraft.raft.grpc_test_service import chain_digest
from kraft.storage import shutdown_marker
from kraft.storage.ids import random_uuid
from kraft.storage.log import CLEAN_SHUTDOWN_FILE, METADATA_LOG_DIR_NAME
from kraft.storage.meta_properties import format_log_dir
from kraft.storage.quorum_state import QuorumState, QuorumStateStore
from kraft.v1 import raft_pb2, raft_pb2_grpc


def _config(tmp_path: Path, port: int, **extra: object) -> NodeConfig:
    return NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
        **extra,
    )


def test_an_unformatted_metadata_dir_refuses_the_start(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="not formatted"):
        check_storage(_config(tmp_path, 9093))


def test_log_dirs_of_two_clusters_refuse_the_start(tmp_path: Path) -> None:
    cfg = _config(tmp_path, 9093, log_dirs=str(tmp_path / "data"))
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    format_log_dir(tmp_path / "data", cluster_id=random_uuid(), node_id=1)
    with pytest.raises(StartupError, match=r"disagree on cluster\.id"):
        check_storage(cfg)


def test_a_dir_of_another_node_refuses_the_start(tmp_path: Path) -> None:
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=7)
    with pytest.raises(StartupError, match="formatted for node 7"):
        check_storage(_config(tmp_path, 9093))


async def test_an_impossible_epoch_in_quorum_state_is_a_one_line_startup_error(tmp_path: Path) -> None:
    # Issue #15: a forged Vote once persisted epoch 2^31 - 1; such a file must stop the start, not loop.
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    (tmp_path / "meta" / METADATA_LOG_DIR_NAME).mkdir()
    QuorumStateStore(tmp_path / "meta" / METADATA_LOG_DIR_NAME).write(QuorumState(leader_epoch=(1 << 31) - 1))
    node = ControllerNode(_config(tmp_path, free_port()))
    with pytest.raises(StartupError, match="impossible epoch 2147483647") as info:
        await node.start()
    assert "\n" not in str(info.value)


async def test_a_one_voter_node_commits_test_appends_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    cluster_id = random_uuid()
    format_log_dir(tmp_path / "meta", cluster_id=cluster_id, node_id=1)
    node = ControllerNode(_config(tmp_path, port, kraft_test_append_enable=True))
    await node.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            test_stub = raft_pb2_grpc.RaftTestServiceStub(channel)
            request = raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"a", b"b"])
            appended = await test_stub.TestAppend(request, timeout=10)
            assert appended.error_code == ErrorCode.NONE
            assert appended.last_offset == appended.base_offset + 1

            wrong = raft_pb2.TestAppendRequest(cluster_id="another", values=[b"x"])
            refused = await test_stub.TestAppend(wrong, timeout=10)
            assert refused.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID

            stream = test_stub.TestAppendStream(None)
            offsets = []
            for value in (b"c", b"d"):
                await stream.write(raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[value]))
                answer = await asyncio.wait_for(stream.read(), 10)
                assert isinstance(answer, raft_pb2.TestAppendResponse) and answer.error_code == 0
                offsets.append(answer.last_offset)
            await stream.done_writing()
            assert offsets[0] > appended.last_offset and offsets[1] == offsets[0] + 1

            deadline = time.monotonic() + 10
            while True:
                asked = raft_pb2.TestDigestRequest(cluster_id=cluster_id)
                digest = await test_stub.TestDigest(asked, timeout=5)
                if digest.applied_offset > offsets[1] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.02)
            assert digest.record_count == 4
            expected = bytes(32)
            for value in (b"a", b"b", b"c", b"d"):
                expected = chain_digest(expected, value)
            assert digest.digest == expected

            raft_stub = raft_pb2_grpc.RaftServiceStub(channel)
            described = await raft_stub.DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(cluster_id=cluster_id), timeout=5
            )
            assert (described.error_code, described.leader_id, described.cluster_id) == (0, 1, cluster_id)
            assert described.current_voters[0].directory_id == node.directory_id
        assert await _wait_health(f"127.0.0.1:{port}", HealthStatus.SERVING)
    finally:
        await node.stop(timeout_ms=2000)
    assert (tmp_path / "meta" / METADATA_LOG_DIR_NAME / CLEAN_SHUTDOWN_FILE).exists()
    assert shutdown_marker.read(tmp_path / "meta" / METADATA_LOG_DIR_NAME).clean


async def test_the_test_service_is_not_served_unless_enabled(tmp_path: Path) -> None:
    port = free_port()
    cluster_id = random_uuid()
    format_log_dir(tmp_path / "meta", cluster_id=cluster_id, node_id=1)
    node = ControllerNode(_config(tmp_path, port))
    await node.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = raft_pb2_grpc.RaftTestServiceStub(channel)
            request = raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"x"])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.TestAppend(request, timeout=5)
            assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await node.stop(timeout_ms=2000)


async def _wait_health(target: str, wanted: HealthStatus, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check_health(target, RAFT_SERVICE, timeout_s=1.0) is wanted:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_port_in_use_refuses_the_start(tmp_path: Path) -> None:
    port = free_port()
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    blocker = grpc.aio.server()
    blocker.add_insecure_port(f"127.0.0.1:{port}")
    await blocker.start()
    node = ControllerNode(_config(tmp_path, port))
    try:
        with pytest.raises(StartupError, match="cannot listen"):
            await node.start()
    finally:
        await blocker.stop(grace=None)


def test_a_dynamic_controller_does_not_dial_itself_through_the_shared_bootstrap_list() -> None:
    cfg = NodeConfig.from_properties(
        {
            "process.roles": "controller",
            "node.id": "2",
            "controller.quorum.bootstrap.servers": "127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9003",
            "listeners": "CONTROLLER://127.0.0.1:9002",
            "metadata.log.dir": "/var/kraft/c2",
        }
    )
    assert peer_addresses(cfg) == ((-2, "127.0.0.1:9001"), (-4, "127.0.0.1:9003"))
    assert raft_config(cfg, random_uuid()).bootstrap_ids == (-2, -4)


def _samples(histogram: Any) -> float:
    return float(sum(bucket.get() for bucket in histogram._buckets))


async def test_the_stall_samplers_watch_both_loops_and_a_thread_and_stop_with_it(
    tmp_path: Path,
) -> None:
    """observability.stall.sampler.ms: the main and intake loops' lag and the sampler thread's wake-up
    delay (total and GIL) are sampled while the node runs; the sampler thread ends with the node."""
    port = free_port()
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    series = [
        LOOP_LAG.labels("1", "main"),
        LOOP_LAG.labels("1", "intake"),
        SAMPLER_WAKEUP_DELAY.labels("1", "total"),
        SAMPLER_WAKEUP_DELAY.labels("1", "gil"),
    ]
    before = [_samples(histogram) for histogram in series]
    node = ControllerNode(_config(tmp_path, port, observability_stall_sampler_ms=5))
    await node.start()
    try:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if all(_samples(h) > b for h, b in zip(series, before, strict=True)):
                break
            await asyncio.sleep(0.02)
        assert [_samples(h) > b for h, b in zip(series, before, strict=True)] == [True] * 4
    finally:
        await node.stop(timeout_ms=2000)
    samplers = [t for t in threading.enumerate() if t.name == "kraft-stall-sampler"]
    for thread in samplers:
        thread.join(timeout=5.0)
    assert not any(thread.is_alive() for thread in samplers)
