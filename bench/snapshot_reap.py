"""Microbenchmark: the longest event-loop stretch while a controller loads a snapshot that replaces an
image of ``--topics`` x ``--partitions`` partitions (issue #17, bounded work units).

The snapshot's image is built from the empty one, so it shares nothing with the image it replaces: when
the last reference to the old image goes, every one of its topics is freed in one go (``before``), unless
:meth:`QuorumController.handle_load_snapshot` handed its big topics to :mod:`kraft.reaper` first, which
takes them apart in ~1 ms turns (``after``).  Each round loads a first snapshot (not timed), then times a
second one of the same size beside a task that takes a turn whenever the loop lets it, through to the
reaper having released everything: the longest stretch without that task (wall and CPU ms,
``time.thread_time``), the process's RSS after it, and what a full collection finds once the heap is
thawed (cyclic garbage the heap freezer froze).  Two trees are compared by running this file
alternately against each (``--label``; copy it into the other tree).

Garbage collection makes stretches of its own: the automatic collections during the load walk what it
builds (and the snapshot's fresh record list), unless the controller's heap freezer
(:mod:`kraft.metadata.heap_freezer`) pauses them and freezes instead.  So the ``no_gc`` rows run with
automatic collection off and the heap freezer doing nothing, and the ``with_gc`` rows as on a node.

Run: ``python -m bench.snapshot_reap`` (200 topics x 5,000 partitions; ~2 GB, a few minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from bench.work_units import _stretches, median_and_max
from kraft.clock import SystemClock
from kraft.metadata import records as rec
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_records import image_values
from kraft.procutil import reap_children_on_exit
from kraft.raft.api import (
    CommittedSlice,
    LeaderAndEpoch,
    LoadedSnapshot,
    NotLeaderError,
    RaftListener,
    SnapshotChunk,
    SnapshotWriter,
)
from kraft.raft.messages import NO_LEADER, DescribeQuorumResponse, SnapshotId
from kraft.reaper import reaper_of
from kraft.v1 import metadata_pb2 as pb

_NO_LEADER = LeaderAndEpoch(NO_LEADER, 0)


class _Follower:
    """A Raft client of a follower that never leads and never writes: only listeners are registered."""

    node_id = 1
    leader_and_epoch = _NO_LEADER
    high_watermark = 0
    next_append_offset = 0

    def register_listener(self, listener: RaftListener) -> None:
        pass

    def unregister_listener(self, listener: RaftListener) -> None:
        pass

    def schedule_append(self, records: Sequence[bytes], *, hold: bool = False) -> int:
        raise NotLeaderError(_NO_LEADER)

    def end_hold(self) -> None:
        pass

    async def append(self, records: Sequence[bytes]) -> int:
        raise NotLeaderError(_NO_LEADER)

    async def yield_turn(self) -> None:
        await asyncio.sleep(0)

    async def learn_log_end_commit(self) -> int:
        return self.high_watermark

    def confirm_leadership(self, *, lease: bool = False) -> Awaitable[None]:
        raise NotLeaderError(_NO_LEADER)

    def create_snapshot(
        self, end_offset: int, epoch: int, last_contained_timestamp_ms: int
    ) -> SnapshotWriter:
        raise NotLeaderError(_NO_LEADER)

    async def read_committed(self, offset: int, max_bytes: int) -> CommittedSlice:
        raise NotLeaderError(_NO_LEADER)

    def latest_snapshot_id(self) -> SnapshotId | None:
        return None

    def describe_quorum(self) -> DescribeQuorumResponse:
        raise NotLeaderError(_NO_LEADER)

    async def resign(self) -> None:
        pass

    async def shutdown(self, timeout_ms: int) -> None:
        pass

    async def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> SnapshotChunk:
        raise NotLeaderError(_NO_LEADER)


def snapshot_values(topics: int, partitions: int) -> list[bytes]:
    delta = MetadataDelta(MetadataImage.empty())
    for t in range(topics):
        topic_id = f"T{t}"
        delta.replay(rec.wrap(pb.TopicRecord(name=f"topic-{t}", topic_id=topic_id)))
        for p in range(partitions):
            replicas = [(t + p + i) % 30 for i in range(3)]
            delta.replay(
                rec.wrap(
                    pb.PartitionRecord(
                        partition_id=p, topic_id=topic_id, replicas=replicas, isr=replicas, leader=replicas[0]
                    )
                )
            )
    return list(image_values(delta.apply()))


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _no_freeze(*_args: object) -> None:
    pass


async def one_round(values: list[bytes], collect: bool) -> dict[str, float]:
    gc.collect()  # what earlier rounds left (a stopped controller's cycles) is not this round's garbage
    # The real clock: the replay yields on its time budget (max_event_time_ms) as on a node.
    controller = QuorumController(
        _Follower(),
        "bench",
        {1: ("127.0.0.1", 1)},
        ControllerOptions(noop_interval_ms=0),
        clock=SystemClock(),
    )
    if not collect:
        for name in ("applied", "loading", "loaded"):  # (loading/loaded: only in trees that have them)
            if hasattr(controller.heap, name):
                setattr(controller.heap, name, _no_freeze)
        if hasattr(controller.heap, "load"):  # (trees where a load runs inside the freezer's load())
            setattr(controller.heap, "load", contextlib.nullcontext)  # noqa: B010 (mypy: method assign)
    try:
        await controller.handle_load_snapshot(LoadedSnapshot(SnapshotId(len(values), 1), 0, list(values)))
        reaper = reaper_of(asyncio.get_running_loop())
        while not reaper.idle:  # noqa: ASYNC110 (the reaper has no event to wait on: it polls too)
            await asyncio.sleep(0.01)
        gc.collect()
        gc.freeze()  # as the first load leaves it on a node (frozen by the heap freezer)
        if not collect:
            gc.disable()
        pieces = reaper.pieces
        loaded_s = 0.0
        load = controller.handle_load_snapshot  # (the closure must not name `controller`: deleted below)

        # The snapshot's own copy of the records, made before the timing: one the controller may hand to
        # the reaper (the records themselves are shared with ``values``, kept for the next round).
        snapshot = LoadedSnapshot(SnapshotId(2 * len(values), 1), 0, list(values))

        async def load_and_reap() -> None:
            nonlocal loaded_s, snapshot
            started = time.perf_counter()
            await load(snapshot)
            del snapshot  # as Raft's listener lets go of it
            loaded_s = time.perf_counter() - started
            while not reaper.idle:  # noqa: ASYNC110 (it looks every POLL_S whether it is the last holder)
                await asyncio.sleep(0.01)

        longest_ms, longest_cpu_ms, _turns = await _stretches(load_and_reap)
        rss_mb = _rss_mb()
        gc.enable()
        # What a full collection finds once everything is thawed: cyclic garbage the heap freezer froze
        # (kept until its next thaw) — the cost of freezing without a full collection first.
        gc.unfreeze()
        frozen_garbage = gc.collect()
        return {
            "longest_stretch_ms": longest_ms,
            "longest_stretch_cpu_ms": longest_cpu_ms,
            "load_s": loaded_s,
            "reaper_pieces": float(reaper.pieces - pieces),
            "rss_after_load_mb": rss_mb,
            "garbage_found_after_thaw": float(frozen_garbage),
        }
    finally:
        gc.enable()
        gc.unfreeze()
        await controller.stop()
        del controller
        gc.collect()


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each row")
    parser.add_argument(
        "--rows", default="no_gc,with_gc", help="no_gc (collection off), with_gc (as on a node)"
    )
    parser.add_argument("--label", default="", help="what tree this is (for A/B runs of two trees)")
    args = parser.parse_args()
    values = snapshot_values(args.topics, args.partitions)
    rounds: dict[str, list[dict[str, float]]] = {}
    loads: list[Any] = []
    for _ in range(args.rounds):
        for row in args.rows.split(","):
            rounds.setdefault(row, []).append(asyncio.run(one_round(values, row == "with_gc")))
            loads.append(os.getloadavg()[0])
    summary = {name: median_and_max(results) for name, results in rounds.items()}
    print(
        json.dumps(
            {
                "label": args.label,
                "topics": args.topics,
                "partitions_per_topic": args.partitions,
                "loadavg_per_run": loads,
                "results": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
