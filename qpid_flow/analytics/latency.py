"""Latency from the event log, per destination and over time.

- **enqueue to delivery**: from a message's ``enqueue`` to its first ``deliver``;
- **enqueue to settle**: from its ``enqueue`` to its last ``settle`` (the one that ended
  it: a released message is settled again after its redelivery).

A latency that ends before its message was enqueued (the wall clock was set back
meanwhile) is none: left out of the figures, and counted (``durations_left_out``).

Both in milliseconds, as p50 / p95 / p99 (Spark's ``percentile_approx``, accuracy 10,000:
within 0.01 % of the rank), plus count, mean and max. Over time, the same in buckets of
the enqueue time, sized so that the log's span makes at most about 60 of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from qpid_flow.analytics.messages import ENQUEUE, message_moves

PERCENTILES = [0.5, 0.95, 0.99]
_NICE_BUCKETS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]


def message_latencies(events: DataFrame, moves: DataFrame | None = None) -> DataFrame:
    """One row per enqueued message: its enqueue time, both latencies (ms, null when the
    log ends before the message was delivered or settled, or when the clock went back
    between) and how many of them were left out as the clock went back. ``moves``:
    :func:`.messages.message_moves` of ``events``, when already computed."""
    if moves is None:
        moves = message_moves(events, events.where(F.lit(False)).select("run", "address"))
    enqueued = moves.where(F.col("kind") == ENQUEUE)
    went_back = [F.coalesce((F.col(end) < F.col("ts")).cast("int"), F.lit(0)) for end in ("t_deliver", "t_settle")]
    return enqueued.select(
        "address",
        F.col("ts").alias("t_enqueue"),
        _milliseconds_to("t_deliver").alias("to_deliver_ms"),
        _milliseconds_to("t_settle").alias("to_settle_ms"),
        (went_back[0] + went_back[1]).alias("durations_left_out"),
    )


def _milliseconds_to(end: str) -> Column:
    """From the enqueue (``ts``) to ``end``; none if ``end`` comes before it."""
    return F.when(F.col(end) >= F.col("ts"), (F.col(end) - F.col("ts")) * 1000.0)


def _stats(column: str) -> list:
    name = column.removesuffix("_ms")
    return [
        F.percentile_approx(column, PERCENTILES, 10000).alias(f"{name}_pct"),
        F.count(column).alias(f"{name}_count"),
        F.avg(column).alias(f"{name}_mean_ms"),
        F.max(column).alias(f"{name}_max_ms"),
    ]


def _flatten(frame: DataFrame, keys: list[str], extra: Sequence[str] = ()) -> DataFrame:
    columns = [F.col(k) for k in keys]
    for name in ("to_deliver", "to_settle"):
        columns.append(F.col(f"{name}_count"))
        for index, p in enumerate(PERCENTILES):
            columns.append(F.col(f"{name}_pct")[index].alias(f"{name}_p{round(p * 100)}_ms"))
        columns += [F.col(f"{name}_mean_ms"), F.col(f"{name}_max_ms")]
    return frame.select(*columns, *extra)


def latency_by_destination(latencies: DataFrame) -> DataFrame:
    left_out = F.sum("durations_left_out").alias("durations_left_out")
    grouped = latencies.groupBy("address").agg(*_stats("to_deliver_ms"), *_stats("to_settle_ms"), left_out)
    return _flatten(grouped, ["address"], ["durations_left_out"])


def bucket_seconds(span_seconds: float, buckets: int = 60) -> int:
    """The smallest 'nice' bucket width that cuts ``span_seconds`` into at most ``buckets``."""
    for width in _NICE_BUCKETS:
        if span_seconds / width <= buckets:
            return width
    return _NICE_BUCKETS[-1]


def latency_over_time(latencies: DataFrame, width: int) -> DataFrame:
    bucket = (F.floor(F.col("t_enqueue") / width) * width).alias("bucket_start")
    grouped = latencies.groupBy("address", bucket).agg(*_stats("to_deliver_ms"), *_stats("to_settle_ms"))
    return _flatten(grouped, ["address", "bucket_start"])
