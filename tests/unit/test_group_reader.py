"""GroupReader (upstream.py), qpid-flow's own reader of grouped destinations, in memory.

The reader's connection is a real Proton engine end (:mod:`tests.unit.proton_pairs`) wired
to a broker end the test plays by hand; a stand-in container hands those ends out and
records the timers the reader asks for, which the test runs when it chooses. Where the
consumers matter, the clients and the router are test_linkroute's :class:`Rig`: real
client links through a real BrokerRouter, fed by the real reader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pytest
import structlog
from proton import Condition, Connection, Delivery, Endpoint, Link, Message, Receiver, Sender, Session

from qpid_flow.amqp.upstream import IDLE_READER_LINGER, GroupReader
from qpid_flow.config import RouterConfig, build_config
from qpid_flow.core.registry import Destinations
from tests.unit.proton_pairs import End, dispatch, move_bytes
from tests.unit.test_linkroute import BROKER, Pair, Rig, begin, broker_link, open_pair, receive

if TYPE_CHECKING:
    from proton import Event
    from proton.reactor import Container

MAX_DELAY = 5.0
LOOKAHEAD = 10


@dataclass
class Upstream:
    """One connection the reader made: its handler, its end, and the broker's end of it."""

    url: str
    handler: Any
    reader: End
    broker: End


@dataclass
class FakeContainer:
    """What GroupReader uses of the reactor: ``connect`` (to an in-memory broker end, whose
    events go to the connection's handler, as the reactor's do) and ``schedule``
    (recorded, run by the test)."""

    upstreams: list[Upstream] = field(default_factory=list)
    timers: list[tuple[float, object]] = field(default_factory=list)

    def connect(self, url: str, handler: object, **_options: object) -> Connection:
        upstream = Upstream(url, handler, End(server=False), End(server=True))
        upstream.reader.connection.open()  # as Container.connect does
        self.upstreams.append(upstream)
        return upstream.reader.connection

    def schedule(self, delay: float, handler: object) -> None:
        self.timers.append((delay, handler))


class ReaderRig:
    """A GroupReader on a stand-in container, with a clock the test moves."""

    def __init__(
        self,
        config: RouterConfig,
        destinations: Destinations | None = None,
        on_link_failed: Callable[[str, bool, Condition | None], None] = lambda *_failure: None,
        on_holders_lost: Callable[[str, set[int]], None] | None = None,
    ) -> None:
        self.now = 1000.0
        self.container = FakeContainer()
        self.reader = GroupReader(
            cast("Container", self.container),
            config,
            destinations if destinations is not None else cast(Destinations, None),
            on_link_failed=on_link_failed,
            on_holders_lost=on_holders_lost,
            clock=lambda: self.now,
        )

    @property
    def upstream(self) -> Upstream:
        """The reader's latest connection."""
        return self.container.upstreams[-1]

    def upstreams_reading(self, address: str | None) -> list[Upstream]:
        """The connections made to read ``address`` (None: the reachability probe's), oldest
        first."""
        return [upstream for upstream in self.container.upstreams if upstream.handler.reads == address]

    def pump(self) -> bool:
        """Handle the reader's events and move bytes on its wires until nothing happens;
        True if anything did."""
        moved = False
        for _ in range(1000):
            busy = False
            for upstream in self.container.upstreams:
                busy = dispatch(upstream.reader.collector, upstream.handler) > 0 or busy
                busy = move_bytes(upstream.reader.transport, upstream.broker.transport) or busy
                busy = move_bytes(upstream.broker.transport, upstream.reader.transport) or busy
                busy = upstream.broker.take_events() > 0 or busy
            if not busy:
                return moved
            moved = True
        raise AssertionError("the reader's wires never went quiet")

    def reconnect(self) -> float:
        """Run the reconnect the reader scheduled (its timer fires); returns its delay."""
        handlers = [upstream.handler for upstream in self.container.upstreams]
        scheduled = [(delay, handler) for delay, handler in self.container.timers if handler in handlers]
        assert len(scheduled) == 1, f"expected one reconnect scheduled, got {scheduled}"
        self.container.timers.clear()
        delay, handler = scheduled[0]
        cast(Any, handler).on_timer_task(cast("Event", None))
        self.pump()
        return delay


def reader_config(brokers: str = BROKER.url, **settings: Any) -> RouterConfig:
    return build_config({"broker": brokers, "reconnect_max_delay": MAX_DELAY, **settings})


def answer_open_then_close(upstream: Upstream) -> None:
    """The broker answers the open and closes at once, as one at its connection limit does."""
    broker = upstream.broker.connection
    broker.open()
    broker.condition = Condition("amqp:resource-limit-exceeded", "connection limit reached")
    broker.close()


# --- reconnect back-off --------------------------------------------------------------------------


def test_a_broker_that_closes_each_connection_at_once_is_retried_with_a_growing_back_off() -> None:
    """Each connection got its open, so the back-off was reset every time and the reader
    reconnected about ten times a second, for good, to a broker at its connection limit.
    A connection that is closed at once is a failed attempt: the delay doubles up to
    reconnect_max_delay."""
    rig = ReaderRig(reader_config())
    rig.reader.start()
    rig.pump()
    delays = []
    for _ in range(8):
        answer_open_then_close(rig.upstream)
        rig.pump()
        assert not rig.reader.connected
        rig.now += 0.05  # each connection lived 50 ms
        delays.append(rig.reconnect())
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, MAX_DELAY, MAX_DELAY]
    assert len(rig.container.upstreams) == 9


def test_a_connection_that_stayed_open_long_enough_is_lost_with_the_back_off_started_again() -> None:
    """Once a connection has stayed open reconnect_max_delay, losing it is a new outage:
    the first reconnect comes after 0.1 s again."""
    rig = ReaderRig(reader_config())
    rig.reader.start()
    rig.pump()
    for _ in range(4):  # the back-off grows to 0.8 s
        answer_open_then_close(rig.upstream)
        rig.pump()
        rig.reconnect()
    rig.upstream.broker.connection.open()
    rig.pump()
    assert rig.reader.connected
    rig.now += MAX_DELAY
    rig.upstream.broker.connection.close()
    rig.pump()
    assert rig.reconnect() == 0.1


def test_a_broker_of_the_list_that_closes_at_once_is_passed_over_for_the_next() -> None:
    """Closed at once counts as a failed attempt at that broker: the reader tries the next
    one of the list at once (it went back to the first, and only the first, for good), and
    backs off once the whole list has been tried."""
    rig = ReaderRig(reader_config("amqp://first.test:5672,amqp://second.test:5672"))
    rig.reader.start()
    rig.pump()
    delays = []
    for _ in range(4):
        answer_open_then_close(rig.upstream)
        rig.pump()
        delays.append(rig.reconnect())
    assert [upstream.url for upstream in rig.container.upstreams] == [
        "amqp://first.test:5672",
        "amqp://second.test:5672",
        "amqp://first.test:5672",
        "amqp://second.test:5672",
        "amqp://first.test:5672",
    ]
    assert delays == [0.0, 0.1, 0.0, 0.2]


def test_the_broker_is_taken_for_gone_only_once_connecting_again_fails() -> None:
    """The probe's connection lost once, the broker still there (a blip, or the broker
    closing that one connection): connecting again works, and nothing is told (the depths
    qpid-flow counted in the broker were reset, and producers passed the stop threshold
    by that much). Lost, and connecting again fails: the broker is gone, told once."""
    told: list[str] = []
    rig = ReaderRig(reader_config())
    rig.reader._on_broker_lost = lambda: told.append("gone")
    rig.reader.start()
    rig.pump()
    rig.upstream.broker.connection.open()
    rig.pump()
    assert rig.reader.connected and not rig.reader.broker_lost
    rig.upstream.broker.connection.close()  # a blip
    rig.pump()
    assert rig.reader.broker_lost and told == []
    rig.reconnect()
    rig.upstream.broker.connection.open()
    rig.pump()
    assert rig.reader.connected and not rig.reader.broker_lost and told == []

    rig.upstream.broker.transport.close_head()  # the broker goes
    rig.upstream.broker.transport.close_tail()
    rig.pump()
    assert told == []
    rig.reconnect()
    rig.upstream.broker.transport.close_head()  # and refuses the next connection
    rig.upstream.broker.transport.close_tail()
    rig.pump()
    assert told == ["gone"]
    rig.reconnect()
    rig.upstream.broker.transport.close_head()
    rig.upstream.broker.transport.close_tail()
    rig.pump()
    assert told == ["gone"], "told once per loss"


# --- the broker ends a reader's link or session --------------------------------------------------


@dataclass
class GroupedRig:
    """Clients through a real BrokerRouter (test_linkroute's Rig) whose grouped destinations
    (``orders``, and any others named) are fed by a real GroupReader."""

    rig: Rig
    upstream: ReaderRig

    @classmethod
    def build(cls, *addresses: str) -> GroupedRig:
        config = build_config(
            {
                "broker": BROKER.url,
                "consumer_lookahead": LOOKAHEAD,
                "destinations": {address: {"shared_groups": True} for address in addresses or ("orders",)},
            }
        )
        rig = Rig(config=config)
        rig.destinations.create_configured()  # as the server does at start
        upstream = ReaderRig(
            config,
            rig.destinations,
            on_link_failed=rig.router.upstream_link_failed,
            on_holders_lost=rig.router.reader_lost_for,
        )
        # In place of the Rig's stub (the reader needs the Rig's destinations and router first).
        cast(Any, rig.router.backend).group_reader = upstream.reader
        upstream.reader.start()
        upstream.pump()
        upstream.upstream.broker.connection.open()
        upstream.pump()
        assert upstream.reader.connected
        return cls(rig, upstream)

    def pump(self) -> None:
        for _ in range(100):
            self.rig.pump()
            if not self.upstream.pump():
                return
        raise AssertionError("the router and the reader never went quiet")

    def consumer(self, pair: Pair, session: Session, name: str, credit: int, address: str = "orders") -> Receiver:
        """A client's consumer of ``address``: the broker allows its check (a zero-credit
        attach on the client's own connection), then qpid-flow's dispatch serves it."""
        receiver = session.receiver(name)
        receiver.source.address = address
        receiver.open()
        self.pump()
        check = broker_link(pair, name)
        check.source.copy(check.remote_source)
        check.target.copy(check.remote_target)
        check.open()
        self.pump()
        assert receiver.state & Endpoint.REMOTE_ACTIVE
        receiver.flow(credit)
        self.pump()
        return receiver

    def answer_reader(self, address: str = "orders") -> Sender:
        """The broker answers the reader's new session and receiver (and, first, the open of
        the connection made to read ``address``): its sender of ``address``."""
        broker = self.upstream.upstreams_reading(address)[-1].broker.connection
        if broker.state & Endpoint.LOCAL_UNINIT:
            broker.open()
            self.pump()
        session = broker.session_head(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
        assert session is not None, "the reader began no new session"
        session.open()
        link = broker.link_head(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
        assert link is not None and link.is_sender, "the reader attached no new receiver"
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.open()
        self.pump()
        return cast(Sender, link)


def grouped(body: str) -> bytes:
    return cast(bytes, Message(body=body, group_id="A").encode())


def broker_sends(sender: Sender, *bodies: str) -> list[Delivery]:
    deliveries = []
    for body in bodies:
        deliveries.append(sender.delivery(f"{body}-{sender.name}"))
        sender.send(grouped(body))
        sender.advance()
    return deliveries


def received(receiver: Receiver) -> list[tuple[Delivery, str]]:
    """Every complete transfer ``receiver`` has, in order, with its message's body."""
    deliveries = []
    while receiver.current is not None:
        delivery, data = receive(receiver)
        message = Message()
        message.decode(data)
        deliveries.append((delivery, cast(str, message.body)))
    return deliveries


def end_reader_link(sender: Sender, how: str) -> None:
    condition = Condition("amqp:resource-deleted", "queue 'orders' in vhost 'v1' deleted")
    ended: Link | Session = sender if how == "link" else sender.session
    ended.condition = condition
    ended.close()


@pytest.mark.parametrize("how", ["link", "session"])
def test_what_a_reader_the_broker_ended_had_fetched_is_forgotten_and_a_new_consumer_reads_afresh(how: str) -> None:
    """The broker ended the reader's link (or its session): its consumers were detached,
    but the messages the reader had fetched stayed queued, those the consumers held put
    back by their detaches. A later consumer got those stale copies (whose accepts went
    to the dead link) and then every message again from the broker, on a reader asking
    for less than its look-ahead. Now they are forgotten as for a lost connection: the
    later consumer gets each message once, from the new reader, and its accept reaches
    the broker."""
    grouped_rig = GroupedRig.build()
    destination = grouped_rig.rig.destinations.find("orders")
    assert destination is not None
    pair = open_pair(grouped_rig.rig)
    session, _ = begin(grouped_rig.rig, pair)
    first = grouped_rig.consumer(pair, session, "first", credit=1)
    old_sender = grouped_rig.answer_reader()
    assert old_sender.credit == LOOKAHEAD
    broker_sends(old_sender, "m0", "m1", "m2")
    grouped_rig.pump()
    assert [body for _, body in received(first)] == ["m0"]  # held, unsettled
    assert len(destination.queue) == 2

    with structlog.testing.capture_logs() as logs:
        end_reader_link(old_sender, how)
        grouped_rig.pump()
    assert first.state & Endpoint.REMOTE_CLOSED
    assert first.remote_condition.name == "amqp:resource-deleted"
    assert len(destination.queue) == 0, "stale copies of what the ended reader fetched"
    assert destination.upstream_credit == 0
    assert {"event": "upstream_messages_forgotten", "address": "orders", "count": 3, "log_level": "info"} in logs
    assert not [entry for entry in logs if entry["log_level"] == "error"], logs
    assert old_sender.session.state & Endpoint.REMOTE_CLOSED, "the ended reader's session was left open"

    second = grouped_rig.consumer(pair, session, "second", credit=10)
    new_sender = grouped_rig.answer_reader()
    assert new_sender.credit == LOOKAHEAD
    redelivered = broker_sends(new_sender, "m0", "m1", "m2")  # the broker delivers them again
    grouped_rig.pump()
    got = received(second)
    assert [body for _, body in got] == ["m0", "m1", "m2"]
    accepted, _ = got[0]
    accepted.update(Delivery.ACCEPTED)
    accepted.settle()
    grouped_rig.pump()
    assert redelivered[0].remote_state == Delivery.ACCEPTED


# --- one connection per grouped destination ------------------------------------------------------


def test_the_broker_closing_one_grouped_destination_s_connection_leaves_the_others_alone() -> None:
    """RabbitMQ closes the whole connection for the fault of one of its links (a deleted
    queue that a receiver reads). All grouped destinations were read on one connection, so
    deleting one queue detached the consumers of every grouped destination. Each is now
    read on a connection of its own: only the deleted queue's consumers are detached."""
    grouped_rig = GroupedRig.build("orders", "invoices")
    pair = open_pair(grouped_rig.rig)
    session, _ = begin(grouped_rig.rig, pair)
    orders = grouped_rig.consumer(pair, session, "orders-consumer", credit=5, address="orders")
    orders_sender = grouped_rig.answer_reader("orders")
    invoices = grouped_rig.consumer(pair, session, "invoices-consumer", credit=5, address="invoices")
    invoices_sender = grouped_rig.answer_reader("invoices")
    assert orders_sender.connection is not invoices_sender.connection
    broker_sends(orders_sender, "o0")
    invoice_deliveries = broker_sends(invoices_sender, "i0", "i1")
    grouped_rig.pump()
    assert [body for _, body in received(orders)] == ["o0"]  # held, unsettled
    held_invoices = received(invoices)
    assert [body for _, body in held_invoices] == ["i0", "i1"]  # held, unsettled

    broker = orders_sender.connection
    broker.condition = Condition("amqp:internal-error", "queue 'orders' in vhost 'v1' deleted")
    broker.close()
    grouped_rig.pump()

    assert orders.state & Endpoint.REMOTE_CLOSED
    assert orders.remote_condition.name == "amqp:link:detach-forced"
    assert invoices.state & Endpoint.REMOTE_ACTIVE, "a consumer of another grouped destination was detached"
    assert grouped_rig.upstream.reader.connected, "the reachability probe went with the orders connection"
    accepted, _ = held_invoices[0]
    accepted.update(Delivery.ACCEPTED)
    accepted.settle()
    grouped_rig.pump()
    assert invoice_deliveries[0].remote_state == Delivery.ACCEPTED


def test_a_grouped_destination_s_connection_closes_when_its_last_consumer_leaves() -> None:
    """The connection made to read the destination stays IDLE_READER_LINGER for a
    consumer that comes again (a client that opens a consumer per request), and what was
    fetched ahead waits there for it; then it goes back to the broker (released) and the
    connection closes; a later consumer gets a new one. (What was fetched went back the
    moment the last consumer left: a consumer coming again got it redelivered by the
    broker, the traces of a modified outcome lost.)"""
    grouped_rig = GroupedRig.build()
    pair = open_pair(grouped_rig.rig)
    session, _ = begin(grouped_rig.rig, pair)
    consumer = grouped_rig.consumer(pair, session, "first", credit=1)
    sender = grouped_rig.answer_reader()
    deliveries = broker_sends(sender, "m0", "m1")
    grouped_rig.pump()
    [(held, _)] = received(consumer)
    held.update(Delivery.ACCEPTED)
    held.settle()
    grouped_rig.pump()

    consumer.close()
    grouped_rig.pump()
    assert deliveries[0].remote_state == Delivery.ACCEPTED
    assert not deliveries[1].remote_state, "fetched ahead: waits for the next consumer"
    assert not sender.connection.state & Endpoint.REMOTE_CLOSED
    again = grouped_rig.consumer(pair, session, "again", credit=1)  # within the linger
    grouped_rig.pump()
    assert [body for _, body in received(again)] == ["m1"]
    again.close()  # leaves it unsettled: back in the queue
    grouped_rig.pump()
    readers = grouped_rig.upstream.upstreams_reading("orders")
    assert len(readers) == 1, "a new connection for a consumer within the linger"
    assert not deliveries[1].remote_state

    # The linger's timers (and the open deadlines, which find their connections open).
    timers = [timer for delay, timer in grouped_rig.upstream.container.timers if delay >= IDLE_READER_LINGER]
    grouped_rig.upstream.container.timers.clear()
    for timer in timers:
        cast(Any, timer).on_timer_task(None)
    grouped_rig.pump()
    assert deliveries[1].remote_state == Delivery.RELEASED  # no consumer came again: given back
    assert sender.connection.state & Endpoint.REMOTE_CLOSED
    assert grouped_rig.upstream.reader.connected

    grouped_rig.consumer(pair, session, "later", credit=1)
    grouped_rig.answer_reader()
    assert len(grouped_rig.upstream.upstreams_reading("orders")) == 2


def test_a_consumer_that_comes_and_goes_within_the_linger_starts_it_again() -> None:
    """The timer of the first consumer to leave closed the reader 10 s after it, though
    another had come and left since: a consumer polling every few seconds found what was
    fetched for it given back to the broker, a modified outcome's delivery-count lost."""
    grouped_rig = GroupedRig.build()
    pair = open_pair(grouped_rig.rig)
    session, _ = begin(grouped_rig.rig, pair)
    first = grouped_rig.consumer(pair, session, "first", credit=1)
    sender = grouped_rig.answer_reader()
    deliveries = broker_sends(sender, "m0", "m1")
    grouped_rig.pump()
    first.close()  # leaves m0 unsettled: it waits, with m1, for the next consumer
    grouped_rig.pump()
    container = grouped_rig.upstream.container
    first_left = [timer for delay, timer in container.timers if delay >= IDLE_READER_LINGER]
    container.timers.clear()
    again = grouped_rig.consumer(pair, session, "again", credit=0)  # within the linger
    grouped_rig.pump()
    again.close()
    grouped_rig.pump()
    last_left = [timer for delay, timer in container.timers if delay >= IDLE_READER_LINGER]
    container.timers.clear()

    for timer in first_left:  # 10 s after the first left: the last left only just now
        cast(Any, timer).on_timer_task(None)
    grouped_rig.pump()
    assert not sender.connection.state & Endpoint.REMOTE_CLOSED, "the linger starts again at the last to leave"
    assert not any(d.remote_state for d in deliveries)
    for timer in last_left:
        cast(Any, timer).on_timer_task(None)
    grouped_rig.pump()
    assert sender.connection.state & Endpoint.REMOTE_CLOSED
    assert [d.remote_state for d in deliveries] == [Delivery.RELEASED, Delivery.RELEASED]
