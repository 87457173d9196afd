"""A lone CreateTopics' hops, traced: where one request's time goes, step by step (issue #17).

Session 14 traced the hops of a one-client, one-partition CreateTopics with temporary probes in a scratch
copy of the tree; this is that trace, committed and opt-in.  The probes are wrappers this module installs
on kraft's classes *in the node processes this benchmark starts* (each node runs as ``python -m
bench.create_trace node <kraft CLI args>``, which installs them and then runs the ``kraft`` CLI): nothing
in ``kraft/`` knows about them, so a node started any other way runs exactly the shipped code, at zero
cost.  Each probe appends ``(time.monotonic_ns(), name)`` to one list per process (CLOCK_MONOTONIC is the
same clock in every process on the host); a daemon thread writes new entries to
``$KRAFT_CREATE_TRACE_DIR/<pid>.trace`` every 0.2 s.

The benchmark starts one 3-controller quorum (``bench.controller``'s profile: the shipped Raft defaults,
fsync on), registers broker 1 and heartbeats it every 2 s (RF 1 needs an unfenced broker), runs an
optional ``--prefill`` (``bench.controller``'s 16-client admin part: thousands of topics), a 1 s warm-up,
then ``--seconds`` of back-to-back one-topic, one-partition, RF 1 CreateTopics on a bare stub to the
active controller, with the send and receive times taken in this process.  Per request (the first
``--skip`` dropped) it takes the probes that fall inside the request's own window and finds, in order,
the first probe of each step after the previous step (the followers' steps from the follower whose next
Fetch left first: the one whose Fetch commits), and reports the median and p90 over requests of each
step's own duration, plus the client's p50.  ``--rounds N`` repeats the window (and the table) N times
in one quorum.

Steps (L = the leader, F = that follower; a probe's name in brackets):

- client send -> L intake handler runs [``intake.in``: the unary handler's hop to the main loop starts]
- -> L servicer on the main loop [``svc.in``] -> the event starts [``event.in``]
- the logic [``logic.in`` .. ``logic.out``: ``ControllerLogic.create_topics``] -> records scheduled
  [``append``: ``RaftDriver.schedule_append`` returned] -> event end [``event.out``]
- -> L driver wakes and takes the output [``dispatch.Wakeup``] -> batch written [``write.AppendRecords``]
  -> parked Fetch answers resolved [``answer.FetchResponse``] -> L fsync handed over [``flush.in``]
- -> F driver has the records [``push.Response.FetchResponse``] -> appended [``write.AppendFetched``]
  -> F fdatasync [``fsync.in`` .. ``fsync.out``] -> F next Fetch sent [``send.FetchRequest``]
- -> that Fetch in L's driver queue [``push.Inbound.FetchRequest``] -> L high watermark [``hw``]
  -> hand-over to the listener [``commit_now.in`` .. ``commit_now.out``] -> the servicer returns
  [``svc.out``] -> the answer on the intake loop [``intake.out``] -> client has it.

Also recorded (not steps): L's own fsync on its thread, the driver parking (``park``), the listener
task's path (``commit.in``), so a later reader can add steps without new probes.

Per window each round also gives ``threads_ms_per_s``: for the leader and each follower, every thread's
ms per second running and runnable without a core (``/proc/PID/task/TID/schedstat``, summed by thread
name; the main thread as ``main``), and the table the main threads' two: on a busy host a step's time is
mostly that wait, not its code (session 19).

``--grpc-io iomgr|event-engine`` (session 19) starts the nodes on that gRPC I/O layer (``KRAFT_GRPC_IO``,
:mod:`kraft.runtime`; the result's ``nodes_grpc_io``), the benchmark's client staying on its own: the four
gRPC messages are most of a lone create's time, and iomgr's trade-off was measured before the intake thread.

Run (under ``flock /tmp/kraft-bench.lock``): ``python -m bench.create_trace [--prefill S] [--seconds S]
[--rounds N] [--skip N] [--set KEY=VALUE] [--grpc-io IO] [--json] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kraft.procutil import reap_children_on_exit

TRACE_DIR_ENV = "KRAFT_CREATE_TRACE_DIR"

# -------------------------------------------------------------------- the probes (in a node process)

_entries: list[tuple[int, str]] = []


def _mark(name: str) -> None:
    _entries.append((time.monotonic_ns(), name))


def _around(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with ``<name>.in`` / ``<name>.out`` marks around each call (awaited if a coroutine
    function)."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            _mark(f"{name}.in")
            try:
                return await function(*args, **kwargs)
            finally:
                _mark(f"{name}.out")

        return wrapped_async

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _mark(f"{name}.in")
        try:
            return function(*args, **kwargs)
        finally:
            _mark(f"{name}.out")

    return wrapped


def _after(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with one ``name`` mark when it returns (sync)."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        _mark(name)
        return result

    return wrapped


def _event_name(event: Any) -> str:
    kind = type(event).__name__.lstrip("_")
    inner = getattr(event, "request", None) or getattr(event, "response", None)
    return kind if inner is None else f"{kind}.{type(inner).__name__}"


PROBE_FLAG = "_create_trace_probe"  # set on every installed wrapper (tests/unit/test_bench_create_trace.py)


def _install(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    setattr(wrapper, PROBE_FLAG, True)
    setattr(owner, name, wrapper)


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    _install(owner, name, make(getattr(owner, name)))


def install_probes() -> None:
    """Wrap the classes a lone CreateTopics passes through (see the module docstring's steps).  Must run
    before the node builds its driver: the driver binds its ports (``_apply_log_op``, ``_deliver``, ...)
    when it is constructed."""
    from kraft.metadata import controller as controller_module
    from kraft.metadata import controller_logic, controller_writes, service
    from kraft.node import intake
    from kraft.raft import driver as driver_module
    from kraft.raft import storage_adapters
    from kraft.raft.core_output import AppendFetched, AppendRecords, OutboundRequest

    _wrap(intake, "_hop_answer", lambda f: _around("intake", f))
    _wrap(service.ControllerServicer, "_call", lambda f: _around("svc", f))
    _wrap(controller_writes.WritePath, "_run_event", lambda f: _around("event", f))
    _wrap(controller_logic.ControllerLogic, "create_topics", lambda f: _around("logic", f))
    quorum_controller = controller_module.QuorumController
    _wrap(quorum_controller, "handle_commit_now", lambda f: _around("commit_now", f))
    _wrap(quorum_controller, "handle_commit", lambda f: _around("commit", f))
    _wrap(storage_adapters.SegmentedLogStore, "flush", lambda f: _around("fsync", f))
    driver = driver_module.RaftDriver
    _wrap(driver, "schedule_append", lambda f: _after("append", f))
    _wrap(driver, "_flush", lambda f: _around("flush", f))
    original_push = driver._push
    original_dispatch = driver._dispatch
    original_write = driver._apply_log_op
    original_deliver = driver._deliver
    original_hw = driver._on_high_watermark
    original_sleep = driver._sleep_until_deadline

    def push(self: Any, event: Any) -> None:
        _mark(f"push.{_event_name(event)}")
        original_push(self, event)

    def dispatch(self: Any, event: Any, now_ms: int) -> Any:
        _mark(f"dispatch.{_event_name(event)}")
        return original_dispatch(self, event, now_ms)

    async def write(self: Any, op: Any) -> None:
        await original_write(self, op)
        if isinstance(op, (AppendRecords, AppendFetched)):
            _mark(f"write.{type(op).__name__}")

    def deliver(self: Any, message: Any) -> None:
        if isinstance(message, OutboundRequest):
            _mark(f"send.{type(message.request).__name__}")
        original_deliver(self, message)
        if not isinstance(message, OutboundRequest):
            _mark(f"answer.{type(message.response).__name__}")

    def high_watermark(self: Any, offset: int) -> None:
        _mark("hw")
        original_hw(self, offset)

    async def sleep(self: Any) -> bool:
        _mark("park")
        return bool(await original_sleep(self))

    for name, wrapper in (
        ("_push", push),
        ("_dispatch", dispatch),
        ("_apply_log_op", write),
        ("_deliver", deliver),
        ("_on_high_watermark", high_watermark),
        ("_sleep_until_deadline", sleep),
    ):
        _install(driver, name, wrapper)


def _start_writer(directory: Path) -> None:
    path = directory / f"{os.getpid()}.trace"

    def write_forever() -> None:
        written = 0
        while True:
            time.sleep(0.2)
            end = len(_entries)
            if end > written:
                with path.open("a") as out:
                    out.writelines(f"{ns} {name}\n" for ns, name in _entries[written:end])
                written = end

    threading.Thread(target=write_forever, name="create-trace-writer", daemon=True).start()


def run_node(argv: Sequence[str]) -> int:
    """A node with the probes: ``python -m bench.create_trace node controller start --config F``."""
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        raise SystemExit(f"{TRACE_DIR_ENV} is not set: the traced node has nowhere to write")
    install_probes()
    _start_writer(Path(directory))
    from kraft.cli.main import run

    return run(list(argv))


# -------------------------------------------------------------------- the analysis (in the benchmark)

# (role, probe) in the request's order; role L = the leader, F = the committing follower, C = the client.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("C", "send", "client send"),
    ("L", "intake.in", "-> L intake handler runs (gRPC in: client, C core, poller, intake loop)"),
    ("L", "svc.in", "-> L servicer on the main loop (the hop)"),
    ("L", "event.in", "-> the event starts (guard, shell, event queue)"),
    ("L", "logic.in", "-> the logic starts"),
    ("L", "logic.out", "the logic (create_topics)"),
    ("L", "append", "-> records scheduled (WritePath.append, schedule_append)"),
    ("L", "event.out", "-> event end"),
    ("L", "dispatch.Wakeup", "-> L driver wakes, takes the output"),
    ("L", "write.AppendRecords", "-> batch cut, built, written"),
    ("L", "answer.FetchResponse", "-> a parked Fetch answered"),
    ("L", "flush.in", "-> L flush starts (the output's rest)"),
    ("F", "push.Response.FetchResponse", "-> F driver has the answer (L gRPC out, F gRPC in)"),
    ("F", "write.AppendFetched", "-> F records appended"),
    ("F", "fsync.in", "-> F fdatasync starts"),
    ("F", "fsync.out", "F fdatasync"),
    ("F", "send.FetchRequest", "-> F next Fetch sent"),
    ("L", "push.Inbound.FetchRequest", "-> that Fetch in L's driver queue (F gRPC out, L gRPC in, hop)"),
    ("L", "hw", "-> L high watermark"),
    ("L", "commit_now.in", "-> hand-over to the listener starts"),
    ("L", "commit_now.out", "hand-over (image installed, waiters resolved)"),
    ("L", "svc.out", "-> the request's task resumes, the servicer returns"),
    ("L", "intake.out", "-> the answer on the intake loop (the hop back)"),
    ("C", "recv", "-> client has the answer (gRPC out)"),
)


def read_traces(directory: Path) -> dict[int, tuple[list[int], list[str]]]:
    """pid -> (times, names), sorted by time."""
    traces: dict[int, tuple[list[int], list[str]]] = {}
    for path in directory.glob("*.trace"):
        entries: list[tuple[int, str]] = []
        # The nodes still run (and their writers write): a last line without its newline is partial.
        for line in path.read_text().split("\n")[:-1]:
            ns, _, name = line.partition(" ")
            entries.append((int(ns), name))
        entries.sort()
        traces[int(path.stem)] = ([ns for ns, _ in entries], [name for _, name in entries])
    return traces


def _first(
    trace: tuple[list[int], list[str]], name: str, after: int, before: int, start: int
) -> tuple[int, int]:
    """(time, index) of the first ``name`` in ``trace`` at or after ``after`` and before ``before``,
    scanning from index ``start``; (-1, start) if none."""
    times, names = trace
    index = start
    while index < len(times) and times[index] < after:
        index += 1
    while index < len(times) and times[index] < before:
        if names[index] == name:
            return times[index], index
        index += 1
    return -1, start


def analyse(
    requests: list[tuple[int, int]], traces: dict[int, tuple[list[int], list[str]]], leader_pid: int
) -> dict[str, Any]:
    """Per request, each step's own duration (µs); steps not found leave the request out of the table."""
    leader = traces[leader_pid]
    followers = [trace for pid, trace in traces.items() if pid != leader_pid]
    follower_steps = [i for i, step in enumerate(STEPS) if step[0] == "F"]
    first_f, last_f = follower_steps[0], follower_steps[-1]
    durations: list[list[float]] = [[] for _ in STEPS[1:]]
    incomplete = 0
    for sent, received in requests:
        times = [sent]
        position = {id(leader): 0, **{id(f): 0 for f in followers}}
        ok = True
        index = 1
        while index < len(STEPS) - 1:
            if index == first_f:
                # the follower whose next Fetch left first
                best: list[int] | None = None
                for trace in followers:
                    at, start = times[-1], 0
                    chain: list[int] = []
                    for _role, probe, _label in STEPS[first_f : last_f + 1]:
                        at, start = _first(trace, probe, at, received, start)
                        if at < 0:
                            break
                        chain.append(at)
                    if at >= 0 and (best is None or chain[-1] < best[-1]):
                        best = chain
                if best is None:
                    ok = False
                    break
                times.extend(best)
                index = last_f + 1
                continue
            at, position[id(leader)] = _first(
                leader, STEPS[index][1], times[-1], received, position[id(leader)]
            )
            if at < 0:
                ok = False
                break
            times.append(at)
            index += 1
        if not ok:
            incomplete += 1
            continue
        times.append(received)
        for step, (earlier, later) in enumerate(itertools.pairwise(times)):
            durations[step].append((later - earlier) / 1000)
    rows: list[dict[str, Any]] = []
    for (_role, probe, label), values in zip(STEPS[1:], durations, strict=True):
        if values:
            ordered = sorted(values)
            rows.append(
                {
                    "step": label,
                    "probe": probe,
                    "p50_us": round(statistics.median(ordered), 1),
                    "p90_us": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
                }
            )
    latencies = sorted((received - sent) / 1e6 for sent, received in requests)
    return {
        "requests": len(requests),
        "traced": len(requests) - incomplete,
        "client_p50_ms": round(statistics.median(latencies), 3) if latencies else None,
        "sum_of_step_p50s_us": round(sum(row["p50_us"] for row in rows), 1),
        "steps": rows,
    }


# -------------------------------------------------------------------- the benchmark


async def _one_client(target: str, cluster_id: str, seconds: float, prefix: str) -> list[tuple[int, int]]:
    from kraft.client.channel import open_channel
    from kraft.errors import ErrorCode
    from kraft.v1 import controller_pb2 as cpb
    from kraft.v1 import controller_pb2_grpc

    channel = open_channel(target)
    stub = controller_pb2_grpc.ControllerServiceStub(channel)
    requests: list[tuple[int, int]] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            topic = cpb.CreatableTopic(
                name=f"{prefix}-{len(requests)}", num_partitions=1, replication_factor=1
            )
            request = cpb.CreateTopicsRequest(cluster_id=cluster_id, topics=[topic])
            sent = time.monotonic_ns()
            response = await stub.CreateTopics(request, timeout=30)
            requests.append((sent, time.monotonic_ns()))
            if response.error_code != ErrorCode.NONE or response.topics[0].error_code != ErrorCode.NONE:
                raise RuntimeError(f"CreateTopics failed: {response}")
    finally:
        await channel.close(grace=None)
    return requests


ThreadTimes = dict[tuple[str, str], tuple[int, int]]
"""(process role, thread name) -> (ns run on a core, ns runnable without one), summed over that name's
threads (``/proc/PID/task/TID/schedstat``); a process's main thread is named ``main``."""


def thread_times(roles: dict[int, str]) -> ThreadTimes:
    """Every thread of the processes ``roles`` names (pid -> role) as :data:`ThreadTimes`; a thread or
    process gone meanwhile is left out."""
    times: ThreadTimes = {}
    for pid, role in roles.items():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                    name = "main" if int(tid) == pid else comm.read().strip()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                    run_ns, wait_ns = run_and_wait(stat.read())
            except (OSError, ValueError):
                continue
            before = times.get((role, name), (0, 0))
            times[(role, name)] = (before[0] + run_ns, before[1] + wait_ns)
    return times


def run_and_wait(schedstat: str) -> tuple[int, int]:
    """A ``schedstat`` line's ns run on a core and ns runnable without one (its third field, the
    number of time slices, is not kept)."""
    run_ns, wait_ns, _slices = schedstat.split()
    return int(run_ns), int(wait_ns)


def cores_used(before: ThreadTimes, after: ThreadTimes, seconds: float) -> dict[str, dict[str, list[float]]]:
    """Per role and thread name, ``[ms run, ms waiting for a core]`` per second between two
    :func:`thread_times` (threads in both only; below 1 ms/s of either left out): on a busy host a lone
    create's steps are mostly that wait (raft-performance.md, session 19, "Who waits for a core")."""
    used: dict[str, dict[str, list[float]]] = {}
    for key, (run_ns, wait_ns) in after.items():
        if key not in before:
            continue
        run = (run_ns - before[key][0]) / 1e6 / seconds
        wait = (wait_ns - before[key][1]) / 1e6 / seconds
        if run >= 1.0 or wait >= 1.0:
            used.setdefault(key[0], {})[key[1]] = [round(run, 1), round(wait, 1)]
    return used


async def _measure(
    quorum: Any, prefill_s: float, seconds: float, rounds: int
) -> tuple[int, list[list[tuple[int, int]]], dict[str, Any], list[dict[str, dict[str, list[float]]]]]:
    from bench.controller import admin_ops
    from bench.controller_fleet import Fleet
    from kraft.client.admin import AdminClient
    from kraft.clock import SystemClock

    leader = quorum.nodes[quorum.wait_for_leader(timeout_s=60).node_id]
    targets = [node.target for node in quorum.nodes.values()]
    prefill: dict[str, Any] = {}
    windows: list[list[tuple[int, int]]] = []
    cores: list[dict[str, dict[str, list[float]]]] = []
    roles = {
        int(node.pid): "leader" if node is leader else f"follower-{node_id}"
        for node_id, node in quorum.nodes.items()
    }
    async with AdminClient(targets, timeout_s=30, clock=SystemClock()) as client:
        beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
        fleet = Fleet(client, beats, quorum.cluster_id, interval_s=2.0)
        await fleet.register(1)
        heartbeats = asyncio.create_task(fleet.run_one(1, 0.0))
        try:
            if prefill_s > 0:
                prefill = await admin_ops(client, prefill_s, workers=16, prefix="prefill")
            await admin_ops(client, 1.0, workers=1, prefix="warm")
            for index in range(rounds):
                before, started = thread_times(roles), time.monotonic()
                windows.append(await _one_client(leader.target, quorum.cluster_id, seconds, f"trace{index}"))
                cores.append(cores_used(before, thread_times(roles), time.monotonic() - started))
        finally:
            fleet.stopped.add(1)
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
            await fleet.close_streams()
            await beats.close()
    return int(leader.pid), windows, prefill, cores


@contextlib.contextmanager
def nodes_grpc_io(grpc_io: str | None) -> Iterator[None]:
    """While in it, ``os.environ`` is what the nodes start with for ``KRAFT_GRPC_IO=grpc_io``
    (``GRPC_EXPERIMENTS`` set as the ``kraft`` command sets it: a traced node imports grpc before the
    command would); None changes nothing.  This process's own variables are restored on exit, so the
    benchmark's client stays on gRPC's defaults (it imports grpc after the nodes started)."""
    if grpc_io is None:
        yield
        return
    from kraft.runtime import GRPC_EXPERIMENTS_ENV, GRPC_IO_ENV, configure_grpc_io

    saved = {name: os.environ.get(name) for name in (GRPC_IO_ENV, GRPC_EXPERIMENTS_ENV)}
    os.environ[GRPC_IO_ENV] = grpc_io
    configure_grpc_io(os.environ)  # (the mapping form: edits the variables, not this process's choice)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run(
    prefill_s: float,
    seconds: float,
    rounds: int,
    skip: int,
    overrides: dict[str, str],
    grpc_io: str | None = None,
) -> dict[str, Any]:
    from bench.controller import PROFILE
    from kraft.cluster import quorum as quorum_module

    load_before = os.getloadavg()
    settings = {**PROFILE, **overrides}
    with tempfile.TemporaryDirectory(prefix="kraft-bench-create-trace-") as tmp:
        trace_dir = Path(tmp) / "trace"
        trace_dir.mkdir()
        os.environ[TRACE_DIR_ENV] = str(trace_dir)
        # The nodes start through this module (probes installed), and only in this process.
        quorum_module.KRAFT_COMMAND = [sys.executable, "-m", "bench.create_trace", "node"]
        with quorum_module.ControllerQuorum(
            Path(tmp) / "metadata", overrides=settings, test_append=False
        ) as quorum:
            with nodes_grpc_io(grpc_io):
                quorum.start()
            leader_pid, windows, prefill, cores = asyncio.run(_measure(quorum, prefill_s, seconds, rounds))
            time.sleep(0.6)  # the nodes' writer threads write every 0.2 s
            traces = read_traces(trace_dir)
    if leader_pid not in traces:
        raise RuntimeError(f"no trace from the leader (pid {leader_pid}): were the probes installed?")
    result: dict[str, Any] = {
        "rounds": [
            {**analyse(window[skip:], traces, leader_pid), "threads_ms_per_s": used}
            for window, used in zip(windows, cores, strict=True)
        ],
        "prefill": prefill,
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "overrides": overrides,
        "nodes_grpc_io": grpc_io or "inherited",
    }
    return result


def _table(result: dict[str, Any]) -> str:
    rounds = result["rounds"]
    header = "| step (p50 µs of each request's own step) | " + " | ".join(
        f"round {i + 1}" for i in range(len(rounds))
    )
    lines = [header + " |", "|---|" + "---|" * len(rounds)]
    labels = [row["step"] for row in rounds[0]["steps"]] if rounds else []
    for position, label in enumerate(labels):
        cells = []
        for one in rounds:
            row = one["steps"][position] if position < len(one["steps"]) else None
            cells.append("" if row is None else f"{row['p50_us']:.0f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| sum of the step p50s (µs) | "
        + " | ".join(f"{r['sum_of_step_p50s_us']:.0f}" for r in rounds)
        + " |"
    )
    lines.append("| client p50 (ms) | " + " | ".join(f"{r['client_p50_ms']}" for r in rounds) + " |")
    lines.append(
        "| requests traced / in the window | "
        + " | ".join(f"{r['traced']} / {r['requests']}" for r in rounds)
        + " |"
    )
    roles = sorted({role for r in rounds for role in r.get("threads_ms_per_s", {})})
    for role in roles:
        cells = []
        for r in rounds:
            main = r.get("threads_ms_per_s", {}).get(role, {}).get("main")
            cells.append("" if main is None else f"{main[0]:.0f} / {main[1]:.0f}")
        lines.append(f"| {role} main thread, ms/s running / waiting for a core | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node outlives the benchmark (kraft.procutil); a traced node's too
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["node"]:
        return run_node(args_in[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.create_trace", description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=float, default=0.0, metavar="S", help="16-client prefill first (s)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each traced window (default 4)")
    parser.add_argument("--rounds", type=int, default=1, help="traced windows in one quorum (default 1)")
    parser.add_argument("--skip", type=int, default=50, help="requests dropped at each window's start (50)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument(
        "--grpc-io",
        choices=("event-engine", "iomgr"),
        help="the nodes' gRPC I/O layer (KRAFT_GRPC_IO; default: as this environment says); not the client's",
    )
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    args = parser.parse_args(args_in)
    overrides: dict[str, str] = {}
    for setting in args.set:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=VALUE, got {setting!r}")
        overrides[key] = value
    started = time.time()
    result = run(args.prefill, args.seconds, args.rounds, args.skip, overrides, args.grpc_io)
    result["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    result["prefill_s"] = args.prefill
    if args.json:
        print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(_table(result))
    load = f"{result['load_average_before']}->{result['load_average_after']}"
    print(f"load={load}  took={time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
