"""The main-thread steps of a lone CreateTopics, warm against cold, in one process (issue #17).

Session 14 found the leader's ``create_topics`` logic costing ~300 µs of main-thread CPU in the node
(``time.thread_time_ns`` around the call) against ~70-125 µs in a quiet in-process loop, and left two
candidates unmeasured: a CPU in its slow state, and caches the other threads and processes evict
between two requests.  This benchmark runs the same steps in this process under three conditions,
alternated round by round so all see the same host:

- ``warm``: back to back, as a tight in-process loop runs them (``bench.create_placement``);
- ``after_sleep``: each step after a ``--sleep-ms`` sleep, as the leader's main thread sleeps between
  a lone client's requests (it waits ~3-5 ms for the followers' fsyncs and Fetches);
- ``after_evict``: each step right after walking ``--evict-mib`` MiB of unrelated memory and a large
  dict (no sleep): the caches cold, the CPU busy and awake.

Steps (thread CPU of each, µs): ``create`` (``ControllerLogic.create_topics`` of one one-partition RF 1
topic over an image of ``--topics`` topics: checks, placement, records and the image view, as in the
node), ``validate`` (the same with ``validate_only``: no records, no view), ``log_read``
(``SegmentedLog.read`` of the log's last batch, as a Fetch answer and the leader's listener read it)
and ``spin`` (a fixed arithmetic loop that touches almost no memory: a CPU that runs slower after a
sleep shows here; one whose caches were emptied does not).  ``gc`` stays enabled, as in the node.

Run under ``flock /tmp/kraft-bench.lock``: ``python -m bench.cold_steps [--topics N] [--rounds N]
[--per-round N] [--sleep-ms MS] [--evict-mib MIB] [--out PATH]`` (~1-2 min at the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.unfence import CLUSTER, Bench
from kraft.procutil import reap_children_on_exit
from kraft.storage.log import LogConfig, SegmentedLog
from kraft.v1 import controller_pb2 as cpb

STEPS = ("create", "validate", "log_read", "spin")
CONDITIONS = ("warm", "after_sleep", "after_evict")
SPIN_ITERATIONS = 2_000
"""The ``spin`` step's loop length (~30-60 µs on this host): long enough to time, too small for caches."""
LOG_BATCHES = 2_000
"""Batches in the benchmark's log (3 records of 150 bytes each, like a small metadata write)."""


class Evictor:
    """Unrelated memory walked before an ``after_evict`` step: a buffer (one byte per 64-byte line) and
    a dict of ``keys`` entries (pointer chasing, as a Python heap is)."""

    def __init__(self, mib: int, keys: int = 200_000) -> None:
        self._buffer = bytearray(mib << 20)
        self._ones = b"\x01" * (len(self._buffer) // 64)
        self._table = {index: str(index) for index in range(keys)}

    def __call__(self) -> int:
        self._buffer[::64] = self._ones
        total = 0
        for key in self._table:
            total += key
        return total


def spin() -> int:
    total = 0
    for index in range(SPIN_ITERATIONS):
        total += index * 3
    return total


class Steps:
    """The measured steps over one logic (image of ``topics`` one-partition topics) and one log."""

    def __init__(self, topics: int, log_dir: Path) -> None:
        self.bench = Bench(1, 0, 1)
        for index in range(topics):
            self.bench.create(
                cpb.CreatableTopic(name=f"prefill-{index}", num_partitions=1, replication_factor=1)
            )
        self.log = SegmentedLog.open(log_dir, LogConfig())
        for _ in range(LOG_BATCHES):
            self.log.append_records([(None, b"x" * 150)] * 3, leader_epoch=1, timestamp_ms=0)
        self.log.flush()
        self._made = 0

    def _request(self, validate_only: bool) -> cpb.CreateTopicsRequest:
        self._made += 1
        topic = cpb.CreatableTopic(name=f"measured-{self._made}", num_partitions=1, replication_factor=1)
        return cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic], validate_only=validate_only)

    def timed(self, step: str) -> int:
        """Thread CPU (ns) of one ``step``; the request is built before the clock starts."""
        if step == "create":
            request = self._request(False)
            started = time.thread_time_ns()
            out = self.bench.logic.create_topics(request, self.bench.offset)
            spent = time.thread_time_ns() - started
            self.bench.offset += len(out.records)
            return spent
        if step == "validate":
            request = self._request(True)
            started = time.thread_time_ns()
            self.bench.logic.create_topics(request, self.bench.offset)
            return time.thread_time_ns() - started
        if step == "log_read":
            offset = self.log.end_offset - 1
            started = time.thread_time_ns()
            self.log.read(offset, 1 << 20)
            return time.thread_time_ns() - started
        started = time.thread_time_ns()
        spin()
        return time.thread_time_ns() - started

    def close(self) -> None:
        self.log.close()


def measure(
    steps: Steps, rounds: int, per_round: int, before: Mapping[str, Callable[[], Any]]
) -> dict[str, dict[str, list[int]]]:
    """Per condition and step, the thread CPU (ns) of every measured step; conditions alternated round by
    round (forward, then backward), the steps interleaved within a round."""
    samples: dict[str, dict[str, list[int]]] = {c: {s: [] for s in STEPS} for c in before}
    order = list(before)
    for round_index in range(rounds):
        for condition in order if round_index % 2 == 0 else list(reversed(order)):
            prepare = before[condition]
            for _ in range(per_round):
                for step in STEPS:
                    prepare()
                    samples[condition][step].append(steps.timed(step))
    return samples


def summary(samples: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    p50 = {
        condition: {step: round(statistics.median(values) / 1e3, 1) for step, values in by_step.items()}
        for condition, by_step in samples.items()
    }
    warm = p50.get("warm", {})
    ratios = {
        condition: {step: round(value / warm[step], 2) for step, value in by_step.items() if warm.get(step)}
        for condition, by_step in p50.items()
        if condition != "warm"
    }
    return {"p50_us": p50, "ratio_to_warm": ratios}


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # in process; bound anyway like every bench main (test_procutil_reaping)
    parser = argparse.ArgumentParser(prog="python -m bench.cold_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=5_000, help="one-partition topics in the image")
    parser.add_argument("--rounds", type=int, default=6, help="alternated rounds (default 6)")
    parser.add_argument("--per-round", type=int, default=100, help="measurements per step, condition, round")
    parser.add_argument("--sleep-ms", type=float, default=3.0, help="the after_sleep condition's sleep")
    parser.add_argument("--evict-mib", type=int, default=32, help="memory walked before an after_evict step")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    evict = Evictor(args.evict_mib)
    sleep_s = args.sleep_ms / 1000
    before: dict[str, Callable[[], Any]] = {
        "warm": lambda: None,
        "after_sleep": lambda: time.sleep(sleep_s),
        "after_evict": evict,
    }
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kraft-bench-cold-steps-") as tmp:
        steps = Steps(args.topics, Path(tmp) / "log")
        try:
            samples = measure(steps, args.rounds, args.per_round, before)
        finally:
            steps.close()
    result = {
        **summary(samples),
        "topics": args.topics,
        "rounds": args.rounds,
        "per_round": args.per_round,
        "sleep_ms": args.sleep_ms,
        "evict_mib": args.evict_mib,
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
