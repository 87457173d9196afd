"""CPU accounting for 64-client writes (issue #17): CPU seconds per write of every process and of the
leader's threads, for the grpc.aio floor, kraft unary ``TestAppend`` and kraft ``TestAppendStream``.

``bench.raft`` says *how fast*; this says *where the CPU goes*.  Per round and system, 64 closed-loop
clients (the same client and 256-byte record as ``bench.raft``) run a warm-up, then a fixed window over
which ``/proc/PID/stat`` (utime + stime) of the client process (this one), the floor server, the leader and
each follower, and ``/proc/PID/task/TID/stat`` of every thread of the leader, are read at both ends.  The
leader's Python threads are named from a ``py-spy dump`` when py-spy is available (``--py-spy PATH``),
gRPC's C threads by their ``comm``.  Also reported: Raft batches written by the leader in the window and
records per batch (from the leader's log segments after the run).

Systems alternate inside each round (floor, kraft, kraft_stream, ...), so machine load hits them alike;
run it under ``flock /tmp/kraft-bench.lock``.  Run: ``python -m bench.raft_cpu [--rounds 2] [--window 4]
[--set KEY=VALUE] [--out bench/results/raft-cpu.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.raft import THROUGHPUT_PROFILE, VALUE, KraftStreamWriter, KraftWriter
from bench.raft_floor import FloorServer
from kraft.client.channel import open_channel
from kraft.cluster.quorum import ControllerQuorum
from kraft.errors import ErrorCode
from kraft.procutil import reap_children_on_exit, spawn_child
from kraft.runtime import configure_grpc_io
from kraft.storage.batch import iter_batch_headers
from kraft.v1 import raft_pb2, raft_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "raft-cpu.json"
CLIENTS = 64
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(stat_path: Path) -> float:
    """utime + stime of a /proc stat file, in seconds (0 if the task is gone)."""
    try:
        text = stat_path.read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _sys_s(stat_path: Path) -> float:
    """stime alone (the kernel's share: syscalls, an inline fsync's journal work), in seconds."""
    try:
        text = stat_path.read_text()
    except OSError:
        return 0.0
    return int(text[text.rindex(")") + 2 :].split()[12]) / TICKS


def _threads(pid: int) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            comm = (task / "comm").read_text().strip()
            out[int(task.name)] = (comm, _cpu_s(task / "stat"))
    return out


def _switches(pid: int) -> dict[int, tuple[str, int]]:
    """Context switches (voluntary + involuntary) of every thread of ``pid`` so far, by thread id: each
    is a thread going to sleep or being woken — a cross-thread hand-off, a GIL wait, an fsync."""
    out: dict[int, tuple[str, int]] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                comm = (task / "comm").read_text().strip()
                fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines())
                count = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
                out[int(task.name)] = (comm, count)
    return out


def _python_thread_names(pid: int, py_spy: str | None) -> dict[int, str]:
    """Native thread id → Python thread name, from ``py-spy dump`` (empty without py-spy)."""
    if not py_spy:
        return {}
    try:
        dump = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {
        int(m.group(1)): m.group(2) for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', dump, re.M)
    }


def _label(tid: int, pid: int, comm: str, names: dict[int, str]) -> str:
    if tid == pid:
        return "main loop (MainThread)"
    name = names.get(tid)
    if name is None:
        return f"C: {comm}"
    if name == "grpc-intake":
        return "grpc intake loop"
    if name.startswith(("asyncio_", "uvloop_")):
        return "asyncio worker (fsync, to_thread)"
    return f"py: {name}"


async def _window(
    call: Callable[[int], Awaitable[None]],
    warmup_s: float,
    window_s: float,
    pids: dict[str, int],
    threaded: dict[str, int],
    profile: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """64 closed-loop clients; /proc counters read at the start and end of the window."""
    done = 0
    errors = 0
    stop = False

    async def worker(worker_id: int) -> None:
        nonlocal done, errors
        seq = worker_id << 32
        while not stop:
            seq += 1
            try:
                await call(seq)
            except Exception:
                errors += 1
                await asyncio.sleep(0.001)
                continue
            done += 1

    tasks = [asyncio.create_task(worker(i)) for i in range(CLIENTS)]
    try:
        await asyncio.sleep(warmup_s)
        before = {name: _cpu_s(Path(f"/proc/{pid}/stat")) for name, pid in pids.items()}
        sys_before = {name: _sys_s(Path(f"/proc/{pid}/stat")) for name, pid in pids.items()}
        threads_before = {name: _threads(pid) for name, pid in threaded.items()}
        switches_before = {name: _switches(pid) for name, pid in pids.items()}
        if profile is not None:
            profile()
        done_before, started = done, time.perf_counter()
        await asyncio.sleep(window_s)
        writes, elapsed = done - done_before, time.perf_counter() - started
        after = {name: _cpu_s(Path(f"/proc/{pid}/stat")) for name, pid in pids.items()}
        sys_after = {name: _sys_s(Path(f"/proc/{pid}/stat")) for name, pid in pids.items()}
        threads_after = {name: _threads(pid) for name, pid in threaded.items()}
        switches_after = {name: _switches(pid) for name, pid in pids.items()}
    finally:
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
    threads = {
        name: {
            tid: (comm, cpu - threads_before[name].get(tid, (comm, 0.0))[1])
            for tid, (comm, cpu) in threads_after[name].items()
        }
        for name in threaded
    }
    return {
        "writes": writes,
        "seconds": elapsed,
        "writes_per_s": writes / elapsed,
        "errors": errors,
        "cpu_s": {name: after[name] - before[name] for name in pids},
        "sys_s": {name: sys_after[name] - sys_before[name] for name in pids},
        "threads": threads,
        "switches": {
            name: {
                tid: (comm, count - switches_before[name].get(tid, (comm, 0))[1])
                for tid, (comm, count) in switches_after[name].items()
            }
            for name in pids
        },
    }


class ForwardingWriter:
    """What the 16-core design's intake processes would send the leader (raft-performance.md, "What would
    reach it on 16 cores"): ``streams`` long-lived ``TestAppendStream`` calls, one per modelled intake
    process; the clients' writes are spread over them, and every write that arrives while a stream's
    message is in flight goes in its next message, as the values of one ``TestAppendRequest`` (one
    message per intake loop turn).  Each client is answered when its message commits.  The leader then
    pays its per-message costs once per ``k`` writes — what this measures, before the design is built."""

    def __init__(self, target: str, cluster_id: str, streams: int) -> None:
        self._channel = open_channel(target)
        self._stub = raft_pb2_grpc.RaftTestServiceStub(self._channel)
        self._cluster_id = cluster_id
        self._count = streams
        self._pending: list[list[asyncio.Future[None]]] = [[] for _ in range(streams)]
        self._wake = [asyncio.Event() for _ in range(streams)]
        self._pumps: list[asyncio.Task[None]] = []
        self.messages = 0
        self.values = 0

    async def write_one(self, seq: int) -> None:
        if not self._pumps:
            self._pumps = [asyncio.create_task(self._pump(i)) for i in range(self._count)]
        index = (seq >> 32) % self._count  # closed_loop numbers each worker's calls from worker_id << 32
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[index].append(done)
        self._wake[index].set()
        await done

    async def _pump(self, index: int) -> None:
        stream = self._stub.TestAppendStream(None)
        try:
            while True:
                await self._wake[index].wait()
                self._wake[index].clear()
                batch, self._pending[index] = self._pending[index], []
                if not batch:
                    continue
                self.messages += 1
                self.values += len(batch)
                error: BaseException | None = None
                try:
                    await stream.write(
                        raft_pb2.TestAppendRequest(cluster_id=self._cluster_id, values=[VALUE] * len(batch))
                    )
                    response = await asyncio.wait_for(stream.read(), 5.0)
                    if (
                        not isinstance(response, raft_pb2.TestAppendResponse)
                        or response.error_code != ErrorCode.NONE
                    ):
                        error = RuntimeError("TestAppendStream failed")
                except (TimeoutError, grpc.RpcError) as exc:
                    error = exc
                for done in batch:
                    if not done.done():
                        if error is None:
                            done.set_result(None)
                        else:
                            done.set_exception(error)
                if error is not None:
                    stream.cancel()
                    stream = self._stub.TestAppendStream(None)
        finally:
            stream.cancel()

    async def close(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for pending in self._pending:
            for done in pending:
                done.cancel()
        await self._channel.close(grace=None)


def _child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a node's intake processes), by pid."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = (entry / "stat").read_text()
            if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
                children.append(int(entry.name))
    return sorted(children)


class SpreadWriter:
    """``connections`` writers, each on its own TCP connection (its own subchannel pool), worker ``w``
    on writer ``w % connections``: 64 clients as 64 processes would connect, which is what lets the
    kernel spread them over a controller's intake processes (``controller.intake.processes``)."""

    def __init__(self, make: Callable[[int], Any], connections: int) -> None:
        self._writers = [make(index) for index in range(connections)]

    async def write_one(self, seq: int) -> None:
        await self._writers[(seq >> 32) % len(self._writers)].write_one(seq)

    async def close(self) -> None:
        for writer in self._writers:
            await writer.close()


def _leader_log_batches(metadata_dir: Path, start: int, end: int) -> tuple[int, int]:
    """(batches, records) the leader's log holds with base offset in [start, end)."""
    batches = records = 0
    for segment in sorted(metadata_dir.rglob("*.log")):
        data = segment.read_bytes()
        with contextlib.suppress(Exception):  # a preallocated tail (zeros) ends the scan
            for _pos, header in iter_batch_headers(data):
                if header.size_in_bytes <= 0:
                    break
                if start <= header.base_offset < end and not header.is_control:
                    batches += 1
                    records += header.last_offset - header.base_offset + 1
    return batches, records


def measure(
    work_dir: Path,
    rounds: int,
    warmup_s: float,
    window_s: float,
    py_spy: str | None,
    only: list[str] | None = None,
    profile: str | None = None,
    forward_streams: tuple[int, ...] = (),
    connections: int = 1,
) -> dict[str, Any]:
    """``forward_streams``: also run :class:`ForwardingWriter` with each of these stream counts
    (``kraft_forwarded_N``).  ``profile`` = ``SYSTEM:PATH``: py-spy records the leader (Python stacks,
    collapsed, at PATH) in the first window of SYSTEM."""
    with contextlib.ExitStack() as stack:
        quorum = stack.enter_context(ControllerQuorum(work_dir / "kraft", overrides=THROUGHPUT_PROFILE))
        quorum.start()
        floor = stack.enter_context(FloorServer())
        leader_id = quorum.wait_for_leader(30).node_id
        procs = {node_id: node.process for node_id, node in quorum.nodes.items()}
        leader_process = procs[leader_id]
        assert leader_process is not None
        floor_process = floor._process  # the bench owns the floor server's process
        assert floor_process is not None
        pids = {"client": os.getpid(), "floor_server": floor_process.pid, "leader": leader_process.pid}
        for node_id, process in procs.items():
            if node_id != leader_id and process is not None:
                pids[f"follower_{node_id}"] = process.pid
        for node_id, process in procs.items():
            if process is not None:
                role = "leader" if node_id == leader_id else f"follower_{node_id}"
                for index, child in enumerate(_child_pids(process.pid)):
                    pids[f"{role}_intake_{index}"] = child
        # Followers too: their CPU per write is per fetch round (main loop, gRPC's poller, the kernel's
        # share of the inline fsync), and only their threads tell which (session 19).
        threaded = {
            name: pid
            for name, pid in pids.items()
            if name in ("leader", "floor_server") or name.startswith("follower")
        }
        target = quorum.nodes[leader_id].target
        profiled: list[subprocess.Popen[Any]] = []

        def start_profile(path: str) -> Callable[[], None]:
            def run() -> None:
                assert py_spy is not None
                command = [
                    py_spy,
                    "record",
                    "--nonblocking",
                    "--pid",
                    str(leader_process.pid),
                    "--rate",
                    "200",
                ]
                command += [
                    "--duration",
                    str(int(window_s)),
                    "--output",
                    path,
                    "--format",
                    "raw",
                ]
                with open(path + ".log", "wb") as errors:
                    profiled.append(spawn_child(command, stdout=errors, stderr=errors))

            return run

        async def run_all() -> dict[str, list[dict[str, Any]]]:
            spread = connections > 1
            writer = SpreadWriter(
                lambda _i: KraftWriter(target, quorum.cluster_id, own_connection=spread), connections
            )
            streamer = KraftStreamWriter(target, quorum.cluster_id)
            floor_writer = SpreadWriter(
                lambda _i: KraftWriter(floor.target, quorum.cluster_id, own_connection=spread), connections
            )
            forwarders = {n: ForwardingWriter(target, quorum.cluster_id, n) for n in forward_streams}
            systems: dict[str, Callable[[int], Awaitable[None]]] = {
                "floor": floor_writer.write_one,
                "kraft_unary": writer.write_one,
                "kraft_stream": streamer.write_one,
            }
            for n, modelled in forwarders.items():
                systems[f"kraft_forwarded_{n}"] = modelled.write_one
            if only:
                systems = {name: call for name, call in systems.items() if name in only}
            out: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
            try:
                for round_index in range(rounds):
                    for name, call in systems.items():
                        hook = None
                        if profile and round_index == 0 and profile.split(":", 1)[0] == name:
                            hook = start_profile(profile.split(":", 1)[1])
                        hw_before = quorum.describe(leader_id)
                        forwarder = (
                            forwarders.get(int(name.rsplit("_", 1)[1])) if "forwarded" in name else None
                        )
                        sent = (forwarder.messages, forwarder.values) if forwarder else (0, 0)
                        window = await _window(call, warmup_s, window_s, pids, threaded, hook)
                        if forwarder is not None:
                            messages = forwarder.messages - sent[0]
                            window["values_per_message"] = round(
                                (forwarder.values - sent[1]) / max(1, messages), 2
                            )
                        hw_after = quorum.describe(leader_id)
                        window["offsets"] = (
                            hw_before.high_watermark if hw_before else 0,
                            hw_after.high_watermark if hw_after else 0,
                        )
                        out[name].append(window)
            finally:
                await writer.close()
                await streamer.close()
                await floor_writer.close()
                for each in forwarders.values():
                    await each.close()
            return out

        names = {pid: _python_thread_names(pid, py_spy) for pid in threaded.values()}
        runs = asyncio.run(run_all())
        for process in profiled:
            process.wait(timeout=60)
        metadata_dir = quorum.nodes[leader_id].metadata_dir
        for name, windows in runs.items():
            for window in windows:
                start, end = window.pop("offsets")
                if name != "floor":
                    batches, records = _leader_log_batches(metadata_dir, start, end)
                    window["leader_batches"] = batches
                    window["records_per_batch"] = round(records / batches, 2) if batches else None
                window["switches"] = {
                    proc: {
                        (
                            f"{_label(tid, threaded[proc], comm, names[threaded[proc]])} [{tid}]"
                            if proc in threaded
                            else f"{comm} [{tid}]"
                        ): count
                        for tid, (comm, count) in switches.items()
                        if count > 0
                    }
                    for proc, switches in window["switches"].items()
                }
                window["threads"] = {
                    proc: {
                        f"{_label(tid, threaded[proc], comm, names[threaded[proc]])} [{tid}]": round(cpu, 3)
                        for tid, (comm, cpu) in sorted(threads.items(), key=lambda t: -t[1][1])
                        if cpu > 0
                    }
                    for proc, threads in window["threads"].items()
                }
    return _summarize(runs)


def _summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per system and window: CPU µs per write of each process and of each thread group (leader, floor)."""
    summary: dict[str, Any] = {}
    for name, windows in runs.items():
        rows = []
        for window in windows:
            writes = max(1, window["writes"])
            per_write = {proc: round(cpu / writes * 1e6, 1) for proc, cpu in window["cpu_s"].items()}
            kernel_per_write = {proc: round(cpu / writes * 1e6, 1) for proc, cpu in window["sys_s"].items()}
            thread_groups: dict[str, dict[str, float]] = {}
            for proc, threads in window["threads"].items():
                groups: dict[str, float] = {}
                for label, cpu in threads.items():
                    group = label.rsplit(" [", 1)[0]
                    groups[group] = groups.get(group, 0.0) + cpu
                thread_groups[proc] = {
                    group: round(cpu / writes * 1e6, 1)
                    for group, cpu in sorted(groups.items(), key=lambda g: -g[1])
                }
            switch_groups: dict[str, dict[str, float]] = {}
            for proc, switches in window["switches"].items():
                groups = {}
                for label, count in switches.items():
                    group = label.rsplit(" [", 1)[0]
                    groups[group] = groups.get(group, 0.0) + count
                switch_groups[proc] = {
                    group: round(count / writes, 2)
                    for group, count in sorted(groups.items(), key=lambda g: -g[1])
                }
            leader_cpu = sum(cpu for proc, cpu in window["cpu_s"].items() if proc.startswith("leader"))
            rows.append(
                {
                    "writes_per_s": round(window["writes_per_s"], 1),
                    "leader_with_intake_us_per_write": round(leader_cpu / writes * 1e6, 1),
                    "errors": window["errors"],
                    "cpu_us_per_write": per_write,
                    "kernel_us_per_write": kernel_per_write,
                    "cpu_us_per_write_all": round(sum(window["cpu_s"].values()) / writes * 1e6, 1),
                    "cpu_share_of_window": {
                        proc: round(cpu / window["seconds"], 3) for proc, cpu in window["cpu_s"].items()
                    },
                    "thread_groups_us_per_write": thread_groups,
                    "context_switches_per_write": {
                        proc: round(sum(groups.values()), 2) for proc, groups in switch_groups.items()
                    },
                    "leader_thread_switches_per_write": switch_groups.get("leader", {}),
                    "threads_cpu_s": window["threads"],
                    "leader_batches": window.get("leader_batches"),
                    "records_per_batch": window.get("records_per_batch"),
                    "values_per_message": window.get("values_per_message"),
                }
            )
        summary[name] = rows
    return summary


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.raft_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy binary to name threads")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--only", action="append", help="floor, kraft_unary, kraft_stream or kraft_forwarded_N (repeatable)"
    )
    parser.add_argument(
        "--forward-streams",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="also model N intake processes forwarding batched appends (kraft_forwarded_N; repeatable)",
    )
    parser.add_argument("--profile", help="SYSTEM:PATH — py-spy collapsed stacks of the leader, 1st window")
    parser.add_argument(
        "--connections",
        type=int,
        default=1,
        help="TCP connections the 64 unary clients (kraft and floor alike) spread over (default 1)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    for setting in args.set:
        key, sep, value = setting.partition("=")
        if not sep:
            parser.error(f"--set wants KEY=VALUE, got {setting!r}")
        THROUGHPUT_PROFILE[key] = value
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kraft-bench-raft-cpu-") as tmp:
        runs = measure(
            Path(tmp),
            args.rounds,
            args.warmup,
            args.window,
            args.py_spy,
            args.only,
            args.profile,
            tuple(args.forward_streams),
            args.connections,
        )
    result = {
        "benchmark": "raft-cpu",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
        },
        "clients": CLIENTS,
        "connections": args.connections,
        "window_s": args.window,
        "kraft_grpc_io": configure_grpc_io(dict(os.environ)),
        "kraft_config": THROUGHPUT_PROFILE,
        "systems": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, rows in runs.items():
        for row in rows:
            print(
                f"{name:<19} {row['writes_per_s']:>7.0f} w/s  µs/write {row['cpu_us_per_write']} "
                f"all={row['cpu_us_per_write_all']} leader+intake={row['leader_with_intake_us_per_write']} "
                f"batches={row['leader_batches']} "
                f"rpb={row['records_per_batch']} vpm={row['values_per_message']}"
            )
            print(f"              of it in the kernel, µs/write {row['kernel_us_per_write']}")
            print(f"              context switches per write {row['context_switches_per_write']}")
            print(f"              leader's threads, switches/write {row['leader_thread_switches_per_write']}")
            for proc, groups in row["thread_groups_us_per_write"].items():
                if sum(groups.values()) > 5:
                    print(f"              {proc} threads µs/write {groups}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
