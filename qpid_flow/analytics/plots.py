"""PNG plots (matplotlib, Agg: no display needed), from small collected series."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator

# Characters of an address kept in its file name; the name stays well under the 255 bytes
# file systems allow (an address may be longer: AMQP sets no limit).
_READABLE = 80


def file_stem(address: str) -> str:
    """A file name for an address (addresses may hold '/', '*', '>' ...), unique to it.

    The readable part alone is not: 'a/b', 'a_b' and 'a b' read alike, every non-ASCII
    name reads as nothing, and a long one is cut; so a hash of the whole address follows it,
    and two destinations never draw over each other's plot."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", address).strip("_")[:_READABLE].strip("_") or "destination"
    # surrogatepass: an address read from a log may hold a lone surrogate (JSON allows it).
    digest = hashlib.sha1(address.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()[:10]
    return f"{readable}-{digest}"


class TimeAxis:
    """A time axis with the idle gaps cut out.

    A log of several runs (or of one router over days) spans hours with activity in a few
    places; drawn on one plain time axis, each run is a sliver. Here the busy intervals
    are laid side by side: x is seconds of activity, any gap longer than ``min_gap``
    seconds and a fifth of the busy time is cut to a thin break (marked on the plot), and
    tick labels are the real UTC times. One instant still gets a readable span."""

    def __init__(self, intervals: Iterable[tuple[float, float]], min_gap: float = 60.0) -> None:
        spans = sorted((float(a), float(max(a, b))) for a, b in intervals)
        busy = sum(b - a for a, b in spans) or 1.0
        cut_above = max(min_gap, busy / 5)
        merged: list[list[float]] = []
        for a, b in spans:
            if merged and a - merged[-1][1] <= cut_above:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        if not merged:
            merged = [[0.0, 0.0]]
        total = sum(b - a for a, b in merged)
        self.gap = max(total * 0.02, 1e-3)  # the drawn width of a cut
        self.segments: list[tuple[float, float, float]] = []  # (start, end, x of start)
        x = 0.0
        for a, b in merged:
            self.segments.append((a, b, x))
            x += (b - a) + self.gap
        self.width = x - self.gap

    def x(self, ts: float) -> float:
        for start, end, at in reversed(self.segments):
            if ts >= start:
                return at + min(ts - start, end - start)
        return self.segments[0][2]

    def xs(self, values: Iterable[float]) -> list[float]:
        return [self.x(v) for v in values]

    def ts(self, x: float) -> float:
        for start, end, at in reversed(self.segments):
            if x >= at:
                return start + min(x - at, end - start)
        return self.segments[0][0]

    def style(self, axis: Any) -> None:
        """Limits (at least a second wide), ticks as real times, the cuts marked."""
        pad = max(self.width * 0.01, 0.5)
        axis.set_xlim(-pad, self.width + pad)
        short = self.segments[-1][1] - self.segments[0][0] < 86400
        fmt = "%H:%M:%S" if short else "%m-%d %H:%M"
        # Under a minute of activity the ticks are a fraction of a second apart: labels in
        # whole seconds repeated ("02:13:17" three times, none of them at .000).
        fine = self.width < 60

        def label(x: float, _pos: int) -> str:
            if x < 0 or x > self.width:
                return ""  # the padding: ts() would clamp it to the first or last instant
            moment = datetime.fromtimestamp(self.ts(x), UTC)
            return moment.strftime(fmt) + (f".{moment.microsecond // 1000:03d}" if fine else "")

        axis.xaxis.set_major_locator(MaxNLocator(nbins=8))
        axis.xaxis.set_major_formatter(FuncFormatter(label))
        labelled_at = -self.width
        for index in range(1, len(self.segments)):
            previous_start, previous_end, previous_at = self.segments[index - 1]
            start = self.segments[index][0]
            x = previous_at + (previous_end - previous_start) + self.gap / 2
            axis.axvline(x, color="#999999", lw=0.8, ls=(0, (2, 2)))
            if x - labelled_at < self.width * 0.04:
                continue  # cuts close together: one label is enough to read
            labelled_at = x
            axis.text(
                x,
                0.98,
                f"{_duration(start - previous_end)} idle ",
                transform=axis.get_xaxis_transform(),
                fontsize=7,
                color="#666666",
                va="top",
                ha="right",
                rotation=90,
            )
        first = datetime.fromtimestamp(self.segments[0][0], UTC)
        axis.set_xlabel(f"UTC from {first:%Y-%m-%d %H:%M:%S}" + ("; idle gaps cut" if len(self.segments) > 1 else ""))
        axis.grid(True, alpha=0.3)


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


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
    time_axis = TimeAxis((min(t for t, _ in series[run]), max(t for t, _ in series[run])) for run in runs)
    for index, run in enumerate(runs):
        points = sorted(series[run])
        label = "depth" if index == 0 else None
        axis.step(
            time_axis.xs(t for t, _ in points),
            [d for _, d in points],
            where="post",
            color="#1f5fa8",
            lw=1.2,
            label=label,
        )
    for index, (start, end) in enumerate(stopped):
        axis.axvspan(
            *time_axis.xs([start, end]), color="#d9534f", alpha=0.18, lw=0, label="flow stopped" if index == 0 else None
        )
    for value, label, style in ((maximum, "max", "-"), (stop, "stop", "--"), (resume, "resume", ":")):
        if value:
            axis.axhline(value, color="#444444", ls=style, lw=1, label=f"{label} {value:,}")
    axis.set_title(f"{address}: depth (messages)")
    axis.set_ylabel("messages")
    axis.set_ylim(bottom=0)
    time_axis.style(axis)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def latency_plot(path: Path, address: str, rows: Sequence[dict[str, Any]], width: float = 1.0) -> None:
    """Enqueue-to-settle and enqueue-to-delivery percentiles per time bucket (``width`` s)."""
    figure, axis = plt.subplots(figsize=(10, 3.6), dpi=100)
    rows = sorted(rows, key=lambda r: r["bucket_start"])
    time_axis = TimeAxis(((r["bucket_start"], r["bucket_start"] + width) for r in rows), min_gap=max(60.0, 3 * width))
    times = time_axis.xs(r["bucket_start"] + width / 2 for r in rows)
    colours = {"p50": "#2e7d32", "p95": "#f9a825", "p99": "#c62828"}
    for measure, style in (("to_settle", "-"), ("to_deliver", "--")):
        for p, colour in colours.items():
            values = [r[f"{measure}_{p}_ms"] for r in rows]
            if any(v is not None for v in values):
                label = f"{measure.replace('_', ' ')} {p}"
                marker = 3 if len(rows) > 5 else 8  # a lone bucket must still show
                axis.plot(times, values, style, color=colour, lw=1.2, marker=".", ms=marker, label=label)
    if not axis.get_lines():
        axis.text(0.5, 0.5, "no message was delivered or settled", transform=axis.transAxes, ha="center")
    axis.set_title(f"{address}: latency from enqueue (ms)")
    axis.set_ylabel("ms")
    axis.set_ylim(bottom=0)
    time_axis.style(axis)
    if axis.get_lines():
        axis.legend(loc="upper right", fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
