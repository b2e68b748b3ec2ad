"""``qpid-flow report``: the analytics pipeline over event logs, on Spark (PySpark).

Needs the optional extra (``pip install 'qpid-flow[analytics]'``: pyspark, pandas,
pyarrow, matplotlib) and a Java runtime. The router never imports this package.

Modules, one analysis each, every one a function from the events DataFrame to result
DataFrames, in Spark SQL functions only (no Python UDF), so the job runs unchanged on a
cluster whose executors have no qpid-flow installed:

- :mod:`.flow`: flow-control periods and per-destination statistics;
- :mod:`.messages`: each message's events in order, once, for the latency and the audit;
- :mod:`.latency`: enqueue-to-delivery and enqueue-to-settle percentiles;
- :mod:`.audit`: the message-group audit (order and overlap);
- :mod:`.advice`: stop/resume thresholds from peaks and producer windows;
- :mod:`.report`: reads the logs, runs the analyses, writes tables, plots and ``index.html``.
"""
