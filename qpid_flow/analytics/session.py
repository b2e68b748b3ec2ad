"""The Spark session: tuned local mode by default, anything else when asked.

Local mode (``local[*]``) is what a report needs for days of one router's logs on a small
machine; the settings below keep a 2-core machine quiet and quick (measured: session start
5-10 s, most of it the JVM). ``--master URL`` runs the same job on a cluster; under
``spark-submit`` the session comes from spark-submit's own settings and none of these is
forced.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qpid_flow.analytics.class_archive import ClassArchive

APP_NAME = "qpid-flow-report"

# Spark and Py4J log to stderr at WARN and INFO by default: a report prints its own
# progress, and only errors from Spark are worth showing next to it, a line each: without
# their exceptions' stack traces (~85 lines for one unreadable file), which the report's
# own last line sums up (report._spark_failure).
_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark: %p %c{1}: %m%n
appender.console.layout.alwaysWriteExceptions = false
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
logger.pygw.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygw.level = error
"""


# The JIT compiler's share of a report. A report runs a few dozen distinct queries (each
# stage its own generated code), each once, over a few million rows. On 2M events and 2
# cores the compiler threads used a third of the report's CPU, mostly C2 (HotSpot's
# optimising compiler) in loop optimisation and register allocation of methods grown large
# by inlining, for code that then runs a few seconds. Shallower inlining and a later C2
# halve C2's time and take about a fifth off the report (docs/report.md, "The JIT
# compiler"). HotSpot product flags, as OpenJDK's JVM has them.
JIT_OPTIONS = (
    "-XX:MaxInlineLevel=6",  # default 15: calls inlined into calls inlined into ...
    "-XX:FreqInlineSize=100",  # default 325 bytecodes: the largest hot method inlined
    "-XX:InlineSmallCode=250",  # default 2500 bytes: the largest compiled method inlined
    "-XX:Tier4InvocationThreshold=20000",  # defaults 5000, 15000, 40000: C2 later
    "-XX:Tier4CompileThreshold=25000",
    "-XX:Tier4BackEdgeThreshold=160000",
)


def under_spark_submit() -> bool:
    """True when spark-submit started this Python driver (it hands over a gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def local_settings(scratch: Path, driver_memory: str, java_options: Sequence[str] = ()) -> dict[str, str]:
    """The settings of the local session (documented in docs/report.md); ``java_options``
    go to the JVM after ours."""
    log4j2 = scratch / "log4j2.properties"
    log4j2.write_text(_LOG4J2)
    every_java_option = " ".join(
        [
            "-XX:+UseParallelGC",  # ~8 % faster than G1 for these short batch jobs
            *JIT_OPTIONS,
            f"-Djava.io.tmpdir={scratch}",
            f"-Dlog4j2.configurationFile={log4j2}",
            *java_options,
        ]
    )
    return {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.shuffle.partitions": "4",
        # Adaptive execution re-plans at every shuffle (a job per stage, more driver work
        # between them); the report's shuffles are few and its joins of small tables are
        # broadcast anyway.
        "spark.sql.adaptive.enabled": "false",
        # The cached events: building the compressed columnar cache cost more (~1 s per 2M
        # events) than the smaller cache saves on the passes over it.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.local.dir": str(scratch),
        "spark.driver.extraJavaOptions": every_java_option,
    }


def build_session(master: str | None = None, driver_memory: str = "2g", archive: ClassArchive | None = None) -> Any:
    """A SparkSession for a report.

    - under spark-submit: spark-submit's session, as configured there;
    - ``master`` given: that master, with only the UI and logging quietened;
    - otherwise: ``local[*]`` with :func:`local_settings`.

    ``archive``: the class archive the driver's JVM maps or records (any master but
    spark-submit's, which starts the JVM itself); see :mod:`qpid_flow.analytics.class_archive`.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(APP_NAME)
    if under_spark_submit():
        spark = builder.getOrCreate()
    else:
        # The hostname may resolve to an address nothing listens on; local work stays on
        # the loopback interface. Must be set before the JVM starts.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        scratch = Path(tempfile.mkdtemp(prefix="qpid-flow-spark-"))
        # The JVM's temporary files and Spark's local folder live here: removed when this
        # Python process ends (after the JVM it started), not left in /tmp by every report.
        atexit.register(shutil.rmtree, scratch, True)
        settings = local_settings(scratch, driver_memory, archive.java_options() if archive else ())
        if master and not master.startswith("local"):
            # A cluster: its own network and memory settings apply; keep ours for logging.
            settings = {
                key: value
                for key, value in settings.items()
                if key
                in ("spark.ui.showConsoleProgress", "spark.sql.session.timeZone", "spark.driver.extraJavaOptions")
            }
        builder = builder.master(master or "local[*]")
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
