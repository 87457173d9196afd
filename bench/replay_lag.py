"""How far each controller's replay lags the quorum's commits during and after bulk work (issue #17,
session 16).

A thread per controller samples, every ``interval_s``, its ``kraft_controller_last_applied_record_offset``
(what its listener has replayed into its image) and ``kraft_raft_high_watermark`` (what it knows is
committed) from its metrics endpoint, and its main thread's ``/proc/PID/task/PID/schedstat`` (the thread
that replays: ns run on a CPU, ns waiting on a run queue for one).  :func:`summarize` turns the samples
into, per node: the largest lag behind the active controller's high watermark (records), when the node's
applied offset reached the active controller's high watermark at the end of the bulk phase (seconds after
that end: the follower's catch-up, what a failover right then would first have to replay), and its main
thread's time split, during the bulk phase and from its end to that catch-up, into running, runnable but
waiting for a core (``runqueue``), and the rest (sleeping: nothing to do, or waiting on the fetch, the
fsync or the driver's turn).  A replay bound by its own CPU runs near 1.0; one starved of a core shows a
large ``runqueue`` share; one held back by waits shows neither.

The scrape is a plain text read with two line lookups (no metric-family parsing: the harness's own
loop shares this process's GIL with the simulated brokers).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

APPLIED = "kraft_controller_last_applied_record_offset"
HIGH_WATERMARK = "kraft_raft_high_watermark"

Sample = tuple[float, int, int, int, int]
"""(monotonic s, applied offset, high watermark, main thread's ns on a CPU, its ns waiting on a run queue);
-1 where not read."""


def gauge(text: str, name: str) -> int:
    """The first sample of ``name`` in a Prometheus text page (labels ignored), -1 if absent."""
    at = text.find("\n" + name)
    while at >= 0:
        line_end = text.find("\n", at + 1)
        line = text[at + 1 : line_end if line_end >= 0 else len(text)]
        rest = line[len(name) :]
        if rest[:1] in ("{", " "):
            try:
                return int(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                return -1
        at = text.find("\n" + name, at + 1)
    return -1


def main_thread_schedstat(pid: int | None) -> tuple[int, int]:
    """(ns run, ns waiting on a run queue) of ``pid``'s main thread; (-1, -1) if unreadable."""
    if pid is None:
        return -1, -1
    try:
        run_ns, wait_ns, _slices = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return -1, -1
    return int(run_ns), int(wait_ns)


WAIT_CLASSES = ("cpu", "gil", "loop", "other")
"""What :func:`wait_class` makes of a thread's ``wchan``: on a CPU or runnable (``0``: no kernel wait), a
futex (in a CPython process's main thread: the GIL, held by another of its threads), the event loop's
epoll (nothing to do: the asyncio task that replays is waiting for its turn, the driver or the next
commit), anything else (a disk read, a pipe)."""


def wait_class(wchan: str) -> str:
    """The class (:data:`WAIT_CLASSES`) of a thread whose ``/proc/.../wchan`` reads ``wchan``."""
    name = wchan.strip()
    if name in ("", "0"):
        return "cpu"
    if "futex" in name:
        return "gil"
    if "epoll" in name or name.startswith("ep_poll"):
        return "loop"
    return "other"


class WaitSampler:
    """Samples every node's main-thread ``wchan`` every ``interval_s`` on one thread: schedstat's shares
    say how long the thread ran or queued for a core, not what it waited on otherwise; the wait's
    kernel function does (session 17)."""

    def __init__(self, pids: Mapping[int, int | None], interval_s: float = 0.01) -> None:
        self._paths = {node: f"/proc/{pid}/task/{pid}/wchan" for node, pid in pids.items() if pid}
        self._interval_s = interval_s
        self.samples: dict[int, list[tuple[float, str]]] = {node: [] for node in self._paths}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replay-lag-wchan", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            for node, path in self._paths.items():
                try:
                    with open(path) as handle:
                        name = handle.read()
                except OSError:
                    continue
                self.samples[node].append((asked, wait_class(name)))
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - asked)))


def wait_shares(rows: list[tuple[float, str]], start: float, end: float) -> dict[str, float] | None:
    """The share of the samples inside [start, end] in each of :data:`WAIT_CLASSES` (None: none)."""
    inside = [kind for when, kind in rows if start <= when <= end]
    if not inside:
        return None
    return {kind: round(inside.count(kind) / len(inside), 2) for kind in WAIT_CLASSES}


class LagSampler:
    """Samples every node's applied offset, high watermark and main-thread CPU on a thread of its own."""

    def __init__(self, ports: Mapping[int, int], pids: Mapping[int, int | None], interval_s: float = 0.25):
        self._ports = dict(ports)
        self._pids = dict(pids)
        self._interval_s = interval_s
        self.samples: dict[int, list[Sample]] = {node: [] for node in self._ports}
        self._stop = threading.Event()
        # one thread per node: a node busy answering its scrape late does not delay the others' samples
        self._threads = [
            threading.Thread(target=self._run, args=(node,), name=f"replay-lag-{node}", daemon=True)
            for node in self._ports
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5.0)

    def _run(self, node: int) -> None:
        url = f"http://127.0.0.1:{self._ports[node]}/metrics"
        rows = self.samples[node]
        while not self._stop.is_set():
            asked = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    text = "\n" + response.read().decode()
            except OSError:
                text = ""
            if text:
                # stamped when the page was asked for: the gauges are at least that new
                run_ns, wait_ns = main_thread_schedstat(self._pids.get(node))
                rows.append((asked, gauge(text, APPLIED), gauge(text, HIGH_WATERMARK), run_ns, wait_ns))
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - asked)))


def summarize(
    samples: Mapping[int, list[Sample]],
    leader: int,
    bulk_start: float,
    bulk_end: float,
    waits: Mapping[int, list[tuple[float, str]]] | None = None,
) -> dict[str, Any]:
    """Per node: the largest lag behind the leader's high watermark (records, and when, s from the bulk
    phase's start), when the node's applied offset reached the leader's high watermark at ``bulk_end``
    (the first leader sample asked for after it; s after ``bulk_end``; None: not within the samples),
    the main thread's running and run-queue shares during the bulk phase and from its end to that
    catch-up, and a
    timeline in 0.5-s bins (s from the bulk start: applied, the node's own high watermark, the
    leader's).  With ``waits`` (:class:`WaitSampler`'s samples), also the main thread's wait classes in
    the same two windows (``main_thread_waits``)."""
    leader_samples = samples.get(leader, [])

    def leader_hwm(at: float) -> int:
        best = -1
        for when, _applied, hwm, *_ in leader_samples:
            if when > at:
                break
            best = hwm
        return best

    after_end = [hwm for when, _applied, hwm, *_ in leader_samples if when >= bulk_end]
    target = after_end[0] if after_end else -1
    out: dict[str, Any] = {"leader": leader, "leader_hwm_after_bulk_end": target}
    for node, every in samples.items():
        rows = [row for row in every if row[0] >= bulk_start - 0.5]
        if not rows:
            continue
        worst, worst_at = 0, 0.0
        # (the applied offset is the last record's, the high watermark the offset after it: +1)
        for when, applied, _hwm, *_ in rows:
            lag = leader_hwm(when) - (applied + 1)
            if applied >= 0 and lag > worst:
                worst, worst_at = lag, when - bulk_start
        caught: float | None = None
        for when, applied, _hwm, *_ in rows:
            if when >= bulk_end and applied + 1 >= target >= 0:
                caught = when
                break
        end = caught if caught is not None else rows[-1][0]
        timeline: list[list[float]] = []
        next_bin = bulk_start
        for when, applied, hwm, *_ in rows:
            if when >= next_bin:
                timeline.append([round(when - bulk_start, 2), applied, hwm, leader_hwm(when)])
                next_bin = when + 0.5
        out[f"node-{node}"] = {
            "max_lag_records": worst,
            "max_lag_at_s": round(worst_at, 2),
            "caught_up_after_bulk_s": None if caught is None else round(caught - bulk_end, 2),
            "main_thread": {
                "bulk": thread_shares(rows, bulk_start, bulk_end),
                "until_caught_up": thread_shares(rows, bulk_end, end),
            },
            "timeline": timeline,
        }
        if waits is not None and node in waits:
            out[f"node-{node}"]["main_thread_waits"] = {
                "bulk": wait_shares(waits[node], bulk_start, bulk_end),
                "until_caught_up": wait_shares(waits[node], bulk_end, end),
            }
    return out


def thread_shares(rows: list[Sample], start: float, end: float) -> dict[str, float] | None:
    """The main thread's share of the wall time between the first and last sample inside [start, end]
    spent running and waiting on a run queue (None: fewer than two samples there)."""
    inside = [row for row in rows if start <= row[0] <= end and row[3] >= 0]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    wall_ns = (inside[-1][0] - inside[0][0]) * 1e9
    return {
        "running": round((inside[-1][3] - inside[0][3]) / wall_ns, 2),
        "runqueue": round((inside[-1][4] - inside[0][4]) / wall_ns, 2),
    }
