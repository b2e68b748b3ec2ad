"""RouterControl (plugin/control.py): what a plugin may do to a running router.

Two ways: with simple fakes for the router, the registry, the scheduler and the bridge (what
RouterControl asks of each, in which order), and on the standalone Router in memory
(:mod:`tests.unit.test_router`'s rig), where a plugin's changed answer reaches the wire once
it calls ``wake``: held transfers forwarded and settled, credit granted, waiting messages
handed out, delayed settlements sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from qpid_flow import hookimpl
from qpid_flow.amqp.bridge import ReactorBridge
from qpid_flow.amqp.router import Router
from qpid_flow.core.dialect import RABBITMQ
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Hold, Message, Producer
from qpid_flow.core.registry import Destinations
from qpid_flow.plugin.control import RouterControl
from qpid_flow.plugin.manager import Hooks
from qpid_flow.testing import ManualControl, make_destination
from tests.unit.test_router import ACCEPTED_SETTLED, Rig, bodies, order, outcome

# --- with fakes -----------------------------------------------------------------------------------


class FakeDestination:
    def __init__(self, address: str, log: list[str]) -> None:
        self.address = address
        self._log = log

    def dispatch(self) -> None:
        self._log.append(f"dispatch {self.address}")


class FakeDestinations:
    """What RouterControl uses of Destinations: ``find`` (never creates) and iteration."""

    def __init__(self, log: list[str], *addresses: str) -> None:
        self.by_address = {a: FakeDestination(a, log) for a in addresses}

    def find(self, address: str) -> FakeDestination | None:
        return self.by_address.get(address)

    def __iter__(self) -> Iterator[FakeDestination]:
        return iter(list(self.by_address.values()))


class FakeRouter:
    """What RouterControl uses of the Router, noting each call in a shared log."""

    def __init__(self, log: list[str]) -> None:
        self._log = log

    def recheck_held(self, address: str) -> None:
        self._log.append(f"recheck_held {address}")

    def destination_name(self, address: str) -> str:
        return address.removeprefix("/queue/")  # as in front of RabbitMQ

    def grant_all(self, address: str | None = None) -> None:
        self._log.append(f"grant_all {address}")

    def held_count(self, address: str) -> int:
        return {"orders": 3}.get(address, 0)

    def delayed_producers(self, address: str) -> int:
        return {"orders": 2}.get(address, 0)

    def waiting_producers(self, address: str) -> set[int]:
        return {"orders": {7, 9}}.get(address, set())


class FakeBridge:
    def __init__(self) -> None:
        self.calls: list[Callable[[], Any]] = []

    def call_soon(self, callback: Callable[[], Any]) -> None:
        self.calls.append(callback)


class Faked:
    """A RouterControl over fakes, and what it did to them."""

    def __init__(self, *addresses: str) -> None:
        self.log: list[str] = []
        self.timers: list[tuple[float, Callable[[], Any]]] = []
        self.router = FakeRouter(self.log)
        self.destinations = FakeDestinations(self.log, *addresses)
        self.bridge = FakeBridge()
        self.memory = MemoryMeter(1000)
        self.hooks = cast(Hooks, object())
        self.control = RouterControl(
            lambda delay, callback: self.timers.append((delay, callback)),
            cast(Router, self.router),
            cast(Destinations, self.destinations),
            cast(ReactorBridge, self.bridge),
            self.memory,
            self.hooks,
        )


def test_wake_for_an_address_rechecks_its_held_transfers_then_dispatches_then_grants() -> None:
    faked = Faked("orders", "invoices")
    faked.control.wake("orders")
    assert faked.log == ["recheck_held orders", "dispatch orders", "grant_all orders"]


def test_wake_for_everything_goes_through_every_destination_then_grants_every_producer() -> None:
    faked = Faked("orders", "invoices")
    faked.control.wake()
    assert faked.log == [
        "recheck_held orders",
        "dispatch orders",
        "recheck_held invoices",
        "dispatch invoices",
        "grant_all None",
    ]


def test_wake_for_an_address_with_no_destination_still_grants_its_producers() -> None:
    """No destination (none was made, or it was forgotten): nothing to recheck or dispatch,
    but the producers of that address (anonymous-relay ones included) are asked again."""
    faked = Faked("orders")
    faked.control.wake("nowhere")
    assert faked.log == ["grant_all nowhere"]
    assert faked.destinations.find("nowhere") is None


def test_schedule_hands_the_callback_to_the_injected_scheduler_without_running_it() -> None:
    faked = Faked()
    ran: list[str] = []

    def callback() -> None:
        ran.append("ran")

    faked.control.schedule(2.5, callback)
    faked.control.schedule(0, callback)
    assert faked.timers == [(2.5, callback), (0, callback)]
    assert ran == []


def test_call_from_thread_goes_through_the_bridge_without_running_the_callback() -> None:
    faked = Faked()
    ran: list[str] = []

    def callback() -> None:
        ran.append("ran")

    faked.control.call_from_thread(callback)
    assert faked.bridge.calls == [callback]
    assert ran == []
    assert faked.timers == [], "not a timer: the bridge's queue keeps the order of calls"


def test_counts_and_lookups_come_from_the_router_and_the_registry() -> None:
    faked = Faked("orders", "invoices")
    control = faked.control
    assert (control.held_transfers("orders"), control.held_transfers("invoices")) == (3, 0)
    assert (control.delayed_producers("orders"), control.delayed_producers("invoices")) == (2, 0)
    assert (control.waiting_producers("orders"), control.waiting_producers("invoices")) == ({7, 9}, set())
    orders = control.destination("orders")
    assert orders is not None and orders.address == "orders"
    assert control.destination("nowhere") is None
    assert [d.address for d in control.destinations()] == ["orders", "invoices"]
    assert control.memory is faked.memory and control.hooks is faked.hooks
    assert faked.log == [], "reading asks nothing of the policies"


def test_an_address_as_clients_write_it_names_its_destination_everywhere() -> None:
    """In front of RabbitMQ, ``/queue/orders`` is queue ``orders``: a plugin given the
    address a client wrote found nothing, and its wake released nobody."""
    faked = Faked("orders", "/queue/odd")
    control = faked.control
    found = control.destination("/queue/orders")
    assert found is not None and found.address == "orders"
    assert control.held_transfers("/queue/orders") == 3
    assert control.delayed_producers("/queue/orders") == 2
    assert control.waiting_producers("/queue/orders") == {7, 9}
    control.wake("/queue/orders")
    assert faked.log == ["recheck_held orders", "dispatch orders", "grant_all orders"]
    # A destination whose own name reads as another form is still found by it.
    odd = control.destination("/queue/odd")
    assert odd is not None and odd.address == "/queue/odd"


def test_the_manual_control_offers_every_method_of_the_router_control() -> None:
    """A plugin's unit test with ManualControl failed on control.address_forms (the
    router's control has it): whatever a plugin may call, the stand-in has."""
    public = {name for name in dir(RouterControl) if not name.startswith("_")}
    assert public - set(dir(ManualControl)) == set()


def test_the_manual_control_names_addresses_as_in_front_of_rabbitmq_when_asked() -> None:
    orders = make_destination("orders")
    standalone, rabbitmq = ManualControl([orders]), ManualControl([orders], dialect=RABBITMQ)
    assert standalone.address_forms("orders") == ("orders",)
    assert standalone.destination("/queue/orders") is None
    assert rabbitmq.address_forms("orders") == ("orders", "/queue/orders", "/amq/queue/orders")
    assert rabbitmq.destination("/queue/orders") is orders
    assert rabbitmq.destination_name("/queue/orders") == "orders"


# --- on the router in memory -------------------------------------------------------------------------


class Gatekeeper:
    """Holds the transfers whose message-id it is told to (all, at first); notes each question."""

    def __init__(self) -> None:
        self.holding: set[str] | None = None  # None: hold everything
        self.asked: list[str] = []

    @hookimpl
    def qpid_flow_transfer_arrived(self, message: Message) -> Hold | None:
        message_id = message.identity()[0]
        self.asked.append(message_id)
        if self.holding is None or message_id in self.holding:
            return Hold("gate closed")
        return None


def test_wake_forwards_held_transfers_once_the_policy_admits_them_in_arrival_order() -> None:
    gate = Gatekeeper()
    rig = Rig(plugins=[gate])
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()
    sent = client.send(sender, order(1), order(2), order(3))
    assert [d.remote_state for d in sent] == [0, 0, 0]
    assert client.commands("disposition") == []
    assert rig.control.held_transfers("orders") == 3
    assert rig.control.waiting_producers("orders") == {p.id for p in rig.destination("orders").producers}
    assert rig.destination("orders").depth == 0

    gate.holding = set()
    gate.asked.clear()
    rig.control.wake("orders")
    rig.pump()
    assert gate.asked == ["m-1", "m-2", "m-3"]
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED] * 3
    assert rig.control.held_transfers("orders") == 0
    assert rig.control.waiting_producers("orders") == set()
    assert [m.identity()[0] for m in rig.destination("orders").queue] == ["m-1", "m-2", "m-3"]


def test_a_held_transfer_that_expired_meanwhile_is_taken_and_counted_expired_never_enqueued() -> None:
    """Standalone, one whose time to live ran out while held was let in: counted in the
    depth until the next sweep, a window of them turned flow control ON again behind live
    producers, once a second. Taken (accepted) and counted expired instead, as in front of
    a broker; the live one behind it goes in."""
    gate = Gatekeeper()
    rig = Rig(plugins=[gate])
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()
    gone = time.time() - 60  # its absolute-expiry-time: long past by the time it is let go
    sent = client.send(sender, order(1, expiry_time=gone), order(2))
    assert rig.control.held_transfers("orders") == 2
    gate.holding = set()
    rig.control.wake("orders")
    rig.pump()
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED] * 2
    destination = rig.destination("orders")
    assert (destination.expired, destination.depth, destination.enqueued_total) == (1, 1, 1)


def test_wake_stops_at_the_first_transfer_still_held_and_keeps_those_behind_it() -> None:
    """m-2 still held: m-1 goes, m-3 is not even asked (order is kept), both stay held."""
    gate = Gatekeeper()
    rig = Rig(plugins=[gate])
    client = rig.connect()
    sender = client.attach_sender("orders")
    sent = client.send(sender, order(1), order(2), order(3))
    gate.holding = {"m-2"}
    gate.asked.clear()
    rig.control.wake("orders")
    rig.pump()
    assert gate.asked == ["m-1", "m-2"]
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED, (0, False), (0, False)]
    assert rig.control.held_transfers("orders") == 2

    gate.holding = set()
    gate.asked.clear()
    rig.control.wake("orders")
    rig.pump()
    assert gate.asked == ["m-2", "m-3"]
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED] * 3


def test_held_transfers_of_a_producer_that_left_are_dropped() -> None:
    gate = Gatekeeper()
    rig = Rig(plugins=[gate])
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1), order(2))
    assert rig.control.held_transfers("orders") == 2
    client.detach(sender)
    assert rig.control.held_transfers("orders") == 0
    assert rig.memory.held == 0


class Allowance:
    """A credit policy granting, once, what it is told to per address (None: anonymous relay)."""

    def __init__(self) -> None:
        self.pending: dict[str | None, int] = {}

    @hookimpl
    def qpid_flow_producer_credit(self, producer: Producer) -> int:
        return self.pending.pop(producer.address, 0)


def test_wake_grants_the_credit_the_policy_now_gives_to_that_addresss_producers_and_anonymous_ones() -> None:
    allowance = Allowance()
    rig = Rig(plugins=[allowance])
    client = rig.connect()
    orders = client.attach_sender("orders")
    invoices = client.attach_sender("invoices")
    anonymous = client.attach_sender(None)
    assert client.commands("flow") == [], "no credit before the policy gives some"

    allowance.pending = {"orders": 5, "invoices": 7, None: 2}
    rig.control.wake("orders")
    rig.pump()
    flows = {f.link: f.number("link-credit") for f in client.commands("flow")}
    assert flows == {"orders-writer": 5, "anonymous-writer": 2}
    assert (orders.credit, invoices.credit, anonymous.credit) == (5, 0, 2)

    rig.control.wake()
    rig.pump()
    assert {f.link: f.number("link-credit") for f in client.commands("flow")} == {"invoices-writer": 7}
    assert invoices.credit == 7


class Picky:
    """A consumer-selection policy that lets nothing out until told to."""

    def __init__(self) -> None:
        self.open = False

    @hookimpl
    def qpid_flow_consumer_select(self) -> Hold | None:
        return None if self.open else Hold("not yet")


def test_wake_hands_out_the_messages_a_policy_let_wait() -> None:
    picky = Picky()
    rig = Rig(plugins=[picky])
    client = rig.connect()
    receiver = client.attach_receiver("orders", credit=5)
    sender = client.attach_sender("orders")
    client.send(sender, order(1), order(2))
    assert client.take(receiver) == []
    assert len(rig.destination("orders").queue) == 2

    picky.open = True
    rig.control.wake("orders")
    rig.pump()
    assert bodies(client.take(receiver)) == [1, 2]


class Delay:
    """A policy making producers wait for their settlements while ``delaying``."""

    def __init__(self) -> None:
        self.delaying = True

    @hookimpl
    def qpid_flow_settlement_delay(self) -> bool:
        return self.delaying


def test_wake_sends_the_settlements_a_policy_delayed_in_order() -> None:
    """Delayed: the messages are on their destination, their producer waits for the outcome;
    once the policy lets go, a wake settles them, in order."""
    delay = Delay()
    rig = Rig(plugins=[delay])
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.commands()
    sent = client.send(sender, order(1), order(2))
    assert [outcome(d) for d in sent] == [(0, False)] * 2
    assert rig.destination("orders").depth == 2
    assert rig.control.delayed_producers("orders") == 1

    delay.delaying = False
    rig.control.wake("orders")
    rig.pump()
    assert [outcome(d) for d in sent] == [ACCEPTED_SETTLED] * 2
    (disposition,) = client.commands("disposition")
    assert (disposition.number("first"), disposition.number("last"), disposition.state) == (0, 1, "accepted")
    assert rig.control.delayed_producers("orders") == 0


def test_the_control_lists_and_finds_destinations_without_making_any() -> None:
    rig = Rig()
    client = rig.connect()
    client.attach_sender("orders")
    assert rig.control.destination("nowhere") is None
    assert rig.destinations.find("nowhere") is None
    assert [d.address for d in rig.control.destinations()] == ["orders"]


class Waker:
    """A plugin that wakes the router from a timer, as the built-in flow control does."""

    control: RouterControl

    @hookimpl
    def qpid_flow_started(self, control: RouterControl) -> None:
        self.control = control


def test_a_plugin_timer_runs_through_the_scheduler_the_server_injected() -> None:
    """RouterControl.schedule reaches the scheduler the rig gave it (the server gives the
    reactor's): nothing runs until the timer fires."""
    waker = Waker()
    gate = Gatekeeper()
    rig = Rig(plugins=[waker, gate])
    client = rig.connect()
    sender = client.attach_sender("orders")
    (delivery,) = client.send(sender, order(1))
    gate.holding = set()
    waker.control.schedule(5.0, lambda: waker.control.wake("orders"))
    rig.pump()
    assert outcome(delivery) == (0, False)
    ((delay, fire),) = rig.timers.later
    assert delay == 5.0
    fire()
    rig.pump()
    assert outcome(delivery) == ACCEPTED_SETTLED


@pytest.mark.parametrize("address", ["orders", None])
def test_wake_with_nothing_to_do_sends_nothing(address: str | None) -> None:
    rig = Rig()
    client = rig.connect()
    client.attach_sender("orders")
    client.commands()
    rig.control.wake(address)
    rig.pump()
    assert client.commands() == [], "a full window is not topped up again"
