"""Blocking send and receive helpers around Python Proton clients with explicit credit, for
the harness and tests that need one call per exchange (tests/integration/clients.py holds
the recording clients that run side by side in threads).

Why not `proton.utils.BlockingConnection` or the default `MessagingHandler`:
- `MessagingHandler(prefetch=1)` stalls after one message against RabbitMQ, so receivers here use
  `prefetch=0` and grant credit themselves with `link.flow(n)`;
- `Container.connect` silently reconnects by default, which hides a dead peer; we always pass
  `reconnect=False` so a failure surfaces as an error;
- every run has a deadline, so a hung peer fails the test instead of hanging CI.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class ClientError(AssertionError):
    """A Proton client run failed (timeout, rejected delivery, remote close...)."""


class _Client(MessagingHandler):
    """Shared plumbing: connect without reconnect, a deadline, and error capture."""

    def __init__(self, url: str, address: str, timeout: float) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url = url
        self.address = address
        self.timeout = timeout
        self.error: str | None = None
        self._conn: Any = None
        self._timer: Any = None

    # Handlers take `event: Any`: Proton types every Event attribute as Optional, yet each one a
    # handler reads is set for the event types it handles.

    def on_start(self, event: Any) -> None:
        self._timer = event.container.schedule(self.timeout, self)
        self._conn = event.container.connect(self.url, reconnect=False)
        self.open_link(event.container, self._conn)

    def open_link(self, container: Container, conn: Any) -> None:
        raise NotImplementedError

    def on_timer_task(self, event: Any) -> None:
        self.fail(f"timed out after {self.timeout}s ({self.progress()})")

    def progress(self) -> str:
        return ""

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        self.finish()

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        self.fail(f"transport error: {cond.name if cond else '?'}: {cond.description if cond else ''}")

    def on_connection_error(self, event: Any) -> None:
        self.fail(f"connection closed by peer: {event.connection.remote_condition}")

    def on_session_error(self, event: Any) -> None:
        self.fail(f"session closed by peer: {event.session.remote_condition}")

    def on_link_error(self, event: Any) -> None:
        self.fail(f"link closed by peer: {event.link.remote_condition}")

    def on_disconnected(self, event: Any) -> None:
        if self._conn is not None:  # not a close we asked for
            self.fail(f"disconnected ({self.progress()})")

    def run(self) -> None:
        Container(self).run()
        if self.error is not None:
            raise ClientError(f"{type(self).__name__} {self.url} {self.address}: {self.error}")


class _Sender(_Client):
    def __init__(self, url: str, address: str, messages: Sequence[Message], timeout: float):
        super().__init__(url, address, timeout)
        self.messages = list(messages)
        self.sent = 0
        self.accepted = 0

    def open_link(self, container: Container, conn: Any) -> None:
        if not self.messages:
            self.finish()
            return
        container.create_sender(conn, self.address)

    def progress(self) -> str:
        return f"sent {self.sent}, accepted {self.accepted} of {len(self.messages)}"

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < len(self.messages):
            event.sender.send(self.messages[self.sent])
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == len(self.messages):
            self.finish()

    def on_rejected(self, event: Any) -> None:
        self.fail(f"delivery rejected: {event.delivery.remote.condition} ({self.progress()})")

    def on_released(self, event: Any) -> None:
        self.fail(f"delivery released/modified ({self.progress()})")


class _Receiver(_Client):
    def __init__(self, url: str, address: str, count: int, timeout: float):
        super().__init__(url, address, timeout)
        self.count = count
        self.received: list[Message] = []

    def open_link(self, container: Container, conn: Any) -> None:
        receiver = container.create_receiver(conn, self.address)
        receiver.flow(self.count)  # explicit credit: exactly what we want, no prefetch

    def progress(self) -> str:
        return f"received {len(self.received)} of {self.count}"

    def on_message(self, event: Any) -> None:
        delivery = event.delivery
        if len(self.received) >= self.count:
            # RabbitMQ may send beyond the credit granted (BROKERS.md): hand extras back.
            self.release(delivery, delivered=False)
            return
        self.received.append(event.message)
        self.accept(delivery)
        if len(self.received) == self.count:
            self.finish()


def send_messages(url: str, address: str, messages: Sequence[Message], timeout: float = 30.0) -> int:
    """Send `messages` at-least-once to `address`; return when all are accepted.

    Raises ClientError on timeout, rejection, release or a dropped connection.
    """
    sender = _Sender(url, address, messages, timeout)
    sender.run()
    return sender.accepted


def receive_messages(url: str, address: str, count: int, timeout: float = 30.0) -> list[Message]:
    """Receive and accept exactly `count` messages from `address` (credit granted up front)."""
    receiver = _Receiver(url, address, count, timeout)
    receiver.run()
    return receiver.received


def numbered_messages(count: int, group_id: str | None = None, size: int = 0) -> list[Message]:
    """Messages with body {"seq": i}, application property seq=i, a message id, and optionally
    a group id with group_sequence=i, so a receiver can check order and integrity."""
    run = uuid.uuid4().hex[:8]
    out = []
    for i in range(count):
        m = Message(
            id=f"{run}-{i}",
            body={"seq": i, "pad": "x" * size} if size else {"seq": i},
            properties={"seq": i, "run": run},
        )
        if group_id is not None:
            m.group_id = group_id
            m.group_sequence = i
        out.append(m)
    return out


def unique_address(prefix: str = "test") -> str:
    """A queue name no other test uses (RabbitMQ auto-declares plain names on attach)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
