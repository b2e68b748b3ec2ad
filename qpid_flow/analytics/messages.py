"""Each message's events side by side: one shuffle and one sort for the latency and the
message-group audit, which both follow a message (``run``, ``seq``) through its
``deliver`` and ``settle`` events in event order.

One window over the ``enqueue``, ``deliver`` and ``settle`` events, partitioned by
message and ordered by ``n``, gives:

- for each ``enqueue``: the message's first delivery time and the time of its final
  settlement, the last ``settle`` that ended it (the latency, :mod:`.latency`). A settle
  ``released`` ends nothing: the message goes back to its queue, whether a consumer
  released it or qpid-flow did (the consumer detached, a group lease ran out, a
  transaction rolled back, the router stopped). Nor does a ``modified`` one followed by a
  delivery (it went back; ``modified`` with undeliverable-here, which the log does not
  tell apart, ends the message and is never followed by one);
- for each ``deliver`` on a grouped destination: the next event of the same message among
  the ``deliver`` and ``settle`` events of grouped destinations, which ends the hold, and
  the number of the message's ``enqueue`` event, the order the destination took it in
  (the audit, :mod:`.audit`). The window orders by (``audited``, ``n``): those events come
  after the message's others, in event order, so that the next one is the next audited
  one, as if the others were not there.

The frame keeps only those two kinds of rows, with their columns (``kind`` says which).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

ENQUEUE = "enqueue"
HOLD = "hold"


# What each enqueue, delivery and settlement row carries through the per-message pass.
_MOVE_FIELDS = ("run", "address", "seq", "group", "consumer", "delivery_count")


def message_moves(events: DataFrame, grouped: DataFrame) -> DataFrame:
    """``grouped``: the (run, address) of the grouped destinations, distinct
    (:func:`.audit.grouped_destinations`)."""
    moves = events.where(F.col("event").isin("enqueue", "deliver", "settle"))
    marked = moves.join(
        F.broadcast(grouped.select("run", "address", F.lit(True).alias("_grouped"))), ["run", "address"], "left"
    )
    audited = F.col("event").isin("deliver", "settle") & F.col("_grouped").isNotNull()
    marked = marked.withColumn("audited", audited)
    in_order = Window.partitionBy("run", "seq").orderBy("audited", "n")
    whole = in_order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    deliver = F.col("event") == "deliver"
    is_enqueue = F.col("event") == "enqueue"
    # The message's last delivery, a column of its own: no window within an aggregate.
    marked = marked.withColumn("_last_deliver", F.max(F.when(deliver, F.col("n"))).over(whole))
    last_deliver = F.col("_last_deliver")
    # Settles that end the message (see the module's docstring). A settle without an
    # outcome (a hand-written log) counts, as every settle used to. Old logs number events
    # by time, so a settle may tie with the delivery before it: >=, not >.
    outcome = F.col("outcome")
    ends = (F.col("event") == "settle") & (
        outcome.isNull()
        | outcome.isin("accepted", "rejected")
        | ((outcome == "modified") & (last_deliver.isNull() | (F.col("n") >= last_deliver)))
    )
    windowed = marked.select(
        *_MOVE_FIELDS,
        "event",
        "audited",
        "n",
        "ts",
        F.lead("event").over(in_order).alias("next_event"),
        F.lead("n").over(in_order).alias("next_n"),
        F.lead("ts").over(in_order).alias("next_ts"),
        F.min(F.when(deliver, F.col("ts"))).over(whole).alias("t_deliver"),
        F.max_by(F.when(ends, F.col("ts")), F.when(ends, F.col("n"))).over(whole).alias("t_settle"),
        F.min(F.when(is_enqueue, F.col("n"))).over(whole).alias("enqueued_n"),
    )
    kept = windowed.where(is_enqueue | (F.col("audited") & deliver))
    # An enqueue without a run or a sequence number matches no delivery (a join would not).
    known = F.col("run").isNotNull() & F.col("seq").isNotNull()
    return kept.select(
        F.when(is_enqueue, F.lit(ENQUEUE)).otherwise(F.lit(HOLD)).alias("kind"),
        *_MOVE_FIELDS,
        "n",
        "ts",
        "next_event",
        "next_n",
        "next_ts",
        "enqueued_n",
        F.when(known, F.col("t_deliver")).alias("t_deliver"),
        F.when(known, F.col("t_settle")).alias("t_settle"),
    )
