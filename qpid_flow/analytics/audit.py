"""The message-group audit: did shared groups hold, message by message?

On every grouped destination (one with a ``group_assigned`` event, or a ``destination``
event saying ``grouped``), from the ``deliver`` and ``settle`` events:

- **order**: a group's messages must be delivered in the order the destination took them
  in: their ``enqueue`` events' order (``n``). Not ``seq``, given as a transfer arrives: a
  transactional transfer is enqueued when its transaction commits, after messages that
  arrived later. Only first deliveries count (``delivery_count`` 1): a released message
  delivered again after later ones is allowed (seed 001) and is not a violation. A
  violation is a first delivery of a message enqueued before one already delivered in the
  same group. A message whose ``enqueue`` is not in the log (in a pruned segment, so
  enqueued before those that are) comes first, by ``seq``; so do tied ``enqueue`` times
  in old logs, which have no ``n``.
- **overlap**: at no moment may two consumers hold unsettled messages of the same group.
  Each delivery holds its message from the ``deliver`` event to the message's next
  ``settle`` (or to the end of the log); a consumer's holds are merged into periods; a
  violation is a period that starts before another consumer's period of the same group
  has ended.

Events are ordered by ``n`` (their number within a run), never by time: timestamps tie.
A healthy log has no row in either table.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from qpid_flow.analytics.messages import HOLD, message_moves

# "Held until the log ends": later than any event number.
_FOREVER = 2**62


def _earlier_in_group() -> WindowSpec:
    """Every row of the same run, destination and group that starts before this one."""
    return Window.partitionBy("run", "address", "group").orderBy("start").rowsBetween(Window.unboundedPreceding, -1)


def grouped_destinations(events: DataFrame, assigned: DataFrame | None = None) -> DataFrame:
    """``assigned``: the (run, address) of the ``group_assigned`` events, when known."""
    if assigned is None:
        assigned = events.where(F.col("event") == "group_assigned").select("run", "address")
    by_assignment = assigned.select("run", "address")
    by_policy = events.where((F.col("event") == "destination") & F.col("grouped")).select("run", "address")
    return by_assignment.union(by_policy).distinct()


def holds(events: DataFrame, grouped: DataFrame | None = None, moves: DataFrame | None = None) -> DataFrame:
    """One row per delivery on a grouped destination: who held which message, from which
    event number (``start``) to which (``end``). ``grouped``: :func:`grouped_destinations`,
    and ``moves``: :func:`.messages.message_moves` of ``events`` and ``grouped``, when
    known."""
    if moves is None:
        moves = message_moves(events, grouped if grouped is not None else grouped_destinations(events))
    settled = F.col("next_event") == "settle"
    return moves.where(F.col("kind") == HOLD).select(
        "run",
        "address",
        F.coalesce("group", F.lit("")).alias("group"),
        "seq",
        "consumer",
        "delivery_count",
        "enqueued_n",
        F.col("n").alias("start"),
        F.when(settled, F.col("next_n")).otherwise(F.lit(_FOREVER)).alias("end"),
        F.col("ts").alias("start_ts"),
        F.when(settled, F.col("next_ts")).alias("end_ts"),
    )


def by_group(held: DataFrame) -> DataFrame:
    """``held`` laid out by group (run, destination, group): every later step is a window
    or an aggregation within a group, and none of them shuffles the holds again."""
    return held.repartition("run", "address", "group")


def order_violations(held: DataFrame) -> DataFrame:
    before = _earlier_in_group()
    # A delivery without a seq names no message: it cannot be placed (nor could it before).
    firsts = held.where((F.col("delivery_count") == 1) & F.col("seq").isNotNull())
    # Enqueue order, then seq (see the module's docstring); -1: before every enqueue logged.
    place = F.struct(F.coalesce("enqueued_n", F.lit(-1)).alias("enqueued_n"), F.col("seq").alias("seq"))
    return (
        firsts.withColumn("place", place)
        .withColumn("latest", F.max("place").over(before))
        .where(F.col("place") < F.col("latest"))
        .select(
            "run",
            "address",
            "group",
            "seq",
            F.col("latest.seq").alias("delivered_before"),
            "consumer",
            F.col("start").alias("n"),
            F.col("start_ts").alias("ts"),
        )
    )


def holding_periods(held: DataFrame) -> DataFrame:
    """Each consumer's holds of a group merged into periods (gaps and islands)."""
    mine = Window.partitionBy("run", "address", "group", "consumer").orderBy("start", "end")
    earlier = mine.rowsBetween(Window.unboundedPreceding, -1)
    marked = held.withColumn("reach", F.max("end").over(earlier)).withColumn(
        "island_start", F.when(F.col("reach").isNull() | (F.col("start") > F.col("reach")), 1).otherwise(0)
    )
    numbered = marked.withColumn("island", F.sum("island_start").over(mine.rowsBetween(Window.unboundedPreceding, 0)))
    return numbered.groupBy("run", "address", "group", "consumer", "island").agg(
        F.min("start").alias("start"),
        F.max("end").alias("end"),
        F.min("start_ts").alias("start_ts"),
        F.count(F.lit(1)).alias("messages"),
    )


def overlap_violations(held: DataFrame) -> DataFrame:
    periods = holding_periods(held)
    before = _earlier_in_group()
    # The earlier period reaching furthest: if it reaches past this start, it is another
    # consumer's (one consumer's periods never overlap each other, they were merged).
    reach = F.max(F.struct(F.col("end"), F.col("consumer"))).over(before)
    return (
        periods.withColumn("reach", reach)
        .where(F.col("reach.end") > F.col("start"))
        .select(
            "run",
            "address",
            "group",
            "consumer",
            F.col("reach.consumer").alias("other_consumer"),
            F.col("start").alias("n"),
            F.col("start_ts").alias("ts"),
            F.when(F.col("reach.end") < _FOREVER, F.col("reach.end")).alias("other_settled_n"),
        )
    )


def audit_summary(held: DataFrame, order: DataFrame, overlap: DataFrame) -> DataFrame:
    audited = held.groupBy("address").agg(
        F.countDistinct("run", "group").alias("groups"),
        F.sum((F.col("delivery_count") == 1).cast("long")).alias("first_deliveries"),
        F.sum((F.col("delivery_count") > 1).cast("long")).alias("redeliveries"),
    )
    order_count = order.groupBy("address").agg(F.count(F.lit(1)).alias("order_violations"))
    overlap_count = overlap.groupBy("address").agg(F.count(F.lit(1)).alias("overlap_violations"))
    return (
        audited.join(order_count, "address", "left")
        .join(overlap_count, "address", "left")
        .select(
            "address",
            "groups",
            "first_deliveries",
            "redeliveries",
            F.coalesce("order_violations", F.lit(0)).alias("order_violations"),
            F.coalesce("overlap_violations", F.lit(0)).alias("overlap_violations"),
        )
    )
