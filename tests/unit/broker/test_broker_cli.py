"""`kraft produce` / `kraft consume` against an in-process broker: output shapes and one-line errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from broker_fakes import MemoryLogOpener, StaticMetadataView
from typer.testing import CliRunner

from kraft.broker.partitions import PartitionManager
from kraft.broker.service import BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, LocalChanges, PartitionAssignment, TopicPartition
from kraft.cli.main import app
from kraft.clock import SystemClock
from kraft.netutil import free_port
from kraft.v1 import broker_pb2_grpc

runner = CliRunner()


@pytest.fixture
async def broker_target(tmp_path: Path) -> AsyncIterator[str]:
    status = BrokerStatus(1, "c", session_timeout_ms=60_000, clock=SystemClock())
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.heartbeat_accepted(status.monotonic_ms())
    manager = PartitionManager(1, [tmp_path], MemoryLogOpener())
    manager.load()
    manager.apply(
        LocalChanges(leaders={TopicPartition("t", 0): PartitionAssignment("id", 1, 0, 0, (1,), (1,))})
    )
    port = free_port()
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(
        BrokerService(status, manager, StaticMetadataView({1: port}, {"t": 1})), server
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def invoke(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    # The CLI runs its own event loop (asyncio.run), so it must run in a thread beside the server's loop.
    result = await asyncio.to_thread(runner.invoke, app, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


async def test_produce_then_consume_round_trip(broker_target: str) -> None:
    code, out, _ = await invoke(
        "produce", "--bootstrap-server", broker_target, "--topic", "t", "--json", stdin="a\nb\n"
    )
    assert code == 0 and json.loads(out) == {
        "topic": "t", "partition": 0, "count": 2, "base_offset": 0, "last_offset": 1
    }  # fmt: skip
    code, out, _ = await invoke(
        "consume", "--bootstrap-server", broker_target, "--topic", "t", "--from-beginning",
        "--max-records", "2", "--json",
    )  # fmt: skip
    assert code == 0
    assert [(r["offset"], r["value"], r["key"]) for r in map(json.loads, out.splitlines())] == [
        (0, "a", None),
        (1, "b", None),
    ]


async def test_errors_are_one_line_on_stderr(broker_target: str) -> None:
    code, _, err = await invoke(
        "consume", "--bootstrap-server", broker_target, "--topic", "t", "--offset", "0", "--from-beginning"
    )
    assert code == 1 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    code, _, err = await invoke(
        "consume", "--bootstrap-server", broker_target, "--topic", "t", "--offset", "9"
    )
    assert code == 1 and "OFFSET_OUT_OF_RANGE" in err
    code, _, err = await invoke("produce", "--bootstrap-server", broker_target, "--topic", "t", stdin="")
    assert code == 1 and "nothing to produce" in err
