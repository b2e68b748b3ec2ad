"""Bad input from a client (docs/behaviour.md, "Bad input"), standalone and in front of a
broker: frames out of place or of the wrong role, fields AMQP does not allow, frames Proton
cannot dispatch. Each closes that client's connection with the condition AMQP names, the
close frame going out, logged once; nothing fails qpid-flow's own handlers.

Frames no client library sends are written by hand (``tests.integration.harness.frames``)
and pushed into qpid-flow's end of the connection; everything else is played through the
rigs of ``test_router`` and ``test_linkroute``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import structlog
from proton import UNDESCRIBED, Array, Data, Delivery, Endpoint, symbol, uint, ulong

from qpid_flow.amqp.reactor import BatchingIOHandler
from tests.integration.harness.frames import AMQP_HEADER, begin_frame, frame, open_frame, sender_attach
from tests.unit import test_linkroute as broker_rig
from tests.unit.proton_pairs import End
from tests.unit.test_router import Rig, assert_still_works, order

ILLEGAL_STATE = "amqp:illegal-state"
FRAMING_ERROR = "amqp:connection:framing-error"
INVALID_FIELD = "amqp:invalid-field"


def transfer(handle: int, delivery_id: int, payload: bytes, channel: int = 0) -> bytes:
    """A transfer frame, as a sender writes it."""
    return frame(0x14, [uint(handle), uint(delivery_id), b"t%d" % delivery_id, uint(0), False, False], channel, payload)


def warnings(logs: Iterable[Mapping[str, Any]]) -> list[str]:
    return [entry["event"] for entry in logs if entry["log_level"] in ("warning", "error")]


def closes(end: End) -> list[str]:
    """The close frames ``end`` wrote (its trace; what it wrote is traced as it is read)."""
    end.transport.peek(max(end.transport.pending(), 0))
    return [line for line in end.frames if " -> @close(" in line]


# --- transfers on a link where qpid-flow is the sender ---------------------------------------------


@pytest.mark.parametrize("credit", [0, 10], ids=["no-credit", "credit"])
def test_transfers_on_the_clients_receiving_link_close_its_connection_with_illegal_state(credit: int) -> None:
    """Only a link's sender sends transfers (AMQP 1.0 2.7.5). The client's transfers on its
    own receiver link were kept unsettled, with no limit and no error (100,000 of 1 KB: 150
    MiB). The connection is closed with amqp:illegal-state, once, and no more is read; the
    client's bytes never come back to it as a transfer of qpid-flow's (which settling them
    would have made Proton send, the link having credit); another client carries on."""
    rig = Rig()
    client = rig.connect()
    other = rig.connect("other")
    receiver = client.attach_receiver("orders", credit=credit)
    client.commands()
    with structlog.testing.capture_logs() as logs:
        client.facing.transport.push(b"".join(transfer(0, n, order(n).encode()) for n in range(3)))
        rig.pump()
    condition = client.connection.remote_condition
    assert condition is not None and condition.name == ILLEGAL_STATE
    assert "orders-reader" in condition.description
    assert warnings(logs) == ["connection_error"]
    assert [f.kind for f in client.commands()] == ["close"]  # no transfer: nothing of the client's echoed
    assert receiver.queued == 0
    assert client.facing.transport.capacity() < 0, "qpid-flow still reads the connection it closed"
    assert rig.destination("orders").consumers == []
    assert_still_works(rig, other)


def test_an_outcome_for_a_delivery_qpid_flow_forgot_is_dropped_not_taken_for_a_transfer() -> None:
    """The other delivery event on a link qpid-flow sends on for no delivery it holds: the
    client settles a message after detaching its receiver (qpid-flow forgot the delivery
    at the detach, and gave the message to the next consumer). Dropped: no error, the
    connection stays open."""
    rig = Rig()
    client = rig.connect()
    sender = client.attach_sender("orders")
    client.send(sender, order(1))
    receiver = client.attach_receiver("orders", credit=1)
    (got,) = client.take(receiver)
    receiver.detach()
    rig.pump()
    seen = len(client.facing.received("disposition"))
    with structlog.testing.capture_logs() as logs:
        client.accept(got)
    assert len(client.facing.received("disposition")) == seen + 1  # it reached qpid-flow
    assert warnings(logs) == []
    assert client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
    again = client.attach_receiver("orders", credit=1, name="orders-reader-2")
    assert [g.body for g in client.take(again)] == [1]  # released at the detach, as before
    assert_still_works(rig, client)


def consumer_in_front_of_a_broker(credit: int) -> tuple[Any, Any, Any, Any]:
    """A client's receiver mirrored to the broker, given ``credit``: the rig, the pair, the
    client's receiver and the broker's end of its link."""
    rig = broker_rig.Rig()
    pair = broker_rig.open_pair(rig)
    session, _ = broker_rig.begin(rig, pair)
    receiver, at_broker = broker_rig.consumer(rig, pair, session)
    receiver.flow(credit)
    rig.pump()
    return rig, pair, receiver, at_broker


def test_transfers_on_the_clients_receiving_link_close_its_connection_in_front_of_a_broker() -> None:
    """The same in front of a broker: the client's connection is closed with
    amqp:illegal-state and its broker connection with it; nothing reached the broker."""
    rig, pair, receiver, at_broker = consumer_in_front_of_a_broker(credit=5)
    with structlog.testing.capture_logs() as logs:
        pair.facing.transport.push(transfer(0, 0, broker_rig.encoded(1)))
        rig.pump()
    condition = pair.client.connection.remote_condition
    assert condition is not None and condition.name == ILLEGAL_STATE
    assert warnings(logs) == ["connection_error"]
    assert pair.broker.connection.state & Endpoint.REMOTE_CLOSED
    assert at_broker.unsettled == 0 and receiver.queued == 0


def test_an_outcome_for_a_delivery_forgotten_in_front_of_a_broker_is_dropped() -> None:
    """In front of a broker too: the client detaches its receiver, then settles what it
    had; the connection stays open."""
    rig, pair, receiver, at_broker = consumer_in_front_of_a_broker(credit=1)
    broker_rig.send(at_broker, broker_rig.encoded(1), "b1")
    rig.pump()
    delivery, _ = broker_rig.receive(receiver)
    receiver.detach()
    rig.pump()
    seen = len(pair.facing.received("disposition"))
    with structlog.testing.capture_logs() as logs:
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        rig.pump()
    assert len(pair.facing.received("disposition")) == seen + 1
    assert warnings(logs) == []
    assert pair.client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


# --- frames before the open ---------------------------------------------------------------------


def test_a_begin_and_attach_before_the_open_close_the_connection_with_framing_error() -> None:
    """The open must be the first frame (AMQP 1.0 2.4.1). A begin and an attach without one
    were answered as if it had come, the attach failed qpid-flow's handler (its open was
    taken for granted: handler_error), and the socket was dropped 10 s later without a
    close. Now: open, then close with amqp:connection:framing-error, logged once."""
    rig = Rig()
    good = rig.connect("good")
    raw = End(server=True, collector=rig.collector)
    rig.router.client_opened(raw.connection, "anonymous", ("127.0.0.1", 1))
    with structlog.testing.capture_logs() as logs:
        raw.transport.push(AMQP_HEADER + begin_frame() + sender_attach("early", 0, "orders"))
        rig.pump()
    (close,) = closes(raw)
    assert f'condition=:"{FRAMING_ERROR}"' in close and "begin before open" in close
    assert not [line for line in raw.frames if " -> @begin(" in line or " -> @attach(" in line]
    assert warnings(logs) == ["connection_error"]
    assert raw.transport.capacity() < 0
    assert rig.destinations.find("orders") is None  # the attach went no further
    assert_still_works(rig, good)


def test_a_begin_before_the_open_closes_the_connection_in_front_of_a_broker() -> None:
    rig = broker_rig.Rig()
    pair = rig.connect()
    rig.pump()  # the protocol headers only
    with structlog.testing.capture_logs() as logs:
        pair.facing.transport.push(begin_frame() + sender_attach("early", 0, "orders"))
        rig.pump()
    condition = pair.client.connection.remote_condition
    assert condition is not None and condition.name == FRAMING_ERROR
    assert warnings(logs) == ["connection_error"]
    assert pair.upstream.connection.state & Endpoint.LOCAL_CLOSED
    assert pair.broker.connection.session_head(0) is None  # nothing of it went upstream


# --- capabilities that are not symbols ----------------------------------------------------------

OFFERED, DESIRED = 7, 8  # the open's fields


def raw_open(field: int, value: Any) -> bytes:
    fields: list[Any] = ["caps", None, None, None, None, None, None, None, None]
    fields[field] = value
    return frame(0x10, fields)


@pytest.mark.parametrize(
    "value",
    [ulong(7), [1, 2], {symbol("a"): 1}, Array(UNDESCRIBED, Data.STRING, "not-a-symbol")],
    ids=["ulong", "list-of-ints", "map", "array-of-strings"],
)
@pytest.mark.parametrize("field", [OFFERED, DESIRED], ids=["offered", "desired"])
def test_capabilities_that_are_not_symbols_are_refused_with_invalid_field(field: int, value: Any) -> None:
    """An open whose desired-capabilities was a ulong failed qpid-flow's handler (TypeError:
    'ulong' object is not iterable) and got amqp:internal-error. It is the client's error:
    amqp:invalid-field, naming the field, as a refused open."""
    rig = Rig()
    good = rig.connect("good")
    raw = End(server=True, collector=rig.collector)
    rig.router.client_opened(raw.connection, "anonymous", ("127.0.0.1", 1))
    with structlog.testing.capture_logs() as logs:
        raw.transport.push(AMQP_HEADER + raw_open(field, value))
        rig.pump()
    (close,) = closes(raw)
    name = "offered-capabilities" if field == OFFERED else "desired-capabilities"
    assert f'condition=:"{INVALID_FIELD}"' in close and f"info={{:invalid-field=:{name}}}" in close
    assert warnings(logs) == ["connection_error"]
    assert raw.connection not in rig.router.connections
    assert_still_works(rig, good)


@pytest.mark.parametrize(
    "value",
    [
        symbol("sole-connection-for-container"),
        [symbol("sole-connection-for-container")],
        Array(UNDESCRIBED, Data.SYMBOL, symbol("sole-connection-for-container"), symbol("other")),
    ],
    ids=["symbol", "list", "array"],
)
def test_capabilities_as_amqp_types_them_are_taken(value: Any) -> None:
    """A symbol, or an array (or list) of symbols: the connection opens, and the
    sole-connection capability is read from any of them (a second connection of the same
    container id is refused)."""
    rig = Rig()
    first, second = (End(server=True, collector=rig.collector) for _ in range(2))
    for end in (first, second):
        rig.router.client_opened(end.connection, "anonymous", ("127.0.0.1", 1))
        end.transport.push(AMQP_HEADER + raw_open(DESIRED, value))
        rig.pump()
    assert first.connection in rig.router.connections
    (close,) = closes(second)
    assert "info={:invalid-field=:container-id}" in close


def test_capabilities_that_are_not_symbols_are_refused_in_front_of_a_broker() -> None:
    """In front of a broker the client's capabilities go upstream, and a ulong failed the
    handler the same way. Refused as standalone; nothing but a close reaches the broker."""
    rig = broker_rig.Rig()
    pair = rig.connect()
    rig.pump()
    with structlog.testing.capture_logs() as logs:
        pair.facing.transport.push(raw_open(DESIRED, ulong(7)))
        rig.pump()
    condition = pair.client.connection.remote_condition
    assert condition is not None and condition.name == INVALID_FIELD
    assert condition.info == {symbol("invalid-field"): symbol("desired-capabilities")}
    assert warnings(logs) == ["connection_error"]
    assert pair.upstream.connection.state & Endpoint.LOCAL_CLOSED


def test_a_brokers_capabilities_that_are_not_symbols_are_dropped() -> None:
    """The broker's open is relayed to the client: capabilities it gave that are not
    symbols are left out (they failed the handler: amqp:internal-error for the client)."""
    rig = broker_rig.Rig()
    pair = rig.connect()
    pair.client.connection.open()
    rig.pump()
    pair.upstream.transport.push(raw_open(OFFERED, ulong(7)))
    with structlog.testing.capture_logs() as logs:
        rig.pump()
    assert warnings(logs) == []
    client = pair.client.connection
    assert client.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
    assert client.remote_offered_capabilities == ["ANONYMOUS-RELAY"]


# --- frames Proton cannot dispatch --------------------------------------------------------------


def stopped_reading(data: bytes) -> End:
    """qpid-flow's end of a connection, opened both ways, after ``data`` from the peer."""
    end = End(server=True)
    end.transport.push(AMQP_HEADER + open_frame())
    end.connection.open()
    end.transport.pop(end.transport.pending())
    end.transport.push(data)
    assert (end.transport.capacity(), end.transport.pending()) == (-1, 0)  # Proton reads no more
    return end


class Selectable:
    """What BatchingIOHandler.update touches of a connection's selectable."""

    def __init__(self) -> None:
        self.reading = self.writing = False
        self._deadline = 0.0
        self.deadline = 0.0
        self.updated = 0

    def update(self) -> None:
        self.updated += 1


@pytest.mark.parametrize(
    "data",
    [frame(0x99, [1, 2]), frame(0x41, [symbol("ANONYMOUS")], frame_type=1), frame(0x40, [[symbol("PLAIN")]])],
    ids=["unknown-descriptor", "sasl-init-after-open", "sasl-mechanisms-after-open"],
)
def test_a_frame_proton_cannot_dispatch_closes_the_connection_with_framing_error(data: bytes) -> None:
    """After the open, a performative of unknown descriptor or a SASL frame: Proton stops
    reading without an error of its own, and qpid-flow's I/O handler dropped the connection
    with a bare TCP close (logged as an ordinary connection_closed). Now the close frame goes
    first, amqp:connection:framing-error, logged connection_error; then the end."""
    end = stopped_reading(data)
    end.connection.qf_remote = "127.0.0.1:1"  # a client's, as the gate hands it over
    io = BatchingIOHandler()
    selectable = Selectable()
    with structlog.testing.capture_logs() as logs:
        io.update(end.transport, selectable, 0.0)
    assert warnings(logs) == ["connection_error"]
    (close,) = closes(end)
    assert f'condition=:"{FRAMING_ERROR}"' in close
    assert end.transport._impl in io._dirty  # written in this turn, then the end
    end.transport.pop(end.transport.pending())
    io.update(end.transport, selectable, 0.0)
    assert end.transport.closed


def test_qpid_flows_own_broker_connection_that_stops_being_read_just_ends() -> None:
    """qpid-flow's own connections to the broker (no client address) end as before: their
    end is handled as the broker's loss, not told to the broker as a framing error."""
    end = stopped_reading(frame(0x99, [1, 2]))
    io = BatchingIOHandler()
    with structlog.testing.capture_logs() as logs:
        io.update(end.transport, Selectable(), 0.0)
    assert warnings(logs) == []
    assert closes(end) == []
    assert end.transport.pending() < 0  # its head closed: the end
