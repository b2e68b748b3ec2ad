"""The event log's schema (docs/events.md, version 1) as a Spark schema.

Always read with an explicit schema: inference is an extra pass over every file, and a
field absent from a sample would change the columns.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

SCHEMA_VERSION = 1

_FIELDS: list[tuple[str, DataType]] = [
    ("v", LongType()),
    ("ts", DoubleType()),
    ("run", StringType()),
    ("n", LongType()),
    ("event", StringType()),
    ("address", StringType()),
    # message events
    ("seq", LongType()),
    ("id", StringType()),
    ("size", LongType()),
    ("group", StringType()),
    ("producer", LongType()),
    ("consumer", LongType()),
    ("delivery_count", LongType()),
    ("outcome", StringType()),
    ("condition", StringType()),
    ("depth", LongType()),
    ("bytes", LongType()),
    # flow and destination events
    ("producers", LongType()),
    ("flowStopCount", LongType()),
    ("flowResumeCount", LongType()),
    ("flowStopSize", LongType()),
    ("flowResumeSize", LongType()),
    ("maxCount", LongType()),
    ("maxSize", LongType()),
    ("limitPolicy", StringType()),
    ("grouped", BooleanType()),
    ("producerWindow", LongType()),
    ("window", LongType()),
    ("reason", StringType()),
]

EVENT_SCHEMA = StructType([StructField(name, kind, True) for name, kind in _FIELDS])
