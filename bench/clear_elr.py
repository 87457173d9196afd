"""Microbenchmark: one ``min.insync.replicas`` change that clears ELRs (KIP-966), per node that handles it.

Builds an image of ``--brokers`` registered brokers and one topic of ``--partitions`` partitions (RF 3,
ISR one replica) of which ``--holders`` hold an ELR (evenly spread), plus a second topic of 1,000
partitions with its own ``min.insync.replicas``, then times, per round:

- ``active_event_ms``: the active controller's IncrementalAlterConfigs of the cluster-wide default (the
  ConfigRecord, the clear, the speculative image and the rejoin index following it — one event);
- ``follower_max_slice_ms`` / ``follower_total_ms``: a follower controller's replay of those records
  in commit_replay's slices of 200 (a ClearElrRecord in its replay steps, where the code has them), then
  ``apply()`` (in the last slice);
- ``broker_local_changes_ms``: a broker's ``local_changes`` for that delta;
- ``records``: how many records the change wrote;
- ``snapshot_apply_ms``: ``apply()`` of a delta that created the big topic (a snapshot load's last step;
  the ELR index is built there), ``change_apply_ms``: ``apply()`` after 10,000 ISR-only changes of it.

Runs against whichever ``kraft`` is on ``PYTHONPATH`` (so the same script times the code before and
after a change). Prints JSON (median and max over ``--rounds``, ms, with the load average).

Run: ``python -m bench.clear_elr --partitions 100000 --holders 3446``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

from bench.controller import register_active_brokers
from bench.work_units import median_and_max, timed
from kraft.clock import SystemClock
from kraft.metadata import records as rec
from kraft.metadata.config_control import incremental_alter_configs
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

CLUSTER = "bench"
OWN_TOPIC_PARTITIONS = 1000


def _topic_records(
    topic_id: str, name: str, partitions: int, brokers: int, holders: int
) -> list[pb.MetadataRecord]:
    written = [rec.wrap(pb.TopicRecord(name=name, topic_id=topic_id))]
    every = partitions // holders if holders else 0
    for partition_id in range(partitions):
        a, b, c = (
            (partition_id % brokers) + 1,
            ((partition_id + 1) % brokers) + 1,
            ((partition_id + 2) % brokers) + 1,
        )
        holds = bool(every) and partition_id % every == 0 and partition_id // every < holders
        written.append(
            rec.wrap(
                pb.PartitionRecord(
                    topic_id=topic_id,
                    partition_id=partition_id,
                    replicas=[a, b, c],
                    isr=[a],
                    leader=a,
                    leader_epoch=1,
                    partition_epoch=1,
                    eligible_leader_replicas=[b] if holds else [],
                    last_known_elr=[c] if holds else [],
                )
            )
        )
    return written


def build(brokers: int, partitions: int, holders: int) -> tuple[ControllerLogic, int, float]:
    settings = ControllerSettings(CLUSTER, max_partitions=10**9, max_broker_partitions=10**9)
    logic = ControllerLogic(settings, MetadataImage.empty(), 0, clock=SystemClock())
    offset = register_active_brokers(logic, brokers)
    delta = MetadataDelta(logic.image)
    for record in _topic_records("big-id", "big", partitions, brokers, holders):
        delta.replay(record, offset)
        offset += 1
    for record in _topic_records("own-id", "own", OWN_TOPIC_PARTITIONS, brokers, OWN_TOPIC_PARTITIONS // 10):
        delta.replay(record, offset)
        offset += 1
    own = pb.ConfigRecord(resource_type=2, resource_name="own", name="min.insync.replicas", value="2")
    delta.replay(rec.wrap(own), offset)
    offset += 1
    snapshot_apply_ms, image = timed(delta.apply)
    logic.reset(image, 0)
    while not logic.index_some(10**9):  # the rejoin index follows the image (a controller active a while)
        pass
    return logic, offset, snapshot_apply_ms


def one_round(brokers: int, partitions: int, holders: int) -> dict[str, float]:
    logic, offset, snapshot_apply_ms = build(brokers, partitions, holders)
    gc.collect()
    gc.freeze()
    committed = logic.image
    out: dict[str, float] = {"snapshot_apply_ms": snapshot_apply_ms}
    request = cpb.IncrementalAlterConfigsRequest(cluster_id=CLUSTER)
    item = request.resources.add()
    item.resource.resource_type = 4  # BROKER, the cluster-wide default
    item.resource.resource_name = ""
    item.configs.add(name="min.insync.replicas", op=0, value="1")
    ms, outcome = timed(lambda: incremental_alter_configs(logic, request, offset))
    assert all(r.error_code == 0 for r in outcome.response.results), outcome.response
    records = list(outcome.records)
    out["active_event_ms"] = ms
    out["records"] = len(records)
    big = logic.image.topic("big")
    assert big is not None and not any(p.elr or p.last_known_elr for p in big.partitions)
    values = [rec.encode_value(r) for r in records]
    delta = MetadataDelta(committed)
    slices: list[float] = []
    for start in range(0, len(values), 200):
        chunk = list(rec.decode_values(values[start : start + 200]))
        clears = [r for r in chunk if r.WhichOneof("record") == "clear_elr"]
        started = time.perf_counter()
        if not clears or not hasattr(delta, "replay_steps"):
            delta.replay_decoded(chunk)
        else:  # as commit_replay: a ClearElrRecord in steps, a loop turn after each
            delta.replay_decoded([r for r in chunk if r.WhichOneof("record") != "clear_elr"])
            for clear in clears:
                for _ in delta.replay_steps(clear):
                    slices.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
        slices.append((time.perf_counter() - started) * 1000)
    ms, follower = timed(delta.apply)
    slices[-1] += ms
    assert follower.topics_by_id == logic.image.topics_by_id
    out["follower_max_slice_ms"] = max(slices)
    out["follower_total_ms"] = sum(slices)
    ms, _ = timed(lambda: delta.local_changes(1))
    out["broker_local_changes_ms"] = ms
    # apply() after ISR-only changes of 10,000 partitions (the ELR index follows the changed ones)
    changed = MetadataDelta(committed)
    for partition_id in range(0, min(partitions, 10_000)):
        change = pb.PartitionChangeRecord(topic_id="big-id", partition_id=partition_id)
        change.isr.ids.extend(committed.topics_by_id["big-id"].partitions[partition_id].replicas[:2])
        changed.replay(rec.wrap(change))
    out["change_apply_ms"], _ = timed(changed.apply)
    gc.unfreeze()
    return out


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--holders", type=int, default=3446)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = [one_round(args.brokers, args.partitions, args.holders) for _ in range(args.rounds)]
    summary = median_and_max(rounds)
    print(
        json.dumps(
            {
                "brokers": args.brokers,
                "partitions": args.partitions,
                "holders": args.holders,
                "loadavg": os.getloadavg(),
                "results": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
