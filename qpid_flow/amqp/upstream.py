"""In front of a broker: qpid-flow's own connections, which read grouped destinations.

Clients' links are mirrored to the broker each on the client's own connection
(:mod:`qpid_flow.amqp.linkroute`); a destination with ``shared_groups`` is the exception,
because only one reader can pin groups. One upstream receiver per such destination
feeds its local consumers with a bounded look-ahead of credit; its messages stay
unsettled at the broker until a local consumer settles them, and the consumer's outcome
is what the broker is told.

Each grouped destination is read on a connection of its own, opened when its first
consumer comes and closed when its last one goes: RabbitMQ closes a whole connection for
the fault of one of its links (deleting a queue that a receiver reads), and a connection
shared by every grouped destination let one queue's trouble detach the consumers of all
the others. One more connection, opened at start and carrying no link, tells whether
the broker is reachable (``/readyz``) and which broker it is (its dialect).

Reconnect behaviour, chosen on purpose: the messages fetched for consumers are
forgotten when the connection drops, since the broker delivers them again; consumers
that held some of them unsettled are detached (``amqp:link:detach-forced``: their
outcomes can no longer reach the broker, and their groups go to whoever gets the
messages again), the others keep their links. The brokers of the list are tried in order, backing off from 0.1 s to
``reconnect_max_delay`` once all have been tried. The back-off starts again from 0.1 s, at
the first broker, only after losing a connection that proved itself by staying open
``reconnect_max_delay``; one that ends sooner (a broker at its connection limit answers the
open and closes at once) is a failed attempt at its broker, and the back-off goes on.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import structlog
from cproton import PN_RELEASED, pn_link_credit
from proton import Condition, Endpoint, Handler, Link, Session, SSLDomain, Terminus

from qpid_flow import codec
from qpid_flow.amqp.endpoints import DeliveryEvent, LeanDelivery, keep_link, kept, take_transfer
from qpid_flow.amqp.guard import contain_errors
from qpid_flow.amqp.outcomes import apply_settlement
from qpid_flow.amqp.timers import Call
from qpid_flow.core.destination import EXPIRED
from qpid_flow.core.dialect import PLAIN, Dialect, dialect_for
from qpid_flow.core.model import Message, Outcome, Settlement

if TYPE_CHECKING:
    from proton import Connection, Event
    from proton.reactor import Container

    from qpid_flow.config import RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.registry import Destinations

__all__ = ["GroupReader"]

log = structlog.get_logger(__name__)

_ACCEPTED = Settlement.accepted()
_RELEASED = Settlement.released()
_REJECTED = Settlement(Outcome.REJECTED)

# Connections are numbered across all of the reader's connections: a message remembers the
# connection it came on (``upstream_epoch``; 0 for one that did not come from the reader).
_connection_numbers = itertools.count(1)

# How long a grouped destination's connection stays open once its last consumer has gone:
# a client that opens a consumer per request would otherwise make the broker set up and
# tear down a connection (TCP, SASL, open) each time.
IDLE_READER_LINGER = 10.0


class _Receiver:
    """The shared upstream receiver of one source address."""

    __slots__ = ("closing", "destination", "durability", "link")

    def __init__(self, destination: Destination, durability: int) -> None:
        self.destination = destination
        self.durability = durability  # the source's, as the destination's consumers ask
        self.link: Link | None = None
        self.closing = False  # detached: nothing it still receives is wanted


@contain_errors
class _ReaderConnection(Handler):
    """One connection of the reader to the broker, with its reconnect back-off: it reads
    one grouped destination (the reachability probe, none)."""

    def __init__(
        self,
        container: Container,
        config: RouterConfig,
        destinations: Destinations,
        on_link_failed: Callable[[str, bool, Condition | None], None],
        on_holders_lost: Callable[[str, set[int]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reads: str | None = None,
    ) -> None:
        super().__init__()
        self.reads = reads  # the grouped destination it reads, for the logs (None: the probe)
        self._brokers = config.broker_addresses
        # How the broker reads addresses and outcomes: known once it answers the open (its
        # product), at once when configured.
        self._dialect_setting = config.broker_dialect
        self.dialect: Dialect | None = dialect_for(config.broker_dialect) if config.broker_dialect != "auto" else None
        self._ssl_domain = _ssl_domain(config) if any(b.scheme == "amqps" for b in self._brokers) else None
        assert self._brokers, "GroupReader needs a broker"
        self._broker_index = 0  # which broker of the list: tried in order, from the first
        self._container = container
        self._lookahead = config.consumer_lookahead
        self._max_delay = config.reconnect_max_delay
        # A broker that takes the TCP connection and never answers (or freezes later) must
        # not hold the reader, and grouped destinations, for good: the open has this long,
        # and a silent broker is dropped after the idle timeout qpid-flow asks for.
        self._open_deadline = config.sasl_timeout
        self._heartbeat = config.idle_timeout
        self._destinations = destinations
        # (address, is_sender, condition): the broker refused or closed one of our links.
        self._on_link_failed = on_link_failed
        # (address, consumer ids): the connection went while those consumers held messages
        # it fetched, unsettled (they must not go on as if they could still settle them).
        self._on_holders_lost = on_holders_lost
        # Called when this connection, once open, was lost and the next attempt to connect
        # failed too (set on the probe only): the broker is gone, as far as qpid-flow can
        # tell. Not at the loss itself: a blip, or the broker closing that one connection,
        # with the broker and its queues still there, is no reason to forget its depths.
        self.on_lost: Callable[[], None] | None = None
        self.opened_once = False
        self._loss_unconfirmed = False
        self._connection: Connection | None = None
        self.connected = False
        self.closing = False
        self.epoch = 0  # which connection (numbered across the reader's); deliveries of an older one are dead
        self.idle_turn = 0  # how many times its last consumer left (see GroupReader.consumer_detached)
        self._delay = 0.0
        self._clock = clock
        self._connected_at = 0.0  # when the open of the current connection came (clock)
        self._receivers: dict[str, _Receiver] = {}
        self._tags = itertools.count(1)

    # --- connection -----------------------------------------------------------------------

    def start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        self.epoch = next(_connection_numbers)
        broker = self._brokers[self._broker_index]
        log.info("upstream_connecting", broker=broker.redacted, reads=self.reads, attempt_delay=self._delay)
        # The URL's path is the virtual host, sent as RabbitMQ expects it: "vhost:NAME".
        virtual_host = f"vhost:{broker.vhost}" if broker.vhost else None
        self._connection = self._container.connect(
            broker.url,
            handler=self,
            reconnect=False,
            virtual_host=virtual_host,
            ssl_domain=self._ssl_domain if broker.scheme == "amqps" else None,
            heartbeat=self._heartbeat or None,
            # With a user in the URL, sign in as that user: left to choose, Proton takes
            # ANONYMOUS when the broker offers it (RabbitMQ does) and the URL's user and
            # password are never checked, nor its rights used.
            allowed_mechs="PLAIN" if broker.user is not None else None,
        )
        if self._open_deadline:
            self._container.schedule(self._open_deadline, Call(functools.partial(self.open_overdue, self.epoch)))

    def open_overdue(self, epoch: int) -> None:
        """The open of connection ``epoch`` did not come in time: drop it, try the next broker."""
        connection = self._connection
        if epoch != self.epoch or self.connected or connection is None or self.closing:
            return
        log.warning(
            "upstream_open_timeout", broker=self._brokers[self._broker_index].redacted, seconds=self._open_deadline
        )
        transport = connection.transport
        if transport is not None and not transport.closed:
            transport.close_head()
            transport.close_tail()  # the transport closes: _lost moves on to the next broker

    def on_connection_remote_open(self, event: Event) -> None:
        if event.connection != self._connection:
            return
        self.connected = True
        self.opened_once = True
        self._loss_unconfirmed = False  # the broker answered again: it was not gone
        product = (event.connection.remote_properties or {}).get("product")
        self.dialect = dialect_for(self._dialect_setting, product if isinstance(product, str) else None)
        # The back-off is not reset here: a broker at its connection limit answers the
        # open and closes at once (see _proved_itself).
        self._connected_at = self._clock()
        log.info(
            "upstream_connected", broker=self._brokers[self._broker_index].redacted, reads=self.reads, epoch=self.epoch
        )
        for receiver in self._receivers.values():
            self._open_receiver(receiver)

    def on_connection_remote_close(self, event: Event) -> None:
        if event.connection == self._connection:
            if event.connection.state & Endpoint.LOCAL_CLOSED:
                self._lost()  # the broker answered qpid-flow's own close (shutdown)
                return
            condition = event.connection.remote_condition
            log.warning(
                "upstream_closed_by_broker",
                reads=self.reads,
                condition=condition.name if condition else None,
                description=condition.description if condition else None,
            )
            event.connection.close()
            self._lost()

    def on_transport_error(self, event: Event) -> None:
        if event.connection == self._connection:
            condition = event.transport.condition
            log.warning(
                "upstream_error",
                reads=self.reads,
                condition=condition.name if condition else None,
                description=condition.description if condition else None,
            )

    def on_transport_closed(self, event: Event) -> None:
        if event.connection == self._connection:
            self._lost()

    def _lost(self) -> None:
        """The broker connection is gone: forget what we fetched (the broker has it)."""
        was_connected = self.connected
        proved_itself = was_connected and self._proved_itself()
        self.connected = False
        self._connection = None
        old_epoch = self.epoch
        for receiver in list(self._receivers.values()):  # a detach below may remove one
            receiver.link = None
            destination = receiver.destination
            destination.upstream_credit = 0
            holders = {
                consumer.id
                for consumer in destination.consumers
                if any(m.upstream_epoch == old_epoch for m in consumer.held.values())
            }
            dropped = destination.forget(lambda m: m.upstream_epoch == old_epoch)
            if dropped:
                log.info("upstream_messages_forgotten", address=destination.address, count=dropped)
            if holders and self._on_holders_lost is not None and not self.closing:
                # Forgotten first: the detaches must not put those messages back in the
                # queue, since the broker delivers them again.
                self._on_holders_lost(destination.address, holders)
        if self.closing:
            return
        if was_connected:
            log.warning("upstream_disconnected", broker=self._brokers[self._broker_index].redacted, reads=self.reads)
            self._loss_unconfirmed = self.on_lost is not None
        elif self._loss_unconfirmed:
            self._loss_unconfirmed = False  # lost, and connecting again failed: gone
            assert self.on_lost is not None
            self.on_lost()
        self._schedule_reconnect(proved_itself)

    def _proved_itself(self) -> bool:
        """Whether the connection now lost stayed open long enough to count as working.

        Not merely opened: a broker at its connection limit answers the open and closes
        at once, and a back-off reset by that retried it about ten times a second. Nor
        "a receiver attached": a broker that takes the attach and then drops the
        connection would be retried as fast. Staying open ``reconnect_max_delay`` bounds
        the reconnect rate whatever the broker does.
        """
        return self._clock() - self._connected_at >= self._max_delay

    def _schedule_reconnect(self, proved_itself: bool) -> None:
        """Connect again: at once to the next broker of the list, or, once the whole list
        has been tried, to the first after the back-off (doubled each round)."""
        if proved_itself:
            self._broker_index = 0  # the first of the list again, then the others
            self._delay = 0.0
        else:
            # Never opened, or closed too soon: a failed attempt at this broker.
            self._broker_index = (self._broker_index + 1) % len(self._brokers)
        # Back off once the whole list has been tried.
        if self._broker_index == 0:
            self._delay = min(self._max_delay, max(0.1, self._delay * 2))
        self._container.schedule(self._delay if self._broker_index == 0 else 0.0, self)

    def on_timer_task(self, event: Event) -> None:
        if not self.closing and self._connection is None:
            self._connect()

    # --- consumers of grouped destinations ------------------------------------------------

    def consumer_attached(self, destination: Destination, durability: int = Terminus.NONDURABLE) -> None:
        """A consumer of ``destination`` came: read it, with a source of ``durability``
        (the consumers' own: RabbitMQ refuses a source whose durability differs from the
        queue's)."""
        if destination.address not in self._receivers:
            receiver = self._receivers[destination.address] = _Receiver(destination, durability)
            self._open_receiver(receiver)

    def _open_receiver(self, receiver: _Receiver) -> None:
        if not self.connected or self._connection is None:
            return
        # A session of its own: RabbitMQ keeps what it sent on a receiver detached with
        # credit outstanding out of every other consumer's sight until the session (its
        # AMQP 0-9-1 channel) ends; and it ends the session of a receiver that drains.
        session = self._connection.session()
        session.open()
        link = session.receiver(f"qpid-flow-reader-{receiver.destination.address}-{next(self._tags)}")
        # The source only, as a client's receiver has it: RabbitMQ declares the node a
        # target names, non-durable, which fails on a durable queue and ends the session.
        link.source.address = (self.dialect or PLAIN).existing_queue(receiver.destination.address)
        link.source.durability = receiver.durability
        link.open()
        link.qf_receiver = receiver
        keep_link(link)
        receiver.link = link
        self._top_up(receiver)

    @property
    def idle(self) -> bool:
        """Reads for no one: no consumer of its destination is left (what it fetched may
        wait for the next, see consumer_detached), or the broker closed its receiver."""
        return not any(receiver.destination.consumers for receiver in self._receivers.values())

    def consumer_detached(self, destination: Destination) -> None:
        if destination.consumers:
            return
        receiver = self._receivers.get(destination.address)
        if receiver is None:
            return
        if destination.dispatched_by_plugin:
            # The last consumer left a destination that still has groups: what was fetched
            # waits for the next consumer while the connection lingers (GroupReader gives
            # it back if none comes). Given back now, each message would lose what happened
            # to it here: a modified outcome's annotations and delivery count, and, for one
            # fetched ahead and never delivered, first-acquirer (the broker redelivers it).
            return
        # Groups turned off: consumers read the broker's queue directly now, so what was
        # fetched goes back at once, and the receiver detaches.
        del self._receivers[destination.address]
        destination.upstream_credit = 0
        self._give_back_fetched(destination)
        link = receiver.link
        if link is not None and link.state & Endpoint.LOCAL_ACTIVE:
            receiver.closing = True  # what still arrives goes back at once
            link.close()
            link.session.close()  # see _open_receiver

    def _give_back_fetched(self, destination: Destination) -> None:
        """Release to the broker every message fetched for ``destination`` and waiting."""
        current = self.epoch
        fetched = [m for m in destination.queue if m.upstream_epoch == current]
        destination.forget(lambda m: m.upstream_epoch != 0)
        for message in fetched:
            if message.on_dequeue is not None:
                message.on_dequeue(_RELEASED)

    def demand_changed(self, destination: Destination) -> None:
        receiver = self._receivers.get(destination.address)
        if receiver is not None:
            self._top_up(receiver)

    def _top_up(self, receiver: _Receiver) -> None:
        """Keep (waiting messages + outstanding credit) near the look-ahead window."""
        link = receiver.link
        if link is None:
            return
        credit = max(pn_link_credit(link._impl), 0)
        missing = self._lookahead - len(receiver.destination.queue) - credit
        if missing >= max(1, self._lookahead // 4):
            link.flow(missing)
            credit += missing
        receiver.destination.upstream_credit = credit

    def _settle_upstream(
        self, epoch: int, delivery: LeanDelivery, settlement: Settlement, broker_expires: bool = False
    ) -> None:
        if epoch == self.epoch and self.connected:
            if broker_expires and settlement is EXPIRED:
                # Its header's ttl ran out here, so at the broker too (counted there from
                # when it arrived, never later than here): given back, the broker expires
                # it itself, and dead-letters it with the reason ``expired``, as it would
                # have directly (told rejected, RabbitMQ gave the reason ``rejected``).
                settlement = _RELEASED
            apply_settlement(delivery, self._as_the_broker_takes(settlement))

    def _as_the_broker_takes(self, settlement: Settlement) -> Settlement:
        """A consumer's outcome as the broker can take it on the reader's session, which
        every consumer of the destination shares. A modified outcome (undeliverable-here:
        the message leaves) goes to a broker that cannot map it (RabbitMQ 3.10 ends the
        session, and with it every consumer of the destination) as rejected: the message
        leaves the queue (to its dead-letter exchange, if it has one), as it leaves here."""
        if settlement.outcome is Outcome.MODIFIED and not (self.dialect or PLAIN).takes_modified:
            return _REJECTED
        return settlement

    # --- events on our links ----------------------------------------------------------

    def on_delivery(self, event: DeliveryEvent) -> None:
        link = event.link
        delivery = event.delivery
        receiver = kept(link, "qf_receiver")
        if receiver is None or delivery.aborted:
            delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        data = take_transfer(link, delivery.pending)
        if receiver.closing:
            delivery.settle_as(PN_RELEASED)  # came after the last consumer left
            return
        # The broker may send beyond the credit we gave (RabbitMQ does): keep it all.
        destination = receiver.destination
        message = Message(data, destination.address)
        message.upstream_epoch = self.epoch
        if _take_time_to_live(message, destination):
            message.on_dequeue = functools.partial(self._settle_upstream, self.epoch, delivery, broker_expires=True)
        else:
            message.on_dequeue = functools.partial(self._settle_upstream, self.epoch, delivery)
        destination.enqueue(message, counted=False)
        self._top_up(receiver)

    def on_session_remote_close(self, event: Event) -> None:
        """The broker ended a reader's session (each receiver has its own): RabbitMQ does
        for an error on the link (a queue that refuses the attach). Its consumers get the
        error as for a closed link; without this they waited for messages for good."""
        session = event.session
        condition = session.remote_condition
        if not self._closed_by_broker(session):
            return
        for receiver in list(self._receivers.values()):
            link = receiver.link
            if link is not None and link.session == session:
                self._receiver_closed(receiver, link.remote_condition or condition)

    def on_link_remote_close(self, event: Event) -> None:
        link = event.link
        condition = link.remote_condition
        if not self._closed_by_broker(link):
            return
        receiver = kept(link, "qf_receiver")
        if receiver is not None:
            self._receiver_closed(receiver, condition)

    def _closed_by_broker(self, endpoint: Session | Link) -> bool:
        """The broker closed ``endpoint``: close this side too. False when the reader is
        going away anyway (its consumers are told by that)."""
        if endpoint.state & Endpoint.LOCAL_ACTIVE:
            endpoint.close()
        return self.connected and not self.closing

    def _receiver_closed(self, receiver: _Receiver, condition: Condition | None) -> None:
        """The broker refused or closed a receiver: its local consumers get the error."""
        address = receiver.destination.address
        if self._receivers.get(address) is not receiver:
            return
        del self._receivers[address]
        log.warning(
            "upstream_link_closed",
            address=address,
            direction="receiver",
            condition=condition.name if condition else None,
            description=condition.description if condition else None,
        )
        self._forget_fetched(receiver)
        self._on_link_failed(address, False, condition)

    def _forget_fetched(self, receiver: _Receiver) -> None:
        """Drop what a receiver the broker closed had fetched, as _lost does for a lost
        connection: the outcomes of those deliveries can no longer reach the broker, which
        delivers the messages again. Done before the consumers are told: their detaches
        would otherwise put the messages they held back in the queue (release_held), for
        a later consumer to get stale copies whose outcomes go nowhere, then every message
        again from the broker. The receiver's session ends too, so that RabbitMQ makes
        what it had sent on it available again (see _open_receiver)."""
        destination = receiver.destination
        # Nothing is outstanding any more: a later consumer's receiver asks for the full
        # look-ahead.
        destination.upstream_credit = 0
        # One receiver per destination and connection: this epoch's messages are all its.
        current = self.epoch
        dropped = destination.forget(lambda m: m.upstream_epoch == current)
        if dropped:
            log.info("upstream_messages_forgotten", address=destination.address, count=dropped)
        receiver.closing = True  # anything still arriving on it goes back at once
        link = receiver.link
        receiver.link = None
        if link is not None and link.session.state & Endpoint.LOCAL_ACTIVE:
            link.session.close()

    # --- shutdown -----------------------------------------------------------------------

    def shutdown(self) -> None:
        """Release every fetched message back to the broker and close the connection."""
        self.closing = True
        for receiver in self._receivers.values():
            self._give_back_fetched(receiver.destination)
        if self._connection is not None and self._connection.state & Endpoint.LOCAL_ACTIVE:
            self._connection.close()


def _take_time_to_live(message: Message, destination: Destination) -> bool:
    """A fetched message with a time to live expires here as it would have at the broker.
    To the broker it is an unsettled delivery to qpid-flow's reader, which it never
    expires: a message waiting behind its group's owner was delivered long after it
    expired. Its header's ttl counts from its arrival here (when it reached the broker is
    not known: never earlier than there); its absolute-expiry-time is exact. An expired one
    is never delivered. True when its header's ttl decides its expiry: the broker, which
    reads that ttl too, expires it once given back; one that expires by its
    absolute-expiry-time alone (RabbitMQ 3.10 does not read it) is told rejected
    (``qpid-flow:expired``) instead, so that it leaves the queue."""
    try:
        message.expires, message.properties_at = codec.expiry_and_properties(message.data, message.arrived)
    except codec.MalformedMessage:
        return False  # the consumer gets it as the broker sent it
    if message.expires is None:
        return False
    destination.expiring = True
    ttl = codec.header_ttl(message.data)
    return ttl is not None and message.expires == message.arrived + ttl / 1000.0


class GroupReader:
    """Reads grouped destinations from the broker for their consumers through qpid-flow:
    each on a connection of its own (see the module's docstring), with one more
    connection, carrying no link, for ``connected`` and ``dialect``."""

    def __init__(
        self,
        container: Container,
        config: RouterConfig,
        destinations: Destinations,
        on_link_failed: Callable[[str, bool, Condition | None], None],
        on_holders_lost: Callable[[str, set[int]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_broker_lost: Callable[[], None] | None = None,
    ) -> None:
        self._container = container
        # The probe's connection, once open, was lost and could not be made again: the
        # broker is gone (stopped, killed, or behind a proxy that still takes connections),
        # whether clients are connected or not (their own connections may be closed
        # cleanly, or not at all yet).
        self._on_broker_lost = on_broker_lost
        self._new_connection = functools.partial(
            _ReaderConnection, container, config, destinations, on_link_failed, on_holders_lost, clock
        )
        self._dialect_configured = dialect_for(config.broker_dialect) if config.broker_dialect != "auto" else None
        self._probe: _ReaderConnection | None = None
        self._readers: dict[str, _ReaderConnection] = {}  # by grouped destination's address

    def start(self) -> None:
        self._probe = self._new_connection()
        self._probe.on_lost = self._on_broker_lost
        self._probe.start()

    @property
    def connected(self) -> bool:
        """The broker is reachable: the probe's connection is open."""
        return self._probe is not None and self._probe.connected

    @property
    def broker_lost(self) -> bool:
        """The probe's connection was open and is not now: the broker, or the way to it,
        went (not merely never reached: a URL whose user the broker refuses is no sign)."""
        probe = self._probe
        return probe is not None and probe.opened_once and not probe.connected

    @property
    def dialect(self) -> Dialect | None:
        """How the broker reads addresses and outcomes: configured, or learnt from the
        first of the reader's connections that the broker answered."""
        if self._dialect_configured is not None:
            return self._dialect_configured
        for connection in self._connections():
            if connection.dialect is not None:
                return connection.dialect
        return None

    def connection_states(self) -> Iterator[bool]:
        """Whether each of the reader's connections is open (for the metrics)."""
        for connection in self._connections():
            yield connection.connected

    def _connections(self) -> Iterator[_ReaderConnection]:
        if self._probe is not None:
            yield self._probe
        yield from self._readers.values()

    def consumer_attached(self, destination: Destination, durability: int = Terminus.NONDURABLE) -> None:
        """A consumer of ``destination`` came: read it (on its own connection, opened for
        its first consumer), with a source of ``durability``."""
        reader = self._readers.get(destination.address)
        if reader is None:
            reader = self._readers[destination.address] = self._new_connection(reads=destination.address)
            reader.start()
        reader.consumer_attached(destination, durability)

    def consumer_detached(self, destination: Destination) -> None:
        """A consumer of ``destination`` left: once none is left, what was fetched for it
        waits, and unless a consumer comes again within ``IDLE_READER_LINGER`` it goes
        back to the broker and the connection closes (at once if groups were turned off)."""
        reader = self._readers.get(destination.address)
        if reader is None:
            return
        reader.consumer_detached(destination)
        if reader.idle:
            # Numbered: a consumer that came and went within the linger starts it again
            # (checked as it was, the first left's timer closed the reader 10 s after it,
            # however recently the last had left: what waited went back to the broker).
            reader.idle_turn += 1
            check = functools.partial(self._close_if_idle, destination.address, reader, reader.idle_turn)
            self._container.schedule(IDLE_READER_LINGER, Call(check))

    def _close_if_idle(self, address: str, reader: _ReaderConnection, turn: int) -> None:
        if self._readers.get(address) is reader and reader.idle and reader.idle_turn == turn:
            del self._readers[address]
            reader.shutdown()

    def demand_changed(self, destination: Destination) -> None:
        reader = self._readers.get(destination.address)
        if reader is not None:
            reader.demand_changed(destination)

    def shutdown(self) -> None:
        """Release every fetched message back to the broker and close the connections."""
        for connection in self._connections():
            connection.shutdown()


def _ssl_domain(config: RouterConfig) -> SSLDomain:
    """TLS for qpid-flow's own broker connection, with the settings clients' pairs use."""
    if config.broker_tls_ca is None:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
    else:
        with _only_trusting(config.broker_tls_ca):
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(config.broker_tls_ca)
    domain.set_peer_authentication(
        SSLDomain.VERIFY_PEER_NAME if config.broker_tls_verify_hostname else SSLDomain.VERIFY_PEER
    )
    if config.broker_tls_cert is not None and config.broker_tls_key is not None:
        domain.set_credentials(config.broker_tls_cert, config.broker_tls_key, None)
    return domain


@contextlib.contextmanager
def _only_trusting(ca_file: str) -> Iterator[None]:
    """While a Proton SSL domain is made: OpenSSL's default CAs are ``ca_file`` alone.

    Proton's domain trusts OpenSSL's default verify paths (the system's CAs), loaded from
    SSL_CERT_FILE and SSL_CERT_DIR as the domain is made, and ``set_trusted_ca_db`` only
    adds to them: a broker pinned to a private CA could be impersonated with any
    certificate a public CA signed, and qpid-flow's own connection signed in to it with
    the broker password. Python's context for clients' connections replaces them
    (tls.broker_context); this makes Proton's do the same. Start-up only, before any
    other thread reads the environment."""
    names = ("SSL_CERT_FILE", "SSL_CERT_DIR")
    saved = {name: os.environ.get(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="qpid-flow-no-ca-") as empty:
        os.environ["SSL_CERT_FILE"] = ca_file
        os.environ["SSL_CERT_DIR"] = empty
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
