"""Broker stop and restart with 2,000 partitions, real processes (issue #19's targets): one controller and
one broker, the broker hosting :data:`PARTITIONS` partitions (replication factor 1, two topics).

Two measurements, :data:`TRIALS` trials each, every trial after one record was produced to every
partition (so each partition has appends to close):

1. **stop**: SIGTERM → the broker process is gone, controlled shutdown included (target ≤ 2 s); then the
   broker is started again and waited for (unfenced);
2. **crash**: SIGKILL, the broker started again at once → ``event=registered`` and ``event=unfenced`` in
   its log, timed from the spawn (target: registered ≤ 2 s; the spawn includes the interpreter start).

Each trial also records where the time went, from the broker's own log: per logged event, the seconds
since the signal (stop) or the spawn (crash).  Storage is the temp dir (a real disk: the stop path
fsyncs).  Run: ``python -m bench.broker_stop [--partitions N]``.  Results: ``bench/results/broker_stop.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from kraft.client.broker import BrokerClient, describe_broker
from kraft.cluster.manager import LocalCluster
from kraft.cluster.process import NodeProcess, pid_alive
from kraft.cluster.quorum import run_kraft
from kraft.cluster.spec import NodeRole
from kraft.errors import ErrorCode
from kraft.procutil import reap_children_on_exit

PARTITIONS = 2_000
TOPIC_PARTITIONS = 1_000
TRIALS = 3
TARGET_STOP_S = 2.0
TARGET_REGISTER_S = 2.0
POLL_S = 0.01
RESULTS = Path(__file__).resolve().parent / "results" / "broker_stop.json"
_TS = re.compile(r"^ts=(\S+) .*?event=(\S+)")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _events_since(log: Path, offset: int, since_wall: float) -> dict[str, float]:
    """First occurrence of each event logged after byte ``offset``: seconds after ``since_wall``."""
    out: dict[str, float] = {}
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    for line in text.splitlines():
        match = _TS.match(line)
        if match is None:
            continue
        stamp = datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
        key = match.group(2)
        if key == "broker_state_changed":
            new = re.search(r" new=(\S+)", line)
            key = f"state={new.group(1)}" if new else key
        out.setdefault(key, round(stamp - since_wall, 3))
    return out


def _wait_log(log: Path, offset: int, needle: bytes, timeout_s: float) -> float:
    """Monotonic time when ``needle`` first appears in ``log`` after byte ``offset``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with log.open("rb") as f:
            f.seek(offset)
            if needle in f.read():
                return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle.decode()} not logged within {timeout_s:.0f} s")
        time.sleep(POLL_S)


async def _touch(targets: list[str], cluster_id: str, topics: list[str], per_topic: int) -> float:
    """One record to every partition (acks=all); seconds taken."""
    started = time.monotonic()
    async with BrokerClient(targets, cluster_id=cluster_id) as client:
        for topic in topics:
            for first in range(0, per_topic, 100):
                answers = await asyncio.gather(
                    *(
                        client.produce(topic, p, [(None, b"x" * 100)])
                        for p in range(first, min(first + 100, per_topic))
                    )
                )
                assert all(a.error_code == ErrorCode.NONE for a in answers), answers
    return time.monotonic() - started


def _wait_exit(pid: int, started: float) -> float:
    """Seconds from ``started`` (monotonic) until ``pid`` is gone."""
    while pid_alive(pid):
        assert time.monotonic() - started < 120, "broker did not exit within 120 s"
        time.sleep(POLL_S)
    return time.monotonic() - started


def _restart_timed(proc: NodeProcess) -> dict[str, Any]:
    """Start the broker; seconds from the spawn to registered and to unfenced, and its logged events."""
    offset = proc.log_path.stat().st_size
    wall, started = time.time(), time.monotonic()
    proc.start()
    registered = _wait_log(proc.log_path, offset, b"event=registered", 120) - started
    unfenced = _wait_log(proc.log_path, offset, b"event=unfenced", 120) - started
    return {
        "registered_s": round(registered, 3),
        "unfenced_s": round(unfenced, 3),
        "events_s": _events_since(proc.log_path, offset, wall),
    }


async def _run(root: Path, partitions: int) -> dict[str, Any]:
    cluster = LocalCluster.create(
        root,
        controllers=1,
        brokers=1,
        profile="default",
        overrides={"max.broker.partitions": str(partitions * 2)},
    )
    result: dict[str, Any] = {"partitions": partitions}
    try:
        cluster.start()
        cluster.wait_healthy(timeout_s=120)
        status = cluster.status()
        broker = next(n for n in status.nodes if n.role is NodeRole.BROKER)
        controllers = status.bootstrap(NodeRole.CONTROLLER)
        proc = cluster.process(broker.node_id)
        per_topic = min(TOPIC_PARTITIONS, partitions)
        topics = [f"wide-{i}" for i in range(partitions // per_topic)]
        partitions = per_topic * len(topics)
        result["partitions"] = partitions
        for topic in topics:
            created = run_kraft(
                ["topic", "create", topic, "-p", str(per_topic), "-r", "1", "--if-not-exists",
                 "--bootstrap-controller", controllers],
                timeout_s=120,
            )  # fmt: skip
            assert created.returncode == 0, created.stderr
        deadline = time.monotonic() + 600
        while True:
            described = await describe_broker(broker.endpoint, status.cluster_id, 10.0)
            if described is not None and len(described.partitions) == partitions:
                break
            assert time.monotonic() < deadline, "partitions not hosted within 600 s"
            await asyncio.sleep(1.0)

        stops: list[dict[str, Any]] = []
        for _ in range(TRIALS):
            touch_s = await _touch([broker.endpoint], status.cluster_id, topics, per_topic)
            offset = proc.log_path.stat().st_size
            wall, started = time.time(), time.monotonic()
            pid = proc.request_stop()
            assert pid is not None
            exit_s = _wait_exit(pid, started)
            assert proc.finish_stop(pid, 5.0) == "stopped"
            trial: dict[str, Any] = {"touch_s": round(touch_s, 2), "exit_s": round(exit_s, 3)}
            trial["events_s"] = _events_since(proc.log_path, offset, wall)
            trial["restart_after_stop"] = _restart_timed(proc)
            stops.append(trial)
        crashes: list[dict[str, Any]] = []
        for _ in range(TRIALS):
            touch_s = await _touch([broker.endpoint], status.cluster_id, topics, per_topic)
            assert proc.kill()
            crashes.append({"touch_s": round(touch_s, 2), **_restart_timed(proc)})
        result["stop"] = stops
        result["crash_restart"] = crashes
        exits = [t["exit_s"] for t in stops]
        registered = [t["registered_s"] for t in crashes]
        result["summary"] = {
            "stop_exit_s": {"median": statistics.median(exits), "max": max(exits)},
            "crash_registered_s": {"median": statistics.median(registered), "max": max(registered)},
            "crash_unfenced_s": {
                "median": statistics.median(t["unfenced_s"] for t in crashes),
                "max": max(t["unfenced_s"] for t in crashes),
            },
        }
        result["met"] = {
            "stop": max(exits) <= TARGET_STOP_S,
            "register_after_kill": max(registered) <= TARGET_REGISTER_S,
        }
    finally:
        cluster.down(timeout_s=60)
    return result


def main() -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--quick", action="store_true", help="accepted for `python -m bench`; no effect")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kraft-broker-stop-"))
    uptime_before = _uptime()
    started = time.monotonic()
    try:
        result = asyncio.run(_run(root / "cluster", args.partitions))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "broker_stop",
        "targets": {"stop_exit_s": TARGET_STOP_S, "crash_registered_s": TARGET_REGISTER_S},
        "trials": TRIALS,
        "storage": f"temp dir ({tempfile.gettempdir()})",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "uptime_before": uptime_before,
        "uptime_after": _uptime(),
        "total_s": round(time.monotonic() - started, 1),
        **result,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if all(report["met"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
