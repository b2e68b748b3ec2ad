"""A scripted AMQP client: one Proton container the test itself turns, so that it decides
when each transfer is sent, how much credit each receiver gives and when each delivery
is settled, with no thread and no callback in between.

Races between a producer, a consumer and qpid-flow's own timers are reproduced this way
one step at a time (the threaded clients of :mod:`.clients` run on their own).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proton import Connection, Delivery, Endpoint, Handler, Link, Message
from proton.reactor import AtMostOnce, Container


class _Recorder(Handler):
    """Keeps every complete message each receiver gets, with its delivery, and the errors."""

    def __init__(self) -> None:
        super().__init__()
        self.received: dict[Any, list[tuple[Delivery, Message]]] = {}
        self.errors: list[str] = []

    def on_delivery(self, event: Any) -> None:
        delivery, link = event.delivery, event.link
        if link.is_receiver and delivery.readable and not delivery.partial:
            message = Message()
            message.decode(link.recv(delivery.pending))
            link.advance()
            self.received.setdefault(link._impl, []).append((delivery, message))

    def on_link_remote_close(self, event: Any) -> None:
        self.errors.append(f"link {event.link.name}: {event.link.remote_condition}")
        event.link.close()

    def on_connection_remote_close(self, event: Any) -> None:
        self.errors.append(f"connection: {event.connection.remote_condition}")

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f"transport: {event.transport.condition}")


class ScriptedClient:
    """Connections and links on one container, turned by :meth:`pump`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.container = Container()
        self.container.timeout = 0.05  # a turn waits at most this long for I/O
        self.container.start()
        self._recorder = _Recorder()
        self._accepted: dict[Any, int] = {}  # per receiver: how many of its deliveries were accepted

    def pump(self, until: Callable[[], bool] | None = None, timeout: float = 0.3, what: str = "") -> bool:
        """Turn the container until ``until()`` holds (an AssertionError naming ``what`` if it
        does not within ``timeout``), or for ``timeout`` seconds when there is no condition."""
        deadline = time.monotonic() + timeout
        while until is None or not until():
            if time.monotonic() > deadline:
                if until is None:
                    return True
                if what:
                    raise AssertionError(f"timed out waiting for {what}; errors: {self._recorder.errors}")
                return False
            self.container.process()
        return True

    def connect(self) -> Connection:
        connection = self.container.connect(self.url, handler=self._recorder, reconnect=False)
        self.pump(lambda: bool(connection.state & Endpoint.REMOTE_ACTIVE), 10, "the connection to open")
        return connection

    def sender(self, connection: Connection, address: str | None, presettled: bool = False) -> Link:
        """A sender to ``address`` (None: an anonymous-relay sender), attached, with the
        credit qpid-flow gave it at attach."""
        link = self.container.create_sender(connection, address, options=AtMostOnce() if presettled else None)
        self.pump(lambda: bool(link.state & Endpoint.REMOTE_ACTIVE), 10, "the sender to attach")
        self.pump(None, 0.2)
        return link

    def receiver(self, connection: Connection, address: str, credit: int = 0) -> Link:
        link = self.container.create_receiver(connection, address)
        self.pump(lambda: bool(link.state & Endpoint.REMOTE_ACTIVE), 10, "the receiver to attach")
        if credit:
            link.flow(credit)
        return link

    def received(self, receiver: Link) -> list[tuple[Delivery, Message]]:
        """What ``receiver`` got so far, in order: (delivery, message)."""
        return self._recorder.received.setdefault(receiver._impl, [])

    def accept_new(self, receiver: Link) -> int:
        """Accept what ``receiver`` got since the last call; how many it got in all."""
        got = self.received(receiver)
        done = self._accepted.get(receiver._impl, 0)
        for delivery, _ in got[done:]:
            accept(delivery)
        self._accepted[receiver._impl] = len(got)
        return len(got)

    @property
    def errors(self) -> list[str]:
        return self._recorder.errors

    def close(self) -> None:
        self.container.stop()


def numbered(index: int, size: int = 10, to: str | None = None, **properties: Any) -> Message:
    """A message whose application property ``i`` is ``index``, with a body of ``size`` bytes."""
    return Message(body="x" * size, address=to, properties={"i": index, **properties})


def accept(delivery: Delivery) -> None:
    delivery.update(Delivery.ACCEPTED)
    delivery.settle()
