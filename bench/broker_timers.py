"""What the broker's periodic replication timers cost the event loop at many hosted partitions.

A broker (id 1) hosts ``--partitions`` partitions of one topic (RF 3 over brokers 1-3; a third led here,
the rest followed), built as in :mod:`bench.replica_image` (in-memory logs, silent fetchers, the first
image applied).  Then, ``--rounds`` times, each beside a task that takes a turn whenever the loop lets it
(:func:`bench.work_units._stretches`: the longest loop stretch, wall and CPU, and the number of turns):

- ``isr_check``: one pass of the ISR shrink check (``replica.lag.time.max.ms / 2``, every 15 s): every
  led partition's ISR members looked at (all caught up here: nothing is proposed, the usual case);
- ``checkpoint_changed``: one ``replica.high.watermark.checkpoint.interval.ms`` tick (every 5 s) after
  one followed partition's high watermark moved: every hosted partition's high watermark collected,
  compared with the last write, encoded and written (temp file, fsync, rename on a worker thread);
- ``checkpoint_idle``: the same tick when nothing moved (nothing is written).

Each row also gives the pass's whole CPU on the loop's thread (``loop_cpu_ms``: all its turns together,
the write on the writer thread not included).

The checkpoint's log dir is on ``/dev/shm`` when there is one.  Runs against the tree on ``PYTHONPATH``:
where the replica manager has no stepped pass (``check_isr_shrinks_paced`` / ``write_checkpoints``),
the one-go calls of before are timed, so the same file measures both sides of an A/B.

Run: ``python -m bench.broker_timers --partitions 100000`` (prints one JSON object; ``--out`` writes it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.replica_image import _image, hosted
from bench.work_units import _stretches
from kraft.broker.replication import ReplicaManager
from kraft.procutil import reap_children_on_exit


async def _isr_check(replicas: ReplicaManager) -> None:
    paced = getattr(replicas, "check_isr_shrinks_paced", None)
    if paced is None:
        replicas.check_isr_shrinks()
    else:
        await paced()


async def _checkpoint(replicas: ReplicaManager) -> None:
    paced = getattr(replicas, "write_checkpoints", None)
    if paced is None:
        await replicas.checkpoints.write_changed(replicas._checkpoint_entries())
    else:
        await paced()


async def run(partitions: int, rounds: int, base: str | None) -> dict[str, Any]:
    image = _image(partitions)
    out: dict[str, Any] = {"partitions": partitions, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="broker-timers-", dir=base) as root:
        _, replicas = hosted(image, Path(root))
        replicas.on_image(image)
        built = getattr(replicas, "wait_built", None)  # (its new states are built in loop turns)
        if built is not None:
            await built()
        followed = list(replicas._followed.values())
        gc.collect()
        gc.freeze()
        await _checkpoint(replicas)  # the first write: every later tick compares with it
        rows: dict[str, list[tuple[float, float, int]]] = {}
        cpu: dict[str, list[float]] = {}

        async def measured(label: str, work: Callable[[], Awaitable[None]]) -> None:
            started = time.thread_time()  # (the ticker's own turns included: a few µs each)
            rows.setdefault(label, []).append(await _stretches(work))
            cpu.setdefault(label, []).append((time.thread_time() - started) * 1000)

        for round_ in range(rounds):
            await measured("isr_check", lambda: _isr_check(replicas))
            followed[round_ % len(followed)].high_watermark += 1
            await measured("checkpoint_changed", lambda: _checkpoint(replicas))
            await measured("checkpoint_idle", lambda: _checkpoint(replicas))
        out["checkpoint_writes"] = replicas.checkpoints.writes
        for label, values in rows.items():
            walls = [v[0] for v in values]
            out[f"{label}_longest_stretch_ms_median"] = round(statistics.median(walls), 2)
            out[f"{label}_longest_stretch_ms_max"] = round(max(walls), 2)
            out[f"{label}_longest_cpu_ms_max"] = round(max(v[1] for v in values), 2)
            out[f"{label}_turns_median"] = statistics.median(v[2] for v in values)
            out[f"{label}_loop_cpu_ms_median"] = round(statistics.median(cpu[label]), 1)
        await replicas.close()
        gc.unfreeze()
    return out


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load_before = float(f.read().split()[0])
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    result = asyncio.run(run(args.partitions, args.rounds, base))
    with open("/proc/loadavg") as f:
        result["loadavg_1m"] = [load_before, float(f.read().split()[0])]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
