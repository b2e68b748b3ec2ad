"""A long-lived connection that opens and closes links by the thousand does not make
qpid-flow grow (qpid_flow/amqp/reclaim.py).

JMS listener containers and request/response clients keep one connection for days and
open a consumer or producer per request. qpid-flow used to keep each link's protocol state
until its connection closed: about 2 KB a link standalone and 5.5 KB a link in front of
RabbitMQ (a client link and its upstream link), measured. Here one connection opens and
closes 3,000 links in turn (receivers and senders, closed by the client; RabbitMQ answers
a close with a bare detach); qpid-flow's resident memory must stay within 1.5 MB of what
it was after the first 500 (it grew by 6 MB standalone and 16 MB in front of RabbitMQ).
"""

from __future__ import annotations

import threading
from typing import Any

from proton.handlers import MessagingHandler
from proton.reactor import Container

from tests.integration.clients import unique
from tests.integration.harness.broker import Broker
from tests.integration.harness.router import StartRouter

WARM_UP = 500
LINKS = 3_000
GROWTH_LIMIT = 1_500_000  # bytes


class _Churn(MessagingHandler):
    """Opens a link, closes it once attached, and opens the next, on one connection;
    notes qpid-flow's resident memory after the warm-up and at the end."""

    def __init__(self, url: str, address: str, resident: Any) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = url
        self.address = address
        self.resident = resident
        self.ended = 0
        self.figures: dict[str, int] = {}
        self.error: str | None = None
        self.done = threading.Event()

    def on_start(self, event: Any) -> None:
        self.connection = event.container.connect(self.url, reconnect=False)
        self._next(event.container)

    def _next(self, container: Any) -> None:
        name = f"churn-{self.ended}"
        if self.ended % 2:
            container.create_sender(self.connection, self.address, name=name)
        else:
            container.create_receiver(self.connection, self.address, name=name)

    def on_link_opened(self, event: Any) -> None:
        event.link.close()

    def on_link_remote_detach(self, event: Any) -> None:
        self._ended(event)

    def on_link_closed(self, event: Any) -> None:
        self._ended(event)

    def on_link_error(self, event: Any) -> None:
        self._finish(event, f"link refused: {event.link.remote_condition}")

    def on_transport_error(self, event: Any) -> None:
        self._finish(event, f"connection lost: {event.transport.condition}")

    def _ended(self, event: Any) -> None:
        self.ended += 1
        if self.ended == WARM_UP:
            self.figures["warm"] = self.resident()
        if self.ended == WARM_UP + LINKS:
            self.figures["end"] = self.resident()
            self._finish(event, None)
        else:
            self._next(event.container)

    def _finish(self, event: Any, error: str | None) -> None:
        self.error = self.error or error
        event.connection.close()
        self.done.set()


def _churn(url: str, address: str, resident: Any) -> dict[str, int]:
    churn = _Churn(url, address, resident)
    container = Container(churn)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    finished = churn.done.wait(240)
    container.stop()
    thread.join(10)
    assert finished, f"the client stopped after {churn.ended} links"
    assert churn.error is None, churn.error
    return churn.figures


def test_link_churn_on_one_connection_standalone(qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process()
    figures = _churn(router.url, unique("churn"), router.resident_bytes)
    assert figures["end"] - figures["warm"] < GROWTH_LIMIT, figures


def test_link_churn_on_one_connection_in_front_of_rabbitmq(rabbitmq: Broker, qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process(broker_url=rabbitmq.url)
    url = f"amqp://{rabbitmq.user}:{rabbitmq.password}@{router.host}:{router.port}"
    figures = _churn(url, f"/queue/{unique('churn')}", router.resident_bytes)
    assert figures["end"] - figures["warm"] < GROWTH_LIMIT, figures
