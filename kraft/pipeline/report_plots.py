"""PNG plots of the metadata report (matplotlib, headless Agg backend).

Each ``plot_*`` function takes small, already aggregated pandas frames (collected from Spark) and writes
one file; the matching ``figure_*`` function builds the figure without saving it (tests inspect it).
Times on the x axis are seconds since the first record of the log.

Readability rules every plot follows (issue #19):

- Colours that carry a meaning are reserved: :data:`OFFLINE_COLOR` marks a partition without a leader
  and the broker-state colours mark states; brokers are drawn from :data:`BROKER_PALETTE`, which holds
  none of them, and distinct brokers get distinct colours (hatching varies once the palette runs out).
- Legends sit outside the axes, right of the plot, so they never cover data.
- Long labels are shortened in the middle (the partition number stays visible); summary.md lists the
  full names.
- Figures are saved with ``bbox_inches="tight"`` instead of ``tight_layout()``: tight_layout warns
  ("Tight layout not applied") when a long tick label leaves no room for the axes, and that warning
  leaked onto ``kraft pipeline metadata-report``'s stderr.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

OFFLINE_COLOR = "#d62728"  # a partition with no leader; also the OFFLINE broker state
STATE_COLORS = {
    "ACTIVE": "#2ca02c",
    "FENCED": "#ff7f0e",
    "CONTROLLED_SHUTDOWN": "#9467bd",
    "OFFLINE": OFFLINE_COLOR,
    "UNREGISTERED": "#7f7f7f",
}
"""Broker lifecycle states, named as ``kraft broker list`` names them (see metadata_tables)."""
_UNKNOWN_STATE_COLOR = "#1f77b4"

# tab20 without its reds (#d62728, #ff9896: offline) — 18 colours distinct from the offline colour.
BROKER_PALETTE = (
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#ffbb78",
    "#2ca02c",
    "#98df8a",
    "#9467bd",
    "#c5b0d5",
    "#8c564b",
    "#c49c94",
    "#e377c2",
    "#f7b6d2",
    "#7f7f7f",
    "#c7c7c7",
    "#bcbd22",
    "#dbdb8d",
    "#17becf",
    "#9edae5",
)
_HATCHES = ("", "//", "..", "xx", "\\\\", "oo")
OFFLINE_HATCH = "xx"

MAX_ROWS_PLOTTED = 40  # brokers / partitions per Gantt chart; the Parquet tables hold all of them
MAX_LABEL_CHARS = 36  # y tick labels longer than this are shortened in the middle
_LABEL_LEVELS = 3  # stacked rows of tenure labels per lane before a label is left out
_LEGEND_OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shorten(label: str, limit: int = MAX_LABEL_CHARS) -> str:
    """``label`` cut in the middle to at most ``limit`` characters (both ends stay readable)."""
    if len(label) <= limit:
        return label
    head = (limit - 1) // 2
    tail = limit - 1 - head
    return f"{label[:head]}…{label[-tail:]}"


def partition_label(topic: str, partition: int) -> str:
    """The y label of a partition's lane; the topic is shortened so the partition number stays."""
    suffix = f"-{int(partition)}"
    return shorten(topic, MAX_LABEL_CHARS - len(suffix)) + suffix


def broker_style(broker: int, brokers: Sequence[int]) -> tuple[str, str]:
    """(colour, hatch) of ``broker`` among ``brokers``: distinct for up to len(palette) * len(hatches)
    brokers, and never the offline colour."""
    index = sorted(brokers).index(broker)
    color = BROKER_PALETTE[index % len(BROKER_PALETTE)]
    hatch = _HATCHES[(index // len(BROKER_PALETTE)) % len(_HATCHES)]
    return color, hatch


def _save(fig: Any, path: Path) -> Path:
    # bbox_inches="tight" grows the canvas to hold outside legends and long labels; it never warns.
    fig.savefig(path, dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _empty(title: str, message: str) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 2))
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center")
    ax.set_axis_off()
    return fig


def figure_record_types(counts: pd.DataFrame, origin_ms: int, bucket_ms: int) -> Any:
    """Stacked bars: records per type per time bucket."""
    title = f"Metadata records per {bucket_ms // 1000 or bucket_ms} {'s' if bucket_ms >= 1000 else 'ms'}"
    if counts.empty:
        return _empty(title, "no records")
    plt = _pyplot()
    table = counts.pivot_table(
        index="bucket_start_ms", columns="record_type", values="records", aggfunc="sum", fill_value=0
    )
    x = [(ms - origin_ms) / 1000 for ms in table.index]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = plt.get_cmap("tab20")
    bottom = [0.0] * len(x)
    for i, record_type in enumerate(table.columns):
        heights = [float(v) for v in table[record_type]]
        ax.bar(
            x,
            heights,
            width=bucket_ms / 1000 * 0.9,
            bottom=bottom,
            align="edge",
            label=record_type,
            color=colors(i % 20),
            hatch=_HATCHES[(i // 20) % len(_HATCHES)],
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("records")
    ax.set_title(title)
    ax.legend(fontsize="small", title="record type", **_LEGEND_OUTSIDE)
    return fig


def plot_record_types(counts: pd.DataFrame, origin_ms: int, bucket_ms: int, path: Path) -> Path:
    return _save(figure_record_types(counts, origin_ms, bucket_ms), path)


def figure_broker_timeline(states: pd.DataFrame, origin_ms: int) -> Any:
    """Gantt chart: one lane per broker, coloured by lifecycle state."""
    title = "Broker lifecycle"
    if states.empty:
        return _empty(title, "no broker records")
    plt = _pyplot()
    brokers = sorted(states["broker_id"].unique())[:MAX_ROWS_PLOTTED]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(brokers)))
    for lane, broker in enumerate(brokers):
        mine = states[states["broker_id"] == broker]
        for _, row in mine.iterrows():
            start = (row["start_ms"] - origin_ms) / 1000
            width = max(row["duration_ms"] / 1000, 0.05)
            color = STATE_COLORS.get(row["state"], _UNKNOWN_STATE_COLOR)
            ax.barh(lane, width, left=start, color=color, height=0.6)
    ax.set_yticks(range(len(brokers)), [f"broker {b}" for b in brokers])
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STATE_COLORS.values()]
    ax.legend(handles, list(STATE_COLORS), fontsize="small", title="state", **_LEGEND_OUTSIDE)
    ax.set_xlabel("seconds since the first record")
    ax.set_title(title)
    return fig


def plot_broker_timeline(states: pd.DataFrame, origin_ms: int, path: Path) -> Path:
    return _save(figure_broker_timeline(states, origin_ms), path)


def _overlaps(box: Any, boxes: list[Any]) -> bool:
    return any(box.overlaps(other) for other in boxes)


def figure_controller_epochs(epochs: pd.DataFrame, origin_ms: int) -> Any:
    """One bar per leader tenure in its leader's lane, labelled with the epoch.

    Short tenures sit close together: a label that would overlap another one moves up a row (up to
    ``_LABEL_LEVELS`` rows); one that still does not fit is left out and counted in a note (the
    epochs table of summary.md lists every epoch).
    """
    import pandas as pd

    title = "Controller leader tenures (bar = one epoch, label eN = epoch N)"
    if epochs.empty:
        return _empty(title, "no records")
    plt = _pyplot()
    leaders = sorted({int(v) for v in epochs["leader_id"].dropna()})
    has_unknown = bool(epochs["leader_id"].isna().any())
    lanes = len(leaders) + (1 if has_unknown else 0)
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.9 * lanes))
    ticks = ([-1] if has_unknown else []) + list(range(len(leaders)))
    ax.set_yticks(ticks, (["leader unknown"] if has_unknown else []) + [f"controller {n}" for n in leaders])
    ax.set_ylim(min(ticks) - 0.5, max(ticks) + 0.9)
    ax.set_xlabel("seconds since the first record")
    ax.set_title(title)
    bars: list[tuple[float, float, int, int]] = []
    for _, row in epochs.iterrows():
        leader = row["leader_id"]
        lane = -1 if pd.isna(leader) else leaders.index(int(leader))
        start = (row["start_ms"] - origin_ms) / 1000
        width = max(row["tenure_ms"] / 1000, 0.05)
        color = "#7f7f7f" if lane < 0 else BROKER_PALETTE[(2 * lane) % len(BROKER_PALETTE)]
        # A black edge keeps back-to-back tenures of one controller apart.
        ax.barh(lane, width, left=start, color=color, edgecolor="black", linewidth=0.5, height=0.5)
        bars.append((start, width, lane, int(row["epoch"])))
    ax.set_xlim(left=min(b[0] for b in bars) - 0.5, right=max(b[0] + b[1] for b in bars) * 1.02 + 0.5)
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    omitted = 0
    for start, _width, lane, epoch in bars:
        for level in range(_LABEL_LEVELS):
            text = ax.text(start, lane + 0.27 + 0.18 * level, f"e{epoch}", fontsize="x-small", va="bottom")
            box = text.get_window_extent(renderer).expanded(1.1, 1.0)
            if not _overlaps(box, placed):
                placed.append(box)
                break
            text.remove()
        else:
            omitted += 1
    if omitted:
        ax.annotate(
            f"{omitted} short tenures unlabelled (see the epochs table in summary.md)",
            xy=(0, -0.18),
            xycoords="axes fraction",
            fontsize="x-small",
            va="top",
        )
    return fig


def plot_controller_epochs(epochs: pd.DataFrame, origin_ms: int, path: Path) -> Path:
    return _save(figure_controller_epochs(epochs, origin_ms), path)


def figure_partition_leaders(events: pd.DataFrame, origin_ms: int, end_ms: int) -> Any:
    """Gantt chart per partition: the leader over time; stretches without a leader in red (hatched)."""
    title = "Partition leaders (colour and label = leader broker; red hatched = offline, no leader)"
    if events.empty:
        return _empty(title, "no partitions")
    plt = _pyplot()
    events = events.sort_values(["topic", "partition", "offset"])
    keys = list(dict.fromkeys(zip(events["topic"].fillna("?"), events["partition"], strict=True)))
    keys = keys[:MAX_ROWS_PLOTTED]
    wanted = set(keys)
    plotted = events[
        [(t, p) in wanted for t, p in zip(events["topic"].fillna("?"), events["partition"], strict=True)]
    ]
    brokers = sorted({int(v) for v in plotted["leader"].dropna() if int(v) != -1})
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.4 * len(keys)))
    for lane, (topic, partition) in enumerate(keys):
        mine = events[(events["topic"].fillna("?") == topic) & (events["partition"] == partition)]
        rows = list(mine.itertuples(index=False))
        for i, row in enumerate(rows):
            if row.change == "removed":
                break
            stop = rows[i + 1].timestamp_ms if i + 1 < len(rows) else end_ms
            start = (row.timestamp_ms - origin_ms) / 1000
            width = max((stop - row.timestamp_ms) / 1000, 0.05)
            if row.leader == -1:
                color, hatch = OFFLINE_COLOR, OFFLINE_HATCH
            else:
                color, hatch = broker_style(int(row.leader), brokers)
            ax.barh(lane, width, left=start, color=color, hatch=hatch, edgecolor="white", height=0.6)
            if row.leader != -1:
                ax.text(start, lane, f" {int(row.leader)}", fontsize="x-small", va="center")
    ax.set_yticks(range(len(keys)), [partition_label(t, p) for t, p in keys])
    handles = [
        plt.Rectangle((0, 0), 1, 1, facecolor=c, hatch=h, edgecolor="white")
        for c, h in (broker_style(b, brokers) for b in brokers)
    ]
    handles.append(
        plt.Rectangle((0, 0), 1, 1, facecolor=OFFLINE_COLOR, hatch=OFFLINE_HATCH, edgecolor="white")
    )
    ax.legend(
        handles,
        [f"broker {b}" for b in brokers] + ["offline (no leader)"],
        fontsize="small",
        title="leader",
        ncol=1 if len(handles) <= 20 else 2,
        **_LEGEND_OUTSIDE,
    )
    ax.set_xlabel("seconds since the first record")
    ax.set_title(title)
    return fig


def plot_partition_leaders(events: pd.DataFrame, origin_ms: int, end_ms: int, path: Path) -> Path:
    return _save(figure_partition_leaders(events, origin_ms, end_ms), path)
