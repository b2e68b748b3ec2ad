"""Producer flow control at its edges, standalone, driven one step at a time by scripted
clients (:mod:`.scripted`): a resume racing new transfers, destinations forgotten while
transfers wait, transactions, several producers on one destination, limits tightened
under producers that already hold credit."""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from proton import Delivery

from .harness.frames import FrameSocket, begin_frame, open_frame, sender_attach, transfer_frame
from .harness.net import free_port
from .harness.router import admin_request
from .scripted import ScriptedClient, accept, numbered

pytestmark = pytest.mark.integration


class Admin:
    """qpid-flow's admin API, as an operator's tools call it."""

    def __init__(self, address: str) -> None:
        self.address = address

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        request = admin_request(self.address, path)
        request.method = method
        if body is not None:
            request.data = json.dumps(body).encode()
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def stat(self, name: str) -> dict[str, Any]:
        status, record = self.call("GET", "/v1/destinations/" + quote(name, safe=""))
        assert status == 200, (status, record)
        return record


@dataclass(frozen=True)
class Standalone:
    url: str
    port: int
    admin: Admin


@pytest.fixture
def standalone(qpid_flow_process: Any) -> Callable[[str], Standalone]:
    """Start a standalone qpid-flow with ``config_text``, its admin API on."""

    def start(config_text: str) -> Standalone:
        admin = f"127.0.0.1:{free_port()}"
        process = qpid_flow_process(config_text=config_text, extra_args=["--admin", admin])
        return Standalone(process.url, process.port, Admin(admin))

    return start


@pytest.fixture
def clients() -> Iterator[Callable[[str], ScriptedClient]]:
    made: list[ScriptedClient] = []

    def make(url: str) -> ScriptedClient:
        client = ScriptedClient(url)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.mark.parametrize("consumer_on_the_producers_connection", [True, False])
def test_reject_after_keeps_a_producers_order_when_flow_resumes(
    standalone: Any, clients: Any, consumer_on_the_producers_connection: bool
) -> None:
    """A resume lets the held transfers go at the next turn of the reactor. A transfer that
    arrives in between must wait behind them, not overtake them: one link's messages reach
    the queue in the order they were sent (ActiveMQ's sendFailIfNoSpaceAfterTimeout blocks
    the send itself)."""
    router = standalone('[destinations."ra"]\nflow_stop_count = 5\nflow_resume_count = 5\nreject_after = "30s"\n')
    client = clients(router.url)
    connection = client.connect()
    sender = client.sender(connection, "ra")
    receiver = client.receiver(connection if consumer_on_the_producers_connection else client.connect(), "ra")
    sent = 0
    deadline = time.monotonic() + 25
    # A steady consumer taking 3 at a time; the producer sending up to 7 a turn: the
    # destination goes ON and OFF hundreds of times, each resume racing new transfers.
    while sent < 3000 and time.monotonic() < deadline:
        client.accept_new(receiver)
        for _ in range(7):
            if sender.credit <= 0 or sent == 3000:
                break
            sender.send(numbered(sent))
            sent += 1
        if receiver.credit < 3:
            receiver.flow(3)
        client.container.process()
    receiver.flow(10_000)
    client.pump(lambda: client.accept_new(receiver) == sent, 10, "every message to arrive")
    order = [message.properties["i"] for _, message in client.received(receiver)]
    overtaken = [(a, b) for a, b in itertools.pairwise(order) if b < a]
    assert router.admin.stat("ra")["flowStoppedCount"] > 10  # the race was run, many times
    assert overtaken == []
    assert order == list(range(sent))


def test_a_producer_sending_beyond_its_credit_loses_its_link_not_the_threshold(standalone: Any, clients: Any) -> None:
    """Credit is what holds producers back: a peer that sends without it (no client library
    does; these are hand-written frames) would walk past the stop threshold and the memory
    limit. Its link ends with amqp:link:transfer-limit-exceeded (AMQP 1.0 2.6.7), what it
    sent beyond its credit is not taken, and other clients carry on."""
    router = standalone('[destinations."orders"]\nmax_count = 1000\nflow_stop_count = 10\nflow_resume_count = 5\n')
    peer = FrameSocket(router.port)
    peer.send(open_frame(), begin_frame(), sender_attach("greedy", 0, "orders"))
    assert peer.read_until(lambda: bool(peer.named("flow")))
    credit = peer.named("flow")[0].fields[6]
    assert credit == 11  # stop + 1: the transfer that crosses the threshold is the last one
    peer.send(*[transfer_frame(0, n, n) for n in range(300)])
    assert peer.read_until(lambda: bool(peer.named("detach")))
    detach = peer.named("detach")[0]
    assert detach.condition() == "amqp:link:transfer-limit-exceeded"
    record = router.admin.stat("orders")
    assert record["depth"] == 11 and record["enqueued"] == 11
    # The connection is still open, and another producer's messages still go in.
    assert not peer.closed_by_peer and not peer.named("close")
    client = clients(router.url)
    receiver = client.receiver(client.connect(), "orders", credit=20)
    client.pump(lambda: len(client.received(receiver)) == 11, 10, "the 11 admitted messages")
    assert [message.body for _, message in client.received(receiver)] == list(range(11))
    peer.close()


def test_a_destination_with_a_transfer_held_for_it_is_not_forgotten(standalone: Any, clients: Any) -> None:
    """An anonymous-relay transfer held for a destination whose producers an operator
    stopped: the destination has no producer link, consumer or message of its own, but it
    must outlive destination_idle_timeout, or the transfer would wait for good instead of
    being rejected when reject_after passes (seed 002)."""
    router = standalone('destination_idle_timeout = "1s"\n[destinations."x.>"]\nreject_after = "4s"\n')
    status, _ = router.admin.call("POST", "/v1/producers/stop", {"pattern": "x.a"})
    assert status == 200
    client = clients(router.url)
    sender = client.sender(client.connect(), None)
    started = time.monotonic()
    delivery = sender.send(numbered(0, to="x.a"))
    client.pump(None, 0.5)
    assert router.admin.stat("x.a")["transfersHeld"] == 1
    client.pump(lambda: delivery.remote_state != 0, 10, "the held transfer's outcome")
    assert delivery.remote_state == Delivery.REJECTED
    assert time.monotonic() - started >= 3.9  # at reject_after, not before


def test_a_destination_with_a_settlement_waiting_on_it_is_not_forgotten(standalone: Any, clients: Any) -> None:
    """An anonymous-relay transfer to a stopped destination is enqueued with its settlement
    delayed; a consumer takes it and leaves. The destination is then empty and has no
    link, but the producer's accepted still waits on it: after destination_idle_timeout
    and more, starting the producers again must still settle it."""
    router = standalone('destination_idle_timeout = "1s"\n')
    router.admin.call("POST", "/v1/producers/stop", {"pattern": "y"})
    client = clients(router.url)
    sender = client.sender(client.connect(), None)
    delivery = sender.send(numbered(0, to="y"))
    client.pump(None, 0.5)
    assert router.admin.stat("y")["producersBlocked"] == 1
    receiver = client.receiver(client.connect(), "y", credit=1)
    client.pump(lambda: len(client.received(receiver)) == 1, 5, "the message")
    accept(client.received(receiver)[0][0])
    receiver.close()
    client.pump(None, 3.5)  # three housekeeping turns past the idle timeout
    assert delivery.remote_state == 0
    assert router.admin.call("GET", "/v1/destinations/y")[0] == 200
    router.admin.call("POST", "/v1/producers/start", {"pattern": "y"})
    client.pump(lambda: delivery.remote_state != 0, 5, "the delayed settlement")
    assert delivery.remote_state == Delivery.ACCEPTED


def test_the_links_view_marks_blocked_the_producers_the_destination_counts_blocked(
    standalone: Any, clients: Any
) -> None:
    """``producersBlocked`` counts an anonymous-relay producer whose settlement waits and a
    named one whose transfers are held unforwarded; ``qpid-flow stat links`` showed both
    unblocked (only "no credit" counted there), so the two views disagreed."""
    router = standalone('memory_limit = "16 KB"\n[destinations."held"]\nflow_stop_count = 1\nflow_resume_count = 1\n')
    client = clients(router.url)
    relay = client.sender(client.connect(), None)
    for n in range(3):
        relay.send(numbered(n, to="held"))  # the second turns flow ON: from it, settlements wait
    named = client.sender(client.connect(), "big")
    client.pump(lambda: named.credit > 10, 5, "credit for the named producer")
    for n in range(10):
        named.send(numbered(n, size=2000))  # past memory_limit: the later ones are held
    client.pump(None, 0.5)
    assert named.credit > 0  # not blocked for want of credit
    status, links = router.admin.call("GET", "/v1/links")
    assert status == 200, links
    blocked = {link["address"] for link in links["links"] if link["blocked"]}
    assert router.admin.stat("held")["producersBlocked"] == 1
    assert router.admin.stat("big")["producersBlocked"] == 1
    assert blocked == {None, "big"}, links  # the relay link has no address of its own


@pytest.mark.parametrize(("stop", "resume"), [(10, 5), (100, 50)])
def test_two_producers_on_a_flow_controlled_destination_both_get_through(
    standalone: Any, clients: Any, stop: int, resume: int
) -> None:
    """Two flooding producers and a steady consumer: flow turns ON and OFF all along, and
    each turn the credit is shared. Before, the producer whose settlement asked first took
    the whole headroom every time: 13,903-18,883 messages against 0."""
    router = standalone(f'[destinations."fair"]\nflow_stop_count = {stop}\nflow_resume_count = {resume}\n')
    client = clients(router.url)
    senders = [client.sender(client.connect(), "fair") for _ in range(2)]
    receiver = client.receiver(client.connect(), "fair")
    sent = [0, 0]
    deadline = time.monotonic() + 60
    turns = 0
    # Until flow went ON eight times, however fast this machine runs the loop.
    while time.monotonic() < deadline:
        turns += 1
        if turns % 200 == 0 and router.admin.stat("fair")["flowStoppedCount"] >= 8:
            break
        for index, sender in enumerate(senders):
            while sender.credit > 0:
                sender.send(numbered(sent[index], producer=index))
                sent[index] += 1
        client.accept_new(receiver)
        if receiver.credit < 2:
            receiver.flow(max(1, stop // 5))
        client.container.process()
    through = [0, 0]
    for _, message in client.received(receiver):
        through[message.properties["producer"]] += 1
    assert router.admin.stat("fair")["flowStoppedCount"] >= 8  # the race was run, many times
    assert min(through) > 0.2 * max(through), through


def _send_while_credit(sender: Any, count: int, start: int = 0) -> list[Delivery]:
    deliveries = []
    for index in range(start, start + count):
        if sender.credit <= 0:
            break
        deliveries.append(sender.send(numbered(index)))
    return deliveries


def test_limits_tightened_under_a_producer_holding_credit_still_bound_the_depth(standalone: Any, clients: Any) -> None:
    """A producer attached under stop 1000 holds a window of credit; the policy changes to
    stop 10 at runtime. Credit cannot be taken back, so what it sends past stop + 1 waits,
    unforwarded and unsettled, and goes in, in order, as consumers make room (seed 004:
    policies change at runtime; the peak stays stop + 1)."""
    router = standalone('[destinations."t1"]\nflow_stop_count = 1000\nflow_resume_count = 900\n')
    client = clients(router.url)
    sender = client.sender(client.connect(), "t1")
    window = int(sender.credit)
    assert window >= 50
    status, _ = router.admin.call("PUT", "/v1/destinations/t1", {"flow_stop_count": 10, "flow_resume_count": 5})
    assert status == 200
    deliveries = _send_while_credit(sender, window)
    client.pump(None, 1.0)
    record = router.admin.stat("t1")
    assert (record["depth"], record["transfersHeld"]) == (11, window - 11)
    assert sum(1 for d in deliveries if d.remote_state == Delivery.ACCEPTED) == 11
    receiver = client.receiver(client.connect(), "t1", credit=window)
    client.pump(lambda: client.accept_new(receiver) == window, 15, "every held transfer to go in")
    assert [message.properties["i"] for _, message in client.received(receiver)] == list(range(window))
    client.pump(lambda: all(d.remote_state == Delivery.ACCEPTED for d in deliveries), 5, "every outcome")


def test_reject_after_set_at_runtime_times_every_held_transfer_from_then(standalone: Any, clients: Any) -> None:
    """Transfers held under plain flow (sent past stop + 1 on credit given before), then
    reject_after = 1s set at runtime: each is rejected once it has waited that long (seed
    002, sendFailIfNoSpaceAfterTimeout). Only the first held transfer was asked again, so
    each of the others started its clock when the one ahead went: the n-th after n s."""
    router = standalone('[destinations."t5"]\nflow_stop_count = 1000\nflow_resume_count = 900\n')
    client = clients(router.url)
    sender = client.sender(client.connect(), "t5")
    assert router.admin.call("PUT", "/v1/destinations/t5", {"flow_stop_count": 2, "flow_resume_count": 1})[0] == 200
    deliveries = _send_while_credit(sender, 8)
    client.pump(None, 1.0)
    assert router.admin.stat("t5")["transfersHeld"] == 5  # 3 admitted: stop + 1
    settings = {"flow_stop_count": 2, "flow_resume_count": 1, "reject_after": "1s"}
    assert router.admin.call("PUT", "/v1/destinations/t5", settings)[0] == 200
    changed = time.monotonic()
    client.pump(lambda: all(d.remote_state for d in deliveries), 10, "every outcome")
    assert time.monotonic() - changed < 2.5  # every one at reject_after, not 5 s for the fifth
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 3 + [Delivery.REJECTED] * 5


def test_reject_after_shortened_at_runtime_times_the_held_transfers_from_then(standalone: Any, clients: Any) -> None:
    """Transfers held under reject_after = 20s, then reject_after = 1s: each is rejected a
    second after the change, not when its 20 s run out (the first held kept its old
    deadline, and the rest waited behind it)."""
    router = standalone('[destinations."t6"]\nflow_stop_count = 1000\nflow_resume_count = 900\n')
    client = clients(router.url)
    sender = client.sender(client.connect(), "t6")
    settings: dict[str, Any] = {"flow_stop_count": 2, "flow_resume_count": 1, "reject_after": "20s"}
    assert router.admin.call("PUT", "/v1/destinations/t6", settings)[0] == 200
    deliveries = _send_while_credit(sender, 8)
    client.pump(None, 1.0)
    assert router.admin.stat("t6")["transfersHeld"] == 5
    assert router.admin.call("PUT", "/v1/destinations/t6", {**settings, "reject_after": "1s"})[0] == 200
    changed = time.monotonic()
    client.pump(lambda: all(d.remote_state for d in deliveries), 25, "every outcome")
    assert time.monotonic() - changed < 2.5
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 3 + [Delivery.REJECTED] * 5


def test_an_operator_stop_holds_what_a_producer_sends_on_credit_it_already_had(standalone: Any, clients: Any) -> None:
    """producers stop after the producer got its credit: nothing it sends goes in until
    producers start; then everything does, in order."""
    router = standalone('[destinations."t2"]\nmax_count = 100000\n')
    client = clients(router.url)
    sender = client.sender(client.connect(), "t2")
    assert router.admin.call("POST", "/v1/producers/stop", {"pattern": "t2"})[0] == 200
    deliveries = _send_while_credit(sender, 50)
    assert len(deliveries) == 50
    client.pump(None, 1.0)
    record = router.admin.stat("t2")
    assert (record["depth"], record["transfersHeld"]) == (0, 50)
    assert not any(d.remote_state for d in deliveries)
    assert router.admin.call("POST", "/v1/producers/start", {"pattern": "t2"})[0] == 200
    client.pump(lambda: all(d.remote_state == Delivery.ACCEPTED for d in deliveries), 10, "the held transfers")
    receiver = client.receiver(client.connect(), "t2", credit=50)
    client.pump(lambda: len(client.received(receiver)) == 50, 10, "the messages")
    assert [message.properties["i"] for _, message in client.received(receiver)] == list(range(50))
