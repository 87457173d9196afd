"""Microbenchmark: the record walk of a Kafka v2 batch (``kraft/storage/batch.py``) per record, for the
shapes a metadata log holds.

Encodes real metadata values (``records.encode_value``): ``change`` — PartitionChangeRecords (ISR and
leader, ~54 bytes, the controlled shutdown's), ``partition`` — PartitionRecords (3 replicas, ~58 bytes
without directories: mostly a record length of two varint bytes; ~172 with three directory ids: a value
length of two), in batches of ``--batch`` records
(the shipped ``max_batch_records``, 2,000: offset deltas of one and two varint bytes) and of 10 records.
Times, per record, ``decode_offset_values`` (``pairs``: what a follower's commit replay and the leader's
own reads decode with), ``decode_batch`` (``records``: ``Record`` objects, what snapshot loads and tools
use) and the CRC check alone (``check``: what both pay before the walk), best of ``--rounds`` rounds of
``--repeat`` passes (CPU time, ``time.thread_time_ns``: on a shared host a preempted pass costs no more; the
cyclic GC off while timing).

Run: ``python -m bench.batch_scan [--rounds 7] [--repeat 20]``.  ``python -m bench.X`` imports ``kraft``
from the current directory, so for an A/B run each arm from its own tree's root.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from kraft.metadata import records as rec
from kraft.procutil import reap_children_on_exit
from kraft.storage.batch import build_batch, check_batch, decode_batch, decode_offset_values
from kraft.v1 import metadata_pb2 as pb


def metadata_values(shape: str, count: int) -> list[bytes]:
    """``count`` encoded metadata values of ``shape`` (``change``, ``partition``, ``partition_dirs``)."""
    topic = str(uuid.UUID(int=7))
    out: list[bytes] = []
    for i in range(count):
        if shape == "change":
            record = pb.MetadataRecord(
                partition_change=pb.PartitionChangeRecord(
                    partition_id=i % 1000, topic_id=topic, isr=pb.BrokerIdList(ids=[2, 3]), leader=2
                )
            )
        else:
            dirs = [str(uuid.UUID(int=n)) for n in (1, 2, 3)] if shape == "partition_dirs" else []
            record = pb.MetadataRecord(
                partition=pb.PartitionRecord(
                    partition_id=i % 1000,
                    topic_id=topic,
                    replicas=[1, 2, 3],
                    isr=[1, 2, 3],
                    leader=1,
                    directories=dirs,
                )
            )
        out.append(rec.encode_value(record))
    return out


def per_record_ns(fn: Callable[[bytes], Any], batch: bytes, records: int, rounds: int, repeat: int) -> float:
    """The best round's ns per record of ``fn(batch)`` (``repeat`` calls a round)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time_ns()
        for _ in range(repeat):
            fn(batch)
        best = min(best, (time.thread_time_ns() - started) / (repeat * records))
    return best


def main() -> None:
    reap_children_on_exit()  # every bench main binds its children first (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--batch", type=int, default=2000, help="records per large batch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    result: dict[str, dict[str, float]] = {}
    gc.disable()
    try:
        for shape in ("change", "partition", "partition_dirs"):
            for size in (args.batch, 10):
                values = metadata_values(shape, size)
                batch = build_batch(1000, [(None, v) for v in values], leader_epoch=3, timestamp_ms=1)
                repeat = args.repeat * max(1, args.batch // size // 20)
                result[f"{shape}/{size}"] = {
                    kind: round(per_record_ns(fn, batch, size, args.rounds, repeat), 1)
                    for kind, fn in (
                        ("pairs", decode_offset_values),
                        ("records", decode_batch),
                        ("check", check_batch),
                    )
                }
    finally:
        gc.enable()
    print(json.dumps({"ns_per_record": result}))


if __name__ == "__main__":
    main()
