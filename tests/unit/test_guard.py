"""contain_errors: a handler's exception closes its own connection, whatever the event kind.

Real Proton objects in memory: two connections joined by their transports (bytes moved by
hand, no socket), so the peer's view of the close is checked too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from proton import Collector, Condition, Connection, Endpoint, Event, Handler, Sender, Transport
from proton.reactor import Container

from qpid_flow.amqp.endpoints import DeliveryEvent, LinkFlowEvent
from qpid_flow.amqp.guard import contain_errors


class Boom(Exception):
    pass


@contain_errors
class Failing(Handler):
    """Fails on every event it handles, as a handler bug would."""

    def on_delivery(self, event: DeliveryEvent) -> None:
        raise Boom("on_delivery")

    def on_link_flow(self, event: LinkFlowEvent) -> None:
        raise Boom("on_link_flow")

    def on_link_local_open(self, event: Event) -> None:
        raise Boom("on_link_local_open")

    def on_timer_task(self, event: Event) -> None:
        raise Boom("on_timer_task")


@contain_errors
class Working(Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def on_delivery(self, event: DeliveryEvent) -> str:
        self.seen.append(event)
        return "handled"


@dataclass
class Wire:
    """qpid-flow's side of a connection (with an open session and sender) and its peer."""

    connection: Connection
    transport: Transport
    sender: Sender
    collector: Collector
    peer: Connection
    peer_transport: Transport

    def pump(self) -> None:
        """Move bytes both ways until neither side has any to write."""
        moved = True
        while moved:
            moved = False
            for source, target in ((self.transport, self.peer_transport), (self.peer_transport, self.transport)):
                pending = source.pending()
                if pending > 0:
                    target.push(source.peek(pending))
                    source.pop(pending)
                    moved = True


@pytest.fixture
def wire() -> Iterator[Wire]:
    connection = Connection()
    transport = Transport()
    transport.bind(connection)
    collector = Collector()
    connection.collect(collector)
    peer = Connection()
    peer_transport = Transport(Transport.SERVER)
    peer_transport.bind(peer)
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("orders-producer")
    sender.open()
    peer.open()
    w = Wire(connection, transport, sender, collector, peer, peer_transport)
    w.pump()
    assert peer.state & Endpoint.REMOTE_ACTIVE
    yield w
    transport.unbind()
    peer_transport.unbind()


def _event_of_type(collector: Collector, kind: Any) -> Event:
    while (event := collector.peek()) is not None:
        collector.pop()
        if event.type == kind:
            return event
    raise AssertionError(f"no {kind} event")


def _assert_closed_with_internal_error(w: Wire) -> None:
    assert w.connection.state & Endpoint.LOCAL_CLOSED
    assert w.connection.condition.name == "amqp:internal-error"
    w.pump()
    assert w.peer.state & Endpoint.REMOTE_CLOSED
    assert w.peer.remote_condition.name == "amqp:internal-error"


def _handler_errors(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == "handler_error"]


def _call(method: Callable[[Any], object], event: object) -> object:
    """What the reactor gets back from a guarded method (typed as the method it wraps)."""
    return method(event)


def test_an_error_on_a_lean_delivery_event_closes_its_connection(wire: Wire) -> None:
    wire.connection.qf_id = "c7"
    delivery = wire.sender.delivery(b"tag-1")
    with structlog.testing.capture_logs() as logs:
        result = _call(Failing().on_delivery, DeliveryEvent(delivery._impl, wire.sender._impl))
    assert result is None
    _assert_closed_with_internal_error(wire)
    (entry,) = _handler_errors(logs)
    assert entry["log_level"] == "error"
    assert entry["connection"] == "c7"
    assert (entry["handler"], entry["method"]) == ("Failing", "on_delivery")
    assert isinstance(entry["exc_info"], Boom)


def test_an_error_on_a_lean_link_flow_event_closes_its_connection(wire: Wire) -> None:
    wire.connection.qf_id = "c8"
    with structlog.testing.capture_logs() as logs:
        result = _call(Failing().on_link_flow, LinkFlowEvent(wire.sender._impl))
    assert result is None
    _assert_closed_with_internal_error(wire)
    (entry,) = _handler_errors(logs)
    assert (entry["connection"], entry["method"]) == ("c8", "on_link_flow")


def test_an_error_on_a_proton_event_closes_its_connection(wire: Wire) -> None:
    event = _event_of_type(wire.collector, Event.LINK_LOCAL_OPEN)
    with structlog.testing.capture_logs() as logs:
        result = _call(Failing().on_link_local_open, event)
    assert result is None
    _assert_closed_with_internal_error(wire)
    (entry,) = _handler_errors(logs)
    assert entry["connection"] is None  # no qf_id kept on this connection
    assert str(entry["exc_info"]) == "on_link_local_open"


def test_a_connection_already_closed_keeps_its_own_condition(wire: Wire) -> None:
    wire.connection.condition = Condition("amqp:connection:forced", "broker lost")
    wire.connection.close()
    with structlog.testing.capture_logs() as logs:
        Failing().on_link_flow(LinkFlowEvent(wire.sender._impl))
    assert wire.connection.condition.name == "amqp:connection:forced"
    assert len(_handler_errors(logs)) == 1


def test_a_handler_without_errors_is_unaffected(wire: Wire) -> None:
    handler = Working()
    event = DeliveryEvent(wire.sender.delivery(b"tag-2")._impl, wire.sender._impl)
    with structlog.testing.capture_logs() as logs:
        assert handler.on_delivery(event) == "handled"
    assert handler.seen == [event]
    assert logs == []
    assert wire.connection.state & Endpoint.LOCAL_ACTIVE


def test_only_on_methods_are_guarded() -> None:
    @contain_errors
    class Mixed(Handler):
        def on_anything(self, event: object) -> None:
            raise Boom("on_anything")

        def helper(self, event: object) -> None:
            raise Boom("helper")

    with structlog.testing.capture_logs():
        assert _call(Mixed().on_anything, object()) is None
    assert Mixed.on_anything.__name__ == "on_anything"
    with pytest.raises(Boom):
        Mixed().helper(object())


def test_a_timer_event_has_no_connection_and_only_logs() -> None:
    # A real reactor turn: the timer fires, the handler fails, and run() still ends normally.
    container = Container(Handler())
    container.schedule(0, Failing())
    with structlog.testing.capture_logs() as logs:
        container.run()
    (entry,) = _handler_errors(logs)
    assert (entry["method"], entry["connection"]) == ("on_timer_task", None)
    assert [e["event"] for e in logs] == ["handler_error"]


class _Unclosable:
    """A connection whose close fails (as Proton may on a freed or half-torn object)."""

    state = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
    qf_id = "c9"
    condition: Condition | None = None

    def close(self) -> None:
        raise RuntimeError("close failed")


class _BrokenEvent:
    @property
    def link(self) -> Any:
        raise RuntimeError("link freed")


def test_a_failing_close_is_logged_and_never_raised() -> None:
    class EventOfUnclosable:
        connection = _Unclosable()

    with structlog.testing.capture_logs() as logs:
        assert _call(Failing().on_link_local_open, EventOfUnclosable()) is None
    assert [e["event"] for e in logs] == ["handler_error", "handler_error_close_failed"]
    assert all(e["connection"] == "c9" for e in logs)
    assert str(logs[1]["exc_info"]) == "close failed"


def test_an_event_whose_connection_cannot_be_found_still_logs_the_error() -> None:
    with structlog.testing.capture_logs() as logs:
        assert _call(Failing().on_link_flow, _BrokenEvent()) is None
    events = {e["event"]: e for e in logs}
    assert set(events) == {"handler_error", "handler_error_connection_unknown"}
    assert isinstance(events["handler_error"]["exc_info"], Boom)
    assert str(events["handler_error_connection_unknown"]["exc_info"]) == "link freed"


@contain_errors
class _NotUtf8(Handler):
    def on_link_local_open(self, event: Any) -> None:
        b"\xff".decode("utf-8")  # what cproton does with a link name that is not UTF-8


def test_text_that_is_not_utf8_closes_with_a_decode_error(wire: Wire) -> None:
    event = _event_of_type(wire.collector, Event.LINK_LOCAL_OPEN)
    _call(_NotUtf8().on_link_local_open, event)
    assert wire.connection.condition.name == "amqp:decode-error"
    wire.pump()
    assert wire.peer.remote_condition.name == "amqp:decode-error"
