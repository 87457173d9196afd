"""Controller benchmark: admin ops/s, 1,000 heartbeating brokers, bulk topic creation, controlled shutdown,
image memory at 1,000,000 partitions (an item with a target states it).

What is measured (results in ``bench/results/controller.json``):

- **admin_ops**: a real 3-controller quorum (:mod:`kraft.cluster.quorum`, fsync on, shipped Raft defaults);
  16 concurrent clients each send CreateTopics (one topic, one partition) back to back; ops/s and latency
  (each answer comes after the commit).
- **admin_ops_one_client**: the same with one client — the latency of a lone write (issue #17's target:
  p50 ≤ 3 ms with the shipped defaults).
- **admin_ops_one_client_all_brokers** (session 11): the 1-client measurement again once all 1,000
  brokers are registered and heartbeating (placement over the whole fleet costs the active controller per
  create, which the one-broker measurement above never shows).
- **heartbeats**: 1,000 simulated brokers register, are unfenced, then heartbeat every 2 s (spread evenly)
  for the measurement window; heartbeat p50/p99 while idle, during the 1-client creates above and while
  the bulk operations below run, and the number of brokers ever answered ``is_fenced`` after their
  unfence (target: p99 ≤ 50 ms while idle, false fencing 0).  Each window's ``client`` key is the
  benchmark client's own lateness (:mod:`bench.controller_fleet`): heartbeats sent behind schedule,
  stalls of the client's loops, and how many of the slowest 1 % were answered while the client's own
  loop was stalled — a heartbeat's latency counts the client's late noticing too.  ``client`` (top
  level) says how the fleet ran (``--broker-processes K``, ``--client-loop``; the default is the
  client of earlier sessions).
- **raft_during_bulk** (session 11): the quorum's Raft counters over the bulk phase (the nodes serve
  ``metrics.port``; two scrapes): the active controller's leadership confirmations answered from the
  lease, after the lease lapsed (``confirmations_lease_lapsed``: those heartbeats waited for a round),
  or by a round, the rounds' mean time, each follower's Fetch turnarounds, and every node's GC
  collections per generation (``gc_node_N``: generation -> [count, ms]; ``kraft_gc_pause_seconds``).
- **create_partitions**: one CreateTopics request creating 100 topics x 1,000 partitions (RF 3, placed
  over the 1,000 brokers), timed until committed.
- **controlled_shutdown**: broker 1 leads 100,000 partitions (explicit assignment); ShutdownBroker moves
  every leadership away; timed until the records committed (target ≤ 5 s).
- **image_memory**: in a fresh process, the controller logic builds an image of 1,000 topics x 1,000
  partitions over 1,000 brokers (RF 3) through CreateTopics; RSS before/after (target ≤ 1 GiB).

- **image_store_saves** (session 16): every image-store save a controller logged (``image_store_saved``:
  those that waited for bulk work or wrote ≥ 10,000 rows) placed in the part of the bulk phase it started
  in (:mod:`bench.store_saves`): start, wall and SQLite-thread CPU ms, rows, why it ran then, its slot.
- **replay_lag** (session 16): each controller's applied offset against the active controller's high
  watermark, sampled every 250 ms from the bulk phase's start until the store saves were waited for
  (:mod:`bench.replay_lag`): the largest lag (records), when each node caught up with the high watermark
  at the bulk phase's end (s after it), its main thread's time running and waiting for a core (schedstat)
  during the bulk phase and until then, a 0.5-s timeline; and (session 17, ``main_thread_waits``) the share
  of 10-ms samples of the main thread's kernel wait in each class: ``cpu`` (running or runnable), ``gil``
  (a futex: another thread of the process holds the GIL), ``loop`` (the event loop's epoll: nothing ready),
  ``other``.

- **slow_heartbeats** (session 18, ``--thread-sample-ms MS``): the slowest 2 % of the after-bulk window's
  heartbeats (1 % of the bulk phase's) grouped into stalls (heartbeats whose waits overlap), the longest
  each with what every thread of the nodes and of this process did then — ms running and ms runnable
  without a core, by thread name, the host's cores used by other processes, the GIL futex samples of the
  main and intake threads, and the nodes' ``stall_sampled`` lines with ``observability.stall.sampler.ms``
  (:mod:`bench.thread_sampler`) — and the after-bulk window's 250-ms timeline of who ran.

- **controller_epochs**: the controller (Raft) epoch before and after the bulk phase; any difference is a
  leader change, which must not happen.

- **cpu_probe** (unless ``--no-cpu-probe``): per phase above, the host's CPU speed from a probe process
  beside the run (:mod:`bench.cpu_probe`; ``speed_factor`` 1.7 = the same CPU work took 1.7x as long as
  at the reference, fast, speed) and the competition for the CPUs (``others_busy_cpus``: CPUs busy with
  processes not of this benchmark).  How to read a run with them: raft-performance.md, "CPU-speed probe
  (session 10)".  With ``--tls`` the same key reports each window as ``plaintext:PART`` / ``tls:PART``.

- **tls** (``--tls``, instead of the above): the same 3-controller quorum over PLAINTEXT and then as
  ``kraft cluster up --tls`` runs it — mutual TLS on every link and the StandardAuthorizer (the clients
  use the admin certificate, a super user; brokers are simulated by the same client, as above): CreateTopics
  latency and throughput with 1, 16 and 64 clients and the heartbeat latency of a fleet (200 brokers with
  ``--quick``, else 1,000) every 2 s; the TLS cost is the difference of each p50/p99 and the throughput
  loss; targets (issue #15): TLS costs ≤ 15 % of the 64-client throughput and ≤ 0.3 ms of the 1-client
  p50 (results in ``bench/results/controller-tls.json``, with the host's load average before and after).

Run: ``python -m bench.controller [--quick] [--tls]`` (``--quick``: 200 brokers, 20,000 partitions,
shorter windows; ``--brokers N`` / ``--partitions N`` override the sizes, ``--no-image-memory`` skips
that part, ``--set KEY=VALUE`` overrides a controller config key for A/B runs, ``--worker-client`` runs
brokers 2..N in a uvloop worker process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import proc_cpu
from bench.controller_fleet import (
    Fleet,
    FleetWorkers,
    GcPauses,
    LoopLagTicker,
    beat_offset_s,
    gather_limited,
    percentile,
    run_loop,
)
from bench.cpu_probe import CpuProbe
from bench.replay_lag import LagSampler, WaitSampler, summarize
from bench.store_saves import saves_by_phase, wait_for_saves
from bench.thread_sampler import ThreadSampler, slow_beat_report
from bench.thread_sampler import raw as thread_samples
from kraft.client.admin import AdminClient
from kraft.client.channel import PLAINTEXT_SECURITY, set_default_security
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerQuorum
from kraft.cluster.spec import ADMIN_CLIENT, certificate_principal
from kraft.errors import ErrorCode
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.heartbeat_lane import SLOW_REASONS
from kraft.metadata.image import MetadataImage
from kraft.netutil import free_port
from kraft.procutil import reap_children_on_exit, run_child
from kraft.security.authorizer import STANDARD_AUTHORIZER
from kraft.v1 import controller_pb2 as cpb

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "controller.json"
TLS_RESULTS_PATH = REPO_ROOT / "bench" / "results" / "controller-tls.json"

PROFILE = {
    # The Raft settings are the shipped defaults (append linger included: group commit bounds it, it no
    # longer delays a lone write), so the numbers are what a default deployment gets.
    "grpc.max.message.bytes": str(64 * 1024 * 1024),
    # Simulated brokers open no logs; broker 1 leads every "led-by-1" partition (100,000).
    "max.broker.partitions": "1000000",
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------- memory


def register_active_brokers(logic: ControllerLogic, brokers: int) -> int:
    """Register brokers 1..``brokers`` (10 racks) and unfence them through the controller logic; the next
    offset."""
    offset = 0
    for broker_id in range(1, brokers + 1):
        request = cpb.RegisterBrokerRequest(
            cluster_id="bench", broker_id=broker_id, incarnation_id=f"i{broker_id}", rack=f"r{broker_id % 10}"
        )
        request.listeners.add(name="PLAINTEXT", host="127.0.0.1", port=10_000 + broker_id)
        out = logic.register_broker(request, 0, offset)
        offset += len(out.records)
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id="bench",
            broker_id=broker_id,
            broker_epoch=out.response.broker_epoch,
            current_metadata_offset=offset,
        )
        offset += len(logic.broker_heartbeat(beat, 0, offset).records)
    return offset


def image_memory_child(topics: int, partitions_per_topic: int, brokers: int) -> dict[str, Any]:
    """Build the image through the controller logic; runs in its own process for a clean RSS."""
    gc.collect()
    before = rss_bytes()
    # Brokers are simulated (no partition logs), so the per-broker limit does not apply here.
    settings = ControllerSettings(
        "bench", max_partitions=topics * partitions_per_topic, max_broker_partitions=10**9
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0)
    offset = register_active_brokers(logic, brokers)
    start = time.perf_counter()
    for index in range(topics):
        topic = cpb.CreatableTopic(
            name=f"topic-{index}", num_partitions=partitions_per_topic, replication_factor=3
        )
        created = logic.create_topics(cpb.CreateTopicsRequest(cluster_id="bench", topics=[topic]), offset)
        offset += len(created.records)
    build_s = time.perf_counter() - start
    del created
    gc.collect()
    after = rss_bytes()
    image = logic.image
    return {
        "brokers": len(image.brokers),
        "partitions": image.partition_count(),
        "build_seconds": round(build_s, 2),
        "rss_before_mib": round(before / 2**20, 1),
        "rss_after_mib": round(after / 2**20, 1),
        "image_mib": round((after - before) / 2**20, 1),
        "target_mib": 1024,
        "meets_target": after <= 2**30,
    }


def measure_image_memory(quick: bool) -> dict[str, Any]:
    topics, per_topic, brokers = (100, 1000, 1000) if quick else (1000, 1000, 1000)
    result = run_child(
        [sys.executable, "-m", "bench.controller", "--image-memory-child", f"{topics},{per_topic},{brokers}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"image memory child failed: {result.stderr.strip()[-2000:]}")
    measured: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return measured


# ---------------------------------------------------------------------------------------------- cluster


def check_created(response: cpb.CreateTopicsResponse) -> None:
    # TOPIC_ALREADY_EXISTS: an earlier attempt committed before a leader change made the client retry
    ok = (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)
    failed = [t for t in response.topics if t.error_code not in ok]
    if failed:
        raise RuntimeError(f"{len(failed)} topics failed, first: {failed[0].name}: {failed[0].error_message}")


async def admin_ops(
    client: AdminClient, seconds: float, workers: int = 16, prefix: str = "admin"
) -> dict[str, Any]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.monotonic() < deadline:
            name = f"{prefix}-{next(counter)}"
            topic = cpb.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
            start = time.monotonic()
            # create_topics, not a bare call: a CreateTopics resent after an unknown outcome (a leader change,
            # a timed-out attempt) may answer TOPIC_ALREADY_EXISTS for the first attempt's topic, which
            # create_topics reconciles as an operator's client would (a bare resend ended a run, session 16).
            response = await client.create_topics(cpb.CreateTopicsRequest(topics=[topic]))
            latencies.append(time.monotonic() - start)
            if response.topics[0].error_code != ErrorCode.NONE:
                raise RuntimeError(response.topics[0].error_message)

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.monotonic() - start
    ms = [v * 1000 for v in latencies]
    return {
        "workers": workers,
        "ops": len(latencies),
        "ops_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(ms, 0.5), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
    }


def cpu_marks(quorum: ControllerQuorum) -> dict[str, proc_cpu.ProcessCpu | None]:
    """CPU snapshots of every controller process and of this harness (``--cpu``)."""
    marks = {
        f"controller-{node_id}": proc_cpu.snapshot(node.pid)
        for node_id, node in quorum.nodes.items()
        if node.pid is not None
    }
    marks["harness"] = proc_cpu.snapshot(os.getpid())
    return marks


def cpu_between(
    before: dict[str, proc_cpu.ProcessCpu | None],
    after: dict[str, proc_cpu.ProcessCpu | None],
    wall_s: float,
    leader_id: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_s": round(wall_s, 2), "active_controller": f"controller-{leader_id}"}
    for name, mark in after.items():
        out[name] = proc_cpu.spent(before.get(name), mark, wall_s)
    return out


@dataclass(frozen=True)
class ClientSetup:
    """How the benchmark's client runs: ``loop`` for its own event loop and the workers', and brokers
    2..N in ``broker_processes`` worker processes (0: in the benchmark's process).

    The default is the client of sessions up to 10 (one process on the standard asyncio loop plays every
    broker): session 11 measured the alternative (:data:`WORKER_CLIENT`) against it on one server tree and
    found no difference in the heartbeat p99 — both clients' loops stall about as much, for want of a
    core — so the default keeps the numbers comparable with earlier sessions' (raft-performance.md,
    "Heartbeats during bulk, the client and the lease (session 11)")."""

    loop: str = "asyncio"
    broker_processes: int = 0
    heartbeat_stream: bool = True  # brokers heartbeat over one stream each, as kraft brokers do (session 15)

    def describe(self) -> dict[str, Any]:
        return {
            "loop": self.loop,
            "broker_processes": self.broker_processes,
            "heartbeat_stream": self.heartbeat_stream,
        }


WORKER_CLIENT = ClientSetup(loop="uvloop", broker_processes=1)
"""The alternative measured in session 11: brokers 2..N heartbeat from one worker process, every client
loop on uvloop (what every kraft process runs)."""


class MetricsQuorum(ControllerQuorum):
    """A :class:`ControllerQuorum` whose nodes serve Prometheus metrics, so a phase can be read as the
    difference of two scrapes (the Raft counters of :func:`raft_counters`)."""

    metrics_ports: dict[int, int]

    def config_text(self, node_id: int) -> str:
        # the base class writes the configs while it initializes: the ports are picked on first use
        ports = self.__dict__.setdefault("metrics_ports", {})
        port = ports.setdefault(node_id, free_port())
        return super().config_text(node_id) + f"metrics.port={port}\n"


RAFT_SERIES = {
    "kraft_raft_leadership_confirmations_total": "how",
    "kraft_raft_confirmation_round_seconds_count": None,
    "kraft_raft_confirmation_round_seconds_sum": None,
    "kraft_raft_fetch_turnaround_seconds_count": None,
    "kraft_raft_fetch_turnaround_seconds_sum": None,
    "kraft_raft_fetch_turnaround_seconds_bucket": "le",
    "kraft_raft_lease_echo_basis_age_seconds_bucket": "le",
    "kraft_raft_inputs_during_flush_total": None,
    "kraft_gc_pause_seconds_count": "generation",
    "kraft_gc_pause_seconds_sum": "generation",
    "kraft_controller_event_queue_processing_time_seconds_count": "kind",
    "kraft_controller_event_queue_processing_time_seconds_sum": "kind",
    # session 14: the heartbeat tail — why heartbeats went the main loop's path and how long they took
    # there, and (with observability.stall.sampler.ms) each node's loop lags and GIL waits
    "kraft_controller_heartbeats_fast_lane_total": None,
    "kraft_controller_heartbeats_slow_path_total": "reason",
    "kraft_controller_heartbeat_slow_path_seconds_bucket": "le",
    "kraft_controller_heartbeat_slow_path_seconds_sum": None,
    "kraft_node_loop_lag_seconds_bucket": "loop,le",
    "kraft_node_loop_lag_seconds_sum": "loop",
    "kraft_node_sampler_wakeup_delay_seconds_bucket": "wait,le",
    "kraft_node_sampler_wakeup_delay_seconds_sum": "wait",
    "kraft_controller_heartbeat_arrival_delay_seconds_bucket": "le",
    "kraft_controller_heartbeat_arrival_delay_seconds_sum": None,
}


def raft_counters(quorum: MetricsQuorum) -> dict[str, float]:
    """The Raft series of :data:`RAFT_SERIES` of every node, ``name[label]@node`` -> value (a node that
    does not answer is left out)."""
    out: dict[str, float] = {}
    for node_id, port in quorum.metrics_ports.items():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as response:
                text = response.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in RAFT_SERIES:
                    continue
                label = RAFT_SERIES[sample.name]
                if label is not None:
                    label = ",".join(sample.labels.get(name, "") for name in label.split(","))
                key = sample.name if label is None else f"{sample.name}[{label}]"
                out[f"{key}@{node_id}"] = float(sample.value)
    return out


def raft_phase(before: dict[str, float], after: dict[str, float], leader_id: int) -> dict[str, Any]:
    """What the Raft counters say about one phase: the active controller's leadership confirmations (lease
    hits, lease lapses, rounds, round time), each follower's Fetch turnarounds, and every node's GC
    collections per generation ([count, ms])."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    confirmations = "kraft_raft_leadership_confirmations_total"
    rounds = delta(f"kraft_raft_confirmation_round_seconds_count@{leader_id}")
    out: dict[str, Any] = {
        "leader": leader_id,
        "confirmations_lease": int(delta(f"{confirmations}[lease]@{leader_id}")),
        "confirmations_lease_lapsed": int(delta(f"{confirmations}[lease_lapsed]@{leader_id}")),
        "confirmations_round": int(delta(f"{confirmations}[round]@{leader_id}")),
        "rounds_waited_on": int(rounds),
        "round_mean_ms": round(
            1000 * delta(f"kraft_raft_confirmation_round_seconds_sum@{leader_id}") / rounds, 1
        )
        if rounds
        else None,
    }
    # session 13: the lease's echo path — each echo that renewed a basis, by the basis' age when it
    # counted (cumulative buckets, ms -> count at or under), and the inputs fed during an fsync
    ages = "kraft_raft_lease_echo_basis_age_seconds_bucket"
    bounds = {
        key: key[len(ages) + 1 :].split("]@", 1)[0]
        for key in after
        if key.startswith(f"{ages}[") and key.endswith(f"@{leader_id}")
    }
    out["echo_basis_age_at_or_under_ms"] = {
        str(round(float(le) * 1000)): int(delta(key))
        for key, le in sorted(bounds.items(), key=lambda item: float(item[1]))
        if le != "+Inf"
    }
    out["echo_basis_ages"] = int(delta(f"{ages}[+Inf]@{leader_id}"))
    out["inputs_during_flush"] = {
        int(key.rsplit("@", 1)[1]): int(delta(key))
        for key in after
        if key.startswith("kraft_raft_inputs_during_flush_total@")
    }
    followers = sorted({int(key.rsplit("@", 1)[1]) for key in after} - {leader_id})
    for node in followers:
        count = delta(f"kraft_raft_fetch_turnaround_seconds_count@{node}")
        over = count - delta(f"kraft_raft_fetch_turnaround_seconds_bucket[0.25]@{node}")
        out[f"follower_{node}_fetch_turnarounds"] = int(count)
        out[f"follower_{node}_fetch_turnaround_mean_ms"] = (
            round(1000 * delta(f"kraft_raft_fetch_turnaround_seconds_sum@{node}") / count, 1)
            if count
            else None
        )
        out[f"follower_{node}_fetch_turnarounds_over_250ms"] = int(over)
    events = "kraft_controller_event_queue_processing_time_seconds"
    kinds = sorted(
        {key[len(events) + 7 :].split("]@", 1)[0] for key in after if key.startswith(f"{events}_count[")}
    )
    # the active controller's events by kind in the phase: [count, ms in all] (whole-ms clock)
    out["leader_events"] = {
        kind: [
            int(delta(f"{events}_count[{kind}]@{leader_id}")),
            round(1000 * delta(f"{events}_sum[{kind}]@{leader_id}")),
        ]
        for kind in kinds
        if delta(f"{events}_count[{kind}]@{leader_id}")
    }
    out.update(heartbeat_tail(delta, leader_id, sorted({int(key.rsplit("@", 1)[1]) for key in after})))
    for node in sorted({int(key.rsplit("@", 1)[1]) for key in after}):
        # the cyclic GC's collections by generation: count and ms in all (kraft_gc_pause_seconds)
        out[f"gc_node_{node}"] = {
            generation: [
                int(delta(f"kraft_gc_pause_seconds_count[{generation}]@{node}")),
                round(1000 * delta(f"kraft_gc_pause_seconds_sum[{generation}]@{node}"), 1),
            ]
            for generation in ("0", "1", "2")
        }
    return out


TAIL_BOUNDS_MS = (20, 50, 100, 200, 500)
"""The stall lengths :func:`heartbeat_tail` counts samples over (bucket bounds of the node's histograms)."""


def heartbeat_tail(delta: Callable[[str], float], leader_id: int, nodes: list[int]) -> dict[str, Any]:
    """Session 14: where a phase's slow heartbeats can have come from, from the counters' deltas — the
    leader's heartbeats by path (fast lane, main loop by reason) and the main-loop path's time, and per
    node the samples of its loop lags and its sampler thread's wake-up delay (total and the GIL's part)
    over each of :data:`TAIL_BOUNDS_MS` ([samples over 20, 50, 100, 200, 500 ms], sum ms)."""
    slow = "kraft_controller_heartbeats_slow_path_total"
    reasons = {reason: int(delta(f"{slow}[{reason}]@{leader_id}")) for reason in SLOW_REASONS}
    seconds = "kraft_controller_heartbeat_slow_path_seconds"
    count = delta(f"{seconds}_bucket[+Inf]@{leader_id}")
    out: dict[str, Any] = {
        "heartbeats_fast_lane": int(delta(f"kraft_controller_heartbeats_fast_lane_total@{leader_id}")),
        "heartbeats_slow_path": {reason: n for reason, n in reasons.items() if n},
        "slow_path_answered": int(count),
        "slow_path_mean_ms": round(1000 * delta(f"{seconds}_sum@{leader_id}") / count, 1) if count else None,
        "slow_path_over_ms": {
            str(ms): int(count - delta(f"{seconds}_bucket[{ms / 1000}]@{leader_id}"))
            for ms in (100, 250, 500)
        },
    }

    arrival = "kraft_controller_heartbeat_arrival_delay_seconds"
    arrived = delta(f"{arrival}_bucket[+Inf]@{leader_id}")
    out["arrival_delay"] = {
        "heartbeats": int(arrived),
        "mean_ms": round(1000 * delta(f"{arrival}_sum@{leader_id}") / arrived, 1) if arrived else None,
        "over_ms": {
            str(ms): int(arrived - delta(f"{arrival}_bucket[{ms / 1000}]@{leader_id}"))
            for ms in TAIL_BOUNDS_MS
        },
    }

    def over(name: str, label: str, node: int) -> list[Any]:
        total = delta(f"{name}_bucket[{label},+Inf]@{node}")
        counts = [int(total - delta(f"{name}_bucket[{label},{ms / 1000}]@{node}")) for ms in TAIL_BOUNDS_MS]
        return [counts, round(1000 * delta(f"{name}_sum[{label}]@{node}"))]

    for node in nodes:
        out[f"stalls_node_{node}"] = {
            "main_loop": over("kraft_node_loop_lag_seconds", "main", node),
            "intake_loop": over("kraft_node_loop_lag_seconds", "intake", node),
            "wakeup": over("kraft_node_sampler_wakeup_delay_seconds", "total", node),
            "gil": over("kraft_node_sampler_wakeup_delay_seconds", "gil", node),
        }
    return out


async def cluster_benchmarks(
    quick: bool,
    base: Path,
    brokers: int | None = None,
    partitions: int | None = None,
    cpu: bool = False,
    probe: CpuProbe | None = None,
    setup: ClientSetup = ClientSetup(),
    beats_out: Path | None = None,
    thread_sample_ms: int = 0,
) -> dict[str, Any]:
    brokers = brokers or (200 if quick else 1000)
    # without a probe the phases are marked on one nobody reads (never started: no process)
    probe = probe or CpuProbe()
    partitions = partitions or (20_000 if quick else 100_000)
    idle_s = 10.0 if quick else 30.0
    admin_s = 5.0 if quick else 10.0
    quorum = MetricsQuorum(base, overrides=PROFILE, test_append=False)
    with quorum:
        quorum.start()
        quorum.wait_for_leader(timeout_s=60)
        targets = [node.target for node in quorum.nodes.values()]
        async with AdminClient(targets, timeout_s=300, clock=SystemClock()) as client:
            # heartbeats like a real broker's: one short attempt, no long retries (the next one comes soon)
            beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
            fleet = Fleet(
                client, beats, quorum.cluster_id, interval_s=2.0, heartbeat_stream=setup.heartbeat_stream
            )
            ticker = LoopLagTicker()
            ticker.start()
            pauses = GcPauses()
            pauses.install()
            workers: FleetWorkers | None = None
            await fleet.register(1)
            # broker 1 keeps its session alive while the admin benchmark runs
            tasks = [asyncio.create_task(fleet.run_one(1, 0.0))]
            try:
                results: dict[str, Any] = {"client": setup.describe()}
                with probe.phase("admin_ops"):
                    results["admin_ops"] = await admin_ops(client, admin_s)
                with probe.phase("admin_ops_one_client"):
                    results["admin_ops_one_client"] = await admin_ops(
                        client, admin_s, workers=1, prefix="admin-one"
                    )
                # The bulk requests are built now: building 100,000 assignments takes the harness's own
                # event loop for a second, which would show up as heartbeat latency in the bulk window.
                per_topic = 1000
                topic_count = partitions // per_topic
                bulk = [
                    cpb.CreatableTopic(name=f"bulk-{i}", num_partitions=per_topic, replication_factor=3)
                    for i in range(topic_count)
                ]
                led = []
                for i in range(topic_count):
                    topic = cpb.CreatableTopic(name=f"led-by-1-{i}")
                    for p in range(per_topic):
                        other = 2 + (i * per_topic + p) % (brokers - 2)
                        topic.assignments.add(partition=p, broker_ids=[1, other, other + 1])
                    led.append(topic)
                led_request = cpb.CreateTopicsRequest(topics=led)
                start = time.monotonic()
                others = list(range(2, brokers + 1))
                if setup.broker_processes > 0:
                    workers = FleetWorkers(
                        targets, quorum.cluster_id, others, brokers, fleet.interval_s,
                        setup.broker_processes, setup.loop, setup.heartbeat_stream,
                    )  # fmt: skip
                    await workers.register()
                else:
                    await gather_limited(32, [fleet.register(b) for b in others])
                registration_s = time.monotonic() - start
                probe.mark("registration", start, start + registration_s)
                if workers is not None:
                    await workers.start_beating()
                else:
                    tasks += [
                        asyncio.create_task(fleet.run_one(b, beat_offset_s(b, brokers, fleet.interval_s)))
                        for b in fleet.epochs
                        if b != 1
                    ]
                idle_start = time.monotonic()
                await asyncio.sleep(idle_s)
                idle_end = time.monotonic()
                probe.mark("heartbeats_idle", idle_start, idle_end)

                # The lone writer again, now with every broker registered and heartbeating: placement
                # over 1,000 brokers costs the active controller per create (session 10: ~0.9 ms), which
                # the 1-broker measurement above never shows.
                with probe.phase("admin_ops_one_client_all_brokers"):
                    results["admin_ops_one_client_all_brokers"] = {
                        "brokers_registered": brokers,
                        **await admin_ops(client, admin_s, workers=1, prefix="admin-one-fleet"),
                    }
                one_fleet_end = time.monotonic()
                before = await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
                counters_before_bulk = await asyncio.to_thread(raft_counters, quorum)
                # Session 16: each controller's replay against the commits, sampled through the bulk
                # phase and after it (bench.replay_lag).
                lag = LagSampler(
                    quorum.metrics_ports, {node_id: node.pid for node_id, node in quorum.nodes.items()}
                )
                lag.start()
                # Session 17: what each main thread waits on when it neither runs nor queues.
                waits = WaitSampler({node_id: node.pid for node_id, node in quorum.nodes.items()})
                waits.start()
                # Session 18: who had the CPUs while a heartbeat was slow (bench.thread_sampler), opt-in.
                threads = ThreadSampler(
                    {
                        **{f"node-{node_id}": node.pid for node_id, node in quorum.nodes.items() if node.pid},
                        "bench": os.getpid(),
                    },
                    interval_s=thread_sample_ms / 1000,
                )
                if thread_sample_ms > 0:
                    threads.start()
                bulk_start = time.monotonic()

                cpu_before = cpu_marks(quorum) if cpu else {}
                start = time.monotonic()
                created = await client.call(lambda s: s.CreateTopics, cpb.CreateTopicsRequest(topics=bulk))
                create_s = time.monotonic() - start
                probe.mark("create_partitions", start, start + create_s)
                if cpu:
                    results["cpu_create_partitions"] = cpu_between(
                        cpu_before, cpu_marks(quorum), create_s, before.controller_id
                    )
                check_created(created)

                led_start = time.monotonic()
                with probe.phase("create_led_by_1"):
                    check_created(await client.call(lambda s: s.CreateTopics, led_request))
                led_end = time.monotonic()
                cluster = await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
                leading = next(b.leader_count for b in cluster.brokers if b.broker_id == 1)

                fleet.stopped.add(1)  # broker 1 is going away: it may (and will) be fenced
                cpu_before = cpu_marks(quorum) if cpu else {}
                start = time.monotonic()
                shutdown = await client.call(
                    lambda s: s.ShutdownBroker, cpb.ShutdownBrokerRequest(broker_id=1)
                )
                shutdown_s = time.monotonic() - start
                probe.mark("controlled_shutdown", start, start + shutdown_s)
                if cpu:
                    results["cpu_controlled_shutdown"] = cpu_between(
                        cpu_before, cpu_marks(quorum), shutdown_s, cluster.controller_id
                    )
                bulk_end = time.monotonic()
                counters_after_bulk = await asyncio.to_thread(raft_counters, quorum)
                await asyncio.sleep(4.0)  # let heartbeats after the bulk phase be measured too
                settle_end = time.monotonic()
                if thread_sample_ms > 0:
                    # on past the window: a heartbeat sent in its last moments is answered after it
                    await asyncio.sleep(2.0)
                    threads.stop()
                counters_settle_end = await asyncio.to_thread(raft_counters, quorum)
                probe.mark("heartbeats_during_bulk", bulk_start, bulk_end)
                probe.mark("heartbeats_after_bulk", bulk_end, settle_end)
                cluster = await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
            except BaseException:
                if workers is not None:
                    workers.close()  # the run failed: kill the workers, nothing to merge
                raise
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await ticker.stop()
                await fleet.close_streams()
                await beats.close()
                pauses.uninstall()
            fleet.tag_client_lags(ticker)
            fleet.gc_pauses.extend(pauses.pauses)
            if workers is not None:
                try:
                    await workers.stop(fleet)
                finally:
                    workers.close()
            states: dict[str, int] = {}
            for broker in cluster.brokers:
                if broker.broker_id != 1:
                    states[broker.state] = states.get(broker.state, 0) + 1
            results["heartbeats"] = {
                "brokers": brokers,
                "interval_ms": int(fleet.interval_s * 1000),
                "registration_seconds": round(registration_s, 2),
                "idle": fleet.window(idle_start, idle_end),
                "during_one_client_creates": fleet.window(idle_end, one_fleet_end),
                "during_bulk_operations": fleet.window(bulk_start, bulk_end),
                "after_bulk_operations": fleet.window(bulk_end, settle_end),
                "errors": fleet.errors,
                "false_fencing": len(fleet.fenced_after_unfence),
                "final_states_other_brokers": states,
                "target_p99_ms": 50,
                # The p99 target is for a fleet heartbeating steadily; report the bulk
                # windows against it too, so a loop stall during bulk writes is not hidden.
                "meets_target": fleet.window(idle_start, idle_end)["p99_ms"] <= 50
                and not fleet.fenced_after_unfence,
                "meets_target_during_bulk": fleet.window(bulk_start, bulk_end)["p99_ms"] <= 50,
            }
            results["raft_during_bulk"] = raft_phase(
                counters_before_bulk, counters_after_bulk, before.controller_id
            )
            # The 4 s after it (session 12): where its slowest heartbeats were (250 ms bins from the
            # shutdown's answer), and what the quorum did meanwhile (events by kind, GC, the lease).
            results["heartbeats"]["after_bulk_timeline"] = fleet.timeline(bulk_end, settle_end, 0.25)
            results["raft_after_bulk"] = raft_phase(
                counters_after_bulk, counters_settle_end, before.controller_id
            )
            if thread_sample_ms > 0:
                # the slowest heartbeats of each window grouped into stalls, each with what every thread of
                # the nodes and of this process did then (s after the window's start; the nodes' stall
                # sampler lines too when observability.stall.sampler.ms is set)
                waits_of = [(beat.sent, beat.sent + beat.latency) for beat in fleet.latencies]
                logs = {node_id: node.log_path for node_id, node in quorum.nodes.items()}
                results["slow_heartbeats"] = {
                    "leader": f"node-{before.controller_id}",
                    "interval_ms": thread_sample_ms,
                    "after_bulk": slow_beat_report(threads, waits_of, bulk_end, settle_end, logs=logs),
                    "during_bulk": slow_beat_report(
                        threads, waits_of, bulk_start, bulk_end, share=0.01, logs=logs, with_timeline=False
                    ),
                }
            # A Raft leader change during the bulk phase shows up as a newer controller epoch.
            results["controller_epochs"] = {
                "before_bulk": before.controller_epoch,
                "after_bulk": cluster.controller_epoch,
                "leader_changes_during_bulk": cluster.controller_epoch - before.controller_epoch,
            }
            results["create_partitions"] = {
                "partitions": partitions,
                "topics": topic_count,
                "requests": 1,
                "replication_factor": 3,
                "seconds": round(create_s, 2),
                "partitions_per_second": round(partitions / create_s),
            }
            # Session 16: where each controller's image-store saves started against the bulk phase's parts
            # (waiting, after every measurement, for each node's first save after the bulk work: the
            # nodes are killed when this returns).
            store_logs = {node_id: node.log_path for node_id, node in quorum.nodes.items()}
            waited_s = await wait_for_saves(store_logs, bulk_end, timeout_s=15.0)
            results["image_store_saves"] = saves_by_phase(
                store_logs,
                {
                    "create_partitions": (bulk_start, led_start),
                    "create_led_by_1": (led_start, led_end),
                    "controlled_shutdown": (led_end, bulk_end),
                    "after_bulk": (bulk_end, settle_end),
                    "later": (settle_end, float("inf")),
                },
                bulk_start,
            )
            results["image_store_saves"]["waited_after_run_s"] = waited_s
            lag.stop()
            waits.stop()
            results["replay_lag"] = summarize(
                lag.samples, cluster.controller_id, bulk_start, bulk_end, waits.samples
            )
            if beats_out is not None:  # every heartbeat and client stall, for lining up with node logs
                raw = {
                    "bulk": [bulk_start, bulk_end],
                    "beats": [list(beat) for beat in fleet.latencies],
                    "client_stalls": fleet.stalls,
                    "client_gc_pauses": fleet.gc_pauses,
                    "threads": thread_samples(threads) if thread_sample_ms > 0 else None,
                }
                await asyncio.to_thread(beats_out.write_text, json.dumps(raw))
            results["controlled_shutdown"] = {
                "leaderships_before": leading,
                "leaderships_after": shutdown.leaderships_remaining,
                "seconds": round(shutdown_s, 2),
                "target_seconds": 5.0,
                "meets_target": shutdown_s <= 5.0 and shutdown.leaderships_remaining == 0,
            }
            return results


async def security_point(
    quorum: ControllerQuorum, brokers: int, window_s: float, probe: CpuProbe, name: str
) -> dict[str, Any]:
    """Admin latency (1 and 16 clients) and a heartbeating fleet's latency against a started quorum (each
    window marked on ``probe`` as ``name:part``)."""
    quorum.wait_for_leader(timeout_s=60)
    targets = [node.target for node in quorum.nodes.values()]
    async with AdminClient(targets, timeout_s=120, clock=SystemClock()) as client:
        beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
        fleet = Fleet(client, beats, quorum.cluster_id, interval_s=2.0)
        tasks: list[asyncio.Task[None]] = []
        try:
            # broker 1 hosts the topics and keeps its session alive while the admin benchmark runs
            await fleet.register(1)
            tasks.append(asyncio.create_task(fleet.run_one(1, 0.0)))
            with probe.phase(f"{name}:admin_ops_one_client"):
                one = await admin_ops(client, window_s, workers=1, prefix="one")
            with probe.phase(f"{name}:admin_ops"):
                many = await admin_ops(client, window_s, workers=16, prefix="many")
            with probe.phase(f"{name}:admin_ops_64_clients"):
                most = await admin_ops(client, window_s, workers=64, prefix="most")
            await gather_limited(32, [fleet.register(b) for b in range(2, brokers + 1)])
            tasks += [
                asyncio.create_task(fleet.run_one(b, (b % brokers) * fleet.interval_s / brokers))
                for b in fleet.epochs
                if b != 1
            ]
            start = time.monotonic()
            await asyncio.sleep(2 * window_s)
            end = time.monotonic()
            probe.mark(f"{name}:heartbeats", start, end)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await fleet.close_streams()
            await beats.close()
    return {
        "admin_ops_one_client": one,
        "admin_ops": many,
        "admin_ops_64_clients": most,
        "heartbeats": {"brokers": brokers, **fleet.window(start, end), "errors": fleet.errors},
    }


def tls_overrides(quorum_size: int) -> dict[str, str]:
    """What ``kraft cluster up --tls`` adds to a node's config beyond TLS: the authorizer, with the
    controllers and the admin client as super users."""
    names = [f"controller-{i}" for i in range(1, quorum_size + 1)] + [ADMIN_CLIENT]
    return {
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": ";".join(certificate_principal(name) for name in names),
    }


def tls_comparison(
    quick: bool, base: Path, brokers: int | None = None, probe: CpuProbe | None = None
) -> dict[str, Any]:
    """:func:`security_point` on a PLAINTEXT quorum, then on an mTLS + authorizer one (one at a time)."""
    brokers = brokers or (200 if quick else 1000)
    window_s = 5.0 if quick else 10.0
    points: dict[str, Any] = {}
    probe = probe or CpuProbe()  # without one the windows are marked on a probe never started
    for name, tls in (("plaintext", False), ("tls", True)):
        overrides = {**PROFILE, **(tls_overrides(3) if tls else {})}
        with ControllerQuorum(base / name, overrides=overrides, test_append=False, tls=tls) as quorum:
            quorum.start()
            set_default_security(quorum.client_security())
            try:
                points[name] = asyncio.run(security_point(quorum, brokers, window_s, probe, name))
            finally:
                set_default_security(PLAINTEXT_SECURITY)
    cost: dict[str, float] = {}
    for part in ("admin_ops_one_client", "admin_ops", "admin_ops_64_clients", "heartbeats"):
        for stat in ("p50_ms", "p99_ms"):
            cost[f"{part}_{stat}"] = round(points["tls"][part][stat] - points["plaintext"][part][stat], 2)
    for part, clients in (("admin_ops", 16), ("admin_ops_64_clients", 64)):
        cost[f"admin_ops_{clients}_clients_throughput"] = round(
            1 - points["tls"][part]["ops_per_second"] / points["plaintext"][part]["ops_per_second"], 4
        )
    # Issue #15's targets, as bench/raft.py --tls states them for the Raft path.
    targets = {
        "tls_throughput_cost_64_clients_le_15pct": cost["admin_ops_64_clients_throughput"] <= 0.15,
        "tls_p50_cost_1_client_le_0_3ms": cost["admin_ops_one_client_p50_ms"] <= 0.3,
    }
    return {**points, "tls_cost": cost, "targets": targets}


def run_tls(
    quick: bool,
    results_path: Path,
    work_dir: Path | None = None,
    brokers: int | None = None,
    cpu_probe: bool = True,
    probe_reference_ms: float | None = None,
) -> dict[str, Any]:
    started = time.time()
    load_before = os.getloadavg()
    probe = CpuProbe()
    if cpu_probe:
        probe.start()
    try:
        if work_dir is not None:
            comparison = tls_comparison(quick, work_dir, brokers, probe)
        else:
            with tempfile.TemporaryDirectory(prefix="kraft-bench-controller-tls-") as tmp:
                comparison = tls_comparison(quick, Path(tmp), brokers, probe)
    finally:
        probe.stop()
    if cpu_probe:
        comparison["cpu_probe"] = probe.report(probe_reference_ms)
    results: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            # A shared host: the 1/5/15-minute load averages around the run say how comparable it is.
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
        },
        "quick": quick,
        "profile": dict(PROFILE),
        **comparison,
    }
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def run(
    quick: bool = False,
    results_path: Path = RESULTS_PATH,
    work_dir: Path | None = None,
    brokers: int | None = None,
    partitions: int | None = None,
    image_memory: bool = True,
    cpu: bool = False,
    cpu_probe: bool = True,
    probe_reference_ms: float | None = None,
    setup: ClientSetup = ClientSetup(),
    beats_out: Path | None = None,
    thread_sample_ms: int = 0,
) -> dict[str, Any]:
    probe = CpuProbe()
    if cpu_probe:
        probe.start()
    load_before = os.getloadavg()
    try:
        if work_dir is not None:  # kept afterwards: node logs for diagnosis
            cluster = run_loop(
                cluster_benchmarks(
                    quick, work_dir, brokers, partitions, cpu, probe, setup, beats_out, thread_sample_ms
                ),
                setup.loop,
            )
        else:
            with tempfile.TemporaryDirectory(prefix="kraft-bench-controller-") as tmp:
                cluster = run_loop(
                    cluster_benchmarks(
                        quick, Path(tmp), brokers, partitions, cpu, probe, setup, beats_out, thread_sample_ms
                    ),
                    setup.loop,
                )
        image = None
        if image_memory:
            with probe.phase("image_memory"):
                image = measure_image_memory(quick)
    finally:
        probe.stop()
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
        },
        "quick": quick,
        "profile": dict(PROFILE),
        **cluster,
    }
    if image is not None:
        results["image_memory"] = image
    if cpu_probe:
        results["cpu_probe"] = probe.report(probe_reference_ms)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller fleet and image, shorter windows")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="compare PLAINTEXT with mTLS + authorizer (admin and heartbeat latency) instead",
    )
    parser.add_argument("--out", type=Path, help=f"default {RESULTS_PATH} ({TLS_RESULTS_PATH} with --tls)")
    parser.add_argument("--work-dir", type=Path, help="keep the quorum's data and logs here")
    parser.add_argument("--brokers", type=int, help="simulated brokers (default 1,000; --quick 200)")
    parser.add_argument(
        "--partitions", type=int, help="partitions per bulk phase (default 100,000; --quick 20,000)"
    )
    parser.add_argument("--no-image-memory", action="store_true", help="skip the image memory child")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also report each controller's and the harness's CPU (and busiest threads) during the bulk "
        "creation and the controlled shutdown (/proc; extra keys cpu_create_partitions, "
        "cpu_controlled_shutdown)",
    )
    parser.add_argument(
        "--no-cpu-probe",
        action="store_true",
        help="run no CPU-speed probe beside the benchmark (bench.cpu_probe; by default it samples a fixed "
        "loop every 0.25 s, ~2-4 %% of one core, and reports the host's speed per phase under cpu_probe)",
    )
    parser.add_argument(
        "--probe-reference-ms",
        type=float,
        help="the probe's reference ms per sample (fast mode) shared by a series of runs; default the "
        "run's own 10th percentile",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a controller config override on top of the profile (A/B runs), e.g. "
        "controller.request.intake.thread=false",
    )
    parser.add_argument(
        "--broker-processes",
        type=int,
        default=ClientSetup().broker_processes,
        metavar="K",
        help="simulated brokers 2..N heartbeat from K worker processes (default %(default)s: from the "
        "benchmark's own process, as in every session up to 10)",
    )
    parser.add_argument(
        "--client-loop",
        choices=("uvloop", "asyncio"),
        default=ClientSetup().loop,
        help="the event loop of the benchmark's client and its workers (default %(default)s)",
    )
    parser.add_argument(
        "--worker-client",
        action="store_true",
        help="session 11's alternative client: --broker-processes 1 --client-loop uvloop",
    )
    parser.add_argument(
        "--beats-out",
        type=Path,
        help="also write every heartbeat (sent, latency, send lateness, client lag) and client loop stall "
        "as JSON here (with --work-dir and --set observability.stall.sampler.ms=N: line them up with the "
        "nodes' event=stall_sampled log lines)",
    )
    parser.add_argument(
        "--heartbeat-unary",
        action="store_true",
        help="the simulated brokers send each heartbeat as a unary BrokerHeartbeat call (before session 15) "
        "instead of over one BrokerHeartbeatStream each (broker.heartbeat.stream, a broker's default)",
    )
    parser.add_argument(
        "--thread-sample-ms",
        type=int,
        default=0,
        metavar="MS",
        help="sample every thread of the nodes and of this process (schedstat, the GIL's futex) every MS ms "
        "through the bulk phase and after it, and report the slowest heartbeats' stalls with what each "
        "thread did then (slow_heartbeats; bench.thread_sampler; default 0: off)",
    )
    parser.add_argument("--image-memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.broker_processes < 0:
        parser.error("--broker-processes must not be negative")
    setup = WORKER_CLIENT if args.worker_client else ClientSetup(args.client_loop, args.broker_processes)
    setup = replace(setup, heartbeat_stream=not args.heartbeat_unary)
    for setting in args.set:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=VALUE, got {setting!r}")
        PROFILE[key] = value
    if args.image_memory_child:
        topics, per_topic, brokers = (int(v) for v in args.image_memory_child.split(","))
        print(json.dumps(image_memory_child(topics, per_topic, brokers)))
        return 0
    # This one process plays 1,000 brokers: like the controllers (kraft.node.metadata_layer), let gRPC's
    # completion-queue thread get the GIL often, or the harness itself delays the heartbeats it measures.
    sys.setswitchinterval(0.0001)
    if args.tls:
        results = run_tls(
            args.quick,
            args.out or TLS_RESULTS_PATH,
            args.work_dir,
            args.brokers,
            not args.no_cpu_probe,
            args.probe_reference_ms,
        )
        print(json.dumps(results, indent=2))
        return 0
    results = run(
        args.quick,
        args.out or RESULTS_PATH,
        args.work_dir,
        args.brokers,
        args.partitions,
        not args.no_image_memory,
        args.cpu,
        not args.no_cpu_probe,
        args.probe_reference_ms,
        setup,
        args.beats_out,
        args.thread_sample_ms,
    )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
