"""BrokerRouter (linkroute.py) in memory: frames in from a client and a broker, frames out.

In the spirit of mitmproxy's Playbook: no socket, no broker process. Four real Proton engine
ends per client (:mod:`tests.unit.proton_pairs`): the client, qpid-flow's client-facing
connection (server, no SASL: the gate did it), qpid-flow's upstream connection and the
broker. qpid-flow's two connections share one collector, as they share the container's,
and its events reach the router the way ``RelayContainer.process`` hands them over. The
test plays the client and the broker by hand and checks what each of them sees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog
from proton import (
    UNDESCRIBED,
    Array,
    Collector,
    Condition,
    Data,
    Delivery,
    Described,
    Endpoint,
    Link,
    Message,
    Receiver,
    Sender,
    Session,
    SymbolList,
    Terminus,
    symbol,
    ulong,
)

from qpid_flow import hookimpl
from qpid_flow.amqp.linkroute import BrokerRouter
from qpid_flow.amqp.upstream import GroupReader as UpstreamGroupReader
from qpid_flow.brokers import BrokerAddress
from qpid_flow.config import RouterConfig, build_config
from qpid_flow.core.destination import Destination
from qpid_flow.core.dialect import Dialect
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Message as Fetched
from qpid_flow.core.registry import Destinations
from qpid_flow.plugin.manager import BUILTIN_PLUGINS, Hooks, build_plugin_manager
from tests.unit.faults import fail_next
from tests.unit.proton_pairs import End, dispatch, move_bytes

BROKER = BrokerAddress("amqp", "broker.test", 5672, user="app", password="secret", vhost="v1")
SELECTOR = symbol("apache.org:selector-filter:string")


class StubGroupReader:
    """What BrokerRouter uses of :class:`UpstreamGroupReader`: only shared_groups destinations call it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.dialect: Dialect | None = None  # the broker's, once the reader has reached it
        self.connected = True  # its probe's connection is open
        self.broker_lost = False  # ... and was not lost

    def consumer_attached(self, destination: Destination, durability: int = 0) -> None:
        self.calls.append(("consumer_attached", destination.address))

    def consumer_detached(self, destination: Destination) -> None:
        self.calls.append(("consumer_detached", destination.address))

    def demand_changed(self, destination: Destination) -> None:
        self.calls.append(("demand_changed", destination.address))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", ""))

    def connection_states(self) -> list[bool]:
        return [True]  # its probe's connection, open


@dataclass
class Pair:
    """A client, qpid-flow's two connections for it, and its broker connection."""

    client: End
    facing: End  # qpid-flow's side of the client's connection
    upstream: End  # qpid-flow's connection to the broker, for this client only
    broker: End


def _builtin_hooks(config: RouterConfig, plugins: list[Any] | None = None) -> Hooks:
    """The built-in policies only (an installed plugin is not BrokerRouter's business), set
    up as server.py does; and ``plugins``, the test's own."""
    pm = build_plugin_manager([])
    for name, _plugin in list(pm.list_name_plugin()):
        if name not in BUILTIN_PLUGINS or name == "events":
            pm.unregister(name=name)
    for plugin in plugins or []:
        pm.register(plugin)
    Hooks(pm).configure(config=config, manager=pm)
    return Hooks(pm)


@dataclass
class Rig:
    """A BrokerRouter built from real qpid-flow objects, and the pairs it mirrors."""

    config: RouterConfig = field(default_factory=lambda: build_config({"broker": BROKER.url}))
    group_reader: StubGroupReader = field(default_factory=StubGroupReader)
    collector: Collector = field(default_factory=Collector)  # qpid-flow's, for all its connections
    pairs: list[Pair] = field(default_factory=list)
    plugins: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        hooks = _builtin_hooks(self.config, self.plugins)
        memory = MemoryMeter()
        self.destinations = Destinations(self.config, hooks, memory)
        self.router = BrokerRouter(
            self.config, hooks, self.destinations, cast(UpstreamGroupReader, self.group_reader), memory
        )

    def connect(self) -> Pair:
        """A client the gate has just handed over (SASL done at both ends)."""
        pair = Pair(
            client=End(server=False),
            facing=End(server=True, collector=self.collector),
            upstream=End(server=False, collector=self.collector),
            broker=End(server=True),
        )
        self.router.pair_opened(pair.facing.connection, pair.upstream.connection, BROKER, ("127.0.0.1", 1), "anonymous")
        self.pairs.append(pair)
        return pair

    def pump(self) -> None:
        """Handle qpid-flow's events and move bytes on every wire until nothing happens."""
        for _ in range(1000):
            busy = dispatch(self.collector, self.router) > 0
            for pair in self.pairs:
                for a, b in ((pair.client, pair.facing), (pair.upstream, pair.broker)):
                    busy = move_bytes(a.transport, b.transport) or busy
                    busy = move_bytes(b.transport, a.transport) or busy
                busy = pair.client.take_events() > 0 or busy
                busy = pair.broker.take_events() > 0 or busy
            if not busy:
                return
        raise AssertionError("the wires never went quiet")


@pytest.fixture
def rig() -> Rig:
    return Rig()


def unbounded_rig() -> Rig:
    """A rig whose destinations have no default maximum: depth counts without flow control."""
    return Rig(config=build_config({"broker": BROKER.url, "default_max_size": 0}))


# --- playing the client and the broker ----------------------------------------------------------


def open_pair(rig: Rig, container: str = "client-1", hostname: str = "vhost:v1") -> Pair:
    """A client connected through qpid-flow (in the broker URL's vhost unless
    ``hostname`` says another), the broker having answered its open."""
    pair = rig.connect()
    pair.client.connection.container = container
    pair.client.connection.hostname = hostname
    pair.client.connection.open()
    rig.pump()
    pair.broker.connection.container = "broker-1"
    pair.broker.connection.open()
    rig.pump()
    assert pair.client.connection.state & Endpoint.REMOTE_ACTIVE
    return pair


def begin(rig: Rig, pair: Pair) -> tuple[Session, Session]:
    """A client session, begun by the broker too: (client's, broker's)."""
    session = pair.client.connection.session()
    session.open()
    rig.pump()
    broker_session = pair.broker.connection.session_head(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
    assert broker_session is not None, "the client's begin did not reach the broker"
    broker_session.open()
    rig.pump()
    assert session.state & Endpoint.REMOTE_ACTIVE
    return session, broker_session


def broker_link(pair: Pair, name: str) -> Link:
    """The broker's end of the link named ``name``."""
    link = pair.broker.connection.link_head(0)
    while link is not None:
        if link.name == name:
            return link
        link = link.next(0)
    raise AssertionError(f"no link {name!r} reached the broker")


def attach(rig: Rig, pair: Pair, link: Link) -> Link:
    """Attach ``link`` and have the broker answer with the terminus it was given."""
    link.open()
    rig.pump()
    answer = broker_link(pair, link.name)
    answer.source.copy(answer.remote_source)
    answer.target.copy(answer.remote_target)
    answer.open()
    rig.pump()
    assert link.state & Endpoint.REMOTE_ACTIVE
    return answer


def producer(rig: Rig, pair: Pair, session: Session, address: str = "orders") -> tuple[Sender, Receiver]:
    sender = session.sender(f"{address}-writer")
    sender.target.address = address
    return sender, attach(rig, pair, sender)


def consumer(rig: Rig, pair: Pair, session: Session, address: str = "orders") -> tuple[Receiver, Sender]:
    receiver = session.receiver(f"{address}-reader")
    receiver.source.address = address
    return receiver, attach(rig, pair, receiver)


def encoded(number: int) -> bytes:
    """A message with every section set, as its sender encodes it."""
    message = Message(
        id=f"m-{number}",
        address="orders",
        subject="order",
        durable=True,
        priority=7,
        properties={"colour": "red", "number": number},
        annotations={symbol("x-opt-origin"): "test"},
        body={"order": number, "lines": [1, 2, 3]},
    )
    return cast(bytes, message.encode())


def send(sender: Sender, data: bytes, tag: str, settled: bool = False) -> Delivery:
    delivery = sender.delivery(tag)
    sender.send(data)
    sender.advance()
    if settled:
        delivery.settle()
    return delivery


def receive(receiver: Receiver) -> tuple[Delivery, bytes]:
    delivery = receiver.current
    assert delivery is not None and delivery.readable and not delivery.partial, "no complete transfer arrived"
    data = receiver.recv(delivery.pending)
    receiver.advance()
    return delivery, cast(bytes, data)


def content(data: Data) -> Any:
    """The value held in a terminus or disposition field (None if empty)."""
    data.rewind()
    return data.get_object() if data.next() is not None else None


# --- connections -------------------------------------------------------------------------------


def test_each_open_reaches_the_other_side_as_given(rig: Rig) -> None:
    """The client's open reaches the broker with its container id, hostname, properties and
    desired capabilities (less the relay qpid-flow provides); only then does the client get an
    open, the broker's: its container id, properties and capabilities, plus ANONYMOUS-RELAY."""
    pair = rig.connect()
    client = pair.client.connection
    client.container = "client-app-1"
    client.hostname = "vhost:v1"
    client.properties = {symbol("product"): "test-client", symbol("version"): "1.2.3"}
    client.desired_capabilities = SymbolList(["ANONYMOUS-RELAY", "DELAYED_DELIVERY"])
    client.open()
    rig.pump()
    broker = pair.broker.connection
    assert broker.remote_container == "client-app-1"
    assert broker.remote_hostname == "vhost:v1"
    assert broker.remote_properties == {"product": "test-client", "version": "1.2.3"}
    assert list(broker.remote_desired_capabilities) == ["DELAYED_DELIVERY"]
    assert client.state & Endpoint.REMOTE_UNINIT, "qpid-flow answered before the broker did"

    broker.container = "broker-7"
    broker.properties = {symbol("product"): "TestBroker", symbol("cluster-node"): 3}
    broker.offered_capabilities = SymbolList(["DELAYED_DELIVERY"])
    broker.open()
    rig.pump()
    assert client.state & Endpoint.REMOTE_ACTIVE
    assert client.remote_container == "broker-7"
    assert client.remote_properties == {"product": "TestBroker", "cluster-node": 3}
    assert set(client.remote_offered_capabilities) == {"DELAYED_DELIVERY", "ANONYMOUS-RELAY"}


def test_a_broker_close_reaches_its_client_with_the_condition_verbatim(rig: Rig) -> None:
    """The broker's close of one upstream connection closes that client's connection with the
    same condition (name, description, info); another client carries on."""
    pair = open_pair(rig)
    other = open_pair(rig, "client-2")
    broker = pair.broker.connection
    broker.condition = Condition("amqp:resource-limit-exceeded", "too many connections", {symbol("limit"): 10})
    broker.close()
    rig.pump()
    client = pair.client.connection
    assert client.state & Endpoint.REMOTE_CLOSED
    condition = client.remote_condition
    assert (condition.name, condition.description) == ("amqp:resource-limit-exceeded", "too many connections")
    assert condition.info == {"limit": 10}
    assert other.client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


def test_a_broker_connection_dropped_without_a_close_drops_its_client_the_same_way(rig: Rig) -> None:
    """The upstream transport just ends (no close frame): the client's connection ends the
    same way, as it would have connected directly (its own reconnect takes over); another
    client carries on."""
    pair = open_pair(rig)
    other = open_pair(rig, "client-2")
    pair.broker.transport.close_head()
    pair.broker.transport.close_tail()
    rig.pump()
    client = pair.client.connection
    assert not client.state & Endpoint.REMOTE_CLOSED, "a close frame was sent: the broker sent none"
    assert pair.client.transport.condition.name == "amqp:connection:framing-error"
    assert other.client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


def test_a_broker_lost_closes_its_clients_with_forced(rig: Rig) -> None:
    """The upstream transport ends without a close and the broker accepts no connection:
    the broker is gone, and the client is closed with amqp:connection:forced."""
    asked: list[BrokerAddress] = []

    def probe(broker: BrokerAddress, on_result: Callable[[bool], None]) -> None:
        asked.append(broker)
        on_result(False)

    rig.router.probe = probe
    pair = open_pair(rig)
    pair.broker.transport.close_head()
    pair.broker.transport.close_tail()
    rig.pump()
    assert asked == [BROKER]
    client = pair.client.connection
    assert client.state & Endpoint.REMOTE_CLOSED
    assert client.remote_condition.name == "amqp:connection:forced"


def test_transfers_sent_while_the_broker_s_loss_is_checked_get_no_outcome(rig: Rig) -> None:
    """Between the broker connection's end and the client's close (while a connect tells
    whether the broker is gone), the client still has credit and may send. Directly, the
    broker's loss would leave such transfers unsettled (the client resends them after its
    reconnect); through qpid-flow too, not released (a client takes released as final)."""
    answers: list[Callable[[bool], None]] = []
    rig.router.probe = lambda broker, on_result: answers.append(on_result)
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(10)
    rig.pump()
    before = send(sender, encoded(1), "t1")
    rig.pump()
    pair.broker.transport.close_head()
    pair.broker.transport.close_tail()
    rig.pump()
    assert answers, "the broker's loss is being checked"
    during = send(sender, encoded(2), "t2")
    rig.pump()
    assert not before.settled and not during.settled
    assert before.remote_state == 0 and during.remote_state == 0, "no outcome for either"
    answers[0](False)
    rig.pump()
    assert pair.client.connection.remote_condition.name == "amqp:connection:forced"
    assert not during.settled


# --- sessions -----------------------------------------------------------------------------------


def test_a_broker_end_reaches_that_session_only(rig: Rig) -> None:
    """The broker ends one session with amqp:precondition-failed: that client session ends
    with the same condition; the client's other session and another client stay open."""
    pair = open_pair(rig)
    doomed, doomed_at_broker = begin(rig, pair)
    kept_open, _ = begin(rig, pair)
    other = open_pair(rig, "client-2")
    other_session, _ = begin(rig, other)

    doomed_at_broker.condition = Condition("amqp:precondition-failed", "session quota", {symbol("quota"): 1})
    doomed_at_broker.close()
    rig.pump()
    assert doomed.state & Endpoint.REMOTE_CLOSED
    condition = doomed.remote_condition
    assert (condition.name, condition.description, condition.info) == (
        "amqp:precondition-failed",
        "session quota",
        {"quota": 1},
    )
    active = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
    assert kept_open.state == active
    assert other_session.state == active
    assert pair.client.connection.state == active
    assert other.client.connection.state == active


def _sessions(connection: Any) -> list[int]:
    """The states of the sessions Proton still holds on ``connection``."""
    states = []
    session = connection.session_head(0)
    while session is not None:
        states.append(session.state)
        session = session.next(0)
    return states


def test_a_session_begun_and_ended_in_one_write_is_answered_then_freed(rig: Rig) -> None:
    """The client's begin and end reach qpid-flow before the broker's begin: the upstream
    session ends once the broker has begun it (ended at once, Proton would take the
    broker's answer for an unknown channel and drop the connection), and is freed then,
    as any session ended both ways (it was kept, 1.7 kB each, for the connection's life)."""
    pair = open_pair(rig)
    broker = pair.broker.connection
    for _ in range(5):
        session = pair.client.connection.session()
        session.open()
        session.close()  # both in one write
        rig.pump()
        at_broker = broker.session_head(Endpoint.LOCAL_UNINIT)
        assert at_broker is not None
        at_broker.open()  # the broker's answer comes after the client's end
        rig.pump()
        at_broker = broker.session_head(Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_CLOSED)
        assert at_broker is not None, "qpid-flow ended the upstream session once it was begun"
        at_broker.close()
        rig.pump()
        # (Proton's client takes the answer for a session of the router's own: its begin
        # has no remote-channel, Proton having let the channel go; docs/behaviour.md.)
    still_open = pair.client.connection.session()
    still_open.open()
    rig.pump()
    assert pair.client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
    closed_both = Endpoint.LOCAL_CLOSED | Endpoint.REMOTE_CLOSED
    assert [state for state in _sessions(pair.upstream.connection) if state == closed_both] == []


def test_sessions_and_links_past_their_limits_are_refused_and_then_the_connection_closed() -> None:
    """max_sessions_per_connection and max_links_per_connection (1 each) in front of a
    broker, counted per connection: a session or link past the limit is refused with
    amqp:resource-limit-exceeded, never reaching the broker; a session the client ended
    frees its place; a second refusal the client has not answered closes the client's
    connection with amqp:resource-limit-exceeded, and its broker connection with it."""
    rig = Rig(
        config=build_config({"broker": BROKER.url, "max_sessions_per_connection": 1, "max_links_per_connection": 1})
    )
    pair = open_pair(rig)
    first, _ = begin(rig, pair)
    refused = pair.client.connection.session()
    refused.open()
    rig.pump()
    assert refused.remote_condition.name == "amqp:resource-limit-exceeded"
    first.close()  # its place is free (the broker's answer to the end does not matter here)
    rig.pump()
    session, _ = begin(rig, pair)
    consumer(rig, pair, session)
    second = session.receiver("second")
    second.source.address = "orders"
    second.open()
    rig.pump()
    assert second.remote_condition.name == "amqp:resource-limit-exceeded"
    with pytest.raises(AssertionError):
        broker_link(pair, "second")
    other = open_pair(rig, "client-2")
    with structlog.testing.capture_logs() as logs:
        again = pair.client.connection.session()
        again.open()  # a second refused session un-ended: past the rule
        rig.pump()
    client = pair.client.connection
    assert client.remote_condition.name == "amqp:resource-limit-exceeded"
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["connection_error"]
    assert pair.broker.connection.state & Endpoint.REMOTE_CLOSED
    assert other.client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


# --- attach ------------------------------------------------------------------------------------


def test_a_receiver_attach_reaches_the_broker_in_full_and_its_answer_comes_back(rig: Rig) -> None:
    """Every field of the client's source (filter, durable, expiry policy, distribution mode,
    dynamic, capabilities) and the link properties reach the broker; the broker's answer (a
    different filter and distribution mode, its own properties) is what the client sees."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver = session.receiver("orders-reader")
    source = receiver.source
    source.address = "orders"
    source.durability = Terminus.DELIVERIES
    source.expiry_policy = Terminus.EXPIRE_NEVER
    source.distribution_mode = Terminus.DIST_MODE_COPY
    source.dynamic = False
    source.filter.put_dict({symbol("colour"): Described(SELECTOR, "colour = 'red'")})
    source.capabilities.put_object(SymbolList(["queue"]))
    receiver.target.address = "client-1-in"
    receiver.properties = {symbol("paired"): True}
    receiver.open()
    rig.pump()

    at_broker = broker_link(pair, "orders-reader")
    assert at_broker.is_sender
    given = at_broker.remote_source
    assert given.address == "orders"
    assert given.durability == Terminus.DELIVERIES
    assert given.expiry_policy == Terminus.EXPIRE_NEVER
    assert given.distribution_mode == Terminus.DIST_MODE_COPY
    assert not given.dynamic
    assert content(given.filter) == {"colour": Described(SELECTOR, "colour = 'red'")}
    assert list(content(given.capabilities)) == ["queue"]
    assert at_broker.remote_target.address == "client-1-in"
    assert at_broker.remote_properties == {"paired": True}
    assert receiver.state & Endpoint.REMOTE_UNINIT, "qpid-flow answered before the broker did"

    at_broker.source.copy(given)
    at_broker.source.distribution_mode = Terminus.DIST_MODE_MOVE
    at_broker.source.filter.clear()
    at_broker.source.filter.put_dict({symbol("colour"): Described(SELECTOR, "colour = 'blue'")})
    at_broker.target.copy(at_broker.remote_target)
    at_broker.properties = {symbol("queue-type"): "quorum"}
    at_broker.open()
    rig.pump()
    assert receiver.state & Endpoint.REMOTE_ACTIVE
    answered = receiver.remote_source
    assert answered.address == "orders"
    assert answered.distribution_mode == Terminus.DIST_MODE_MOVE
    assert answered.durability == Terminus.DELIVERIES
    assert content(answered.filter) == {"colour": Described(SELECTOR, "colour = 'blue'")}
    assert receiver.remote_properties == {"queue-type": "quorum"}


def test_a_broker_refusal_reaches_the_client_with_its_condition(rig: Rig) -> None:
    """The broker answers an attach with a null source and detaches it with amqp:not-found:
    the client gets the null source, then the detach with the broker's condition."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver = session.receiver("missing-reader")
    receiver.source.address = "no-such-queue"
    receiver.open()
    rig.pump()
    refusal = broker_link(pair, "missing-reader")
    refusal.open()  # no source: the node does not exist
    refusal.condition = Condition("amqp:not-found", "no queue 'no-such-queue' in vhost 'v1'")
    refusal.close()
    rig.pump()
    assert receiver.remote_source.type == Terminus.UNSPECIFIED
    assert receiver.state & Endpoint.REMOTE_CLOSED
    condition = receiver.remote_condition
    assert (condition.name, condition.description) == ("amqp:not-found", "no queue 'no-such-queue' in vhost 'v1'")
    (detach,) = pair.client.received("detach")
    assert "closed=true" in detach
    assert session.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


# --- producers -----------------------------------------------------------------------------------


def test_producer_transfers_and_outcomes_pass_through(rig: Rig) -> None:
    """Transfers reach the broker byte for byte; the broker's rejected (with its condition)
    and released reach the client's deliveries, settled; a pre-settled transfer arrives
    pre-settled."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(10)
    rig.pump()
    first = send(sender, encoded(1), "t1")
    second = send(sender, encoded(2), "t2")
    send(sender, encoded(3), "t3", settled=True)
    rig.pump()

    rejected, data = receive(at_broker)
    assert data == encoded(1)
    released, data = receive(at_broker)
    assert data == encoded(2)
    presettled, data = receive(at_broker)
    assert data == encoded(3)
    assert not rejected.settled and not released.settled
    assert presettled.settled

    rejected.local.condition = Condition("amqp:precondition-failed", "queue is full")
    rejected.update(Delivery.REJECTED)
    rejected.settle()
    released.update(Delivery.RELEASED)
    released.settle()
    rig.pump()
    assert first.remote_state == Delivery.REJECTED
    assert first.settled
    condition = first.remote.condition
    assert (condition.name, condition.description) == ("amqp:precondition-failed", "queue is full")
    assert second.remote_state == Delivery.RELEASED
    assert second.settled


def test_a_dynamic_target_is_the_broker_s_to_answer_and_its_node_gets_the_transfers(rig: Rig) -> None:
    """A producer asking for a dynamic target (a JMS temporary queue's) reaches the broker
    as asked; the client gets the broker's answer with the node's name; its transfers go
    to that node and count on the destination the broker named. (RabbitMQ 3.10 refuses
    one: test_transparency.py.)"""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender = session.sender("temporary-writer")
    sender.target.dynamic = True
    sender.open()
    rig.pump()
    at_broker = broker_link(pair, "temporary-writer")
    assert at_broker.remote_target.dynamic and at_broker.remote_target.address is None
    at_broker.source.copy(at_broker.remote_source)
    at_broker.target.address = "temp-queue://broker-1:1"
    at_broker.open()
    rig.pump()
    assert sender.state & Endpoint.REMOTE_ACTIVE
    assert sender.remote_target.address == "temp-queue://broker-1:1"
    at_broker.flow(5)
    rig.pump()
    assert sender.credit > 0
    sent = send(sender, encoded(1), "t1")
    rig.pump()
    delivery, data = receive(at_broker)
    assert data == encoded(1)
    delivery.update(Delivery.ACCEPTED)
    delivery.settle()
    rig.pump()
    assert sent.remote_state == Delivery.ACCEPTED
    node = rig.destinations.find("temp-queue://broker-1:1")
    assert node is not None and node.enqueued_total == 1


def test_a_transactional_transfer_goes_to_the_broker_in_its_transaction_and_the_answer_comes_back(rig: Rig) -> None:
    """In front of a broker the broker runs transactions: the client's coordinator link and
    declare reach it; a transfer sent in the declared transaction reaches it with its
    transactional state (txn-id), and the broker's transactional outcome reaches the
    client as given. (Once, such a transfer was refused with amqp:transaction:unknown-id:
    qpid-flow looked the txn-id up among its own transactions.)"""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    coordinator = session.sender("txn-control")
    coordinator.target.type = Terminus.COORDINATOR
    coordinator_at_broker = attach(rig, pair, coordinator)
    coordinator_at_broker.flow(1)
    rig.pump()
    declare = send(coordinator, cast(bytes, Message(body=Described(ulong(0x31), [None])).encode()), "declare")
    rig.pump()
    declared, _data = receive(coordinator_at_broker)
    declared.local.data = [b"txn-7"]
    declared.update(0x33)  # declared
    declared.settle()
    rig.pump()
    assert declare.remote_state == 0x33 and declare.remote.data == [b"txn-7"]

    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(5)
    rig.pump()
    sent = send(sender, encoded(1), "t1")
    sent.local.data = [b"txn-7"]
    sent.update(0x34)  # transactional-state
    rig.pump()
    arrived, data = receive(at_broker)
    assert data == encoded(1)
    assert arrived.remote_state == 0x34 and arrived.remote.data == [b"txn-7"]
    arrived.local.data = [b"txn-7", Described(ulong(0x24), [])]  # accepted, in the transaction
    arrived.update(0x34)
    arrived.settle()
    rig.pump()
    assert sent.settled and sent.remote_state == 0x34
    txn_id, outcome = sent.remote.data
    assert (bytes(txn_id), int(outcome.descriptor)) == (b"txn-7", 0x24)

    refused = send(sender, encoded(2), "t2")
    refused.local.data = [b"txn-7"]
    refused.update(0x34)
    rig.pump()
    arrived, _data = receive(at_broker)
    error = Described(ulong(0x1D), [symbol("amqp:precondition-failed"), "not in this queue", None])
    arrived.local.data = [b"txn-7", Described(ulong(0x25), [error])]  # rejected, in the transaction
    arrived.update(0x34)
    arrived.settle()
    rig.pump()
    txn_id, outcome = refused.remote.data
    assert (bytes(txn_id), int(outcome.descriptor)) == (b"txn-7", 0x25)
    assert list(outcome.value[0].value)[:2] == ["amqp:precondition-failed", "not in this queue"]


@dataclass
class InFlight:
    """Three transfers a client's producer sent to 'orders', at the broker, unanswered."""

    rig: Rig
    pair: Pair
    session: Session
    broker_session: Session
    sender: Sender


def three_in_flight() -> InFlight:
    rig = unbounded_rig()
    pair = open_pair(rig)
    session, broker_session = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(10)
    rig.pump()
    for n in range(3):
        send(sender, encoded(n), f"t{n}")
    rig.pump()
    return InFlight(rig, pair, session, broker_session, sender)


def test_transfers_in_flight_when_their_producer_leaves_stay_in_the_depth() -> None:
    """Three transfers reach the broker; the client closes its link before the broker's
    outcomes. The broker keeps them (a detach takes nothing back): the depth keeps them.
    (They were released on the client's side and left the depth: an undercount by a
    window at every producer that left with transfers in flight.)"""
    flight = three_in_flight()
    rig, sender = flight.rig, flight.sender
    orders = rig.destinations.find("orders")
    assert orders is not None and orders.depth == 3
    sender.close()
    rig.pump()
    assert (orders.depth, orders.dequeued_total, orders.in_flight) == (3, 0, 0)


def test_transfers_in_flight_when_the_broker_ends_the_session_leave_the_depth() -> None:
    """Three transfers reach the broker; it ends the session before confirming them
    (RabbitMQ does for a transfer it refuses, and drops what it had not confirmed). They
    leave the depth: counted as kept, they stayed in it for good, and after enough of
    these flow control stopped producers of an empty queue."""
    flight = three_in_flight()
    rig, session, broker_session = flight.rig, flight.session, flight.broker_session
    orders = rig.destinations.find("orders")
    assert orders is not None and orders.depth == 3
    broker_session.condition = Condition("amqp:precondition-failed", "user_id does not match")
    broker_session.close()
    rig.pump()
    session.close()
    rig.pump()
    assert (orders.depth, orders.in_flight) == (0, 0)


def test_relayed_transfers_waiting_on_a_session_the_broker_ended_leave_the_counts() -> None:
    """An anonymous-relay producer's transfers wait for their upstream sender's attach when
    the broker ends the session (RabbitMQ does, for a relay-style send to a missing
    exchange): nothing more can go on it, so they leave the depth, the in-flight count and
    the memory at once. (They stayed counted until the client's connection closed: a false
    flow stop, and the memory limit creeping up.)"""
    rig = unbounded_rig()
    pair = open_pair(rig)
    session, broker_session = begin(rig, pair)
    anonymous = session.sender("anon")
    anonymous.open()
    rig.pump()
    for n in range(3):
        send(anonymous, cast(bytes, Message(address="orders", body=n).encode()), f"t{n}")
    rig.pump()
    orders = rig.destinations.find("orders")
    assert orders is not None and (orders.depth, orders.in_flight) == (3, 3)
    broker_session.condition = Condition("amqp:not-found", "no exchange 'x' in vhost 'v1'")
    broker_session.close()
    rig.pump()
    session.close()
    rig.pump()
    assert (orders.depth, orders.in_flight, rig.router.memory.held) == (0, 0, 0)


def test_a_transfer_the_client_aborts_gives_its_credit_back() -> None:
    """An aborted transfer goes no further, so the broker never sees it and its credit on
    the upstream link is untouched: the client gets the credit back. (It did not: after
    two aborts the client had none, the broker's two unused, and nothing granted again.)"""
    rig = unbounded_rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(2)
    rig.pump()
    for n in range(2):
        delivery = sender.delivery(f"a{n}")
        sender.send(encoded(n)[:20])
        rig.pump()
        delivery.abort()
        rig.pump()
    assert (sender.credit, at_broker.queued) == (2, 0)


def test_an_anonymous_relay_producer_keeps_at_most_64_upstream_senders() -> None:
    """A reply-to server sends to 70 one-off addresses: an upstream sender each, but past
    64 the least recently used idle one is detached (all 70 stayed attached for the life
    of the producer's link)."""
    from qpid_flow.amqp.linkroute import _RELAYS_PER_PRODUCER

    rig = unbounded_rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    anonymous = session.sender("replies")
    anonymous.open()
    rig.pump()
    for n in range(70):
        send(anonymous, cast(bytes, Message(address=f"reply.{n}", body=n).encode()), f"t{n}")
        rig.pump()
        opening = pair.broker.connection.link_head(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
        assert opening is not None, "no upstream sender attached for a new address"
        opening.source.copy(opening.remote_source)
        opening.target.copy(opening.remote_target)
        opening.open()
        opening.flow(10)
        rig.pump()
        delivery, _data = receive(cast(Receiver, opening))
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        rig.pump()
    detaches = pair.broker.received("detach")
    assert _RELAYS_PER_PRODUCER == 64 and len(detaches) == 70 - 64
    assert all("closed=true" not in detach for detach in detaches)  # detached, not closed


# --- consumers -----------------------------------------------------------------------------------


def test_consumer_credit_messages_and_outcomes_pass_through(rig: Rig) -> None:
    """The client's flow(5) is credit 5 at the broker; the broker's messages reach the client
    byte for byte; the client's modified (with its flags and annotations) and accepted reach
    the broker's deliveries, settled."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session)
    assert at_broker.credit == 0
    receiver.flow(5)
    rig.pump()
    assert at_broker.credit == 5

    sent_first = send(at_broker, encoded(1), "b1")
    sent_second = send(at_broker, encoded(2), "b2")
    rig.pump()
    first, data = receive(receiver)
    assert data == encoded(1)
    second, data = receive(receiver)
    assert data == encoded(2)

    first.local.failed = True
    first.local.undeliverable = False
    first.local.annotations = {symbol("x-opt-retry-reason"): "handler crashed"}
    first.update(Delivery.MODIFIED)
    first.settle()
    second.update(Delivery.ACCEPTED)
    second.settle()
    rig.pump()
    assert sent_first.remote_state == Delivery.MODIFIED
    assert sent_first.settled
    assert sent_first.remote.failed is True
    assert sent_first.remote.undeliverable is False
    assert sent_first.remote.annotations == {"x-opt-retry-reason": "handler crashed"}
    assert sent_second.remote_state == Delivery.ACCEPTED
    assert sent_second.settled


def test_a_transfer_the_broker_aborts_gives_the_broker_its_credit_back(rig: Rig) -> None:
    """The broker's aborted transfer used its credit, not the client's: the broker is
    given it back, and its next message reaches the client. (It was not: the link stalled.)"""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session)
    receiver.flow(1)
    rig.pump()
    aborted = at_broker.delivery("b0")
    at_broker.send(encoded(0)[:20])
    rig.pump()
    aborted.abort()
    rig.pump()
    assert (receiver.credit, receiver.queued, at_broker.credit) == (1, 0, 1)
    send(at_broker, encoded(1), "b1")
    rig.pump()
    assert receiver.queued == 1


def test_a_consumer_drain_is_answered_once_the_broker_drains(rig: Rig) -> None:
    """The client's drain reaches the broker; with no message to send the broker drains its
    credit, and only then does the client get its drain answer: credit 0, drain done."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session)
    receiver.flow(3)
    rig.pump()
    receiver.drain(0)
    rig.pump()
    assert at_broker.drain_mode
    assert at_broker.credit == 3
    assert "drain=true" in pair.broker.received("flow")[-1]
    assert receiver.draining(), "the client got its drain answer before the broker drained"

    at_broker.drained()
    rig.pump()
    assert receiver.credit == 0
    assert not receiver.draining()
    answer = pair.client.received("flow")[-1]
    assert "drain=true" in answer and "link-credit=0" in answer


def test_a_consumer_detach_is_passed_on_and_answered_as_the_broker_answers(rig: Rig) -> None:
    """A consumer detaching with credit outstanding: the detach goes to the broker at once
    (no drain: RabbitMQ ends the session of a receiver that drains), and the client gets
    the broker's answer, in the broker's mode: RabbitMQ answers a closing detach with a
    non-closing one, and so does qpid-flow, only once the broker has answered."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session)
    receiver.flow(5)
    rig.pump()
    send(at_broker, encoded(1), "b1")
    rig.pump()
    delivery, _ = receive(receiver)
    delivery.update(Delivery.ACCEPTED)
    delivery.settle()
    receiver.close()
    rig.pump()
    (detach,) = pair.broker.received("detach")
    assert "closed=true" in detach
    assert not any("drain=true" in flow for flow in pair.broker.received("flow"))
    assert pair.client.received("detach") == [], "the client was answered before the broker answered"
    at_broker.detach()  # RabbitMQ's answer to a closing detach: a non-closing one
    rig.pump()
    (answer,) = pair.client.received("detach")
    assert "closed=true" not in answer
    assert rig.group_reader.calls == []


class SettledMessages:
    """Records what plugins hear of mirrored consumers' messages."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, int, str | None]] = []

    @hookimpl
    def qpid_flow_message_delivered(self, message: Fetched) -> None:
        self.heard.append(("delivered", message.delivery_count, None))

    @hookimpl
    def qpid_flow_message_settled(self, message: Fetched, consumer: Any, settlement: Any) -> None:
        self.heard.append(("settled", message.delivery_count, f"{settlement.outcome.value} by {consumer}"))


def test_a_consumer_gone_with_messages_unsettled_tells_plugins_they_went_back() -> None:
    """Its connection lost with a message unsettled: the broker gets it back, and plugins
    (the event log's settle) hear it released by nobody, as a standalone queue tells them.
    (They heard nothing: the log had its deliver and no settle.) The broker's second
    delivery of it is delivery 2, as its header says."""
    heard = SettledMessages()
    rig = Rig(config=build_config({"broker": BROKER.url, "default_max_size": 0}), plugins=[heard])
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session)
    receiver.flow(5)
    rig.pump()
    send(at_broker, encoded(1), "b1")
    rig.pump()
    receive(receiver)
    assert heard.heard == [("delivered", 1, None)]
    pair.client.transport.close_head()  # the client's connection dropped
    pair.client.transport.close_tail()
    rig.pump()
    assert heard.heard == [("delivered", 1, None), ("settled", 1, "released by None")]
    orders = rig.destinations.find("orders")
    assert orders is not None and orders.released == 1

    again = open_pair(rig, "client-2")
    session, _ = begin(rig, again)
    receiver, at_broker = consumer(rig, again, session)
    receiver.flow(5)
    rig.pump()
    redelivered = Message(body=1, delivery_count=1)
    send(at_broker, redelivered.encode(), "b2")
    rig.pump()
    assert heard.heard[-1] == ("delivered", 2, None)
    # Released, then delivered again by RabbitMQ: delivery-count unchanged (AMQP does
    # not count a release), first-acquirer false. (It read 1, as a first delivery.)
    body = Message(body=1).encode()
    # A header of durable, priority, ttl (null) and first-acquirer (false, then true), as
    # RabbitMQ writes it (Proton's Message leaves a false first-acquirer out).
    send(at_broker, b"\x00\x53\x70\xc0\x05\x04\x40\x40\x40\x42" + body, "b3")
    rig.pump()
    assert heard.heard[-1] == ("delivered", 2, None)
    send(at_broker, b"\x00\x53\x70\xc0\x05\x04\x40\x40\x40\x41" + body, "b4")
    rig.pump()
    assert heard.heard[-1] == ("delivered", 1, None)


def grouped_rig() -> Rig:
    return Rig(
        config=build_config({"broker": BROKER.url, "destinations": {"orders": {"shared_groups": True}}}),
    )


def grouped_consumer(rig: Rig, name: str) -> tuple[Pair, Receiver]:
    """A client in the reader's vhost attaching consumer ``name`` to grouped ``orders``."""
    pair = open_pair(rig, hostname="vhost:v1")
    session, _ = begin(rig, pair)
    receiver = session.receiver(name)
    receiver.source.address = "orders"
    receiver.open()
    rig.pump()
    return pair, receiver


def set_shared_groups(rig: Rig, on: bool) -> None:
    """An operator turns message groups on or off for ``orders`` at runtime."""
    from qpid_flow.admin.operations import Operations

    Operations(rig.destinations, cast(Any, None), rig.router).add_destination("orders", {"shared_groups": on})
    rig.pump()


def echo_probe(rig: Rig, pair: Pair, name: str) -> Link:
    """The broker answers the probe of grouped consumer ``name`` with an echo of its attach."""
    probe = broker_link(pair, name)
    probe.source.copy(probe.remote_source)
    probe.target.copy(probe.remote_target)
    probe.open()
    rig.pump()
    return probe


def test_a_grouped_destination_s_consumer_is_answered_with_the_selector_and_mode_qpid_flow_applies() -> None:
    """On a shared_groups destination qpid-flow's own reader and dispatch serve the
    consumers: the broker only checks the right to read (a probe). Its echo of the
    probe's filter and distribution mode is not what is in force: the client is told the
    selector and browse mode qpid-flow applies, and they are applied (a browser sees the
    red message only, pre-settled, and takes nothing). Once, the broker's echo came back
    and neither was applied: a browser took messages, a selector let everything through."""
    rig = grouped_rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver = session.receiver("orders-browser")
    receiver.source.address = "orders"
    receiver.source.distribution_mode = Terminus.DIST_MODE_COPY
    receiver.source.filter.put_dict(
        {symbol("colour"): Described(SELECTOR, "colour = 'red'"), symbol("other"): Described(symbol("x:y"), "z")}
    )
    receiver.open()
    rig.pump()
    echo_probe(rig, pair, "orders-browser")  # an echo of everything, as Artemis does
    answered = receiver.remote_source
    assert answered.distribution_mode == Terminus.DIST_MODE_COPY
    assert content(answered.filter) == {"colour": Described(SELECTOR, "colour = 'red'")}
    assert receiver.remote_snd_settle_mode == Link.SND_SETTLED
    destination = rig.destinations.find("orders")
    assert destination is not None and len(destination.browsers) == 1
    receiver.flow(10)
    rig.pump()
    for colour in ("blue", "red"):
        destination.enqueue(Fetched(cast(bytes, Message(properties={"colour": colour}).encode()), "orders"))
    rig.pump()
    delivery = receiver.current
    assert delivery is not None and delivery.settled
    seen = Message()
    seen.decode(receiver.recv(delivery.pending))
    assert seen.properties == {"colour": "red"}
    receiver.advance()
    assert receiver.current is None  # the blue one was not for it
    assert len(destination.queue) == 2  # browsing takes nothing


def test_a_grouped_destination_s_consumer_in_another_vhost_is_refused() -> None:
    """qpid-flow's reader reads a grouped queue in the broker URL's vhost (v1). A consumer
    connected in vhost "tenant" was checked by the broker against tenant's queue, then fed
    v1's messages by the reader, whatever its rights in v1. It is now refused, and the
    broker is not asked; a destination without shared_groups is mirrored as before."""
    rig = grouped_rig()
    pair = open_pair(rig, hostname="vhost:tenant")
    session, _ = begin(rig, pair)
    grouped_consumer = session.receiver("orders-elsewhere")
    grouped_consumer.source.address = "orders"
    grouped_consumer.open()
    plain_consumer = session.receiver("plain-elsewhere")
    plain_consumer.source.address = "plain"
    plain_consumer.open()
    rig.pump()
    assert grouped_consumer.state & Endpoint.REMOTE_CLOSED
    assert grouped_consumer.remote_condition.name == "amqp:not-allowed"
    assert "'tenant'" in grouped_consumer.remote_condition.description
    with pytest.raises(AssertionError):
        broker_link(pair, "orders-elsewhere")
    assert rig.group_reader.calls == []
    assert broker_link(pair, "plain-elsewhere").remote_source.address == "plain"


def test_a_grouped_destination_s_consumer_in_the_readers_vhost_is_served() -> None:
    """The same consumer in the broker URL's vhost (written ``vhost:v1``) is mirrored as a
    probe: the broker checks its right to read."""
    rig = grouped_rig()
    pair, receiver = grouped_consumer(rig, "orders-here")
    assert not receiver.state & Endpoint.REMOTE_CLOSED
    assert broker_link(pair, "orders-here").remote_source.address == "orders"


def test_a_bad_selector_on_a_grouped_destination_is_refused_whatever_the_broker_says() -> None:
    rig = grouped_rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver = session.receiver("orders-bad")
    receiver.source.address = "orders"
    receiver.source.filter.put_dict({symbol("s"): Described(SELECTOR, "colour = = 'x'")})
    receiver.open()
    rig.pump()
    probe = echo_probe(rig, pair, "orders-bad")  # RabbitMQ ignores a selector it does not apply
    assert receiver.state & Endpoint.REMOTE_CLOSED
    assert receiver.remote_condition.name == "amqp:invalid-field"
    assert probe.state & Endpoint.REMOTE_CLOSED


# --- the guard ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "act"),
    [
        ("_attach_consumer", "attach"),  # a Proton event (link remote open)
        ("_consumer_credit", "flow"),  # a lean LinkFlowEvent
        ("_client_outcome", "settle"),  # a lean DeliveryEvent
    ],
)
def test_a_router_error_closes_that_client_only(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, method: str, act: str
) -> None:
    """A BrokerRouter handler that raises on one client's event (a Proton event, a lean flow
    or delivery event) closes that client's connection with amqp:internal-error, its broker
    connection following once the client answers; another client's traffic carries on."""
    pair = open_pair(rig)
    other = open_pair(rig, "client-2")
    session, _ = begin(rig, pair)
    receiver = session.receiver("orders-reader")
    receiver.source.address = "orders"
    if act != "attach":
        at_broker = attach(rig, pair, receiver)
        receiver.flow(1 if act == "settle" else 0)
        rig.pump()
        if act == "settle":
            send(at_broker, encoded(1), "b1")
            rig.pump()
            delivery, _ = receive(receiver)
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
    failed = fail_next(rig.router, method, monkeypatch)
    with structlog.testing.capture_logs() as logs:
        if act == "attach":
            receiver.open()
        elif act == "flow":
            receiver.flow(2)
        rig.pump()
    assert failed == [method]
    assert [entry["event"] for entry in logs if entry["log_level"] == "error"] == ["handler_error"]
    client = pair.client.connection
    assert client.state & Endpoint.REMOTE_CLOSED
    assert client.remote_condition.name == "amqp:internal-error"
    client.close()  # the client answers: its broker connection goes too
    rig.pump()
    assert pair.broker.connection.state & Endpoint.REMOTE_CLOSED

    other_session, _ = begin(rig, other)
    other_receiver, at_broker = consumer(rig, other, other_session)
    other_receiver.flow(1)
    rig.pump()
    send(at_broker, encoded(7), "b7")
    rig.pump()
    _, data = receive(other_receiver)
    assert data == encoded(7)
    assert other.client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


def test_producer_credit_never_exceeds_the_brokers() -> None:
    """A producer gets no credit before the broker gives some, then no more than the broker's
    credit on the upstream link, though the credit policy would give 100 (no size limit set)."""
    rig = unbounded_rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    assert sender.credit == 0
    at_broker.flow(3)
    rig.pump()
    assert sender.credit == 3
    at_broker.flow(2)
    rig.pump()
    assert sender.credit == 5


def test_producer_credit_before_the_brokers_with_default_limits() -> None:
    """The same with the default configuration (flow limits by size: one credit at a time)."""
    rig = Rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, _ = producer(rig, pair, session)
    assert sender.credit == 0


def test_broker_outcomes_reach_the_producer_as_given() -> None:
    """The broker's rejected keeps its error info, its modified its message annotations."""
    rig = Rig()
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(10)
    rig.pump()
    first = send(sender, encoded(1), "t1")
    second = send(sender, encoded(2), "t2")
    rig.pump()
    rejected, _ = receive(at_broker)
    modified, _ = receive(at_broker)
    rejected.local.condition = Condition("amqp:precondition-failed", "queue is full", {symbol("queue"): "orders"})
    rejected.update(Delivery.REJECTED)
    rejected.settle()
    modified.local.failed = True
    modified.local.undeliverable = True
    modified.local.annotations = {symbol("x-opt-why"): "later"}
    modified.update(Delivery.MODIFIED)
    modified.settle()
    rig.pump()
    assert first.remote.condition.info == {"queue": "orders"}
    assert second.remote_state == Delivery.MODIFIED
    assert second.remote.annotations == {"x-opt-why": "later"}


def test_consumers_reading_the_broker_are_detached_when_groups_are_turned_on_at_runtime(rig: Rig) -> None:
    """shared_groups turned on by an operator while a consumer reads the broker's queue
    directly: it is detached with amqp:link:detach-forced (its client attaches again, to
    qpid-flow's reader), and its upstream link closes (the broker gets its unsettled
    messages back). (It stayed mirrored: it and a consumer served by groups both held
    messages of one group.)"""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session)
    orders = rig.destinations.find("orders")
    assert orders is not None and len(orders.mirrored) == 1
    set_shared_groups(rig, True)
    assert receiver.remote_condition is not None
    assert receiver.remote_condition.name == "amqp:link:detach-forced"
    assert at_broker.state & Endpoint.REMOTE_CLOSED
    assert not orders.mirrored


def test_the_readers_consumers_are_detached_when_groups_are_turned_off_at_runtime() -> None:
    """shared_groups turned off while a consumer is served by qpid-flow's reader: it is
    detached with amqp:link:detach-forced (its client attaches again, reading the broker's
    queue directly), and the reader, with no consumer left, is told (it gives the broker
    back what it fetched). It stayed attached: what the reader had fetched waited for it
    while new consumers, reading the broker, got none of it."""
    rig = grouped_rig()
    pair, receiver = grouped_consumer(rig, "orders-grouped")
    echo_probe(rig, pair, "orders-grouped")
    orders = rig.destinations.find("orders")
    assert orders is not None and len(orders.consumers) == 1
    set_shared_groups(rig, False)
    assert receiver.remote_condition is not None
    assert receiver.remote_condition.name == "amqp:link:detach-forced"
    assert not orders.consumers
    assert ("consumer_detached", "orders") in cast(StubGroupReader, rig.group_reader).calls


def test_a_broker_behind_a_proxy_that_still_takes_connections_is_lost_all_the_same(rig: Rig) -> None:
    """A proxy (HAProxy) in front of a broker that is gone takes TCP connections: the
    connect says reachable, but the reader's own connection is lost too, so the client is
    closed with amqp:connection:forced. (It was dropped bare, as for one connection the
    broker dropped on purpose.)"""
    rig.router.probe = lambda broker, on_result: on_result(True)
    pair = open_pair(rig)
    rig.group_reader.connected = False
    rig.group_reader.broker_lost = True
    pair.broker.transport.close_head()
    pair.broker.transport.close_tail()
    rig.pump()
    client = pair.client.connection
    assert client.state & Endpoint.REMOTE_CLOSED
    assert client.remote_condition.name == "amqp:connection:forced"


def test_a_reader_that_never_reached_the_broker_is_no_sign_the_broker_is_gone(rig: Rig) -> None:
    """The --broker URL's user is refused (clients sign in as themselves, no grouped
    destination): qpid-flow's own connection never opened. A client's broker connection
    dropped while a connect still reaches the broker is dropped the same way, the depths
    kept. (It was closed with amqp:connection:forced and the depths reset.)"""
    rig.router.probe = lambda broker, on_result: on_result(True)
    pair = open_pair(rig)
    rig.group_reader.connected = False
    orders = rig.destinations.get("orders")
    assert orders is not None
    orders.depth = 11
    pair.broker.transport.close_head()
    pair.broker.transport.close_tail()
    rig.pump()
    assert not pair.client.connection.state & Endpoint.REMOTE_CLOSED, "closed with a close frame"
    assert orders.depth == 11


def test_a_broker_lost_restarts_the_depths_qpid_flow_counted_in_it(rig: Rig) -> None:
    """17 messages passed through to 'orders', then the broker is gone (a restart empties
    RabbitMQ's non-durable queues): the depth restarts from what qpid-flow holds (none),
    so a destination stopped on those 17 is not stopped for good. (It stayed at 17, and
    new producers got no credit until qpid-flow itself restarted.) A destination whose
    broker figure a plugin reads keeps its count for the plugin to correct."""
    rig.router.probe = lambda broker, on_result: on_result(False)
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender, at_broker = producer(rig, pair, session)
    at_broker.flow(20)
    rig.pump()
    for n in range(17):
        delivery = send(sender, encoded(n), f"t{n}")
        rig.pump()
        arrived, _data = receive(at_broker)
        arrived.update(Delivery.ACCEPTED)
        arrived.settle()
        rig.pump()
        assert delivery.remote_state == Delivery.ACCEPTED
    orders = rig.destinations.find("orders")
    read = rig.destinations.get("read-by-a-plugin")
    assert orders is not None and read is not None and orders.depth == 17
    read.depth = 5
    read.set_broker_backlog(5)
    pair.broker.transport.close_head()
    pair.broker.transport.close_tail()
    rig.pump()
    assert pair.client.connection.remote_condition.name == "amqp:connection:forced"
    assert (orders.depth, orders.bytes) == (0, 0)
    assert read.depth == 5


def test_a_policy_given_as_a_rabbitmq_address_applies_to_the_queue_it_names() -> None:
    """In front of RabbitMQ, ``config add destination /queue/rt`` is about queue ``rt``,
    which clients' /queue/rt and rt both name. (The policy was kept under '/queue/rt': it
    matched no destination, made a phantom one, and rt's producers were not held.)"""
    from qpid_flow.admin.operations import Operations

    rig = Rig(config=build_config({"broker": BROKER.url, "broker_dialect": "rabbitmq"}))
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    producer(rig, pair, session, "/queue/rt")
    operations = Operations(rig.destinations, cast(Any, None), rig.router)
    record = operations.add_destination("/queue/rt", {"max_count": 100})
    assert record["name"] == "rt"
    rt = rig.destinations.find("rt")
    assert rt is not None and rt.policy.max_count == 100
    assert rig.destinations.find("/queue/rt") is None
    assert operations.remove_destination("/queue/rt")["name"] == "rt"


def test_freeing_a_session_the_broker_ended_sends_it_no_settlement() -> None:
    """The broker ends a session with transfers in flight on it: qpid-flow answers the end
    and frees the session, which settles those transfers locally. The broker hears no
    disposition of them: freed in the turn of the end, Proton wrote a bare settlement for
    each before qpid-flow's end frame."""
    flight = three_in_flight()
    rig, pair, session, broker_session = flight.rig, flight.pair, flight.session, flight.broker_session
    broker_session.condition = Condition("amqp:precondition-failed", "user_id does not match")
    broker_session.close()
    rig.pump()
    session.close()  # the client answers the end it was passed: qpid-flow then answers the broker's
    rig.pump()
    assert pair.broker.received("disposition") == []
    assert pair.broker.received("end"), "qpid-flow did not answer the end"


@pytest.mark.parametrize("how", ["configured", "the reader's"])
def test_an_operator_s_rabbitmq_address_is_mapped_before_any_client_connects(how: str) -> None:
    """The dialect known before a client's connection has reached the broker: configured
    (broker_dialect = "rabbitmq"), or found by qpid-flow's own reader. (It was learnt from
    a client's upstream open only: a boot-time 'config add destination /queue/rt' made a
    policy for a phantom '/queue/rt'.)"""
    from qpid_flow.admin.operations import Operations
    from qpid_flow.core.dialect import RABBITMQ

    setting = "rabbitmq" if how == "configured" else "auto"
    rig = Rig(config=build_config({"broker": BROKER.url, "broker_dialect": setting}))
    if how == "the reader's":
        rig.group_reader.dialect = RABBITMQ
    operations = Operations(rig.destinations, cast(Any, None), rig.router)
    assert operations.add_destination("/queue/rt", {"max_count": 100})["name"] == "rt"


def test_an_address_looked_up_before_the_dialect_was_known_is_mapped_once_it_is() -> None:
    """broker_dialect = "auto": until the broker is reached names are taken as given, and
    once the reader has reached it /queue/qq is qq. (The name looked up first stayed
    cached as given for good, while any other /queue/X was mapped.)"""
    from qpid_flow.core.dialect import RABBITMQ

    rig = Rig(config=build_config({"broker": BROKER.url, "broker_dialect": "auto"}))
    assert rig.router.destination_name("/queue/qq") == "/queue/qq"
    rig.group_reader.dialect = RABBITMQ
    assert rig.router.destination_name("/queue/qq") == "qq"
    assert rig.router.destination_name("/queue/other") == "other"


@pytest.mark.parametrize(
    ("client", "pending", "upstream", "added", "then"),
    [
        (10, 0, 0, 10, 10),  # the client's credit goes up as it is
        (10, 3, 2, 5, 7),  # less what waits here and what the broker still has
        (0, 5, -7, 7, 0),  # the broker sent 7 beyond its credit: back to 0, never below
        (1, 0, -6, 7, 1),
        (2, 5, 1, -1, 0),  # more waits here than the client wants: the broker gets none
        (0, 0, 4, -4, 0),  # the client took back its credit: so does the broker's link
        (3, 1, 5, -3, 2),
    ],
)
def test_the_upstream_credit_never_goes_out_below_zero(
    client: int, pending: int, upstream: int, added: int, then: int
) -> None:
    """RabbitMQ sends beyond credit, leaving the upstream link's credit negative; a top-up
    that left it negative went to the broker as link-credit 0xfffffffb (about 4.29
    billion), and RabbitMQ pushed the whole queue into qpid-flow's memory (found by a
    review: 4,000 of 4,000 messages taken from other consumers, RSS +100 MB)."""
    from qpid_flow.amqp.linkroute import upstream_credit_change

    assert upstream_credit_change(client, pending, upstream) == added
    assert upstream + added == then


def test_a_consumer_settling_without_an_outcome_leaves_the_depth_as_rabbitmq_keeps_the_message() -> None:
    """The settlement goes to the broker as it came (RabbitMQ applies its default outcome,
    released, and ends the session): the message stays in the depth, and nothing is
    counted acknowledged. (It was counted accepted and taken out of the depth, while the
    broker still held it: depth 0 against 20 in the broker, 'acknowledged' 20.)"""
    rig = Rig(config=build_config({"broker": BROKER.url, "broker_dialect": "rabbitmq"}))
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session, "/queue/orders")
    orders = rig.destinations.find("orders")
    assert orders is not None
    orders.depth = 1
    receiver.flow(1)
    rig.pump()
    send(at_broker, encoded(1), "b1")
    rig.pump()
    got, _data = receive(receiver)
    got.settle()  # no outcome
    rig.pump()
    assert (orders.depth, orders.stats()["acknowledged"]) == (1, 0)


def test_bytes_leave_with_the_depth_whatever_encoding_the_broker_delivers() -> None:
    """RabbitMQ re-encodes what it delivers: the bytes a consumer got were subtracted from
    bytes counted in at the producer's encoding, and the destination's bytes drifted from
    its backlog (a review measured 4,004 bytes counted for 100 messages of 44.5 bytes; a
    broker that delivers fewer bytes than were sent leaves bytes with the queue empty,
    held against flow_stop_size). The backlog's average size leaves with each message
    instead: here 100 of the 200, then the rest."""
    rig = Rig(config=build_config({"broker": BROKER.url, "broker_dialect": "rabbitmq"}))
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    receiver, at_broker = consumer(rig, pair, session, "/queue/orders")
    orders = rig.destinations.find("orders")
    assert orders is not None
    orders.depth, orders.bytes = 2, 200  # as two producers' 100-byte messages counted in
    receiver.flow(2)
    rig.pump()
    delivered = encoded(1)
    for tag in ("b1", "b2"):
        send(at_broker, delivered, tag)
    rig.pump()
    remaining = []
    for _ in range(2):
        got, _data = receive(receiver)
        got.update(Delivery.ACCEPTED)
        got.settle()
        rig.pump()
        remaining.append((orders.depth, orders.bytes))
    assert remaining == [(1, 100), (0, 0)]


def test_a_producer_s_source_reaches_the_broker_and_its_answer_the_client(rig: Rig) -> None:
    """A producer's source has no address (its capabilities, say what a JMS client asks
    for): Proton took it for no source, and neither the broker nor, in the answer, the
    client got one (directly, RabbitMQ answers a source)."""
    pair = open_pair(rig)
    session, _ = begin(rig, pair)
    sender = session.sender("writer")
    capabilities = sender.source.capabilities
    capabilities.put_array(False, Data.SYMBOL)
    capabilities.enter()
    capabilities.put_symbol("queue")
    capabilities.exit()
    sender.target.address = "orders"
    attach(rig, pair, sender)
    sent, answered = pair.broker.received("attach")[0], pair.client.received("attach")[0]
    assert "source=@source(40)" in sent and ":queue" in sent
    assert "source=@source(40)" in answered


def test_the_memory_gauge_counts_the_bytes_in_use_not_the_transfers_held(rig: Rig) -> None:
    """qpid_flow_memory_bytes is 'counted against memory_limit'. Transfers held unforwarded
    are held bytes but not in use: counted, the gauge read 5 x the limit with nothing over
    it, and the shipped QpidFlowMemoryNearLimit alert fired."""
    from qpid_flow.admin.operations import Operations

    memory = MemoryMeter(limit=20480)
    memory.add(5000)
    memory.hold(100_000)
    operations = Operations(rig.destinations, cast(Any, SimpleNamespace(memory=memory)), rig.router)
    snapshot = operations.snapshot()
    assert (snapshot.memory_bytes, snapshot.memory_over) == (5000, False)


def test_a_subject_naming_rabbitmqs_direct_reply_to_is_not_routed_into_a_depth(rig: Rig) -> None:
    """A reply sent to /queue with the subject amq.rabbitmq.reply-to.X goes to the
    requester's channel; RabbitMQ stores nothing. The reply name's destination (known to
    the broker: a producer had a link to it) gained a depth that never went down."""
    from qpid_flow.core.dialect import RABBITMQ

    router = rig.router
    router._dialect_found(RABBITMQ)
    reply_name, queue_name = "amq.rabbitmq.reply-to.g1h2AA5y", "orders"
    for name in (reply_name, queue_name):
        destination = rig.destinations.get(name)
        assert destination is not None
        destination.at_broker = True
    for subject, routed in ((reply_name, "/queue"), (queue_name, queue_name)):
        data = Message(subject=subject, body="reply").encode()
        assert router.routed_address("/queue", data) == routed, subject


def test_an_array_in_a_clients_connection_properties_leaves_the_others_to_reach_the_broker(rig: Rig) -> None:
    """An entry holding an array is left out (Proton cannot re-encode a malformed one
    safely); the client's product and version still reach the broker (all were dropped)."""
    pair = rig.connect()
    caps = Array(UNDESCRIBED, Data.SYMBOL, symbol("a"), symbol("b"))
    pair.client.connection.properties = {symbol("product"): "my-client", symbol("version"): "1.0", symbol("caps"): caps}
    pair.client.connection.open()
    rig.pump()
    assert pair.broker.connection.remote_properties == {symbol("product"): "my-client", symbol("version"): "1.0"}
