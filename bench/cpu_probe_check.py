"""Does the CPU-speed probe's loop slow down when kraft's own code does?  (bench.cpu_probe, issue #17)

One process pinned to one CPU runs, back to back, the probe's fixed loop (:data:`bench.cpu_probe
.LOOP_ITERATIONS`), a controller-logic CreateTopics of 200 partitions over 100 brokers (pure Python: what
the active controller does in a bulk phase) and three parses of a 4,000-assignment CreateTopicsRequest
(protobuf: C code), then sleeps 10 ms; for ``--seconds``.  Each triple is taken within ~10 ms on one CPU,
so the three see the same CPU speed.  Each unit is normalised to its median (the controller-logic one per
position in its 40-topic cycle: the logic restarts empty every 40 topics, and a topic costs more the more
there are), the loop to the run's 10th percentile (the probe's reference), and the triples are binned by
the loop's factor: if kraft's code slows as the loop does, each bin's unit factors follow its loop factor.

Run under ``flock /tmp/kraft-bench.lock``: ``python -m bench.cpu_probe_check [--seconds 60] [--cpu N]
[--out PATH]`` (default ``bench/results/cpu_probe_check.json``).  Results: raft-performance.md,
"CPU-speed probe (session 10)".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.controller import register_active_brokers
from bench.cpu_probe import LOOP_ITERATIONS, percentile, probe_loop
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb

RESULTS_PATH = Path(__file__).resolve().parents[1] / "bench" / "results" / "cpu_probe_check.json"
CYCLE = 40  # topics before the controller logic starts empty again (bounds its growth)
BINS = ((0.0, 1.1), (1.1, 1.3), (1.3, 1.5), (1.5, float("inf")))


def _fresh_logic() -> tuple[ControllerLogic, int]:
    settings = ControllerSettings("bench", max_partitions=10**7, max_broker_partitions=10**9)
    logic = ControllerLogic(settings, MetadataImage.empty(), 0)
    return logic, register_active_brokers(logic, 100)


def _parse_blob() -> bytes:
    request = cpb.CreateTopicsRequest()
    for t in range(4):
        topic = request.topics.add(name=f"x{t}")
        for p in range(1000):
            topic.assignments.add(partition=p, broker_ids=[1 + p % 7, 2 + p % 7, 3 + p % 7])
    return request.SerializeToString()


def measure(seconds: float) -> list[tuple[int, float, float, float]]:
    """(cycle position, loop ms, controller-logic ms, protobuf ms) of CPU time per triple."""
    blob = _parse_blob()
    rows: list[tuple[int, float, float, float]] = []
    logic, offset = _fresh_logic()
    index = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if index % CYCLE == 0:
            logic, offset = _fresh_logic()
        c0 = time.process_time()
        probe_loop(LOOP_ITERATIONS)
        c1 = time.process_time()
        topic = cpb.CreatableTopic(name=f"t-{index}", num_partitions=200, replication_factor=3)
        created = logic.create_topics(cpb.CreateTopicsRequest(cluster_id="bench", topics=[topic]), offset)
        c2 = time.process_time()
        for _ in range(3):
            cpb.CreateTopicsRequest.FromString(blob)
        c3 = time.process_time()
        offset += len(created.records)
        rows.append((index % CYCLE, (c1 - c0) * 1000, (c2 - c1) * 1000, (c3 - c2) * 1000))
        index += 1
        time.sleep(0.01)
    return rows


def analyse(rows: list[tuple[int, float, float, float]]) -> dict[str, Any]:
    """Each unit normalised as the module doc says, binned by the loop's factor."""
    reference = percentile([r[1] for r in rows], 0.10)
    by_position: dict[int, list[float]] = {}
    for position, _, logic_ms, _ in rows:
        by_position.setdefault(position, []).append(logic_ms)
    logic_median = {position: statistics.median(v) for position, v in by_position.items()}
    proto_median = statistics.median(r[3] for r in rows)
    loop_f = [r[1] / reference for r in rows]
    logic_f = [r[2] / logic_median[r[0]] for r in rows]
    proto_f = [r[3] / proto_median for r in rows]
    bins = []
    for low, high in BINS:
        chosen = [i for i, f in enumerate(loop_f) if low <= f < high]
        if chosen:
            bins.append(
                {
                    "loop_factor_from": low,
                    "loop_factor_below": None if high == float("inf") else high,
                    "triples": len(chosen),
                    "loop": round(statistics.mean(loop_f[i] for i in chosen), 2),
                    "controller_logic": round(statistics.mean(logic_f[i] for i in chosen), 2),
                    "protobuf_parse": round(statistics.mean(proto_f[i] for i in chosen), 2),
                }
            )
    return {
        "triples": len(rows),
        "loop_reference_ms": round(reference, 3),
        "controller_logic_median_ms": round(statistics.median(r[2] for r in rows), 3),
        "protobuf_parse_median_ms": round(proto_median, 3),
        # single triples are noisy (units of ~2 ms and ~0.5 ms): the bins are the result
        "pearson_loop_controller_logic": _pearson(loop_f, logic_f),
        "pearson_loop_protobuf": _pearson(loop_f, proto_f),
        "bins": bins,
    }


def _pearson(xs: list[float], ys: list[float]) -> float | None:
    try:
        return round(statistics.correlation(xs, ys), 3)
    except statistics.StatisticsError:  # fewer than two triples, or one side constant
        return None


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # as every benchmark's main (this one starts no child)
    parser = argparse.ArgumentParser(
        prog="python -m bench.cpu_probe_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to measure (default 60)")
    parser.add_argument("--cpu", type=int, default=None, help="the CPU to pin to (default the last allowed)")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    load_before = [round(v, 2) for v in os.getloadavg()]
    started = time.time()
    result = analyse(measure(args.seconds))
    result = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": args.seconds,
        "cpu": cpu,
        "load_average_before": load_before,
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
