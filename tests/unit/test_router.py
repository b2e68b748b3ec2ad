"""The standalone Router (router.py) in memory: events in, commands out.

In the spirit of mitmproxy's sans-IO layer tests (its Playbook): no socket, no process. Each
client is two real Proton engine ends (:mod:`tests.unit.proton_pairs`): the client, played by
the test, and qpid-flow's client-facing connection (server, no SASL: the gate did it), whose
events reach the router the way ``RelayContainer.process`` hands them over. Everything else
is the real thing, assembled as server.py assembles it: the built-in plugins, the
destinations, the StandaloneBackend, a RouterControl (whose timers and thread calls the rig
runs between events, as the reactor would).

A test plays the client (:class:`Client`: attach a sender, send, attach a receiver with
credit, settle, detach), :meth:`Rig.pump` carries bytes and events until all is quiet, and the
test asserts on what came out: the frames qpid-flow wrote (:meth:`Client.commands`: flow with
the credit granted, dispositions with their outcome, transfers in order, detach and close with
their condition) and what plugins see (destination depth, hooks called).
"""

from __future__ import annotations

import itertools
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import structlog
from proton import (
    Collector,
    Condition,
    Delivery,
    Endpoint,
    Link,
    Message,
    Receiver,
    Sender,
    Session,
    SymbolList,
    Terminus,
    symbol,
)

from qpid_flow import hookimpl
from qpid_flow.amqp.bridge import ReactorBridge
from qpid_flow.amqp.router import Router
from qpid_flow.config import RouterConfig, build_config
from qpid_flow.core.destination import Destination
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Consumer, Producer, Reject, Settlement
from qpid_flow.core.registry import Destinations
from qpid_flow.core.standalone import StandaloneBackend
from qpid_flow.plugin.control import RouterControl
from qpid_flow.plugin.manager import BUILTIN_PLUGINS, Hooks, build_plugin_manager
from tests.unit.faults import fail_next
from tests.unit.proton_pairs import End, dispatch, move_bytes

# Seed 003 (Qpid C++ broker producer flow control): max 1000 messages, stop above 900,
# resume below 500.
SEED_003 = {"orders": {"max_count": 1000, "flow_stop_count": 900, "flow_resume_count": 500}}


# --- the frames qpid-flow writes ---------------------------------------------------------------


@dataclass
class Frame:
    """One frame qpid-flow wrote to a client, as Proton's trace shows it."""

    kind: str  # the performative: "attach", "flow", "transfer", "disposition", "detach"...
    text: str
    link: str | None = None  # the name of the link it is about (flow, transfer, detach, attach)

    def field(self, name: str) -> str | None:
        found = re.search(rf"[\[ ]{re.escape(name)}=(\"[^\"]*\"|[^,\]\s]+)", self.text)
        return found.group(1) if found else None

    def number(self, name: str) -> int:
        value = self.field(name)
        assert value is not None, f"no {name} in {self.text}"
        return int(value, 0)

    @property
    def state(self) -> str | None:
        """A disposition's outcome: "accepted", "rejected", "released", "modified"."""
        found = re.search(r"state=@([\w-]+)\(", self.text)
        return found.group(1) if found else None

    @property
    def condition(self) -> str | None:
        found = re.search(r'condition=:"([^"]*)"', self.text)
        return found.group(1) if found else None

    @property
    def settled(self) -> bool:
        return self.field("settled") == "true"

    def __repr__(self) -> str:
        return self.text


def parse_frames(lines: Iterable[str]) -> list[Frame]:
    """The frames among ``lines`` (an End's trace) that the other end wrote (``<-``)."""
    frames = []
    for line in lines:
        found = re.search(r" <- @([\w-]+)\(\d+\)", line)
        if found:
            frames.append(Frame(found.group(1), line))
    return frames


# --- the rig ------------------------------------------------------------------------------------


class Timers:
    """RouterControl's scheduler, standing in for the reactor's timers: a callback scheduled
    with delay 0 runs once the current event is handled (:meth:`Rig.pump` runs it); later ones
    wait in ``later`` until a test fires them."""

    def __init__(self) -> None:
        self.due: list[Callable[[], Any]] = []
        self.later: list[tuple[float, Callable[[], Any]]] = []

    def schedule(self, delay: float, callback: Callable[[], Any]) -> None:
        if delay <= 0:
            self.due.append(callback)
        else:
            self.later.append((delay, callback))

    def run_due(self) -> int:
        ran = 0
        while self.due:
            self.due.pop(0)()
            ran += 1
        return ran


class FakeBridge:
    """What RouterControl uses of ReactorBridge: ``call_soon`` (run by the rig's pump)."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], Any]] = []

    def call_soon(self, callback: Callable[[], Any]) -> None:
        self.calls.append(callback)

    def run(self) -> int:
        ran = 0
        while self.calls:
            self.calls.pop(0)()
            ran += 1
        return ran


class Recorder:
    """A plugin that notes the notifications the router and the destinations send."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    @hookimpl
    def qpid_flow_producer_attached(self, producer: Producer, destination: Destination | None) -> None:
        self.calls.append(("producer_attached", producer.name, destination.address if destination else None))

    @hookimpl
    def qpid_flow_producer_detached(self, producer: Producer, destination: Destination | None) -> None:
        self.calls.append(("producer_detached", producer.name, destination.address if destination else None))

    @hookimpl
    def qpid_flow_consumer_attached(self, consumer: Consumer, destination: Destination) -> None:
        self.calls.append(("consumer_attached", consumer.name, destination.address))

    @hookimpl
    def qpid_flow_consumer_detached(self, consumer: Consumer, destination: Destination) -> None:
        self.calls.append(("consumer_detached", consumer.name, destination.address))

    @hookimpl
    def qpid_flow_transfer_settled(self, producer: Producer, settlement: Settlement) -> None:
        self.calls.append(("transfer_settled", producer.name, settlement.outcome.value))

    @hookimpl
    def qpid_flow_group_assigned(self, group: str, consumer: Consumer) -> None:
        self.calls.append(("group_assigned", group, consumer.name))

    @hookimpl
    def qpid_flow_group_released(self, group: str, consumer: Consumer, reason: str) -> None:
        self.calls.append(("group_released", group, consumer.name, reason))

    def named(self, *kinds: str) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] in kinds]


def built_in_hooks(config: RouterConfig, plugins: Iterable[object] = ()) -> Hooks:
    """The built-in policies (no event log, no installed plugin) and ``plugins``, set up as
    server.py does: configured, then bound."""
    pm = build_plugin_manager([])
    for name, _plugin in list(pm.list_name_plugin()):
        if name not in BUILTIN_PLUGINS or name == "events":
            pm.unregister(name=name)
    for index, plugin in enumerate(plugins):
        pm.register(plugin, name=f"test-plugin-{index}")
    Hooks(pm).configure(config=config, manager=pm)
    return Hooks(pm)


@dataclass
class Rig:
    """A standalone Router built from real qpid-flow objects, and the clients it serves."""

    settings: dict[str, Any] = field(default_factory=dict)  # the router's TOML, as parsed
    plugins: list[object] = field(default_factory=list)  # registered before the built-ins are bound
    clients: list[Client] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.config = build_config(self.settings)
        self.recorder = Recorder()
        self.hooks = built_in_hooks(self.config, [self.recorder, *self.plugins])
        self.memory = MemoryMeter(self.config.memory_limit)
        self.destinations = Destinations(self.config, self.hooks, self.memory)
        self.backend = StandaloneBackend()
        self.router = Router(self.config, self.hooks, self.destinations, self.backend, self.memory)
        self.router.container_id = "qpid-flow-test"
        self.collector = Collector()  # qpid-flow's, for all its connections
        self.timers = Timers()
        self.bridge = FakeBridge()
        self.control = RouterControl(
            self.timers.schedule,
            self.router,
            self.destinations,
            cast(ReactorBridge, self.bridge),
            self.memory,
            self.hooks,
        )
        self.hooks.started(control=self.control)
        self.destinations.create_configured()

    def connect(self, container: str = "client-1", user: str = "anonymous") -> Client:
        """A client the gate has just handed over (SASL done), its AMQP open answered."""
        client = Client(self, End(server=False), End(server=True, collector=self.collector))
        self.router.client_opened(client.facing.connection, user, ("127.0.0.1", 40000 + len(self.clients)))
        self.clients.append(client)
        client.connection.container = container
        client.connection.open()
        self.pump()
        assert client.connection.state & Endpoint.REMOTE_ACTIVE, "qpid-flow did not answer the open"
        assert [f.kind for f in client.commands()] == ["open"]
        return client

    def pump(self) -> None:
        """Hand qpid-flow's events to the router, run what it scheduled for after the event
        (timers of delay 0, calls handed over from threads) and move bytes on every wire,
        until nothing happens."""
        for _ in range(10_000):
            busy = dispatch(self.collector, self.router) > 0
            busy = self.timers.run_due() > 0 or busy
            busy = self.bridge.run() > 0 or busy
            for client in self.clients:
                busy = move_bytes(client.end.transport, client.facing.transport) or busy
                busy = move_bytes(client.facing.transport, client.end.transport) or busy
                busy = client.end.take_events() > 0 or busy
            if not busy:
                return
        raise AssertionError("the wires never went quiet")

    def destination(self, address: str) -> Destination:
        destination = self.destinations.find(address)
        assert destination is not None, f"no destination {address!r}"
        return destination


@dataclass
class Got:
    """A transfer a client's receiver got: its delivery and the message it carried."""

    delivery: Delivery
    message: Message

    @property
    def body(self) -> Any:
        return self.message.body


class Client:
    """A client of the router, played by the test; every action pumps until quiet."""

    def __init__(self, rig: Rig, end: End, facing: End) -> None:
        self.rig = rig
        self.end = end
        self.facing = facing  # qpid-flow's end of this client's connection
        self._session: Session | None = None
        self._read = 0  # frames of the trace already handed out by commands()
        self._links: dict[str, str] = {}  # qpid-flow's handle -> link name, from its attaches
        self._tags = itertools.count(1)

    @property
    def connection(self) -> Any:
        return self.end.connection

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = self.connection.session()
            self._session.open()
            self.rig.pump()
            assert [f.kind for f in self.commands()] == ["begin"], "qpid-flow did not answer the begin"
        return self._session

    # --- events in -------------------------------------------------------------------------

    def attach_sender(self, address: str | None, name: str | None = None) -> Sender:
        """Attach a sender (a producer link) to ``address`` (None: anonymous relay)."""
        sender = self.session.sender(name or f"{address or 'anonymous'}-writer")
        sender.target.address = address
        sender.open()
        self.rig.pump()
        return sender

    def attach_receiver(
        self, address: str, credit: int = 0, name: str | None = None, presettled: bool = False
    ) -> Receiver:
        """Attach a receiver (a consumer link) of ``address`` and give it ``credit``."""
        receiver = self.session.receiver(name or f"{address}-reader")
        receiver.source.address = address
        if presettled:
            receiver.snd_settle_mode = Link.SND_SETTLED
        receiver.open()
        if credit:
            receiver.flow(credit)
        self.rig.pump()
        return receiver

    def send(self, sender: Sender, *messages: Message, settled: bool = False) -> list[Delivery]:
        """Send ``messages``, one transfer each, in order (credit or not: Proton buffers)."""
        deliveries: list[Delivery] = []
        for message in messages:
            delivery = sender.delivery(f"{sender.name}-{next(self._tags)}")
            sender.send(message.encode())
            sender.advance()
            if settled:
                delivery.settle()
            deliveries.append(delivery)
        self.rig.pump()
        return deliveries

    def flow(self, receiver: Receiver, credit: int) -> None:
        receiver.flow(credit)
        self.rig.pump()

    def take(self, receiver: Receiver) -> list[Got]:
        """Every complete transfer that arrived on ``receiver`` since the last take, in order."""
        got = []
        while (delivery := receiver.current) is not None and delivery.readable and not delivery.partial:
            data = receiver.recv(delivery.pending)
            receiver.advance()
            message = Message()
            message.decode(data)
            got.append(Got(delivery, message))
        return got

    def settle(self, *deliveries: Delivery, outcome: int = Delivery.ACCEPTED, **details: Any) -> None:
        """Give ``deliveries`` an outcome and settle them (``details``: ``condition``,
        ``failed``, ``undeliverable``, ``annotations`` of the local disposition)."""
        for delivery in deliveries:
            for name, value in details.items():
                setattr(delivery.local, name, value)
            delivery.update(outcome)
            delivery.settle()
        self.rig.pump()

    def accept(self, *got: Got) -> None:
        self.settle(*(g.delivery for g in got), outcome=Delivery.ACCEPTED)

    def detach(self, link: Link) -> None:
        link.close()
        self.rig.pump()

    def close(self) -> None:
        self.connection.close()
        self.rig.pump()

    # --- commands out ----------------------------------------------------------------------

    def commands(self, kind: str | None = None, link: Link | None = None) -> list[Frame]:
        """The frames qpid-flow wrote to this client since the last call (of one ``kind``,
        and about one ``link``, if given: the others are dropped as well). Links are told
        apart by the handles in qpid-flow's attaches: one session per client, as here."""
        lines = self.end.frames[self._read :]
        self._read = len(self.end.frames)
        frames = parse_frames(lines)
        for frame in frames:
            handle = frame.field("handle")
            if frame.kind == "attach" and handle is not None:
                name = frame.field("name")
                self._links[handle] = name.strip('"') if name else ""
            if handle is not None:
                frame.link = self._links.get(handle)
        return [
            frame
            for frame in frames
            if (kind is None or frame.kind == kind) and (link is None or frame.link == link.name)
        ]


def order(number: int, group: str | None = None, **fields: Any) -> Message:
    """An order message: body ``number``, message-id ``m-<number>``."""
    return Message(id=f"m-{number}", body=number, group_id=group, **fields)


def bodies(got: Iterable[Got]) -> list[Any]:
    return [g.body for g in got]


def outcome(delivery: Delivery) -> tuple[int, bool]:
    """A producer's view of one of its transfers: (the remote state, settled)."""
    return delivery.remote_state, delivery.settled


ACCEPTED_SETTLED = (Delivery.ACCEPTED, True)


@pytest.fixture
def rig() -> Rig:
    return Rig()


# --- producer credit ------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "window"), [({}, 100), ({"producer_window": 7}, 7)], ids=["default", "set"])
def test_a_producer_gets_producer_window_credit_on_attach(settings: dict[str, Any], window: int) -> None:
    """The attach is answered (rcv-settle-mode first, the router's max-message-size), then one
    flow frame grants the window: 100 standalone by default, else producer_window."""
    rig = Rig(settings)
    client = rig.connect()
    sender = client.attach_sender("orders")
    attach, flow = client.commands()
    assert (attach.kind, attach.link, attach.field("role")) == ("attach", "orders-writer", "true")
    assert attach.number("rcv-settle-mode") == 0  # first
    assert attach.number("max-message-size") == 100 * 1024 * 1024
    assert (flow.kind, flow.link) == ("flow", "orders-writer")
    assert (flow.number("delivery-count"), flow.number("link-credit")) == (0, window)
    assert sender.credit == window
    assert rig.recorder.named("producer_attached") == [("producer_attached", "orders-writer", "orders")]
    assert [p.name for p in rig.destination("orders").producers] == ["orders-writer"]


def test_producer_credit_is_topped_up_only_once_half_of_the_last_grant_is_used(rig: Rig) -> None:
    """Standalone, each transfer is accepted as it is enqueued; the window is topped up only
    once the link holds half of its last grant or less: after 49 of 100 no flow, after the
    50th one flow back to 100 (delivery-count 50), and none again before the next half."""
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()

    first = client.send(sender, *(order(n) for n in range(49)))
    assert [outcome(d) for d in first] == [ACCEPTED_SETTLED] * 49
    assert client.commands("flow") == []
    assert sender.credit == 51

    client.send(sender, order(49))
    (flow,) = client.commands("flow")
    assert (flow.number("delivery-count"), flow.number("link-credit")) == (50, 100)
    assert sender.credit == 100

    client.send(sender, *(order(n) for n in range(50, 99)))
    assert client.commands("flow") == []
    assert sender.credit == 51
    assert rig.destination("orders").depth == 99


class CreditPolicy:
    """A credit policy topping links up to 10, noting the credit each link held when asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    @hookimpl
    def qpid_flow_producer_credit(self, producer: Producer) -> int:
        self.asked.append(producer.credit)
        return 10 - producer.credit - producer.unsettled


def test_the_credit_policy_is_asked_after_settlements_only_once_half_of_the_last_grant_is_used() -> None:
    """The hook is asked at attach (10), then not after each settlement while the link holds
    more than half of that (4 sent: 6 left), but after the one that leaves it 5; its answer
    (5) is what the flow frame adds."""
    policy = CreditPolicy()
    rig = Rig(plugins=[policy])
    client = rig.connect()
    sender = client.attach_sender("orders")
    assert (policy.asked, sender.credit) == ([0], 10)
    client.send(sender, *(order(n) for n in range(4)))
    assert policy.asked == [0]
    client.commands()
    client.send(sender, order(4))
    assert policy.asked == [0, 5]
    (flow,) = client.commands("flow")
    assert (flow.number("delivery-count"), flow.number("link-credit")) == (5, 10)


def test_pre_settled_transfers_are_enqueued_and_topped_up_without_dispositions(rig: Rig) -> None:
    """Pre-settled transfers get no disposition, count in the depth, and use credit the same way."""
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()
    client.send(sender, *(order(n) for n in range(50)), settled=True)
    frames = client.commands()
    assert [f.kind for f in frames] == ["flow"]
    assert (frames[0].number("delivery-count"), frames[0].number("link-credit")) == (50, 100)
    assert rig.destination("orders").depth == 50


# --- producer flow control (seed 003) -------------------------------------------------------------


def fill_until_stopped(client: Client, sender: Sender, most: int = 2000) -> list[Delivery]:
    """Send as long as qpid-flow gives credit (up to ``most``); the deliveries, in order."""
    sent: list[Delivery] = []
    while sender.credit > 0 and len(sent) < most:
        sent += client.send(sender, *(order(len(sent) + n) for n in range(sender.credit)))
    return sent


def granted_up_to(flows: Iterable[Frame]) -> int:
    """The highest delivery-count the flow frames let the producer reach."""
    return max(f.number("delivery-count") + f.number("link-credit") for f in flows)


def test_flow_control_grants_credit_up_to_exactly_the_message_that_crosses_the_stop_threshold() -> None:
    """Seed 003 (stop above 900, resume below 500): the producer is granted credit for exactly
    901 messages (the 901st crosses the threshold and is accepted), then none; the
    destination is flow-stopped at depth 901."""
    rig = Rig({"destinations": SEED_003})
    client = rig.connect()
    sender = client.attach_sender("orders")
    sent = fill_until_stopped(client, sender)
    assert len(sent) == 901
    assert all(outcome(d) == ACCEPTED_SETTLED for d in sent)
    assert granted_up_to(client.commands("flow", sender)) == 901
    assert sender.credit == 0
    destination = rig.destination("orders")
    assert destination.depth == 901
    stats = destination.stats()
    assert (stats["flowStopped"], stats["flowStoppedCount"], stats["producersBlocked"]) == (True, 1, 1)


def test_a_producer_whose_transfers_wait_under_reject_after_counts_as_blocked() -> None:
    """reject_after keeps a producer's credit (it must send to be answered): what blocks it
    is its held transfers. producersBlocked counted only producers without credit: 0."""
    rig = Rig({"destinations": {"orders": {"reject_after": "30s", "flow_stop_count": 2, "flow_resume_count": 1}}})
    client = rig.connect()
    sender = client.attach_sender("orders")
    sent = client.send(sender, *(order(n) for n in range(5)))
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED] * 3 + [(0, False)] * 2
    assert sender.credit > 0
    stats = rig.destination("orders").stats()
    assert (stats["flowStopped"], stats["transfersHeld"], stats["producersBlocked"]) == (True, 2, 1)


def test_flow_control_resumes_the_producer_only_below_the_resume_threshold() -> None:
    """Seed 003 again: a consumer takes all 901, in order. Accepting 401 leaves depth 500 (not
    below 500): still no credit; the next accept leaves 499: the producer gets a full window
    (100) in one flow frame, and the destination is flowing again."""
    rig = Rig({"destinations": SEED_003})
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    fill_until_stopped(producer, sender)
    producer.commands()

    consumer = rig.connect("consumer")
    receiver = consumer.attach_receiver("orders", credit=1000)
    got = consumer.take(receiver)
    assert bodies(got) == list(range(901))
    destination = rig.destination("orders")
    assert destination.depth == 901, "messages out to a consumer unsettled still count"

    consumer.accept(*got[:401])
    assert destination.depth == 500
    assert producer.commands("flow") == []
    assert sender.credit == 0
    assert destination.stats()["flowStopped"] is True

    consumer.accept(got[401])
    assert destination.depth == 499
    (flow,) = producer.commands("flow")
    assert (flow.number("delivery-count"), flow.number("link-credit")) == (901, 100)
    assert sender.credit == 100
    assert destination.stats()["flowStopped"] is False


def test_a_full_destination_rejects_with_resource_limit_exceeded() -> None:
    """A destination at its max_count (2, flow thresholds off): the transfer that does not fit
    is rejected with amqp:resource-limit-exceeded and a description naming the limits."""
    rig = Rig({"destinations": {"orders": {"max_count": 2, "flow_stop_count": 0, "limit_policy": "reject"}}})
    client = rig.connect()
    sender = client.attach_sender("orders")
    deliveries = client.send(sender, order(1), order(2), order(3))
    assert [outcome(d) for d in deliveries[:2]] == [ACCEPTED_SETTLED] * 2
    refused = deliveries[2]
    assert outcome(refused) == (Delivery.REJECTED, True)
    assert refused.remote.condition.name == "amqp:resource-limit-exceeded"
    assert "depth 2 of max_count 2" in refused.remote.condition.description
    assert rig.destination("orders").depth == 2


# --- delivery to consumers ----------------------------------------------------------------------


def test_messages_reach_a_consumer_in_order_and_the_producer_was_accepted_on_enqueue(rig: Rig) -> None:
    """Standalone, the producer's transfer is settled accepted as soon as it is on its
    destination, before any consumer; a consumer attaching with credit 5 gets the 3 waiting
    messages, unsettled, in order; its accepts take them off the destination; the producer
    hears nothing more."""
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    producer.commands()
    sent = producer.send(sender, order(1), order(2), order(3))
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED] * 3
    (disposition,) = producer.commands("disposition")
    assert (disposition.state, disposition.settled, disposition.number("first")) == ("accepted", True, 0)
    assert disposition.number("last") == 2
    destination = rig.destination("orders")
    assert (destination.depth, len(destination.queue)) == (3, 3)

    consumer = rig.connect("consumer")
    receiver = consumer.attach_receiver("orders", credit=5)
    transfers = consumer.commands("transfer", receiver)
    assert [t.field("delivery-tag") for t in transfers] == ['b"1"', 'b"2"', 'b"3"']
    assert not any(t.settled for t in transfers)
    got = consumer.take(receiver)
    assert bodies(got) == [1, 2, 3]
    assert [g.message.id for g in got] == ["m-1", "m-2", "m-3"]
    assert receiver.credit == 2
    assert (destination.depth, len(destination.queue)) == (3, 0)

    consumer.accept(*got)
    assert destination.depth == 0
    stats = destination.stats()
    assert (stats["delivered"], stats["acknowledged"], stats["dequeued"]) == (3, 3, 3)
    assert producer.commands() == []


def test_a_message_sent_while_a_consumer_waits_goes_straight_to_it(rig: Rig) -> None:
    """A consumer with credit and nothing waiting gets each message as it arrives."""
    client = rig.connect()
    receiver = client.attach_receiver("orders", credit=2)
    sender = client.attach_sender("orders")
    client.commands()
    client.send(sender, order(7))
    (transfer,) = client.commands("transfer")
    assert transfer.link == "orders-reader"
    assert bodies(client.take(receiver)) == [7]


def test_a_presettled_consumer_gets_settled_transfers_and_the_message_leaves_at_once(rig: Rig) -> None:
    """A consumer attaching with snd-settle-mode settled (at-most-once): the transfers arrive
    settled, and the message leaves its destination (counted accepted) as it is sent."""
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1), order(2))
    receiver = client.attach_receiver("orders", credit=5, presettled=True)
    attach = next(f for f in client.commands("attach") if f.link == "orders-reader")
    assert attach.number("snd-settle-mode") == 1  # settled
    assert bodies(client.take(receiver)) == [1, 2]
    destination = rig.destination("orders")
    assert (destination.depth, destination.acknowledged) == (0, 2)


def test_consumers_with_credit_take_turns(rig: Rig) -> None:
    """Two consumers with credit: the messages go to one then the other (round robin)."""
    first = rig.connect("first")
    second = rig.connect("second")
    one = first.attach_receiver("orders", credit=10)
    two = second.attach_receiver("orders", credit=10)
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    producer.send(sender, *(order(n) for n in range(4)))
    got_one, got_two = bodies(first.take(one)), bodies(second.take(two))
    assert sorted(got_one + got_two) == [0, 1, 2, 3]
    assert len(got_one) == len(got_two) == 2
    assert got_one == sorted(got_one) and got_two == sorted(got_two)


# --- release and redelivery -------------------------------------------------------------------------


def test_a_released_message_goes_back_in_front_and_is_redelivered_to_the_next_consumer(rig: Rig) -> None:
    """The first consumer (credit 2) gets 1 and 2 and releases 1: it goes back in front of 3.
    The next consumer gets 1 then 3. A release is no failed attempt: the redelivered header
    keeps delivery-count 0, but says it may have been acquired before (first-acquirer false)."""
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    producer.send(sender, *(order(n, first_acquirer=True) for n in (1, 2, 3)))
    first = rig.connect("first")
    one = first.attach_receiver("orders", credit=2)
    got = first.take(one)
    assert bodies(got) == [1, 2]
    first.settle(got[0].delivery, outcome=Delivery.RELEASED)
    assert first.take(one) == [], "no credit left: nothing comes back to the first consumer"
    destination = rig.destination("orders")
    assert [m.identity()[0] for m in destination.queue] == ["m-1", "m-3"]
    assert (destination.depth, destination.released) == (3, 1)

    second = rig.connect("second")
    two = second.attach_receiver("orders", credit=5)
    again = second.take(two)
    assert bodies(again) == [1, 3]
    assert (again[0].message.delivery_count, again[0].message.first_acquirer) == (0, False)
    assert (again[1].message.delivery_count, again[1].message.first_acquirer) == (0, True)


def test_a_modified_delivery_failed_message_is_redelivered_with_its_delivery_count_raised(rig: Rig) -> None:
    """modified(delivery-failed) puts the message back too, and counts a failed attempt: the
    same consumer, with credit left, gets it again with delivery-count 1, then 2."""
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1))
    receiver = client.attach_receiver("orders", credit=3)
    (got,) = client.take(receiver)
    assert got.message.delivery_count == 0
    client.settle(got.delivery, outcome=Delivery.MODIFIED, failed=True)
    (again,) = client.take(receiver)
    assert (again.body, again.message.delivery_count, again.message.first_acquirer) == (1, 1, False)
    client.settle(again.delivery, outcome=Delivery.MODIFIED, failed=True)
    (third,) = client.take(receiver)
    assert third.message.delivery_count == 2
    client.accept(third)
    assert rig.destination("orders").depth == 0


def test_a_detaching_consumer_releases_what_it_held_in_order_as_failed_attempts(rig: Rig) -> None:
    """A consumer holding 1 and 2 unsettled detaches: both go back in front, in order, and
    the next consumer gets them with delivery-count 1 (handed out, never settled)."""
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1), order(2), order(3))
    receiver = client.attach_receiver("orders", credit=2, name="leaving")
    assert bodies(client.take(receiver)) == [1, 2]
    client.detach(receiver)
    (detach,) = client.commands("detach")
    assert detach.link == "leaving" and detach.field("closed") == "true"
    assert detach.condition is None
    assert rig.recorder.named("consumer_detached") == [("consumer_detached", "leaving", "orders")]

    other = client.attach_receiver("orders", credit=5, name="staying")
    again = client.take(other)
    assert bodies(again) == [1, 2, 3]
    assert [g.message.delivery_count for g in again] == [1, 1, 0]
    assert rig.destination("orders").depth == 3


def test_a_rejecting_consumer_takes_the_message_off_the_destination(rig: Rig) -> None:
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1))
    receiver = client.attach_receiver("orders", credit=3)
    (got,) = client.take(receiver)
    client.settle(got.delivery, outcome=Delivery.REJECTED, condition=Condition("app:bad-order", "no such item"))
    assert client.take(receiver) == []
    destination = rig.destination("orders")
    assert (destination.depth, destination.rejected) == (0, 1)


def test_a_modified_undeliverable_here_message_is_not_delivered_to_that_consumer_again(rig: Rig) -> None:
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1))
    receiver = client.attach_receiver("orders", credit=3)
    (got,) = client.take(receiver)
    client.settle(got.delivery, outcome=Delivery.MODIFIED, failed=True, undeliverable=True)
    assert client.take(receiver) == [], "handed back to the consumer that said undeliverable-here"
    assert rig.destination("orders").depth == 0, "docs/behaviour.md: modified, undeliverable-here: message leaves"


# --- policy decisions -------------------------------------------------------------------------------


class RejectOrders:
    """A policy refusing every transfer to 'orders' (and giving no opinion elsewhere)."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    @hookimpl
    def qpid_flow_transfer_arrived(self, message: Any, destination: Destination) -> Reject | None:
        self.asked.append(message.identity()[0])
        if destination.address != "orders":
            return None
        return Reject("orders are closed today", condition="amqp:not-allowed")


def test_a_policy_reject_settles_the_transfer_rejected_with_its_condition() -> None:
    """A plugin answering Reject: the producer's transfer is settled rejected with the
    plugin's condition and description; nothing is enqueued, and the credit is still
    topped up as for any settlement. A transfer elsewhere is accepted."""
    policy = RejectOrders()
    rig = Rig({"producer_window": 4}, plugins=[policy])
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()
    (refused, second) = client.send(sender, order(1), order(2))
    assert outcome(refused) == outcome(second) == (Delivery.REJECTED, True)
    condition = refused.remote.condition
    assert (condition.name, condition.description) == ("amqp:not-allowed", "orders are closed today")
    dispositions = client.commands("disposition")
    assert [(d.state, d.condition, d.settled) for d in dispositions] == [("rejected", "amqp:not-allowed", True)] * 2
    assert policy.asked == ["m-1", "m-2"]
    assert rig.destination("orders").depth == 0
    assert sender.credit == 4, "the rejected transfers' credit came back"
    assert rig.recorder.named("transfer_settled") == [("transfer_settled", "orders-writer", "rejected")] * 2

    elsewhere = client.attach_sender("invoices")
    (accepted,) = client.send(elsewhere, order(3))
    assert outcome(accepted) == ACCEPTED_SETTLED
    assert rig.destination("invoices").depth == 1


class FailingPolicy:
    @hookimpl
    def qpid_flow_transfer_arrived(self) -> None:
        raise RuntimeError("policy bug")


def test_a_policy_that_raises_rejects_the_transfer_with_internal_error() -> None:
    rig = Rig(plugins=[FailingPolicy()])
    client = rig.connect()
    sender = client.attach_sender("orders")
    with structlog.testing.capture_logs() as logs:
        (delivery,) = client.send(sender, order(1))
    assert outcome(delivery) == (Delivery.REJECTED, True)
    assert delivery.remote.condition.name == "amqp:internal-error"
    assert [e["hook"] for e in logs if e["event"] == "plugin_error"] == ["qpid_flow_transfer_arrived"]
    assert client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


# --- refusals by the router itself -----------------------------------------------------------------


def test_an_anonymous_relay_transfer_goes_to_its_to_address_and_one_without_is_rejected(rig: Rig) -> None:
    client = rig.connect()
    sender = client.attach_sender(None)
    (flow,) = client.commands("flow", sender)
    assert flow.number("link-credit") == 100
    addressed, unaddressed = client.send(sender, order(1, address="invoices"), order(2))
    assert outcome(addressed) == ACCEPTED_SETTLED
    assert rig.destination("invoices").depth == 1
    assert outcome(unaddressed) == (Delivery.REJECTED, True)
    assert unaddressed.remote.condition.name == "amqp:invalid-field"
    assert rig.recorder.named("producer_attached") == [("producer_attached", "anonymous-writer", None)]


def test_credit_spent_on_refused_transfers_is_given_back() -> None:
    rig = Rig({"producer_window": 4})
    client = rig.connect()
    sender = client.attach_sender(None)
    refused = client.send(sender, *(order(n) for n in range(4)))  # no 'to': each is refused
    assert [d.remote_state for d in refused] == [Delivery.REJECTED] * 4
    assert sender.credit > 0, "the producer was left with no credit at all"


class SettledTransfers:
    """Records what plugins are told of producers' outcomes: (address, outcome, condition)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str | None]] = []

    @hookimpl
    def qpid_flow_transfer_settled(self, message: Any, settlement: Settlement) -> None:
        self.told.append((message.address, settlement.outcome.value, settlement.condition))


def test_transfers_the_router_refuses_are_told_to_plugins_as_settled() -> None:
    """The event log writes transfer_settled from this hook: a transfer refused before it
    reached a destination (no such destination, not allowed, no 'to') was rejected to its
    producer and never told, and the log missed it."""
    told = SettledTransfers()
    rig = Rig(
        {
            "auto_create": False,
            "destinations": {"orders": {}},
            "acl": [{"user": "alice", "send": ["orders", "nowhere"]}],
        },
        plugins=[told],
    )
    alice = rig.connect("alice", user="alice")
    relay = alice.attach_sender(None)
    outcomes = alice.send(
        relay,
        order(1, address="orders"),
        order(2, address="nowhere"),
        order(3, address="invoices"),
        order(4),
    )
    assert [d.remote.condition.name if d.remote.condition else None for d in outcomes] == [
        None,
        "amqp:not-found",
        "amqp:unauthorized-access",
        "amqp:invalid-field",
    ]
    assert told.told == [
        ("orders", "accepted", None),
        ("nowhere", "rejected", "amqp:not-found"),
        ("invoices", "rejected", "amqp:unauthorized-access"),
        ("", "rejected", "amqp:invalid-field"),
    ]


def test_the_acl_refuses_links_and_anonymous_relay_transfers_the_user_may_not_make() -> None:
    """alice may send to and receive from 'orders' only: her attach to 'invoices' is refused
    with amqp:unauthorized-access, as is an anonymous-relay transfer of hers to 'invoices';
    bob (no entry) may not even receive from 'orders'."""
    rig = Rig({"acl": [{"user": "alice", "send": ["orders"], "receive": ["orders"]}]})
    alice = rig.connect("alice", user="alice")
    allowed = alice.attach_sender("orders")
    assert allowed.credit == 100
    refused = alice.attach_sender("invoices")
    assert refused.remote_condition.name == "amqp:unauthorized-access"
    assert refused.remote_condition.description == "user 'alice' may not send to 'invoices'"
    relay = alice.attach_sender(None)
    to_orders, to_invoices = alice.send(relay, order(1, address="orders"), order(2, address="invoices"))
    assert outcome(to_orders) == ACCEPTED_SETTLED
    assert outcome(to_invoices) == (Delivery.REJECTED, True)
    assert to_invoices.remote.condition.name == "amqp:unauthorized-access"
    assert rig.destinations.find("invoices") is None

    bob = rig.connect("bob", user="bob")
    receiver = bob.attach_receiver("orders", credit=5)
    assert receiver.remote_condition.name == "amqp:unauthorized-access"
    assert bob.take(receiver) == []
    assert rig.destination("orders").consumers == []


def test_a_connection_over_max_connections_is_opened_then_closed_with_resource_limit() -> None:
    rig = Rig({"max_connections": 1})
    first = rig.connect("first")
    second = Client(rig, End(server=False), End(server=True, collector=rig.collector))
    rig.router.client_opened(second.facing.connection, "anonymous", ("127.0.0.1", 2))
    rig.clients.append(second)
    second.connection.open()
    rig.pump()
    assert [(f.kind, f.condition) for f in second.commands()] == [
        ("open", None),
        ("close", "amqp:resource-limit-exceeded"),
    ]
    assert rig.router.connections == {first.facing.connection}
    first.close()
    third = rig.connect("third")  # connect() checks that the open alone came back
    assert not third.connection.state & Endpoint.REMOTE_CLOSED, "the first one's place was not given back"


RESOURCE_LIMIT = "amqp:resource-limit-exceeded"


def test_sessions_past_max_sessions_per_connection_are_ended_and_a_client_ending_none_is_closed() -> None:
    """max_sessions_per_connection = 2, counted per connection: the begins past it are ended
    with amqp:resource-limit-exceeded; a session ended frees its place, and a refused one
    the client ended counts no more. A client that leaves more refused sessions un-ended
    than the limit has its connection closed with amqp:resource-limit-exceeded, and nothing
    more is read from it: refused sessions were answered for good (10,000 begins that a
    client never ended, each walking all those before it, took 172 s to answer)."""
    rig = Rig({"max_sessions_per_connection": 2})
    client = rig.connect()
    other = rig.connect("other")

    def begin() -> Session:
        session = client.connection.session()
        session.open()
        rig.pump()
        return session

    first, _second, third, _fourth = begin(), begin(), begin(), begin()
    assert [s.remote_condition.name if s.remote_condition else None for s in (first, _second, third, _fourth)] == [
        None,
        None,
        RESOURCE_LIMIT,
        RESOURCE_LIMIT,
    ]
    assert [(f.kind, f.condition) for f in client.commands() if f.kind == "end"] == [("end", RESOURCE_LIMIT)] * 2
    first.close()  # its place is free
    rig.pump()
    fifth = begin()
    assert fifth.state & Endpoint.REMOTE_ACTIVE and fifth.remote_condition is None
    third.close()  # the client ended a refused one: one refused left un-ended
    rig.pump()
    with structlog.testing.capture_logs() as logs:
        sixth = begin()  # refused: two un-ended, the limit
        assert sixth.remote_condition.name == RESOURCE_LIMIT
        assert not client.connection.state & Endpoint.REMOTE_CLOSED
        begin()  # a third un-ended refusal: past the rule
    assert client.connection.remote_condition.name == RESOURCE_LIMIT
    assert "more than 2 sessions refused and not ended" in client.connection.remote_condition.description
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["session_refused", "connection_error"]
    assert client.facing.transport.capacity() < 0, "qpid-flow still reads the connection it closed"
    assert rig.router.connections == {other.facing.connection}
    assert_still_works(rig, other)


def test_links_past_max_links_per_connection_are_detached_and_a_client_detaching_none_is_closed() -> None:
    """As for sessions, with max_links_per_connection = 2: a detach (not a close: a JMS
    durable subscriber's) frees a link's place; a refused link the client detached counts
    no more; more refused links un-detached than the limit close the connection."""
    rig = Rig({"max_links_per_connection": 2})
    client = rig.connect()
    other = rig.connect("other")
    first, _second, third, _fourth = (client.attach_receiver("orders", name=f"reader-{n}") for n in range(4))
    assert [link.remote_condition.name if link.remote_condition else None for link in (first, third)] == [
        None,
        RESOURCE_LIMIT,
    ]
    assert [(f.link, f.condition) for f in client.commands("detach")] == [
        ("reader-2", RESOURCE_LIMIT),
        ("reader-3", RESOURCE_LIMIT),
    ]
    first.detach()
    rig.pump()
    assert client.attach_receiver("orders", name="reader-4").remote_condition is None
    third.close()
    rig.pump()
    assert client.attach_receiver("orders", name="reader-5").remote_condition.name == RESOURCE_LIMIT
    assert not client.connection.state & Endpoint.REMOTE_CLOSED
    with structlog.testing.capture_logs() as logs:
        client.attach_receiver("orders", name="reader-6")
    assert client.connection.remote_condition.name == RESOURCE_LIMIT
    assert "more than 2 links refused and not detached" in client.connection.remote_condition.description
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["connection_error"]
    assert client.facing.transport.capacity() < 0
    assert rig.destination("orders").consumers == []
    assert_still_works(rig, other)


def test_an_attach_to_an_unknown_destination_is_refused_when_auto_create_is_off() -> None:
    rig = Rig({"auto_create": False, "destinations": {"orders": {}}})
    client = rig.connect()
    sender = client.attach_sender("nowhere")
    receiver = client.attach_receiver("nowhere.either")
    for link in (sender, receiver):
        assert link.state & Endpoint.REMOTE_CLOSED
        assert link.remote_condition.name == "amqp:not-found"
    assert [f.condition for f in client.commands("detach")] == ["amqp:not-found", "amqp:not-found"]
    # The terminus qpid-flow did not make is null in its answer (AMQP 1.0 2.6.3): that is how
    # a client (qpid-jms) tells a refusal from an attach that worked.
    assert (sender.remote_target.type, sender.remote_target.address) == (Terminus.UNSPECIFIED, None)
    assert (receiver.remote_source.type, receiver.remote_source.address) == (Terminus.UNSPECIFIED, None)
    assert client.attach_sender("orders").credit == 100


def test_a_transfer_over_max_message_size_closes_its_link_only() -> None:
    rig = Rig({"max_message_size": 64})
    client = rig.connect()
    sender = client.attach_sender("orders")
    small = client.attach_sender("orders", name="small-writer")
    client.send(sender, Message(body="x" * 200))
    assert sender.state & Endpoint.REMOTE_CLOSED
    assert sender.remote_condition.name == "amqp:link:message-size-exceeded"
    (ok,) = client.send(small, order(1))
    assert outcome(ok) == ACCEPTED_SETTLED
    assert rig.destination("orders").depth == 1


# --- message groups ----------------------------------------------------------------------------------


def test_a_groups_messages_go_to_one_consumer_only_while_it_holds_some_unsettled() -> None:
    """shared_groups: with two consumers, group A goes to the first and B to the second. While
    the first holds A messages unsettled, the next A waits for it even though the second has
    credit; once it has settled all its A messages, the group is free and the second gets it."""
    rig = Rig({"destinations": {"orders": {"shared_groups": True}}})
    first = rig.connect("first")
    second = rig.connect("second")
    one = first.attach_receiver("orders", credit=3, name="one")
    two = second.attach_receiver("orders", credit=3, name="two")
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")

    producer.send(sender, order(1, "A"), order(2, "B"), order(3, "A"), order(4, "B"))
    got_one = first.take(one)
    got_two = second.take(two)
    assert [(g.body, g.message.group_id) for g in got_one] == [(1, "A"), (3, "A")]
    assert [(g.body, g.message.group_id) for g in got_two] == [(2, "B"), (4, "B")]

    first.accept(got_one[0])  # still holds 3: A stays with the first consumer
    producer.send(sender, order(5, "A"))
    (five,) = first.take(one)
    assert five.body == 5
    assert one.credit == 0
    producer.send(sender, order(6, "A"))
    assert second.take(two) == [], "group A went to another consumer while the first held some"
    assert rig.destination("orders").stats()["waiting"] == 1

    first.accept(got_one[1], five)  # the first holds no A message any more: A is free
    (six,) = second.take(two)
    assert (six.body, six.message.group_id) == (6, "A")
    assert rig.recorder.named("group_assigned") == [
        ("group_assigned", "A", "one"),
        ("group_assigned", "B", "two"),
        ("group_assigned", "A", "two"),
    ]
    assert ("group_released", "A", "one", "settled") in rig.recorder.calls


# --- errors stay on their own connection -------------------------------------------------------------


def assert_still_works(rig: Rig, client: Client, address: str = "invoices") -> None:
    """``client`` can still produce and consume through the router."""
    sender = client.attach_sender(address, name=f"{address}-check-writer")
    receiver = client.attach_receiver(address, credit=1, name=f"{address}-check-reader")
    (delivery,) = client.send(sender, order(42))
    assert outcome(delivery) == ACCEPTED_SETTLED
    (got,) = client.take(receiver)
    assert got.body == 42
    client.accept(got)
    assert client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


@pytest.mark.parametrize(
    ("target", "method", "act"),
    [
        ("router", "_attach_consumer", "attach"),  # a Proton event (link remote open)
        ("router", "_on_transfer", "send"),  # a lean DeliveryEvent
        ("backend", "demand_changed", "flow"),  # a lean LinkFlowEvent
    ],
)
def test_a_router_error_closes_that_client_only(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, target: str, method: str, act: str
) -> None:
    """A handler that raises on one client's event closes that client's connection with
    amqp:internal-error and logs handler_error; once the client answers, the router forgets
    it (its consumer leaves the destination); another client carries on."""
    doomed = rig.connect("doomed")
    other = rig.connect("other")
    receiver = doomed.session.receiver("orders-reader")
    receiver.source.address = "orders"
    sender = doomed.attach_sender("orders")
    if act != "attach":
        receiver.open()
        rig.pump()
    failed = fail_next(rig.router if target == "router" else rig.backend, method, monkeypatch)
    with structlog.testing.capture_logs() as logs:
        if act == "attach":
            receiver.open()
            rig.pump()
        elif act == "send":
            doomed.send(sender, order(1))
        else:
            doomed.flow(receiver, 3)
    assert failed == [method]
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["handler_error"]
    (close,) = doomed.commands("close")
    assert close.condition == "amqp:internal-error"
    assert doomed.connection.remote_condition.name == "amqp:internal-error"

    doomed.close()
    assert doomed.facing.connection not in rig.router.connections
    assert rig.destination("orders").consumers == []
    assert rig.destination("orders").producers == set()
    assert len(rig.router.connections) == 1
    assert_still_works(rig, other)


def test_a_framing_error_closes_that_client_only(rig: Rig) -> None:
    """Bytes that are no AMQP frame on one connection: Proton closes it with
    amqp:connection:framing-error, the router forgets it; another client carries on."""
    bad = rig.connect("bad")
    good = rig.connect("good")
    bad.attach_sender("orders")
    with structlog.testing.capture_logs() as logs:
        bad.facing.transport.push(b"\x00\x00\x00\x01garbage")  # a frame size below the minimum
        rig.pump()
    assert bad.connection.remote_condition.name == "amqp:connection:framing-error"
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["connection_error"]
    assert rig.router.connections == {good.facing.connection}
    assert rig.destination("orders").producers == set()
    assert_still_works(rig, good)


def test_a_container_id_that_is_not_utf8_closes_that_connection_with_decode_error(rig: Rig) -> None:
    """A peer's open whose container-id is not UTF-8 (a raw open frame: Proton's client API
    cannot send one): the handler fails reading it, and the guard closes that connection with
    amqp:decode-error rather than internal-error. Another client carries on."""
    good = rig.connect("good")
    raw = End(server=True, collector=rig.collector)
    rig.router.client_opened(raw.connection, "anonymous", ("127.0.0.1", 1))
    container_id = b"\xa1\x03\xff\xfeA"  # str8-utf8 of 3 bytes, not UTF-8
    body = b"\x00\x53\x10\xc0" + bytes([len(container_id) + 1, 1]) + container_id  # open: [container-id]
    raw.transport.push(b"AMQP\x00\x01\x00\x00" + struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)
    with structlog.testing.capture_logs() as logs:
        rig.pump()
    raw.transport.peek(raw.transport.pending())  # what qpid-flow writes back (traced as it is)
    (close,) = [f for f in raw.frames if " -> @close(" in f]
    assert 'condition=:"amqp:decode-error"' in close
    assert [e["method"] for e in logs if e["event"] == "handler_error"] == ["on_connection_remote_open"]
    assert_still_works(rig, good)


# --- links and connections going away -----------------------------------------------------------


def test_a_producer_detach_is_answered_and_reported(rig: Rig) -> None:
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()
    client.detach(sender)
    (detach,) = client.commands("detach")
    assert (detach.link, detach.field("closed"), detach.condition) == ("orders-writer", "true", None)
    assert rig.recorder.named("producer_detached") == [("producer_detached", "orders-writer", "orders")]
    assert rig.destination("orders").producers == set()


def test_a_client_closing_its_connection_releases_what_its_consumers_held(rig: Rig) -> None:
    """The close is answered with a close without error; the messages its consumer held go
    back for the next consumer, and the router forgets the connection."""
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    producer.send(sender, order(1), order(2))
    leaving = rig.connect("leaving")
    receiver = leaving.attach_receiver("orders", credit=5)
    assert bodies(leaving.take(receiver)) == [1, 2]
    leaving.commands()
    leaving.close()
    (close,) = leaving.commands("close")
    assert close.condition is None
    assert leaving.facing.connection not in rig.router.connections
    staying = rig.connect("staying")
    other = staying.attach_receiver("orders", credit=5)
    assert bodies(staying.take(other)) == [1, 2]


def test_a_consumer_drain_with_nothing_waiting_gives_the_credit_back_at_once(rig: Rig) -> None:
    client = rig.connect()
    receiver = client.attach_receiver("orders", credit=4)
    client.commands()
    receiver.drain(0)
    rig.pump()
    (flow,) = client.commands("flow", receiver)
    assert (flow.field("drain"), flow.number("link-credit"), flow.number("delivery-count")) == ("true", 0, 4)
    assert receiver.credit == 0


@pytest.mark.parametrize("dynamic", [False, True], ids=["named", "dynamic"])
def test_a_consumer_asking_a_durable_subscription_is_answered_that_it_has_none(rig: Rig, dynamic: bool) -> None:
    """Standalone keeps nothing of a link past its detach: a source asking durable
    unsettled-state, expiry-policy never and a timeout is answered durable none,
    expiry-policy link-detach, timeout 0, so the client can tell; the rest as it asked."""
    client = rig.connect()
    receiver = client.session.receiver("subscription")
    if dynamic:
        receiver.source.dynamic = True
    else:
        receiver.source.address = "orders"
    receiver.source.durability = Terminus.DELIVERIES
    receiver.source.expiry_policy = Terminus.EXPIRE_NEVER
    receiver.source.timeout = 3600
    receiver.source.distribution_mode = Terminus.DIST_MODE_MOVE
    receiver.open()
    rig.pump()
    answered = receiver.remote_source
    assert (answered.durability, answered.expiry_policy, answered.timeout) == (
        Terminus.NONDURABLE,
        Terminus.EXPIRE_WITH_LINK,
        0,
    )
    assert answered.distribution_mode == Terminus.DIST_MODE_MOVE
    if dynamic:
        assert answered.address.startswith("qpid-flow.temporary.")
    else:
        assert answered.address == "orders"


def test_a_coordinator_answers_only_the_transaction_capabilities_it_has() -> None:
    """Local transactions only: a client asking for distributed ones as well must not be
    told it has them (it learnt at its declare, from amqp:not-implemented)."""
    from proton import UNDESCRIBED, Array, Data, symbol

    rig = Rig()
    client = rig.connect()
    controller = client.session.sender("controller")
    controller.source.address = "controller"
    controller.target.type = Terminus.COORDINATOR
    asked = ("amqp:local-transactions", "amqp:distributed-transactions", "amqp:promotable-transactions")
    controller.target.capabilities.put_object(Array(UNDESCRIBED, Data.SYMBOL, *map(symbol, asked)))
    controller.open()
    rig.pump()
    assert controller.state & Endpoint.REMOTE_ACTIVE
    answered = controller.remote_target.capabilities
    answered.rewind()
    assert answered.next() is not None
    assert [str(s) for s in answered.get_object().elements] == ["amqp:local-transactions"]


def test_a_modified_outcomes_annotations_go_into_the_redelivered_message() -> None:
    """AMQP 1.0 3.4.5: the message-annotations of a modified outcome are merged into the
    message's own for its next delivery (they were ignored). Its bytes grow, and the
    destination's byte count follows them out again."""
    rig = Rig()
    client = rig.connect()
    client.send(client.attach_sender("orders"), Message(body="order 1", annotations={"x-opt-origin": "eu"}))
    receiver = client.attach_receiver("orders", credit=1)
    (first,) = client.take(receiver)
    delivery = first.delivery
    delivery.local.failed = True
    delivery.local.annotations = {symbol("x-opt-retry-reason"): "timeout", symbol("x-opt-origin"): "us"}
    delivery.update(Delivery.MODIFIED)
    delivery.settle()
    rig.pump()
    client.flow(receiver, 1)
    (again,) = client.take(receiver)
    assert again.body == "order 1" and again.message.delivery_count == 1
    assert again.message.annotations == {"x-opt-origin": "us", "x-opt-retry-reason": "timeout"}
    destination = rig.destination("orders")
    assert destination.bytes > 0
    client.accept(again)
    assert (destination.depth, destination.bytes, rig.memory.held) == (0, 0, 0)


def test_a_second_connection_of_a_sole_container_id_is_refused_as_brokers_refuse_it() -> None:
    """JMS client ids: qpid-jms asks sole-connection-for-container, and a second connection
    with the same id is refused (InvalidClientIDException on the client), as ActiveMQ,
    Artemis and Broker-J refuse it. (qpid-flow let both in: two instances of a 'singleton'
    client, or two holders of one durable subscription name.) Other ids are unaffected."""
    rig = Rig()
    sole = symbol("sole-connection-for-container")

    def open_with(container: str) -> Client:
        client = Client(rig, End(server=False), End(server=True, collector=rig.collector))
        rig.router.client_opened(client.facing.connection, "anonymous", ("127.0.0.1", 40000 + len(rig.clients)))
        rig.clients.append(client)
        client.connection.container = container
        client.connection.desired_capabilities = SymbolList([sole])
        client.connection.open()
        rig.pump()
        return client

    first = open_with("jms-client-id-1")
    assert first.connection.state & Endpoint.REMOTE_ACTIVE
    second = open_with("jms-client-id-1")
    assert second.connection.state & Endpoint.REMOTE_CLOSED
    condition = second.connection.remote_condition
    assert condition.name == "amqp:invalid-field"
    assert condition.info == {symbol("invalid-field"): symbol("container-id")}
    assert second.connection.remote_properties[symbol("amqp:connection-establishment-failed")] is True
    other = open_with("jms-client-id-2")
    assert other.connection.state & Endpoint.REMOTE_ACTIVE and not other.connection.state & Endpoint.REMOTE_CLOSED
    first.connection.close()
    rig.pump()
    again = open_with("jms-client-id-1")
    assert not again.connection.state & Endpoint.REMOTE_CLOSED


def test_a_producer_asking_a_durable_target_is_answered_that_it_has_none(rig: Rig) -> None:
    """As for a consumer's source: the target qpid-flow answers says durable none and
    expiry link-detach, whatever the client asked (it was echoed as asked)."""
    client = rig.connect()
    sender = client.session.sender("writer")
    sender.target.address = "orders"
    sender.target.durability = Terminus.DELIVERIES
    sender.target.expiry_policy = Terminus.EXPIRE_NEVER
    sender.target.timeout = 3600
    sender.open()
    rig.pump()
    answered = sender.remote_target
    assert (answered.address, answered.durability, answered.expiry_policy, answered.timeout) == (
        "orders",
        Terminus.NONDURABLE,
        Terminus.EXPIRE_WITH_LINK,
        0,
    )
