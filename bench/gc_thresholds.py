"""GC pauses of an active controller's heap with a large image: default thresholds vs tuned ones.

Each configuration runs in a fresh child process: the controller logic builds an image of ``--partitions``
partitions (1,000 per topic, RF 3, over ``--brokers`` brokers), then runs a bulk workload of the kind that
allocates the most — brokers fenced and unfenced in turn, each a leave job and a rejoin job, run slice by
slice through ``continue_bulk_jobs`` (every slice builds records, a delta and a new image) — while
``gc.callbacks`` times every collection by generation.  The heap is frozen as the controller does it
(:class:`kraft.metadata.heap_freezer.HeapFreezer`: after the build, then every ``FREEZE_AFTER_RECORDS``
applied records) unless the configuration says ``freeze: false``.

Reported per configuration: collections and pause p50 / p99 / max per generation, total time in GC and the
workload's wall time.  The figure that matters for heartbeats is the longest pause (a pause is a stall of
the event loop), then the total.

``--workload create`` (session 12) runs a bulk creation instead, as ``bench.controller``'s leader does
it (``bench.bulk_create``'s order: every topic's plan, the preparing work units round robin, then the
writes), the freezer fed as the controller feeds it (``built`` per preparing unit, ``applied`` per
written batch), on top of the ``--partitions`` image; ``--threshold A,B,C`` (repeatable) names the
thresholds to compare (each with the freezer), ``--rounds`` alternates them.  Each run also reports its
CPU (``process_time``) and peak RSS (``ru_maxrss``, the fresh child's own).

Run: ``python -m bench.gc_thresholds [--partitions N] [--brokers N] [--cycles N] [--configs 1,3]
[--workload fence|create] [--threshold 700,10,10 ...] [--rounds N] [--out PATH]``
(results in ``bench/results/gc_thresholds.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench.controller import register_active_brokers
from kraft.clock import Deadline, SystemClock
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.heap_freezer import HeapFreezer, freeze_heap
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit, run_child
from kraft.v1 import controller_pb2 as cpb

RESULTS_PATH = Path(__file__).parent / "results" / "gc_thresholds.json"

CONFIGS: list[dict[str, Any]] = [
    {"name": "default, no freeze", "threshold": None, "freeze": False},
    {"name": "default (700, 10, 10) + freeze (shipped)", "threshold": None, "freeze": True},
    {"name": "(10000, 10, 10) + freeze", "threshold": [10_000, 10, 10], "freeze": True},
    {"name": "(50000, 50, 100) + freeze", "threshold": [50_000, 50, 100], "freeze": True},
    {"name": "(50000, 50, 100), no freeze", "threshold": [50_000, 50, 100], "freeze": False},
    {"name": "(50000, 10, 10) + freeze", "threshold": [50_000, 10, 10], "freeze": True},
]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _build(partitions: int, brokers: int) -> tuple[ControllerLogic, int]:
    topics = max(1, partitions // 1000)
    settings = ControllerSettings(
        "bench", max_partitions=10**9, max_broker_partitions=10**9, max_changes_per_write=1000
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0)
    offset = register_active_brokers(logic, brokers)
    for index in range(topics):
        topic = cpb.CreatableTopic(name=f"topic-{index}", num_partitions=1000, replication_factor=3)
        created = logic.create_topics(cpb.CreateTopicsRequest(cluster_id="bench", topics=[topic]), offset)
        offset += len(created.records)
    return logic, offset


CREATE_TOPICS = 100
CREATE_PER_TOPIC = 1000
CREATE_EVENT_MS = 5
CREATE_WORK_UNIT = 1000


def _create_workload(logic: ControllerLogic, offset: int, freezer: HeapFreezer | None) -> int:
    """``bench.controller``'s bulk creation as the leader runs it: 100 topics x 1,000 partitions in one
    request — the plans, the preparing work units round robin (each counted as built), then the writes
    (each counted as applied).  Returns the records written."""
    from kraft.metadata.partition_reservations import RequestOrder

    bulk = [
        cpb.CreatableTopic(name=f"bulk-{i}", num_partitions=CREATE_PER_TOPIC, replication_factor=3)
        for i in range(CREATE_TOPICS)
    ]
    order = RequestOrder({t.name: i for i, t in enumerate(bulk)})
    plans = []
    for topic in bulk:
        one = cpb.CreateTopicsRequest(cluster_id="bench", topics=[topic])
        _, plan = logic.plan_topic(one, offset, True, order)
        assert plan is not None
        plans.append(plan)
    pending = list(plans)
    while pending:
        still = []
        for plan in pending:
            before = plan.planned
            done = logic.prepare_some(plan, Deadline(SystemClock(), CREATE_EVENT_MS), CREATE_WORK_UNIT)
            if freezer is not None and hasattr(freezer, "built"):  # (trees before session 11: applied only)
                freezer.built(plan.planned - before)
            if not done:
                still.append(plan)
        pending = still
    records = 0
    for plan in plans:
        out = logic.create_prepared_topic(plan, False, offset)
        assert out.response.topics[0].error_code == 0, out.response.topics[0].error_message
        # a prepared topic's write carries values since session 17 (Outcome.values), records before
        values = getattr(out, "values", None)
        written = len(out.records) if values is None else len(values)
        offset += written
        records += written
        if freezer is not None:
            freezer.applied(written)
    return records


def child(
    config: dict[str, Any], partitions: int, brokers: int, cycles: int, workload: str = "fence"
) -> dict[str, Any]:
    build_start = time.perf_counter()
    logic, offset = _build(partitions, brokers)
    build_s = time.perf_counter() - build_start
    if config["threshold"] is not None:
        gc.set_threshold(*config["threshold"])
    freezer = HeapFreezer(SystemClock())
    if config["freeze"]:
        freeze_heap()  # the reference: nothing cyclic frozen (a node freezes young-only, HeapFreezer)
    else:
        gc.collect()
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append((time.perf_counter() - started[0]) * 1000)

    gc.callbacks.append(on_gc)
    work_start = time.perf_counter()
    cpu_start = time.process_time()
    records = 0
    try:
        if workload == "create":
            records = _create_workload(logic, offset, freezer if config["freeze"] else None)
        for cycle in range(cycles if workload == "fence" else 0):
            broker_id = 1 + cycle % brokers
            broker = logic.image.brokers[broker_id]
            for want_fence in (True, False):
                beat = cpb.BrokerHeartbeatRequest(
                    cluster_id="bench",
                    broker_id=broker_id,
                    broker_epoch=broker.epoch,
                    current_metadata_offset=offset,
                    want_fence=want_fence,
                )
                out = logic.broker_heartbeat(beat, 0, offset).records
                offset += len(out)
                records += len(out)
                if config["freeze"]:
                    freezer.applied(len(out))
                while logic.has_bulk_jobs():
                    more = getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)(offset)
                    offset += len(more)
                    records += len(more)
                    if config["freeze"]:
                        freezer.applied(len(more))
    finally:
        gc.callbacks.remove(on_gc)
    work_s = time.perf_counter() - work_start
    cpu_s = time.process_time() - cpu_start
    generations = {
        str(gen): {
            "collections": len(values),
            "p50_ms": round(_percentile(values, 0.5), 3),
            "p99_ms": round(_percentile(values, 0.99), 3),
            "max_ms": round(max(values, default=0.0), 3),
            "total_ms": round(sum(values), 1),
        }
        for gen, values in pauses.items()
    }
    return {
        "config": config["name"],
        "threshold": list(gc.get_threshold()),
        "freeze": config["freeze"],
        "partitions": logic.image.partition_count(),
        "build_seconds": round(build_s, 2),
        "workload_records": records,
        "workload": workload,
        "workload_seconds": round(work_s, 2),
        "workload_cpu_seconds": round(cpu_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "gc_total_ms": round(sum(sum(v) for v in pauses.values()), 1),
        "longest_pause_ms": round(max((max(v, default=0.0) for v in pauses.values()), default=0.0), 2),
        "generations": generations,
    }


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=200_000)
    parser.add_argument("--brokers", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=6, help="brokers fenced and unfenced in turn")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--configs", help="comma-separated indexes into CONFIGS (default: all)")
    parser.add_argument("--workload", choices=("fence", "create"), default="fence")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="A,B,C",
        help="gc.set_threshold values to compare, each with the freezer (instead of CONFIGS)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="the configurations alternated this often")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        config = json.loads(args.child)
        print(json.dumps(child(config, args.partitions, args.brokers, args.cycles, args.workload)))
        return
    configs: list[dict[str, Any]]
    if args.threshold:
        configs = []
        for text in args.threshold:
            threshold = [int(x) for x in text.split(",")]
            configs.append({"name": f"{tuple(threshold)} + freeze", "threshold": threshold, "freeze": True})
    elif args.configs:
        configs = [CONFIGS[int(i)] for i in args.configs.split(",")]
    else:
        configs = list(CONFIGS)
    runs = []
    for _ in range(args.rounds):
        for config in configs:
            load = os.getloadavg()
            out = run_child(
                [
                    sys.executable,
                    "-m",
                    "bench.gc_thresholds",
                    "--child",
                    json.dumps(config),
                    "--partitions",
                    str(args.partitions),
                    "--brokers",
                    str(args.brokers),
                    "--cycles",
                    str(args.cycles),
                    "--workload",
                    args.workload,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            result["load_average_before"] = [round(x, 2) for x in load]
            print(json.dumps(result), flush=True)
            runs.append(result)
    results = {
        "benchmark": "gc_thresholds",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "partitions": args.partitions,
        "brokers": args.brokers,
        "cycles": args.cycles,
        "workload": args.workload,
        "runs": runs,
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
