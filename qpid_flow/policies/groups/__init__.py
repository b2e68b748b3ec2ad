"""Shared message groups (Qpid C++ broker / Broker-J SHARED_GROUPS): the queue that pins a
group to one consumer (``grouped_queue``), and the plugin that installs it (``plugin``)."""
