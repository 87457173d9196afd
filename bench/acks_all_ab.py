"""acks=1 against acks=all at one producer, with the brokers' CPU per request (issue #16).

One fresh cluster (1 controller + 3 brokers, ``fast`` profile, RF 3, the topics of ``bench.broker``'s
replication section); ``--reps`` times, for 100 B and 1 KiB records, an acks=1 run then an acks=all run of
``--seconds`` each (``bench.broker``'s load).  Besides records/s and p50, each run records the CPU time
(user + system, from ``/proc/PID/stat``) that the cluster's processes spent per produce request: unlike
throughput it barely moves with the load of a shared host, so an A/B of two commits (run this module
from each tree in turn, alternating, under ``flock /tmp/kraft-bench.lock``) compares what each costs.
One JSON line per pair on stdout; nothing is written.

Run: ``python -m bench.acks_all_ab LABEL [--seconds 2] [--reps 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from bench.broker import _produce_load
from kraft.client.admin import AdminClient
from kraft.clock import SystemClock
from kraft.cluster.manager import LocalCluster
from kraft.observability.logging import configure_logging
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb


def _cluster_cpu_s(cluster: LocalCluster) -> float:
    """User + system CPU seconds of the cluster's running processes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for node in cluster.spec.nodes:
        pid = cluster.process(node.node_id).pid()
        if pid is None:
            continue
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def run(label: str, seconds: float, reps: int) -> None:
    configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", controllers=1, brokers=3, profile="fast")
        cluster.start()
        try:
            await asyncio.to_thread(cluster.wait_healthy, 90)
            bootstrap = ",".join(b.target for b in cluster.spec.brokers)
            ids = [b.node_id for b in cluster.spec.brokers]
            async with AdminClient([cluster.spec.controllers[0].target], clock=SystemClock()) as admin:
                for size in (100, 1024):
                    assignments = [
                        cpb.ReplicaAssignment(partition=p, broker_ids=ids[p:] + ids[:p]) for p in range(3)
                    ]
                    topic = cpb.CreatableTopic(
                        name=f"load-{size}", num_partitions=-1, replication_factor=-1, assignments=assignments
                    )
                    await admin.call(lambda stub: stub.CreateTopics, cpb.CreateTopicsRequest(topics=[topic]))
            await asyncio.sleep(1.0)
            for rep in range(reps):
                for size in (100, 1024):
                    line: dict[str, object] = {"label": label, "rep": rep, "record_bytes": size}
                    rates = {}
                    for acks, name in ((1, "acks_1"), (-1, "acks_all")):
                        cpu_before = _cluster_cpu_s(cluster)
                        result = await _produce_load(bootstrap, f"load-{size}", acks, size, 1, seconds)
                        cpu_ms = (_cluster_cpu_s(cluster) - cpu_before) * 1000 / max(result["requests"], 1)
                        rates[name] = result["records_per_second"]
                        line[f"{name}_records_per_second"] = result["records_per_second"]
                        line[f"{name}_p50_ms"] = result["latency_p50_ms"]
                        line[f"{name}_cluster_cpu_ms_per_request"] = round(cpu_ms, 2)
                    line["ratio"] = round(rates["acks_all"] / max(rates["acks_1"], 1), 3)
                    line["load_average"] = round(os.getloadavg()[0], 2)
                    print(json.dumps(line), flush=True)
        finally:
            cluster.down()


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("label")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args.label, args.seconds, args.reps))


if __name__ == "__main__":
    main()
