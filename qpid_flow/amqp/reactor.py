"""The reactor, tuned for relaying: fewer Python objects and updates per message.

Proton's Python reactor wraps every engine event in a Python ``Event`` (and its context
objects), resolves its handler through link, session and connection, offers it to the
global I/O handler as well, and re-computes a connection's socket interest on every
``PN_TRANSPORT`` event, of which Proton emits one for almost every change to a delivery.
A relayed message makes about six deliveries events and six transport events: that
machinery cost more than qpid-flow's own work. At low rates the cost of each turn of the
loop matters most: a message takes three or four turns of its own.

- :class:`BatchingIOHandler` notes which transports changed and updates each once per
  turn of the reactor, when no other event is left (only the state at ``select()``
  matters); it writes pending output at once rather than a turn later, and serves the
  sockets ``select()`` reports in the turn itself rather than through a posted event each.
- :class:`RelayContainer` hands ``PN_DELIVERY`` and ``PN_LINK_FLOW`` straight to the
  handler of their connection and ``PN_TRANSPORT`` to the batching handler, from the raw
  engine event; every other event is dispatched the usual way. A turn ends without a
  posted ``reactor_quiesced`` event and without returning to ``Container.run``.
- Deliveries, links and transfers are handled lean (:mod:`qpid_flow.amqp.endpoints`), and the
  sockets wait in ``epoll`` (:mod:`qpid_flow.amqp.epoll`).
- In front of a broker, a client's upstream connection is read only while the client
  takes what qpid-flow sends it (:meth:`BatchingIOHandler.pace`): a client that stops
  reading its socket leaves its backlog in the broker, as it would connected directly,
  not in qpid-flow's memory.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import structlog
from cproton import (
    PN_CONNECTION_FINAL,
    PN_CONNECTION_UNBOUND,
    PN_DELIVERY,
    PN_EOS,
    PN_LINK_FLOW,
    PN_LOCAL_CLOSED,
    PN_REMOTE_UNINIT,
    PN_TRANSPORT,
    ffi,
    pn_collector_more,
    pn_collector_peek,
    pn_collector_pop,
    pn_connection_state,
    pn_connection_transport,
    pn_delivery_link,
    pn_event_connection,
    pn_event_delivery,
    pn_event_link,
    pn_event_transport,
    pn_event_type,
    pn_link_session,
    pn_session_connection,
    pn_session_head,
    pn_session_next,
    pn_session_outgoing_bytes,
    pn_transport_capacity,
    pn_transport_connection,
    pn_transport_get_idle_timeout,
    pn_transport_pending,
    pn_transport_pop,
    pn_transport_tick,
)
from proton import Condition, Connection, Endpoint, Event, Transport
from proton._selectable import Selectable
from proton.handlers import IOHandler
from proton.reactor import Container

from qpid_flow.amqp import reclaim
from qpid_flow.amqp.endpoints import DeliveryEvent, LinkFlowEvent, kept
from qpid_flow.amqp.epoll import EpollSelector

__all__ = [
    "BatchingIOHandler",
    "RelayContainer",
]

log = logging.getLogger(__name__)
events = structlog.get_logger(__name__)

FRAMING_ERROR = "amqp:connection:framing-error"


_QUIESCED = Event.REACTOR_QUIESCED.number
_NULL = ffi.NULL  # compared in C; cproton.isnull is a Python function, called per event

# A client's backlog: bytes qpid-flow has for it that its socket has not taken yet (in its
# transport and its sessions). Above the high mark its upstream connection is no longer
# read, until the backlog is back under the low mark: the broker's further frames wait in
# the broker (its socket's buffers, then its queue), as they would for a client connected
# directly that reads slowly. The marks leave a client that reads at all a full socket's
# worth of room, so that pacing never throttles one that keeps up.
BACKLOG_HIGH = 1 << 20
BACKLOG_LOW = 256 << 10
# A paused upstream connection is still read once in every half of its idle timeout: Proton
# drops a peer it hears nothing from for that long, and the broker is alive (its frames wait
# unread). One read a period keeps it; the client's own silence is judged on its own side.


class Unwritten:
    """Bytes of messages handed to a paced client's links that its socket has not taken.

    Proton frames a delivery as soon as it is sent, into an output buffer of the
    transport's that ``pn_transport_pending`` does not report past one frame: with the
    measure below alone, a stalled client was handed all 40 messages of 4 MiB it had
    credit for (518 MB resident), its upstream never paused. The router adds what it hands
    over; each write to the client's socket takes off what it wrote (frame headers and
    other frames included, so the count errs low by a few bytes a frame).

    ``stuck``: bytes of deliveries whose link went before they were framed (taken off
    ``bytes`` too). Proton never frames them and never takes them out of its session's
    outgoing bytes: one detached link with 1.2 MB unsent kept a client's every other link
    waiting for good."""

    __slots__ = ("bytes", "stuck")

    def __init__(self) -> None:
        self.bytes = 0
        self.stuck = 0


_OPEN = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE  # pn_session_head: open both ways, exactly


def client_backlog(connection: Any) -> int:
    """The bytes waiting for ``connection``'s socket (a C pointer): its transport's output
    and what its open sessions hold that the transport has not framed yet (Proton frames
    no more than the peer's largest frame at a time). An ended session's are never
    written."""
    transport = pn_connection_transport(connection)
    if transport == _NULL:
        return 0
    backlog = max(pn_transport_pending(transport), 0)
    session = pn_session_head(connection, _OPEN)
    while session != _NULL:
        backlog += pn_session_outgoing_bytes(session)
        session = pn_session_next(session, _OPEN)
    return backlog


def _only_quiesced_left(collector: Any) -> bool:
    """Proton's ``reactor.quiesced`` without wrapping the head event in Python objects."""
    head = pn_collector_peek(collector)
    if head == _NULL:
        return True
    return not pn_collector_more(collector) and pn_event_type(head) == _QUIESCED


class _SelectableEvent:
    """What Proton's I/O error handler reads from its event: the selectable."""

    __slots__ = ("selectable",)

    def __init__(self, selectable: Selectable) -> None:
        self.selectable = selectable


class BatchingIOHandler(IOHandler):
    def __init__(self) -> None:
        super().__init__()
        self._selector: EpollSelector = EpollSelector()
        # Keyed by the C pointer itself: cffi pointers hash and compare by address, and
        # that is cheaper than converting them to ints.
        self._dirty: dict[Any, Any] = {}
        # Transport wrappers that connections' selectables hold, by C pointer. Weak: an
        # entry goes when its selectable lets go (the transport closed).
        self._transports: weakref.WeakValueDictionary[Any, Transport] = weakref.WeakValueDictionary()
        # Broker mode: upstream connection -> its client, and back (C pointers), and the
        # upstream connections not read now because their client's backlog is too large,
        # with when they were last read.
        self._client_of: dict[Any, Any] = {}
        self._upstream_of: dict[Any, Any] = {}
        self._paused: dict[Any, float] = {}
        self._unwritten: dict[Any, Unwritten] = {}  # client connection -> its count

    def on_connection_bound(self, event: Event) -> None:
        """Proton's own: resolve the peer's name and connect. A name that does not resolve
        (a DNS outage, a mistyped standby broker) or a socket refused at once raised out of
        the reactor and ended the process; it is a failed connection like a refused one:
        the transport closes with the error, and its owner (qpid-flow's own connection to
        the broker) tries the next broker or backs off."""
        try:
            super().on_connection_bound(event)
        except OSError as exc:
            url = event.connection.url
            address = f"{url.host}:{url.port}" if url is not None else "?"
            transport = event.transport  # its owner logs the error (upstream_error)
            transport.condition = Condition("proton:io", f"cannot connect to {address}: {exc}")
            transport.close_tail()
            transport.close_head()

    def pace(self, client: Any, upstream: Any) -> Unwritten:
        """Read the ``upstream`` connection (C pointer) only while ``client``'s backlog
        allows (see ``BACKLOG_HIGH``), for as long as both are bound. The count returned
        is the client's, for the router to add what it hands to the client's links."""
        self._client_of[upstream] = client
        self._upstream_of[client] = upstream
        unwritten = self._unwritten[client] = Unwritten()
        return unwritten

    def _backlog(self, client: Any) -> int:
        unwritten = self._unwritten.get(client)
        backlog = client_backlog(client)
        if unwritten is None:
            return backlog
        if unwritten.stuck:
            # Never more stuck than there is: a session freed took its bytes along.
            unwritten.stuck = min(unwritten.stuck, backlog)
            backlog -= unwritten.stuck
        return backlog if unwritten.bytes < backlog else unwritten.bytes

    def forget(self, connection: Any) -> None:
        """``connection`` (C pointer) is unbound or freed: its pacing ends (its pointer may
        be given to a later connection), and an upstream paused for it is read again."""
        client = self._client_of.pop(connection, None)
        if client is not None:
            self._upstream_of.pop(client, None)
            self._paused.pop(connection, None)
        upstream = self._upstream_of.pop(connection, None)
        if upstream is not None:
            self._unwritten.pop(connection, None)
            self._client_of.pop(upstream, None)
            self._resume(upstream)

    def _resume(self, upstream: Any) -> None:
        if self._paused.pop(upstream, None) is not None:
            transport = pn_connection_transport(upstream)
            if transport != _NULL:
                self.mark_dirty(transport)  # its next update reads it again

    def _reads_upstream(self, upstream: Any, client: Any, transport: Any, now: float) -> bool:
        backlog = self._backlog(client)
        paused = self._paused
        since = paused.get(upstream)
        if since is None:
            if backlog > BACKLOG_HIGH:
                paused[upstream] = now
                return False
            return True
        if backlog <= BACKLOG_LOW:
            del paused[upstream]
            return True
        idle = pn_transport_get_idle_timeout(transport)  # ms; 0: none
        if idle and now - since >= idle / 2000:
            paused[upstream] = now  # one read now (see BACKLOG_LOW), then paused again
            return True
        return False

    def on_transport(self, event: Any) -> None:
        transport = event.transport
        self._dirty[transport._impl] = transport

    def on_transport_closed(self, event: Any) -> None:
        """Proton's, for a transport it still knows: a second close event for one already
        unbound (a close asked for while its first close event waited in the queue) has
        lost the selectable Proton's handler reads, and its AttributeError ended the
        process (found by the fuzzer with the open deadline)."""
        transport = event.transport
        if transport is None:
            return
        if kept(transport, "_selectable") is None or kept(transport, "_reactor") is None:
            if transport.connection is not None:
                transport.unbind()
            return
        super().on_transport_closed(event)

    def mark_dirty(self, transport_impl: Any) -> None:
        """The same, from a raw transport pointer."""
        if transport_impl in self._dirty:
            return
        transport = self._transports.get(transport_impl)
        if transport is None:
            transport = Transport.wrap(transport_impl)
            selectable = kept(transport, "_selectable")
            if selectable is not None and selectable._transport is not None:
                # Reuse the wrapper the connection's selectable holds, for as long as it
                # holds it, rather than wrapping the transport again every turn.
                transport = selectable._transport
                self._transports[transport_impl] = transport
        self._dirty[transport_impl] = transport

    def update(self, transport: Any, selectable: Any, now: float) -> None:
        """Proton's update, telling the selector directly, and only when what it uses changed.

        Proton posts a ``selectable_updated`` event for every update, which costs a trip
        through the generic dispatch and a walk of every connection's deadline. The
        transport is asked through Proton's C functions directly: its Python methods add
        two calls each, and this runs for every transport that changed, every turn."""
        if transport is None:
            # An expiry posted before its transport closed (a deadline passed in the same
            # wait as the socket's end): the selectable is ending, nothing to update. This
            # ended the process with an AttributeError.
            return
        impl = transport._impl
        capacity = pn_transport_capacity(impl)
        pending = pn_transport_pending(impl)
        if capacity < PN_EOS or pending < PN_EOS:
            IOHandler.update(transport, selectable, now)  # an error: the transport is closing
            return
        if capacity == PN_EOS and pending == 0:
            # Proton reads no more and has nothing left to send. After a close that is the
            # end (the handlers of this turn already answered it); after input Proton could
            # not decode (a frame body that is a lone descriptor byte, found by fuzzing) or
            # could not dispatch (see _refuse_undispatched) it stops reading without an
            # error, and nothing would ever end the connection: its socket would stay
            # half-closed for good. End it here, with a close frame first if none went.
            if self._refuse_undispatched(transport):
                self._dirty[impl] = transport  # write_changed goes round again: the close goes out
                return
            transport.close_head()
            IOHandler.update(transport, selectable, now)
            return
        reading = capacity > 0
        writing = pending > 0
        since = None
        if self._client_of:
            connection = pn_transport_connection(impl)
            client = self._client_of.get(connection)
            if client is not None:
                reading = reading and self._reads_upstream(connection, client, impl, now)
                since = self._paused.get(connection)
            else:
                upstream = self._upstream_of.get(connection)
                if upstream in self._paused and self._backlog(connection) <= BACKLOG_LOW:
                    self._resume(upstream)
        tick = pn_transport_tick(impl, int(now * 1000))
        later = tick / 1000 if tick else 0
        if since is not None and (idle := pn_transport_get_idle_timeout(impl)):
            # Paused: wake for its keep-alive read (see _reads_upstream) before Proton's
            # idle check would find the broker silent.
            wake = since + idle / 2000
            later = wake if not later or wake < later else later
        earlier = selectable._deadline
        same_interest = selectable.reading == reading and selectable.writing == writing
        if same_interest and (later == earlier or (earlier and (not later or later >= earlier))):
            selectable._deadline = later
            return  # same interest, and the selector already wakes no later than needed
        selectable.reading = reading
        selectable.writing = writing
        selectable._deadline = later
        self._selector.interest(selectable)
        # The selector's deadline is already no later than every other connection's.
        self._selector.lower_deadline(later)

    @staticmethod
    def _refuse_undispatched(transport: Any) -> bool:
        """Proton stopped reading a connection it has not closed, without an error of its
        own: input it could not decode or dispatch (a performative of unknown descriptor,
        0x99; a SASL frame after the open). It was dropped without a word (a bare TCP
        close, logged as an ordinary ``connection_closed``); it is closed with
        ``amqp:connection:framing-error`` now (open first if qpid-flow had not: a close
        needs an open before it), as a broker closes it, and logged ``connection_error``.
        True if it was: its close frame is to go out before the end. Not when qpid-flow
        closed it already: that is the end (the next update ends it); nor before the
        client's open, which Proton holds any close back for; nor on qpid-flow's own
        connections to the broker, whose end is handled as the broker's loss (the end goes
        as it went, for these)."""
        impl = pn_transport_connection(transport._impl)
        if impl == _NULL or pn_connection_state(impl) & (PN_LOCAL_CLOSED | PN_REMOTE_UNINIT):
            return False
        connection = Connection.wrap(impl)
        if kept(connection, "qf_remote") is None:
            return False  # not a client's (the gate hands each client over with its address)
        description = "a frame qpid-flow cannot read or dispatch (an unknown performative, a SASL frame after the open)"
        events.warning(
            "connection_error",
            connection=kept(connection, "qf_id"),
            remote=kept(connection, "qf_remote"),
            condition=FRAMING_ERROR,
            description=description,
        )
        if connection.state & Endpoint.LOCAL_UNINIT:
            connection.open()
        connection.condition = Condition(FRAMING_ERROR, description)
        connection.close()
        return True

    def _flush(self, transport: Any, selectable: Any) -> None:
        """Write what the transport has to send now, instead of waiting a turn for
        ``select()`` to say the socket is writable: it almost always is, and a turn of the
        reactor costs more than the write."""
        impl = transport._impl
        pending = pn_transport_pending(impl)
        if pending <= 0:
            if pending == 0 and (unwritten := self._unwritten_of(impl)) is not None:
                # Nothing framed is left to write: what was handed over and never framed
                # (a link detached before it went) must not keep the upstream paused.
                unwritten.bytes = 0
            return  # nothing, or closing: the update that follows handles it
        try:
            sent = selectable._delegate.send(transport.peek(pending))
        except BlockingIOError:
            return  # the socket buffer is full: select() will say when it drains
        except OSError as error:
            log.error("Couldn't send: %r", error)
            transport.close_head()
            return
        pn_transport_pop(impl, sent)
        if (unwritten := self._unwritten_of(impl)) is not None:
            unwritten.bytes = unwritten.bytes - sent if unwritten.bytes > sent else 0

    def _unwritten_of(self, transport: Any) -> Unwritten | None:
        """A paced client's count, from its transport (C pointer); None for any other."""
        return self._unwritten.get(pn_transport_connection(transport)) if self._unwritten else None

    def _read(self, transport: Any, selectable: Any) -> None:
        capacity = pn_transport_capacity(transport._impl)
        if capacity <= 0:
            return
        try:
            data = selectable._delegate.recv(capacity)
        except BlockingIOError:
            return
        except OSError as error:
            log.error("Couldn't recv: %r", error)
            transport.close_tail()
            return
        if data:
            transport.push(data)
        else:  # end of stream
            self.on_selectable_error(_SelectableEvent(selectable))

    def on_reactor_quiesced(self, event: Any) -> None:
        # Only reached through Proton's generic loop; RelayContainer.process ends its turns
        # without posting this event (see there).
        reactor = event.reactor
        self.write_changed(reactor)
        if _only_quiesced_left(reactor._collector._impl):
            self.wait_and_serve(reactor)
        reactor.yield_()

    def write_changed(self, reactor: Any) -> None:
        """Write what every transport changed this turn has to send, and update what the
        selector waits for on it."""
        dirty = self._dirty
        now = reactor.now
        # Again while an update marked another transport (a client's drained backlog
        # resumes its upstream's reading).
        while dirty:
            transports = list(dirty.values())
            dirty.clear()
            for transport in transports:
                selectable = kept(transport, "_selectable")
                if selectable and not selectable.is_terminal:
                    self._flush(transport, selectable)
                    self.update(transport, selectable, now)

    def wait_and_serve(self, reactor: Any) -> None:
        """Wait for I/O or the next deadline, then serve what is ready.

        Connections' sockets are read and written here rather than through one posted
        event each; any other selectable (acceptor, connector, timer) keeps its own
        handling."""
        _ = reactor.timer_deadline  # drops cancelled timers, as Proton's handler does
        readable, writable, expired = self._selector.select(reactor.timeout)
        reactor.mark()
        dirty = self._dirty
        for selectable in readable:
            transport = selectable._transport
            if transport is not None and type(selectable) is Selectable:
                self._read(transport, selectable)
                dirty[transport._impl] = transport
            else:
                selectable.readable()
        for selectable in writable:
            transport = selectable._transport
            if transport is not None and type(selectable) is Selectable:
                self._flush(transport, selectable)
                dirty[transport._impl] = transport
            else:
                selectable.writable()
        for selectable in expired:
            selectable.expired()


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
        # Connection (C pointer) -> its handler, for connections that have their own.
        # An entry goes when its connection is unbound or finalized: C memory is reused, and a stale
        # entry would hand a later connection at the same address (a client's) to the
        # handler of a dead one (qpid-flow's own broker reader, retrying while the broker
        # is down): that client's transfers were settled unseen and its producer stalled.
        # Dropping it at unbind is safe because qpid-flow connects with reconnect=False:
        # a reconnect is a new connection, registered anew by connect().
        self._connection_handlers: dict[Any, Any] = {}

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        connection = super().connect(*args, **kwargs)
        handler = kwargs.get("handler")
        if handler is not None:
            # A handler reconnecting replaces its old connection: keep the map small.
            for key, known in list(self._connection_handlers.items()):
                if known is handler:
                    del self._connection_handlers[key]
            self._connection_handlers[connection._impl] = handler
        return connection

    def pace(self, client: Any, upstream: Any) -> Unwritten:
        """Read ``upstream`` only while ``client`` takes what it is sent (Proton
        connections; see :meth:`BatchingIOHandler.pace`)."""
        return self._io.pace(client._impl, upstream._impl)

    def process(self) -> bool:
        """Run turns until a handler asks to yield or the container stops.

        A turn: handle every event; write what changed (which may post events: handle
        them too); then wait for I/O or a timer and serve it. Proton's own loop ends each
        turn by posting ``REACTOR_QUIESCED``, dispatching it, and returning to ``run()``,
        which costs more than a quiet turn's work; here the turn goes straight on."""
        self.mark()
        collector = self._collector._impl
        handlers = self._connection_handlers
        default: Any = self._handler
        io = self._io
        mark_dirty = io.mark_dirty
        while True:
            if self._yield:  # type: ignore[has-type]
                self._yield = False
                return True
            raw = pn_collector_peek(collector)
            if raw == _NULL:
                if self._stop or not (self._timers > 0 or self._selectables > 1):
                    # Stopping, or nothing left to wait for: Proton ends it its way.
                    return bool(super().process())
                io.write_changed(self)
                reclaim.flush()  # after the writing: see reclaim.flush
                if pn_collector_peek(collector) == _NULL:
                    io.wait_and_serve(self)
                continue
            kind = pn_event_type(raw)
            if kind == PN_DELIVERY:
                delivery_impl = pn_event_delivery(raw)
                link_impl = pn_delivery_link(delivery_impl)
                handler = handlers.get(pn_session_connection(pn_link_session(link_impl)), default)
                handler.on_delivery(DeliveryEvent(delivery_impl, link_impl))
            elif kind == PN_TRANSPORT:
                mark_dirty(pn_event_transport(raw))
            elif kind == PN_LINK_FLOW:
                # Credit changed: about one per message relayed. Only the link's
                # connection handler acts on it (the I/O handler does not).
                link_impl = pn_event_link(raw)
                handler = handlers.get(pn_session_connection(pn_link_session(link_impl)), default)
                on_link_flow = getattr(handler, "on_link_flow", None)
                if on_link_flow is not None:
                    on_link_flow(LinkFlowEvent(link_impl))
            else:
                # Any other event, one at a time, the way Proton dispatches it.
                event = Event.wrap(raw)
                event.dispatch(event.handler or default)
                event.dispatch(self._global_handler)
                self._previous = event.type
                reclaim.handled(raw, kind)  # links and sessions ended both ways are freed
                if kind in (PN_CONNECTION_UNBOUND, PN_CONNECTION_FINAL):
                    # Its transport is gone (no delivery can come any more), or the
                    # connection itself. Before the pop: until then the event keeps the C
                    # connection alive, so its address cannot have been given to another.
                    connection = pn_event_connection(raw)
                    handlers.pop(connection, None)
                    io.forget(connection)
            pn_collector_pop(collector)
