"""The operator's side: the HTTP API and dashboard (``http``), Prometheus metrics
(``metrics``), and the operations they run on the reactor thread (``operations``)."""
