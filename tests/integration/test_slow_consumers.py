"""A consumer that stops reading its socket, in front of RabbitMQ.

Connected directly, RabbitMQ's writes to such a consumer's socket block and the messages it
asked for stay in the broker. Through qpid-flow the same must hold: qpid-flow stops reading
that client's upstream connection while the client does not take what it is sent, instead
of pulling the whole backlog off the broker into its own memory. The other clients carry
on, and the stalled one gets every message, in order, once it reads again.
"""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import urlsplit

import pytest
from proton import Endpoint, Message

from .harness.blocking_clients import numbered_messages, receive_messages, send_messages, unique_address
from .harness.net import free_port
from .harness.rawclient import RawClient
from .harness.router import admin_request

pytestmark = pytest.mark.integration

# Each asks for 75 MiB, then more, at once: messages smaller than the pacing's 1 MiB mark,
# and larger (a 4 MiB one is framed into Proton's output at once, all of it: its stalled
# consumer was handed all 40 before pacing saw any backlog, 518 MB resident).
SIZES = [(300, 256 * 1024), (40, 4 * 1024 * 1024)]


def delivered_to(admin: str, container: str) -> int:
    """Messages qpid-flow has sent on the consumer links of the client ``container``."""
    with urllib.request.urlopen(admin_request(admin, "/v1/connections"), timeout=10) as response:
        connections = json.loads(response.read())["connections"]
    ids = [c["id"] for c in connections if c.get("container") == container]
    with urllib.request.urlopen(admin_request(admin, "/v1/links"), timeout=10) as response:
        links = json.loads(response.read())["links"]
    return sum(link["deliveries"] for link in links if link["connection"] in ids and link["role"] == "consumer")


class _Taken:
    """The messages a hand-pumped receiver has read off its link, in arrival order."""

    def __init__(self, receiver: object, count: int) -> None:
        self.receiver = receiver
        self.count = count
        self.messages: list[Message] = []

    def __call__(self) -> bool:
        receiver = self.receiver
        while True:
            delivery = receiver.current  # type: ignore[attr-defined]
            if delivery is None or delivery.partial or not delivery.readable:
                break
            message = Message()
            message.decode(receiver.recv(delivery.pending))  # type: ignore[attr-defined]
            self.messages.append(message)
            # On to the next first: settling the current delivery advances the link too,
            # and an advance after it skipped a delivery that had already arrived.
            receiver.advance()  # type: ignore[attr-defined]
            delivery.update(delivery.ACCEPTED)
            delivery.settle()
        return len(self.messages) >= self.count


@pytest.mark.parametrize(("count", "size"), SIZES, ids=["256KiB", "4MiB"])
def test_a_consumer_that_stops_reading_leaves_its_backlog_in_the_broker(
    rabbitmq, qpid_flow_process, count: int, size: int
) -> None:
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(broker_url=rabbitmq.url, extra_args=["--admin", admin])
    address = unique_address("stalled")
    send_messages(rabbitmq.url, address, numbered_messages(count, size=size), timeout=120)

    before = router.resident_bytes()
    client = RawClient(urlsplit(router.url).port or 5672, receive_buffer=4096)
    try:
        connection = client.connection
        connection.container = "stalled-consumer"
        # qpid-flow asks the broker for the same 2 s and drops a broker it hears nothing from
        # for 4 s: a paused upstream must still hear the broker (the stall lasts 6 s).
        client.transport.idle_timeout = 2
        connection.open()
        session = connection.session()
        session.open()
        receiver = session.receiver("stalled")
        receiver.source.address = address
        receiver.open()
        receiver.flow(count)
        assert client.pump(lambda: receiver.state & Endpoint.REMOTE_ACTIVE), "the consumer was not attached"
        # From here the consumer reads nothing: qpid-flow's writes to it fill its socket.
        # Watched for 6 s. Without pacing, qpid-flow took all 300 off the broker within 2-3 s
        # and its memory grew by about 200 MB. Paced, what it sends is what the sockets'
        # buffers (about 4 MiB on loopback) and its 1 MiB mark hold: 39 messages seen.
        peak = before
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            peak = max(peak, router.resident_bytes())
            time.sleep(0.2)
        sent = delivered_to(admin, "stalled-consumer")
        assert sent < count // 3, f"qpid-flow sent {sent} of {count} messages to a consumer that reads nothing"
        # The allocator keeps some of what passed through (30-40 MiB seen): not the backlog.
        assert peak - before < 100 * 2**20, f"qpid-flow grew by {(peak - before) / 2**20:.0f} MiB"

        # A bystander through the same qpid-flow is not held up.
        other = unique_address("bystander")
        send_messages(router.url, other, numbered_messages(3), timeout=30)
        assert [m.body["seq"] for m in receive_messages(router.url, other, 3, timeout=30)] == [0, 1, 2]

        # Reading again, the consumer gets every message it asked for, in order.
        taken = _Taken(receiver, count)
        assert client.pump(taken, timeout=120), f"only {len(taken.messages)} of {count} arrived"
        assert [m.body["seq"] for m in taken.messages] == list(range(count))
    finally:
        client.close()


def test_a_link_gone_with_messages_unsent_holds_up_no_other_link_of_its_connection(rabbitmq, qpid_flow_process) -> None:
    """A consumer link whose session's window closed (its client stopped reading that
    session) leaves with messages handed to it that were never framed. Proton keeps their
    bytes in the session's outgoing count for good, and pacing read them as the client's
    backlog: the client's other links got nothing more (70 s seen), where directly they get
    theirs at once."""
    router = qpid_flow_process(broker_url=rabbitmq.url)
    stuck, other = unique_address("stuck"), unique_address("other")
    send_messages(rabbitmq.url, stuck, numbered_messages(12, size=256 * 1024), timeout=60)
    client = RawClient(urlsplit(router.url).port or 5672)
    try:
        client.transport.max_frame_size = 16384
        connection = client.connection
        connection.open()
        session_a = connection.session()
        session_a.incoming_capacity = 65536  # nothing read from it: its window closes
        session_a.open()
        a = session_a.receiver("stuck")
        a.source.address = stuck
        a.open()
        a.flow(10)
        session_b = connection.session()
        session_b.open()
        b = session_b.receiver("other")
        b.source.address = other
        b.open()
        b.flow(10)
        client.pump(lambda: False, timeout=3)
        a.close()
        client.pump(lambda: False, timeout=1)
        send_messages(rabbitmq.url, other, numbered_messages(3), timeout=30)
        taken = _Taken(b, 3)
        assert client.pump(taken, timeout=15), f"{len(taken.messages)} of 3 reached the client's other link"
    finally:
        client.close()
