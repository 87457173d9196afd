"""What every thread of the benchmark's processes did while a heartbeat was slow (issue #17, session 18).

A heartbeat answered on the leader's intake thread takes ~1 ms; one that takes 20-60 ms after the bulk
work waited for something: a core (the kernel had the thread runnable, no CPU free), the GIL (another
thread of its process ran Python or a long C call), or its own loop's queue.  The nodes' stall samplers
(``observability.stall.sampler.ms``) tell a node's loop lag and its sleeping thread's wake-up delay; this
sampler, in the benchmark's process, tells who had the CPUs then: every ``interval_s`` it reads each
thread's ``/proc/PID/task/TID/schedstat`` (ns run on a CPU, ns runnable on a run queue) of the named
processes, the host's busy time (``/proc/stat``), and the ``wchan`` of the threads whose name is in
``wchan_comms`` (a futex in a CPython thread that wants to run Python: the GIL).  A process's main thread is
named ``main`` (its ``comm`` is ``python``, as is every thread CPython started without a kernel name — this
sampler's own thread names itself ``thread-sampler``).

:func:`stall_clusters` groups the slowest heartbeats of a window into stalls (heartbeats whose waits
overlap), and :func:`breakdown` says, for one stall's interval, each process's threads' ms running and ms
runnable-without-a-core, the host's busy cores and the part of them no sampled process used (other work on
the host).  A stall the leader's intake thread spent runnable is a CPU shortage; one it spent asleep
while another of its threads ran is the GIL; one where nothing of the leader was waiting points away
from the leader (the client, the network path).

Cost: one ``pread`` per thread per sample on files kept open (the threads listed again every
``rescan_every`` samples), in the calling process and under its GIL: ~0.3 ms of CPU per sample of 60
threads (~1.5 % of a core at 20 ms; 2.6 ms with an open and close per file, as r2-r4 of session 18 ran it),
only between :meth:`ThreadSampler.start` and :meth:`ThreadSampler.stop`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.replay_lag import wait_class
from kraft.observability.thread_names import named_target

ThreadKey = tuple[str, int]
"""(process name as given to the sampler, thread id)."""

USER_HZ = os.sysconf("SC_CLK_TCK")


@dataclass
class Snapshot:
    """One sample: its monotonic time, each thread's cumulative (ns run, ns runnable-waiting), and the
    host's cumulative busy ticks (all CPUs, ``/proc/stat``; -1 if unread)."""

    at: float
    threads: dict[ThreadKey, tuple[int, int]]
    host_busy_ticks: int


@dataclass
class ThreadSampler:
    """Samples the threads of ``pids`` (name -> pid) every ``interval_s`` on a thread of its own."""

    pids: Mapping[str, int]
    interval_s: float = 0.02
    wchan_comms: frozenset[str] = frozenset({"main", "grpc-intake"})
    snapshots: list[Snapshot] = field(default_factory=list)
    names: dict[ThreadKey, str] = field(default_factory=dict)
    """Each sampled thread's ``comm`` (as first read)."""
    wchans: list[tuple[float, ThreadKey, str]] = field(default_factory=list)
    """(time, thread, :func:`bench.replay_lag.wait_class` of its wchan) for the ``wchan_comms`` threads."""

    rescan_every: int = 25
    """Samples between two listings of the processes' threads (a thread started in between is sampled from
    the next listing on; the nodes' threads live as long as the node)."""

    def __post_init__(self) -> None:
        # Each sampled file stays open and is re-read with pread (a /proc file regenerates its content at
        # offset 0): an open and close per file per sample cost ~2.6 ms of CPU for 60 threads.
        self._fds: dict[ThreadKey, tuple[int, int | None]] = {}
        self._stat_fd: int | None = None
        self._samples = 0
        self._stop = threading.Event()
        run = named_target("thread-sampler", self._run)  # not one more ``python`` in the report
        self._thread = threading.Thread(target=run, name="thread-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self.close()

    def close(self) -> None:
        """Close the files kept open (after the last :meth:`sample`)."""
        for schedstat, wchan in self._fds.values():
            for fd in (schedstat, wchan):
                if fd is not None:
                    os.close(fd)
        self._fds.clear()
        if self._stat_fd is not None:
            os.close(self._stat_fd)
            self._stat_fd = None

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            self.sample(asked)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - asked)))

    def _rescan(self) -> None:
        """Open the files of every thread of the processes not open yet."""
        for name, pid in self.pids.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for text in tids:
                key = (name, int(text))
                if key in self._fds:
                    continue
                base = f"/proc/{pid}/task/{text}"
                try:
                    if key not in self.names:
                        with open(f"{base}/comm") as handle:
                            self.names[key] = "main" if key[1] == pid else handle.read().strip()
                    schedstat = os.open(f"{base}/schedstat", os.O_RDONLY)
                except OSError:
                    continue  # the thread ended meanwhile
                wchan = None
                if self.names[key] in self.wchan_comms:
                    try:
                        wchan = os.open(f"{base}/wchan", os.O_RDONLY)
                    except OSError:
                        wchan = None
                self._fds[key] = (schedstat, wchan)

    def sample(self, at: float) -> None:
        if self._samples % self.rescan_every == 0:
            self._rescan()
        self._samples += 1
        threads: dict[ThreadKey, tuple[int, int]] = {}
        gone: list[ThreadKey] = []
        for key, (schedstat, wchan) in self._fds.items():
            try:
                run_ns, wait_ns, _slices = os.pread(schedstat, 128, 0).split()
                if wchan is not None:
                    self.wchans.append((at, key, wait_class(os.pread(wchan, 128, 0).decode())))
            except (OSError, ValueError):
                gone.append(key)  # the thread ended
                continue
            threads[key] = (int(run_ns), int(wait_ns))
        for key in gone:
            for fd in self._fds.pop(key):
                if fd is not None:
                    os.close(fd)
        if self._stat_fd is None:
            with contextlib.suppress(OSError):
                self._stat_fd = os.open("/proc/stat", os.O_RDONLY)
        self.snapshots.append(Snapshot(at, threads, host_busy_ticks(self._stat_fd)))


def host_busy_ticks(fd: int | None = None) -> int:
    """All CPUs' busy ticks since boot (``/proc/stat``'s ``cpu`` line: user, nice, system, irq, softirq;
    not idle, iowait or steal — a vCPU the hypervisor did not run is busy with nobody's work here); read
    through ``fd`` if given, an open ``/proc/stat``; -1 if unread."""
    try:
        if fd is None:
            with open("/proc/stat", "rb") as handle:
                line = handle.readline()
        else:
            line = os.pread(fd, 256, 0).split(b"\n", 1)[0]
        values = [int(value) for value in line.split()[1:]]
    except (OSError, ValueError):
        return -1
    # user nice system idle iowait irq softirq steal [guest guest_nice: already counted in user/nice]
    user, nice, system, _idle, _iowait, irq, softirq = values[:7]
    return user + nice + system + irq + softirq


def _around(snapshots: Sequence[Snapshot], start: float, end: float) -> tuple[Snapshot, Snapshot] | None:
    """The last snapshot at or before ``start`` and the first at or after ``end`` (the interval they span
    covers [start, end]); None if the samples do not cover it."""
    before = [snap for snap in snapshots if snap.at <= start]
    after = [snap for snap in snapshots if snap.at >= end]
    if not before or not after:
        return None
    return before[-1], after[0]


def breakdown(
    snapshots: Sequence[Snapshot], names: Mapping[ThreadKey, str], start: float, end: float
) -> dict[str, Any] | None:
    """What the sampled threads did over [start, end] (widened to the samples around it): the span, per
    process its threads' ms running and ms runnable-waiting (by thread name, threads of one name summed;
    only names with at least 1 ms), the host's busy cores and the cores no sampled thread used
    (``other_cores``).  None if the samples do not cover the interval."""
    pair = _around(snapshots, start, end)
    if pair is None:
        return None
    first, last = pair
    span_s = last.at - first.at
    if span_s <= 0:
        return None
    processes: dict[str, dict[str, list[float]]] = {}
    ours_ns = 0
    for key, (run_ns, wait_ns) in last.threads.items():
        run0, wait0 = first.threads.get(key, (0, 0))  # a thread born inside the span: all of its time
        ran, waited = run_ns - run0, wait_ns - wait0
        ours_ns += ran
        process, _tid = key
        per_name = processes.setdefault(process, {})
        row = per_name.setdefault(names.get(key, "?"), [0.0, 0.0])
        row[0] += ran / 1e6
        row[1] += waited / 1e6
    out: dict[str, Any] = {"span_ms": round(span_s * 1000, 1)}
    for process in sorted(processes):
        out[process] = {
            name: [round(ran, 1), round(waited, 1)]
            for name, (ran, waited) in sorted(processes[process].items(), key=lambda item: -sum(item[1]))
            if ran + waited >= 1.0
        }
    if first.host_busy_ticks >= 0 and last.host_busy_ticks >= 0:
        busy_s = (last.host_busy_ticks - first.host_busy_ticks) / USER_HZ
        out["host_busy_cores"] = round(busy_s / span_s, 2)
        out["other_cores"] = round(max(0.0, busy_s - ours_ns / 1e9) / span_s, 2)
    return out


def wchan_shares(
    wchans: Sequence[tuple[float, ThreadKey, str]], names: Mapping[ThreadKey, str], start: float, end: float
) -> dict[str, dict[str, int]]:
    """Per ``process/thread name``: how many wchan samples inside [start, end] fell in each wait class."""
    out: dict[str, dict[str, int]] = {}
    for at, key, kind in wchans:
        if start <= at <= end:
            row = out.setdefault(f"{key[0]}/{names.get(key, '?')}", {})
            row[kind] = row.get(kind, 0) + 1
    return out


Wait = tuple[float, float]
"""A slow heartbeat as (sent, answered) monotonic seconds."""


def stall_clusters(waits: Sequence[Wait], gap_s: float = 0.0) -> list[list[Wait]]:
    """Group heartbeat waits whose [sent, answered] intervals overlap (or are within ``gap_s`` of each
    other) — one stall slows every heartbeat in flight across it — in time order."""
    clusters: list[list[Wait]] = []
    reach = float("-inf")
    for sent, answered in sorted(waits):
        if clusters and sent <= reach + gap_s:
            clusters[-1].append((sent, answered))
            reach = max(reach, answered)
        else:
            clusters.append([(sent, answered)])
            reach = answered
    return clusters


def node_log_events(paths: Mapping[int, Path], start: float, end: float) -> list[dict[str, Any]]:
    """The nodes' ``stall_sampled`` and ``heartbeat_arrived_late`` log lines (``observability.stall.
    sampler.ms``) that ended inside [start, end]: node, what, ms, the end's monotonic s, and the GIL /
    run-queue split a sampler thread's line carries."""
    out: list[dict[str, Any]] = []
    for node, path in paths.items():
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if "event=stall_sampled" not in line and "event=heartbeat_arrived_late" not in line:
                continue
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            try:
                if fields["event"] == "stall_sampled":
                    ended = float(fields["ended_monotonic_s"])
                else:  # arrived late: it ended (reached its handler) ms after it was sent
                    ended = float(fields["sent_monotonic_s"]) + float(fields["ms"]) / 1000
            except (KeyError, ValueError):
                continue
            if start <= ended <= end:
                row: dict[str, Any] = {"node": node, "what": fields.get("what", "arrived_late")}
                row["ms"] = float(fields["ms"])
                row["ended_s"] = round(ended, 4)
                for extra in ("gil_ms", "run_queue_ms", "broker"):
                    if extra in fields:
                        row[extra] = float(fields[extra])
                out.append(row)
    return sorted(out, key=lambda row: float(row["ended_s"]))


def slow_beat_report(
    sampler: ThreadSampler,
    beats: Sequence[Wait],
    start: float,
    end: float,
    share: float = 0.02,
    logs: Mapping[int, Path] | None = None,
    clusters_max: int = 8,
    with_timeline: bool = True,
) -> dict[str, Any]:
    """The slowest ``share`` of the heartbeats sent in [start, end) grouped into stalls
    (:func:`stall_clusters`), the longest ``clusters_max`` of them each with its :func:`breakdown`,
    :func:`wchan_shares` and (``logs``) the nodes' sampler lines in it; and the whole window's breakdown
    for comparison.  Times are reported in s after ``start``."""
    inside = sorted((beat for beat in beats if start <= beat[0] < end), key=lambda beat: beat[1] - beat[0])
    slowest = inside[int((1 - share) * len(inside)) :] if inside else []
    clusters = stall_clusters(slowest)
    clusters.sort(key=lambda cluster: -max(answered - sent for sent, answered in cluster))
    rows: list[dict[str, Any]] = []
    for cluster in clusters[:clusters_max]:
        first = min(sent for sent, _ in cluster)
        last = max(answered for _, answered in cluster)
        row: dict[str, Any] = {
            "at_s": round(first - start, 3),
            "span_ms": round((last - first) * 1000, 1),
            "heartbeats": len(cluster),
            "max_ms": round(max(answered - sent for sent, answered in cluster) * 1000, 1),
            "threads": breakdown(sampler.snapshots, sampler.names, first, last),
            "wchan": wchan_shares(sampler.wchans, sampler.names, first, last),
        }
        if logs is not None:
            events = node_log_events(logs, first, last + 0.05)
            # the samplers' lines one by one; the heartbeats that reached a handler late, per node as
            # [count, max ms] (one line per heartbeat: hundreds in a long stall)
            row["node_logs"] = [
                {**event, "ended_s": round(float(event["ended_s"]) - start, 3)}
                for event in events
                if event["what"] != "arrived_late"
            ]
            late: dict[str, list[float]] = {}
            for event in events:
                if event["what"] == "arrived_late":
                    count_max = late.setdefault(f"node-{event['node']}", [0, 0.0])
                    count_max[0] += 1
                    count_max[1] = max(count_max[1], float(event["ms"]))
            row["arrived_late"] = late
        rows.append(row)
    return {
        "heartbeats": len(inside),
        "slowest": len(slowest),
        "slowest_min_ms": round((slowest[0][1] - slowest[0][0]) * 1000, 1) if slowest else None,
        "stalls": len(clusters),
        "longest": rows,
        "window": breakdown(sampler.snapshots, sampler.names, start, end),
        "timeline": timeline(sampler.snapshots, sampler.names, start, end, 0.25) if with_timeline else None,
    }


def timeline(
    snapshots: Sequence[Snapshot], names: Mapping[ThreadKey, str], start: float, end: float, bin_s: float
) -> list[dict[str, Any]]:
    """Who ran in each ``bin_s`` of [start, end): per bin its start (s after ``start``), each process's
    ms running and ms runnable-waiting in all its threads ([run, wait]), its image-store thread's ms
    running where it ran (a save), and the host's cores used by no sampled thread."""
    out: list[dict[str, Any]] = []
    at = start
    while at < end - 1e-9:
        cut = breakdown(snapshots, names, at, min(end, at + bin_s))
        if cut is not None:
            row: dict[str, Any] = {"at_s": round(at - start, 2)}
            for process, threads in cut.items():
                if not isinstance(threads, dict):
                    continue
                row[process] = [
                    round(sum(v[0] for v in threads.values())),
                    round(sum(v[1] for v in threads.values())),
                ]
                if "image-store" in threads:
                    row[f"{process}/image-store"] = round(threads["image-store"][0])
            row["other_cores"] = cut.get("other_cores")
            out.append(row)
        at += bin_s
    return out


def raw(sampler: ThreadSampler) -> dict[str, Any]:
    """The samples as JSON-able lists, for lining up offline (``--beats-out``): thread names
    (``process/tid`` -> comm), snapshots [at, host busy ticks, {``process/tid``: [run ns, wait ns]}], and
    wchan samples [at, ``process/tid``, class]."""
    return {
        "names": {f"{p}/{t}": name for (p, t), name in sampler.names.items()},
        "snapshots": [
            [snap.at, snap.host_busy_ticks, {f"{p}/{t}": list(v) for (p, t), v in snap.threads.items()}]
            for snap in sampler.snapshots
        ],
        "wchans": [[at, f"{key[0]}/{key[1]}", kind] for at, key, kind in sampler.wchans],
    }
