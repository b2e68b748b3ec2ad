"""The real depth reader against a real RabbitMQ, started by qpid-flow's test harness.

Needs the qpid-flow source tree (for ``tests/integration/harness``) and rabbitmq-server
(``bash .ci/install-deps``). A missing broker is an error, as in qpid-flow's own suite.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pika
import pytest
from qpid_flow.config import RouterConfig

from qpid_flow_rabbitmq_depth import PikaDepthReader, RabbitMQDepth, parse_settings

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[3]
# These tests live in qpid-flow's source tree and use its broker harness: run them there.
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from tests.integration.harness.broker import Broker, BrokerError  # noqa: E402
from tests.integration.harness.rabbitmq import make_broker  # noqa: E402

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination as RouterDestination
    from qpid_flow.plugin.control import RouterControl


def as_control(fake: object) -> RouterControl:
    """A test stand-in, passed where the plugin takes the router's control."""
    return cast("RouterControl", fake)


def as_destination(fake: object) -> RouterDestination:
    """A test stand-in, passed where the plugin takes a destination."""
    return cast("RouterDestination", fake)


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[Broker]:
    """A private RabbitMQ (or the one QPID_FLOW_TEST_BROKER_URL names), as the suite picks."""
    try:
        broker = make_broker()
        broker.start()
    except BrokerError as e:
        pytest.fail(f"RabbitMQ test broker unavailable: {e}", pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture
def reader(rabbitmq: Broker) -> Iterator[PikaDepthReader]:
    """The production reader, built the way the plugin builds it: from the AMQP 1.0 URL."""
    settings = parse_settings({}, rabbitmq.url)
    depth_reader = PikaDepthReader.from_parameters(settings.connection_parameters())
    yield depth_reader
    depth_reader.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def channel(rabbitmq: Broker) -> Any:
    params = pika.ConnectionParameters(
        host=rabbitmq.host, port=rabbitmq.port, credentials=pika.PlainCredentials(rabbitmq.user, rabbitmq.password)
    )
    return pika.BlockingConnection(params).channel()


def test_reads_the_ready_count_and_zero_once_deleted(rabbitmq: Broker, reader: PikaDepthReader) -> None:
    name = unique("depth")
    ch = channel(rabbitmq)
    try:
        ch.confirm_delivery()  # every publish confirmed: all 37 are in the queue before we read
        ch.queue_declare(queue=name)
        for i in range(37):
            ch.basic_publish(exchange="", routing_key=name, body=f"message {i}".encode())
        assert reader(name) == 37
        assert reader(name) == 37  # the same connection and channel, again

        ch.queue_delete(queue=name)
        assert reader(name) == 0  # gone: 404, counted as no backlog
        assert reader(unique("never")) == 0

        ch.queue_declare(queue=name)  # the channel reopened after the 404 keeps working
        ch.basic_publish(exchange="", routing_key=name, body=b"again")
        assert reader(name) == 1
    finally:
        ch.queue_delete(queue=name)
        ch.connection.close()


def test_an_amqp10_address_maps_to_the_queue_rabbitmq_declared(rabbitmq: Broker, reader: PikaDepthReader) -> None:
    """Queues that AMQP 1.0 senders create (plain NAME, /queue/NAME) can be read from 0-9-1:
    the address mapping and RabbitMQ agree on the name, and the queue is not exclusive."""
    from proton import Message
    from proton.utils import BlockingConnection

    from qpid_flow_rabbitmq_depth import queue_name

    plain, prefixed = unique("plain"), unique("prefixed")
    connection = BlockingConnection(rabbitmq.url, timeout=10)
    try:
        for address, count in ((plain, 3), (f"/queue/{prefixed}", 5)):
            sender = connection.create_sender(address)
            for i in range(count):
                sender.send(Message(body=f"m{i}"))  # waits until RabbitMQ settles it
            # No sender.close(): RabbitMQ 3.10 may never answer a detach; closing the
            # connection below ends the links.
        name_plain, name_prefixed = queue_name(plain), queue_name(f"/queue/{prefixed}")
        assert name_plain is not None and name_prefixed is not None
        assert reader(name_plain) == 3
        assert reader(name_prefixed) == 5
    finally:
        connection.close()
    ch = channel(rabbitmq)
    for name in (plain, prefixed):
        ch.queue_delete(queue=name)
    ch.connection.close()


def test_the_plugin_thread_delivers_a_real_backlog(rabbitmq: Broker) -> None:
    """The plugin as qpid-flow would run it (real pika, real thread), minus qpid-flow."""
    import threading
    import time

    name = unique("thread")
    ch = channel(rabbitmq)
    ch.confirm_delivery()
    ch.queue_declare(queue=name)
    for _ in range(11):
        ch.basic_publish(exchange="", routing_key=name, body=b"x")

    class Destination:
        address = f"/queue/{name}"
        backlogs: list[int] = []  # noqa: RUF012 - one instance

        def set_broker_backlog(self, ready: int) -> None:
            self.backlogs.append(ready)

    destination = Destination()

    class Control:
        def call_from_thread(self, callback: Any) -> None:
            callback()

        def destination(self, address: str) -> Destination | None:
            return destination if address == destination.address else None

    plugin = RabbitMQDepth()
    plugin.qpid_flow_configure(
        config=RouterConfig(broker=rabbitmq.url, plugins={"rabbitmq_depth": {"interval": "200ms"}})
    )
    plugin.qpid_flow_destination_created(destination=as_destination(destination))
    plugin.qpid_flow_started(control=as_control(Control()))
    try:
        deadline = time.monotonic() + 10
        while destination.backlogs[-1:] != [11] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert destination.backlogs[-1:] == [11]
        ch.queue_purge(queue=name)
        while destination.backlogs[-1:] != [0] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert destination.backlogs[-1:] == [0]
    finally:
        plugin.qpid_flow_stopping()
        ch.queue_delete(queue=name)
        ch.connection.close()
    assert not [t for t in threading.enumerate() if t.name == "qpid-flow-rabbitmq-depth"]


def test_a_queue_that_does_not_exist_is_read_without_a_warning_each_time(
    reader: PikaDepthReader, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer's /amq/queue/X that was never declared is read every interval: pika
    logged a warning for each read's 404 (every 2 s, for as long as X was known)."""
    caplog.set_level("WARNING")
    for _ in range(3):
        assert reader(unique("never")) == 0
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pika")] == []
