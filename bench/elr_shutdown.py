"""Microbenchmark: what the ELR-holder index (``MetadataImage.elr_holders``) costs a controlled shutdown.

Builds, through ``ControllerLogic``, ``--brokers`` brokers and ``--topics`` topics of 1,000 partitions led
by broker 1 (RF 3; with ``--hold N`` every Nth partition holds a last known ELR), then runs broker 1's
controlled shutdown as the controller shell does (``shutdown_broker``, then ``continue_bulk_jobs`` in
writes of ``--work-unit``) and a follower controller's decode, replay and ``apply()`` of each write —
with the index and without it (an image without ``elr_holders``: no image follows one), alternated in one
process.  Prints JSON: medians over ``--rounds`` of the active controller's events (total, longest), the
follower's replay and its ``apply()``s (ms), with the load average.  Runs against whichever ``kraft`` is on
``PYTHONPATH`` (one without the index times the "on" side only).

Run: ``python -m bench.elr_shutdown [--hold 30]`` (~110k leaderships; ~2 min).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from dataclasses import fields, replace

import kraft
from bench.controller import register_active_brokers
from kraft.clock import SystemClock
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

PER_TOPIC = 1000
HAS_INDEX = "elr_holders" in {f.name for f in fields(MetadataImage)}


def build(brokers: int, topics: int, hold: int, work_unit: int) -> tuple[ControllerLogic, int, MetadataImage]:
    settings = ControllerSettings(
        "bench", max_partitions=10**9, max_broker_partitions=10**9, max_changes_per_write=work_unit
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0, clock=SystemClock())
    offset = register_active_brokers(logic, brokers)
    delta = MetadataDelta(logic.image)
    for t in range(topics):
        topic_id = f"t{t}"
        delta.replay(rec.wrap(pb.TopicRecord(name=f"led-by-1-{t}", topic_id=topic_id)), offset)
        offset += 1
        for p in range(PER_TOPIC):
            other = 2 + (t * PER_TOPIC + p) % (brokers - 3)
            replicas = [1, other, other + 1]
            holds = bool(hold) and p % hold == 0
            record = pb.PartitionRecord(
                topic_id=topic_id,
                partition_id=p,
                replicas=replicas,
                isr=replicas,
                leader=1,
                leader_epoch=1,
                partition_epoch=1,
                last_known_elr=[other + 2] if holds else [],
            )
            delta.replay(rec.wrap(record), offset)
            offset += 1
    return logic, offset, delta.apply()


def one_round(logic: ControllerLogic, offset: int, image: MetadataImage, index: bool) -> dict[str, float]:
    if HAS_INDEX and not index:
        image = replace(image, elr_holders=None)  # type: ignore[call-arg, unused-ignore]
    logic.reset(image, 0)
    while not logic.index_some(10**9):  # the rejoin index follows the image (a controller active a while)
        pass
    gc.collect()
    events: list[float] = []
    writes: list[list[pb.MetadataRecord] | list[bytes]] = []
    started = time.perf_counter()
    out = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id="bench", broker_id=1), offset)
    events.append(time.perf_counter() - started)
    writes.append(list(out.records))
    offset += len(out.records)
    while logic.has_bulk_jobs():
        started = time.perf_counter()
        more = getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)(
            offset
        )  # (session 18: values)
        events.append(time.perf_counter() - started)
        if more:
            writes.append(list(more))
            offset += len(more)
    values = [[r if isinstance(r, bytes) else rec.encode_value(r) for r in write] for write in writes]
    follower = image
    replay_s = apply_s = 0.0
    for write in values:
        delta = MetadataDelta(follower)
        started = time.perf_counter()
        delta.replay_decoded(rec.decode_values(write))
        replayed = time.perf_counter()
        follower = delta.apply()
        apply_s += time.perf_counter() - replayed
        replay_s += replayed - started
    assert follower.topics_by_id == logic.image.topics_by_id
    return {
        "active_total_ms": sum(events) * 1000,
        "active_max_event_ms": max(events) * 1000,
        "records": sum(map(len, writes)),
        "follower_replay_ms": replay_s * 1000,
        "follower_apply_ms": apply_s * 1000,
    }


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=110)
    parser.add_argument("--hold", type=int, default=0, help="every Nth partition holds a last known ELR")
    parser.add_argument("--work-unit", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    logic, offset, image = build(args.brokers, args.topics, args.hold, args.work_unit)
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for i in range(args.rounds):
        for side in ("on", "off") if i % 2 == 0 else ("off", "on"):
            if side == "on" or HAS_INDEX:
                results[side].append(one_round(logic, offset, image, side == "on"))
    summary = {
        side: {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]}
        for side, rounds in results.items()
        if rounds
    }
    print(
        json.dumps(
            {"kraft": kraft.__file__, "hold": args.hold, "loadavg": os.getloadavg(), "median": summary},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
