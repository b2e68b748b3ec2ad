"""Standalone qpid-flow answers as a broker would (../shared/SEMANTICS.md section 7), seen
by real clients: the open frame, ... (transactions: test_transactions.py)"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from proton import Delivery, Endpoint, Message, Timeout, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy, LinkOption, Selector
from proton.utils import BlockingConnection, LinkDetached

from .harness.net import free_port
from .harness.router import StartRouter
from .harness.scenario import run_rhea


def test_open_frame_names_the_broker(qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        container_id = connection.conn.remote_container
        assert container_id.startswith("qpid-flow-")
        properties = {str(key): value for key, value in (connection.conn.remote_properties or {}).items()}
        assert properties["product"] == "qpid-flow"
        assert properties["version"]
    finally:
        connection.close()
    peer = run_rhea(router.url, "send", "open.frame", "0")["peer"]
    assert peer["container_id"] == container_id
    assert (peer["properties"]["product"], peer["properties"]["version"]) == ("qpid-flow", properties["version"])


def test_delivery_works_with_the_passthrough_policy_disabled(qpid_flow_process: StartRouter) -> None:
    """None from every plugin is "no opinion": the core gives producers a window and lets
    consumers take turns, so disabling the built-in policy (docs/plugins.md) stops nothing."""
    router = qpid_flow_process(extra_args=["--disable-plugin", "passthrough"])
    sent = run_rhea(router.url, "send", "no.passthrough", "5")
    assert sent["outcomes"] == {"accepted": 5}, sent
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("no.passthrough")
        sender.send(Message(body="proton"))
        receiver = connection.create_receiver("no.passthrough")
        bodies = [receiver.receive(timeout=10).body for _ in range(6)]
        receiver.accept()
    finally:
        connection.close()
    assert bodies == [f"rhea-{n}" for n in range(5)] + ["proton"]


def test_first_credit_on_a_new_destination_is_a_full_window(qpid_flow_process: StartRouter) -> None:
    """With the default configuration a new destination has a size threshold (80% of
    default_max_size) and no message size seen yet: its first producer still gets a normal
    window (producer_window, 100), not one credit, so a client that sends only in its first
    on_sendable does not stall (qpid-interop-test's shims do)."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("brand.new.destination")
        connection.wait(lambda: sender.link.credit > 0, timeout=10)
        assert sender.link.credit == 100
    finally:
        connection.close()
    sent = run_rhea(router.url, "send", "another.new.destination", "1")
    assert (sent["first_credit"], sent["outcomes"]) == (100, {"accepted": 1}), sent


def test_expired_messages_are_never_delivered_and_counted(qpid_flow_process: StartRouter) -> None:
    """A 1 s time to live: after 2.5 s the message is gone, whoever asks (Proton and rhea),
    and the statistics count it; a message without one waits as long as it takes."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(extra_args=["--admin", admin])
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("ttl.q")
        sender.send(Message(body="short-lived", ttl=1.0))
        sender.send(Message(body="kept"))
        sender.send(Message(body="short-lived too", ttl=1.0))
        time.sleep(2.5)  # fixed: the time to live (1 s) must run out; nothing to wait on
        received = run_rhea(router.url, "receive", "ttl.q", "3", "3000")
        assert received["received"] == ["kept"], received
        stats = _destination(admin, "ttl.q")
        assert (stats["expired"], stats["depth"]) == (2, 0)
        sender.send(Message(body="expires in a minute", ttl=60.0))
        receiver = connection.create_receiver("ttl.q")
        assert receiver.receive(timeout=10).body == "expires in a minute"
        receiver.accept()
    finally:
        connection.close()


def test_delivery_count_rises_on_failed_deliveries_only(qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        connection.create_sender("count.q").send(Message(body="counted"))
        receiver = connection.create_receiver("count.q", credit=1)
        first = receiver.receive(timeout=10)
        assert first.delivery_count == 0
        receiver.release(delivered=False)  # released: not a failed attempt
        again = receiver.receive(timeout=10)
        assert (again.delivery_count, again.first_acquirer) == (0, False)
        # modified with delivery-failed set (Proton's release(delivered=True) leaves it unset)
        delivery = receiver.fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
        third = receiver.receive(timeout=10)
        assert third.delivery_count == 1 and third.body == "counted"
        receiver.accept()
        # rhea: modified(delivery-failed) on the first arrival, then the redelivery
        connection.create_sender("count.rhea").send(Message(body="counted by rhea"))
    finally:
        connection.close()
    received = run_rhea(router.url, "receive", "count.rhea", "1", env={"RHEA_FAIL_FIRST": "1"})
    assert [(body, count) for body, count, _ in received["deliveries"]] == [
        ("counted by rhea", 0),
        ("counted by rhea", 1),
    ], received


def _destination(admin: str, name: str) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{admin}/v1/destinations/{name}")
    token = os.environ.get("QPID_FLOW_ADMIN_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        record: dict[str, Any] = json.loads(response.read())
    return record


def test_request_response_through_a_dynamic_reply_queue(qpid_flow_process: StartRouter) -> None:
    """Proton's client.py / server.py pattern: the client's dynamic source gets a temporary
    queue (its address in the attach answer), the server answers to reply-to through the
    anonymous relay, and the queue is deleted when the client's link detaches."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text="auto_create = false\n[destinations.requests]\n", extra_args=["--admin", admin]
    )
    client = BlockingConnection(router.url, timeout=10)
    server = BlockingConnection(router.url, timeout=10)
    try:
        replies = client.create_receiver(None, dynamic=True)
        reply_to = replies.link.remote_source.address
        assert reply_to and reply_to.startswith("qpid-flow.temporary.")
        client.create_sender("requests").send(Message(body="ping", reply_to=reply_to, correlation_id=7))
        requests = server.create_receiver("requests")
        request = requests.receive(timeout=10)
        requests.accept()
        server.create_sender(None).send(
            Message(address=request.reply_to, body=f"pong to {request.body}", correlation_id=request.correlation_id)
        )
        answer = replies.receive(timeout=10)
        replies.accept()
        assert (answer.body, answer.correlation_id) == ("pong to ping", 7)
        assert _destination(admin, reply_to)["name"] == reply_to
        replies.close()
        client.create_receiver("requests").close()  # a round trip: the detach is processed
        with pytest.raises(urllib.error.HTTPError) as gone:
            _destination(admin, reply_to)
        assert gone.value.code == 404
    finally:
        client.close()
        server.close()


def test_replies_to_a_deleted_reply_queue_are_refused_not_kept(qpid_flow_process: StartRouter) -> None:
    """The requester left (its dynamic source's queue is deleted) while a responder still
    had a link to the reply address. The responder's link is detached with
    amqp:resource-deleted and a late reply through the relay is rejected: the name did come
    back as an ordinary queue (auto_create), accepting replies nobody could ever read."""
    from proton.utils import SendException

    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(extra_args=["--admin", admin])  # auto_create on: the default
    client = BlockingConnection(router.url, timeout=10)
    server = BlockingConnection(router.url, timeout=10)
    try:
        replies = client.create_receiver(None, dynamic=True)
        reply_to = replies.link.remote_source.address
        responder = server.create_sender(reply_to)
        responder.send(Message(body="first answer"))
        assert replies.receive(timeout=10).body == "first answer"
        replies.accept()
        replies.close()
        with pytest.raises(LinkDetached) as detached:
            server.wait(lambda: False, timeout=5)
        assert "amqp:resource-deleted" in str(detached.value)
        with pytest.raises(SendException) as refused:
            server.create_sender(None).send(Message(address=reply_to, body="too late"))
        assert refused.value.state == Delivery.REJECTED
        with pytest.raises(urllib.error.HTTPError) as gone:
            _destination(admin, reply_to)
        assert gone.value.code == 404
    finally:
        client.close()
        server.close()


def test_a_reply_queue_is_its_connection_s_and_goes_with_the_link_that_made_it(
    qpid_flow_process: StartRouter,
) -> None:
    """A consumer on another connection attached to the requester's temporary queue and
    took half its replies; after the requester's link closed, the queue lived on for that
    consumer, replies still accepted. JMS (and ActiveMQ: 'Cannot subscribe to remote
    temporary destination') keep a temporary queue to its connection, and AMQP 1.0 3.5.10
    deletes a dynamic node with the link that caused its creation."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(extra_args=["--admin", admin])
    client = BlockingConnection(router.url, timeout=10)
    other = BlockingConnection(router.url, timeout=10)
    try:
        replies = client.create_receiver(None, dynamic=True)
        reply_to = replies.link.remote_source.address
        with pytest.raises(LinkDetached) as refused:
            other.create_receiver(reply_to)
        assert "amqp:resource-locked" in str(refused.value)
        second = client.create_receiver(reply_to)  # its own connection may, as JMS allows
        with pytest.raises(LinkDetached) as deleted:
            replies.close()  # the other consumer of the same connection is detached with it
            client.wait(lambda: False, timeout=5)
        assert "amqp:resource-deleted" in str(deleted.value)
        assert second.link.state & Endpoint.REMOTE_CLOSED
        with pytest.raises(urllib.error.HTTPError) as gone:
            _destination(admin, reply_to)
        assert gone.value.code == 404
    finally:
        client.close()
        other.close()


def test_a_selector_on_a_dynamic_source_is_applied(qpid_flow_process: StartRouter) -> None:
    """It was echoed in the attach answer, as if in force, and every reply delivered."""

    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        replies = connection.create_receiver(None, dynamic=True, options=Selector("colour = 'red'"))
        reply_to = replies.link.remote_source.address
        answers = connection.create_sender(None)
        for colour in ("blue", "red"):
            answers.send(Message(address=reply_to, body=f"{colour} one", properties={"colour": colour}))
        assert replies.receive(timeout=10).body == "red one"
        replies.accept()
        with pytest.raises(Timeout):
            replies.receive(timeout=1)
    finally:
        connection.close()


def test_a_rhea_client_gets_replies_on_a_dynamic_queue(qpid_flow_process: StartRouter) -> None:
    """The same pattern with rhea as the client (its dynamic source), Proton as the server
    answering through the anonymous relay."""
    router = qpid_flow_process()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        client = pool.submit(run_rhea, router.url, "request", "rhea.requests", "2", "15000")
        server = BlockingConnection(router.url, timeout=10)
        try:
            requests = server.create_receiver("rhea.requests")
            answers = server.create_sender(None)
            for _ in range(2):
                request = requests.receive(timeout=10)
                requests.accept()
                answers.send(Message(address=request.reply_to, body=f"pong to {request.body}"))
        finally:
            server.close()
        report = client.result()
    assert report["reply_to"].startswith("qpid-flow.temporary."), report
    assert (report["received"], report["errors"]) == (["pong to rhea-0", "pong to rhea-1"], []), report


class DynamicTarget(LinkOption):
    """A sender whose target is dynamic: the broker makes the node and names it."""

    def apply(self, link: Any) -> None:
        link.target.dynamic = True
        link.target.address = None

    def test(self, link: Any) -> bool:
        return bool(link.is_sender)


def test_a_dynamic_target_lives_as_long_as_its_link(qpid_flow_process: StartRouter) -> None:
    """A producer with a dynamic target gets a temporary queue named in the attach answer,
    even with auto_create off; a consumer attaches to it by name; when the producer's link
    detaches the node is deleted and its consumer detached with amqp:resource-deleted."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(config_text="auto_create = false\n", extra_args=["--admin", admin])
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender(None, options=DynamicTarget())
        address = sender.link.remote_target.address
        assert address and address.startswith("qpid-flow.temporary.")
        sender.send(Message(body="to a node of my own"))
        receiver = connection.create_receiver(address)
        assert receiver.receive(timeout=10).body == "to a node of my own"
        receiver.accept()
        assert _destination(admin, address)["name"] == address
        responder = BlockingConnection(router.url, timeout=10)
        other_sender = responder.create_sender(address)  # another producer naming the node
        with pytest.raises(LinkDetached) as detached:  # the receiver's, as the sender closes
            sender.close()
            connection.wait(lambda: False, timeout=5)
        assert "amqp:resource-deleted" in str(detached.value)
        # The other producer is detached too: it stayed attached to a deleted node (and,
        # under memory_limit, counted among the producers sharing the room for good).
        with pytest.raises(LinkDetached) as producer_detached:
            responder.wait(lambda: False, timeout=5)
        assert "amqp:resource-deleted" in str(producer_detached.value)
        assert other_sender.link.state & Endpoint.REMOTE_CLOSED
        responder.close()
        with pytest.raises(urllib.error.HTTPError) as gone:
            _destination(admin, address)
        assert gone.value.code == 404
    finally:
        connection.close()


def _coloured(connection: BlockingConnection, address: str, grouped: bool = False) -> None:
    sender = connection.create_sender(address)
    for n, colour in enumerate(["red", "green", "blue", "green", "red", "green"]):
        group = f"g{n}" if grouped else None
        sender.send(Message(body=f"{colour}-{n}", properties={"colour": colour, "n": n}, group_id=group))


@pytest.mark.parametrize("shared_groups", [False, True], ids=["fifo", "shared-groups"])
def test_selectors_pick_messages_per_consumer(qpid_flow_process: StartRouter, shared_groups: bool) -> None:
    """Proton's selected_recv.py: a consumer with `colour = 'green'` gets only green ones,
    in order; the others stay for other consumers (rhea with its own selector here). The
    same on a shared-groups destination, each message in a group of its own (within one
    group a selector cannot skip the group's head: tests/unit/test_groups.py)."""
    config = '[destinations."colours"]\nshared_groups = true\n' if shared_groups else None
    router = qpid_flow_process(config_text=config)
    connection = BlockingConnection(router.url, timeout=10)
    try:
        _coloured(connection, "colours", grouped=shared_groups)
        green = connection.create_receiver("colours", options=Selector("colour = 'green' AND n > 1"))
        applied = green.link.remote_source.filter
        applied.rewind()
        applied.next()
        assert list(applied.get_object()) == [symbol("selector")]  # echoed: it is applied
        assert [green.receive(timeout=10).body for _ in range(2)] == ["green-3", "green-5"]
        green.accept()
        green.accept()
        reds = run_rhea(router.url, "receive", "colours", "2", "5000", env={"RHEA_SELECTOR": "colour = 'red'"})
        assert reds["received"] == ["red-0", "red-4"], reds
        rest = connection.create_receiver("colours", name="everything else")
        assert [rest.receive(timeout=10).body for _ in range(2)] == ["green-1", "blue-2"]
        with pytest.raises(LinkDetached) as bad:
            connection.create_receiver("colours", name="bad", options=Selector("colour = = 'x'"))
        assert "amqp:invalid-field" in str(bad.value)
    finally:
        connection.close()


def test_a_selector_consumer_gets_its_message_behind_a_backlog_it_does_not_want(
    qpid_flow_process: StartRouter,
) -> None:
    """1,500 blue messages nobody takes, then a red one: a consumer selecting red gets it
    (qpidd and Artemis deliver it; qpid-flow looked 1,000 messages deep and stopped), and
    the blue ones are all there for a consumer without a selector."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=30)
    try:
        sender = connection.create_sender("backlog")
        for n in range(1500):
            sender.send(Message(body=f"blue-{n}", properties={"colour": "blue"}))
        sender.send(Message(body="red", properties={"colour": "red"}))
        red = connection.create_receiver("backlog", name="red only", options=Selector("colour = 'red'"))
        assert red.receive(timeout=10).body == "red"
        red.accept()
        rest = connection.create_receiver("backlog", name="everything else", credit=2000)
        bodies = [rest.receive(timeout=10).body for _ in range(1500)]
        rest.accept()
        assert bodies == [f"blue-{n}" for n in range(1500)]
    finally:
        connection.close()


def test_browsing_leaves_the_messages_for_consumers(qpid_flow_process: StartRouter) -> None:
    """distribution-mode copy (Proton's queue_browser.py, rhea): a browser sees every
    message, the consumer after it still gets them all."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        _coloured(connection, "browsed")
        browser = connection.create_receiver("browsed", name="browser", options=Copy())
        assert [browser.receive(timeout=10).body for _ in range(6)][:2] == ["red-0", "green-1"]
        browsed = run_rhea(router.url, "receive", "browsed", "6", "5000", env={"RHEA_BROWSE": "1"})
        assert len(browsed["received"]) == 6, browsed
        taker = connection.create_receiver("browsed", name="taker")
        assert [taker.receive(timeout=10).body for _ in range(6)][-1] == "green-5"
    finally:
        connection.close()


@pytest.mark.parametrize("how", ["consumer left holding it", "released"])
def test_a_browser_sees_a_message_that_went_back_with_the_header_its_next_delivery_carries(
    qpid_flow_process: StartRouter, how: str
) -> None:
    """Delivered once, then back in the queue (a failed attempt, or released): a browser
    got the bytes as first sent (first-acquirer true, delivery-count 0), though its own
    selector on JMSXDeliveryCount read them as redelivered."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        connection.create_sender("went.back").send(Message(body="once", first_acquirer=True))
        taker = connection.create_receiver("went.back", name="taker", credit=1)
        assert taker.receive(timeout=10).body == "once"
        if how == "released":
            taker.release(delivered=False)
        taker.close()
        failed = 1 if how == "consumer left holding it" else 0
        # The browser's selector reads the header as the next delivery carries it.
        selected = Selector(f"JMSXDeliveryCount = {failed + 1}")
        browser = connection.create_receiver("went.back", name="browser", options=[Copy(), selected])
        shown = browser.receive(timeout=10)
        after = connection.create_receiver("went.back", name="after").receive(timeout=10)
    finally:
        connection.close()
    assert (shown.first_acquirer, shown.delivery_count) == (False, failed)
    assert (after.first_acquirer, after.delivery_count) == (False, failed)


class _OneOffNames(MessagingHandler):
    """Sends one pre-settled message with a ``ttl`` s time to live to each of ``count`` new
    names through the anonymous relay: reply addresses used once."""

    def __init__(self, url: str, first: int, count: int, ttl: float) -> None:
        super().__init__()
        self.url = url
        self.next = first
        self.end = first + count
        self.ttl = ttl

    def on_start(self, event: Any) -> None:
        self.sender = event.container.create_sender(event.container.connect(self.url), None)

    def on_sendable(self, event: Any) -> None:
        while self.sender.credit and self.next < self.end:
            self.sender.send(Message(address=f"reply.{self.next}", body="x", ttl=self.ttl))
            self.next += 1
        if self.next >= self.end:
            event.connection.close()


def _admin_get(admin: str, path: str) -> Any:
    """The admin API's JSON answer to GET ``path``; None for 404."""
    try:
        with urllib.request.urlopen(f"http://{admin}{path}", timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def test_one_off_names_are_forgotten_and_memory_stays_flat(qpid_flow_process: StartRouter) -> None:
    """Issue 16: three rounds of 100,000 names used once each. After each round every
    name is forgotten (expired, then idle for destination_idle_timeout), and the process's
    peak resident memory after rounds 2 and 3 is within 10 % of its peak after round 1.

    Every round has the same peak, all 100,000 names at once (the time to live outlasts the
    sending, checked), so a round can raise the high-water mark only with what earlier rounds left
    behind: at about 4 KB a name at the peak, anything piling up per name shows. (The
    resident memory after a round is no measure: it swings by a third with what the
    allocator keeps.) The wait polls the last name, not the list of all: a list of
    100,000 records several times a second would be the largest allocation in the process."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(config_text='destination_idle_timeout = "1s"\n', extra_args=["--admin", admin])
    peaks: list[int] = []
    for round_number in range(3):
        first = round_number * 100_000
        # The time to live outlasts the sending with room: a round sent in 27 s on a busy
        # machine (16 s otherwise) lost its first names before its last were sent, and its
        # lower peak made the next rounds look 13 % larger (a CI run with helpers busy).
        started = time.monotonic()
        Container(_OneOffNames(router.url, first, 100_000, ttl=45)).run()
        assert time.monotonic() - started < 45, "the sending outlasted the time to live: rounds not comparable"
        deadline = time.monotonic() + 180
        while _admin_get(admin, f"/v1/destinations/reply.{first + 99_999}") is not None:
            assert time.monotonic() < deadline, f"round {round_number}: its last name is never forgotten"
            time.sleep(0.5)
        while left := len(_admin_get(admin, "/v1/destinations")["destinations"]):
            assert time.monotonic() < deadline, f"round {round_number}: {left} destinations never forgotten"
            time.sleep(1)
        peaks.append(router.peak_resident_bytes())
    assert max(peaks[1:]) <= peaks[0] * 1.10, f"peak resident bytes after each round: {peaks}"


class _MaxMessageSize(LinkOption):
    def __init__(self, size: int) -> None:
        self.size = size

    def apply(self, link: Any) -> None:
        link.max_message_size = self.size


def test_a_consumer_is_not_sent_a_message_larger_than_its_max_message_size(
    qpid_flow_process: StartRouter,
) -> None:
    """AMQP 1.0 2.7.3: the sender must not send it (a receiver may end the link with
    amqp:link:message-size-exceeded). qpid-flow sent it. The large message now waits for
    a consumer that takes it; the small ones behind it go on."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("sized")
        sender.send(Message(body="L" * 5000))
        sender.send(Message(body="small"))
        limited = connection.create_receiver("sized", credit=10, options=_MaxMessageSize(1000))
        assert limited.receive(timeout=10).body == "small"
        limited.accept()
        with pytest.raises(Timeout):
            limited.receive(timeout=1)
        anyone = connection.create_receiver("sized", name="anyone")
        assert anyone.receive(timeout=10).body == "L" * 5000
        anyone.accept()
        assert limited.link.state & limited.link.REMOTE_ACTIVE  # still attached
    finally:
        connection.close()


def test_a_message_a_client_cannot_decode_is_refused_not_queued(qpid_flow_process: StartRouter) -> None:
    """An empty transfer and a malformed one were accepted and queued as sent: a Proton
    MessagingHandler consuming on another connection raised on them (and after its
    release the next consumer got the same), where RabbitMQ never hands a consumer bytes
    it cannot decode. They are rejected with amqp:decode-error; the good one behind them
    goes through."""
    from .harness.rawclient import RawClient

    router = qpid_flow_process()
    raw = RawClient(router.port)
    try:
        raw.connection.open()
        session = raw.connection.session()
        session.open()
        sender = session.sender("bad-bytes")
        sender.target.address = "undecodable"
        sender.open()
        assert raw.pump(lambda: sender.credit > 0)
        outcomes = []
        # The fourth: delivery annotations only, which qpid-flow takes off (none left).
        bad = (b"", b"\xff\xfe\xfd", b"\x00Sw\xa1\x05hel", b"\x00Sq\xc1\x01\x00")
        for tag, payload in enumerate((*bad, Message(body="good").encode())):
            delivery = sender.delivery(str(tag))
            sender.send(payload)
            sender.advance()
            assert raw.pump(functools.partial(getattr, delivery, "remote_state"))
            condition = delivery.remote.condition
            outcomes.append((delivery.remote_state, condition.name if condition else None))
        assert outcomes == [(Delivery.REJECTED, "amqp:decode-error")] * 4 + [(Delivery.ACCEPTED, None)]
    finally:
        raw.close()
    consumer = BlockingConnection(router.url, timeout=10)
    try:
        receiver = consumer.create_receiver("undecodable")
        assert receiver.receive(timeout=10).body == "good"
        receiver.accept()
        with pytest.raises(Timeout):
            receiver.receive(timeout=1)
    finally:
        consumer.close()


def test_delivery_annotations_are_not_passed_on_to_consumers(qpid_flow_process: StartRouter) -> None:
    """Delivery annotations are for the receiving peer only (AMQP 1.0 3.2.2): qpid-flow,
    standalone, is that peer, and its consumers get the message without them, as from
    Artemis or ActiveMQ. Everything else arrives as sent."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("hop.only")
        sent = Message(
            body="with-da",
            id="m-1",
            group_id="g",
            properties={"k": 1},
            annotations={symbol("x-opt-kept"): "yes"},
            instructions={symbol("x-opt-hop-only"): "for the next hop"},
        )
        sender.send(sent)
        receiver = connection.create_receiver("hop.only")
        got = receiver.receive(timeout=10)
        receiver.accept()
    finally:
        connection.close()
    assert got.instructions is None
    assert (got.body, got.id, got.group_id, got.properties, got.annotations) == (
        "with-da",
        "m-1",
        "g",
        {"k": 1},
        {symbol("x-opt-kept"): "yes"},
    )
