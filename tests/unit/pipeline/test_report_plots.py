"""The metadata report's pictures say what they show (issue #19): reserved colours, legends outside
the axes, labels that neither overlap nor get cut, and nothing printed on stderr while drawing."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgba  # noqa: E402

from kraft.pipeline import report_plots as plots  # noqa: E402

T0 = 1_700_000_000_000
LONG_TOPIC = "payments-" + "x" * 230 + "-eu-west"  # Kafka allows 249 characters


def _leader_events(brokers: list[int]) -> Any:
    """One partition per broker led by it, partition 1 of 'orders' offline from 5 s to 8 s, and one
    partition of a topic with a very long name."""
    rows: list[dict[str, Any]] = []
    for i, broker in enumerate(brokers):
        rows.append(_row("orders", i, 10 * i, 0, broker, "created"))
    rows.append(_row("orders", 1, 10_000, 5_000, -1, "offline"))
    rows.append(_row("orders", 1, 10_001, 8_000, brokers[1], "recovered"))
    rows.append(_row(LONG_TOPIC, 0, 20_000, 1_000, brokers[0], "created"))
    return pd.DataFrame(rows)


def _row(topic: str, partition: int, offset: int, at_ms: int, leader: int, change: str) -> dict[str, Any]:
    return {
        "topic": topic,
        "topic_id": f"id-{topic[:8]}",
        "partition": partition,
        "offset": offset,
        "timestamp_ms": T0 + at_ms,
        "leader": leader,
        "previous_leader": None,
        "change": change,
    }


def _epochs(count: int) -> Any:
    """Epochs 1..count, most of them 100 ms long (labels crowd), alternating three controllers."""
    rows = []
    start = 0
    for epoch in range(1, count + 1):
        tenure = 100 if epoch % 5 else 4_000
        rows.append(
            {
                "epoch": epoch,
                "leader_id": 1 + epoch % 3,
                "first_offset": epoch,
                "last_offset": epoch,
                "records": 1,
                "start_ms": T0 + start,
                "end_ms": T0 + start + tenure,
                "tenure_ms": tenure,
                "is_current": epoch == count,
            }
        )
        start += tenure
    return pd.DataFrame(rows)


def _states() -> Any:
    return pd.DataFrame(
        [
            {"broker_id": 101, "state": "FENCED", "start_ms": T0, "duration_ms": 1_000},
            {"broker_id": 101, "state": "ACTIVE", "start_ms": T0 + 1_000, "duration_ms": 5_000},
            {"broker_id": 101, "state": "OFFLINE", "start_ms": T0 + 6_000, "duration_ms": 2_000},
            {"broker_id": 102, "state": "CONTROLLED_SHUTDOWN", "start_ms": T0, "duration_ms": 8_000},
        ]
    )


def _counts() -> Any:
    return pd.DataFrame(
        [
            {"bucket_start_ms": T0 + 1_000 * (i % 8), "record_type": f"Type{i}Record", "records": 1 + i}
            for i in range(24)
        ]
    )


def _figures() -> dict[str, Any]:
    brokers = [101 + i for i in range(20)]
    return {
        "partition_leaders": plots.figure_partition_leaders(_leader_events(brokers), T0, T0 + 10_000),
        "controller_epochs": plots.figure_controller_epochs(_epochs(30), T0),
        "broker_timeline": plots.figure_broker_timeline(_states(), T0),
        "record_types": plots.figure_record_types(_counts(), T0, 1_000),
    }


def _close(figures: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    for figure in figures.values():
        plt.close(figure)


def test_live_brokers_never_get_the_offline_colour_and_never_share_a_style() -> None:
    brokers = [101 + i for i in range(20)]  # more brokers than tab10 has colours; includes 103
    figure = plots.figure_partition_leaders(_leader_events(brokers), T0, T0 + 10_000)
    try:
        ax = figure.axes[0]
        offline = to_rgba(plots.OFFLINE_COLOR)
        bars = [p for p in ax.patches if p.get_height() > 0.5]
        offline_bars = [p for p in bars if p.get_facecolor() == offline]
        assert len(offline_bars) == 1  # exactly the one offline stretch of orders-1
        assert offline_bars[0].get_hatch() == plots.OFFLINE_HATCH
        styles = {(p.get_facecolor(), p.get_hatch()) for p in bars if p not in offline_bars}
        assert len(styles) == len(brokers)  # distinct brokers, distinct looks
    finally:
        _close({"f": figure})
    many = list(range(1, 109))
    assert all(to_rgba(plots.broker_style(b, many)[0]) != to_rgba(plots.OFFLINE_COLOR) for b in many)
    assert len({plots.broker_style(b, many) for b in many}) == len(many)
    assert to_rgba(plots.OFFLINE_COLOR) not in {to_rgba(c) for c in plots.BROKER_PALETTE}


def test_every_legend_sits_outside_its_axes() -> None:
    figures = _figures()
    try:
        for name, figure in figures.items():
            renderer = figure.canvas.get_renderer()
            figure.canvas.draw()
            for ax in figure.axes:
                legend = ax.get_legend()
                if legend is None:
                    assert name == "controller_epochs"  # lanes are named on the axis instead
                    continue
                assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), name
    finally:
        _close(figures)


def test_epoch_labels_do_not_overlap_and_long_topics_are_shortened() -> None:
    figures = _figures()
    try:
        figure = figures["controller_epochs"]
        renderer = figure.canvas.get_renderer()
        ax = figure.axes[0]
        labels = [t for t in ax.texts if t.get_text().startswith("e")]
        boxes = [t.get_window_extent(renderer) for t in labels]
        for i, box in enumerate(boxes):
            assert not any(box.overlaps(other) for other in boxes[i + 1 :]), labels[i].get_text()
        unlabelled = [t for t in ax.texts if "unlabelled" in t.get_text()]
        assert len(labels) + (int(unlabelled[0].get_text().split()[0]) if unlabelled else 0) == 30
        ticks = [t.get_text() for t in figures["partition_leaders"].axes[0].get_yticklabels()]
        long_tick = [t for t in ticks if t.startswith("payments-")]
        assert long_tick == [plots.partition_label(LONG_TOPIC, 0)]
        assert len(long_tick[0]) <= plots.MAX_LABEL_CHARS and long_tick[0].endswith("-eu-west-0")
    finally:
        _close(figures)


def test_drawing_the_report_prints_nothing_and_warns_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # tight_layout() used to warn "Tight layout not applied" for a long topic name; that warning was
    # printed by `kraft pipeline metadata-report` (issue #19).
    brokers = [101 + i for i in range(20)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.plot_partition_leaders(_leader_events(brokers), T0, T0 + 10_000, tmp_path / "p.png")
        plots.plot_controller_epochs(_epochs(30), T0, tmp_path / "e.png")
        plots.plot_broker_timeline(_states(), T0, tmp_path / "b.png")
        plots.plot_record_types(_counts(), T0, 1_000, tmp_path / "r.png")
        plots.plot_record_types(_counts().head(0), T0, 1_000, tmp_path / "empty.png")
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    for name in ("p", "e", "b", "r", "empty"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
