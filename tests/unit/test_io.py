"""RelayContainer's own dispatch: a connection's handler is forgotten with the connection."""

from __future__ import annotations

from typing import Any

from proton.handlers import MessagingHandler

from qpid_flow.amqp.reactor import RelayContainer

from ..integration.harness.net import free_port


class Refused(MessagingHandler):
    """Connects where nothing listens, as qpid-flow's broker reader does while the broker is down."""

    def __init__(self) -> None:
        super().__init__()
        self.errors = 0

    def on_transport_error(self, event: Any) -> None:
        self.errors += 1


def test_the_handler_of_a_finished_connection_is_forgotten() -> None:
    """Its C address is reused by later connections (a client's): a stale entry would
    route their deliveries to this handler (the producer stall of docs/behaviour.md)."""
    container = RelayContainer()
    handler = Refused()
    container.connect(f"amqp://127.0.0.1:{free_port()}", handler=handler, reconnect=False)
    assert len(container._connection_handlers) == 1
    container.run()
    assert handler.errors == 1
    assert container._connection_handlers == {}


class _Ended:
    """A connection's selectable after its transport closed: Proton's close handler drops
    the transport from it, and an expiry posted before that still reaches the I/O handler."""

    _transport = None

    class _reactor:  # Proton reads the selectable's _reactor.now
        now = 0.0


class _Expired:
    selectable = _Ended()


def test_an_expiry_that_arrives_after_its_transport_closed_is_ignored() -> None:
    # It ended the whole process with an AttributeError (every client's connection with it).
    from qpid_flow.amqp.reactor import BatchingIOHandler

    BatchingIOHandler().on_selectable_expired(_Expired())
