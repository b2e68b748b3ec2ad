"""Real AMQP 1.0 clients for the integration tests (Proton Python, each in its own container).

Each client runs a Proton ``Container`` in a thread of the test process and records
what it saw: the outcome of every message sent, every message received in arrival
order. They are ordinary clients: nothing here knows qpid-flow is on the other side.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proton import Delivery, Handler, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

__all__ = ["Consumer", "Producer", "Received", "make_message", "run_all", "start", "unique"]


def unique(prefix: str) -> str:
    """An address no other test (or earlier run against the same broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_message(
    producer: str, index: int, size: int = 100, group: str | None = None, to: str | None = None, **props: Any
) -> Message:
    """A message that says who sent it and its number, with properties to check end to end;
    ``to``: its address, for an anonymous-relay producer."""
    body = f"{producer}:{index}:".ljust(size, "x")
    return Message(
        id=f"{producer}-{index}",
        address=to,
        body=body,
        subject="test",
        group_id=group,
        properties={"producer": producer, "index": index, **props},
        durable=False,
    )


@dataclass
class Received:
    message: Message
    at: float
    settled_at: float = 0.0
    outcome: str = ""


class _Client(MessagingHandler):
    """Common parts: connect without silent reconnect, stop on timeout, record errors."""

    def __init__(self, url: str, timeout: float, reconnect: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.timeout = timeout
        # Seconds to wait before connecting again after losing the connection (None: give
        # up), as an application with its own reconnect does; ``url`` may be changed meanwhile.
        self.reconnect = reconnect
        self.reconnects = 0
        self.losses: list[str] = []  # why each connection ended, in order
        self.bound = False
        self.error: str | None = None
        self.done = threading.Event()
        self.connection: Any = None
        self.container: Container | None = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.deadline = event.container.schedule(self.timeout, self)
        self.connect(event)
        if self.reconnect is not None:
            event.container.schedule(0.5, _Watch(self))

    # Seconds of silence after which the client drops its connection (its open frame
    # asks the peer for keep-alives every half of it); None: no idle timeout.
    heartbeat: float | None = None

    def connect(self, event: Any) -> None:
        self.bound = False  # the new connection's transport not seen yet (see _Watch)
        self.connection = event.container.connect(self.url, reconnect=False, heartbeat=self.heartbeat)
        self.open_links(event)

    def _lost(self, why: str) -> bool:
        """The connection is gone: True when the client will connect again."""
        if self.reconnect is None or self.done.is_set() or self.container is None:
            return False
        self.reconnects += 1
        self.losses.append(why)
        if self.connection is not None and self.connection.state & self.connection.LOCAL_ACTIVE:
            self.connection.close()
        self.connection = None
        self.container.schedule(self.reconnect, _Reconnect(self))
        return True

    def open_links(self, event: Any) -> None:
        raise NotImplementedError

    def on_timer_task(self, event: Any) -> None:
        if not self.done.is_set():
            self.error = self.error or "timed out"
            self.finish()

    def finish(self) -> None:
        """Close cleanly: the container stops once the close handshake is over, so
        everything written before (pre-settled transfers, dispositions) reaches the peer."""
        self.done.set()
        if self.connection is not None:
            self.connection.close()
        if self.container is not None:
            self.container.schedule(5.0, _Stop(self.container))

    def on_connection_closed(self, event: Any) -> None:
        if self.container is not None and self.done.is_set():
            self.container.stop()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        if event.connection != self.connection and self.reconnect is not None:
            return  # an earlier connection's end
        if self._lost(condition.name if condition else "disconnected"):
            return
        if not self.done.is_set():
            self.error = (
                f"transport error: {condition.name if condition else '?'}: {condition.description if condition else ''}"
            )

    def on_link_error(self, event: Any) -> None:
        condition = event.link.remote_condition
        if self.reconnect is not None and (event.connection != self.connection or self._lost(condition.name)):
            return  # an application that reconnects starts over on a new connection
        self.error = f"link error: {condition.name}: {condition.description}"
        self.finish()

    def on_session_error(self, event: Any) -> None:
        condition = event.session.remote_condition
        if self.reconnect is not None and (event.connection != self.connection or self._lost(condition.name)):
            return
        self.error = f"session error: {condition.name}: {condition.description}"
        self.finish()

    def on_connection_error(self, event: Any) -> None:
        condition = event.connection.remote_condition
        if self.reconnect is not None and (event.connection != self.connection or self._lost(condition.name)):
            return
        self.error = f"connection error: {condition.name}: {condition.description}"
        self.finish()

    def on_disconnected(self, event: Any) -> None:
        # Proton's messaging layer reports a close with amqp:connection:forced (the
        # broker's, or qpid-flow's when the broker is lost) only as this disconnect.
        condition = event.connection.remote_condition if event.connection is not None else None
        why = condition.name if condition is not None else "disconnected"
        if self.reconnect is not None and (event.connection != self.connection or self._lost(why)):
            return
        if not self.done.is_set():
            self.error = self.error or "disconnected"
            self.done.set()
            if self.container is not None:
                self.container.stop()

    def run(self) -> None:
        try:
            Container(self).run()
        except Exception as exc:  # surfaced by the test, not lost in the thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()


class Producer(_Client):
    """Sends ``messages`` to ``address`` (or each to its own ``to`` with ``anonymous``)."""

    def __init__(
        self,
        url: str,
        address: str | None,
        messages: list[Message],
        timeout: float = 120.0,
        presettled: bool = False,
        pace: float = 0.0,
        reconnect: float | None = None,
        rate: float = 0.0,
    ) -> None:
        super().__init__(url, timeout, reconnect=reconnect, auto_settle=True)
        self.address = address
        self.messages = messages
        self.presettled = presettled
        self.pace = pace
        # Messages a second, sent from a timer every ``_TICK`` (a few at a time, as an
        # application paced by its own clock): the container is not blocked meanwhile,
        # so keep-alives and outcomes go on (``pace`` sleeps between sends instead).
        self.rate = rate
        self._budget = 0.0
        self.sent = 0
        self.to_send: list[int] = []  # indices still to send, the next one last
        # index -> outcome name ("accepted", "rejected", "released", "modified")
        self.outcomes: dict[int, str] = {}
        self.conditions: dict[int, str] = {}
        self.settled_at: dict[int, float] = {}
        self.sender: Any = None

    def open_links(self, event: Any) -> None:
        options = None
        if self.presettled:
            from proton.reactor import AtMostOnce

            options = AtMostOnce()
        self.sender = event.container.create_sender(self.connection, self.address, options=options)
        # After a reconnect, whatever got no outcome is sent again (at least once).
        self.to_send = [i for i in range(len(self.messages)) if i not in self.outcomes]
        self.to_send.reverse()

    def on_start(self, event: Any) -> None:
        super().on_start(event)
        if self.rate:
            event.container.schedule(_TICK, _Pace(self))

    def tick(self, container: Any) -> None:
        """``rate``: this tick's messages, as far as the credit goes."""
        if self.done.is_set():
            return
        self._budget = min(self._budget + self.rate * _TICK, max(self.rate * _TICK, 1.0))
        sender = self.sender
        while self._budget >= 1 and self.connection is not None and sender.credit > 0 and self.to_send:
            self._send(sender)
            self._budget -= 1
        container.schedule(_TICK, _Pace(self))

    def _send(self, sender: Any) -> None:
        index = self.to_send.pop()
        delivery = sender.send(self.messages[index])
        delivery.index = index
        self.sent += 1
        if self.presettled:
            self.outcomes[delivery.index] = "accepted"

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        if sender != self.sender or self.rate:
            return  # a link of a connection lost earlier; or sent by the timer
        while sender.credit > 0 and self.to_send:
            self._send(sender)
            if self.pace:
                time.sleep(self.pace)
        if self.presettled and not self.to_send:
            self.finish()

    def _record(self, event: Any, outcome: str) -> None:
        index = event.delivery.index
        self.outcomes[index] = outcome
        self.settled_at[index] = time.monotonic()
        if outcome == "rejected" and event.delivery.remote.condition is not None:
            self.conditions[index] = event.delivery.remote.condition.name
        if len(self.outcomes) == len(self.messages):
            self.finish()

    def on_accepted(self, event: Any) -> None:
        self._record(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        self._record(event, "rejected")

    def on_released(self, event: Any) -> None:
        state = event.delivery.remote_state
        self._record(event, "modified" if state == Delivery.MODIFIED else "released")


class Consumer(_Client):
    """Receives from ``address`` with a fixed credit window, settling each message as
    ``decide(message)`` says: "accept", "reject", "release", or "hold" (never settle).

    Stops after ``count`` messages were accepted or rejected (or when ``stop()`` is set).
    """

    def __init__(
        self,
        url: str,
        address: str,
        count: int | None = None,
        prefetch: int = 10,
        timeout: float = 120.0,
        decide: Callable[[Message], str] | None = None,
        idle_stop: float | None = None,
        stop: threading.Event | None = None,
        reconnect: float | None = None,
    ) -> None:
        super().__init__(url, timeout, reconnect=reconnect, prefetch=0, auto_accept=False, auto_settle=True)
        self.address = address
        self.count = count
        self.prefetch = prefetch
        self.decide = decide or (lambda _m: "accept")
        self.idle_stop = idle_stop
        self.stop_event = stop
        self.received: list[Received] = []
        self.finished = 0
        self.last_activity = time.monotonic()
        self.receiver: Any = None

    def open_links(self, event: Any) -> None:
        self.receiver = event.container.create_receiver(self.connection, self.address)
        self.receiver.flow(self.prefetch)
        if (self.idle_stop is not None or self.stop_event is not None) and not self.reconnects:
            event.container.schedule(0.1, _Poll(self))

    def on_message(self, event: Any) -> None:
        now = time.monotonic()
        self.last_activity = now
        record = Received(event.message, now)
        self.received.append(record)
        verdict = self.decide(event.message)
        record.outcome = verdict
        if verdict == "hold":
            return  # never settle it, and take no more credit for it
        if verdict == "accept":
            self.accept(event.delivery)
        elif verdict == "reject":
            self.reject(event.delivery)
        else:
            self.release(event.delivery, delivered=False)
        record.settled_at = time.monotonic()
        if verdict in ("accept", "reject"):
            self.finished += 1
        event.receiver.flow(1)
        if self.count is not None and self.finished >= self.count:
            self.finish()

    def poll(self, container: Any) -> None:
        if self.done.is_set():
            return
        if self.stop_event is not None and self.stop_event.is_set():
            self.finish()
            return
        if self.idle_stop is not None and time.monotonic() - self.last_activity > self.idle_stop:
            self.finish()
            return
        container.schedule(0.1, _Poll(self))


class _Stop(Handler):
    def __init__(self, container: Container) -> None:
        super().__init__()
        self.container = container

    def on_timer_task(self, event: Any) -> None:
        self.container.stop()


_TICK = 0.1  # seconds between a rate-paced producer's sends (Producer.rate)


class _Pace(Handler):
    def __init__(self, producer: Producer) -> None:
        super().__init__()
        self.producer = producer

    def on_timer_task(self, event: Any) -> None:
        self.producer.tick(event.container)


class _Watch(Handler):
    """Reconnect when the connection's transport has ended, even if no event said so for
    that connection (a disconnect can arrive with its transport already unbound)."""

    def __init__(self, client: _Client) -> None:
        super().__init__()
        self.client = client

    def on_timer_task(self, event: Any) -> None:
        client = self.client
        if client.done.is_set():
            return
        connection = client.connection
        if connection is not None:
            transport = connection.transport
            if transport is not None and not transport.closed:
                client.bound = True
            elif client.bound:
                # Bound once and gone since: a connection just made has no transport for
                # a turn or two, which is not a loss.
                client._lost("disconnected")
        event.container.schedule(0.5, self)


class _Reconnect(Handler):
    def __init__(self, client: _Client) -> None:
        super().__init__()
        self.client = client

    def on_timer_task(self, event: Any) -> None:
        if not self.client.done.is_set() and self.client.connection is None:
            self.client.connect(event)


class _Poll(Handler):
    def __init__(self, consumer: Consumer) -> None:
        super().__init__()
        self.consumer = consumer

    def on_timer_task(self, event: Any) -> None:
        self.consumer.poll(event.container)


@dataclass
class Running:
    threads: list[threading.Thread] = field(default_factory=list)


def start(*clients: _Client) -> list[threading.Thread]:
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for t in threads:
        t.start()
    return threads


def run_all(*clients: _Client, timeout: float = 180.0) -> None:
    """Run clients concurrently until each finishes (or the timeout passes)."""
    threads = start(*clients)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
