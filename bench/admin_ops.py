"""Just ``bench.controller``'s admin phases, alternated across trees and settings (issue #17, session 9).

``python -m bench.controller`` measures 16-client CreateTopics ops/s (``admin_ops``) and the one-client
latency (``admin_ops_one_client``) on a fresh 3-controller quorum before its long bulk phases; on this
2-core host one run says little (the 16-client number scattered 563-874 ops/s over three runs of one
tree).  This runs only those two phases, the same way (a fresh quorum with the same profile, broker 1
registered and heartbeating every 2 s, 16 workers then one, one topic of one partition RF 1 per
CreateTopics, each answered after its commit), once per *variant* per round, the variants' order flipped
every round, each run in a child process of its own so that a variant may be another checkout of kraft
(``@TREE``: the child runs with ``PYTHONPATH=TREE`` and that tree's quorum code).  Per run it also reads
each process's CPU (``/proc/PID/stat`` utime+stime) over the 16-client window: CPU per op of the active
controller, the two followers and the client.

A variant is ``LABEL[@TREE][:KEY=VALUE[,KEY=VALUE...]]`` (controller config overrides), e.g.::

    python -m bench.admin_ops --rounds 3 --variant on --variant off:controller.raft.fetch.on.intake=false
    python -m bench.admin_ops --variant old@/tmp/s9/wt-old --variant new

The driver (this tree) runs a CPU-speed probe beside it all (:mod:`bench.cpu_probe`; off with
``--no-cpu-probe``): every run (or, with ``--interleave``, every window) gains ``speed_factor``, the host's
CPU speed during it against the probe's reference (1.7 = the same CPU work took 1.7x as long), and the
document a ``cpu_probe`` report.

Run it under ``flock /tmp/kraft-bench.lock``; ~35 s per run with the default 10 s windows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# In a child running an older tree (before session 8 / 10) these do not exist: only the driver uses them.
with contextlib.suppress(ImportError):
    from bench.cpu_probe import CpuProbe
    from kraft.procutil import reap_children_on_exit, run_child

REPO_ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 300.0
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


# ------------------------------------------------------------------------------------------- the child


def log_batches(metadata_dir: Path, start_ms: float, end_ms: float) -> dict[str, Any]:
    """The leader's data batches written in [start_ms, end_ms) (by batch timestamp): how many, and
    records per batch -- fewer, bigger batches mean fewer Raft round trips per op."""
    from kraft.storage.batch import decode_batch
    from kraft.storage.errors import CorruptRecordError

    count = records = 0
    for segment in sorted(metadata_dir.rglob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos < len(data):
            try:
                batch, pos = decode_batch(data, pos)
            except CorruptRecordError:  # the active segment's preallocated (zeroed) tail
                break
            if not batch.is_control and start_ms <= batch.base_timestamp < end_ms:
                count += 1
                records += len(batch.records)
    return {"batches": count, "records_per_batch": round(records / max(1, count), 2)}


async def _measure(quorum: Any, seconds: float) -> dict[str, Any]:
    # Imported here: the child runs against the tree it is given (PYTHONPATH), never this one's.
    from bench.controller import admin_ops
    from bench.controller_fleet import Fleet
    from kraft.client.admin import AdminClient
    from kraft.clock import SystemClock

    leader_id = quorum.wait_for_leader(timeout_s=60).node_id
    targets = [node.target for node in quorum.nodes.values()]
    async with AdminClient(targets, timeout_s=300, clock=SystemClock()) as client:
        beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
        fleet = Fleet(client, beats, quorum.cluster_id, interval_s=2.0)
        await fleet.register(1)
        heartbeats = asyncio.create_task(fleet.run_one(1, 0.0))
        try:
            pids = {f"node{node_id}": node.process.pid for node_id, node in quorum.nodes.items()}
            pids["client"] = os.getpid()
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            window_start_ms = time.time() * 1000
            many = await admin_ops(client, seconds)
            window_end_ms = time.time() * 1000
            after = {name: cpu_seconds(pid) for name, pid in pids.items()}
            batches = log_batches(quorum.nodes[leader_id].metadata_dir, window_start_ms, window_end_ms)
            one = await admin_ops(client, seconds, workers=1, prefix="admin-one")
            if quorum.wait_for_leader(timeout_s=10).node_id != leader_id:
                raise RuntimeError("the Raft leader changed during the run: not comparable")
        finally:
            fleet.stopped.add(1)
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
            await fleet.close_streams()
            await beats.close()
    ops = max(1, many["ops"])
    cpu_us = {name: (after[name] - before[name]) * 1e6 / ops for name in pids}
    roles = {
        "leader": cpu_us[f"node{leader_id}"],
        "followers": sorted(cpu_us[f"node{n}"] for n in quorum.nodes if n != leader_id),
        "client": cpu_us["client"],
    }
    return {
        "admin_ops": many,
        "admin_ops_one_client": one,
        "cpu_us_per_op_16_clients": {
            "leader": round(roles["leader"]),
            "followers": [round(v) for v in roles["followers"]],
            "client": round(roles["client"]),
        },
        "raft_batches_16_clients": batches,
        "heartbeat_errors": fleet.errors,
    }


def child_run(seconds: float, overrides: dict[str, str]) -> dict[str, Any]:
    from bench.controller import PROFILE
    from kraft.cluster.quorum import ControllerQuorum

    with (
        tempfile.TemporaryDirectory(prefix="kraft-bench-admin-ops-") as tmp,
        ControllerQuorum(Path(tmp), overrides={**PROFILE, **overrides}, test_append=False) as quorum,
    ):
        quorum.start()
        return asyncio.run(_measure(quorum, seconds))


def child_main(argv: list[str]) -> int:
    seconds = float(argv[0])
    overrides: dict[str, str] = json.loads(argv[1])
    print(json.dumps(child_run(seconds, overrides)))
    return 0


# ------------------------------------------------------------------------------------ interleaved mode


class _Live:
    """A variant's quorum, running for the whole interleaved run, with its client and broker 1."""

    def __init__(self, variant: Variant, base: Path) -> None:
        import kraft.cluster.quorum as quorum_module
        from bench.controller import PROFILE

        self.variant = variant
        self.quorum = quorum_module.ControllerQuorum(
            base, overrides={**PROFILE, **variant.overrides}, test_append=False
        )
        # The nodes run the variant's tree: its root is their cwd (``-m kraft.cli.main`` imports from
        # there first) and their PYTHONPATH; the quorum's files are the same in every tree measured.
        saved_root, saved_path = quorum_module.REPO_ROOT, os.environ.get("PYTHONPATH")
        quorum_module.REPO_ROOT = variant.tree
        os.environ["PYTHONPATH"] = str(variant.tree)
        try:
            self.quorum.start()
        finally:
            quorum_module.REPO_ROOT = saved_root
            if saved_path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved_path
        self.leader_id = -1

    async def open(self) -> None:
        from bench.controller_fleet import Fleet
        from kraft.client.admin import AdminClient
        from kraft.clock import SystemClock

        targets = [node.target for node in self.quorum.nodes.values()]
        self.client = AdminClient(targets, timeout_s=300, clock=SystemClock())
        self.beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
        self.fleet = Fleet(self.client, self.beats, self.quorum.cluster_id, interval_s=2.0)
        await self.fleet.register(1)
        self.heartbeats = asyncio.create_task(self.fleet.run_one(1, 0.0))

    async def close(self) -> None:
        self.fleet.stopped.add(1)
        self.heartbeats.cancel()
        await asyncio.gather(self.heartbeats, return_exceptions=True)
        await self.fleet.close_streams()
        await self.beats.close()
        await self.client.close()

    async def window(self, seconds: float, workers: int, prefix: str) -> dict[str, Any]:
        from bench.controller import admin_ops

        pids = {f"node{node_id}": node.pid or 0 for node_id, node in self.quorum.nodes.items()}
        pids["client"] = os.getpid()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        start_ms = time.time() * 1000
        result = await admin_ops(self.client, seconds, workers=workers, prefix=prefix)
        end_ms = time.time() * 1000
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        if self.quorum.wait_for_leader(timeout_s=10).node_id != self.leader_id:
            raise RuntimeError(f"{self.variant.label}: the Raft leader changed: not comparable")
        ops = max(1, result["ops"])
        cpu = {name: (after[name] - before[name]) * 1e6 / ops for name in pids}
        result["cpu_us_per_op"] = {
            "leader": round(cpu[f"node{self.leader_id}"]),
            "followers": sorted(round(cpu[f"node{n}"]) for n in self.quorum.nodes if n != self.leader_id),
            "client": round(cpu["client"]),
        }
        result["raft"] = log_batches(self.quorum.nodes[self.leader_id].metadata_dir, start_ms, end_ms)
        result["load_average"] = [round(v, 2) for v in os.getloadavg()]
        return result


async def _interleave(lives: list[_Live], rounds: int, seconds: float, probe: CpuProbe) -> dict[str, Any]:
    for live in lives:
        await live.open()
    try:
        for live in lives:  # warm-up: channels, the client's active controller
            await live.window(1.0, 16, f"warm-{live.variant.label}")
        windows: dict[str, dict[str, list[dict[str, Any]]]] = {
            live.variant.label: {"admin_ops": [], "admin_ops_one_client": []} for live in lives
        }
        for workers, part in ((16, "admin_ops"), (1, "admin_ops_one_client")):
            for index in range(rounds):
                order = lives if index % 2 == 0 else list(reversed(lives))
                for live in order:
                    label = live.variant.label
                    with probe.phase(f"{part}-{index}-{label}"):
                        result = await live.window(seconds, workers, f"{part}-{index}-{label}")
                    windows[label][part].append(result)
                    raft = result["raft"]
                    print(
                        f"part={part} round={index} variant={label} ops_per_s={result['ops_per_second']} "
                        f"p50_ms={result['p50_ms']} p99_ms={result['p99_ms']} "
                        f"cpu_us_per_op={result['cpu_us_per_op']} batches={raft['batches']} "
                        f"records_per_batch={raft['records_per_batch']} load={result['load_average']}",
                        flush=True,
                    )
        return windows
    finally:
        for live in lives:
            await live.close()


def interleaved(
    variants: list[Variant], rounds: int, seconds: float, cpu_probe: bool = True
) -> dict[str, Any]:
    probe = CpuProbe()  # never started without cpu_probe: the windows are marked on it all the same
    with tempfile.TemporaryDirectory(prefix="kraft-bench-admin-ops-") as tmp, contextlib.ExitStack() as stack:
        stack.callback(probe.stop)
        lives = []
        for variant in variants:
            live = _Live(variant, Path(tmp) / variant.label)
            stack.enter_context(live.quorum)
            lives.append(live)
        # Only once every node is started: a node forked (kraft.procutil forks for its preexec_fn) while
        # this process has gRPC running once aborted at start (epoll_wait: bad file descriptor).
        for live in lives:
            live.leader_id = live.quorum.wait_for_leader(timeout_s=60).node_id
        if cpu_probe:
            probe.start()
        windows = asyncio.run(_interleave(lives, rounds, seconds, probe))
    report = probe.report() if cpu_probe else None
    if report is not None:
        for label, parts in windows.items():
            for part, results in parts.items():
                for index, result in enumerate(results):
                    result["speed_factor"] = report["phases"][f"{part}-{index}-{label}"]["speed_factor"]
    summary: dict[str, Any] = {}
    for label, parts in windows.items():
        many, one = parts["admin_ops"], parts["admin_ops_one_client"]
        summary[label] = {
            "ops_per_second": [w["ops_per_second"] for w in many],
            "ops_per_second_median": round(statistics.median(w["ops_per_second"] for w in many), 1),
            "leader_cpu_us_per_op_median": round(
                statistics.median(w["cpu_us_per_op"]["leader"] for w in many)
            ),
            "records_per_batch_median": round(
                statistics.median(w["raft"]["records_per_batch"] for w in many), 2
            ),
            "one_client_p50_ms": [w["p50_ms"] for w in one],
            "one_client_p50_ms_median": round(statistics.median(w["p50_ms"] for w in one), 2),
        }
        if report is not None:
            summary[label]["speed_factor"] = [w["speed_factor"] for w in many]
            summary[label]["one_client_speed_factor"] = [w["speed_factor"] for w in one]
    document: dict[str, Any] = {"windows": windows, "summary": summary}
    if report is not None:
        document["cpu_probe"] = report
    return document


# ------------------------------------------------------------------------------------------ the driver


@dataclass(frozen=True)
class Variant:
    label: str
    tree: Path
    overrides: dict[str, str]

    @staticmethod
    def parse(text: str) -> Variant:
        head, _, settings = text.partition(":")
        label, _, tree = head.partition("@")
        if not label:
            raise ValueError(f"a variant needs a label: {text!r}")
        overrides: dict[str, str] = {}
        for setting in filter(None, settings.split(",")):
            key, sep, value = setting.partition("=")
            if not sep or not key:
                raise ValueError(f"KEY=VALUE expected, got {setting!r} in {text!r}")
            overrides[key] = value
        return Variant(label, Path(tree).resolve() if tree else REPO_ROOT, overrides)


# Loads this file by path in the child, so a tree without bench/admin_ops.py (an older commit) can be
# measured; the child's cwd and PYTHONPATH are that tree's, so every other import is the tree's.
_CHILD_CODE = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('bench_admin_ops_child', sys.argv[1])\n"
    "module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "sys.exit(module.child_main(sys.argv[2:]))\n"
)


def run_variant(variant: Variant, seconds: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(variant.tree)}
    load = [round(v, 2) for v in os.getloadavg()]
    started = time.time()
    done = run_child(
        [
            sys.executable,
            "-c",
            _CHILD_CODE,
            str(Path(__file__).resolve()),
            str(seconds),
            json.dumps(variant.overrides),
        ],
        cwd=variant.tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant.label} failed ({done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_average_before"] = load
    result["took_s"] = round(time.time() - started, 1)
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ops = [r["admin_ops"]["ops_per_second"] for r in runs]
    one = [r["admin_ops_one_client"]["p50_ms"] for r in runs]
    leader = [r["cpu_us_per_op_16_clients"]["leader"] for r in runs]
    speed = (
        {"speed_factor": [r["speed_factor"] for r in runs]} if all("speed_factor" in r for r in runs) else {}
    )
    return {
        **speed,
        "ops_per_second": ops,
        "ops_per_second_median": round(statistics.median(ops), 1),
        "one_client_p50_ms": one,
        "one_client_p50_ms_median": round(statistics.median(one), 2),
        "leader_cpu_us_per_op_median": round(statistics.median(leader)),
    }


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.admin_ops", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[], help="LABEL[@TREE][:KEY=VALUE,...]")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every variant (default 3)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="each phase's window (default 10, as bench.controller)"
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="every variant's quorum up at once in this process, windows alternated (after one warm-up "
        "window each; topics accumulate over the windows): less load drift between the compared windows",
    )
    parser.add_argument("--out", type=Path, help="write every run and the summary there as JSON")
    parser.add_argument("--no-cpu-probe", action="store_true", help="no CPU-speed probe (bench.cpu_probe)")
    args = parser.parse_args(argv)
    try:
        variants = [Variant.parse(text) for text in args.variant or ["this"]]
    except ValueError as exc:
        parser.error(str(exc))
    if args.interleave:
        document = interleaved(variants, args.rounds, args.seconds, not args.no_cpu_probe)
        for label, values in document["summary"].items():
            print(f"summary variant={label} " + " ".join(f"{k}={v}" for k, v in values.items()))
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            document["variants"] = {
                v.label: {"tree": str(v.tree), "overrides": v.overrides} for v in variants
            }
            args.out.write_text(json.dumps(document, indent=2) + "\n")
        return 0
    runs: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    probe = CpuProbe()  # never started with --no-cpu-probe: the runs are marked on it all the same
    if not args.no_cpu_probe:
        probe.start()
    try:
        _sequential(variants, args.rounds, args.seconds, runs, probe)
    finally:
        probe.stop()
    report = None if args.no_cpu_probe else probe.report()
    if report is not None:
        for label, values in runs.items():
            for index, result in enumerate(values):
                # the whole run: the child's quorum start and both windows
                result["speed_factor"] = report["phases"][f"{index}-{label}"]["speed_factor"]
    summaries = {label: summary(values) for label, values in runs.items()}
    for label, values in summaries.items():
        print(f"summary variant={label} " + " ".join(f"{k}={v}" for k, v in values.items()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "variants": {v.label: {"tree": str(v.tree), "overrides": v.overrides} for v in variants},
            "runs": runs,
            "summary": summaries,
        }
        if report is not None:
            document["cpu_probe"] = report
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def _sequential(
    variants: list[Variant],
    rounds: int,
    seconds: float,
    runs: dict[str, list[dict[str, Any]]],
    probe: CpuProbe,
) -> None:
    """Every variant once per round in a child of its own, the order flipped every round."""
    for index in range(rounds):
        order = variants if index % 2 == 0 else list(reversed(variants))
        for variant in order:
            with probe.phase(f"{index}-{variant.label}"):
                result = run_variant(variant, seconds)
            runs[variant.label].append(result)
            cpu = result["cpu_us_per_op_16_clients"]
            print(
                f"round={index} variant={variant.label} ops_per_s={result['admin_ops']['ops_per_second']} "
                f"p50_ms={result['admin_ops']['p50_ms']} p99_ms={result['admin_ops']['p99_ms']} "
                f"one_client_p50_ms={result['admin_ops_one_client']['p50_ms']} "
                f"cpu_us_per_op leader={cpu['leader']} followers={cpu['followers']} client={cpu['client']} "
                f"batches={result['raft_batches_16_clients']['batches']} "
                f"records_per_batch={result['raft_batches_16_clients']['records_per_batch']} "
                f"load={result['load_average_before']}",
                flush=True,
            )


if __name__ == "__main__":
    raise SystemExit(main())
