"""PNG plots of the metadata report (matplotlib, headless Agg backend).

Each function takes small, already aggregated pandas frames (collected from Spark) and writes one file.
Times on the x axis are seconds since the first record of the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

_STATE_COLORS = {
    "ACTIVE": "#2ca02c",
    "FENCED": "#ff7f0e",
    "CONTROLLED_SHUTDOWN": "#9467bd",
    "UNREGISTERED": "#7f7f7f",
}
MAX_ROWS_PLOTTED = 40  # brokers / partitions per Gantt chart; the Parquet tables hold all of them


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def _empty(path: Path, title: str, message: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 2))
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center")
    ax.set_axis_off()
    return _save(fig, path)


def plot_record_types(counts: pd.DataFrame, origin_ms: int, bucket_ms: int, path: Path) -> Path:
    """Stacked bars: records per type per time bucket."""
    title = f"Metadata records per {bucket_ms // 1000 or bucket_ms} {'s' if bucket_ms >= 1000 else 'ms'}"
    if counts.empty:
        return _empty(path, title, "no records")
    plt = _pyplot()
    table = counts.pivot_table(
        index="bucket_start_ms", columns="record_type", values="records", aggfunc="sum", fill_value=0
    )
    x = [(ms - origin_ms) / 1000 for ms in table.index]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = [0.0] * len(x)
    for record_type in table.columns:
        heights = [float(v) for v in table[record_type]]
        ax.bar(x, heights, width=bucket_ms / 1000 * 0.9, bottom=bottom, align="edge", label=record_type)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("records")
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=2, loc="upper right")
    return _save(fig, path)


def plot_broker_timeline(states: pd.DataFrame, origin_ms: int, path: Path) -> Path:
    """Gantt chart: one lane per broker, coloured by lifecycle state."""
    title = "Broker lifecycle"
    if states.empty:
        return _empty(path, title, "no broker records")
    plt = _pyplot()
    brokers = sorted(states["broker_id"].unique())[:MAX_ROWS_PLOTTED]
    fig, ax = plt.subplots(figsize=(10, 1 + 0.45 * len(brokers)))
    for lane, broker in enumerate(brokers):
        mine = states[states["broker_id"] == broker]
        for _, row in mine.iterrows():
            start = (row["start_ms"] - origin_ms) / 1000
            width = max(row["duration_ms"] / 1000, 0.05)
            ax.barh(lane, width, left=start, color=_STATE_COLORS.get(row["state"], "#1f77b4"), height=0.6)
    ax.set_yticks(range(len(brokers)), [f"broker {b}" for b in brokers])
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _STATE_COLORS.values()]
    ax.legend(handles, list(_STATE_COLORS), fontsize="small", loc="upper right")
    ax.set_xlabel("seconds since the first record")
    ax.set_title(title)
    return _save(fig, path)


def plot_controller_epochs(epochs: pd.DataFrame, origin_ms: int, path: Path) -> Path:
    """One bar per leader tenure, labelled with epoch and leader id."""
    import pandas as pd

    title = "Controller leader tenures"
    if epochs.empty:
        return _empty(path, title, "no records")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    leaders = sorted({int(v) for v in epochs["leader_id"].dropna()})
    colors = plt.get_cmap("tab10")
    for _, row in epochs.iterrows():
        leader = row["leader_id"]
        lane = -1 if pd.isna(leader) else leaders.index(int(leader))
        start = (row["start_ms"] - origin_ms) / 1000
        width = max(row["tenure_ms"] / 1000, 0.05)
        ax.barh(lane, width, left=start, color=colors(int(row["epoch"]) % 10), height=0.6)
        ax.text(start, lane + 0.35, f"e{int(row['epoch'])}", fontsize="x-small")
    ticks = [-1, *range(len(leaders))]
    ax.set_yticks(ticks, ["unknown"] + [f"controller {n}" for n in leaders])
    ax.set_xlabel("seconds since the first record")
    ax.set_title(title)
    return _save(fig, path)


def plot_partition_leaders(events: pd.DataFrame, origin_ms: int, end_ms: int, path: Path) -> Path:
    """Gantt chart per partition: leader over time; offline stretches in red."""
    title = "Partition leaders (red = offline)"
    if events.empty:
        return _empty(path, title, "no partitions")
    plt = _pyplot()
    events = events.sort_values(["topic", "partition", "offset"])
    keys = list(dict.fromkeys(zip(events["topic"].fillna("?"), events["partition"], strict=True)))
    keys = keys[:MAX_ROWS_PLOTTED]
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 1 + 0.4 * len(keys)))
    for lane, (topic, partition) in enumerate(keys):
        mine = events[(events["topic"].fillna("?") == topic) & (events["partition"] == partition)]
        rows = list(mine.itertuples(index=False))
        for i, row in enumerate(rows):
            if row.change == "removed":
                break
            stop = rows[i + 1].timestamp_ms if i + 1 < len(rows) else end_ms
            start = (row.timestamp_ms - origin_ms) / 1000
            width = max((stop - row.timestamp_ms) / 1000, 0.05)
            color = "#d62728" if row.leader == -1 else colors(int(row.leader) % 10)
            ax.barh(lane, width, left=start, color=color, height=0.6)
            if row.leader != -1:
                ax.text(start, lane, str(int(row.leader)), fontsize="x-small", va="center")
    ax.set_yticks(range(len(keys)), [f"{t}-{p}" for t, p in keys])
    ax.set_xlabel("seconds since the first record")
    ax.set_title(title)
    return _save(fig, path)
