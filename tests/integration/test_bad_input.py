"""Bad input from a client, on a real qpid-flow (docs/behaviour.md, "Bad input"): frames
written by hand that no client library sends. Each closes that client's connection with a
close frame carrying the condition AMQP names, after which qpid-flow reads no more from it;
other clients carry on. The unit tests (tests/unit/test_bad_input.py) cover the handlers;
these, the reactor's part: the close frame going out and the socket's end.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import pytest
from proton import Described, ubyte, uint, ulong

from .harness.blocking_clients import numbered_messages, receive_messages, send_messages, unique_address
from .harness.frames import FrameSocket, begin_frame, frame, open_frame, sender_attach, transfer_frame
from .harness.router import RouterProcess, StartRouter

pytestmark = pytest.mark.integration

Start = Callable[..., RouterProcess]


@pytest.fixture(params=["standalone", "broker"])
def start(request: pytest.FixtureRequest, qpid_flow_process: StartRouter) -> Start:
    """Starts a qpid-flow, standalone or in front of the session's RabbitMQ."""
    broker_url = request.getfixturevalue("rabbitmq").url if request.param == "broker" else None
    return lambda config_text=None: qpid_flow_process(broker_url=broker_url, config_text=config_text)


def receiver_attach(name: str, handle: int, address: str) -> bytes:
    source = Described(ulong(0x28), [address])
    target = Described(ulong(0x29), [None])
    return frame(0x12, [name, uint(handle), True, ubyte(0), ubyte(0), source, target, None, None])


def flow(handle: int, credit: int) -> bytes:
    return frame(0x13, [uint(0), uint(2048), uint(0), uint(2048), uint(handle), uint(0), uint(credit)])


def opened(router: RouterProcess) -> FrameSocket:
    peer = FrameSocket(router.port)
    peer.send(open_frame(), begin_frame(window=2**31 - 1))
    assert peer.read_until(lambda: bool(peer.named("begin")), timeout=15), peer.received
    return peer


def closed_with(peer: FrameSocket, timeout: float = 10) -> str | None:
    """The condition of qpid-flow's close, once qpid-flow has ended the socket too (with a
    reset when bytes the client sent were left unread: the frames before it count)."""
    try:
        peer.read_until(lambda: peer.closed_by_peer, timeout=timeout)
    except ConnectionResetError:
        peer.closed_by_peer = True
    assert peer.closed_by_peer, f"qpid-flow did not end the socket: {peer.received}"
    closes = peer.named("close")
    assert closes, f"the socket ended without a close frame: {peer.received}"
    return closes[0].condition()


def warnings_logged(router: RouterProcess) -> list[tuple[str, str | None]]:
    events = [json.loads(line) for line in router.log_text().splitlines() if line.startswith("{")]
    return [(e["event"], e.get("condition")) for e in events if e.get("level") in ("warning", "error")]


def still_works(router: RouterProcess) -> None:
    address = unique_address("bystander")
    send_messages(router.url, address, numbered_messages(1), timeout=15)
    assert len(receive_messages(router.url, address, 1, timeout=15)) == 1


@pytest.mark.parametrize("data", [frame(0x99, [1, 2]), frame(0x41, [], frame_type=1)], ids=["0x99", "sasl-init"])
def test_a_frame_qpid_flow_cannot_dispatch_gets_a_close_before_the_end(start: Start, data: bytes) -> None:
    """A performative of unknown descriptor, or a SASL frame after the open: the connection
    ended with a bare TCP close, logged as an ordinary connection_closed."""
    router = start()
    peer = opened(router)
    peer.send(data)
    assert closed_with(peer) == "amqp:connection:framing-error"
    peer.close()
    assert ("connection_error", "amqp:connection:framing-error") in warnings_logged(router)
    still_works(router)


def test_transfers_on_the_clients_receiving_link_close_the_connection_and_stay_out_of_memory(start: Start) -> None:
    """A client's transfers on its own receiver link (qpid-flow is the sender there) were kept
    unsettled, without limit or error: 100,000 of 1 KB took qpid-flow from 41 to 191 MiB.
    The first one closes the connection with amqp:illegal-state; what follows is not read."""
    router = start()
    address = unique_address("wrong-role")
    peer = opened(router)
    peer.send(receiver_attach("reader", 0, address), flow(0, 10))
    assert peer.read_until(lambda: bool(peer.named("attach")), timeout=15), peer.received
    before = router.resident_bytes()
    body = b"x" * 1000
    with contextlib.suppress(OSError):  # qpid-flow ends the socket: what matters is below
        for start_id in range(0, 100_000, 1000):
            peer.send(*(transfer_frame(0, n, body) for n in range(start_id, start_id + 1000)))
    assert closed_with(peer) == "amqp:illegal-state"
    peer.close()
    assert not peer.named("transfer"), "the client's bytes came back to it"
    assert router.resident_bytes() - before < 32 * 2**20
    assert [w for w in warnings_logged(router) if w[0] != "connection_closed"] == [
        ("connection_error", "amqp:illegal-state")
    ]
    still_works(router)


def test_a_begin_and_attach_before_the_open_get_a_framing_error_close(start: Start) -> None:
    """They were answered as if the open had come; the attach failed qpid-flow's handler,
    and the socket was dropped 10 s later (the open deadline) without a close."""
    router = start()
    peer = FrameSocket(router.port)
    peer.send(begin_frame(), sender_attach("early", 0, unique_address("no-open")))
    assert closed_with(peer, timeout=5) == "amqp:connection:framing-error"
    peer.close()
    assert not peer.named("begin") and not peer.named("attach")
    assert ("handler_error", None) not in warnings_logged(router)
    still_works(router)


def test_a_client_leaving_refused_sessions_unended_is_closed_at_once(qpid_flow_process: StartRouter) -> None:
    """max_sessions_per_connection = 10 and 10,000 begins never ended: answering them took
    172 s, and every other client waited as long. Now the connection is closed with
    amqp:resource-limit-exceeded at the 11th refusal, and a bystander is not held up."""
    router = qpid_flow_process(config_text="max_sessions_per_connection = 10\n")
    peer = opened(router)
    with contextlib.suppress(OSError):
        peer.send(*(frame(0x11, [None, uint(0), uint(2048), uint(2048)], channel=n) for n in range(1, 10_001)))
    assert closed_with(peer, timeout=15) == "amqp:resource-limit-exceeded"
    assert len(peer.named("end")) == 10  # the refusals before the close
    peer.close()
    still_works(router)
