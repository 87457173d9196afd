"""Run reports: ``report.json`` (machine-readable), ``report.html`` with PNG plots (matplotlib)."""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checkers import ClusterSample, LeaderObservation, Status, Verdict
from chaos.history import EventType, Operation
from chaos.nemesis import NemesisEvent

OPS_PLOT = "operations.png"
LEADERS_PLOT = "leaders.png"
OUTCOME_COLORS = {EventType.OK: "tab:green", EventType.FAIL: "tab:red", EventType.INFO: "tab:orange"}
_OUTCOME_MEANING = {
    EventType.OK: "ok (done)",
    EventType.FAIL: "fail (not done)",
    EventType.INFO: "info (outcome unknown)",
}


@dataclass(slots=True)
class RunReport:
    scenario: str
    seed: int
    duration_s: float
    started_unix: float
    verdicts: list[Verdict]
    operations: list[Operation] = field(default_factory=list)
    nemesis_events: list[NemesisEvent] = field(default_factory=list)
    leaders: list[LeaderObservation] = field(default_factory=list)
    healed_ns: int = 0
    reproduce: str = ""  # the command line that replays this run's seed
    samples: list[ClusterSample] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not any(v.status is Status.FAIL for v in self.verdicts)

    def origin_ns(self) -> int:
        times = [op.invoke_ns for op in self.operations] + [e.time_ns for e in self.nemesis_events]
        return min(times) if times else 0

    def to_json(self) -> dict[str, Any]:
        origin = self.origin_ns()
        outcomes = Counter(f"{op.f}:{op.outcome.value}" for op in self.operations)
        latencies = sorted(
            (op.complete_ns - op.invoke_ns) / 1e6
            for op in self.operations
            if op.outcome is EventType.OK and op.complete_ns is not None
        )
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "reproduce": self.reproduce,
            "duration_s": self.duration_s,
            "started_unix": self.started_unix,
            "valid": self.valid,
            "verdicts": [v.to_json() for v in self.verdicts],
            "operations": {
                "total": len(self.operations),
                "by_outcome": dict(sorted(outcomes.items())),
                "ok_latency_ms": _percentiles(latencies),
            },
            "nemesis": [
                {
                    "t_s": (e.time_ns - origin) / 1e9,
                    "nemesis": e.nemesis,
                    "action": e.action,
                    "description": e.description,
                }
                for e in self.nemesis_events
            ],
            "healed_at_s": (self.healed_ns - origin) / 1e9 if self.healed_ns else None,
            # The monitor's view over time (active controller, brokers' fenced flags): the evidence
            # behind fenced-broker-never-acks and liveness-after-heal.
            "samples": [
                {
                    "t_s": (sample.time_ns - origin) / 1e9,
                    "leader": sample.leader_id,
                    "fenced": {str(broker): fenced for broker, fenced in sorted(sample.fenced.items())},
                    # the committed offset those flags are from, and when they were asked for
                    "metadata_offset": sample.metadata_offset,
                    "probe_t_s": (sample.observed_from_ns - origin) / 1e9,
                }
                for sample in self.samples
            ],
        }


def _percentiles(sorted_values: list[float]) -> dict[str, float]:
    if not sorted_values:
        return {}

    def at(q: float) -> float:
        return round(sorted_values[min(int(q * len(sorted_values)), len(sorted_values) - 1)], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(sorted_values[-1], 3)}


def _fault_windows(report: RunReport, origin: int) -> list[tuple[float, float, str]]:
    windows: list[tuple[float, float, str]] = []
    started: dict[str, float] = {}
    for event in report.nemesis_events:
        t = (event.time_ns - origin) / 1e9
        if event.action == "start":
            started[event.nemesis] = t
        elif event.nemesis in started:
            windows.append((started.pop(event.nemesis), t, event.nemesis))
    return windows


_LEGEND_OUTSIDE: dict[str, Any] = {
    "loc": "upper left",
    "bbox_to_anchor": (1.01, 1.0),
    "borderaxespad": 0.0,
    "fontsize": 8,
}
_MAX_PROCESS_TICKS = 24  # up to this many client processes, each row is labelled with its id


def _plot_operations(report: RunReport, origin: int, windows: list[tuple[float, float, str]]) -> Any:
    """One row per client process, one dot per operation at its invoke time, coloured by outcome."""
    import matplotlib.pyplot as plt

    from chaos.produce import PRODUCER_PROCESS_BASE

    # Process ids are sparse (producers start at PRODUCER_PROCESS_BASE, and a process that saw an
    # `info` continues under a new id): each is drawn at its rank, and the axis says so.
    processes = sorted({op.process for op in report.operations})
    rank = {process: i for i, process in enumerate(processes)}
    figure, axes = plt.subplots(figsize=(11, 4.5))
    for outcome, color in OUTCOME_COLORS.items():
        chosen = [op for op in report.operations if op.outcome is outcome]
        axes.scatter(
            [(op.invoke_ns - origin) / 1e9 for op in chosen],
            [rank[op.process] for op in chosen],
            s=8,
            color=color,
            label=_OUTCOME_MEANING[outcome],
        )
    for start, end, name in windows:
        axes.axvspan(start, end, color="grey", alpha=0.2)
        axes.text(start, axes.get_ylim()[1], name, fontsize=7, va="top")
    producers = [p for p in processes if p >= PRODUCER_PROCESS_BASE]
    if producers and len(producers) < len(processes):
        boundary = rank[producers[0]] - 0.5
        axes.axhline(boundary, color="black", linewidth=0.6, linestyle="--")
        axes.text(
            0.0,
            boundary,
            " producers above, topic clients below",
            fontsize=7,
            va="bottom",
            transform=axes.get_yaxis_transform(),
        )
    if len(processes) <= _MAX_PROCESS_TICKS:
        axes.set_yticks(range(len(processes)), [f"p{p}" for p in processes], fontsize=7)
        axes.set_ylabel("client process id")
    else:
        axes.set_ylabel(f"client process, by rank of its id\n({len(processes)} processes, lowest id = 0)")
    axes.set_xlabel("seconds since the first operation (invoke time)")
    axes.text(
        0.0,
        1.02,
        "one dot per operation; a process that got `info` continues under a new id; grey: fault windows",
        transform=axes.transAxes,
        fontsize=7,
        va="bottom",
    )
    axes.set_title(f"{report.scenario}: operations by outcome", loc="left", pad=14)
    axes.legend(title="outcome", **_LEGEND_OUTSIDE)
    return figure


def _plot_leaders(report: RunReport, origin: int, windows: list[tuple[float, float, str]]) -> Any:
    """Two panels over the same time: each controller's reported epoch, and whom it named leader."""
    import matplotlib.pyplot as plt

    observers = sorted({o.observer for o in report.leaders})
    figure, (epochs, leaders) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
    for i, observer in enumerate(observers):
        seen = [o for o in report.leaders if o.observer == observer]
        times = [(o.time_ns - origin) / 1e9 for o in seen]
        # Controllers that agree would draw one line over another: shift each a little.
        shift = (i - (len(observers) - 1) / 2) * 0.05
        epochs.step(times, [o.epoch + shift for o in seen], where="post", label=observer)
        leaders.step(
            times,
            [(-1 if o.leader_id is None else o.leader_id) + shift for o in seen],
            where="post",
            label=observer,
        )
    for axes in (epochs, leaders):
        for start, end, _ in windows:
            axes.axvspan(start, end, color="grey", alpha=0.2)
    epochs.set_title(
        "Raft leader epoch and leader as each controller reported them (DescribeQuorum polls)", loc="left"
    )
    epochs.set_ylabel("epoch it reports")
    epochs.text(
        0.0,
        -0.02,
        "a step up = that controller learned of a new election; lines drawn slightly apart where "
        "controllers agree; far apart = they disagree (a partitioned node lags or runs ahead)",
        transform=epochs.transAxes,
        fontsize=7,
        va="top",
    )
    epochs.legend(title="reported by", **_LEGEND_OUTSIDE)
    leader_ids = sorted({o.leader_id for o in report.leaders if o.leader_id is not None})
    leaders.set_yticks([-1, *leader_ids], ["none known", *[str(i) for i in leader_ids]])
    leaders.set_ylabel("leader (controller id)\nit names")
    leaders.set_xlabel("seconds since the first operation (grey: fault windows)")
    return figure


def _plot(report: RunReport, directory: Path) -> list[str]:
    """Operations over time (per process, by outcome) and what each controller said about leadership."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = report.origin_ns()
    windows = _fault_windows(report, origin)
    for name, figure in (
        (OPS_PLOT, _plot_operations(report, origin, windows)),
        (LEADERS_PLOT, _plot_leaders(report, origin, windows)),
    ):
        # bbox_inches="tight" makes room for the outside legends (tight_layout would warn instead).
        figure.savefig(directory / name, dpi=90, bbox_inches="tight")
        plt.close(figure)
    return [OPS_PLOT, LEADERS_PLOT]


def _html(report: RunReport, summary: dict[str, Any], plots: list[str]) -> str:
    rows = "".join(
        f"<tr class='{v.status.value}'><td>{html.escape(v.checker)}</td><td>{v.status.value.upper()}</td>"
        f"<td>{html.escape(v.summary)}</td><td><pre>{html.escape(chr(10).join(v.offending[:50]))}</pre></td></tr>"
        for v in report.verdicts
    )
    faults = "".join(
        f"<tr><td>{e['t_s']:.2f}</td><td>{html.escape(e['nemesis'])}</td><td>{e['action']}</td>"
        f"<td>{html.escape(e['description'])}</td></tr>"
        for e in summary["nemesis"]
    )
    images = "".join(f"<p><img src='{name}' alt='{name}'></p>" for name in plots)
    verdict = "VALID" if report.valid else "INVALID"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kraft chaos: {html.escape(report.scenario)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}} .pass td:nth-child(2){{color:green}}
.fail td:nth-child(2){{color:red;font-weight:bold}} .unknown td:nth-child(2){{color:#b80}}
pre{{margin:0;font-size:11px;white-space:pre-wrap}}</style></head><body>
<h1>kraft chaos run: {html.escape(report.scenario)} — {verdict}</h1>
<p>seed {report.seed}, duration {report.duration_s:g} s, {summary["operations"]["total"]} operations
{html.escape(json.dumps(summary["operations"]["by_outcome"]))}; ok latency (ms)
{html.escape(json.dumps(summary["operations"]["ok_latency_ms"]))}. History: <code>history.sqlite</code>.</p>
<p>Reproduce: <code>{html.escape(report.reproduce)}</code></p>
<h2>Verdicts</h2><table><tr><th>checker</th><th>status</th><th>summary</th><th>offending</th></tr>{rows}</table>
<h2>Faults</h2><table><tr><th>t (s)</th><th>nemesis</th><th>action</th><th>what</th></tr>{faults}</table>
<h2>Plots</h2>{images}
</body></html>
"""


def write_report(report: RunReport, directory: Path) -> dict[str, Any]:
    """Write ``report.json``, the PNG plots and ``report.html`` into ``directory``; returns the JSON."""
    directory.mkdir(parents=True, exist_ok=True)
    summary = report.to_json()
    (directory / "report.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    plots = _plot(report, directory)
    (directory / "report.html").write_text(_html(report, summary, plots), encoding="utf-8")
    return summary
