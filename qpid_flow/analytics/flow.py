"""Flow control from the event log: when each destination was stopped, and how full it got.

- **periods**: one row per flow-stopped period (``flow_stopped`` to the next
  ``flow_resumed`` of the same destination in the same run; a period still open when the
  log ends is closed at the run's last event and marked ``open``);
- **by destination**: ``flowStoppedCount`` (as ``qpid-flow stat`` counts it), total and
  longest time stopped, producer-seconds blocked (each period's length times the producer
  links it stopped), peak depth in messages and bytes, and the largest overshoot above the
  stop threshold in force at the time (messages and bytes).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

# Events that carry a destination's depth, or announce its thresholds.
_LEVEL_EVENTS = ("enqueue", "settle", "flow_stopped", "flow_resumed", "destination")
# Events about a destination or its links, not about one message: a few per flow-control
# cycle, link or policy change.
_CONTROL_EVENTS = ("flow_stopped", "flow_resumed", "producer_attached", "producer_detached", "destination")
# Ordered as a window orders ``n``: an event without a number comes first.
_FIRST = -(2**63)


def control_events(events: DataFrame) -> DataFrame:
    """The few events the flow periods, the thresholds in force and the threshold advice
    read (every ``_CONTROL_EVENTS`` event, and any other depth-carrying event that announces
    a threshold): kept apart (cached), so that those analyses do not scan every event."""
    announces = F.col("flowStopCount").isNotNull() | F.col("flowStopSize").isNotNull()
    return events.where(F.col("event").isin(*_CONTROL_EVENTS) | (F.col("event").isin(*_LEVEL_EVENTS) & announces))


def run_ends(events: DataFrame) -> DataFrame:
    """The last event time of each run."""
    return events.groupBy("run").agg(F.max("ts").alias("run_end"))


def flow_periods(events: DataFrame, run_end: DataFrame | None = None) -> DataFrame:
    """``run_end``: :func:`run_ends` of ``events``, when already known."""
    changes = events.where(F.col("event").isin("flow_stopped", "flow_resumed"))
    in_order = Window.partitionBy("run", "address").orderBy("n")
    changes = changes.select(
        "run",
        "address",
        "event",
        "ts",
        "depth",
        "bytes",
        "producers",
        "flowStopCount",
        "flowResumeCount",
        "flowStopSize",
        "flowResumeSize",
        F.lead("event").over(in_order).alias("next_event"),
        F.lead("ts").over(in_order).alias("next_ts"),
    )
    if run_end is None:
        run_end = run_ends(events)
    stopped = changes.where(F.col("event") == "flow_stopped").join(F.broadcast(run_end), "run")
    is_open = F.col("next_event").isNull()
    end = F.when(is_open, F.col("run_end")).otherwise(F.col("next_ts"))
    return stopped.select(
        "run",
        "address",
        F.col("ts").alias("start"),
        end.alias("end"),
        # A period that ends before it starts (the wall clock was set back meanwhile) has
        # no length the log can tell: none, left out of the sums (flow_by_destination
        # counts it).
        F.when(end >= F.col("ts"), end - F.col("ts")).alias("seconds"),
        is_open.alias("open"),
        F.col("depth").alias("depth_at_stop"),
        F.col("bytes").alias("bytes_at_stop"),
        "producers",
        "flowStopCount",
        "flowResumeCount",
        "flowStopSize",
        "flowResumeSize",
    )


def _thresholds_in_force(events: DataFrame, control: DataFrame | None = None) -> DataFrame:
    """Depth-carrying events with the stop thresholds in force when they happened (the
    last ones a ``destination`` or flow event of the same run announced).

    Only the few events that carry a threshold are put in order (a window); each of them
    is in force from its number to the next one's, and every other event takes the one
    whose range holds its number (a broadcast join): no sort of every event. ``control``:
    :func:`control_events` of ``events``, when kept."""
    with_depth = events.where(F.col("event").isin(*_LEVEL_EVENTS))
    order = F.coalesce(F.col("n"), F.lit(_FIRST))
    carriers = (
        (control if control is not None else events)
        .where(F.col("event").isin(*_LEVEL_EVENTS))
        .where(F.col("flowStopCount").isNotNull() | F.col("flowStopSize").isNotNull())
    )
    in_order = Window.partitionBy("run", "address").orderBy(order)
    so_far = in_order.rowsBetween(Window.unboundedPreceding, 0)
    ranges = carriers.select(
        F.col("run").alias("r_run"),
        F.col("address").alias("r_address"),
        order.alias("r_from"),
        F.lead(order).over(in_order).alias("r_to"),
        F.last("flowStopCount", ignorenulls=True).over(so_far).alias("stop_count"),
        F.last("flowStopSize", ignorenulls=True).over(so_far).alias("stop_size"),
    )
    inside = (
        F.col("run").eqNullSafe(F.col("r_run"))
        & F.col("address").eqNullSafe(F.col("r_address"))
        & (order >= F.col("r_from"))
        & (F.col("r_to").isNull() | (order < F.col("r_to")))
    )
    return with_depth.join(F.broadcast(ranges), inside, "left").select(
        "run", "address", "event", "ts", "depth", "bytes", "size", "stop_count", "stop_size"
    )


def destination_levels(events: DataFrame, control: DataFrame | None = None) -> DataFrame:
    """Per destination, in one pass over the depth-carrying events: peak depth and bytes,
    overshoot above the stop threshold in force, the largest stop thresholds, the
    enqueued messages (count, runs, largest size), and the time span of the events that
    carry a depth (``depth_t0``, ``depth_t1``: the axis of its depth plot, see
    :func:`depth_series`). ``control``: :func:`control_events`."""
    levels = _thresholds_in_force(events, control)
    over_count = F.when(F.col("stop_count") > 0, F.col("depth") - F.col("stop_count"))
    over_size = F.when(F.col("stop_size") > 0, F.col("bytes") - F.col("stop_size"))
    # A destination without a name is never matched to its enqueued messages (a join).
    enqueue = (F.col("event") == "enqueue") & F.col("address").isNotNull()
    return levels.groupBy("address").agg(
        F.max("depth").alias("peak_depth"),
        F.max("bytes").alias("peak_bytes"),
        F.greatest(F.max(over_count), F.lit(0)).alias("max_overshoot_count"),
        F.greatest(F.max(over_size), F.lit(0)).alias("max_overshoot_bytes"),
        F.max("stop_count").alias("flowStopCount"),
        F.max("stop_size").alias("flowStopSize"),
        F.count(F.when(enqueue, F.lit(1))).alias("enqueued"),
        F.countDistinct(F.when(enqueue, F.col("run"))).alias("runs"),
        F.max(F.when(enqueue, F.col("size"))).alias("largest_message"),
        F.min(F.when(F.col("depth").isNotNull(), F.col("ts"))).alias("depth_t0"),
        F.max(F.when(F.col("depth").isNotNull(), F.col("ts"))).alias("depth_t1"),
    )


def flow_by_destination(events: DataFrame, periods: DataFrame, levels: DataFrame | None = None) -> DataFrame:
    """``levels``: :func:`destination_levels` of ``events``, when already computed."""
    per_period = periods.groupBy("address").agg(
        F.count(F.lit(1)).alias("flowStoppedCount"),
        F.sum("seconds").alias("stopped_seconds"),
        F.max("seconds").alias("longest_stop_seconds"),
        F.sum(F.col("seconds") * F.coalesce(F.col("producers"), F.lit(0))).alias("producer_seconds_blocked"),
        F.sum(F.col("open").cast("int")).alias("open_at_end"),
        F.count(F.when(F.col("end") < F.col("start"), F.lit(1))).alias("durations_left_out"),
    )
    if levels is None:
        levels = destination_levels(events)
    result = levels.join(per_period, "address", "left")
    return result.select(
        "address",
        F.coalesce("runs", F.lit(0)).alias("runs"),
        F.coalesce("enqueued", F.lit(0)).alias("enqueued"),
        F.coalesce("flowStoppedCount", F.lit(0)).alias("flowStoppedCount"),
        F.coalesce("stopped_seconds", F.lit(0.0)).alias("stopped_seconds"),
        F.coalesce("longest_stop_seconds", F.lit(0.0)).alias("longest_stop_seconds"),
        F.coalesce("producer_seconds_blocked", F.lit(0.0)).alias("producer_seconds_blocked"),
        F.coalesce("open_at_end", F.lit(0)).alias("stopped_at_end"),
        F.coalesce("peak_depth", F.lit(0)).alias("peak_depth"),
        F.coalesce("peak_bytes", F.lit(0)).alias("peak_bytes"),
        F.coalesce("flowStopCount", F.lit(0)).alias("flowStopCount"),
        F.coalesce("flowStopSize", F.lit(0)).alias("flowStopSize"),
        F.coalesce("max_overshoot_count", F.lit(0)).alias("max_overshoot_count"),
        F.coalesce("max_overshoot_bytes", F.lit(0)).alias("max_overshoot_bytes"),
        F.coalesce("durations_left_out", F.lit(0)).alias("durations_left_out"),
    )


def depth_spans(levels: DataFrame) -> dict[str, tuple[float, float]]:
    """The time span of each destination's depth-carrying events, from
    :func:`destination_levels` (kept: no pass over the events)."""
    rows = levels.where(F.col("address").isNotNull() & F.col("depth_t0").isNotNull()).collect()
    return {row["address"]: (row["depth_t0"], row["depth_t1"]) for row in rows}


def depth_series(events: DataFrame, spans: dict[str, tuple[float, float]], points: int = 1200) -> list[Any]:
    """Depth over time of the destinations of ``spans`` (:func:`depth_spans`) for plotting:
    at most ``points`` buckets per destination over its span, each with the highest depth
    in it (peaks must survive the thinning)."""
    if not spans:
        return []
    # Each destination's start and bucket width as literals: one pass over the events,
    # none to find the spans.
    t0 = F.lit(None).cast("double")
    width = F.lit(None).cast("double")
    for address, (start, end) in spans.items():
        is_it = F.col("address") == F.lit(address)
        t0 = F.when(is_it, F.lit(start)).otherwise(t0)
        width = F.when(is_it, F.lit(max((end - start) / points, 1e-3))).otherwise(width)
    depths = events.where(F.col("address").isin(list(spans)) & F.col("depth").isNotNull())
    bucketed = depths.withColumn("bucket", F.floor((F.col("ts") - t0) / width).cast("long"))
    return (
        bucketed.groupBy("address", "run", "bucket")
        .agg(F.min("ts").alias("ts"), F.max("depth").alias("depth"), F.max("bytes").alias("bytes"))
        .select("address", "run", "ts", "depth", "bytes")
        .collect()
    )
