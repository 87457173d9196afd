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


def _plot(report: RunReport, directory: Path) -> list[str]:
    """Operations over time (per process, by outcome) and the leader epoch each controller reported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = report.origin_ns()
    windows = _fault_windows(report, origin)
    # Process ids are sparse (producers start at 1,000,000): plot each at its rank instead.
    rank = {process: i for i, process in enumerate(sorted({op.process for op in report.operations}))}
    figure, axes = plt.subplots(figsize=(11, 4))
    for outcome, color in OUTCOME_COLORS.items():
        chosen = [op for op in report.operations if op.outcome is outcome]
        axes.scatter(
            [(op.invoke_ns - origin) / 1e9 for op in chosen],
            [rank[op.process] for op in chosen],
            s=8,
            color=color,
            label=outcome.value,
        )
    for start, end, name in windows:
        axes.axvspan(start, end, color="grey", alpha=0.2)
        axes.text(start, axes.get_ylim()[1], name, fontsize=7, va="top")
    axes.set_xlabel("seconds since the first operation")
    axes.set_ylabel("client process (by id order)")
    axes.set_title(f"{report.scenario}: operations by outcome (grey: faults)")
    axes.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(directory / OPS_PLOT, dpi=90)
    plt.close(figure)
    figure, axes = plt.subplots(figsize=(11, 3))
    for observer in sorted({o.observer for o in report.leaders}):
        seen = [o for o in report.leaders if o.observer == observer]
        axes.step(
            [(o.time_ns - origin) / 1e9 for o in seen], [o.epoch for o in seen], where="post", label=observer
        )
    for start, end, _ in windows:
        axes.axvspan(start, end, color="grey", alpha=0.2)
    axes.set_xlabel("seconds since the first operation")
    axes.set_ylabel("leader epoch")
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(directory / LEADERS_PLOT, dpi=90)
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
