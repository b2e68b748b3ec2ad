"""Differential transparency: what a client sees through qpid-flow is what it sees at the broker.

qpid-flow's promise in front of a broker (../shared/SEMANTICS.md section 1, issue 14): a client
sees exactly what it would see connected to the broker directly (its identity, links, outcomes,
errors, fan-out), except where a policy deliberately holds credit or settlement. No policy is
configured here, so nothing may differ.

Each test runs one scenario twice, with the same client script and the same credentials: directly
against RabbitMQ, then through a fresh qpid-flow in front of the same RabbitMQ
(`harness.scenario.run_both`). A scenario returns a plain value of what its clients observed
(messages per consumer in order, outcomes and their condition names, the level and name of every
error, what a bystander connection saw). Each test asserts:
1. the direct outcome is what RabbitMQ 3.10.8 does (../shared/BROKERS.md, or measured here where
   that page is silent), so the test cannot pass by both sides being broken the same way;
2. the outcome through qpid-flow equals the direct one.

Condition descriptions are left out of every comparison (they carry per-connection ids); their
names are kept.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import pytest
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from qpid_flow.security.sasl import MechanismsReader

from .harness.blocking_clients import unique_address
from .harness.broker import Broker
from .harness.cexamples import ProtonCExamples
from .harness.forwarder import Forwarder
from .harness.net import free_port
from .harness.router import StartRouter
from .harness.scenario import (
    WAIT,
    Bystander,
    Peer,
    Target,
    amqp10_logins_since,
    bodies,
    ctl,
    delete_queues,
    message,
    open_connections_of,
    queue_rows,
    run_both,
    run_c_examples,
    run_rhea,
    subscription_queues,
)
from .harness.waiting import wait_until

pytestmark = pytest.mark.integration

T = TypeVar("T")
Errors = list[tuple[str, str | None]]
BYSTANDER_OK = "5+ round trips completed"
N = 10


class Both(Protocol):
    def __call__(self, scenario: Callable[[Target], T]) -> tuple[T, T]: ...


@pytest.fixture
def both(rabbitmq: Broker, qpid_flow_process: StartRouter) -> Both:
    """`both(scenario)` -> (direct, through): the scenario against the session's RabbitMQ, then
    through a qpid-flow started for this test with `--broker` = that RabbitMQ (guest:guest)."""

    def run(scenario: Callable[[Target], T]) -> tuple[T, T]:
        return run_both(scenario, rabbitmq, qpid_flow_process)

    return run


def settle_time() -> None:
    """A short pause for anything late (a duplicate, an extra delivery) to arrive.

    Fixed: it gives what must not come the time to come; there is nothing to wait on."""
    time.sleep(0.3)


# --- 1. fan-out ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FanOut:
    subscriber_a: list[Any]
    subscriber_b: list[Any]
    producer_outcomes: list[Any]
    errors: Errors


def fan_out(target: Target, address: str) -> FanOut:
    """Two subscribers attach to `address`, then a producer sends N messages to it."""
    with Peer(target.url) as a, Peer(target.url) as b, Peer(target.url) as producer:
        ra = a.receiver(address, credit=2 * N)
        rb = b.receiver(address, credit=2 * N)
        a.wait(lambda: ra.remote_opened or a.ended)
        b.wait(lambda: rb.remote_opened or b.ended)
        sender = producer.sender(address)
        for i in range(N):
            producer.send(sender, message(i))
        producer.wait(lambda: all(sender.outcomes) or producer.ended)
        a.wait(lambda: len(ra.received) >= N)
        b.wait(lambda: len(rb.received) >= N)
        settle_time()
        return FanOut(
            bodies(ra), bodies(rb), list(sender.outcomes), a.view.errors + b.view.errors + producer.view.errors
        )


@pytest.mark.parametrize("kind", ["exchange-fanout", "topic"])
def test_fan_out_reaches_every_subscriber(both: Both, rabbitmq: Broker, kind: str) -> None:
    """Each of two subscribers of `/exchange/amq.fanout` or `/topic/<key>` gets all N messages,
    in order, as at the broker (each subscriber has its own queue there); not half each."""

    def scenario(target: Target) -> FanOut:
        address = "/exchange/amq.fanout" if kind == "exchange-fanout" else f"/topic/{unique_address('fan')}"
        return fan_out(target, address)

    try:
        direct, through = both(scenario)
    finally:
        # RabbitMQ 3.10 leaves the queue of a /exchange or /topic receiver behind after it
        # detaches (non-durable, not auto-delete): remove them, or every later amq.fanout
        # message piles up in them.
        delete_queues(rabbitmq, subscription_queues(rabbitmq, "amq.fanout"))
    assert direct == FanOut(list(range(N)), list(range(N)), [("accepted", None)] * N, [])
    assert through == direct


# --- 2. refused requests ---------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    errors: Errors
    link_attached: bool
    outcomes: list[Any]
    same_connection_after: str
    bystander: str


def round_trip_on_new_session(peer: Peer) -> str:
    """Whether the client's connection still works: a send and receive on a new session."""
    if peer.ended:
        return "connection gone"
    address = unique_address("after")
    receiver = peer.receiver(address, credit=1, new_session=True)
    sender = peer.sender(address, new_session=True)
    peer.send(sender, message("after"))
    peer.wait(lambda: bool(receiver.received) or peer.ended)
    if bodies(receiver) == ["after"]:
        return "round trip ok"
    if peer.ended:
        return "connection gone"
    return f"no round trip within {WAIT}s: got {bodies(receiver)}"


def refused(target: Target, request: str) -> Refusal:
    """One client makes a request RabbitMQ refuses, while a bystander round-trips."""
    with Bystander(target.url) as bystander, Peer(target.url) as peer:
        if request == "user-id":
            link = peer.sender(unique_address("uid"), new_session=True)
            peer.wait(lambda: link.remote_opened or bool(peer.view.errors))
            peer.send(link, message("not mine", user_id=b"someone-else"))
        elif request == "missing-exchange":
            link = peer.sender(f"/exchange/{unique_address('missing')}", new_session=True)
        elif request == "dynamic-target":
            link = peer.sender(None, dynamic=True, new_session=True)
        else:
            link = peer.receiver(f"/amq/queue/{unique_address('missing')}", credit=1, new_session=True)
        peer.wait(lambda: bool(peer.view.errors))
        settle_time()
        after = round_trip_on_new_session(peer)
        return Refusal(list(peer.view.errors), link.remote_opened, list(link.outcomes), after, bystander.result())


REFUSALS = {
    # BROKERS.md: RabbitMQ ends the session (not the link, not the connection).
    "user-id": Refusal([("session", "amqp:precondition-failed")], True, [None], "round trip ok", BYSTANDER_OK),
    "missing-exchange": Refusal([("session", "amqp:not-found")], False, [], "round trip ok", BYSTANDER_OK),
    "missing-amq-queue-receiver": Refusal([("session", "amqp:not-found")], False, [], "round trip ok", BYSTANDER_OK),
    # Measured here: RabbitMQ 3.10.8 makes no node for a dynamic target (a JMS temporary
    # queue's producer asks for one); qpid-flow once answered it as an anonymous relay.
    "dynamic-target": Refusal([("session", "amqp:not-implemented")], False, [], "round trip ok", BYSTANDER_OK),
}


@pytest.mark.parametrize("request_kind", list(REFUSALS))
def test_refused_request_reaches_that_client_only(both: Both, request_kind: str) -> None:
    """A request RabbitMQ refuses (a message whose user_id is not the connection's user, a sender
    to a missing exchange or with a dynamic target, a receiver from a missing /amq/queue) ends
    that client's session with RabbitMQ's condition; the client's connection still works on a
    new session, and a bystander connection round-trips throughout."""
    direct, through = both(lambda target: refused(target, request_kind))
    assert direct == REFUSALS[request_kind]
    assert through == direct


# --- 3. messages RabbitMQ cannot take --------------------------------------------------------


@dataclass(frozen=True)
class Untakeable:
    errors: Errors
    outcomes: list[Any]
    bystander: str
    #: AMQP 1.0 connections the broker accepted as the client's own user while it was there
    client_user_logins: int
    #: AMQP 1.0 connections the broker accepted, any user, in the quiet period after the client left
    logins_after_client_left: int
    connections_of_client_user_left: int
    later_consumer: list[Any]


QUIET = 6.0  # longer than qpid-flow's default reconnect_max_delay (5 s) plus RabbitMQ's 3 s close


def untakeable(target: Target, kind: str) -> Untakeable:
    """A client with a user of its own sends a message RabbitMQ cannot take, with a bystander
    round-tripping; afterwards, nothing reconnects and the message never turns up."""
    user = f"untakeable-{uuid.uuid4().hex[:8]}"
    broker = target.broker
    ctl(broker, "add_user", user, "pw")
    ctl(broker, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
    try:
        address = unique_address("untakeable")
        bad = message("x", instructions={"x-opt-qpid-flow-test": "y"}) if kind == "delivery-annotations" else None
        if bad is None:
            bad = message([1, 2, 3])  # an amqp-value holding a list
        started = time.time()
        with Bystander(target.url) as bystander, Peer(target.url_as(user, "pw")) as peer:
            sender = peer.sender(address)
            peer.wait(lambda: sender.remote_opened or peer.ended)
            peer.send(sender, bad)
            peer.wait(lambda: peer.ended, 2 * WAIT)
            seen = bystander.result()
        left = time.time()
        client_logins = amqp10_logins_since(broker, started).count(user)
        time.sleep(QUIET)  # fixed: a while in which no reconnect may sign in again
        after = len(amqp10_logins_since(broker, left))
        still = open_connections_of(broker, user)
        with Peer(target.url) as consumer:
            receiver = consumer.receiver(address, credit=5)
            consumer.wait(lambda: bool(receiver.received), 1.0)
            later = bodies(receiver)
        return Untakeable(list(peer.view.errors), list(sender.outcomes), seen, client_logins, after, still, later)
    finally:
        ctl(broker, "delete_user", user)


@pytest.mark.parametrize("kind", ["delivery-annotations", "amqp-value-list"])
def test_message_the_broker_cannot_take_ends_that_connection_only(both: Both, kind: str) -> None:
    """A message with delivery annotations, or whose body is an amqp-value list, crashes RabbitMQ
    3.10.8's AMQP 1.0 session: it drops that connection (no close frame; the client sees a
    transport framing error) and keeps nothing. Through qpid-flow the same reaches that client
    only: the bystander round-trips, nobody reconnects or resends after the client has gone (no
    AMQP 1.0 login at the broker in the quiet period, no connection of its user left), and the
    message is never delivered to a later consumer. (An amqp-sequence body is taken: not here.)"""
    direct, through = both(lambda target: untakeable(target, kind))
    assert direct.errors == [("transport", "amqp:connection:framing-error")]
    assert direct == Untakeable(direct.errors, [None], BYSTANDER_OK, 1, 0, 0, [])
    assert through == direct


# --- 4. missing queue ------------------------------------------------------------------------


@dataclass(frozen=True)
class MissingQueue:
    send_outcomes: list[Any]
    send_errors: Errors
    queue_exists_after_send: bool
    receiver_attached: bool
    receive_errors: Errors


def missing_queue(target: Target) -> MissingQueue:
    """Send to, then receive from, `/amq/queue/<missing>`."""
    name = unique_address("missing")
    with Peer(target.url) as p:
        sender = p.sender(f"/amq/queue/{name}")
        p.send(sender, message("lost"))
        p.wait(lambda: all(sender.outcomes) or bool(p.view.errors))
        settle_time()
        send_errors = list(p.view.errors)
    try:
        target.broker.queue_depth(name)
        exists = True
    except LookupError:
        exists = False
    with Peer(target.url) as p:
        receiver = p.receiver(f"/amq/queue/{name}", credit=1)
        p.wait(lambda: bool(p.view.errors))
        settle_time()
        return MissingQueue(list(sender.outcomes), send_errors, exists, receiver.remote_opened, list(p.view.errors))


def test_missing_queue(both: Both) -> None:
    """BROKERS.md: sending to a missing `/amq/queue/NAME` is accepted and the message silently
    dropped (no queue appears); a receiver from it has its session ended (amqp:not-found)."""
    direct, through = both(missing_queue)
    assert direct == MissingQueue([("accepted", None)], [], False, False, [("session", "amqp:not-found")])
    assert through == direct


# --- 5. drain --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    received: list[Any]
    drained: bool
    credit_after: int
    errors: Errors
    next_consumer: list[tuple[Any, int]]


def drain_with_messages_waiting(target: Target) -> Drain:
    """3 messages queued; a receiver with no credit asks for a drain of 5; then a fresh consumer
    takes what is left."""
    address = unique_address("drain")
    with Peer(target.url) as p:
        sender = p.sender(address)
        for i in range(3):
            p.send(sender, message(i))
        p.wait(lambda: all(sender.outcomes) or p.ended)
        receiver = p.receiver(address, credit=0)
        p.wait(lambda: receiver.remote_opened or bool(p.view.errors))
        p.drain(receiver, 5)
        p.wait(lambda: receiver.drained or bool(p.view.errors))
        settle_time()
        seen = Drain(bodies(receiver), receiver.drained, receiver.credit, list(p.view.errors), [])
    with Peer(target.url) as p:
        receiver = p.receiver(address, credit=10)
        p.wait(lambda: len(receiver.received) >= 3, 2.0)
        settle_time()
        return Drain(
            seen.received,
            seen.drained,
            seen.credit_after,
            seen.errors,
            [(r.body, r.delivery_count) for r in receiver.received],
        )


def test_drain_with_messages_waiting(both: Both) -> None:
    """A drain of 5 with 3 messages waiting. RabbitMQ 3.10.8, measured here with Proton: it sends
    2 of them, then ends the session with amqp:internal-error (a function_clause on send_drained
    in rabbit_classic_queue); the drain never completes and all 3 go back to the queue (the
    accepts of the 2 were lost with the session), so the next consumer gets 0, 1, 2.
    (BROKERS.md reports "2, then drained" with rhea.) Through qpid-flow the client sees the same.

    The crash does not always stay in the session: in some runs RabbitMQ drops the whole
    connection instead (no close frame), directly or through qpid-flow, which passes that on
    as it came. Either end of the crash is the broker's; everything else must be equal."""
    crashed = ({("session", "amqp:internal-error")}, {("transport", "amqp:connection:framing-error")})
    direct, through = both(drain_with_messages_waiting)
    assert replace(direct, errors=[]) == Drain([0, 1], False, 3, [], [(0, 0), (1, 0), (2, 0)])
    assert set(direct.errors) in crashed, direct.errors
    assert replace(through, errors=[]) == replace(direct, errors=[])
    assert set(through.errors) in crashed, through.errors


# --- 6. TTL ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ttl:
    after_expiry: list[Any]
    fresh: list[Any]
    errors: Errors


def ttl(target: Target) -> Ttl:
    """A message with a 200 ms TTL waits 1 s in the queue; then a consumer attaches, and a fresh
    message follows."""
    address = unique_address("ttl")
    with Peer(target.url) as p:
        sender = p.sender(address)
        p.send(sender, message("short-lived", ttl=0.2))
        p.wait(lambda: all(sender.outcomes) or p.ended)
        time.sleep(1.0)  # fixed: the time to live (200 ms) must run out while it waits in the queue
        receiver = p.receiver(address, credit=5)
        p.wait(lambda: bool(receiver.received), 1.0)
        expired = bodies(receiver)
        p.send(sender, message("fresh"))
        p.wait(lambda: len(receiver.received) > len(expired))
        settle_time()
        return Ttl(expired, bodies(receiver)[len(expired) :], list(p.view.errors))


def test_expired_message_is_not_delivered(both: Both) -> None:
    """An expired message is never delivered; a fresh one is."""
    direct, through = both(ttl)
    assert direct == Ttl([], ["fresh"], [])
    assert through == direct


# --- 7. redelivery count ---------------------------------------------------------------------


@dataclass(frozen=True)
class Redelivery:
    first: list[tuple[Any, int]]
    errors: Errors
    again: list[tuple[Any, int]]


def redelivery(target: Target) -> Redelivery:
    """Consume a message, settle it modified(delivery-failed), consume it again (a new session:
    the first may be gone) and compare the header delivery-count of both deliveries."""
    address = unique_address("redelivery")
    with Peer(target.url) as p:
        sender = p.sender(address)
        p.send(sender, message("m"))
        p.wait(lambda: all(sender.outcomes) or p.ended)
        first = p.receiver(address, credit=1, auto_accept=False, new_session=True)
        p.wait(lambda: bool(first.received) or p.ended)
        if first.received:
            p.settle(first, 0, "modified", delivery_failed=True)
        if not p.wait(lambda: bool(p.view.errors), 1.0):
            p.flow(first, 1)  # a broker that takes the outcome may redeliver on this link
        again = p.receiver(address, credit=1, new_session=True)
        p.wait(lambda: bool(again.received) or len(first.received) > 1)
        settle_time()
        return Redelivery(
            [(r.body, r.delivery_count) for r in first.received],
            list(p.view.errors),
            [(r.body, r.delivery_count) for r in again.received],
        )


def test_redelivery_count(both: Both) -> None:
    """modified(delivery-failed) and then the delivery-count of the next delivery. RabbitMQ
    3.10.8, measured here: it accepts no `modified` outcome at all, it ends the session with
    amqp:invalid-field; the message goes back and is delivered again with delivery-count 0 (it
    does not count redeliveries). Through qpid-flow the client sees the same."""
    direct, through = both(redelivery)
    assert direct == Redelivery([("m", 0)], [("session", "amqp:invalid-field")], [("m", 0)])
    assert through == direct


# --- 8. SASL PLAIN ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Login:
    opened: bool
    errors: Errors
    round_trip: str


@dataclass(frozen=True)
class Logins:
    right_password: Login
    wrong_password: Login
    user_without_permissions: Login


def login(url: str) -> Login:
    with Peer(url) as p:
        trip = round_trip_on_new_session(p) if p.view.remote_opened else "not opened"
        settle_time()
        return Login(p.view.remote_opened, list(p.view.errors), trip)


def sasl_plain(target: Target) -> Logins:
    """Three clients authenticate with SASL PLAIN: guest/guest, guest/wrong, and a user made
    with `rabbitmqctl add_user` that has no permissions on "/"."""
    user = f"noperm-{uuid.uuid4().hex[:8]}"
    ctl(target.broker, "add_user", user, "pw")
    try:
        return Logins(
            login(target.url_as("guest", "guest")),
            login(target.url_as("guest", "wrong")),
            login(target.url_as(user, "pw")),
        )
    finally:
        ctl(target.broker, "delete_user", user)


def test_sasl_plain_identity_is_the_clients(both: Both) -> None:
    """The client's own PLAIN credentials decide (qpid-flow's --broker URL is guest:guest):
    guest/guest works; a wrong password is refused at SASL (amqp:unauthorized-access); a user
    with no permissions on "/" is let in (open answered) and its connection closed with
    amqp:unauthorized-access at its first attach (measured here: RabbitMQ 3.10 checks vhost
    access at the first session)."""
    direct, through = both(sasl_plain)
    assert direct == Logins(
        Login(True, [], "round trip ok"),
        Login(False, [("transport", "amqp:unauthorized-access")], "not opened"),
        Login(True, [("connection", "amqp:unauthorized-access")], "connection gone"),
    )
    assert through == direct


# --- 9. vhost --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vhost:
    send_outcomes: list[Any]
    received_in_default_vhost: list[Any]
    received_in_vhost: list[Any]
    errors: Errors


def vhost(target: Target) -> Vhost:
    """A message sent with hostname `vhost:<name>` is received in that vhost, not in "/"."""
    name = f"vh-{uuid.uuid4().hex[:8]}"
    broker = target.broker
    ctl(broker, "add_vhost", name)
    try:
        ctl(broker, "set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        address = unique_address("vhost")
        with Peer(target.url, virtual_host=f"vhost:{name}") as p:
            sender = p.sender(address)
            p.send(sender, message("in-vhost"))
            p.wait(lambda: all(sender.outcomes) or p.ended)
            errors = list(p.view.errors)
        with Peer(target.url) as p:
            receiver = p.receiver(address, credit=1)
            p.wait(lambda: bool(receiver.received), 1.0)
            in_default = bodies(receiver)
            errors += p.view.errors
        with Peer(target.url, virtual_host=f"vhost:{name}") as p:
            receiver = p.receiver(address, credit=1)
            p.wait(lambda: bool(receiver.received))
            settle_time()
            return Vhost(list(sender.outcomes), in_default, bodies(receiver), errors + p.view.errors)
    finally:
        ctl(broker, "delete_vhost", name)


def test_vhost_is_chosen_by_the_clients_hostname(both: Both) -> None:
    """BROKERS.md: the vhost is chosen by the open frame's hostname (`vhost:NAME`)."""
    direct, through = both(vhost)
    assert direct == Vhost([("accepted", None)], [], ["in-vhost"], [])
    assert through == direct


# --- 10. durable subscription ----------------------------------------------------------------


@dataclass(frozen=True)
class DurableSubscription:
    attached: bool
    detach_answer: tuple[str, str | None] | None
    received_after_reattach: list[Any]
    #: (durable, messages) of each queue RabbitMQ made for the subscription, after the reattach
    subscription_queues: list[tuple[bool, int]]
    errors: Errors


def durable_subscription(target: Target) -> DurableSubscription:
    """A receiver on `/topic/<k>` with a fixed link name and container id, durable terminus
    (unsettled-state, expiry never) attaches, detaches without closing, and leaves; 4 messages
    are published meanwhile; the same container reattaches the same link."""
    key = unique_address("durable")
    address = f"/topic/{key}"
    container_id = f"subscriber-{key}"
    link_name = f"subscription-{key}"
    try:
        with Peer(target.url, container_id=container_id) as p:
            sub = p.receiver(address, name=link_name, durable=True)
            p.wait(lambda: sub.remote_opened or bool(p.view.errors))
            attached = sub.remote_opened
            p.detach(sub, close=False)
            detach_answer = sub.remote_closed
            errors = list(p.view.errors)
        with Peer(target.url) as p:
            sender = p.sender(address)
            for i in range(4):
                p.send(sender, message(i))
            p.wait(lambda: all(sender.outcomes) or p.ended)
            errors += p.view.errors
        with Peer(target.url, container_id=container_id) as p:
            sub = p.receiver(address, name=link_name, durable=True, credit=10)
            p.wait(lambda: len(sub.received) >= 4 or bool(p.view.errors), 2.0)
            settle_time()
            received = bodies(sub)
            p.detach(sub, close=False)
            errors += p.view.errors
        queues = queue_rows(target.broker, subscription_queues(target.broker, "amq.topic", key))
        return DurableSubscription(attached, detach_answer, received, queues, errors)
    finally:
        delete_queues(target.broker, subscription_queues(target.broker, "amq.topic", key))


def test_durable_subscription_across_reconnect(both: Both) -> None:
    """What RabbitMQ 3.10.8 does with a durable `/topic` subscription, measured here: it makes a
    durable server-named queue per attach, so the reattached link gets a new, empty queue and
    none of the 4 messages; they stay in the first queue. The detach is answered with a detach
    (not closed). Through qpid-flow the client sees the same, and the broker holds the same."""
    direct, through = both(durable_subscription)
    assert direct == DurableSubscription(True, ("link-detach", None), [], [(True, 0), (True, 4)], [])
    assert through == direct


# --- 11. a consumer leaving with prefetched messages -----------------------------------------


@dataclass(frozen=True)
class Leaving:
    a_received: list[Any]
    a_detach_answer: tuple[str, str | None] | None
    b_while_a_connected: list[Any]
    b_after_a_closed: list[Any]
    errors: Errors


def consumer_leaving(target: Target, release_first: bool) -> Leaving:
    """20 queued. Consumer A grants 10, accepts the first 2, then (release_first: releases the
    other 8) detaches; consumer B grants 30 while A's connection stays open, then A closes."""
    address = unique_address("leaving")
    with Peer(target.url) as p:
        sender = p.sender(address)
        for i in range(20):
            p.send(sender, message(i))
        p.wait(lambda: all(sender.outcomes) or p.ended)
    a = Peer(target.url)
    try:
        ra = a.receiver(address, credit=10, auto_accept=False)
        a.wait(lambda: len(ra.received) >= 10 or a.ended)
        settle_time()
        a_received = bodies(ra)
        for i in range(min(2, len(ra.received))):
            a.settle(ra, i, "accepted")
        if release_first:
            for i in range(2, len(ra.received)):
                a.settle(ra, i, "released")
        a.detach(ra, close=True)
        with Peer(target.url) as b:
            rb = b.receiver(address, credit=30)
            b.wait(lambda: len(rb.received) >= 18, 2.0)
            settle_time()
            while_connected = bodies(rb)
            a.close()
            b.wait(lambda: len(rb.received) >= 18, 2.0)
            settle_time()
            return Leaving(a_received, ra.remote_closed, while_connected, bodies(rb), a.view.errors + b.view.errors)
    finally:
        a.close()


def test_consumer_leaving_with_unsettled_messages(both: Both) -> None:
    """RabbitMQ 3.10.8, measured here: when a consumer detaches holding unsettled deliveries, it
    neither redelivers them nor lets anyone else have them while that consumer's connection is
    open (cf. BROKERS.md, released messages of a link detached with credit outstanding): the next
    consumer gets only 10..19; the 8 come back (2..9) when A's connection closes. Through
    qpid-flow the same: not all 18 at once, not fewer after A has gone."""
    direct, through = both(lambda target: consumer_leaving(target, release_first=False))
    assert direct == Leaving(
        list(range(10)),
        ("link-detach", None),  # RabbitMQ answers a closing detach with a non-closing one
        list(range(10, 20)),
        list(range(10, 20)) + list(range(2, 10)),
        [],
    )
    assert through == direct


def test_consumer_releasing_before_it_leaves(both: Both) -> None:
    """The well-behaved variant: A releases the 8 it holds before detaching; B gets all the
    remaining 18 at once, in queue order."""
    direct, through = both(lambda target: consumer_leaving(target, release_first=True))
    assert direct == Leaving(list(range(10)), ("link-detach", None), list(range(2, 20)), list(range(2, 20)), [])
    assert through == direct


@dataclass(frozen=True)
class CreditTakenBack:
    reduced: list[Any]
    other: list[Any]
    errors: Errors


def credit_taken_back(target: Target) -> CreditTakenBack:
    """Consumer A grants 5, gets one message, then takes back the 4 left (a flow with
    link-credit 0, AMQP 2.6.7); B attaches with 10, and 4 more messages are sent."""
    address = unique_address("credit-back")
    with Peer(target.url) as a, Peer(target.url) as b, Peer(target.url) as producer:
        sender = producer.sender(address)
        producer.send(sender, message(0))
        reduced = a.receiver(address, credit=5, auto_accept=False)
        a.wait(lambda: bool(reduced.received))
        a.flow(reduced, -4)
        a.wait(lambda: False, 0.5)  # fixed: the lowered credit must reach the broker first
        other = b.receiver(address, credit=10)
        b.wait(lambda: other.remote_opened or b.ended)
        for i in range(1, 5):
            producer.send(sender, message(i))
        b.wait(lambda: len(other.received) >= 4, 3.0)
        settle_time()
        return CreditTakenBack(bodies(reduced), bodies(other), a.view.errors + b.view.errors + producer.view.errors)


def test_a_consumer_taking_back_credit(both: Both) -> None:
    """The broker stops sending to a consumer that took its credit back: another consumer
    gets the messages. Through qpid-flow the broker kept the old credit and sent 2 of the 4
    to the reduced consumer's upstream link, where they waited for its credit (B got 2)."""
    direct, through = both(credit_taken_back)
    assert direct == CreditTakenBack([0], [1, 2, 3, 4], [])
    assert through == direct


# --- 12. other client libraries --------------------------------------------------------------


def test_proton_c_examples(both: Both, proton_c_examples: ProtonCExamples) -> None:
    """Proton C's `send` and `receive` examples (no SASL credentials, as shipped): 100 messages
    sent and acknowledged, then 100 received in order, both ways."""

    def scenario(target: Target) -> dict[str, Any]:
        return run_c_examples(proton_c_examples, target.host, target.port, unique_address("c"), 100)

    direct, through = both(scenario)
    assert direct == {
        "send_rc": 0,
        "send_summary": ["100 messages sent and acknowledged"],
        "receive_rc": 0,
        "receive_summary": ["100 messages received"],
        "bodies": [f'{{"sequence"={n}}}' for n in range(1, 101)],
    }
    assert through == direct


def test_rhea_client(both: Both) -> None:
    """rhea (JavaScript, SASL PLAIN guest/guest): send 20, receive 20, same bodies, both ways."""

    def scenario(target: Target) -> dict[str, Any]:
        address = unique_address("rhea")
        sent = run_rhea(target.url, "send", address, "20")
        got = run_rhea(target.url, "receive", address, "20")
        return {"sent": sent, "received": got}

    direct, through = both(scenario)
    assert direct["sent"]["outcomes"] == {"accepted": 20} and direct["sent"]["errors"] == []
    assert direct["received"]["received"] == [f"rhea-{i}" for i in range(20)]
    assert not direct["sent"]["timed_out"] and not direct["received"]["timed_out"]
    through["sent"]["address"] = direct["sent"]["address"]  # unique per run
    through["received"]["address"] = direct["received"]["address"]
    # Credit is what qpid-flow owns (its producer window, not the broker's grant).
    assert direct["sent"].pop("first_credit") > 0 and through["sent"].pop("first_credit") > 0
    assert through == direct


# --- the open frame's idle timeout ----------------------------------------------------------


def idle_timeout_seen(target: Target) -> float:
    """The idle-time-out of the open frame the client gets back (RabbitMQ's heartbeat)."""
    with Peer(target.url) as p:
        return float(p.call(lambda: p._conn.transport.remote_idle_timeout))


def test_the_client_is_told_the_brokers_idle_timeout(both: Both) -> None:
    """The client's open is answered with the broker's idle-time-out, not half of it: Proton
    advertises half of the local value, so qpid-flow asks for twice what the broker said."""
    direct, through = both(idle_timeout_seen)
    assert direct == 60.0  # RabbitMQ 3.10's default heartbeat
    assert through == direct


class _OpenRecorder(MessagingHandler):
    """A Proton listener standing in for a broker: it records each open's idle-time-out
    (RabbitMQ does not show what a client asked for)."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.asked: dict[str, float] = {}
        self.listening = threading.Event()

    def on_start(self, event: Any) -> None:
        self.acceptor = event.container.listen(f"127.0.0.1:{self.port}")
        self.listening.set()

    def on_connection_opened(self, event: Any) -> None:
        connection = event.connection
        self.asked[connection.remote_container] = connection.transport.remote_idle_timeout


class _Opener(MessagingHandler):
    def __init__(self, url: str, heartbeat: float) -> None:
        super().__init__()
        self.url, self.heartbeat = url, heartbeat

    def on_start(self, event: Any) -> None:
        event.container.connect(self.url, heartbeat=self.heartbeat, reconnect=False, allowed_mechs="ANONYMOUS")

    def on_connection_opened(self, event: Any) -> None:
        event.connection.close()


def test_the_broker_is_told_the_clients_idle_timeout(qpid_flow_process: StartRouter) -> None:
    """The other way: the broker gets the idle-time-out the client asked for, as it would
    directly (a Proton listener plays the broker and records it)."""
    listener = _OpenRecorder(free_port())
    broker = Container(listener)
    broker.allow_insecure_mechs = True
    thread = threading.Thread(target=broker.run, daemon=True)
    thread.start()
    try:
        assert listener.listening.wait(5)
        router = qpid_flow_process(broker_url=f"amqp://127.0.0.1:{listener.port}")
        for name, url in (("direct", f"amqp://127.0.0.1:{listener.port}"), ("through", router.url)):
            client = Container(_Opener(url, heartbeat=40.0))
            client.container_id = name
            client.run()
        assert wait_until(lambda: {"direct", "through"} <= set(listener.asked), 10)
        assert listener.asked["direct"] == 20.0  # Proton's client advertises half its heartbeat
        assert listener.asked["through"] == listener.asked["direct"]
    finally:
        broker.stop()
        thread.join(5)


# --- the SASL mechanisms offered --------------------------------------------------------------


def mechanisms_offered(target: Target) -> list[str]:
    """The sasl-mechanisms a client is offered (read off the wire)."""
    reader = MechanismsReader()
    with socket.create_connection((target.host, target.port), timeout=10) as sock:
        offered = reader.read_from(sock)
    assert reader.error is None, reader.error
    return list(offered or ())


def test_the_client_is_offered_the_brokers_mechanisms_in_its_order(both: Both) -> None:
    """A client picks its mechanism from the list and its order: offered another list, a
    client may sign in as someone else than it would at the broker (see below)."""
    direct, through = both(mechanisms_offered)
    assert direct == ["ANONYMOUS", "AMQPLAIN", "PLAIN"]  # RabbitMQ 3.10 with its defaults
    assert through == direct


def test_a_broker_down_at_start_has_its_own_mechanisms_offered_from_the_first_client(
    rabbitmq: Broker, qpid_flow_process: StartRouter
) -> None:
    """qpid-flow learns the broker's mechanisms at start. With the broker down then, the
    first clients were offered a guess (PLAIN, ANONYMOUS) until one client's sign-in had
    gone through: Proton's client, a user in its URL, signed in with PLAIN as that user,
    where at RabbitMQ it signs in ANONYMOUS. Now, until the list is known, each handshake
    asks the broker before offering anything."""
    port = free_port()
    router = qpid_flow_process(broker_url=f"amqp://127.0.0.1:{port}")
    forwarder = Forwarder(port, rabbitmq.port)
    try:
        direct = mechanisms_offered(Target(rabbitmq.url, rabbitmq, through=False))
        through = mechanisms_offered(Target(router.url, rabbitmq, through=True))
        signed_in = stock_client_with_credentials(Target(router.url, rabbitmq, through=True))
    finally:
        forwarder.close()
    assert direct == ["ANONYMOUS", "AMQPLAIN", "PLAIN"]
    assert through == direct
    assert signed_in == "opened"


def stock_client_with_credentials(target: Target) -> str:
    """Proton's BlockingConnection, a user and password in its URL, no mechanism chosen:
    against RabbitMQ's list it signs in ANONYMOUS (Proton looks for PLAIN, finds it inside
    AMQPLAIN, refuses that match and stops looking), as RabbitMQ's anonymous user, so a
    user RabbitMQ does not know still gets in."""
    try:
        connection = BlockingConnection(target.url_as("nobody-here", "pw"), timeout=10)
    except Exception as exc:
        return f"refused: {type(exc).__name__}"
    connection.close()
    return "opened"


def test_a_stock_client_signs_in_as_it_would_at_the_broker(both: Both) -> None:
    direct, through = both(stock_client_with_credentials)
    assert direct == "opened"
    assert through == direct
