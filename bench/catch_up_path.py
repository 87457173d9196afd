"""The follower catch-up path in one process (issue #16): what a replica copy costs per MB, and what
flushing per fetch costs against flushing every few MiB.

The leader's partition log (a real :class:`~kraft.storage.log.SegmentedLog` on disk, through the broker's
``SegmentedPartitionLog``) holds ``--lag-mib`` of 64 x 1 KiB batches.  The copy loop is the replication
path without the network: ``read_batches`` below the leader's end (``replica.fetch.max.bytes`` per fetch),
the ``ReplicaFetchResponse`` serialized and parsed as gRPC would, ``append_batches`` (validated: CRC,
contiguity, epochs) on the follower's log, and its flush — after every fetch (``per_fetch``, kraft before
``durable_offset``) or once ``catch_up_flush_bytes`` are unflushed and at the end (``every_8MiB``, the
follower's rule now).  Time per stage, MB/s per policy, alternating policies ``--repeat`` times.

It complements ``python -m bench.broker --catch-up-only LABEL`` (real processes, gRPC between them),
which needs an idle machine: on the shared 2-core box at load 13-15 its 64 MiB run did not finish in 7 min.

Run: ``python -m bench.catch_up_path [--lag-mib 64] [--repeat 3]`` → ``bench/results/catch_up_path.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kraft.broker.replication import ReplicationSettings
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.types import ProducedRecord
from kraft.procutil import reap_children_on_exit
from kraft.v1 import broker_pb2 as pb

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "catch_up_path.json"
MIB = 1 << 20
SEGMENT_BYTES = 1 << 30


def _copy(leader: Any, follower: Any, fetch_bytes: int, flush_every: int) -> dict[str, Any]:
    end = leader.log_end_offset
    stages = {"read": 0.0, "protobuf": 0.0, "append": 0.0, "flush": 0.0}
    copied = unflushed = fetches = flushes = 0
    started = time.perf_counter()
    while follower.log_end_offset < end:
        a = time.perf_counter()
        data = leader.read_batches(follower.log_end_offset, fetch_bytes, end)
        b = time.perf_counter()
        response = pb.ReplicaFetchResponse()
        response.partitions.add(topic="t", partition=0, records=data, log_end_offset=end)
        parsed = pb.ReplicaFetchResponse.FromString(response.SerializeToString())
        records = parsed.partitions[0].records
        c = time.perf_counter()
        follower.append_batches(records)
        d = time.perf_counter()
        unflushed += len(records)
        if follower.log_end_offset >= end or unflushed >= flush_every:
            follower.flush()
            unflushed = 0
            flushes += 1
        e = time.perf_counter()
        stages["read"] += b - a
        stages["protobuf"] += c - b
        stages["append"] += d - c
        stages["flush"] += e - d
        copied += len(records)
        fetches += 1
    elapsed = time.perf_counter() - started
    return {
        "mb": round(copied / 1e6, 1),
        "seconds": round(elapsed, 3),
        "mb_per_second": round(copied / 1e6 / elapsed, 1),
        "fetches": fetches,
        "flushes": flushes,
        "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
    }


def run(lag_mib: int, repeat: int) -> dict[str, Any]:
    settings = ReplicationSettings()
    policies = {"per_fetch": 0, "every_8MiB": settings.catch_up_flush_bytes}
    open_log = segmented_log_opener(SEGMENT_BYTES)
    root = Path(tempfile.mkdtemp(prefix="kraft-catch-up-"))
    try:
        (root / "leader").mkdir()
        leader = open_log(root / "leader")
        batch = [ProducedRecord(None, os.urandom(1024), 0) for _ in range(64)]
        while leader.log_end_offset * 1024 < lag_mib * MIB:
            leader.append_records(batch, 1)
        leader.flush()
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
        for i in range(repeat):
            for name, flush_every in policies.items():
                directory = root / f"follower-{name}-{i}"
                directory.mkdir()
                follower = open_log(directory)
                try:
                    runs[name].append(_copy(leader, follower, settings.fetch_max_bytes, flush_every))
                finally:
                    follower.close()
                    shutil.rmtree(directory)
        leader.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "what": "follower copy path in one process: read_batches, protobuf round trip, append_batches, flush",
        "lag_mib": lag_mib,
        "fetch_bytes": settings.fetch_max_bytes,
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end",
        "runs": runs,
        "median_mb_per_second": {
            name: sorted(r["mb_per_second"] for r in rs)[len(rs) // 2] for name, rs in runs.items()
        },
    }


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lag-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = run(args.lag_mib, args.repeat)
    RESULTS_PATH.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_mb_per_second"], indent=2))


if __name__ == "__main__":
    main()
