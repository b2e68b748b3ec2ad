"""The reactor, tuned for relaying: fewer Python objects and updates per message.

Proton's Python reactor wraps every engine event in a Python ``Event`` (and its context
objects), resolves its handler through link, session and connection, offers it to the
global I/O handler as well, and re-computes a connection's socket interest on every
``PN_TRANSPORT`` event, of which Proton emits one for almost every change to a delivery.
A relayed message makes about six deliveries events and six transport events: that
machinery cost more than qpid-flow's own work.

- :class:`BatchingIOHandler` notes which transports changed and updates each once per
  turn of the reactor, when no other event is left (only the state at ``select()``
  matters).
- :class:`RelayContainer` hands ``PN_DELIVERY`` straight to the handler of its
  connection and ``PN_TRANSPORT`` to the batching handler, from the raw engine event;
  every other event is dispatched the usual way.
"""

from __future__ import annotations

from typing import Any

from cproton import (
    PN_DELIVERY,
    PN_TRANSPORT,
    addressof,
    isnull,
    pn_collector_peek,
    pn_collector_pop,
    pn_delivery_link,
    pn_event_delivery,
    pn_event_transport,
    pn_event_type,
    pn_link_session,
    pn_session_connection,
)
from proton import Delivery, Event, ProtonException, Transport
from proton.handlers import IOHandler
from proton.reactor import Container

__all__ = ["BatchingIOHandler", "RelayContainer"]


class BatchingIOHandler(IOHandler):
    def __init__(self) -> None:
        super().__init__()
        self._dirty: dict[int, Any] = {}

    def on_transport(self, event: Any) -> None:
        transport = event.transport
        self._dirty[addressof(transport._impl)] = transport

    def mark_dirty(self, transport_impl: Any) -> None:
        """The same, from a raw transport pointer (wrapped once per turn at most)."""
        key = addressof(transport_impl)
        if key not in self._dirty:
            self._dirty[key] = Transport.wrap(transport_impl)

    def update(self, transport: Any, selectable: Any, now: float) -> None:
        """Proton's update, without the ``selectable_updated`` event when nothing the
        selector uses changed: that event makes the selector walk every connection."""
        reading, writing, deadline = selectable.reading, selectable.writing, selectable._deadline
        try:
            selectable.reading = transport.capacity() > 0
            selectable.writing = transport.pending() > 0
        except ProtonException:
            super().update(transport, selectable, now)  # the transport is closing: Proton's way
            return
        selectable.deadline = transport.tick(now)
        later = selectable._deadline
        if (
            selectable.reading == reading
            and selectable.writing == writing
            and (later == deadline or (deadline and (not later or later >= deadline)))
        ):
            return  # same interest, and the selector already wakes no later than needed
        selectable.update()

    def on_reactor_quiesced(self, event: Any) -> None:
        if self._dirty:
            dirty = list(self._dirty.values())
            self._dirty.clear()
            for transport in dirty:
                selectable = transport._selectable
                if selectable and not selectable.is_terminal:
                    self.update(transport, selectable, transport._reactor.now)
            # The updates posted events: let the reactor handle them, then quiesce again.
        super().on_reactor_quiesced(event)


class _DeliveryEvent:
    """What a delivery handler reads from its event: the delivery, nothing else."""

    __slots__ = ("delivery",)

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery


class RelayContainer(Container):
    """A Proton container whose two most frequent events take a short path.

    Every message relayed makes several ``PN_DELIVERY`` and ``PN_TRANSPORT`` events. The
    generic path wraps each in a Python ``Event`` (and its context objects), resolves its
    handler through link, session and connection, and offers it to the global I/O handler
    too. Here a ``PN_DELIVERY`` goes straight to the handler of its connection (the broker
    connection's handler, or the container's handler for client connections) and a
    ``PN_TRANSPORT`` only marks its transport for the batched I/O update. Every other
    event goes the generic way.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._io = BatchingIOHandler()
        super().__init__(*args, global_handler=self._io, **kwargs)
        # Connection (C pointer address) -> its handler, for connections that have their own.
        self._connection_handlers: dict[int, Any] = {}

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        connection = super().connect(*args, **kwargs)
        handler = kwargs.get("handler")
        if handler is not None:
            # A handler reconnecting replaces its old connection: keep the map small.
            for key, known in list(self._connection_handlers.items()):
                if known is handler:
                    del self._connection_handlers[key]
            self._connection_handlers[addressof(connection._impl)] = handler
        return connection

    def process(self) -> bool:
        self.mark()
        collector = self._collector._impl
        handlers = self._connection_handlers
        default: Any = self._handler
        mark_dirty = self._io.mark_dirty
        while True:
            if self._yield:  # type: ignore[has-type]
                self._yield = False
                return True
            raw = pn_collector_peek(collector)
            if isnull(raw):
                # Nothing left: Proton decides whether to wait for I/O, fire timers or stop.
                return bool(super().process())
            kind = pn_event_type(raw)
            if kind == PN_DELIVERY:
                delivery_impl = pn_event_delivery(raw)
                connection = pn_session_connection(pn_link_session(pn_delivery_link(delivery_impl)))
                handler = handlers.get(addressof(connection), default)
                handler.on_delivery(_DeliveryEvent(Delivery.wrap(delivery_impl)))
                self._previous = None
            elif kind == PN_TRANSPORT:
                mark_dirty(pn_event_transport(raw))
                self._previous = None
            else:
                # Any other event, one at a time, the way Proton dispatches it.
                event = Event.wrap(raw)
                event.dispatch(event.handler or default)
                event.dispatch(self._global_handler)
                self._previous = event.type
            pn_collector_pop(collector)
