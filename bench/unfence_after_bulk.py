"""Microbenchmark: an unfence right after a controlled shutdown of ~109,000 leaderships, in the active
controller's logic (issue #17, session 12).

The shutdown's slices leave the rejoin index's flags dirty (``RejoinIndex``, ``LAZY_MIN_CHANGES``); the
shell settles them afterwards in events of their own, but a broker unfenced before that is done used to
settle all of them inside its heartbeat's event (0.2-0.3 s).  This builds ``bench.shutdown_profile``'s
image (``--small-topics`` one-partition topics of broker 1 and ``--topics`` x 1,000 partitions led by
broker 1, over ``--brokers`` brokers), fences broker ``--unfenced`` (its leave job run), runs broker 1's
ShutdownBroker slice by slice as the shell does, and then at once the heartbeat that unfences broker
``--unfenced`` and every bulk slice after it: per event the thread CPU and wall time (ms), the number of
events, and how many partitions were still dirty before the heartbeat.  Then, without an unfence, the
settle events the shell would run (``index_some``: count, CPU p50/max, total).

Run: ``python -m bench.unfence_after_bulk [--rounds 3]`` (~1 min a round); works on any tree with
``bench.shutdown_profile`` (run it with ``PYTHONPATH`` set to the other tree for A/B).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.shutdown_profile import build
from kraft.metadata.controller_logic import ControllerLogic
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb


class _GcTime:
    """The cyclic GC's pauses so far (``gc.callbacks``), so an event's CPU can be told from its GC's."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._started


GC_TIME = _GcTime()


def _event(
    fn: Callable[[], Any], cpu: list[float], wall: list[float], gc_ms: list[float] | None = None
) -> Any:
    started_wall, started, started_gc = time.perf_counter(), time.thread_time_ns(), GC_TIME.total_s
    out = fn()
    cpu.append((time.thread_time_ns() - started) / 1e6)
    wall.append((time.perf_counter() - started_wall) * 1000)
    if gc_ms is not None:
        gc_ms.append((GC_TIME.total_s - started_gc) * 1000)
    return out


def _beat(logic: ControllerLogic, broker_id: int, offset: int, fence: bool) -> list[Any]:
    request = cpb.BrokerHeartbeatRequest(
        cluster_id="bench",
        broker_id=broker_id,
        broker_epoch=logic.image.brokers[broker_id].epoch,
        current_metadata_offset=offset + 10**9,
        want_fence=fence,
    )
    return list(logic.broker_heartbeat(request, 0, offset).records)


def _shut_down_1(logic: ControllerLogic, offset: int) -> int:
    out = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id="bench", broker_id=1), offset)
    offset += len(out.records)
    while logic.has_bulk_jobs():
        offset += len(getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)(offset))
    return offset


def one_round(logic: ControllerLogic, offset: int, image: MetadataImage, unfenced: int) -> dict[str, float]:
    logic.reset(image, 0)
    while not logic.index_some(10**9):  # the rejoin index follows the image (a controller active a while)
        pass
    offset += len(_beat(logic, unfenced, offset, fence=True))
    while logic.has_bulk_jobs():
        offset += len(getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)(offset))
    while not logic.index_some(10**9):
        pass
    gc.collect()
    gc.freeze()  # as the heap freezer does: the image is not traced by every collection
    try:
        offset = _shut_down_1(logic, offset)
        index = logic.rejoin_index
        dirty = sum(len(ids) for ids in getattr(index, "_dirty", {}).values())
        cpu: list[float] = []
        wall: list[float] = []
        gc_ms: list[float] = []
        offset += len(_event(lambda: _beat(logic, unfenced, offset, fence=False), cpu, wall, gc_ms))
        records = 0
        while logic.has_bulk_jobs():
            more = _event(
                partial(getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs), offset),
                cpu,
                wall,
                gc_ms,
            )
            offset += len(more)
            records += len(more)
        assert not logic.image.brokers[unfenced].fenced
        left_after = getattr(index, "settling", False)
        # The same shutdown again from the start, no unfence: the settle events the shell runs after it.
        logic.reset(image, 0)
        while not logic.index_some(10**9):
            pass
        offset = _shut_down_1(logic, offset)
        settle_cpu: list[float] = []
        settle_wall: list[float] = []
        while getattr(index, "settling", False):
            _event(logic.index_some, settle_cpu, settle_wall)
    finally:
        gc.unfreeze()
    return {
        "dirty_before_unfence": float(dirty),
        "unfence_event_cpu_ms": cpu[0],
        "unfence_event_wall_ms": wall[0],
        "events_after_it": float(len(cpu) - 1),
        "longest_event_cpu_ms": max(cpu),
        "longest_event_wall_ms": max(wall),
        # the longest once the cyclic GC's pauses inside each event are taken out (wall ms)
        "longest_event_wall_less_gc_ms": max(w - g for w, g in zip(wall, gc_ms, strict=True)),
        "gc_ms_in_the_longest_event": gc_ms[wall.index(max(wall))],
        "unfence_events_cpu_ms_total": sum(cpu),
        "election_records": float(records),
        "dirty_left_after_the_job": float(left_after),
        "settle_events": float(len(settle_cpu)),
        "settle_event_cpu_p50_ms": statistics.median(settle_cpu) if settle_cpu else 0.0,
        "settle_event_cpu_max_ms": max(settle_cpu, default=0.0),
        "settle_event_wall_max_ms": max(settle_wall, default=0.0),
        "settle_cpu_ms_total": sum(settle_cpu),
    }


def main() -> None:
    reap_children_on_exit()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--small-topics", type=int, default=9000)
    parser.add_argument("--unfenced", type=int, default=500, help="the broker fenced before, then unfenced")
    parser.add_argument("--work-unit", type=int, default=1000)
    parser.add_argument("--event-ms", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gc.callbacks.append(GC_TIME)
    logic, offset, image = build(args.brokers, args.topics, args.small_topics, args.work_unit, args.event_ms)
    rounds = [one_round(logic, offset, image, args.unfenced) for _ in range(args.rounds)]
    result = {
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "median": {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]},
        "rounds": [{key: round(value, 2) for key, value in r.items()} for r in rounds],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
