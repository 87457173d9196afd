"""Where a request's time goes on the active controller: ``kraft_request_stage_seconds`` scraped from a
node's Prometheus endpoint before and after a window, the difference summarised per (request, stage).

Stages (see kraft/observability/metrics.py): ``hop_in`` (intake thread → main loop), ``queue_wait``
(event queue), ``event`` (logic + append), ``commit_wait`` (its own records) or ``dependency_wait`` (no
records: earlier writes it depends on), ``handler`` (all main-loop time), ``hop_out`` (main loop → intake
thread), ``total`` (intake handler entry → answer).  Percentiles are bucket upper bounds (coarse); the
mean is exact.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kraft.cluster.quorum import ControllerQuorum
from kraft.netutil import free_port

STAGE_METRIC = "kraft_request_stage_seconds"

# (request, stage) → (sum of seconds, [(upper bound, cumulative count), ...])
Snapshot = dict[tuple[str, str], tuple[float, list[tuple[float, float]]]]


@dataclass
class MeteredQuorum(ControllerQuorum):
    """A quorum whose nodes serve Prometheus metrics on ports of their own."""

    metrics_ports: dict[int, int] = field(default_factory=dict)

    def config_text(self, node_id: int) -> str:
        port = self.metrics_ports.setdefault(node_id, free_port())
        return super().config_text(node_id) + f"metrics.port={port}\nmetrics.host=127.0.0.1\n"


def _scrape(port: int) -> Snapshot:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5.0) as answer:
        text = answer.read().decode()
    sums: dict[tuple[str, str], float] = {}
    buckets: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != STAGE_METRIC:
            continue
        for sample in family.samples:
            key = (sample.labels.get("request", ""), sample.labels.get("stage", ""))
            if sample.name.endswith("_sum"):
                sums[key] = sample.value
            elif sample.name.endswith("_bucket"):
                buckets.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
    return {key: (sums.get(key, 0.0), sorted(found)) for key, found in buckets.items()}


async def scrape(port: int) -> Snapshot:
    """One scrape, off the caller's event loop (the harness times heartbeats on it)."""
    return await asyncio.to_thread(_scrape, port)


def _quantile(counts: list[tuple[float, float]], total: float, q: float) -> float:
    want = q * total
    for bound, cumulative in counts:
        if cumulative >= want:
            return bound
    return math.inf


def summarise(before: Snapshot, after: Snapshot, requests: tuple[str, ...]) -> dict[str, Any]:
    """Per request, per stage: count, mean and bucketed p50/p99 (ms) of what happened between the scrapes."""
    out: dict[str, dict[str, Any]] = {}
    for (request, stage), (total_s, counts) in sorted(after.items()):
        if request not in requests:
            continue
        base_sum, base_counts = before.get((request, stage), (0.0, []))
        base = dict(base_counts)
        diff = [(bound, cumulative - base.get(bound, 0.0)) for bound, cumulative in counts]
        n = diff[-1][1] if diff else 0.0
        if n <= 0:
            continue
        out.setdefault(request, {})[stage] = {
            "count": int(n),
            "mean_ms": round((total_s - base_sum) / n * 1000, 3),
            "p50_le_ms": round(_quantile(diff, n, 0.5) * 1000, 2),
            "p99_le_ms": round(_quantile(diff, n, 0.99) * 1000, 2),
        }
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle so far (every process of the machine, other users' too)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuWindow:
    """CPU used per controller process, by this harness and by the whole machine over a window: whether
    the machine had cores to spare while latency was measured."""

    pids: dict[int, int]
    start: dict[str, float] = field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        now = {f"node{node}": cpu_seconds(pid) for node, pid in self.pids.items()}
        now["harness"] = cpu_seconds(os.getpid())
        now["machine"] = machine_busy_seconds()
        now["wall"] = time.monotonic()
        return now

    def begin(self) -> None:
        self.start = self._now()

    def end(self, leader: int) -> dict[str, Any]:
        now = self._now()
        wall = now["wall"] - self.start["wall"]
        used = {key: now[key] - self.start[key] for key in now if key != "wall"}
        return {
            "wall_seconds": round(wall, 2),
            "cores": os.cpu_count(),
            "leader": f"node{leader}",
            "cpu_seconds": {key: round(value, 2) for key, value in used.items()},
            "cores_busy": {key: round(value / wall, 2) for key, value in used.items()},
        }
