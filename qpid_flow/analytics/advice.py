"""Threshold advice: stop and resume values that keep a destination under its maximum.

Seed 000's capacity-window arithmetic: every producer may have a window's worth of
transfers in flight when a destination crosses its stop threshold, so the destination can
receive up to ``stop + sum of the producers' windows`` messages. A stop threshold that
keeps the depth under the maximum is therefore ``max - sum(windows)`` (qpidd's worst
case, for clients that do not honour credit, such as anonymous-relay senders) and never
more than ``max - observed overshoot`` (what the log shows qpid-flow's credit let through).
Resume keeps the configured stop:resume ratio (qpidd's 80 % / 70 % defaults when none).

For bytes the same, with windows counted in the largest message seen. A destination
without a maximum gets a suggested maximum instead: the observed peak plus the windows.

The window sum is the most credit the producers attached to the destination at once could
hold: the running sum of their windows (``producer_attached`` / ``producer_detached``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

DEFAULT_RESUME_RATIO = 70 / 80


def peak_producers(events: DataFrame) -> DataFrame:
    """The most producer links attached to each destination at once, and the most credit
    their windows added up to at once (the windows may differ)."""
    changes = events.where(F.col("event").isin("producer_attached", "producer_detached") & F.col("address").isNotNull())
    attaching = F.col("event") == "producer_attached"
    so_far = Window.partitionBy("run", "address").orderBy("n").rowsBetween(Window.unboundedPreceding, 0)
    # A detach carries no window: take it from the same link's attach.
    link = Window.partitionBy("run", "address", "producer")
    window = F.max(F.when(attaching, F.col("window"))).over(link)
    signed = changes.select(
        "run",
        "address",
        "n",
        F.when(attaching, 1).otherwise(-1).alias("step"),
        (F.when(attaching, 1).otherwise(-1) * F.coalesce(window, F.lit(0))).alias("credit_step"),
        F.col("window"),
    )
    running = signed.select(
        "address",
        F.sum("step").over(so_far).alias("attached"),
        F.sum("credit_step").over(so_far).alias("window_sum"),
        "window",
    )
    return running.groupBy("address").agg(
        F.max("attached").alias("peak_producers"),
        F.max("window_sum").alias("window_count"),
        F.max("window").alias("producer_window"),
    )


def latest_policy(events: DataFrame) -> DataFrame:
    policies = events.where(F.col("event") == "destination")
    newest = Window.partitionBy("address").orderBy(F.col("ts").desc(), F.col("n").desc())
    return (
        policies.withColumn("rank", F.row_number().over(newest))
        .where(F.col("rank") == 1)
        .select(
            "address",
            F.col("maxCount").alias("max_count"),
            F.col("maxSize").alias("max_size"),
            F.col("flowStopCount").alias("stop_count"),
            F.col("flowResumeCount").alias("resume_count"),
            F.col("flowStopSize").alias("stop_size"),
            F.col("flowResumeSize").alias("resume_size"),
            F.col("limitPolicy").alias("limit_policy"),
            F.col("producerWindow").alias("policy_window"),
        )
    )


def _advise(maximum: str, observed_over: str, windows: str, stop: str, resume: str, peak: str, unit: str) -> list:
    reserve = F.greatest(F.col(windows), F.col(observed_over))
    advised_stop = F.when(F.col(maximum) > 0, F.greatest(F.col(maximum) - reserve, F.lit(1)))
    ratio = F.when((F.col(stop) > 0) & (F.col(resume) > 0), F.col(resume) / F.col(stop)).otherwise(
        F.lit(DEFAULT_RESUME_RATIO)
    )
    advised_resume = F.when(advised_stop.isNotNull(), F.floor(advised_stop * ratio).cast("long"))
    suggested_max = F.when(F.col(maximum) <= 0, F.col(peak) + F.col(windows))
    fits = F.when(F.col(maximum) > 0, F.col(maximum) - F.col(windows) >= 1)
    return [
        advised_stop.cast("long").alias(f"advised_stop_{unit}"),
        advised_resume.alias(f"advised_resume_{unit}"),
        suggested_max.cast("long").alias(f"suggested_max_{unit}"),
        fits.alias(f"max_{unit}_fits_windows"),
    ]


def threshold_advice(events: DataFrame, flow_summary: DataFrame, largest: DataFrame | None = None) -> DataFrame:
    """``largest``: each destination's ``largest_message`` enqueued, when known."""
    if largest is None:
        largest = (
            events.where(F.col("event") == "enqueue").groupBy("address").agg(F.max("size").alias("largest_message"))
        )
    largest = largest.select("address", "largest_message")
    joined = (
        flow_summary.select(
            "address", "peak_depth", "peak_bytes", "max_overshoot_count", "max_overshoot_bytes", "flowStoppedCount"
        )
        .join(latest_policy(events), "address", "left")
        .join(peak_producers(events), "address", "left")
        .join(largest, "address", "left")
    )
    filled = joined.select(
        "address",
        "flowStoppedCount",
        "peak_depth",
        "peak_bytes",
        "max_overshoot_count",
        "max_overshoot_bytes",
        *[
            F.coalesce(F.col(c), F.lit(0)).alias(c)
            for c in ("max_count", "max_size", "stop_count", "resume_count", "stop_size", "resume_size")
        ],
        F.coalesce("peak_producers", F.lit(0)).alias("peak_producers"),
        F.coalesce("producer_window", "policy_window", F.lit(0)).alias("producer_window"),
        F.coalesce("window_count", F.lit(0)).alias("window_count"),
        F.coalesce("largest_message", F.lit(0)).alias("largest_message"),
    )
    filled = filled.withColumn("window_bytes", F.col("window_count") * F.col("largest_message"))
    return filled.select(
        "*",
        *_advise(
            "max_count", "max_overshoot_count", "window_count", "stop_count", "resume_count", "peak_depth", "count"
        ),
        *_advise("max_size", "max_overshoot_bytes", "window_bytes", "stop_size", "resume_size", "peak_bytes", "bytes"),
    )
