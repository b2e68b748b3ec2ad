"""In front of RabbitMQ, frames no client library sends (hand-written): a transfer sent
before qpid-flow gave the link any credit, and a transaction control message that never
ends. Each must end that link only, the way a producer beyond its credit or over the size
limit ends, and must neither reach the broker nor be held in qpid-flow's memory.
"""

from __future__ import annotations

import time

import pytest
from proton import Described, symbol, ubyte, uint, ulong

from .harness.blocking_clients import numbered_messages, receive_messages, send_messages, unique_address
from .harness.frames import FrameSocket, begin_frame, frame, open_frame, sender_attach, transfer_frame

pytestmark = pytest.mark.integration


def test_transfers_sent_with_the_attach_end_the_link_and_never_reach_the_broker(rabbitmq, qpid_flow_process) -> None:
    """Until the broker answers a producer's attach, qpid-flow has given it no credit. Sent
    in the same write as the attach, its transfers were relayed as they came: past an
    operator's `producers stop`, flow control, the size limit and the plugins, with no
    outcome for the client."""
    address = unique_address("pipelined")
    router = qpid_flow_process(broker_url=rabbitmq.url)
    peer = FrameSocket(router.port)
    peer.send(open_frame(), begin_frame())
    assert peer.read_until(lambda: bool(peer.named("begin")), timeout=15)  # the broker's, relayed
    transfers = [transfer_frame(0, n, n) for n in range(5)]
    peer.send(sender_attach("eager", 0, address), *transfers)  # in one write
    assert peer.read_until(lambda: bool(peer.named("detach")), timeout=15), peer.received
    assert peer.named("detach")[0].condition() == "amqp:link:transfer-limit-exceeded"
    assert not peer.named("close")  # the link only
    peer.close()
    # None of the five reached the broker: a well-behaved client's one message is all there is.
    send_messages(router.url, address, numbered_messages(1), timeout=15)
    assert rabbitmq.queue_depth(address) == 1


def test_a_control_message_that_never_ends_ends_its_link_not_the_memory(rabbitmq, qpid_flow_process) -> None:
    """A coordinator link's transfer was held whole until it ended, with no limit: one
    client streamed 1 GB into qpid-flow's memory in 4 s. A control message is a few dozen
    bytes; past 64 KiB the link ends with amqp:link:message-size-exceeded."""
    router = qpid_flow_process(broker_url=rabbitmq.url)
    peer = FrameSocket(router.port)
    peer.send(open_frame(), begin_frame(window=2**31 - 1))
    assert peer.read_until(lambda: bool(peer.named("begin")), timeout=15)
    source = Described(ulong(0x28), [None])
    coordinator = Described(ulong(0x30), [[symbol("amqp:local-transactions")]])
    peer.send(frame(0x12, ["controller", uint(0), False, ubyte(0), ubyte(0), source, coordinator, None, None, uint(0)]))
    before = router.resident_bytes()
    piece = b"x" * 30_000
    start = b"\x00\x53\x75\xb0" + (30_000).to_bytes(4, "big") + piece  # a data section, never finished
    try:
        for n in range(3_500):  # 100 MiB, more=true throughout
            peer.send(frame(0x14, [uint(0), uint(0), b"t", uint(0), False, True], payload=start if n == 0 else piece))
    except OSError:
        pass  # qpid-flow may stop reading once it has ended the link: what matters is below
    peer.read_until(lambda: bool(peer.named("detach")), timeout=10)
    # The link ends (message-size-exceeded); RabbitMQ 3.10, which has no transactions, may
    # end the session first (not-implemented). Either way nothing more is kept: before, the
    # transfer was kept whole after both.
    ended = [(p.name, p.condition()) for p in peer.received if p.name in ("detach", "end")]
    assert ended and ended[0] in (("detach", "amqp:link:message-size-exceeded"), ("end", "amqp:not-implemented"))
    time.sleep(0.5)
    grown = router.resident_bytes() - before
    assert grown < 50 * 2**20, f"qpid-flow grew by {grown >> 20} MiB for 100 MiB of one unfinished control message"
    peer.close()
    # Other clients carry on.
    other = unique_address("after-the-controller")
    send_messages(router.url, other, numbered_messages(1), timeout=15)
    assert [m.body["seq"] for m in receive_messages(router.url, other, 1, timeout=15)] == [0]


def test_a_session_begun_and_ended_in_one_write_is_answered_and_the_connection_carries_on(
    rabbitmq, qpid_flow_process
) -> None:
    """A client begins and ends a session in one write. RabbitMQ answers begin, then end.
    qpid-flow ended the upstream session before the broker's begin came back: Proton had
    freed the channel, took the answer for an unknown channel ("begin reply to unknown
    channel 0") and dropped the connection, the client's other sessions with it."""
    router = qpid_flow_process(broker_url=rabbitmq.url)
    peer = FrameSocket(router.port)
    peer.send(open_frame())
    assert peer.read_until(lambda: bool(peer.named("open")), timeout=15)
    peer.send(begin_frame(), frame(0x17, []))  # begin and end on channel 0, in one write
    assert peer.read_until(lambda: bool(peer.named("end")), timeout=15), peer.received
    assert [p.name for p in peer.received if p.name in ("begin", "end")] == ["begin", "end"]
    peer.send(frame(0x11, [None, uint(0), uint(2048), uint(2048)], channel=1))
    assert peer.read_until(lambda: len(peer.named("begin")) == 2, timeout=15), peer.received
    assert not peer.named("close") and not peer.closed_by_peer
    peer.close()
