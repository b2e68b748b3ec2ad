"""In front of a broker: one connection upstream, its links, and reconnecting.

Producer messages go out on one upstream sender per target address and are settled
back to their producer with the broker's outcome, never earlier. One shared upstream
receiver per source address feeds the local consumers of that address with a bounded
look-ahead of credit; its messages stay unsettled at the broker until a local consumer
settles them, and the consumer's outcome is what the broker is told.

Reconnect behaviour, chosen on purpose: while the broker is away producers get no new
credit (what they already sent is kept and sent again once connected: nothing a
producer saw accepted is lost, and nothing unaccepted is dropped); the messages fetched
for consumers are forgotten, since the broker delivers them again; consumers keep their
links. Reconnection backs off from 0.1 s to ``reconnect_max_delay``.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from cproton import PN_RELEASED, pn_link_credit
from proton import Condition, Endpoint, Handler, Link

from qpid_flow.endpoints import DeliveryEvent, LeanDelivery, keep_link, kept, new_delivery, send_transfer, take_transfer
from qpid_flow.guard import contain_errors
from qpid_flow.memory import MemoryMeter
from qpid_flow.model import Message, Outcome, Settlement
from qpid_flow.outcomes import apply_settlement, remote_settlement

if TYPE_CHECKING:
    from proton import Connection, Event
    from proton.reactor import Container

    from qpid_flow.backend import OutcomeCallback
    from qpid_flow.config import RouterConfig
    from qpid_flow.destination import Destination
    from qpid_flow.registry import Destinations

__all__ = ["BrokerBackend"]

log = structlog.get_logger("qpid_flow.upstream")

_ACCEPTED = Settlement.accepted()
_RELEASED = Settlement.released()


class _Sender:
    """The upstream sender of one target address and the messages waiting for it."""

    __slots__ = ("address", "in_flight", "link", "pending")

    def __init__(self, address: str) -> None:
        self.address = address
        self.link: Link | None = None
        self.pending: deque[tuple[Message, OutcomeCallback]] = deque()
        # Sent and waiting for the broker's outcome, in send order, by C delivery (the
        # delivery's event carries it; the entry holds the wrapper, so the C delivery
        # lives, and its address stays unique, as long as the entry).
        self.in_flight: dict[Any, tuple[Message, OutcomeCallback, LeanDelivery]] = {}


class _Receiver:
    """The shared upstream receiver of one source address."""

    __slots__ = ("closing", "destination", "link")

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self.link: Link | None = None
        self.closing = False  # detached: nothing it still receives is wanted


@contain_errors
class BrokerBackend(Handler):
    """The :class:`~qpid_flow.backend.Backend` for a broker behind qpid-flow."""

    def __init__(
        self,
        container: Container,
        config: RouterConfig,
        destinations: Destinations,
        on_writable: Callable[[], None],
        on_link_failed: Callable[[str, bool, Condition | None], None],
        memory: MemoryMeter | None = None,
    ) -> None:
        super().__init__()
        self._brokers = config.broker_addresses
        assert self._brokers, "BrokerBackend needs a broker"
        self._broker_index = 0  # which broker of the list: tried in order, from the first
        self._container = container
        self._lookahead = config.consumer_lookahead
        self._max_delay = config.reconnect_max_delay
        self._destinations = destinations
        self._on_writable = on_writable
        # (address, is_sender, condition): the broker refused or closed one of our links.
        self._on_link_failed = on_link_failed
        self._memory = memory or MemoryMeter()
        self._connection: Connection | None = None
        self.connected = False
        self.closing = False
        self.epoch = 0  # which connection; deliveries of an older one are dead
        self._delay = 0.0
        self._senders: dict[str, _Sender] = {}
        self._receivers: dict[str, _Receiver] = {}
        self._tags = itertools.count(1)

    # --- connection -----------------------------------------------------------------------

    def start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        self.epoch += 1
        broker = self._brokers[self._broker_index]
        log.info("upstream_connecting", broker=broker.redacted, attempt_delay=self._delay)
        # The URL's path is the virtual host, sent as RabbitMQ expects it: "vhost:NAME".
        virtual_host = f"vhost:{broker.vhost}" if broker.vhost else None
        self._connection = self._container.connect(broker.url, handler=self, reconnect=False, virtual_host=virtual_host)

    def on_connection_remote_open(self, event: Event) -> None:
        if event.connection != self._connection:
            return
        self.connected = True
        self._delay = 0.0
        log.info("upstream_connected", broker=self._brokers[self._broker_index].redacted, epoch=self.epoch)
        for sender in self._senders.values():
            self._open_sender(sender)
        for receiver in self._receivers.values():
            self._open_receiver(receiver)
        self._on_writable()

    def on_connection_remote_close(self, event: Event) -> None:
        if event.connection == self._connection:
            condition = event.connection.remote_condition
            log.warning(
                "upstream_closed_by_broker",
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
                condition=condition.name if condition else None,
                description=condition.description if condition else None,
            )

    def on_transport_closed(self, event: Event) -> None:
        if event.connection == self._connection:
            self._lost()

    def _lost(self) -> None:
        """The broker connection is gone: keep what producers sent, forget what we fetched."""
        was_connected = self.connected
        self.connected = False
        self._connection = None
        old_epoch = self.epoch
        for sender in self._senders.values():
            sender.link = None
            if sender.in_flight:
                # No outcome came for these: send them again, first, in their order.
                sender.pending.extendleft((message, done) for message, done, _ in reversed(sender.in_flight.values()))
                sender.in_flight.clear()
        for receiver in self._receivers.values():
            receiver.link = None
            receiver.destination.upstream_credit = 0
            dropped = receiver.destination.forget(lambda m: m.upstream_epoch == old_epoch)
            if dropped:
                log.info("upstream_messages_forgotten", address=receiver.destination.address, count=dropped)
        if self.closing:
            return
        if was_connected:
            log.warning("upstream_disconnected", broker=self._brokers[self._broker_index].redacted)
            self._broker_index = 0  # the first of the list again, then the others
            self._delay = 0.0
        else:
            self._broker_index = (self._broker_index + 1) % len(self._brokers)
        # Back off once the whole list has been tried.
        if self._broker_index == 0:
            self._delay = min(self._max_delay, max(0.1, self._delay * 2))
        self._container.schedule(self._delay if self._broker_index == 0 else 0.0, self)

    def on_timer_task(self, event: Event) -> None:
        if not self.closing and self._connection is None:
            self._connect()

    # --- producer side (Backend) ----------------------------------------------------------

    def writable(self, address: str | None) -> bool:
        return self.connected and not self.closing

    def producer_attached(self, destination: Destination) -> None:
        self._sender(destination.address)

    def _sender(self, address: str) -> _Sender:
        sender = self._senders.get(address)
        if sender is None:
            sender = self._senders[address] = _Sender(address)
            self._open_sender(sender)
        return sender

    def _open_sender(self, sender: _Sender) -> None:
        if not self.connected or self._connection is None:
            return
        link = self._container.create_sender(self._connection, sender.address)
        link.qf_sender = sender
        keep_link(link)
        sender.link = link

    def forward(self, destination: Destination, message: Message, done: OutcomeCallback) -> None:
        # It counts in the destination's depth from now on: it is on its way to the broker.
        destination.count_in(message)
        destination.in_flight += 1
        self._memory.add(message.size)

        def outcome(message: Message, settlement: Settlement) -> None:
            destination.in_flight -= 1
            self._memory.sub(message.size)
            if settlement.outcome is not Outcome.ACCEPTED:
                destination.count_out(message)  # the broker did not take it
            done(message, settlement)

        sender = self._sender(destination.address)
        sender.pending.append((message, outcome))
        if sender.link is not None and pn_link_credit(sender.link._impl) > 0:
            self._pump(sender)

    def _pump(self, sender: _Sender) -> None:
        link = sender.link
        if link is None:
            return
        pending = sender.pending
        while pending and pn_link_credit(link._impl) > 0:
            message, done = pending.popleft()
            delivery = new_delivery(link, str(next(self._tags)))
            send_transfer(link, message.data)
            if message.origin is None:
                # The producer sent it pre-settled: so do we; there is no outcome to wait for.
                delivery.settle()
                done(message, _ACCEPTED)
            else:
                sender.in_flight[delivery._impl] = (message, done, delivery)

    def in_flight(self) -> int:
        return sum(len(s.in_flight) + len(s.pending) for s in self._senders.values())

    # --- consumer side (Backend) ----------------------------------------------------------

    def consumer_attached(self, destination: Destination) -> None:
        if destination.address not in self._receivers:
            receiver = self._receivers[destination.address] = _Receiver(destination)
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
        link.source.address = receiver.destination.address
        link.target.address = receiver.destination.address
        link.open()
        link.qf_receiver = receiver
        keep_link(link)
        receiver.link = link
        self._top_up(receiver)

    def consumer_detached(self, destination: Destination) -> None:
        if destination.consumers:
            return
        receiver = self._receivers.pop(destination.address, None)
        if receiver is None:
            return
        # No local consumer is left: give back what was fetched ahead, then detach.
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

    def _settle_upstream(self, epoch: int, delivery: LeanDelivery, settlement: Settlement) -> None:
        if epoch == self.epoch and self.connected:
            apply_settlement(delivery, settlement)

    # --- events on our links ----------------------------------------------------------

    def on_link_flow(self, event: Event) -> None:
        sender = kept(event.link, "qf_sender")
        if sender is not None and sender.link == event.link:
            self._pump(sender)
            return

    def on_delivery(self, event: DeliveryEvent) -> None:
        link = event.link
        if link.is_sender:
            sender: _Sender | None = kept(link, "qf_sender")
            if sender is None:
                return
            entry = sender.in_flight.get(event.impl)
            if entry is None:
                return
            message, done, delivery = entry
            settlement = remote_settlement(delivery)
            if settlement is None:
                return
            del sender.in_flight[event.impl]
            delivery.settle()
            done(message, settlement)
            return
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
        message = Message(data, receiver.destination.address)
        message.upstream_epoch = self.epoch
        message.on_dequeue = functools.partial(self._settle_upstream, self.epoch, delivery)
        receiver.destination.enqueue(message, counted=False)
        self._top_up(receiver)

    def on_link_remote_close(self, event: Event) -> None:
        link = event.link
        condition = link.remote_condition
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()
        if not self.connected or self.closing:
            return
        sender = kept(link, "qf_sender")
        if sender is not None:
            self._sender_closed(sender, condition)
        receiver = kept(link, "qf_receiver")
        if receiver is not None:
            self._receiver_closed(receiver, condition)

    def _sender_closed(self, sender: _Sender, condition: Condition | None) -> None:
        """The broker refused or closed a sender: fail its messages and its producers."""
        if self._senders.get(sender.address) is not sender:
            return
        del self._senders[sender.address]
        log.warning(
            "upstream_link_closed",
            address=sender.address,
            direction="sender",
            condition=condition.name if condition else None,
            description=condition.description if condition else None,
        )
        failed = Settlement(
            Outcome.REJECTED,
            condition.name if condition else "amqp:internal-error",
            condition.description if condition else f"the broker closed the link to {sender.address!r}",
        )
        waiting = [(message, done) for message, done, _ in sender.in_flight.values()]
        for message, done in [*waiting, *sender.pending]:
            done(message, failed)
        self._on_link_failed(sender.address, True, condition)

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
        self._on_link_failed(address, False, condition)

    # --- shutdown -----------------------------------------------------------------------

    def shutdown(self) -> None:
        """Release every fetched message back to the broker and close the connection."""
        self.closing = True
        for receiver in self._receivers.values():
            self._give_back_fetched(receiver.destination)
        if self._connection is not None and self._connection.state & Endpoint.LOCAL_ACTIVE:
            self._connection.close()
