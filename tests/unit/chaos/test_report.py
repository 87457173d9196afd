"""Report files from synthetic run data."""

from __future__ import annotations

import json
from pathlib import Path

from chaos_histories import op

from chaos.checkers import LeaderObservation
from chaos.checkers.verdict import failed, passed
from chaos.history import EventType
from chaos.nemesis import NemesisEvent
from chaos.report import LEADERS_PLOT, OPS_PLOT, RunReport, write_report


def test_report_json_html_and_plots(tmp_path: Path) -> None:
    second = 1_000_000_000
    report = RunReport(
        scenario="isolate",
        seed=7,
        duration_s=2.0,
        started_unix=0.0,
        verdicts=[
            passed("linearizable-topic", "all 1 keys linearizable"),
            failed("no-lost-acknowledged", "1 acknowledged operations lost", ["op#1 <lost>"]),
        ],
        operations=[
            op("create", 0, second // 10, result="created"),
            op("delete", second, None, process=1),
            op("create", second, second + 5, outcome=EventType.FAIL, process=2),
        ],
        nemesis_events=[
            NemesisEvent(second // 2, "isolate-one", "start", "blackhole a <-/-> b"),
            NemesisEvent(second * 3 // 2, "isolate-one", "heal", "restored 2 links"),
        ],
        leaders=[LeaderObservation("controller-1", 1, 1, 0), LeaderObservation("controller-1", 2, 2, second)],
        healed_ns=second * 3 // 2,
    )
    summary = write_report(report, tmp_path)
    assert summary["valid"] is False
    assert summary["operations"]["by_outcome"] == {"create:fail": 1, "create:ok": 1, "delete:info": 1}
    assert summary["operations"]["ok_latency_ms"]["max"] == 100.0
    assert summary["nemesis"][1] == {
        "t_s": 1.5,
        "nemesis": "isolate-one",
        "action": "heal",
        "description": "restored 2 links",
    }
    assert json.loads((tmp_path / "report.json").read_text()) == summary
    page = (tmp_path / "report.html").read_text()
    assert "INVALID" in page and "op#1 &lt;lost&gt;" in page and OPS_PLOT in page
    assert (tmp_path / OPS_PLOT).read_bytes()[:4] == b"\x89PNG" and (tmp_path / LEADERS_PLOT).exists()
