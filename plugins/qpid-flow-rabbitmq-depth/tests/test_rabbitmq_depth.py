"""The rabbitmq_depth plugin without a broker: a fake pika connection stands in for RabbitMQ."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pika.exceptions
import pytest
from qpid_flow.config import ConfigError, DestinationPolicy, RouterConfig

from qpid_flow_rabbitmq_depth import (
    PikaDepthReader,
    RabbitMQDepth,
    Settings,
    parse_settings,
    plugin,
    queue_name,
)
from qpid_flow_rabbitmq_depth import reader as reader_module
from qpid_flow_rabbitmq_depth import worker as worker_module

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination as RouterDestination
    from qpid_flow.plugin.control import RouterControl


def as_control(fake: object) -> RouterControl:
    """A test stand-in, passed where the plugin takes the router's control."""
    return cast("RouterControl", fake)


def as_destination(fake: object) -> RouterDestination:
    """A test stand-in, passed where the plugin takes a destination."""
    return cast("RouterDestination", fake)


BROKER = "amqp://guest:guest@127.0.0.1:5672"


# --- fakes -----------------------------------------------------------------------------------


class FakeBroker:
    """Queues and their ready counts; ``down`` makes connecting fail like a dead broker."""

    def __init__(self, queues: dict[str, int] | None = None) -> None:
        self.queues = dict(queues or {})
        self.down = False
        self.connects = 0
        self.channels = 0
        self.declares: list[str] = []
        self.connections: list[FakeConnection] = []

    def connect(self) -> FakeConnection:
        self.connects += 1
        if self.down:
            raise pika.exceptions.AMQPConnectionError("Connection refused")
        connection = FakeConnection(self)
        self.connections.append(connection)
        return connection


class FakeConnection:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.is_open = True
        self.idles = 0

    def channel(self) -> FakeChannel:
        self.broker.channels += 1
        return FakeChannel(self)

    def process_data_events(self, time_limit: float = 0) -> None:
        self.idles += 1

    def close(self) -> None:
        self.is_open = False


class FakeChannel:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection
        self.is_open = True

    def queue_declare(self, queue: str, passive: bool = False) -> Any:
        assert passive, "the plugin must never create queues"
        broker = self.connection.broker
        broker.declares.append(queue)
        if broker.down or not self.connection.is_open:
            self.connection.is_open = False
            raise pika.exceptions.StreamLostError("Transport indicated EOF")
        if queue not in broker.queues:
            self.is_open = False  # as pika: the broker closed the channel
            raise pika.exceptions.ChannelClosedByBroker(404, f"NOT_FOUND - no queue '{queue}' in vhost '/'")
        if broker.queues[queue] < 0:
            self.is_open = False
            raise pika.exceptions.ChannelClosedByBroker(405, "RESOURCE_LOCKED - exclusive queue")
        return SimpleNamespace(method=SimpleNamespace(message_count=broker.queues[queue]))


@dataclass
class FakeDestination:
    address: str
    backlogs: list[int] = field(default_factory=list)

    def set_broker_backlog(self, ready: int) -> None:
        self.backlogs.append(ready)


class FakeControl:
    """``call_from_thread`` runs the callback at once (the reactor hand-over, collapsed)."""

    def __init__(self, *destinations: FakeDestination) -> None:
        self.destinations = {d.address: d for d in destinations}
        self.calls = 0

    def call_from_thread(self, callback: Callable[[], Any]) -> None:
        self.calls += 1
        callback()

    def destination(self, address: str) -> FakeDestination | None:
        return self.destinations.get(address)


class RecordingLog:
    """Stands in for a module's structlog logger (robust to structlog's logger caching)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str) -> Callable[..., None]:
        def log(event: str, **fields: Any) -> None:
            self.events.append((level, event, fields))

        return log

    def __getattr__(self, level: str) -> Callable[..., None]:
        return self._record(level)

    def names(self) -> list[str]:
        return [event for _, event, _ in self.events]


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> RecordingLog:
    recorder = RecordingLog()
    monkeypatch.setattr(worker_module, "log", recorder)
    monkeypatch.setattr(reader_module, "log", recorder)
    return recorder


def make_plugin(broker: FakeBroker, threaded: bool = False) -> RabbitMQDepth:
    return RabbitMQDepth(lambda _settings: PikaDepthReader(broker.connect), threaded=threaded)


def config(broker: str | None = BROKER, **settings: Any) -> RouterConfig:
    return RouterConfig(broker=broker, plugins={"rabbitmq_depth": settings} if settings else {})


def started(broker: FakeBroker, *destinations: FakeDestination, **settings: Any) -> tuple[RabbitMQDepth, FakeControl]:
    p = make_plugin(broker)
    p.qpid_flow_configure(config=config(**settings))
    control = FakeControl(*destinations)
    p.qpid_flow_started(control=as_control(control))
    for destination in destinations:
        p.qpid_flow_destination_created(destination=as_destination(destination))
    return p, control


# --- address -> queue ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("orders", "orders"),
        ("/queue/orders", "orders"),
        ("/amq/queue/orders", "orders"),
        ("orders.eu.high", "orders.eu.high"),
        ("/queue/a%2Fb", "a/b"),  # RabbitMQ unescapes %2F ...
        ("a%2Fb", "a/b"),
        ("/queue/a%2fb", "a%2fb"),  # ... upper case only
        ("/exchange/amq.topic/orders", None),
        ("/exchange/logs", None),
        ("/topic/orders.*", None),
        ("/temp-queue/x", None),
        ("/reply-queue/x", None),
        ("/queue/", None),
        ("/queue", None),
        ("/queue/a/b", None),  # RabbitMQ refuses it
        ("/amq/queue/", None),
        ("a/b", None),
        ("", None),
        ("/", None),
        ("x" * 255, "x" * 255),
        ("x" * 256, None),  # longer than any queue name
    ],
)
def test_queue_name(address: str, expected: str | None) -> None:
    assert queue_name(address) == expected


# --- settings ------------------------------------------------------------------------------------


def test_settings_defaults_follow_the_broker_url() -> None:
    s = parse_settings({}, "amqp://alice:s%40cret@rabbit.example:5673")
    assert s == Settings(interval=2.0, amqp091_url="amqp://alice:s%40cret@rabbit.example:5673", vhost="/")
    assert s.display_url == "amqp://alice@rabbit.example:5673"
    params = s.connection_parameters()
    assert (params.host, params.port, params.virtual_host) == ("rabbit.example", 5673, "/")
    assert (params.credentials.username, params.credentials.password) == ("alice", "s@cret")
    assert params.connection_attempts == 1


@pytest.mark.parametrize(
    ("broker", "url"),
    [
        ("amqp://guest:guest@127.0.0.1", "amqp://guest:guest@127.0.0.1:5672"),
        ("amqp://127.0.0.1", "amqp://127.0.0.1:5672"),
        ("amqps://u:p@rabbit", "amqps://u:p@rabbit:5671"),
        ("amqp://u:p@[::1]:5700/ignored?x=1", "amqp://u:p@[::1]:5700"),
    ],
)
def test_default_url_from_broker(broker: str, url: str) -> None:
    assert parse_settings({}, broker).amqp091_url == url


def test_settings_given() -> None:
    s = parse_settings(
        {"interval": "500ms", "amqp091_url": "amqp://admin:pw@mq:5672/?heartbeat=30", "vhost": "prod"}, BROKER
    )
    assert (s.interval, s.vhost) == (0.5, "prod")
    params = s.connection_parameters()
    assert (params.host, params.virtual_host, params.heartbeat) == ("mq", "prod", 30)
    assert parse_settings({"interval": 3}, BROKER).interval == 3.0


# Each bad table and the key its error names.
BAD_SETTINGS = [
    ({"interval": "soon"}, "plugins.rabbitmq_depth.interval"),
    ({"interval": "0s"}, "plugins.rabbitmq_depth.interval"),
    ({"interval": "10ms"}, "plugins.rabbitmq_depth.interval"),
    ({"interval": -1}, "plugins.rabbitmq_depth.interval"),
    ({"interval": True}, "plugins.rabbitmq_depth.interval"),
    ({"vhost": ""}, "plugins.rabbitmq_depth.vhost"),
    ({"vhost": 3}, "plugins.rabbitmq_depth.vhost"),
    ({"amqp091_url": "http://mq:15672"}, "plugins.rabbitmq_depth.amqp091_url"),
    ({"amqp091_url": "mq:5672"}, "plugins.rabbitmq_depth.amqp091_url"),
    ({"amqp091_url": 5672}, "plugins.rabbitmq_depth.amqp091_url"),
    ({"amqp091_url": "amqp://mq:5672/prod"}, "plugins.rabbitmq_depth.amqp091_url"),
    ({"amqp091_url": "amqp://mq:5672/?bogus=1"}, "plugins.rabbitmq_depth.amqp091_url"),
    ({"amqp091_url": "amqp://mq:99999"}, "plugins.rabbitmq_depth.amqp091_url"),
    ({"url": "amqp://mq"}, "plugins.rabbitmq_depth.url"),
]


@pytest.mark.parametrize(("table", "key"), BAD_SETTINGS)
def test_bad_settings_name_the_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_settings(table, BROKER)
    assert raised.value.key == key
    assert str(raised.value).startswith(key)


@pytest.mark.parametrize(
    "url",
    [
        "amqp://depth:D3pthSecretPw@127.0.0.1:5672/prod",  # refused for its vhost
        "amqp://depth:D3pthSecretPw@127.0.0.1:5672?heartbeat=abc",  # no '/' before the query
        "amqp://depth:D3pth Secret,Pw@127.0.0.1:5672",  # a raw space and comma in the password
        "amqp://depth:D3pthSecretPw@127.0.0.1:5672/?heartbeat=abc",  # pika's refusal
    ],
)
def test_a_refused_url_never_shows_its_password(url: str) -> None:
    """docs/security.md: passwords are masked in every configuration error. The URL was
    printed as given, password and all."""
    with pytest.raises(ConfigError) as raised:
        parse_settings({"amqp091_url": url}, BROKER)
    assert "Secret" not in str(raised.value)
    assert "amqp://depth:***@127.0.0.1:5672" in str(raised.value)


def test_a_broker_url_it_cannot_derive_from_is_shown_masked() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_settings({}, "amqp://svc:S3cretPw@broker.example:port")
    assert "S3cret" not in str(raised.value)
    assert "amqp://svc:***@broker.example:port" in str(raised.value)


def test_configure_refuses_bad_settings_through_the_hook() -> None:
    with pytest.raises(ConfigError, match=r"plugins\.rabbitmq_depth\.interval"):
        make_plugin(FakeBroker()).qpid_flow_configure(config=config(interval="often"))


@pytest.mark.parametrize(("table", "key"), BAD_SETTINGS)
def test_standalone_refuses_bad_settings_too(table: dict[str, Any], key: str) -> None:
    """The README says a bad value stops qpid-flow at start, naming the key; standalone,
    the table was not even read, and a mistake waited for the day a broker was set."""
    with pytest.raises(ConfigError) as raised:
        make_plugin(FakeBroker()).qpid_flow_configure(config=config(broker=None, **table))
    assert raised.value.key == key


def test_standalone_does_nothing_at_all() -> None:
    broker = FakeBroker({"orders": 5})
    p = make_plugin(broker, threaded=True)
    p.qpid_flow_configure(config=config(broker=None, interval="1s", vhost="prod"))
    control = FakeControl(FakeDestination("orders"))
    p.qpid_flow_started(control=as_control(control))
    p.qpid_flow_destination_created(destination=as_destination(FakeDestination("orders")))
    p.qpid_flow_stopping()
    assert p.worker is None
    assert (broker.connects, control.calls) == (0, 0)
    assert not [t for t in threading.enumerate() if t.name == "qpid-flow-rabbitmq-depth"]


def test_the_entry_point_object_is_the_plugin() -> None:
    assert isinstance(plugin, RabbitMQDepth)


# --- the worker with a fake connection ---------------------------------------------------------


def test_a_queue_whose_name_holds_a_slash_is_read() -> None:
    """In front of RabbitMQ the address /queue/dir%2Fs is the destination "dir/s": parsed
    again as an address, that name named no queue, and its backlog was never read (a
    producer got 11 accepted past a backlog of 50 and a stop of 10)."""
    broker = FakeBroker({"dir/s": 50})
    destination = FakeDestination("dir/s")
    p, _control = started(broker, destination)
    assert p.worker is not None
    assert p.worker.addresses == ["dir/s"]
    assert p.worker.poll_once()
    assert destination.backlogs == [50]


def test_depths_reach_the_destinations() -> None:
    broker = FakeBroker({"orders": 37, "audit": 0, "eu": 4})
    orders, plain, audit, eu, topic = (
        FakeDestination("/queue/orders"),
        FakeDestination("orders"),
        FakeDestination("/amq/queue/audit"),
        FakeDestination("eu"),
        FakeDestination("/topic/orders"),
    )
    p, _control = started(broker, orders, plain, audit, eu, topic)
    assert p.worker is not None
    assert sorted(p.worker.addresses) == ["/amq/queue/audit", "/queue/orders", "eu", "orders"]

    assert p.worker.poll_once()
    assert (orders.backlogs, plain.backlogs, audit.backlogs, eu.backlogs, topic.backlogs) == ([37], [37], [0], [4], [])
    # One connection, one channel, one declare per queue ("orders" and "/queue/orders" share one).
    assert (broker.connects, broker.channels) == (1, 1)
    assert sorted(broker.declares) == ["audit", "eu", "orders"]

    broker.queues["orders"] = 12
    assert p.worker.poll_once()
    assert orders.backlogs == [37, 12]
    assert (broker.connects, broker.channels) == (1, 1)  # reused


def test_a_missing_queue_counts_zero_and_the_channel_is_reopened() -> None:
    broker = FakeBroker({"present": 3})
    missing, present = FakeDestination("/queue/missing"), FakeDestination("present")
    p, _control = started(broker, missing, present)
    assert p.worker is not None

    assert p.worker.poll_once()
    assert (missing.backlogs, present.backlogs) == ([0], [3])
    assert broker.connects == 1 and broker.channels == 2  # a fresh channel after the 404

    broker.queues["missing"] = 9  # declared later: counted from then on
    assert p.worker.poll_once()
    assert missing.backlogs == [0, 9]


def test_a_refused_queue_is_skipped_and_logged_once(logs: RecordingLog) -> None:
    broker = FakeBroker({"locked": -1, "ok": 2})
    locked, ok = FakeDestination("locked"), FakeDestination("ok")
    p, _control = started(broker, locked, ok)
    assert p.worker is not None
    assert p.worker.poll_once() and p.worker.poll_once()
    assert (locked.backlogs, ok.backlogs) == ([], [2, 2])
    assert logs.names() == ["rabbitmq_depth_queue_refused"]


def test_a_new_destination_is_read_before_the_interval_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """... but not at once: FRESH_DELAY after it was made (a passive declare racing the
    client attach that declares the queue can end that client's session at RabbitMQ 3.10),
    neither by its own read nor by a full poll."""
    broker = FakeBroker({"orders": 5, "late": 7})
    orders = FakeDestination("orders")
    p, control = started(broker, orders, interval="1h")  # made with no delay (conftest)
    worker = p.worker
    assert worker is not None
    start = time.monotonic()
    clock = [start]
    worker._clock = lambda: clock[0]
    next_full = worker._step(start)  # the poll at start
    assert orders.backlogs == [5] and next_full == start + 3600.0

    monkeypatch.setattr(worker_module, "FRESH_DELAY", 1.0)
    late = FakeDestination("late")
    control.destinations["late"] = late
    p.qpid_flow_destination_created(destination=as_destination(late))
    clock[0] = start + 0.5  # not yet: the client's attach may be declaring the queue right now
    assert worker._step(next_full) == next_full
    assert late.backlogs == []
    assert worker.poll_once() and late.backlogs == []  # a full poll leaves it alone too
    clock[0] = start + 1.0
    assert worker._step(next_full) == next_full
    assert (orders.backlogs, late.backlogs) == ([5, 5], [7])  # the due one read; orders by the full poll


def test_a_forgotten_destination_is_no_longer_read() -> None:
    broker = FakeBroker({"orders": 5})
    orders = FakeDestination("orders")
    p, control = started(broker, orders)
    assert p.worker is not None
    del control.destinations["orders"]  # the router forgot it
    assert p.worker.poll_once()
    assert p.worker.addresses == []
    broker.declares.clear()
    assert p.worker.poll_once()
    assert broker.declares == []


def test_a_connection_failure_is_logged_once_and_retried(logs: RecordingLog) -> None:
    broker = FakeBroker({"orders": 8})
    orders = FakeDestination("orders")
    p, _control = started(broker, orders)
    worker = p.worker
    assert worker is not None
    assert worker.poll_once() and orders.backlogs == [8]

    broker.down = True  # the connection breaks, then reconnecting fails
    for _ in range(4):
        assert not worker.poll_once()
    assert worker.down
    assert logs.names() == ["rabbitmq_depth_unavailable"]
    assert orders.backlogs == [8]  # nothing made up while the broker is away
    assert broker.connects == 1 + 3  # broken connection dropped, a fresh attempt each retry
    assert worker._backoff() == 16.0  # 2 s doubled per failure...
    worker._failures = 100
    assert worker._backoff() == 30.0  # ... up to 30 s

    broker.down = False
    broker.queues["orders"] = 2
    assert worker.poll_once()
    assert not worker.down
    assert logs.names() == ["rabbitmq_depth_unavailable", "rabbitmq_depth_recovered"]
    assert orders.backlogs == [8, 2]

    broker.down = True  # a second outage is logged again, once
    assert not worker.poll_once() and not worker.poll_once()
    assert logs.names()[-1] == "rabbitmq_depth_unavailable"
    assert logs.names().count("rabbitmq_depth_unavailable") == 2


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_backlog_of_a_configured_destination_counts_from_the_poll_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router creates the destinations named in its configuration after
    qpid_flow_started: the worker's poll at start found nothing to read, and they were
    read FRESH_DELAY later, as if a client's attach had just made them. Now the plugin
    watches them from qpid_flow_configure, with no delay (patterns and exchanges aside)."""
    monkeypatch.setattr(worker_module, "FRESH_DELAY", 30.0)  # any later read would be too late
    broker = FakeBroker({"orders": 50, "eu": 3})
    orders, eu = FakeDestination("orders"), FakeDestination("/queue/eu")
    destinations = {name: DestinationPolicy.of(name) for name in ("orders", "/queue/eu", "audit.>", "/exchange/x")}
    p = make_plugin(broker, threaded=True)
    p.qpid_flow_configure(config=RouterConfig(broker=BROKER, plugins={}, destinations=destinations))
    assert p.worker is not None
    assert sorted(p.worker.addresses) == ["/queue/eu", "orders"]
    p.qpid_flow_started(control=as_control(FakeControl(orders, eu)))  # the thread polls at once
    try:
        for destination in (orders, eu):  # then the router creates them (create_configured)
            p.qpid_flow_destination_created(destination=as_destination(destination))
        assert wait_for(lambda: orders.backlogs == [50] and eu.backlogs == [3])
    finally:
        p.qpid_flow_stopping()


def test_the_thread_polls_at_start_retries_through_an_outage_and_stops(logs: RecordingLog) -> None:
    broker = FakeBroker({"orders": 37})
    broker.down = True
    orders = FakeDestination("orders")
    p = make_plugin(broker, threaded=True)
    p.qpid_flow_configure(config=config(interval="100ms"))
    assert p.worker is not None
    p.worker._max_backoff = 0.1
    p.qpid_flow_destination_created(destination=as_destination(orders))  # created before start: still read
    p.qpid_flow_started(control=as_control(FakeControl(orders)))
    try:
        assert wait_for(lambda: broker.connects >= 3)
        broker.down = False
        assert wait_for(lambda: orders.backlogs[-1:] == [37])
        broker.queues["orders"] = 0
        assert wait_for(lambda: orders.backlogs[-1:] == [0])
    finally:
        p.qpid_flow_stopping()
    assert not [t for t in threading.enumerate() if t.name == "qpid-flow-rabbitmq-depth"]
    assert logs.names().count("rabbitmq_depth_unavailable") == 1
    assert logs.names().count("rabbitmq_depth_recovered") == 1
    assert broker.connections and not broker.connections[-1].is_open  # closed on stop


def test_an_unexpected_error_does_not_kill_the_thread(logs: RecordingLog) -> None:
    broker = FakeBroker({"orders": 1})
    orders = FakeDestination("orders")
    p = make_plugin(broker, threaded=True)
    p.qpid_flow_configure(config=config(interval="100ms"))
    assert p.worker is not None
    p.worker._max_backoff = 0.1
    failures = [2]
    control = FakeControl(orders)
    real = control.call_from_thread

    def flaky(callback: Callable[[], Any]) -> None:
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("reactor bridge closed")
        real(callback)

    control.call_from_thread = flaky  # type: ignore[method-assign]
    p.qpid_flow_destination_created(destination=as_destination(orders))
    p.qpid_flow_started(control=as_control(control))
    try:
        assert wait_for(lambda: orders.backlogs == [1] or len(orders.backlogs) > 1)
    finally:
        p.qpid_flow_stopping()
    assert logs.names().count("rabbitmq_depth_worker_error") == 2
