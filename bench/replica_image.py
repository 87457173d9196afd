"""What ``ReplicaManager.on_image`` costs per applied image on a broker hosting many partitions.

A broker (id 1) hosts ``--partitions`` partitions of one topic (RF 3 over brokers 1-3): a third led here,
the rest followed from brokers 2 and 3.  The logs are in memory and the fetchers' transport never
answers, so what is timed is the replication shell's own work: after each image, ``on_image`` brings
the leader/follower states, the min ISR, the KIP-704 recovery reports and the gauges in line.

Measured (median and max over ``--rounds`` images, ms):
- ``first``: the first image (every partition is new to replication: proportional to all of them), until
  its states are all built — where the tree on ``PYTHONPATH`` builds them in loop turns
  (``ReplicaManager.wait_built``), beside a task that takes every turn it can: ``first_ms`` (wall, all
  turns), ``first_cpu_ms`` (the loop thread's CPU), ``first_longest_stretch_ms`` / ``_cpu_ms`` and
  ``first_turns`` (:func:`bench.work_units._stretches`); the same file measures a one-go tree.  With
  ``--checkpoint`` the log dir holds a stored high-watermark checkpoint of every partition (as after a
  restart), read when the first state is made;
- ``isr_change``: an image whose one change is one led partition's ISR (the usual AlterPartition);
- ``leader_change``: one followed partition becomes led;
- ``topic_config``: ``min.insync.replicas`` of an unrelated topic changes;
- ``noop``: an image with no change here (another broker's registration, say).

Run: ``python -m bench.replica_image --partitions 100000`` (prints one JSON object; ``--out`` writes it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from google.protobuf.message import Message

from bench.work_units import _stretches
from kraft.broker import hwm_checkpoint
from kraft.broker.image_adapter import _assignment, local_assignments
from kraft.broker.partitions import Partition, PartitionManager
from kraft.broker.replication import ReplicaManager
from kraft.broker.types import (
    LocalChanges,
    PartitionAssignment,
    ProducedRecord,
    ReplicaRole,
    StoredRecord,
    TopicPartition,
)
from kraft.clock import SystemClock
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import metadata_pb2 as mpb
from tests.unit.broker.broker_fakes import SilentReplicaTransport, replayed

BROKER = 1


class _Log:
    """The least a replicated partition log answers here (nothing is appended in this bench)."""

    log_start_offset = 0
    log_end_offset = 0
    flushed_offset = 0

    def append_records(
        self, records: Sequence[ProducedRecord], leader_epoch: int, max_batch_bytes: int | None = None
    ) -> int:
        raise NotImplementedError

    def read_records(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        return []

    def flush(self) -> None:
        pass

    def epoch_entries(self) -> list[tuple[int, int]]:
        return []

    def read_batches(self, offset: int, max_bytes: int, max_offset: int) -> bytes:
        return b""

    def append_batches(self, data: bytes) -> int:
        raise NotImplementedError

    def truncate_to(self, offset: int) -> int:
        return 0

    def close(self) -> None:
        pass


def _image(partitions: int) -> MetadataImage:
    lists = [(1, 2, 3), (2, 3, 1), (3, 1, 2)]
    registrations = [PartitionRegistration(r, r, r[0], 0, 0) for r in lists]
    topic = TopicImage("big", "big-id", tuple(registrations[i % 3] for i in range(partitions)))
    other = TopicImage("other", "other-id", (PartitionRegistration((2,), (2,), 2, 0, 0),))
    return replace(
        MetadataImage.empty(),
        offset=0,
        topics_by_id={"big-id": topic, "other-id": other},
        topic_ids_by_name={"big": "big-id", "other": "other-id"},
    )


def hosted(image: MetadataImage, root: Path) -> tuple[PartitionManager, ReplicaManager]:
    """Broker ``BROKER``'s partitions of ``image`` hosted under ``root`` with in-memory logs and fetchers
    whose leaders never answer (bench.broker_timers builds its broker the same way)."""
    manager = PartitionManager(BROKER, [root], lambda path: _Log())
    replicas = ReplicaManager(
        BROKER,
        "bench",
        manager,
        clock=SystemClock(),
        broker_epoch=lambda: 10,
        send_alter_partition=None,
        transport=SilentReplicaTransport(),
    )
    for tp, assignment in local_assignments(image, BROKER).items():
        role = ReplicaRole.LEADER if assignment.leader == BROKER else ReplicaRole.FOLLOWER
        # Built in memory (private _add): creating 100,000 directories is not what is measured.
        manager._add(Partition(tp, root, _Log(), assignment, role))
    return manager, replicas


async def run(partitions: int, rounds: int, checkpoint: bool = False) -> dict[str, float]:
    image = _image(partitions)
    out: dict[str, float] = {"partitions": partitions}  # (counts too: ints are floats to mypy)
    with tempfile.TemporaryDirectory(prefix="replica-image-") as root:
        manager, replicas = hosted(image, Path(root))
        if checkpoint:  # as after a restart: every hosted partition's high watermark stored (0 here)
            stored = {p.checkpoint_key: 0 for p in manager.partitions()}
            hwm_checkpoint.write(Path(root), stored)
            del stored
        for round_ in range(rounds):  # the partitions the images change get their state files written
            for index in (_led_of(round_, partitions), _led_of(round_, partitions) + 1):
                (Path(root) / TopicPartition("big", index).dir_name).mkdir(exist_ok=True)
        gc.collect()
        gc.freeze()

        async def first() -> None:
            replicas.on_image(image)
            built = getattr(replicas, "wait_built", None)  # (a tree without stepped builds: one go)
            if built is not None:
                await built()

        started, cpu_started = time.perf_counter(), time.thread_time()
        longest, longest_cpu, turns = await _stretches(first)
        out["first_ms"] = round((time.perf_counter() - started) * 1000, 1)
        out["first_cpu_ms"] = round((time.thread_time() - cpu_started) * 1000, 1)
        out["first_longest_stretch_ms"] = round(longest, 2)
        out["first_longest_cpu_ms"] = round(longest_cpu, 2)
        out["first_turns"] = turns
        out["led"] = len(replicas._led)
        out["followed"] = len(replicas._followed)
        offset = 1
        times: dict[str, list[float]] = {}

        def step(label: str, *payloads: Message) -> None:
            nonlocal image, offset
            new = replayed(image, offset, payloads)
            offset += len(payloads)
            changes = _changes(image, new)
            image = new
            manager.apply(changes)
            started = time.perf_counter()
            replicas.on_image(image)
            times.setdefault(label, []).append((time.perf_counter() - started) * 1000)

        for round_ in range(rounds):
            led = _led_of(round_, partitions)
            isr = [1, 2] if round_ % 2 == 0 else [1, 2, 3]
            step(
                "isr_change",
                mpb.PartitionChangeRecord(topic_id="big-id", partition_id=led, isr=mpb.BrokerIdList(ids=isr)),
            )
            followed = led + 1  # led by 2: brokers 1 and 3 follow
            step(
                "leader_change", mpb.PartitionChangeRecord(topic_id="big-id", partition_id=followed, leader=1)
            )
            step(
                "leader_change", mpb.PartitionChangeRecord(topic_id="big-id", partition_id=followed, leader=2)
            )
            step(
                "topic_config",
                mpb.ConfigRecord(
                    resource_type=2,
                    resource_name="other",
                    name="min.insync.replicas",
                    value=str(1 + round_ % 2),
                ),
            )
            step("noop", mpb.NoOpRecord())
        for label, values in times.items():
            out[f"{label}_median_ms"] = round(statistics.median(values), 4)
            out[f"{label}_max_ms"] = round(max(values), 4)
        await replicas.close()
        gc.unfreeze()
    return out


def _led_of(round_: int, partitions: int) -> int:
    """The led partition round ``round_`` changes (0, 3, 6...: led here; the next one is led by 2)."""
    return 3 * (round_ % max(partitions // 3, 1))


def _changes(old: MetadataImage, new: MetadataImage) -> LocalChanges:
    """The local changes of the partitions whose registration changed (what the publisher hands the
    partition manager), found by identity: unchanged registrations are shared between the images."""
    leaders: dict[TopicPartition, PartitionAssignment] = {}
    followers: dict[TopicPartition, PartitionAssignment] = {}
    for topic_id, topic in new.topics_by_id.items():
        before = old.topics_by_id.get(topic_id)
        if before is topic:
            continue
        for index, registration in enumerate(topic.partitions):
            if (
                before is not None
                and index < len(before.partitions)
                and before.partitions[index] is registration
            ):
                continue
            if BROKER in registration.replicas:
                assignment = _assignment(topic_id, registration)
                (leaders if assignment.leader == BROKER else followers)[TopicPartition(topic.name, index)] = (
                    assignment
                )
    return LocalChanges(leaders=leaders, followers=followers)


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--checkpoint", action="store_true", help="a stored HWM checkpoint of every partition"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(run(args.partitions, args.rounds, args.checkpoint))
    with open("/proc/loadavg") as f:
        result["loadavg_1m"] = float(f.read().split()[0])
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
