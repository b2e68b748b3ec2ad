"""qpid-flow's own reader of grouped destinations against brokers that misbehave: one that
closes every connection as soon as it is open, RabbitMQ ending the reader's session, and
RabbitMQ closing the reader's connection of one grouped queue when that queue is deleted."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

from .clients import unique
from .harness.broker import Broker
from .harness.net import free_port, wait_for_port
from .harness.router import StartRouter
from .harness.scenario import ctl

pytestmark = pytest.mark.integration

# A broker at its connection limit: it answers every open, then closes the connection at
# once with amqp:resource-limit-exceeded. A process of its own, so the test can end it.
AT_CONNECTION_LIMIT = """
import sys
from proton import Condition, Handler
from proton.reactor import Container

class AtLimit(Handler):
    def on_connection_bound(self, event):
        event.transport.sasl().allowed_mechs("ANONYMOUS")

    def on_connection_remote_open(self, event):
        event.connection.open()
        event.connection.condition = Condition("amqp:resource-limit-exceeded", "connection limit reached")
        event.connection.close()

container = Container(AtLimit())
container.listen(f"127.0.0.1:{sys.argv[1]}")
container.run()
"""


def grouped_config(address: str, extra: str = "") -> str:
    return f'{extra}[destinations."{address}"]\nshared_groups = true\nmax_count = 0\nmax_size = 0\n'


def events(log_text: str, name: str) -> list[dict[str, object]]:
    found = []
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == name:
                found.append(record)
    return found


@pytest.fixture
def broker_at_connection_limit() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", AT_CONNECTION_LIMIT, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        assert wait_for_port("127.0.0.1", port, 15, alive=lambda: process.poll() is None), process.stderr
        yield f"amqp://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(10)


def test_the_reader_backs_off_from_a_broker_that_closes_each_connection_at_once(
    broker_at_connection_limit: str, qpid_flow_process: StartRouter
) -> None:
    """Every connection got its open, and that reset the back-off: the reader reconnected
    about ten times a second, for good (97 connections in 10 s). Now a connection closed at
    once is a failed attempt, and the delay doubles up to reconnect_max_delay."""
    address = unique("grouped-at-limit")
    router = qpid_flow_process(
        broker_url=broker_at_connection_limit,
        config_text=grouped_config(address, extra='reconnect_max_delay = "2s"\n'),
        extra_args=["--disable-plugin", "rabbitmq_depth"],
    )
    time.sleep(6)  # 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 2 s of back-off: about 7 connections
    log = router.log_text()
    assert len(events(log, "upstream_closed_by_broker")) >= 3, router.log_tail()  # the broker did answer
    attempts = events(log, "upstream_connecting")
    assert len(attempts) <= 10, f"{len(attempts)} connections in 6 s"
    assert max(float(str(attempt["attempt_delay"])) for attempt in attempts) == 2.0


def receive_all(receiver: BlockingReceiver, quiet: float) -> list[str]:
    """Bodies received until none comes for ``quiet`` seconds, each accepted."""
    bodies = []
    with contextlib.suppress(Timeout):
        while True:
            bodies.append(str(receiver.receive(timeout=quiet).body))
            receiver.accept()
    return bodies


def settle_undeliverable_here(receiver: BlockingReceiver) -> None:
    """Settle the oldest unsettled delivery of ``receiver`` modified, undeliverable-here and
    not failed: RabbitMQ 3.10 cannot map that outcome and ends the session it came on with
    amqp:invalid-field (through qpid-flow: its reader's session)."""
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.local.undeliverable = True
    delivery.update(Delivery.MODIFIED)
    delivery.settle()


def test_after_the_broker_ends_the_reader_s_session_a_new_consumer_gets_each_message_once(
    rabbitmq: Broker, qpid_flow_process: StartRouter
) -> None:
    """RabbitMQ ended the session of qpid-flow's reader (an outcome it cannot map): the
    consumer was detached, but what the reader had fetched stayed in qpid-flow, and a later
    consumer got those stale copies (their accepts went to the dead link) and then every
    message again from the broker. Now they are forgotten with the reader's session: the
    later consumer gets each message once, and its accepts reach the broker."""
    address = unique("grouped-session-ended")
    # The plain dialect relays a modified outcome as it is, which RabbitMQ cannot map: the
    # way to make it end the reader's session (with its own dialect, qpid-flow sends it as
    # rejected; see the test below).
    router = qpid_flow_process(
        broker_url=rabbitmq.url,
        config_text=grouped_config(address, extra='broker_dialect = "plain"\n'),
        extra_args=["--disable-plugin", "rabbitmq_depth"],
    )
    bodies = [f"m{n}" for n in range(4)]
    direct = BlockingConnection(rabbitmq.url, timeout=15)
    first = BlockingConnection(router.url, timeout=15)
    later = BlockingConnection(router.url, timeout=15)
    try:
        sender = direct.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, group_id="A"))
        holder = first.create_receiver(address, credit=1)
        assert holder.receive(timeout=15).body == "m0"  # the others fetched, waiting for group A's owner
        settle_undeliverable_here(holder)
        with pytest.raises(LinkDetached) as detached:
            first.wait(lambda: False, timeout=15)
        assert "amqp:invalid-field" in str(detached.value)

        receiver = later.create_receiver(address, credit=20)
        assert receive_all(receiver, quiet=3) == bodies
    finally:
        for connection in (first, later, direct):
            with contextlib.suppress(Exception):
                connection.close()
    # qpid-flow gone, whatever its reader held unsettled is ready again: nothing, if the
    # accepts reached the broker.
    router.stop()
    assert rabbitmq.queue_depth(address) == 0, "the accepts did not reach the broker"


def test_a_grouped_consumer_s_modified_outcome_ends_no_one_s_session(
    rabbitmq: Broker, qpid_flow_process: StartRouter
) -> None:
    """A consumer of a grouped destination settles a message modified, undeliverable-here
    (qpid-jms sends modified outcomes on recover and rollback). RabbitMQ 3.10 cannot map
    modified: sent as it was on the reader's session, which every consumer of the
    destination shares, it ended that session and detached them all with
    amqp:invalid-field. It now reaches RabbitMQ as rejected: the message leaves the queue,
    as it leaves qpid-flow, and neither the consumer nor a bystander is detached."""
    address = unique("grouped-modified")
    router = qpid_flow_process(
        broker_url=rabbitmq.url,
        config_text=grouped_config(address),
        extra_args=["--disable-plugin", "rabbitmq_depth"],
    )
    direct = BlockingConnection(rabbitmq.url, timeout=15)
    first = BlockingConnection(router.url, timeout=15)
    other = BlockingConnection(router.url, timeout=15)
    try:
        sender = direct.create_sender(address)
        sender.send(Message(body="a0", group_id="A"))
        sender.send(Message(body="b0", group_id="B"))
        holder = first.create_receiver(address, credit=1)
        assert holder.receive(timeout=15).body == "a0"
        other.create_receiver(address, credit=0)  # a bystander: attached, taking nothing
        settle_undeliverable_here(holder)
        for connection in (first, other):
            with pytest.raises(Timeout):
                connection.wait(lambda: False, timeout=2)  # no detach comes
        assert holder.receive(timeout=15).body == "b0"
        holder.accept()
    finally:
        for connection in (first, other, direct):
            with contextlib.suppress(Exception):
                connection.close()
    router.stop()
    assert rabbitmq.queue_depth(address) == 0, "a0 was not taken out of the queue"


def test_deleting_one_grouped_queue_leaves_the_consumers_of_another_attached(
    rabbitmq: Broker, qpid_flow_process: StartRouter
) -> None:
    """RabbitMQ closes the connection that reads a queue when the queue is deleted. Every
    grouped destination was read on one connection of qpid-flow's, so deleting one grouped
    queue detached the consumers of all of them (amqp:link:detach-forced), which a client
    connected to RabbitMQ directly never sees for a queue it does not read. Each grouped
    destination is now read on a connection of its own."""
    deleted, kept = unique("grouped-deleted"), unique("grouped-kept")
    router = qpid_flow_process(
        broker_url=rabbitmq.url,
        config_text=grouped_config(deleted) + grouped_config(kept),
        extra_args=["--disable-plugin", "rabbitmq_depth"],
    )
    direct = BlockingConnection(rabbitmq.url, timeout=15)
    doomed = BlockingConnection(router.url, timeout=15)
    bystander = BlockingConnection(router.url, timeout=15)
    try:
        for address in (deleted, kept):
            sender = direct.create_sender(address)
            for n in range(2):
                sender.send(Message(body=f"{address}-{n}", group_id="A"))
        doomed.create_receiver(deleted, credit=1).receive(timeout=15)  # held, unsettled
        reader = bystander.create_receiver(kept, credit=1)
        assert reader.receive(timeout=15).body == f"{kept}-0"  # held, unsettled

        ctl(rabbitmq, "delete_queue", deleted)
        with pytest.raises(Timeout):
            bystander.wait(lambda: False, timeout=3)  # no detach comes
        reader.accept()
        assert reader.receive(timeout=15).body == f"{kept}-1"
        reader.accept()
    finally:
        for connection in (doomed, bystander, direct):
            with contextlib.suppress(Exception):
                connection.close()
    router.stop()
    assert rabbitmq.queue_depth(kept) == 0, "the bystander's accepts did not reach the broker"
