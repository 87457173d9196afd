"""Many partitions under a low file-descriptor limit, real processes (issue #14): 3 controllers and 3
brokers, every process started with ``ulimit -n`` = :data:`FD_LIMIT` (soft *and* hard: a broker raises its
soft limit to the hard one at start, so only a hard limit binds), each broker hosting
``partitions_per_broker`` partitions (replication factor 1: each partition costs one log on one broker).

Phases (seconds and the peak descriptor count of each broker, sampled from ``/proc/<pid>/fd``):

1. **create**: topics of :data:`TOPIC_PARTITIONS` partitions until every broker hosts its share — the
   brokers create the directories and logs (paced, heartbeating meanwhile);
2. **touch**: a produce (acks=all) to every :data:`TOUCH_EVERY`-th partition and a fetch of it back
   through the leader — each reopens its segment file through the broker's LRU of open files;
3. **restart**: one broker stopped (SIGTERM) and started again; the time until it hosts all its partitions
   again and answers a fetch of each touched partition of its own with the record (retriable errors
   while it settles, never an empty answer).

Pass criteria: no process exited, no "Too many open files" in any log, every broker's peak descriptor
count below the limit, every touched record read back before and after the restart.

Run: ``python -m bench.fd_scale [--quick] [--partitions-per-broker N] [--brokers N] [--controllers N]
[--out FILE]`` (default 3 controllers, 3 brokers, 20,000 per broker; ``--quick`` 2,000).  Results:
``bench/results/fd_scale.json``; one broker with 100,000 partitions: ``fd_scale_100k.json``.  Data on
``/dev/shm`` when it exists (the run measures descriptors and CPU, not a disk's fsync latency), else the
temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kraft.client.broker import BrokerClient, broker_state
from kraft.cluster.manager import LocalCluster
from kraft.cluster.quorum import run_kraft
from kraft.cluster.spec import NodeRole
from kraft.errors import ErrorCode
from kraft.procutil import reap_children_on_exit

FD_LIMIT = 1024
TOPIC_PARTITIONS = 1_000
TOUCH_EVERY = 97
RESULTS = Path(__file__).resolve().parent / "results" / "fd_scale.json"


def _fds(pid: int | None) -> int:
    if pid is None:
        return -1
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


class _Sampler:
    """Peak descriptor counts of the broker processes, sampled whenever :meth:`sample` is called."""

    def __init__(self, cluster: LocalCluster, brokers: list[int]) -> None:
        self.cluster = cluster
        self.brokers = brokers
        self.peak = dict.fromkeys(brokers, 0)

    def sample(self) -> None:
        for b in self.brokers:
            self.peak[b] = max(self.peak[b], _fds(self.cluster.process(b).pid()))


async def _hosted(targets: dict[int, str], cluster_id: str) -> dict[int, int]:
    """Partitions each broker hosts, from DescribeBroker's ``partition_count`` (the state alone: listing
    100,000 partitions every second would cost the broker what is being measured)."""
    counts: dict[int, int] = {}
    for broker, target in targets.items():
        described = await broker_state(target, cluster_id, 10.0)
        counts[broker] = -1 if described is None else described.partition_count
    return counts


async def _wait(
    what: str, check: Callable[[], Any], sampler: _Sampler, timeout_s: float, interval_s: float = 1.0
) -> float:
    started = time.monotonic()
    while True:
        sampler.sample()
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def _run(root: Path, per_broker: int, brokers_n: int, controllers_n: int) -> dict[str, Any]:
    # Whole topics of TOPIC_PARTITIONS: a count that is no multiple of it waited for partitions never made.
    total = per_broker * brokers_n // TOPIC_PARTITIONS * TOPIC_PARTITIONS
    cluster = LocalCluster.create(
        root,
        controllers=controllers_n,
        brokers=brokers_n,
        profile="default",  # Kafka's timings (session 9 s): the fast profile's 3 s fenced every broker here
        overrides={"max.broker.partitions": str(per_broker * 2)},
    )
    result: dict[str, Any] = {
        "controllers": controllers_n,
        "brokers": brokers_n,
        "partitions_per_broker": per_broker,
        "partitions": total,
    }
    try:
        cluster.start()
        cluster.wait_healthy(timeout_s=120)
        status = cluster.status()
        broker_ids = [n.node_id for n in status.nodes if n.role is NodeRole.BROKER]
        targets = {n.node_id: n.endpoint for n in status.nodes if n.role is NodeRole.BROKER}
        controllers = status.bootstrap(NodeRole.CONTROLLER)
        sampler = _Sampler(cluster, broker_ids)
        result["fds_at_start"] = {b: _fds(cluster.process(b).pid()) for b in broker_ids}

        topics = [f"wide-{i:03d}" for i in range(total // TOPIC_PARTITIONS)]
        started = time.monotonic()
        create_retries = 0
        for topic in topics:
            while True:
                created = run_kraft(
                    ["topic", "create", topic, "-p", str(TOPIC_PARTITIONS), "-r", "1", "--if-not-exists",
                     "--bootstrap-controller", controllers],
                    timeout_s=120,
                )  # fmt: skip
                sampler.sample()
                if created.returncode == 0:
                    break
                # Retriable (brokers fenced while busy creating): counted, retried after a pause.
                assert "retry" in created.stderr and create_retries < 200, created.stderr
                create_retries += 1
                await asyncio.sleep(2)
        result["create_retries"] = create_retries
        result["create_requests_s"] = round(time.monotonic() - started, 1)

        async def all_hosted() -> bool:
            return sum((await _hosted(targets, status.cluster_id)).values()) == total

        await _wait("every partition hosted", all_hosted, sampler, timeout_s=max(600, total / 20))
        result["create_s"] = round(time.monotonic() - started, 1)
        result["hosted"] = await _hosted(targets, status.cluster_id)
        result["create_peak_fds"] = dict(sampler.peak)

        touched = [(t, p) for t in topics for p in range(0, TOPIC_PARTITIONS, TOUCH_EVERY)]
        started = time.monotonic()
        async with BrokerClient(list(targets.values()), cluster_id=status.cluster_id) as client:
            for i, (topic, partition) in enumerate(touched):
                produced = await client.produce(
                    topic, partition, [(None, b"%s/%d" % (topic.encode(), partition))]
                )
                assert produced.error_code == ErrorCode.NONE, produced
                if i % 50 == 0:
                    sampler.sample()
            for topic, partition in touched:
                fetched = await client.fetch(topic, partition, 0)
                assert fetched.error_code == ErrorCode.NONE, fetched
                assert [r.value for r in fetched.records] == [b"%s/%d" % (topic.encode(), partition)], fetched
        sampler.sample()
        result["touch"] = {"partitions": len(touched), "seconds": round(time.monotonic() - started, 1)}
        result["touch_peak_fds"] = dict(sampler.peak)

        # Restart one broker: reopen its partitions under the same limit, then read its records back.
        restarted = broker_ids[0]
        sampler.peak[restarted] = 0
        started = time.monotonic()
        stopped = cluster.stop(restarted, timeout_s=120)
        process = cluster.process(restarted)
        if process.is_running():  # LocalCluster.restart would start nothing (KeyError): say why
            pid = process.pid()
            raise AssertionError(f"broker {restarted} still running after stop ({stopped}): pid {pid}")
        cluster.start([restarted])
        mine = result["hosted"][restarted]

        async def reopened() -> bool:
            counts = await _hosted({restarted: targets[restarted]}, status.cluster_id)
            return counts[restarted] == int(mine)

        await _wait(
            f"broker {restarted} hosting its {mine} partitions again", reopened, sampler, timeout_s=900
        )
        empty_answers = 0
        async with BrokerClient(list(targets.values()), cluster_id=status.cluster_id) as client:
            for topic, partition in touched:
                leader = await client.leader(topic, partition, refresh=True)
                if leader is None or leader.broker_id != restarted:
                    continue
                fetched = await client.fetch(topic, partition, 0, deadline_s=120)
                assert fetched.error_code == ErrorCode.NONE, fetched
                if not fetched.records:
                    empty_answers += 1
                assert [r.value for r in fetched.records] == [b"%s/%d" % (topic.encode(), partition)], fetched
        sampler.sample()
        result["restart"] = {
            "broker": restarted,
            "seconds_until_served": round(time.monotonic() - started, 1),
            "peak_fds": sampler.peak[restarted],
            "empty_answers": empty_answers,
        }

        logs = {b: cluster.process(b).log_path.read_text(errors="replace") for b in broker_ids}
        result["fenced_by_controller_events"] = {
            b: text.count("event=fenced_by_controller") for b, text in logs.items()
        }
        result["too_many_open_files"] = {b: "Too many open files" in text for b, text in logs.items()}
        result["alive"] = {b: cluster.process(b).is_running() for b in broker_ids}
        result["open_segment_files_max"] = {
            b: next((w.split("=")[1] for w in text.split() if w.startswith("open_segment_files_max=")), None)
            for b, text in logs.items()
        }
        peaks = [*result["create_peak_fds"].values(), *result["touch_peak_fds"].values()]
        result["peak_fds"] = max(*peaks, result["restart"]["peak_fds"])
        result["met"] = (
            result["peak_fds"] < FD_LIMIT
            and not any(result["too_many_open_files"].values())
            and all(result["alive"].values())
        )
    finally:
        cluster.down(timeout_s=60)
    return result


def main() -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,000 partitions per broker")
    parser.add_argument("--partitions-per-broker", type=int, default=None)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--controllers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    per_broker = args.partitions_per_broker or (2_000 if args.quick else 20_000)
    # Inherited by every process the cluster starts: soft and hard, so the brokers cannot raise it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="kraft-fd-scale-", dir=base))
    started = time.monotonic()
    try:
        result = asyncio.run(_run(root / "cluster", per_broker, args.brokers, args.controllers))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "fd_scale",
        "fd_limit": FD_LIMIT,
        "target": "no EMFILE, every broker's peak_fds < fd_limit, records read back",
        "storage": "tmpfs (/dev/shm)" if base else "temp dir",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "total_s": round(time.monotonic() - started, 1),
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if report.get("met") else 1


if __name__ == "__main__":
    raise SystemExit(main())
