"""PNG plots (matplotlib, Agg: no display needed), from small collected series."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt


def file_stem(address: str) -> str:
    """A file name for an address (addresses may hold '/', '*', '>' ...)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", address).strip("_") or "destination"


def _times(values: Iterable[float]) -> list[float]:
    """UNIX times as matplotlib's date numbers (UTC)."""
    return [float(mdates.date2num(datetime.fromtimestamp(v, UTC))) for v in values]


def _style_time_axis(axis: Any) -> None:
    locator = mdates.AutoDateLocator()
    axis.xaxis.set_major_locator(locator)
    axis.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    axis.grid(True, alpha=0.3)


def depth_plot(
    path: Path,
    address: str,
    series: dict[str, list[tuple[float, int]]],
    stopped: Sequence[tuple[float, float]],
    stop: int,
    resume: int,
    maximum: int,
) -> None:
    """Depth over time, one line per run (none across the gap between two runs), the
    thresholds as lines, flow-stopped periods shaded."""
    figure, axis = plt.subplots(figsize=(10, 3.6), dpi=100)
    runs = sorted(series, key=lambda run: min(t for t, _ in series[run]))
    for index, run in enumerate(runs):
        points = sorted(series[run])
        label = "depth" if index == 0 else None
        axis.step(
            _times(t for t, _ in points), [d for _, d in points], where="post", color="#1f5fa8", lw=1.2, label=label
        )
    for index, (start, end) in enumerate(stopped):
        axis.axvspan(
            *_times([start, end]), color="#d9534f", alpha=0.18, lw=0, label="flow stopped" if index == 0 else None
        )
    for value, label, style in ((maximum, "max", "-"), (stop, "stop", "--"), (resume, "resume", ":")):
        if value:
            axis.axhline(value, color="#444444", ls=style, lw=1, label=f"{label} {value:,}")
    axis.set_title(f"{address}: depth (messages)")
    axis.set_ylabel("messages")
    axis.set_ylim(bottom=0)
    _style_time_axis(axis)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def latency_plot(path: Path, address: str, rows: Sequence[dict[str, Any]]) -> None:
    """Enqueue-to-settle and enqueue-to-delivery percentiles per time bucket."""
    figure, axis = plt.subplots(figsize=(10, 3.6), dpi=100)
    rows = sorted(rows, key=lambda r: r["bucket_start"])
    times = _times(r["bucket_start"] for r in rows)
    colours = {"p50": "#2e7d32", "p95": "#f9a825", "p99": "#c62828"}
    for measure, style in (("to_settle", "-"), ("to_deliver", "--")):
        for p, colour in colours.items():
            values = [r[f"{measure}_{p}_ms"] for r in rows]
            if any(v is not None for v in values):
                label = f"{measure.replace('_', ' ')} {p}"
                axis.plot(times, values, style, color=colour, lw=1.2, marker=".", ms=3, label=label)
    if not axis.get_lines():
        axis.text(0.5, 0.5, "no message was delivered or settled", transform=axis.transAxes, ha="center")
    axis.set_title(f"{address}: latency from enqueue (ms)")
    axis.set_ylabel("ms")
    axis.set_ylim(bottom=0)
    _style_time_axis(axis)
    if axis.get_lines():
        axis.legend(loc="upper right", fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
