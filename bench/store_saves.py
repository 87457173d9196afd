"""Where the controllers' image-store saves landed against a benchmark's phases (issue #17, session 16).

Each controller logs ``event=image_store_saved`` for every save that waited for bulk work or wrote many
rows (:mod:`kraft.metadata.store_writer`), with ``start_mono_ms`` on the host's monotonic clock — the
clock ``time.monotonic()`` reads in the benchmark too — so a save can be placed in the phase it started
in.  :func:`saves_by_phase` reads the node logs after a run; ``bench.controller`` reports it as
``image_store_saves``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EVENT = "event=image_store_saved "


def parse_fields(line: str) -> dict[str, str]:
    """A log line's ``key=value`` fields (the saved-event's values are bare tokens)."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def _int(value: str | None) -> int | None:
    return None if value is None or value == "null" else int(value)


def _starts(path: Path) -> list[float]:
    """The start (monotonic s) of every save ``path`` logged so far."""
    if not path.exists():
        return []
    return [
        int(parse_fields(line)["start_mono_ms"]) / 1000
        for line in path.read_text(errors="replace").splitlines()
        if EVENT in line
    ]


async def wait_for_saves(logs: Mapping[int, Path], after_s: float, timeout_s: float) -> float:
    """Wait (polling) until every node logged a save that started at or after ``after_s`` (monotonic),
    at most ``timeout_s``: a controller's deferred save after bulk work may come seconds after a
    benchmark's last window, and the nodes are killed when it ends.  Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if all(any(at >= after_s for at in _starts(path)) for path in logs.values()):
            break
        await asyncio.sleep(0.25)
    return round(time.monotonic() - started, 2)


def phase_of(at_s: float, windows: Mapping[str, tuple[float, float]]) -> str:
    """The first window (in the mapping's order) holding ``at_s``, else ``"outside"``."""
    for name, (start, end) in windows.items():
        if start <= at_s < end:
            return name
    return "outside"


def saves_by_phase(
    logs: Mapping[int, Path], windows: Mapping[str, tuple[float, float]], origin_s: float
) -> dict[str, Any]:
    """Every logged save: node, phase, start (s from ``origin_s``), wall ms, SQLite-thread CPU ms, rows,
    why and slot; and per phase, each node's saves and CPU ms summed."""
    started: list[tuple[float, dict[str, Any]]] = []
    for node_id, path in logs.items():
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if EVENT not in line:
                continue
            fields = parse_fields(line)
            started_s = int(fields["start_mono_ms"]) / 1000
            started.append(
                (
                    started_s,
                    {
                        "node": node_id,
                        "phase": phase_of(started_s, windows),
                        "at_s": round(started_s - origin_s, 2),
                        "ms": _int(fields.get("ms")),
                        "cpu_ms": _int(fields.get("cpu_ms")),
                        "rows": _int(fields.get("rows")),
                        "records": _int(fields.get("records")),
                        "why": fields.get("why"),
                        "slot": _int(fields.get("slot")),
                        "waited_ms": _int(fields.get("waited_ms")),
                    },
                )
            )
    started.sort(key=lambda item: item[0])
    saves = [save for _, save in started]
    phases: dict[str, dict[str, list[int]]] = {}
    for save in saves:
        per_node = phases.setdefault(save["phase"], {})
        count_cpu = per_node.setdefault(str(save["node"]), [0, 0])
        count_cpu[0] += 1
        count_cpu[1] += save["cpu_ms"] or 0
    return {
        "windows_s": {
            name: [round(start - origin_s, 2), None if end == float("inf") else round(end - origin_s, 2)]
            for name, (start, end) in windows.items()
        },
        "saves": saves,
        "by_phase_node_count_cpu_ms": phases,
    }
