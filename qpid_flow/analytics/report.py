"""``qpid-flow report EVENTS... --out DIR``: read event logs, analyse them on Spark, write
tables (Parquet and CSV), PNG plots and ``index.html``.

Also runnable by spark-submit, unchanged::

    spark-submit --master spark://host:7077 qpid_flow/analytics/report.py EVENTS... --out DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from qpid_flow.analytics.inputs import InputError, damaged_parquet, expand_inputs

if TYPE_CHECKING:
    from qpid_flow.analytics.class_archive import ClassArchive

TITLE = "qpid-flow report"
STEPS = [
    "reading events",
    "flow control",
    "latency",
    "message-group audit",
    "threshold advice",
    "plots",
    "page",
]

# Columns shown on the page (every column is in the CSV and Parquet files).
FLOW_COLUMNS = [
    "address",
    "runs",
    "enqueued",
    "flowStoppedCount",
    "stopped_seconds",
    "longest_stop_seconds",
    "producer_seconds_blocked",
    "stopped_at_end",
    "peak_depth",
    "peak_bytes",
    "flowStopCount",
    "max_overshoot_count",
    "max_overshoot_bytes",
]
LATENCY_COLUMNS = [
    "address",
    "to_deliver_count",
    "to_deliver_p50_ms",
    "to_deliver_p95_ms",
    "to_deliver_p99_ms",
    "to_settle_count",
    "to_settle_p50_ms",
    "to_settle_p95_ms",
    "to_settle_p99_ms",
    "to_settle_max_ms",
]
AUDIT_COLUMNS = ["address", "groups", "first_deliveries", "redeliveries", "order_violations", "overlap_violations"]
ADVICE_COLUMNS = [
    "address",
    "max_count",
    "stop_count",
    "resume_count",
    "peak_depth",
    "max_overshoot_count",
    "peak_producers",
    "window_count",
    "advised_stop_count",
    "advised_resume_count",
    "suggested_max_count",
    "max_size",
    "advised_stop_bytes",
    "advised_resume_bytes",
    "suggested_max_bytes",
]


@dataclass
class ReportResult:
    """What a report found, for the command's exit status and for tests."""

    out: Path
    events: int
    runs: int
    flow: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    order_violations: list[dict[str, Any]] = field(default_factory=list)
    overlap_violations: list[dict[str, Any]] = field(default_factory=list)
    advice: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    # What was wrong with the input (repeats dropped, damaged streams): a line each.
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    step_seconds: list[tuple[str, float]] = field(default_factory=list)


class _Writer:
    """Writes each result table as Parquet and CSV under ``out`` from one computation: the
    table is kept (a small cache) for the tables computed from it, collected once (as
    Arrow), put in order on the driver (:func:`_in_order`), and written from the collected
    rows, not by more Spark jobs."""

    def __init__(self, spark: Any, out: Path) -> None:
        self.spark = spark
        self.out = out
        self.frames: dict[str, Any] = {}

    def save(self, name: str, frame: Any, order: Sequence[str]) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        kept = frame.persist()
        self.frames[name] = kept
        table = _in_order(kept.toArrow(), order)
        # One file per table: the tables are small (one row per destination, per period or
        # per violation). Parquet as Spark would write it; CSV for spreadsheets.
        parquet = self.out / "parquet" / name
        if parquet.exists():
            shutil.rmtree(parquet)
        parquet.mkdir(parents=True)
        pq.write_table(table, str(parquet / "part-00000.parquet"), compression="snappy")
        rows: list[dict[str, Any]] = table.to_pylist()
        _write_csv(self.out / "csv" / name, table.column_names, rows)
        return rows

    def frame(self, name: str) -> Any:
        """The table ``name``, as saved (computed once)."""
        return self.frames[name]

    def links(self, name: str) -> list[str]:
        return [f"csv/{name}/", f"parquet/{name}/"]


class _FlowTables(NamedTuple):
    """What the flow section gives the sections that wait for it."""

    periods: list[dict[str, Any]]  # flow_periods, as saved
    rows: list[dict[str, Any]]  # flow_by_destination, as saved
    levels: Any  # flow.destination_levels (kept until the advice is done)
    spans: dict[str, tuple[float, float]]  # flow.depth_spans: the depth plots' time axes


def _sort_key(value: Any) -> tuple:
    # Spark's ascending order: null first, NaN after every number.
    if value is None:
        return (0,)
    if isinstance(value, float) and value != value:
        return (2,)
    return (1, value)


def _in_order(table: Any, order: Sequence[str]) -> Any:
    """``table``'s rows sorted by ``order`` as Spark's ``orderBy`` sorts them (ascending,
    nulls first; strings by code point, as by their UTF-8 bytes). On the driver: a result
    table is small, and a global sort in Spark is two jobs (one samples the rows to range
    partition them) and two stages more per table."""
    import pyarrow as pa

    columns = [table.column(name).to_pylist() for name in order]
    rows = sorted(range(table.num_rows), key=lambda i: tuple(_sort_key(c[i]) for c in columns))
    return table.take(pa.array(rows, type=pa.int64()))


def _csv_value(value: Any) -> Any:
    # As Spark's CSV writer: timestamps in ISO 8601, booleans lower case, null empty.
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _write_csv(folder: Path, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    import csv

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with (folder / "part-00000.csv").open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_value(row[c]) for c in columns])


# The JSON reader puts a line it cannot parse whole (not JSON, or a field of the wrong type,
# which it would otherwise read as null) in this column: such a line is counted unreadable.
CORRUPT_RECORD = "_corrupt_record"


class DamagedStream(NamedTuple):
    """An open segment's stream read up to a corrupt batch (or not at all: a damaged head)."""

    path: str
    reason: str  # writers.read_stream's: "batch 3: ..." or "stream head: ..."
    records: int  # the records read before the damage


def _read_inputs(spark: Any, paths: list[str], scratch: Path) -> tuple[Any, list[DamagedStream]]:
    """Every input as one frame of the event schema (and the ``CORRUPT_RECORD`` column):
    JSON lines (plain or gzip) parsed with the schema; the columnar log's Parquet segments
    read as they are; an open segment's Arrow stream (``.arrows``: a router still running,
    or killed) converted to Parquet in ``scratch`` first, since Spark has no reader for it.
    Also the streams that were damaged, read up to the damage.

    A router may still be writing a columnar log: its files are looked at again here, after
    the JVM started (:func:`~qpid_flow.analytics.inputs.current_files`), and Spark skips a
    Parquet file that is pruned while it reads (``ignoreMissingFiles``) rather than failing."""
    from functools import reduce

    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from qpid_flow.analytics.inputs import current_files, unique_files
    from qpid_flow.analytics.schema import EVENT_SCHEMA

    paths = current_files(paths)
    parquet = [p for p in paths if p.endswith(".parquet")]
    streams = [p for p in paths if p.endswith(".arrows")]
    text = [p for p in paths if not p.endswith((".parquet", ".arrows"))]
    damaged = []
    for index, stream in enumerate(streams):
        converted, damage = _stream_as_parquet(Path(stream), scratch / f"stream-{index}.parquet")
        if converted is not None:
            parquet.append(str(converted))
        if damage is not None:
            damaged.append(damage)
    parquet = unique_files(parquet)  # a stream finished meanwhile is its Parquet file, maybe listed too
    no_corrupt_record = F.lit(None).cast("string").alias(CORRUPT_RECORD)
    frames = []
    if text:
        with_corrupt = StructType([*EVENT_SCHEMA.fields, StructField(CORRUPT_RECORD, StringType())])
        reader = spark.read.schema(with_corrupt).option("mode", "PERMISSIVE")
        frames.append(reader.option("columnNameOfCorruptRecord", CORRUPT_RECORD).json(text))
    if parquet:
        read = spark.read.schema(EVENT_SCHEMA).option("ignoreMissingFiles", "true").parquet(*parquet)
        frames.append(read.select("*", no_corrupt_record))
    if not frames:  # every file went (pruned) between the listing and now
        frames.append(spark.createDataFrame([], EVENT_SCHEMA).select("*", no_corrupt_record))
    return reduce(lambda a, b: a.unionByName(b), frames), damaged


def _stream_as_parquet(stream: Path, target: Path) -> tuple[Path | None, DamagedStream | None]:
    """An open segment's stream as the Parquet file ``target``, up to its last complete
    batch, and what was wrong with it if it was damaged (a corrupt batch, left out with
    everything after it, or a head that cannot be read). A stream that has gone since it
    was listed was finished by its writer: then the Parquet file it became, or None if that
    has been pruned too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qpid_flow.policies.event_log.writers import arrow_schema, read_stream

    try:
        batches, reason = read_stream(stream)
    except FileNotFoundError:
        finished = stream.with_suffix(".parquet")
        return (finished if finished.exists() else None), None
    pq.write_table(pa.Table.from_batches(batches, schema=arrow_schema()), str(target))
    damage = None if reason is None else DamagedStream(str(stream), reason, sum(b.num_rows for b in batches))
    return target, damage


@dataclass
class EventStats:
    """What one pass over the parsed events counts, by schema version and run."""

    events: int = 0
    unreadable: int = 0
    other_versions: int = 0
    runs: int = 0
    t0: float | None = None
    t1: float | None = None
    # The last event time of each run (schema version 1 events only).
    run_end: dict[str | None, float | None] = field(default_factory=dict)
    # (run, address) of every group_assigned event (schema version 1 events only).
    assigned: list[tuple[str | None, str | None]] = field(default_factory=list)
    # Records of a run read more than once (the same (run, n)), dropped.
    repeated: int = 0
    # Open segments' streams read up to a corrupt batch, or not at all.
    damaged: list[DamagedStream] = field(default_factory=list)


# Fields no analysis reads: not parsed, not cached. (The latency reads ``outcome``: a
# released message was not settled for good.)
_UNUSED_FIELDS = ("id", "condition", "reason")


def load_events(
    spark: Any, paths: list[str], scratch: Path, before_stats: Callable[[Any], None] | None = None
) -> tuple[Any, EventStats]:
    """The events (schema version 1, cached) and what one pass over them counts.
    ``before_stats``: called with the events before that pass, to start other work on
    them alongside it; called again with the events without their repeats if that pass
    finds a run read twice."""
    from pyspark.sql import functions as F

    from qpid_flow.analytics.schema import EVENT_SCHEMA

    raw, damaged = _read_inputs(spark, paths, scratch)
    # A line the JSON reader could not parse whole has no version: it is unreadable.
    readable_v = F.when(F.col(CORRUPT_RECORD).isNull(), F.col("v")).alias("v")
    used = [readable_v if name == "v" else F.col(name) for name in EVENT_SCHEMA.names if name not in _UNUSED_FIELDS]
    # Parsed once: the cache is filled by the aggregation below, and every later step (the
    # version filter included) reads the cache, not the text. ``n`` is cached as the log
    # has it, so that the aggregation tells a run's numbers from the times standing in for
    # them (_numbered).
    parsed = raw.select(*used).persist()
    if before_stats is not None:
        before_stats(_numbered(parsed))
    rows = _count_events(parsed)
    stats = _event_stats(rows)
    stats.damaged = damaged
    repeated_runs = _runs_with_repeats(rows)
    if repeated_runs:  # only then: a log without repeats costs no pass more
        parsed, stats.repeated = _drop_repeats(parsed, repeated_runs, sum(row["count"] for row in rows))
        stats.events -= stats.repeated
        if before_stats is not None:
            before_stats(_numbered(parsed))
    return _numbered(parsed), stats


def _numbered(parsed: Any) -> Any:
    """The events of schema version 1, each with its number. Logs written before the event
    number existed are ordered by time (microseconds)."""
    from pyspark.sql import functions as F

    from qpid_flow.analytics.schema import SCHEMA_VERSION

    numbered = F.coalesce(F.col("n"), (F.col("ts") * 1_000_000).cast("long"))
    return parsed.where(F.col("v") == SCHEMA_VERSION).withColumn("n", numbered)


def _count_events(parsed: Any) -> list[Any]:
    """One small table answers the counts by version, the time span, the runs, where
    groups were assigned and whether a run was read twice: one row per (version, run,
    address, group_assigned or not)."""
    from pyspark.sql import functions as F

    assigned = F.col("event") == "group_assigned"
    return (
        parsed.groupBy("v", "run", F.when(assigned, F.col("address")).alias("assigned_to"), assigned.alias("assigned"))
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.min("ts").alias("t0"),
            F.max("ts").alias("t1"),
            F.count("n").alias("numbered"),
            F.min("n").alias("n0"),
            F.max("n").alias("n1"),
        )
        .collect()
    )


def _event_stats(rows: list[Any]) -> EventStats:
    from qpid_flow.analytics.schema import SCHEMA_VERSION

    stats = EventStats()
    for row in rows:
        if row["v"] != SCHEMA_VERSION:
            if row["v"] is None:
                stats.unreadable += row["count"]
            else:
                stats.other_versions += row["count"]
            continue
        stats.events += row["count"]
        run = row["run"]
        if row["t1"] is not None:
            end = stats.run_end.get(run)
            stats.run_end[run] = row["t1"] if end is None else max(end, row["t1"])
        else:
            stats.run_end.setdefault(run, None)
        if row["t0"] is not None:
            stats.t0 = row["t0"] if stats.t0 is None else min(stats.t0, row["t0"])
            stats.t1 = row["t1"] if stats.t1 is None else max(stats.t1, row["t1"])
        if row["assigned"]:
            stats.assigned.append((run, row["assigned_to"]))
    stats.runs = len([run for run in stats.run_end if run is not None])
    return stats


def _runs_with_repeats(rows: list[Any]) -> list[str]:
    """The runs (schema version 1) holding more numbered events than numbers between their
    first and last: a run numbers its events from 1 and skips a number only when its
    writer dropped a record, so more events than numbers means some were read twice (a
    file and its copy: a .gz beside the plain file, a Parquet copy of a JSON-lines log)."""
    from qpid_flow.analytics.schema import SCHEMA_VERSION

    spans: dict[str, tuple[int, int, int]] = {}
    for row in rows:
        if row["v"] != SCHEMA_VERSION or row["run"] is None or not row["numbered"]:
            continue
        numbered, n0, n1 = spans.get(row["run"], (0, row["n0"], row["n1"]))
        spans[row["run"]] = (numbered + row["numbered"], min(n0, row["n0"]), max(n1, row["n1"]))
    return sorted(run for run, (numbered, n0, n1) in spans.items() if numbered > n1 - n0 + 1)


def _drop_repeats(parsed: Any, runs: list[str], count: int) -> tuple[Any, int]:
    """``parsed`` (cached) with each numbered event of ``runs`` once, cached in its place,
    and how many rows went (``count``: the rows of ``parsed``)."""
    from pyspark.sql import functions as F

    from qpid_flow.analytics.schema import SCHEMA_VERSION

    repeatable = (F.col("v") == SCHEMA_VERSION) & F.col("run").isin(runs) & F.col("n").isNotNull()
    repeatable = F.coalesce(repeatable, F.lit(False))
    once = parsed.where(repeatable).dropDuplicates(["run", "n"])
    kept = parsed.where(~repeatable).unionByName(once).persist()
    dropped = count - kept.count()
    parsed.unpersist()
    return kept, dropped


def _small_frame(spark: Any, rows: list[tuple[Any, ...]], schema: str) -> Any:
    """A frame of a few rows, as literals in the plan: no Python RDD (and no Python worker
    process) behind it, as ``createDataFrame`` would have."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructType

    kinds = StructType.fromDDL(schema)
    assert isinstance(kinds, StructType)
    structs = [
        F.struct(*[F.lit(value).cast(f.dataType).alias(f.name) for value, f in zip(row, kinds.fields, strict=True)])
        for row in rows
    ]
    array = F.array(*structs) if structs else F.array().cast(ArrayType(kinds))
    return spark.range(1).select(F.inline(array)).select(*[F.col(f.name).cast(f.dataType) for f in kinds.fields])


def _depth_series(
    events: Any, flow_rows: list[dict[str, Any]], spans: dict[str, tuple[float, float]], max_plots: int
) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[tuple[float, int]]]]]:
    """The destinations plotted (most flow stops, then deepest) and their depth series.
    ``spans``: :func:`.flow.depth_spans`."""
    from qpid_flow.analytics.flow import depth_series

    ranked = sorted(flow_rows, key=lambda r: (-r["flowStoppedCount"], -r["peak_depth"], r["address"]))[:max_plots]
    chosen = [r["address"] for r in ranked]
    if not chosen:
        return [], {}
    series: dict[str, dict[str, list[tuple[float, int]]]] = {a: {} for a in chosen}
    for row in depth_series(events, {a: spans[a] for a in chosen if a in spans}):
        series[row["address"]].setdefault(row["run"], []).append((row["ts"], row["depth"]))
    return ranked, series


def _plot_depths(
    out: Path,
    policies: dict[str, Any],
    ranked: list[dict[str, Any]],
    series: dict[str, dict[str, list[tuple[float, int]]]],
    periods: list[dict[str, Any]],
) -> list:
    from qpid_flow.analytics import plots

    images = []
    for row in ranked:
        address = row["address"]
        policy = policies.get(address, {})
        stopped = [(p["start"], p["end"]) for p in periods if p["address"] == address]
        path = out / "plots" / f"depth-{plots.file_stem(address)}.png"
        plots.depth_plot(
            path,
            address,
            series[address],
            stopped,
            int(policy.get("stop_count") or row["flowStopCount"] or 0),
            int(policy.get("resume_count") or 0),
            int(policy.get("max_count") or 0),
        )
        images.append((f"plots/{path.name}", f"depth of {address}"))
    return images


def _plot_latency(out: Path, over_time: list[dict[str, Any]], addresses: list[str], width: float) -> list:
    from qpid_flow.analytics import plots

    images = []
    for address in addresses:
        rows = [r for r in over_time if r["address"] == address]
        if not rows:
            continue
        path = out / "plots" / f"latency-{plots.file_stem(address)}.png"
        plots.latency_plot(path, address, rows, width)
        images.append((f"plots/{path.name}", f"latency of {address}"))
    return images


def run_report(
    spark: Any, inputs: list[str], out: Path, max_plots: int = 12, progress_out: Any = sys.stderr
) -> ReportResult:
    """Run every analysis of ``inputs`` (expanded paths) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="qpid-flow-report-"))
    try:
        return _run_report(spark, inputs, out, max_plots, progress_out, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_report(
    spark: Any, inputs: list[str], out: Path, max_plots: int, progress_out: Any, scratch: Path
) -> ReportResult:

    from qpid_flow.analytics import advice, audit, flow, latency, messages
    from qpid_flow.analytics.page import Section, Table, render_report
    from qpid_flow.analytics.progress import Progress

    page = out / "index.html"
    writer = _Writer(spark, out)
    with Progress(TITLE, STEPS, page, spark, progress_out) as progress:
        progress.step("reading events")
        early: dict[str, Any] = {}
        first = ThreadPoolExecutor(max_workers=1, thread_name_prefix="report-levels")

        def start_levels(events: Any) -> None:
            # The few events about destinations and links (flow periods, thresholds,
            # advice), and the levels of each destination (flow control and advice):
            # computed alongside the pass that counts the events, which uses the two cores
            # while the driver prepares the sections below. Started again without the
            # repeats of a run read twice, if any: the first ones counted them.
            for stale in ("control", "levels"):
                if stale in early:
                    early[stale].unpersist()
            control = flow.control_events(events).persist()
            levels = flow.destination_levels(events, control).persist()
            early.update(control=control, levels=levels, ready=first.submit(levels.count))

        try:
            events, counts = load_events(spark, inputs, scratch, start_levels)
        finally:
            first.shutdown(wait=False)
        control, levels = early["control"], early["levels"]
        t0, t1, runs = counts.t0, counts.t1, counts.runs
        result = ReportResult(out=out, events=counts.events, runs=runs, notes=_input_notes(counts))
        run_end = _small_frame(spark, list(counts.run_end.items()), "run string, run_end double")
        assigned = _small_frame(spark, counts.assigned, "run string, address string")

        width = latency.bucket_seconds((t1 - t0) if t0 is not None and t1 is not None else 0.0)

        # Each message's events in order, for the latency and the audit (one shuffle).
        moves = messages.message_moves(events, audit.grouped_destinations(control, assigned)).persist()

        def flow_section() -> _FlowTables:
            periods = writer.save("flow_periods", flow.flow_periods(control, run_end), ["address", "start"])
            # Shared with the threshold advice (the largest message of each destination).
            early["ready"].result()
            rows = writer.save(
                "flow_by_destination",
                flow.flow_by_destination(events, writer.frame("flow_periods"), levels),
                ["address"],
            )
            # The depth plots' time axes, before the advice lets the levels go.
            return _FlowTables(periods, rows, levels, flow.depth_spans(levels))

        def latency_section() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            latencies = latency.message_latencies(events, moves)
            by_destination = writer.save(
                "latency_by_destination", latency.latency_by_destination(latencies), ["address"]
            )
            over_time = writer.save(
                "latency_over_time", latency.latency_over_time(latencies, width), ["address", "bucket_start"]
            )
            return by_destination, over_time

        def audit_section() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
            held = audit.by_group(audit.holds(events, moves=moves)).persist()
            order = writer.save("group_order_violations", audit.order_violations(held), ["address", "group", "n"])
            overlap = writer.save("group_overlap_violations", audit.overlap_violations(held), ["address", "group", "n"])
            summary = writer.save(
                "group_audit",
                audit.audit_summary(
                    held, writer.frame("group_order_violations"), writer.frame("group_overlap_violations")
                ),
                ["address"],
            )
            held.unpersist()
            return summary, order, overlap

        def advice_section() -> list[dict[str, Any]]:
            levels = flow_done.result().levels
            rows = writer.save(
                "threshold_advice",
                advice.threshold_advice(control, writer.frame("flow_by_destination"), levels),
                ["address"],
            )
            levels.unpersist()
            return rows

        def depth_section() -> tuple[list[dict[str, Any]], dict[str, dict[str, list[tuple[float, int]]]]]:
            tables = flow_done.result()
            return _depth_series(events, tables.rows, tables.spans, max_plots)

        # The sections are independent Spark work (the advice and the depth series wait for
        # the flow tables): each runs in a thread of its own, so that one section's driver
        # work (planning, collecting, writing files) and its stages of a single task overlap
        # another's. Each table is computed as before, whatever the interleaving; the steps
        # below wait for the sections in order, and the plots are drawn here, in one thread.
        progress.step("flow control")
        pool = ThreadPoolExecutor(max_workers=5, thread_name_prefix="report")
        try:
            flow_done = pool.submit(flow_section)
            latency_done = pool.submit(latency_section)
            audit_done = pool.submit(audit_section)
            advice_done = pool.submit(advice_section)
            depth_done = pool.submit(depth_section)
            flow_tables = flow_done.result()
            periods, result.flow = flow_tables.periods, flow_tables.rows

            progress.step("latency")
            result.latency, over_time = latency_done.result()
            # Drawn while Spark works on the other sections.
            busiest = [r["address"] for r in sorted(result.latency, key=lambda r: -(r["to_settle_count"] or 0))]
            latency_images = _plot_latency(out, over_time, busiest[:max_plots], width)

            progress.step("message-group audit")
            result.audit, result.order_violations, result.overlap_violations = audit_done.result()
            moves.unpersist()

            progress.step("threshold advice")
            result.advice = advice_done.result()

            progress.step("plots")
            ranked, series = depth_done.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        policies = {r["address"]: r for r in result.advice}
        depth_images = _plot_depths(out, policies, ranked, series, periods)
        result.plots = [src for src, _ in depth_images + latency_images]

        progress.step("page")
        spark.catalog.clearCache()  # the parsed events (load_events)
        total_order = sum(r["order_violations"] for r in result.audit)
        total_overlap = sum(r["overlap_violations"] for r in result.audit)
        healthy = total_order == 0 and total_overlap == 0
        sections = [
            Section(
                "Flow control",
                "One row per destination over every run. flowStoppedCount counts the times flow control "
                "turned on (as qpid-flow stat does); producer seconds blocked = each stopped period's length "
                "times the producer links it stopped; overshoot = depth above the stop threshold in force.",
                tables=[
                    Table("Per destination", result.flow, FLOW_COLUMNS, files=writer.links("flow_by_destination")),
                    Table(
                        "Flow-stopped periods",
                        periods,
                        ["address", "run", "start", "seconds", "open", "depth_at_stop", "producers", "flowStopCount"],
                        files=writer.links("flow_periods"),
                        limit=10,
                    ),
                ],
                images=depth_images,
            ),
            Section(
                "Latency",
                f"Milliseconds from a message's enqueue to its first delivery and to its final settlement "
                f"(a release is none: the message went back); "
                f"over time in buckets of {width} s of enqueue time. In front of a broker a message is "
                f"enqueued when it arrives from the broker: its latency is its time in qpid-flow and at the "
                f"consumer, not in the broker's queue.",
                tables=[
                    Table(
                        "Per destination", result.latency, LATENCY_COLUMNS, files=writer.links("latency_by_destination")
                    ),
                ],
                images=latency_images,
            ),
            Section(
                "Message-group audit",
                "First deliveries must follow enqueue order within a group (redeliveries are not counted); "
                "two consumers must never hold unsettled messages of one group at the same time.",
                verdict=(
                    healthy,
                    "No violation: every group was delivered in order, to one consumer at a time."
                    if healthy
                    else f"{total_order:,} order violation(s) and {total_overlap:,} overlap violation(s).",
                ),
                tables=[
                    Table("Per grouped destination", result.audit, AUDIT_COLUMNS, files=writer.links("group_audit")),
                    Table(
                        "Order violations",
                        result.order_violations,
                        ["address", "group", "seq", "delivered_before", "consumer", "n", "ts"],
                        files=writer.links("group_order_violations"),
                        limit=20,
                    ),
                    Table(
                        "Overlap violations",
                        result.overlap_violations,
                        ["address", "group", "consumer", "other_consumer", "n", "ts", "other_settled_n"],
                        files=writer.links("group_overlap_violations"),
                        limit=20,
                    ),
                ],
            ),
            Section(
                "Threshold advice",
                "Stop = max - max(credit windows of the producers attached at once, observed overshoot), "
                "so that a destination "
                "stays under its maximum even if every producer sends its window after the stop (seed 000); "
                "resume keeps the configured resume:stop ratio (70:80 when none). Bytes use the largest message. "
                "Without a maximum, a suggested maximum = observed peak + windows.",
                tables=[
                    Table("Per destination", result.advice, ADVICE_COLUMNS, files=writer.links("threshold_advice"))
                ],
            ),
        ]
        result.seconds = progress.finish()
        result.step_seconds = progress.timings
        left_out = sum(r["durations_left_out"] for r in result.flow + result.latency)
        summary = [
            ("inputs", ", ".join(inputs[:5]) + (f" and {len(inputs) - 5} more" if len(inputs) > 5 else "")),
            ("events read", f"{counts.events:,} (schema v1)"),
            ("unreadable lines", f"{counts.unreadable:,}"),
            ("other schema versions (skipped)", f"{counts.other_versions:,}"),
            ("repeated records (dropped)", f"{counts.repeated:,}"),
            ("damaged streams (read up to the damage)", "; ".join(map(_damage, counts.damaged)) or "none"),
            ("durations left out (clock went back)", f"{left_out:,}"),
            ("runs (qpid-flow processes)", f"{runs:,}"),
            ("from", _when(t0)),
            ("to", _when(t1)),
            (
                "made",
                f"{_when(time.time())} in {result.seconds:.1f} s, Spark {spark.version}, {spark.sparkContext.master}",
            ),
        ]
        temporary = page.with_suffix(".tmp")
        temporary.write_text(render_report(TITLE, summary, sections), encoding="utf-8")
        temporary.replace(page)
    return result


def _damage(stream: DamagedStream) -> str:
    return f"{stream.path}: {stream.reason} ({stream.records:,} records read before it)"


def _input_notes(counts: EventStats) -> list[str]:
    """A line for each thing wrong with the input that the report worked around."""
    notes = [f"damaged stream {_damage(stream)}" for stream in counts.damaged]
    if counts.repeated:
        notes.append(f"{counts.repeated:,} repeated records dropped (a run read twice: a file and a copy of it?)")
    return notes


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "events", nargs="+", metavar="EVENTS", help="event log files, folders or glob patterns (.gz too)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="where the tables, plots and index.html go")
    parser.add_argument("--master", metavar="URL", help="Spark master (default: local[*], tuned for small machines)")
    parser.add_argument("--driver-memory", default="2g", metavar="SIZE", help="local mode driver memory (default 2g)")
    parser.add_argument("--max-plots", type=int, default=12, metavar="N", help="destinations plotted (default 12)")
    parser.add_argument(
        "--no-class-archive",
        action="store_true",
        help="neither map nor record the JVM's class archive in ~/.cache/qpid-flow (docs/report.md)",
    )


def run_command(args: argparse.Namespace) -> int:
    try:
        inputs = expand_inputs(args.events)
    except InputError as exc:
        print(f"qpid-flow report: {exc}", file=sys.stderr)
        return 2
    refusal = _out_refusal(Path(args.out), args.events, inputs)
    if refusal is not None:
        print(f"qpid-flow report: --out: {refusal}", file=sys.stderr)
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(
            "qpid-flow report: PySpark is not installed: pip install 'qpid-flow[analytics]' (and a Java runtime)",
            file=sys.stderr,
        )
        return 2
    damaged = damaged_parquet(inputs)
    if damaged is not None:
        print(f"qpid-flow report: cannot read {damaged[0]}: {damaged[1]}", file=sys.stderr)
        return 1
    from qpid_flow.analytics.class_archive import class_archive, java_binary
    from qpid_flow.analytics.session import build_session, under_spark_submit

    java = java_binary()
    if java is None:
        print(
            "qpid-flow report: no Java runtime found (Spark needs one): install openjdk-17-jre-headless",
            file=sys.stderr,
        )
        return 2
    archive = None if args.no_class_archive or under_spark_submit() else class_archive(java)
    try:
        spark = build_session(args.master, args.driver_memory, archive)
        try:
            result = run_report(spark, inputs, Path(args.out), args.max_plots)
        finally:
            spark.stop()
    except Exception as exc:  # Spark's errors are long Java traces: say what failed, in one line
        print(f"qpid-flow report: Spark failed: {_spark_failure(exc)}", file=sys.stderr)
        return 1
    for note in result.notes:
        print(f"report: {note}", file=sys.stderr)
    violations = len(result.order_violations) + len(result.overlap_violations)
    print(
        f"report: {result.events:,} events, {result.runs} run(s), {len(result.flow)} destination(s), "
        f"{violations} group violation(s), {result.seconds:.1f} s -> {Path(args.out) / 'index.html'}",
        file=sys.stderr,
    )
    if archive is not None and archive.recording:
        _record_class_archive(archive)
    return 0


def _out_refusal(out: Path, specs: Sequence[str], inputs: Sequence[str]) -> str | None:
    """Why ``out`` cannot take the report of ``inputs`` (listed from ``specs``), if it
    cannot: told before Spark starts. A report's tables inside an input folder, or inputs
    inside the report's folder, would be read by the next report as events."""
    if out.exists() and not out.is_dir():
        return f"{str(out)!r} is a file, not a folder"
    where = os.path.realpath(out)
    for spec in specs:
        if "://" not in spec and os.path.isdir(spec) and _inside(where, os.path.realpath(spec)):
            return f"{str(out)!r} is the input folder {spec!r} or inside it: the next report would read this one"
    for path in inputs:
        if "://" not in path and _inside(os.path.realpath(path), where):
            return f"{str(out)!r} holds the input {path!r}: the next report would read this one"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {str(out)!r}: {exc.strerror}"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"cannot write in {str(out)!r}"
    return None


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (both resolved)."""
    return os.path.commonpath([path, folder]) == folder


def _spark_failure(exc: BaseException) -> str:
    """A failed Spark job in one line: the deepest cause its Java trace gives, and the file
    it names if it names one (not Py4J's "An error occurred while calling o445....")."""
    lines = [line.strip().removeprefix(": ") for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    told = [line for line in lines if not line.startswith("An error occurred while calling")]
    message = causes[-1] if causes else (told or lines)[0]
    named = re.search(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", "\n".join(lines))
    if named is None:
        return message
    file = named.group().rstrip(".,;:").removeprefix("file://")
    return message if file in message else f"{file}: {message}"


def _record_class_archive(archive: ClassArchive) -> None:
    from pyspark import SparkContext

    print(f"report: recording the JVM's classes in {archive.path} for faster starts (once)", file=sys.stderr)
    if not archive.finish(SparkContext._gateway):
        print("report: the class archive was not recorded; the next report will try again", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qpid-flow report", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
