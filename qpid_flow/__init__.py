"""qpid-flow: an AMQP 1.0 intermediary that adds flow control and message groups.

Plugin authors need only ``hookimpl``::

    from qpid_flow import hookimpl

    @hookimpl
    def qpid_flow_message_enqueued(destination, message): ...
"""

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("qpid_flow")

__all__ = ["__version__", "hookimpl"]
