"""The runtime choices of long-running processes (kraft.runtime): event loop and gRPC I/O layer."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys

import pytest

from kraft.runtime import (
    EVENT_LOOP_ENV,
    GRPC_EXPERIMENTS_ENV,
    GRPC_IO_ENV,
    IOMGR_EXPERIMENTS,
    EventLoopChoiceError,
    GrpcIoChoiceError,
    configure_grpc_io,
    configure_grpc_logging,
    is_node_command,
    loop_factory,
    run_server,
    running_loop_name,
)


async def _loop_name() -> str:
    await asyncio.sleep(0)
    await asyncio.to_thread(lambda: None)  # the worker-thread hop the Raft driver's fsyncs rely on
    return running_loop_name()


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert loop_factory() is not None
    assert run_server(_loop_name()) == "uvloop"


def test_the_standard_loop_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    assert loop_factory() is None
    assert run_server(_loop_name()) == "asyncio"


def test_an_unknown_loop_is_an_error_and_the_coroutine_is_not_left_dangling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    coroutine = _loop_name()
    with pytest.raises(
        EventLoopChoiceError, match=r"KRAFT_EVENT_LOOP='trio': must be one of uvloop, asyncio"
    ):
        run_server(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # so no "never awaited" warning


# --- the gRPC I/O layer ---------------------------------------------------------------------------


def test_event_engine_is_the_default_grpc_io() -> None:
    env: dict[str, str] = {}
    assert configure_grpc_io(env) == "event-engine"
    assert env == {}


def test_iomgr_can_be_chosen_and_children_inherit_it() -> None:
    env = {GRPC_IO_ENV: "iomgr"}
    assert configure_grpc_io(env) == "iomgr"
    assert env[GRPC_EXPERIMENTS_ENV] == IOMGR_EXPERIMENTS
    assert configure_grpc_io(env) == "iomgr"  # a child inheriting both keeps it
    assert env[GRPC_EXPERIMENTS_ENV] == IOMGR_EXPERIMENTS


def test_event_engine_chosen_explicitly_undoes_an_inherited_iomgr() -> None:
    inherited = {GRPC_IO_ENV: "event-engine", GRPC_EXPERIMENTS_ENV: IOMGR_EXPERIMENTS}
    assert configure_grpc_io(inherited) == "event-engine"
    assert GRPC_EXPERIMENTS_ENV not in inherited


def test_the_operators_own_grpc_experiments_win() -> None:
    env = {GRPC_EXPERIMENTS_ENV: "-event_engine_dns", GRPC_IO_ENV: "iomgr"}
    assert configure_grpc_io(env) == "GRPC_EXPERIMENTS=-event_engine_dns"
    assert env[GRPC_EXPERIMENTS_ENV] == "-event_engine_dns"
    empty = {GRPC_EXPERIMENTS_ENV: ""}
    assert configure_grpc_io(empty) == "event-engine"
    assert empty == {GRPC_EXPERIMENTS_ENV: ""}


def test_an_unknown_grpc_io_changes_nothing_and_the_server_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {GRPC_IO_ENV: "epoll"}
    assert configure_grpc_io(env) == "event-engine"
    assert env == {GRPC_IO_ENV: "epoll"}
    own = {GRPC_EXPERIMENTS_ENV: IOMGR_EXPERIMENTS}  # set by hand, no KRAFT_GRPC_IO: left alone
    assert configure_grpc_io(own) == "iomgr"
    assert own == {GRPC_EXPERIMENTS_ENV: IOMGR_EXPERIMENTS}
    monkeypatch.setenv(GRPC_IO_ENV, "epoll")
    coroutine = _loop_name()
    with pytest.raises(GrpcIoChoiceError, match=r"KRAFT_GRPC_IO='epoll': must be one of iomgr, event-engine"):
        run_server(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED


def _probe_process(extra_env: dict[str, str]) -> str:
    """Import the `kraft` command in a fresh interpreter; report the choice and when grpc got imported."""
    code = (
        "import sys, os, kraft.cli.main, kraft.runtime as r, grpc;"
        "print(r.grpc_io_name(), os.environ.get('GRPC_EXPERIMENTS', '-'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in (GRPC_IO_ENV, GRPC_EXPERIMENTS_ENV)}
    env.update(extra_env)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_the_kraft_command_chooses_before_grpc_is_imported() -> None:
    assert _probe_process({GRPC_IO_ENV: "iomgr"}) == f"iomgr {IOMGR_EXPERIMENTS}"
    assert _probe_process({}) == "event-engine -"


def test_too_late_to_choose_reports_what_grpc_runs_on() -> None:
    code = (
        "import grpc, os, kraft.runtime as r;"
        "print(r.configure_grpc_io(), os.environ.get('GRPC_EXPERIMENTS', '-'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in (GRPC_IO_ENV, GRPC_EXPERIMENTS_ENV)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "event-engine -"


def test_a_node_logs_grpc_errors_only_and_other_commands_nothing() -> None:
    node = ["kraft", "controller", "start", "--config", "c.properties"]
    assert is_node_command(node) and is_node_command(["kraft", "broker", "start", "-c", "b"])
    assert not is_node_command(["kraft", "cluster", "start", "1"])
    assert not is_node_command(["kraft", "broker", "list"])
    env: dict[str, str] = {}
    assert configure_grpc_logging(node, env) == "ERROR" and env["GRPC_VERBOSITY"] == "ERROR"
    cli: dict[str, str] = {}
    assert configure_grpc_logging(["kraft", "cluster", "up"], cli) == "NONE"
    # A node spawned by `cluster up` inherits the CLI's NONE, which is kraft's choice, not the
    # operator's: the node chooses ERROR (the handshake lines go, the core's errors stay).
    child = dict(cli)
    assert configure_grpc_logging(node, child) == "ERROR" and child["GRPC_VERBOSITY"] == "ERROR"
    # The operator's own value always wins, in the CLI and in the nodes it spawns.
    operator = {"GRPC_VERBOSITY": "debug"}
    assert configure_grpc_logging(["kraft", "cluster", "up"], operator) == "debug"
    assert configure_grpc_logging(node, dict(operator)) == "debug"
    assert operator == {"GRPC_VERBOSITY": "debug"}


def test_sigusr2_dumps_every_threads_stack_to_stderr_and_the_node_goes_on() -> None:
    """``kill -USR2`` on a node: where every thread is, in its log, without stopping it (a node stuck in
    a deadlock gets this from the cluster manager before SIGKILL)."""
    script = (
        "import os, signal, threading, time\n"
        "from kraft.runtime import enable_stack_dumps\n"
        "enable_stack_dumps()\n"
        "def parked_in_a_thread(): time.sleep(2)\n"
        "threading.Thread(target=parked_in_a_thread, daemon=True).start()\n"
        "time.sleep(0.1)\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "print('still running')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "still running"
    assert "parked_in_a_thread" in done.stderr and "Current thread" in done.stderr
