"""Real Proton engine objects in memory, for tests of qpid-flow's handlers without sockets.

An :class:`End` is one end of an AMQP connection: a ``proton.Connection`` bound to a
``proton.Transport`` (no SASL) and collected by a ``proton.Collector``. :func:`move_bytes`
carries what one transport writes to the other (``peek``/``pop``/``push``), end of stream
included, as a socket would. :func:`dispatch` hands the events of a collector to a handler
the way :meth:`qpid_flow.amqp.reactor.RelayContainer.process` does.
"""

from __future__ import annotations

from typing import Any

from cproton import (
    PN_DELIVERY,
    PN_LINK_FLOW,
    PN_TRANSPORT,
    ffi,
    pn_collector_peek,
    pn_collector_pop,
    pn_delivery_link,
    pn_event_delivery,
    pn_event_link,
    pn_event_type,
)
from proton import Collector, Connection, Event, Transport

from qpid_flow.amqp import reclaim
from qpid_flow.amqp.endpoints import DeliveryEvent, LinkFlowEvent

__all__ = ["End", "dispatch", "move_bytes"]

_NULL = ffi.NULL


class End:
    """One end of a connection: its connection, transport, collector, and the frames it saw.

    ``frames`` holds Proton's frame trace (``FRAME: 0 -> @flow(19) [...]`` for a frame written,
    ``<-`` for one read), so a test can check what went over the wire and in which order.
    """

    def __init__(self, server: bool, collector: Collector | None = None) -> None:
        self.connection = Connection()
        self.transport = Transport(Transport.SERVER if server else Transport.CLIENT)
        self.frames: list[str] = []
        self.transport.trace(Transport.TRACE_FRM)
        self.transport.tracer = lambda _transport, message: self.frames.append(message)
        self.transport.bind(self.connection)
        self.collector = collector if collector is not None else Collector()
        self.connection.collect(self.collector)
        self.events: list[str] = []

    def take_events(self) -> int:
        """Pop the events of an end driven by hand, noting their names (``link_remote_detach``);
        returns how many there were. (An end dispatched to a handler uses :func:`dispatch`.)"""
        count = 0
        while (event := self.collector.peek()) is not None:
            self.events.append(event.type.name)
            self.collector.pop()
            count += 1
        return count

    def received(self, performative: str) -> list[str]:
        """The frames of one kind (``"flow"``, ``"detach"``...) this end read, in order."""
        return [frame for frame in self.frames if f" <- @{performative}(" in frame]


def move_bytes(source: Transport, target: Transport) -> bool:
    """Carry what ``source`` has written to ``target``; True if anything moved.

    A closed head on ``source`` (it will write nothing more) reaches ``target`` as the end
    of its input, as a socket closed by the peer would; and what ``source`` writes to a
    ``target`` that reads no more fails, so ``source`` can write no more either (as Proton's
    I/O handler closes the head of a transport whose socket write failed)."""
    pending = source.pending()
    capacity = target.capacity()
    if pending > 0 and capacity > 0:
        size = min(pending, capacity)
        target.push(source.peek(size))
        source.pop(size)
        return True
    if pending < 0 and capacity >= 0:
        target.close_tail()
        return True
    if pending > 0 and capacity < 0:
        source.close_head()
        return True
    return False


def dispatch(collector: Collector, handler: Any) -> int:
    """Hand every event of ``collector`` to ``handler`` as ``RelayContainer.process`` does:
    ``PN_DELIVERY`` as a :class:`DeliveryEvent`, ``PN_LINK_FLOW`` as a :class:`LinkFlowEvent`,
    ``PN_TRANSPORT`` to nobody (the batching I/O handler's), the rest the usual Proton way.
    Returns how many events there were."""
    impl = collector._impl
    count = 0
    reclaim.flush()  # the sessions ended last time: their end frames have been moved since
    while True:
        raw = pn_collector_peek(impl)
        if raw == _NULL:
            return count
        kind = pn_event_type(raw)
        if kind == PN_DELIVERY:
            delivery_impl = pn_event_delivery(raw)
            handler.on_delivery(DeliveryEvent(delivery_impl, pn_delivery_link(delivery_impl)))
        elif kind == PN_LINK_FLOW:
            on_link_flow = getattr(handler, "on_link_flow", None)
            if on_link_flow is not None:
                on_link_flow(LinkFlowEvent(pn_event_link(raw)))
        elif kind != PN_TRANSPORT:
            Event.wrap(raw).dispatch(handler)
            reclaim.handled(raw, kind)
        pn_collector_pop(impl)
        count += 1
