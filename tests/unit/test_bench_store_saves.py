"""bench.store_saves: the controllers' ``image_store_saved`` lines placed in a benchmark's phases (issue #17,
session 16), read from node logs as ``bench.controller`` leaves them."""

from __future__ import annotations

from pathlib import Path

from bench.store_saves import saves_by_phase

LINE = (
    "ts=2026-12-07T07:20:11.123Z level=info logger=controller event=image_store_saved node={node} "
    "offset=900 records=400 rows={rows} why={why} waited_ms=3000 ms=700 cpu_ms={cpu} slot={slot} "
    "start_mono_ms={mono}"
)


def test_saves_are_placed_in_the_phase_they_started_in(tmp_path: Path) -> None:
    logs = {}
    for node, entries in {
        1: [(1_005_000, "defer_max", 2, 500), (1_012_000, "bulk_ended", 2, 300)],
        2: [(1_004_999, "interval", 0, 100), (1_010_000, "bulk_ended", 0, 400)],
    }.items():
        path = tmp_path / f"node{node}.log"
        text = "ts=… level=info logger=raft event=state_changed node=1\n" + "\n".join(
            LINE.format(node=node, rows=20_000, why=why, cpu=cpu, slot=slot, mono=mono)
            for mono, why, slot, cpu in entries
        )
        path.write_text(text + "\n")
        logs[node] = path
    logs[3] = tmp_path / "node3.log"  # never written: skipped
    windows = {"bulk": (1_000.0, 1_005.0), "shutdown": (1_005.0, 1_010.0), "after_bulk": (1_010.0, 1_014.0)}
    report = saves_by_phase(logs, windows, origin_s=1_000.0)
    placed = [(s["node"], s["phase"], s["at_s"], s["why"], s["cpu_ms"]) for s in report["saves"]]
    assert placed == [
        (2, "bulk", 5.0, "interval", 100),  # a window is [start, end): 4.999 s is still the first
        (1, "shutdown", 5.0, "defer_max", 500),
        (2, "after_bulk", 10.0, "bulk_ended", 400),
        (1, "after_bulk", 12.0, "bulk_ended", 300),
    ]
    assert report["by_phase_node_count_cpu_ms"]["after_bulk"] == {"1": [1, 300], "2": [1, 400]}
    assert report["windows_s"]["shutdown"] == [5.0, 10.0]
    late = saves_by_phase({1: logs[1]}, {"bulk": (1_000.0, 1_005.0)}, origin_s=1_000.0)
    assert {s["phase"] for s in late["saves"]} == {"outside"}
