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


def test_plots_explain_themselves() -> None:
    """operations.png names its rows and outcomes; leaders.png says the epochs are each controller's
    report and shows whom each one named leader (issue #19)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from chaos.report import _plot_leaders, _plot_operations

    second = 1_000_000_000
    report = RunReport(
        scenario="isolate",
        seed=7,
        duration_s=2.0,
        started_unix=0.0,
        verdicts=[],
        operations=[
            op("create", 0, second // 10, result="created"),
            op("create", second, None, process=1_000_000),
        ],
        leaders=[
            LeaderObservation("controller-1", 1, 1, 0),
            LeaderObservation("controller-2", 1, None, 0),
            LeaderObservation("controller-2", 2, 2, second),
        ],
    )
    operations = _plot_operations(report, 0, [])
    leaders = _plot_leaders(report, 0, [])
    try:
        (axes,) = operations.axes
        assert axes.get_ylabel() == "client process id"
        assert [t.get_text() for t in axes.get_yticklabels()] == ["p0", "p1000000"]
        texts = " ".join(t.get_text() for t in axes.texts)
        assert "one dot per operation" in texts and "producers above, topic clients below" in texts
        legend = axes.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == [
            "ok (done)",
            "fail (not done)",
            "info (outcome unknown)",
        ]
        renderer = operations.canvas.get_renderer()
        assert not legend.get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))
        epochs, named = leaders.axes
        assert "as each controller reported" in epochs.get_title(loc="left")
        assert epochs.get_ylabel() == "epoch it reports"
        assert named.get_ylabel().startswith("leader (controller id)")
        assert [t.get_text() for t in named.get_yticklabels()] == ["none known", "1", "2"]
    finally:
        plt.close(operations)
        plt.close(leaders)
