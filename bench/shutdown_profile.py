"""Microbenchmark: where the CPU of ``bench.controller``'s controlled shutdown goes, phase by phase, on
the active controller and on a follower controller.

Builds, through ``ControllerLogic``, ``--brokers`` brokers, ``--small-topics`` one-partition topics whose
only replica is broker 1 (``bench.controller``'s admin phase leaves ~10,000 such) and ``--topics`` topics
of 1,000 partitions led by broker 1 (RF 3), then runs broker 1's ShutdownBroker as the controller shell
does — ``shutdown_broker``, then ``continue_bulk_jobs`` slices of at most ``--work-unit`` records or
``--event-ms`` (the shipped ``controller.max.work.unit.records`` / ``controller.max.event.time.ms``) — and
takes each slice through what the records cost after the logic: the leader's ``encode_value`` and Raft
batch encoding, a follower's batch decoding, record decoding, replay (in commit_replay's pieces) and
``apply()``.  CPU per phase is ``time.thread_time`` (ms); collections of the cyclic GC (enabled, the heap
frozen as the heap freezer does) are counted apart.

Leader phases: ``scan`` (the leave job: looking at partitions and computing each change, ``leave_change``),
``image`` (``_Batch.view``: the speculative image's ``apply()``, the rejoin index's ``advance`` — also given
alone as ``rejoin_index``; ``index_settle``, apart: the rejoin index's flags the slices left dirty,
settled after the job as the shell does in events of their own), ``encode`` (``encode_value``),
``batch_encode`` (``build_batch``: what Raft's append does with the values).  Follower phases:
``decode_batch``, ``decode_values`` (what commit_replay decodes with: ``decode_replay_values``, which
reads a common PartitionChangeRecord without upb), ``replay``, ``apply``.  Also: slices, records per
slice, the longest slice (wall ms).

Run: ``python -m bench.shutdown_profile [--rounds 3] [--event-ms 5] [--work-unit 1000]`` (~1 min a round);
``--out FILE`` also writes the JSON.  Works on any tree with ``bench.elr_shutdown`` (run the file with
``PYTHONPATH`` set to the other tree for A/B).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.controller import register_active_brokers
from bench.elr_shutdown import PER_TOPIC
from kraft.clock import SystemClock
from kraft.metadata import controller_logic
from kraft.metadata import records as rec
from kraft.metadata.commit_replay import REPLAY_PIECE_RECORDS

try:  # what commit_replay decodes with since session 15 (an older tree: decode_values, as it did)
    from kraft.metadata.change_decode import decode_replay_values as decode_for_replay
except ImportError:  # pragma: no cover (A/B against a tree before it)
    decode_for_replay = rec.decode_values
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.storage.batch import build_batch, decode_batch
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

LEADER_PHASES = ("scan", "image", "rejoin_index", "encode", "batch_encode")
FOLLOWER_PHASES = ("decode_batch", "decode_values", "replay", "apply")


class Phases:
    """CPU time (``time.thread_time_ns``) per named phase, and the cyclic GC's time apart."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self._gc_started = 0

    def timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return fn(*args)
        finally:
            self.add(name, time.thread_time_ns() - started)

    def add(self, name: str, ns: int) -> None:
        self.ns[name] = self.ns.get(name, 0) + ns

    def gc_callback(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time_ns()
        else:
            self.add("gc", time.thread_time_ns() - self._gc_started)


def build(
    brokers: int, topics: int, small_topics: int, work_unit: int, event_ms: int
) -> tuple[ControllerLogic, int, MetadataImage]:
    """``small_topics`` one-partition topics with broker 1 their only replica (what ``bench.controller``'s
    admin phase creates, ~10,000, before the other brokers register: the shutdown leaves each leaderless),
    then ``topics`` topics of 1,000 partitions led by broker 1 (RF 3), in that order (the image's order is
    the leave job's)."""
    settings = ControllerSettings(
        "bench",
        max_partitions=10**9,
        max_broker_partitions=10**9,
        max_changes_per_write=work_unit,
        max_event_time_ms=event_ms,
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0, clock=SystemClock())
    offset = register_active_brokers(logic, brokers)
    delta = MetadataDelta(logic.image)

    def add(record: Any) -> None:
        nonlocal offset
        delta.replay(rec.wrap(record), offset)
        offset += 1

    for t in range(small_topics):
        add(pb.TopicRecord(name=f"admin-{t}", topic_id=f"a{t}"))
        add(pb.PartitionRecord(topic_id=f"a{t}", partition_id=0, replicas=[1], isr=[1], leader=1))
    for t in range(topics):
        add(pb.TopicRecord(name=f"led-by-1-{t}", topic_id=f"t{t}"))
        for p in range(PER_TOPIC):
            other = 2 + (t * PER_TOPIC + p) % (brokers - 3)
            replicas = [1, other, other + 1]
            add(
                pb.PartitionRecord(
                    topic_id=f"t{t}",
                    partition_id=p,
                    replicas=replicas,
                    isr=replicas,
                    leader=1,
                    leader_epoch=1,
                    partition_epoch=1,
                )
            )
    return logic, offset, delta.apply()


def one_round(
    logic: ControllerLogic, offset: int, image: MetadataImage, work_unit: int, event_ms: int
) -> dict[str, float]:
    logic.reset(image, 0)
    while not logic.index_some(10**9):  # the rejoin index follows the image (a controller active a while)
        pass
    phases = Phases()
    index = logic.rejoin_index
    advance = index.advance

    def timed_advance(*args: Any) -> Any:
        return phases.timed("rejoin_index", advance, *args)

    vars(index)["advance"] = timed_advance  # this instance's only (the bench's probe)
    view = controller_logic._Batch.view

    def timed_view(batch: Any) -> Any:
        return phases.timed("image", view, batch)

    controller_logic._Batch.view = timed_view  # type: ignore[method-assign, assignment]  # restored below
    gc.collect()
    gc.freeze()  # as the heap freezer does after a load: the image is not traced by every collection
    gc.callbacks.append(phases.gc_callback)
    slices: list[tuple[list[Any], float]] = []
    slice_cpu_ms: list[float] = []  # CPU of each slice (thread time), the scan and its closing view
    try:
        started_wall = time.perf_counter()
        started = time.thread_time_ns()
        out = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id="bench", broker_id=1), offset)
        phases.add("slices", time.thread_time_ns() - started)
        slice_cpu_ms.append((time.thread_time_ns() - started) / 1e6)
        slices.append((list(out.records), time.perf_counter() - started_wall))
        offset += len(out.records)
        # Since session 18 the slices come encoded (continue_bulk_values, what the write path appends):
        # their encoding is then in ``slices``/``scan`` and ``encode`` passes their values through.
        next_slice = getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)
        while logic.has_bulk_jobs():
            started_wall = time.perf_counter()
            started = time.thread_time_ns()
            more = next_slice(offset)
            phases.add("slices", time.thread_time_ns() - started)
            slice_cpu_ms.append((time.thread_time_ns() - started) / 1e6)
            if more:
                slices.append((list(more), time.perf_counter() - started_wall))
                offset += len(more)
        # What the bulk slices left to the rejoin index's settling (session 11: its flags are recomputed
        # after the job, in slices the shell runs as their own events): counted apart, not in the slices.
        settle_cpu_ms: list[float] = []  # each settle event's CPU (``index_some``, as the shell runs it)
        while getattr(index, "settling", False):
            started = time.thread_time_ns()
            logic.index_some()
            settle_cpu_ms.append((time.thread_time_ns() - started) / 1e6)
            phases.add("index_settle", time.thread_time_ns() - started)
        follower = image
        first = 0
        for records, _ in slices:
            values = phases.timed(
                "encode", lambda rs: [r if type(r) is bytes else rec.encode_value(r) for r in rs], records
            )
            raw = phases.timed(
                "batch_encode",
                lambda vs, base: build_batch(base, [(None, v) for v in vs], leader_epoch=1, timestamp_ms=0),
                values,
                first,
            )
            first += len(values)
            batch, _ = phases.timed("decode_batch", decode_batch, raw)
            delta = MetadataDelta(follower)
            got = [r.value for r in batch.records]
            for start in range(0, len(got), REPLAY_PIECE_RECORDS):
                piece = got[start : start + REPLAY_PIECE_RECORDS]
                decoded = phases.timed("decode_values", lambda p: list(decode_for_replay(p)), piece)
                phases.timed("replay", lambda d, into: sum(into.replay_decoded_steps(d)), decoded, delta)
            follower = phases.timed("apply", delta.apply)
    finally:
        gc.callbacks.remove(phases.gc_callback)
        gc.unfreeze()
        del vars(index)["advance"]
        controller_logic._Batch.view = view  # type: ignore[method-assign]
    assert follower.topics_by_id == logic.image.topics_by_id
    ms = {name: ns / 1e6 for name, ns in phases.ns.items()}
    result = {
        "slices": float(len(slices)),
        "records": float(sum(len(r) for r, _ in slices)),
        "longest_slice_ms": max(w for _, w in slices) * 1000,
        # per-slice CPU (GC included): what the event-time budget is about, without preemption
        "slice_cpu_p50_ms": statistics.median(slice_cpu_ms),
        "slice_cpu_p95_ms": statistics.quantiles(slice_cpu_ms, n=20)[-1] if len(slice_cpu_ms) > 1 else 0.0,
        "slice_cpu_max_ms": max(slice_cpu_ms),
        "slices_over_budget": float(sum(1 for ms in slice_cpu_ms if ms > event_ms * 1.2)),
        "slices_cpu": ms.get("slices", 0.0),
        "scan": ms.get("slices", 0.0) - ms.get("image", 0.0),
        "image": ms.get("image", 0.0),
        "rejoin_index": ms.get("rejoin_index", 0.0),
        "index_settle": ms.get("index_settle", 0.0),
        "settle_events": float(len(settle_cpu_ms)),
        "settle_event_cpu_p50_ms": statistics.median(settle_cpu_ms) if settle_cpu_ms else 0.0,
        "settle_event_cpu_max_ms": max(settle_cpu_ms, default=0.0),
        "encode": ms.get("encode", 0.0),
        "batch_encode": ms.get("batch_encode", 0.0),
        "decode_batch": ms.get("decode_batch", 0.0),
        "decode_values": ms.get("decode_values", 0.0),
        "replay": ms.get("replay", 0.0),
        "apply": ms.get("apply", 0.0),
        "gc": ms.get("gc", 0.0),
    }
    result["records_per_slice"] = result["records"] / result["slices"]
    result["leader_total"] = result["slices_cpu"] + result["encode"] + result["batch_encode"]
    result["follower_total"] = sum(result[k] for k in FOLLOWER_PHASES)
    return result


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=110)
    parser.add_argument(
        "--small-topics", type=int, default=0, help="one-partition topics led by broker 1 alone (first)"
    )
    parser.add_argument("--work-unit", type=int, default=1000)
    parser.add_argument("--event-ms", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    logic, offset, image = build(args.brokers, args.topics, args.small_topics, args.work_unit, args.event_ms)
    rounds = [one_round(logic, offset, image, args.work_unit, args.event_ms) for _ in range(args.rounds)]
    result = {
        "benchmark": "shutdown_profile",
        "brokers": args.brokers,
        "topics": args.topics,
        "small_topics": args.small_topics,
        "work_unit": args.work_unit,
        "event_ms": args.event_ms,
        "rounds": args.rounds,
        "median_cpu_ms": {k: round(statistics.median(r[k] for r in rounds), 1) for k in rounds[0]},
        "min_cpu_ms": {k: round(min(r[k] for r in rounds), 1) for k in rounds[0]},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
