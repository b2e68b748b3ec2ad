"""Producer flow control (Qpid C++ broker and ActiveMQ semantics): the thresholds and their
state (``thresholds``), and the plugin that withholds credit and settlement (``plugin``)."""
