"""Local transactions in standalone qpid-flow (AMQP 1.0 part 4), driven by Proton's own
transaction API (``Container.declare_transaction``), as a client application uses it.

A transaction's transfers are invisible until the commit and gone after a rollback; its
consumers' outcomes take effect at the commit (the message stays out to that consumer,
its group with it, until then) and are undone by a rollback; a commit that can no longer
be applied whole is rolled back and the client told ``amqp:transaction:rollback``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from proton import Described, Endpoint, Event, Message, Terminus, Timeout, symbol, ulong
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Transaction
from proton.utils import BlockingConnection

from .harness.net import free_port
from .harness.rawclient import RawClient
from .harness.router import RouterProcess, StartRouter

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


class TxClient(MessagingHandler, TransactionHandler):
    """Runs one transaction: sends ``send`` messages to ``address`` and/or takes ``take``
    messages from it (accepting each in the transaction), calls ``before_discharge`` (the
    moment to look at the router from outside), then commits (or aborts), and calls
    ``after_discharge`` before it closes its connection.

    ``result`` is "committed", "aborted" or "commit failed: CONDITION".
    """

    def __init__(
        self,
        url: str,
        address: str,
        send: int = 0,
        take: int = 0,
        commit: bool = True,
        before_discharge: Callable[[], None] | None = None,
        after_discharge: Callable[[], None] | None = None,
        settle_before_discharge: bool = False,
        discharge_when_sent: bool = False,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.discharge_when_sent = discharge_when_sent  # not waiting for the transfers' outcomes
        self.url = url
        self.address = address
        self.to_send = send
        self.to_take = take
        self.commit = commit
        self.before_discharge = before_discharge
        self.after_discharge = after_discharge
        self.settle_before_discharge = settle_before_discharge
        self.transaction: Transaction | None = None
        self.sent = 0
        self.answered = 0  # transactional outcomes of the sent messages
        self.taken: list[Any] = []
        self.result = ""
        self.error: BaseException | None = None

    def body(self, number: int) -> Any:
        """The body of the ``number``-th message sent (from 1)."""
        return f"tx-{number}"

    def message(self, number: int) -> Message:
        """The ``number``-th message sent (from 1)."""
        return Message(body=self.body(number), durable=True)

    def on_start(self, event: Event) -> None:
        self.container = event.container
        self.connection = event.container.connect(self.url, reconnect=False)
        if self.to_send:
            self.sender = event.container.create_sender(self.connection, self.address)
        if self.to_take:
            self.receiver = event.container.create_receiver(self.connection, self.address)
        event.container.declare_transaction(
            self.connection, handler=self, settle_before_discharge=self.settle_before_discharge
        )
        self.timer = event.container.schedule(TIMEOUT, self)

    def on_timer_task(self, _event: Event) -> None:
        self.result = self.result or "timed out"
        self.connection.close()

    def on_transaction_declared(self, event: Event) -> None:
        self.transaction = event.transaction
        if self.to_take:
            self.receiver.flow(self.to_take)
        self._send()

    def on_sendable(self, _event: Event) -> None:
        self._send()

    def _send(self) -> None:
        while self.transaction and self.sent < self.to_send and self.sender.credit:
            self.sent += 1
            self.transaction.send(self.sender, self.message(self.sent))
        self._maybe_discharge()

    def on_delivery(self, event: Event) -> None:
        if event.link.is_sender and event.delivery.remote_state == 0x34:
            self.answered += 1
            self._maybe_discharge()
        # (MessagingHandler's own handlers get the event too: it dispatches to them after this.)

    def on_message(self, event: Event) -> None:
        assert self.transaction is not None
        self.taken.append(event.message.body)
        self.transaction.accept(event.delivery)
        self._maybe_discharge()

    def _maybe_discharge(self) -> None:
        if self.transaction is None or self.result:
            return
        sent = self.sent if self.discharge_when_sent else self.answered
        if sent < self.to_send or len(self.taken) < self.to_take:
            return
        self.result = "discharging"
        try:
            if self.before_discharge is not None:
                self.before_discharge()
        except BaseException as exc:  # reported by run(), not lost in the reactor
            self.error = exc
        if self.commit:
            self.transaction.commit()
        else:
            self.transaction.abort()

    def on_transaction_committed(self, _event: Event) -> None:
        self._finish("committed")

    def on_transaction_aborted(self, _event: Event) -> None:
        self._finish("aborted")

    def on_transaction_commit_failed(self, event: Event) -> None:
        condition = event.delivery.remote.condition
        self._finish(f"commit failed: {condition.name if condition else None}")

    def on_transaction_declare_failed(self, _event: Event) -> None:
        self._finish("declare failed")

    def _finish(self, result: str) -> None:
        self.result = result
        self.timer.cancel()
        if self.after_discharge is not None:
            self.after_discharge()  # the connection still open: its going wakes the router
        self.connection.close()

    def run(self) -> TxClient:
        Container(self).run()
        if self.error is not None:
            raise self.error
        return self


def stats(admin: str, name: str) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{admin}/v1/destinations/{name}")
    token = os.environ.get("QPID_FLOW_ADMIN_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        record: dict[str, Any] = json.loads(response.read())
    return record


def drain(router: RouterProcess, address: str, expect: int, timeout: float = 2.0) -> list[Any]:
    """Receive (and accept) everything waiting on ``address``: ``expect`` messages, then
    make sure no more come within ``timeout``."""
    connection = BlockingConnection(router.url, timeout=10)
    try:
        receiver = connection.create_receiver(address, credit=expect + 10)
        bodies = []
        for _ in range(expect):
            bodies.append(receiver.receive(timeout=10).body)
            receiver.accept()
        try:
            bodies.append(receiver.receive(timeout=timeout).body)
            receiver.accept()
        except Timeout:  # nothing more, as expected
            pass
        return bodies
    finally:
        connection.close()


def take_counted(router: RouterProcess, address: str, count: int) -> list[tuple[Any, int]]:
    """Receive (and accept) ``count`` messages of ``address``: each body and delivery-count."""
    connection = BlockingConnection(router.url, timeout=10)
    try:
        receiver = connection.create_receiver(address, credit=10)
        taken = []
        for _ in range(count):
            message = receiver.receive(timeout=10)
            taken.append((message.body, message.delivery_count))
            receiver.accept()
        return taken
    finally:
        connection.close()


@pytest.fixture
def router_with_admin(qpid_flow_process: StartRouter) -> tuple[RouterProcess, str]:
    admin = f"127.0.0.1:{free_port()}"
    return qpid_flow_process(extra_args=["--admin", admin]), admin


def test_transactional_sends_appear_at_commit_only(router_with_admin: tuple[RouterProcess, str]) -> None:
    router, admin = router_with_admin
    seen_before: dict[str, Any] = {}
    client = TxClient(
        router.url,
        "tx.commit",
        send=10,
        before_discharge=lambda: seen_before.update(stats(admin, "tx.commit")),
    ).run()
    assert client.result == "committed"
    assert seen_before["depth"] == 0, "staged transfers must not be visible before the commit"
    assert stats(admin, "tx.commit")["depth"] == 10
    assert drain(router, "tx.commit", 10) == [f"tx-{n}" for n in range(1, 11)]


@pytest.mark.parametrize("commit", [True, False])
def test_staged_transfers_count_against_the_flow_control_headroom(qpid_flow_process: StartRouter, commit: bool) -> None:
    """stop 10: a transactional producer gets credit for stop + 1 = 11 transfers, staged ones
    included (the commit puts them on the destination, credit or not), so the 11th leaves it
    none until its transaction ends, as a plain producer's 11th would. Committed: depth 11
    and flow ON. Rolled back: the room is back for the next producer."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='[destinations."txf"]\nflow_stop_count = 10\nflow_resume_count = 5\n', extra_args=["--admin", admin]
    )
    seen: dict[str, Any] = {}
    client = TxClient(router.url, "txf", send=11, commit=commit)
    client.before_discharge = lambda: seen.update(credit=client.sender.credit, **stats(admin, "txf"))
    client.run()
    assert client.result == ("committed" if commit else "aborted")
    assert seen["credit"] == 0 and seen["depth"] == 0
    after = stats(admin, "txf")
    if commit:
        assert after["depth"] == 11 and after["flowStopped"]
    else:
        assert after["depth"] == 0 and not after["flowStopped"]
        connection = BlockingConnection(router.url, timeout=10)
        try:
            sender = connection.create_sender("txf")
            connection.wait(lambda: sender.link.credit >= 11, timeout=5, msg="the headroom's credit")
            assert sender.link.credit == 11
        finally:
            connection.close()


def test_rolled_back_sends_are_dropped(router_with_admin: tuple[RouterProcess, str]) -> None:
    router, admin = router_with_admin
    client = TxClient(router.url, "tx.abort", send=5, commit=False).run()
    assert client.result == "aborted"
    assert stats(admin, "tx.abort")["depth"] == 0
    assert drain(router, "tx.abort", 0) == []


def test_transactional_accepts_take_effect_at_commit(router_with_admin: tuple[RouterProcess, str]) -> None:
    router, admin = router_with_admin
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("tx.consume")
        for n in range(4):
            sender.send(Message(body=f"m{n}"))
    finally:
        connection.close()
    during: dict[str, Any] = {}
    client = TxClient(
        router.url, "tx.consume", take=4, before_discharge=lambda: during.update(stats(admin, "tx.consume"))
    ).run()
    assert client.result == "committed" and client.taken == ["m0", "m1", "m2", "m3"]
    assert during["depth"] == 4, "accepted in an open transaction: still on the destination"
    assert stats(admin, "tx.consume")["depth"] == 0


@pytest.mark.parametrize("settle_before_discharge", [False, True])
def test_rolled_back_accepts_give_the_messages_back(
    router_with_admin: tuple[RouterProcess, str], settle_before_discharge: bool
) -> None:
    """Aborted: the messages come back to the destination, whether the client had settled
    them (qpid-flow puts them back) or not (Proton's client releases them on abort), with
    one failed attempt each either way. (Not settled, they came back at delivery-count 0,
    settled at 1.)"""
    router, admin = router_with_admin
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("tx.unconsume")
        for n in range(3):
            sender.send(Message(body=f"m{n}"))
    finally:
        connection.close()
    client = TxClient(
        router.url, "tx.unconsume", take=3, commit=False, settle_before_discharge=settle_before_discharge
    ).run()
    assert client.result == "aborted" and client.taken == ["m0", "m1", "m2"]
    assert take_counted(router, "tx.unconsume", 3) == [("m0", 1), ("m1", 1), ("m2", 1)]
    assert stats(admin, "tx.unconsume")["depth"] == 0


class AcceptThenAbort(MessagingHandler, TransactionHandler):
    """Takes one message, accepts it in a transaction without settling, aborts; then
    settles it ``modified(delivery-failed)``, or closes still holding it (``then``)."""

    def __init__(self, url: str, address: str, then: str) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.url, self.address, self.then = url, address, then
        self.delivery: Any = None

    def on_start(self, event: Event) -> None:
        self.connection = event.container.connect(self.url, reconnect=False)
        self.receiver = event.container.create_receiver(self.connection, self.address)
        event.container.declare_transaction(self.connection, handler=self)
        self.timer = event.container.schedule(TIMEOUT, self)

    def on_timer_task(self, _event: Event) -> None:
        self.connection.close()

    def on_transaction_declared(self, event: Event) -> None:
        self.transaction = event.transaction
        self.receiver.flow(1)

    def on_message(self, event: Event) -> None:
        self.delivery = event.delivery
        self.transaction.update(event.delivery, event.delivery.ACCEPTED)  # not settled
        self.transaction.abort()

    def on_transaction_aborted(self, _event: Event) -> None:
        if self.then == "modified-failed":
            self.delivery.local.failed = True
            self.delivery.update(self.delivery.MODIFIED)
            self.delivery.settle()
        self.timer.cancel()
        self.connection.close()


@pytest.mark.parametrize("then", ["modified-failed", "close holding"])
def test_a_rolled_back_accept_and_what_follows_it_are_one_failed_attempt(
    router_with_admin: tuple[RouterProcess, str], then: str
) -> None:
    """An unsettled transactional accept rolled back counts a failed attempt; settling
    the same delivery modified(delivery-failed) after, or leaving with it, counted a
    second: the next delivery said delivery-count 2 for one attempt (JMSXDeliveryCount 3,
    so max-redelivery dead-lettering fired twice as early)."""
    router, _ = router_with_admin
    _send_plain(router, "tx.once", 1)
    Container(AcceptThenAbort(router.url, "tx.once", then)).run()
    assert take_counted(router, "tx.once", 1) == [("plain-0", 1)]


def test_a_commit_that_no_longer_fits_is_rolled_back(qpid_flow_process: StartRouter) -> None:
    """max_count 5 with ring off, 3 already waiting, 4 more in a transaction: the commit
    would overfill the queue, so the whole transaction is rolled back and the client told."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='[destinations."tx.full"]\nmax_count = 5\nflow_stop_count = 0\nflow_resume_count = 0\n'
        'limit_policy = "reject"\n',
        extra_args=["--admin", admin],
    )
    fill: Callable[[], None] = lambda: _send_plain(router, "tx.full", 3)  # noqa: E731
    client = TxClient(router.url, "tx.full", send=4, before_discharge=fill).run()
    assert client.result == "commit failed: amqp:transaction:rollback"
    assert stats(admin, "tx.full")["depth"] == 3
    assert drain(router, "tx.full", 3) == ["plain-0", "plain-1", "plain-2"]


def test_a_transaction_with_a_rejected_transfer_is_rolled_back(qpid_flow_process: StartRouter) -> None:
    """limit_policy reject, stop at 10: a transactional producer of 30 got 11 transfers
    staged and 19 rejected, and its commit put the 11 in, losing the 19 (not all or
    nothing). Seed 004 (ActiveMQ): "For transacted sessions, rollback the transaction with
    a Queue full indication": the commit is refused, nothing of it goes in."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='[destinations."tx.rej"]\nmax_count = 100\nflow_stop_count = 10\nlimit_policy = "reject"\n',
        extra_args=["--admin", admin],
    )
    client = TxClient(router.url, "tx.rej", send=30).run()
    assert client.result == "commit failed: amqp:transaction:rollback"
    assert stats(admin, "tx.rej")["depth"] == 0
    _send_plain(router, "tx.rej", 3)  # the destination takes plain producers as before
    assert drain(router, "tx.rej", 3) == ["plain-0", "plain-1", "plain-2"]


class _OneLarge(TxClient):
    """Sends a small message, then one of 300 kB (several transfers), in one transaction."""

    def body(self, number: int) -> Any:
        return b"x" * 300_000 if number == 2 else f"tx-{number}"


def test_a_transaction_with_a_transfer_refused_while_arriving_is_rolled_back(qpid_flow_process: StartRouter) -> None:
    """A transactional message refused while it arrived (it would pass memory_limit) was
    answered rejected without its transaction, and the commit went through: the small
    message went in, the large one was lost from an all-or-nothing unit."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='memory_limit = "100 KB"\ndefault_max_size = 0\n[destinations."tx.arriving"]\n',
        extra_args=["--admin", admin],
    )
    client = _OneLarge(router.url, "tx.arriving", send=2).run()
    assert client.result == "commit failed: amqp:transaction:rollback"
    record = stats(admin, "tx.arriving")
    assert (record["depth"], record["refused"]) == (0, 1)


class _RelayToTwo(TxClient):
    """Sends on an anonymous-relay link (``address`` None): to tx.relay.ok, then to an
    address that names no destination."""

    def message(self, number: int) -> Message:
        return Message(body=self.body(number), address="tx.relay.ok" if number == 1 else "tx.relay.missing")


def test_a_transaction_with_a_relay_transfer_to_no_destination_is_rolled_back(qpid_flow_process: StartRouter) -> None:
    """A relay transfer the router refuses itself (no destination, not allowed) was
    rejected outside the transaction it named, and the commit put the others in."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='auto_create = false\n[destinations."tx.relay.ok"]\n', extra_args=["--admin", admin]
    )
    client = _RelayToTwo(router.url, None, send=2).run()  # type: ignore[arg-type]
    assert client.result == "commit failed: amqp:transaction:rollback"
    assert stats(admin, "tx.relay.ok")["depth"] == 0


def test_a_transfer_held_for_what_a_transaction_staged_goes_in_at_its_rollback(qpid_flow_process: StartRouter) -> None:
    """Flow control counts what open transactions staged: a plain transfer past the stop
    size with them is held, flow OFF. The rollback freed the room but asked nobody again
    about held transfers (no depth change, no resume): the transfer stayed held, its
    producer's later ones behind it, for good."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='producer_window = 4\n[destinations."tx.held"]\nmax_size = 10000\nflow_stop_size = 70\n'
        "flow_resume_size = 30\n",
        extra_args=["--admin", admin],
    )
    plain = BlockingConnection(router.url, timeout=10)
    sender = plain.create_sender("tx.held")  # credit now, while nothing is staged
    outcome: list[str] = []

    def send_plain() -> None:
        try:
            sender.send(Message(body="plain", durable=True))
            outcome.append("accepted")
        except Exception as exc:  # the test reads what happened
            outcome.append(type(exc).__name__)

    def hold_one_then_abort() -> None:
        threading.Thread(target=send_plain, daemon=True).start()
        deadline = time.monotonic() + 10
        while stats(admin, "tx.held")["transfersHeld"] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats(admin, "tx.held")["transfersHeld"] == 1, "the plain transfer was not held"

    def wait_for_the_plain_outcome() -> None:
        deadline = time.monotonic() + 10
        while not outcome and time.monotonic() < deadline:
            time.sleep(0.05)

    try:
        client = TxClient(
            router.url,
            "tx.held",
            send=4,
            commit=False,
            before_discharge=hold_one_then_abort,
            after_discharge=wait_for_the_plain_outcome,
        ).run()
        assert client.result == "aborted"
        assert outcome == ["accepted"], "the held transfer stayed held after the rollback"
        assert stats(admin, "tx.held")["depth"] == 1
    finally:
        plain.close()


class _UndecodableInTransaction(MessagingHandler, TransactionHandler):
    """Sends, in one transaction, bytes no client could decode and then a good message,
    and commits once both have their outcome."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(auto_accept=False)
        self.url, self.address = url, address
        self.result = ""
        self.raw: Any = None
        self.good: Any = None

    def on_start(self, event: Event) -> None:
        self.connection = event.container.connect(self.url, reconnect=False)
        self.sender = event.container.create_sender(self.connection, self.address)
        event.container.declare_transaction(self.connection, handler=self)
        self.timer = event.container.schedule(TIMEOUT, self)

    def on_timer_task(self, _event: Event) -> None:
        self.result = "timed out"
        self.connection.close()

    def on_transaction_declared(self, event: Event) -> None:
        self.transaction = event.transaction
        self.raw = self.sender.delivery(b"raw")
        self.sender.stream(b"\x01\x02garbage")
        self.sender.advance()
        self.raw.local.data = [self.transaction.id]
        self.raw.update(0x34)  # transactional-state: the transfer belongs to the transaction
        self.good = self.transaction.send(self.sender, Message(body="good"))

    def on_delivery(self, event: Event) -> None:
        if self.raw is not None and self.raw.remote_state and self.good is not None and self.good.remote_state:
            self.raw, self.good = None, None
            self.transaction.commit()

    def on_transaction_committed(self, _event: Event) -> None:
        self._finish("committed")

    def on_transaction_commit_failed(self, event: Event) -> None:
        condition = event.delivery.remote.condition
        self._finish(f"commit failed: {condition.name if condition else None}")

    def _finish(self, result: str) -> None:
        self.result = result
        self.timer.cancel()
        self.connection.close()


def test_a_transaction_with_a_message_no_client_could_decode_fails(qpid_flow_process: StartRouter) -> None:
    """Outside a transaction such bytes are rejected with amqp:decode-error. Inside one they
    were accepted and staged, the commit went through, and the message was dropped
    without a word when the commit forwarded it. Now the transfer is rejected at once and
    the transaction cannot commit: nothing of it goes in."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(extra_args=["--admin", admin])
    client = _UndecodableInTransaction(router.url, "tx.undecodable")
    Container(client).run()
    assert client.result == "commit failed: amqp:transaction:rollback"
    assert stats(admin, "tx.undecodable")["depth"] == 0


def _send_plain(router: RouterProcess, address: str, count: int) -> None:
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender(address)
        for n in range(count):
            sender.send(Message(body=f"plain-{n}"))
    finally:
        connection.close()


def test_a_group_stays_with_its_consumer_until_the_commit(qpid_flow_process: StartRouter) -> None:
    """Shared groups: a message accepted in an open transaction is still out to its
    consumer, so the rest of its group goes to no other consumer until the commit."""
    router = qpid_flow_process(config_text='[destinations."tx.groups"]\nshared_groups = true\n')
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("tx.groups")
        sender.send(Message(body="a1", group_id="A"))
        sender.send(Message(body="a2", group_id="A"))
        sender.send(Message(body="b1", group_id="B"))
    finally:
        connection.close()
    other: dict[str, list[Any]] = {}

    def another_consumer_looks() -> None:
        # While the transaction is open: another consumer gets group B, never A's second.
        other["bodies"] = drain_some(router, "tx.groups", 1)

    client = TxClient(router.url, "tx.groups", take=1, before_discharge=another_consumer_looks).run()
    assert client.result == "committed" and client.taken == ["a1"]
    assert other["bodies"] == ["b1"]
    assert drain(router, "tx.groups", 1) == ["a2"]


def drain_some(router: RouterProcess, address: str, expect: int) -> list[Any]:
    """Like drain, on a thread of its own: called from inside another client's reactor."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.extend(drain(router, address, expect)))
    thread.start()
    thread.join(60)
    return result


def test_the_coordinator_link_going_rolls_back(router_with_admin: tuple[RouterProcess, str]) -> None:
    """A client that declares, sends, and disconnects without a discharge: nothing lands."""
    router, admin = router_with_admin

    class Leaver(TxClient):
        def _maybe_discharge(self) -> None:
            if self.answered >= self.to_send and not self.result:
                self._finish("left")

    client = Leaver(router.url, "tx.left", send=5).run()
    assert client.result == "left"
    assert drain(router, "tx.left", 0) == []
    assert stats(admin, "tx.left")["depth"] == 0
    # Rolled back, not merely never committed: what it staged is given back. (The link
    # was looked for by identity among Proton's wrappers, a new one at every event: the
    # transaction stayed open, its transfers and their bytes counted for good.)
    rolled_back = [line for line in router.log_text().splitlines() if '"transaction_rolled_back"' in line]
    assert len(rolled_back) == 1 and '"dropped": 5' in rolled_back[0]


def test_a_commit_waits_for_the_transfers_flow_control_holds(qpid_flow_process: StartRouter) -> None:
    """Flow is ON (3 waiting, stop above 2) with reject_after: a transactional transfer is
    held, unanswered; the client commits at once; the commit waits until a consumer makes
    room, the held transfer is admitted into the transaction, then the commit enqueues it."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='[destinations."tx.flow"]\nmax_count = 10\nflow_stop_count = 2\nflow_resume_count = 1\n'
        'reject_after = "60s"\n',
        extra_args=["--admin", admin],
    )
    _send_plain(router, "tx.flow", 3)
    assert stats(admin, "tx.flow")["flowStopped"] is True
    drained: list[Any] = []

    def make_room_once_held() -> None:
        deadline = time.monotonic() + TIMEOUT
        while stats(admin, "tx.flow")["transfersHeld"] < 1:  # the transfer is held
            assert time.monotonic() < deadline, "the transactional transfer was never held"
            time.sleep(0.05)
        drained.extend(drain(router, "tx.flow", 3, timeout=0.1))

    drainer = threading.Thread(target=make_room_once_held, daemon=True)
    client = TxClient(router.url, "tx.flow", send=1, discharge_when_sent=True, before_discharge=drainer.start).run()
    drainer.join(TIMEOUT)
    assert client.result == "committed"
    # The drainer may get the committed message too: the commit follows its first accept.
    assert drained + drain(router, "tx.flow", 4 - len(drained)) == ["plain-0", "plain-1", "plain-2", "tx-1"]


@pytest.mark.parametrize(
    "limit",
    ['[destinations."tx.big"]\nflow_stop_size = 200\nflow_resume_size = 100\n', "memory_limit = 200\n"],
    ids=["flow_stop_size", "memory_limit"],
)
def test_a_transaction_past_a_size_limit_on_credit_it_was_given_commits(
    qpid_flow_process: StartRouter, limit: str
) -> None:
    """No message size known yet, a producer gets a full window; its transaction sends 20
    messages, past the stop size (or the memory limit) with what it staged itself. Those
    past it were held until flow turned OFF (or memory freed), which only the commit could
    bring, and the commit waited for them: the discharge was never answered. They are
    staged instead (the commit enqueues them, credit or not), and the commit goes in."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(config_text=limit, extra_args=["--admin", admin])
    client = TxClient(router.url, "tx.big", send=20)
    runner = threading.Thread(target=client.run, daemon=True)
    runner.start()
    runner.join(TIMEOUT)
    assert client.answered == 20, f"{client.answered} of 20 transactional transfers answered"
    assert client.result == "committed"
    assert stats(admin, "tx.big")["depth"] == 20


@pytest.mark.parametrize("descriptors", ["numeric", "symbolic"])
def test_a_discharge_named_by_numeric_descriptor_commits(qpid_flow_process: StartRouter, descriptors: str) -> None:
    """qpid-jms, rhea and AMQP.Net Lite describe declare and discharge by code (0x31, 0x32),
    Proton by symbol. Every numeric discharge was refused ``amqp:transaction:unknown-id``:
    the txn-id was read from a buffer already freed."""
    from urllib.parse import urlsplit

    from proton import Described, Endpoint, Terminus, symbol, ulong

    from .harness.rawclient import RawClient

    declare, discharge = (
        (ulong(0x31), ulong(0x32))
        if descriptors == "numeric"
        else (symbol("amqp:declare:list"), symbol("amqp:discharge:list"))
    )
    router = qpid_flow_process()
    client = RawClient(urlsplit(router.url).port or 5672)
    try:
        client.connection.open()
        session = client.connection.session()
        session.open()
        controller = session.sender("controller")
        controller.source.address = "controller"
        controller.target.type = Terminus.COORDINATOR
        controller.open()
        producer = session.sender("producer")
        producer.target.address = "tx.numeric"
        producer.open()
        assert client.pump(lambda: controller.credit > 0 and producer.credit > 0)

        def transfer(link: Any, body: Any, txn: bytes | None = None) -> Any:
            delivery = link.delivery(f"{link.name}-{time.monotonic_ns()}".encode())
            if txn is not None:
                delivery.local.data = [txn]
                delivery.update(0x34)  # transactional-state
            link.send(Message(body=body).encode())
            link.advance()
            return delivery

        declared = transfer(controller, Described(declare, [None]))
        assert client.pump(lambda: declared.remote_state)
        txn = bytes(declared.remote.data[0])
        staged = transfer(producer, "in the transaction", txn)
        assert client.pump(lambda: staged.remote_state)
        discharged = transfer(controller, Described(discharge, [txn, False]))
        assert client.pump(lambda: discharged.remote_state)
        assert discharged.remote_state == discharged.ACCEPTED, discharged.remote.condition
        assert client.connection.state & Endpoint.REMOTE_ACTIVE
    finally:
        client.close()
    assert drain(router, "tx.numeric", 1) == ["in the transaction"]


class _StaysAfterAbort(TxClient):
    """Takes ``take`` messages in a transaction with credit to spare, aborts, and stays:
    what comes back to it within ``wait`` seconds of the abort is ``again``."""

    def __init__(self, url: str, address: str, take: int, wait: float) -> None:
        super().__init__(url, address, take=take, commit=False, settle_before_discharge=True)
        self.wait = wait
        self.again: list[Any] = []

    def on_transaction_declared(self, event: Event) -> None:
        self.transaction = event.transaction
        self.receiver.flow(self.to_take + 5)

    def on_message(self, event: Event) -> None:
        if self.result:  # discharging (they may come back before the answer) or aborted
            self.again.append(event.message.body)
            event.delivery.settle()
            return
        super().on_message(event)

    def on_transaction_aborted(self, _event: Event) -> None:
        self.result = "aborted"
        self.timer.cancel()
        self.container.schedule(self.wait, self)

    def on_timer_task(self, _event: Event) -> None:
        if self.result != "aborted":
            self.result = "timed out"
        self.connection.close()


def test_messages_a_rollback_gives_back_go_out_again_at_once(router_with_admin: tuple[RouterProcess, str]) -> None:
    """The consumer that rolled back still has credit: the messages it had accepted (and
    settled, as qpid-jms does) come back to it without any other event. (They went back to
    the queue and waited there until a new message, credit or settlement came along.)"""
    router, _admin = router_with_admin
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("tx.again")
        for n in range(3):
            sender.send(Message(body=f"m{n}"))
    finally:
        connection.close()
    client = _StaysAfterAbort(router.url, "tx.again", take=3, wait=2.0).run()
    assert client.result == "aborted" and client.taken == ["m0", "m1", "m2"]
    assert client.again == ["m0", "m1", "m2"]


def _raw_link(session: Any, name: str, address: str, *, receiver: bool = False, coordinator: bool = False) -> Any:
    link = session.receiver(name) if receiver else session.sender(name)
    if coordinator:
        link.source.address = "ctl"
        link.target.type = Terminus.COORDINATOR
        link.target.capabilities.put_object(symbol("amqp:local-transactions"))
    elif receiver:
        link.source.address = address
    else:
        link.target.address = address
    link.open()
    return link


@pytest.mark.parametrize("first", ["coordinator", "consumer"])
def test_a_connection_lost_in_a_transaction_gives_each_message_back_once(
    qpid_flow_process: StartRouter, first: str
) -> None:
    """A consumer takes a group's three messages and accepts two in a transaction
    (settled), then its connection drops. Each comes back once, one failed attempt each.
    (With the coordinator attached first, its rollback gave the two back and dispatched
    them to the consumer of the dying connection, which still had credit and released
    them again: delivery counts 2, 2, 1, and 5 delivered for 3.)"""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='[destinations."tx.lost"]\nshared_groups = true\n', extra_args=["--admin", admin]
    )
    connection = BlockingConnection(router.url, timeout=10)
    sender = connection.create_sender("tx.lost")
    for n in (1, 2, 3):
        sender.send(Message(body=f"a{n}", group_id="A"))
    connection.close()

    client = RawClient(int(router.url.rsplit(":", 1)[1]))
    client.connection.open()
    session = client.connection.session()
    session.open()
    if first == "coordinator":
        controller = _raw_link(session, "ctl", "", coordinator=True)
        consumer = _raw_link(session, "rcv", "tx.lost", receiver=True)
    else:
        consumer = _raw_link(session, "rcv", "tx.lost", receiver=True)
        controller = _raw_link(session, "ctl", "", coordinator=True)
    assert client.pump(lambda: controller.credit > 0 and consumer.state & Endpoint.REMOTE_ACTIVE)
    declare = controller.delivery(b"d")
    controller.send(Message(body=Described(symbol("amqp:declare:list"), [None])).encode())
    controller.advance()
    assert client.pump(lambda: declare.remote_state)
    txn = bytes(declare.remote.data[0])
    consumer.flow(5)
    got: list[Any] = []

    def have_three() -> bool:
        while (delivery := consumer.current) is not None and delivery.readable and not delivery.partial:
            consumer.recv(delivery.pending)
            consumer.advance()
            got.append(delivery)
        return len(got) == 3

    assert client.pump(have_three)
    for delivery in got[:2]:  # accepted in the transaction, settled
        delivery.local.data = [txn, Described(ulong(0x24), [])]
        delivery.update(0x34)
        delivery.settle()
    client.pump(lambda: False, 0.5)
    client.close()  # dropped: no detach, no close

    deadline = time.monotonic() + TIMEOUT
    while stats(admin, "tx.lost")["released"] < 3:
        assert time.monotonic() < deadline, stats(admin, "tx.lost")
        time.sleep(0.05)
    record = stats(admin, "tx.lost")
    assert (record["delivered"], record["released"], record["depth"]) == (3, 3, 3)
    assert take_counted(router, "tx.lost", 3) == [("a1", 1), ("a2", 1), ("a3", 1)]
