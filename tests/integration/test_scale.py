"""1,000 client connections through qpid-flow to RabbitMQ, each round-tripping a message.

In front of a broker every client connection gets an upstream connection of its own
(qpid_flow/amqp/linkroute.py), so 1,000 clients mean 1,000 mirrored connections at the broker,
plus qpid-flow's own. One Proton container in the test process drives all clients (one
``MessagingHandler``), in three phases, each waiting for every client before the next:

1. connect: 1,000 ``container.connect(..., reconnect=False)`` at once, each with the
   broker's user and password (SASL PLAIN, which qpid-flow relays to the broker); done when
   every connection is open (the broker's open, relayed by qpid-flow): the connect rate;
2. attach: each client attaches a consumer, then a producer, on its own queue; done when
   every link is open: qpid-flow's RSS is read now, with all 1,000 pairs open;
3. round trip: each producer sends one message naming its client; each consumer accepts
   what it receives and checks it is its own; done when every producer has seen
   ``accepted`` and every consumer its message.

Then every client closes, and qpid-flow must close their upstream connections.

The test asserts behaviour only (all round trips, each client's own message back, no
upstream connection left); the figures (connect rate and connect-time percentiles, RSS
before and with all pairs open, RSS per pair, phase times, CPU seconds of qpid-flow,
RabbitMQ and the clients per phase, sockets at the broker) are printed and put in the
assertion messages. Nothing waits without a deadline: the container stops itself at
``DEADLINE`` and the test fails with how many clients got through each phase, the first
clients that did not, and the warnings of qpid-flow's and the broker's logs.

The clients' container waits with ``poll()`` (``_PollSelector``): Proton's own selector
uses ``select()``, which cannot watch a descriptor numbered 1,024 or more.

Run: ``.venv/bin/python -m pytest tests/integration/test_scale.py -s``.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton._io import IO
from proton.handlers import IOHandler, MessagingHandler
from proton.reactor import Container

from .harness.broker import Broker
from .harness.router import RouterProcess, StartRouter
from .harness.waiting import wait_until

pytestmark = pytest.mark.integration

CLIENTS = 1_000
DEADLINE = 120.0  # seconds for all three phases; a run here takes 7-10 s (see BENCHMARKS.md)
_POLL = 0.05
_CLOSE_WAIT = 20.0  # seconds for the clients' close handshakes at the end


def rss_kib(pid: int) -> int:
    """Resident set size of process ``pid`` in KiB (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def established_to(pid: int, port: int) -> int:
    """How many of process ``pid``'s TCP sockets are established to ``port`` (IPv4 loopback)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        found = re.fullmatch(r"socket:\[(\d+)\]", target)
        if found:
            inodes.add(found.group(1))
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
                count += 1
    return count


def rabbitmq_sockets(broker: Broker) -> dict[str, int]:
    """RabbitMQ's own count of its sockets and their limit (``rabbitmqctl status``; AMQP 1.0
    connections are not in ``list_connections`` on 3.10). Empty when the harness does not run
    the broker (``QPID_FLOW_TEST_BROKER_URL``)."""
    ctl = getattr(broker, "ctl", None)
    if ctl is None:
        return {}
    status = re.sub(r"\x1b\[[0-9;]*m", "", ctl("status").stdout)
    found = re.search(r"Sockets: (\d+), limit: (\d+)", status)
    return {"rabbitmq_sockets": int(found.group(1)), "rabbitmq_socket_limit": int(found.group(2))} if found else {}


def diagnostics(router: RouterProcess, broker: Broker) -> str:
    """For a failure: qpid-flow's log events by count, its warnings and errors, and the
    broker's error lines (leaving out the depth plugin's look-ups of queues not declared
    yet, which the broker logs as channel errors)."""
    events: dict[str, int] = {}
    problems: list[str] = []
    for line in router.log_text().splitlines():
        found = re.search(r'"event": "([^"]*)"', line)
        if found is None or "pika." in line:
            continue
        events[found.group(1)] = events.get(found.group(1), 0) + 1
        if '"level": "warning"' in line or '"level": "error"' in line:
            problems.append(line[:300])
    text = f"qpid-flow log events {events}; first warnings and errors: {problems[:10]}"
    workdir, nodename = getattr(broker, "workdir", None), getattr(broker, "nodename", None)
    if workdir is not None and nodename is not None:
        log = Path(workdir) / "log" / f"{nodename}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        errors = [
            line[:300]
            for line in lines
            if "[error]" in line and "queue.declare" not in line and "Channel error on connection" not in line
        ]
        text += f"; broker log error lines (last 20 of {len(errors)}): {errors[-20:]}"
    return text


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time process ``pid`` has used so far (0 when unknown)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _PollSelector(IO.Selector):
    """Proton's selector with ``poll()`` for ``select()``, which cannot watch a descriptor
    numbered 1,024 or more: a thousand client sockets plus pytest's own files pass that."""

    def select(self, timeout: float | None) -> tuple[list[Any], list[Any], list[Any]]:
        waits = [timeout] if timeout is not None else []
        deadline: float | None = getattr(self, "_deadline", None)  # Proton's, untyped
        if deadline is not None:
            waits.append(max(0.0, deadline - time.time()))
        poller = select.poll()
        watched: dict[int, Any] = {}
        for selectable in self._reading | self._writing:
            mask = select.POLLIN if selectable in self._reading else 0
            mask |= select.POLLOUT if selectable in self._writing else 0
            fd = selectable.fileno()
            watched[fd] = selectable
            poller.register(fd, mask)
        try:
            ready = poller.poll(min(waits) * 1000 if waits else None)
        except InterruptedError:
            ready = []
        readable, writable = [], []
        for fd, events in ready:
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR) and watched[fd] in self._reading:
                readable.append(watched[fd])
            if events & (select.POLLOUT | select.POLLHUP | select.POLLERR) and watched[fd] in self._writing:
                writable.append(watched[fd])
        now = time.time()
        expired = [s for s in self._selectables if s.deadline and now > s.deadline]
        self._deadline = None
        self.update_deadline()
        return readable, writable, expired


class _PollIOHandler(IOHandler):
    def __init__(self) -> None:
        super().__init__()
        self._selector = _PollSelector()


@dataclass
class _Client:
    index: int
    queue: str
    connection: Any = None
    sender: Any = None
    receiver: Any = None
    opened: bool = False
    opened_at: float = 0.0  # monotonic
    links_open: int = 0
    sent: bool = False
    outcome: str | None = None
    received: list[str] = field(default_factory=list)
    error: str | None = None
    counted: bool = False

    @property
    def body(self) -> str:
        return f"client {self.index} on {self.queue}"

    @property
    def round_tripped(self) -> bool:
        return self.outcome == "accepted" and self.received == [self.body]


class ScaleDriver(MessagingHandler):
    """All clients in one container. ``phase_times`` holds when each phase ended (monotonic)."""

    def __init__(self, url: str, clients: int, run: str, pids: dict[str, int | None]) -> None:
        super().__init__(prefetch=1, auto_accept=False)
        self.url = url
        # Whose CPU time is read at each phase's end: where the time goes.
        self.pids = {**pids, "clients": os.getpid()}
        self.cpu: dict[str, dict[str, float]] = {}
        self.clients = [_Client(i, f"scale-{run}-{i}") for i in range(clients)]
        self.started = 0.0
        self.phase_times: dict[str, float] = {}
        self.opened = 0
        self.attached = 0
        self.round_trips = 0
        self.timed_out = False
        self.release = threading.Event()  # set by the test: close everything and stop
        self.all_done = threading.Event()  # set here when phase 3 is over (or the deadline passed)
        self.attached_event = threading.Event()
        self.proceed = threading.Event()  # set by the test once it has read RSS with all links open
        self._container: Container | None = None
        self._deadline_task: Any = None
        self._closing = False
        self.transports_closed = 0

    def _client(self, endpoint: Any) -> _Client:
        return self.clients[endpoint.connection.qf_client]

    def _mark(self, phase: str) -> None:
        self.phase_times[phase] = time.monotonic()
        self.cpu[phase] = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def cpu_used(self, first: str, last: str) -> str:
        """CPU seconds each process used between two phase ends."""
        if first not in self.cpu or last not in self.cpu:
            return "n/a"
        return " ".join(f"{name} {self.cpu[last][name] - self.cpu[first][name]:.2f}" for name in self.pids)

    # --- phase 1: connect -------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        container = event.container
        self._container = container
        self._mark("start")
        self.started = time.monotonic()
        for client in self.clients:
            client.connection = container.connect(self.url, reconnect=False)
            client.connection.qf_client = client.index
        self._deadline_task = container.schedule(DEADLINE, self)
        container.schedule(_POLL, _Poll(self))

    def on_connection_opened(self, event: Any) -> None:
        client = self._client(event)
        if client.opened:
            return
        client.opened = True
        client.opened_at = time.monotonic()
        self.opened += 1
        if self.opened == len(self.clients):
            self._mark("connected")
            self._attach_all()

    # --- phase 2: attach --------------------------------------------------------------

    def _attach_all(self) -> None:
        container = self._container
        assert container is not None
        for client in self.clients:
            # The consumer first: its attach declares the queue before anything is sent to it.
            client.receiver = container.create_receiver(client.connection, client.queue, name=f"{client.queue}-in")
            client.sender = container.create_sender(client.connection, client.queue, name=f"{client.queue}-out")

    def on_link_opened(self, event: Any) -> None:
        client = self._client(event)
        client.links_open += 1
        if client.links_open == 2:
            self.attached += 1
            if self.attached == len(self.clients):
                self._mark("attached")
                self.attached_event.set()

    # --- phase 3: round trip (started by the test through _Poll once RSS is read) -----

    def send_all(self) -> None:
        for client in self.clients:
            self._send(client)

    def on_sendable(self, event: Any) -> None:
        if self.proceed.is_set():
            self._send(self._client(event))

    def _send(self, client: _Client) -> None:
        if not client.sent and client.sender is not None and client.sender.credit > 0:
            client.sent = True
            client.sender.send(Message(body=client.body, durable=False))

    def on_accepted(self, event: Any) -> None:
        client = self._client(event)
        client.outcome = "accepted"
        self._check(client)

    def on_rejected(self, event: Any) -> None:
        self._client(event).outcome = "rejected"

    def on_released(self, event: Any) -> None:
        self._client(event).outcome = "released"

    def on_message(self, event: Any) -> None:
        client = self._client(event)
        client.received.append(str(event.message.body))
        self.accept(event.delivery)
        self._check(client)

    def _check(self, client: _Client) -> None:
        if client.round_tripped and not client.counted:
            client.counted = True
            self.round_trips += 1
            if self.round_trips == len(self.clients):
                self._mark("round_tripped")
                self.all_done.set()

    # --- errors and the end -----------------------------------------------------------

    def on_connection_remote_close(self, event: Any) -> None:
        # Proton's MessagingHandler does not call on_connection_error for
        # amqp:connection:forced (what qpid-flow sends when it loses the broker): record
        # every condition here.
        condition = event.connection.remote_condition
        if condition is not None:
            self._error(event, "connection", condition)

    def on_disconnected(self, event: Any) -> None:
        if not self._closing:
            self._error(event, "disconnected", event.transport.condition)

    def on_session_error(self, event: Any) -> None:
        self._error(event, "session", event.session.remote_condition)

    def on_link_error(self, event: Any) -> None:
        self._error(event, "link", event.link.remote_condition)

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        if not self._closing and event.connection is not None:
            self._error(event, "transport", condition)

    def _error(self, event: Any, what: str, condition: Any) -> None:
        client = self._client(event)
        if client.error is None:
            name = condition.name if condition is not None else None
            description = condition.description if condition is not None else None
            client.error = f"{what}: {name} {description}"

    def on_timer_task(self, event: Any) -> None:
        if not self.all_done.is_set():
            self.timed_out = True
            self.all_done.set()
            self.attached_event.set()

    def on_transport_closed(self, event: Any) -> None:
        self.transports_closed += 1

    def close_all(self) -> None:
        """Close every connection cleanly; the container stops once all are closed (or
        after ``_CLOSE_WAIT`` seconds: it never waits for a peer that does not answer)."""
        self._closing = True
        if self._deadline_task is not None:
            self._deadline_task.cancel()
        for client in self.clients:
            if client.connection is not None:
                client.connection.close()
        assert self._container is not None
        self._container.schedule(_POLL, _Stopper(self, time.monotonic() + _CLOSE_WAIT))

    def stragglers(self, limit: int = 5) -> str:
        """The first clients that did not round-trip, with what their endpoints say."""
        shown = []
        for c in self.clients:
            if c.counted:
                continue
            state = f"client {c.index} ({c.queue}): sent={c.sent} outcome={c.outcome} received={c.received}"
            if c.connection is not None:
                state += f" connection state={c.connection.state} condition={c.connection.remote_condition}"
            for name, link in (("sender", c.sender), ("receiver", c.receiver)):
                if link is not None:
                    state += f" {name} state={link.state} credit={link.credit} unsettled={link.unsettled}"
            shown.append(state)
            if len(shown) == limit:
                break
        return "; ".join(shown)

    def counts(self) -> str:
        errors = [c.error for c in self.clients if c.error]
        wrong = [c.index for c in self.clients if c.received and c.received != [c.body]]
        outcomes: dict[str, int] = {}
        for c in self.clients:
            if c.outcome is not None:
                outcomes[c.outcome] = outcomes.get(c.outcome, 0) + 1
        return (
            f"of {len(self.clients)} clients: {self.opened} connected, {self.attached} attached both links, "
            f"{sum(c.sent for c in self.clients)} sent, outcomes {outcomes}, "
            f"{sum(bool(c.received) for c in self.clients)} received, {self.round_trips} round-tripped; "
            f"{len(wrong)} got a message not their own {wrong[:5]}; "
            f"{len(errors)} errors (first: {errors[:3]})"
            + ("; DEADLINE PASSED" if self.timed_out else "")
            + (f"; stragglers: {self.stragglers()}" if self.round_trips < len(self.clients) else "")
        )


class _Poll:
    """Runs in the container: starts phase 3 when the test says so, stops when it says so."""

    def __init__(self, driver: ScaleDriver) -> None:
        self.driver = driver
        self.sending = False

    def on_timer_task(self, event: Any) -> None:
        driver = self.driver
        if driver.release.is_set():
            driver.close_all()
            return
        if driver.proceed.is_set() and not self.sending:
            self.sending = True
            driver.send_all()
        event.container.schedule(_POLL, self)


class _Stopper:
    """Stops the container once every client's transport is closed, or at ``until``."""

    def __init__(self, driver: ScaleDriver, until: float) -> None:
        self.driver = driver
        self.until = until

    def on_timer_task(self, event: Any) -> None:
        if self.driver.transports_closed >= len(self.driver.clients) or time.monotonic() > self.until:
            event.container.stop()
        else:
            event.container.schedule(_POLL, self)


def start_clients(url: str, pids: dict[str, int | None]) -> tuple[ScaleDriver, threading.Thread]:
    """``CLIENTS`` clients of ``url`` in one container, running in a thread of their own."""
    driver = ScaleDriver(url, CLIENTS, uuid.uuid4().hex[:8], pids)
    container = Container(driver, global_handler=_PollIOHandler())
    thread = threading.Thread(target=container.run, name="scale-clients", daemon=True)
    thread.start()
    return driver, thread


def test_a_thousand_clients_round_trip_through_qpid_flow(rabbitmq: Broker, qpid_flow_process: StartRouter) -> None:
    router: RouterProcess = qpid_flow_process(broker_url=rabbitmq.url)
    broker_pid: int | None = getattr(rabbitmq, "pid", None)  # None: a broker the harness does not run
    # qpid-flow's own (group reader) connection is established first.
    wait_until(lambda: established_to(router.pid, rabbitmq.port) >= 1)
    rss_before = rss_kib(router.pid)
    upstream_before = established_to(router.pid, rabbitmq.port)

    # Each client authenticates at the broker through qpid-flow (SASL PLAIN relayed by its gate).
    url = f"amqp://{rabbitmq.user}:{rabbitmq.password}@{router.host}:{router.port}"
    driver, thread = start_clients(url, {"qpid-flow": router.pid, "rabbitmq": broker_pid})

    figures: dict[str, Any] = {"rss_before_kib": rss_before}
    try:
        assert driver.attached_event.wait(DEADLINE + 10), f"the client container is stuck: {driver.counts()}"
        assert not driver.timed_out, (
            f"not all clients connected and attached in {DEADLINE:.0f} s: {driver.counts()}; "
            f"{diagnostics(router, rabbitmq)}"
        )
        figures["rss_all_open_kib"] = rss_kib(router.pid)
        figures["upstream_sockets"] = established_to(router.pid, rabbitmq.port)
        if broker_pid is not None:
            figures["rabbitmq_rss_kib"] = rss_kib(broker_pid)
        figures.update(rabbitmq_sockets(rabbitmq))
        driver.proceed.set()
        assert driver.all_done.wait(DEADLINE + 10), f"the client container is stuck: {driver.counts()}"
        figures["rss_after_round_trips_kib"] = rss_kib(router.pid)
    finally:
        driver.release.set()
        thread.join(_CLOSE_WAIT + 10)
    # Clients gone: qpid-flow closes their upstream connections; its own stay (the grouped
    # destinations' reader from the start, the depth plugin's once there are destinations).
    own = figures.get("upstream_sockets", CLIENTS + upstream_before) - CLIENTS
    until = time.monotonic() + 30
    while (upstream_left := established_to(router.pid, rabbitmq.port)) > own and time.monotonic() < until:
        time.sleep(0.2)
    figures["upstream_sockets_after_close"] = upstream_left
    figures["rss_after_close_kib"] = rss_kib(router.pid)
    figures["clients_closed"] = driver.transports_closed

    times = driver.phase_times
    if "connected" in times:
        figures["connect_s"] = times["connected"] - driver.started
        figures["connect_rate_per_s"] = CLIENTS / figures["connect_s"]
        waits = sorted(c.opened_at - driver.started for c in driver.clients)
        for name, rank in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            figures[f"connect_{name}_s"] = waits[min(len(waits) - 1, int(rank * len(waits)))]
    if "attached" in times:
        figures["attach_s"] = times["attached"] - times["connected"]
    if "round_tripped" in times:
        figures["round_trip_s"] = times["round_tripped"] - times["attached"]
        figures["total_s"] = times["round_tripped"] - driver.started
    for first, last in (("start", "connected"), ("connected", "attached"), ("attached", "round_tripped")):
        figures[f"cpu_s_{last}"] = driver.cpu_used(first, last)
    if "rss_all_open_kib" in figures:
        figures["rss_per_pair_kib"] = (figures["rss_all_open_kib"] - rss_before) / CLIENTS
    figures["upstream_sockets_before"] = upstream_before
    report = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    print(f"\nscale: {report}\nscale: {driver.counts()}")

    if driver.round_trips < CLIENTS or driver.timed_out:
        why = f"{driver.counts()}; {report}; {diagnostics(router, rabbitmq)}"
        assert not driver.timed_out, f"not all clients round-tripped in {DEADLINE:.0f} s: {why}"
        assert driver.round_trips == CLIENTS, why
    for client in driver.clients:
        assert client.error is None, f"client {client.index}: {client.error}; {driver.counts()}; {report}"
        assert client.outcome == "accepted", f"client {client.index}: outcome {client.outcome}; {report}"
        assert client.received == [client.body], f"client {client.index} got {client.received}; {report}"
    assert router.returncode is None, f"qpid-flow exited ({router.returncode}); {report}"
    assert upstream_left <= own, f"upstream connections left after the clients closed; {report}"


def compare(rounds: int) -> None:
    """The same clients directly against RabbitMQ, then through qpid-flow, ``rounds`` times
    on one private broker: what qpid-flow adds to the connect rate and phase times
    (``.venv/bin/python -m tests.integration.test_scale [ROUNDS]``, for BENCHMARKS.md)."""
    import shutil
    import tempfile

    from .harness.rabbitmq import RabbitMQBroker
    from .harness.router import start_router

    broker = RabbitMQBroker()
    broker.start()
    workdir = Path(tempfile.mkdtemp(prefix="qpid-flow-scale-"))
    try:
        for _ in range(rounds):
            for through in (False, True):
                router = start_router(workdir, broker.url) if through else None
                pids: dict[str, int | None] = {"rabbitmq": broker.pid}
                url = broker.url
                if router is not None:
                    time.sleep(1.0)
                    pids["qpid-flow"] = router.pid
                    url = f"amqp://{broker.user}:{broker.password}@{router.host}:{router.port}"
                driver, thread = start_clients(url, pids)
                driver.attached_event.wait(DEADLINE + 10)
                driver.proceed.set()
                driver.all_done.wait(DEADLINE + 10)
                driver.release.set()
                thread.join(_CLOSE_WAIT + 10)
                if router is not None:
                    router.stop()
                times = driver.phase_times
                if "round_tripped" not in times:
                    print(f"{'qpid-flow' if through else 'direct':9}  failed: {driver.counts()}")
                    continue
                connect = times["connected"] - driver.started
                print(
                    f"{'qpid-flow' if through else 'direct':9}  connect {connect:.2f} s ({CLIENTS / connect:.0f}/s), "
                    f"attach {times['attached'] - times['connected']:.2f} s, "
                    f"round trip {times['round_tripped'] - times['attached']:.2f} s; CPU s: "
                    f"connect {driver.cpu_used('start', 'connected')}; "
                    f"attach {driver.cpu_used('connected', 'attached')}",
                    flush=True,
                )
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    import sys

    compare(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
