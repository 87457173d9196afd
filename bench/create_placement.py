"""Microbenchmark: the controller logic's CPU per one-partition CreateTopics with 1 vs 1,000 brokers.

Builds, through :class:`ControllerLogic` (no Raft, no gRPC), an image of ``--topics`` one-partition topics
over N registered, unfenced brokers in 10 racks, then times (``time.process_time``) ``create_topics`` of
one more one-partition topic — RF 1 on 1 broker (bench.controller's ``admin_ops_one_client``), RF 3 on
1,000 (``admin_ops_one_client_all_brokers``) — and, at 1,000 brokers, the same create right after a broker
change (a fence and unfence: the image's broker map is new, so the placement order cached per broker map,
``ControllerLogic._placement_order``, is rebuilt) and a heartbeat that changes nothing.  The sizes are
alternated round by round so both see the same host speed.  Prints JSON (``--out`` also writes it).

Run: ``python -m bench.create_placement`` (~20 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.unfence import Bench
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb


def _topic(name: str, factor: int) -> cpb.CreatableTopic:
    return cpb.CreatableTopic(name=name, num_partitions=1, replication_factor=factor)


def _timed_us(fn: Callable[[], Any]) -> float:
    started = time.process_time_ns()
    fn()
    return (time.process_time_ns() - started) / 1e3


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # in process; bound anyway like every bench main (test_procutil_reaping)
    parser = argparse.ArgumentParser(
        prog="python -m bench.create_placement", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--topics", type=int, default=5_000, help="one-partition topics already in the image")
    parser.add_argument("--rounds", type=int, default=6, help="alternated rounds (default 6)")
    parser.add_argument("--per-round", type=int, default=200, help="creates per size per round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    gc.disable()  # a collection in one size's loop and not the other's is noise here, not the logic's cost
    sizes = {"1_broker_rf1": (1, 1), "1000_brokers_rf3": (1000, 3)}
    benches: dict[str, Bench] = {}
    for name, (brokers, factor) in sizes.items():
        bench = Bench(brokers, 0, 1)
        for index in range(args.topics):
            bench.create(_topic(f"pre-{index}", factor))
        benches[name] = bench
    samples: dict[str, list[float]] = {name: [] for name in sizes}
    samples["1000_brokers_rf3_after_broker_change"] = []
    samples["1000_brokers_heartbeat_unchanged"] = []
    rounds: list[dict[str, float]] = []
    for round_index in range(args.rounds):
        row: dict[str, float] = {}
        order = list(sizes) if round_index % 2 == 0 else list(reversed(sizes))
        for name in order:
            bench, factor = benches[name], sizes[name][1]
            times = []
            for i in range(args.per_round):
                topic = _topic(f"r{round_index}-{i}", factor)
                times.append(_timed_us(partial(bench.create, topic)))
            samples[name] += times
            row[name] = round(statistics.median(times), 1)
        big = benches["1000_brokers_rf3"]
        changed: list[float] = []
        beats: list[float] = []
        for i in range(20):
            broker_id = 1 + (round_index * 20 + i) % 1000
            big.fence(broker_id)
            big.beat(broker_id)  # unfenced again: the image has a new broker map
            topic = _topic(f"c{round_index}-{i}", 3)
            changed.append(_timed_us(partial(big.create, topic)))
            beats.append(_timed_us(partial(big.beat, broker_id)))
        samples["1000_brokers_rf3_after_broker_change"] += changed
        samples["1000_brokers_heartbeat_unchanged"] += beats
        row["1000_brokers_rf3_after_broker_change"] = round(statistics.median(changed), 1)
        rounds.append(row)
        print(json.dumps({"round": round_index, **row}), flush=True)
    result = {
        "p50_us": {name: round(statistics.median(values), 1) for name, values in samples.items()},
        "rounds": rounds,
        "topics": args.topics,
        "load_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
