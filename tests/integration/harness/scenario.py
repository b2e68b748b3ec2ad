"""Differential scenarios: the same client script run directly against the broker and through
qpid-flow, each run reduced to a plain comparable value.

The pieces:
- `Peer`: one AMQP 1.0 connection (Proton Python, raw `Handler`, its own `Container` in a thread)
  driven step by step from the test thread. It records what the client can observe: attach
  answers, every message received (in order, with its header's delivery-count), each sent
  delivery's outcome and condition, credit and drain completion, and every error condition with
  the level it came at (link, session, connection, transport). Credit is explicit (`flow`,
  `drain`), `reconnect=False` always, and every wait has a deadline: a peer that hangs leaves
  the views as they were at the deadline (something missing in the outcome), never a hung test.
- `Bystander`: a separate connection doing send/receive round trips on its own queue while a
  scenario runs; its comparable result is "N round trips completed" or how it stalled.
- `run_both`: run a scenario directly and through a fresh qpid-flow; return both outcomes.
- `run_c_examples` / `run_rhea`: the same kind of script with other client libraries.
- Broker helpers (`ctl`, `open_connections_of`, `amqp10_logins_since`, `subscription_queues`...)
  for RabbitMQ's own view: who is connected, who connected when, what queues a subscription left.

Nothing here knows qpid-flow's internals: a scenario only sees what any client would see.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from proton import Delivery, Handler, Message, Terminus
from proton.reactor import ApplicationEvent, Container, EventInjector

from .broker import Broker
from .cexamples import ProtonCExamples
from .router import RouterProcess

T = TypeVar("T")

#: Default deadline of one wait (seconds). Scenarios wait for things that take milliseconds
#: directly; a few seconds is generous and keeps a broken path from eating the test's budget.
WAIT = 5.0

RHEA_DIR = Path(__file__).resolve().parent / "rhea"


class ScenarioError(AssertionError):
    """The scenario's own machinery failed (not the system under test): a client thread died,
    a reactor call did not return, a helper program is missing."""


# --- what a client observes ------------------------------------------------------------------


def condition_name(condition: Any) -> str | None:
    """The condition's symbolic name only: descriptions carry per-connection ids and differ
    between two runs of the same scenario."""
    return str(condition.name) if condition is not None and condition.name else None


@dataclass
class Received:
    """One message as the receiving client saw it."""

    body: Any
    delivery_count: int
    properties: dict[str, Any] | None
    message_id: Any


@dataclass
class LinkView:
    """What one link's client saw. Written by the reactor thread, read by the test thread
    (only plain Python values here, never Proton objects)."""

    name: str
    is_sender: bool
    remote_opened: bool = False
    #: the address in the broker's attach answer (source for a receiver, target for a sender)
    remote_address: str | None = None
    #: None while attached; ("link" | "link-detach", condition name or None) once the peer ended it
    remote_closed: tuple[str, str | None] | None = None
    received: list[Received] = field(default_factory=list)
    #: per sent message, in send order: None while unsettled, then (outcome, condition name)
    outcomes: list[tuple[str, str | None] | None] = field(default_factory=list)
    credit: int = 0
    drain_requested: bool = False
    #: set when a drain completed: the sender answered with credit 0 while drain was on
    drained: bool = False


@dataclass
class PeerView:
    """What the connection's client saw, at every level."""

    remote_opened: bool = False
    #: (level, condition name) in arrival order; level: link, link-detach, session, connection, transport
    errors: list[tuple[str, str | None]] = field(default_factory=list)
    disconnected: bool = False


_OUTCOMES = {
    Delivery.ACCEPTED: "accepted",
    Delivery.REJECTED: "rejected",
    Delivery.RELEASED: "released",
    Delivery.MODIFIED: "modified",
}


class _PeerHandler(Handler):
    """Reactor-thread side of a Peer: records events into the Peer's views; answers the
    peer's closes like any client would (Proton's Handshaker), and nothing more."""

    def __init__(self, peer: Peer) -> None:
        super().__init__()
        self.peer = peer

    # calls from the test thread
    def on_peer_call(self, event: Any) -> None:
        self.peer._run_calls()

    def on_connection_remote_open(self, event: Any) -> None:
        self.peer.view.remote_opened = True

    def on_connection_remote_close(self, event: Any) -> None:
        conn = event.connection
        if not self.peer._closing:
            self.peer.view.errors.append(("connection", condition_name(conn.remote_condition)))
        if conn.state & conn.LOCAL_ACTIVE:
            conn.close()

    def on_session_remote_close(self, event: Any) -> None:
        ssn = event.session
        if not self.peer._closing:
            self.peer.view.errors.append(("session", condition_name(ssn.remote_condition)))
        if ssn.state & ssn.LOCAL_ACTIVE:
            ssn.close()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        view = self.peer._views.get(link.name)
        if view is None:
            return
        view.remote_opened = True
        terminus = link.remote_target if link.is_sender else link.remote_source
        view.remote_address = terminus.address if terminus is not None else None

    def _link_ended(self, event: Any, level: str) -> None:
        link = event.link
        view = self.peer._views.get(link.name)
        if view is not None and view.remote_closed is None:
            name = condition_name(link.remote_condition)
            view.remote_closed = (level, name)
            if not self.peer._closing and not self.peer._detaching.get(link.name):
                self.peer.view.errors.append((level, name))
        if link.state & link.LOCAL_ACTIVE:
            if level == "link-detach":
                link.detach()
            else:
                link.close()

    def on_link_remote_close(self, event: Any) -> None:
        self._link_ended(event, "link")

    def on_link_remote_detach(self, event: Any) -> None:
        self._link_ended(event, "link-detach")

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        view = self.peer._views.get(link.name)
        if view is None:
            return
        view.credit = link.credit
        if view.drain_requested and link.credit == 0:
            view.drained = True

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = dlv.link
        view = self.peer._views.get(link.name)
        if view is None:
            return
        if link.is_receiver:
            if not dlv.readable or dlv.partial:
                return
            msg = Message()
            msg.decode(link.recv(dlv.pending))
            link.advance()
            view.received.append(
                Received(
                    body=msg.body,
                    delivery_count=int(msg.delivery_count or 0),
                    properties=dict(msg.properties) if msg.properties else None,
                    message_id=msg.id,
                )
            )
            self.peer._deliveries.setdefault(link.name, []).append(dlv)
            view.credit = link.credit
            if view.drain_requested and link.credit == 0:
                view.drained = True
            if self.peer._auto_accept.get(link.name, True):
                dlv.update(Delivery.ACCEPTED)
                dlv.settle()
        else:
            index = self.peer._sent_index.get((link.name, dlv.tag))
            if index is None or not dlv.updated or view.outcomes[index] is not None:
                return
            outcome = _OUTCOMES.get(dlv.remote_state, str(dlv.remote_state))
            view.outcomes[index] = (outcome, condition_name(dlv.remote.condition))
            dlv.settle()

    def on_transport_error(self, event: Any) -> None:
        if not self.peer._closing:
            self.peer.view.errors.append(("transport", condition_name(event.transport.condition)))

    def on_transport_closed(self, event: Any) -> None:
        self.peer.view.disconnected = True


def with_credentials(url: str, user: str, password: str) -> str:
    """`url` with user:password in it (replacing any already there)."""
    u = urllib.parse.urlsplit(url)
    host = u.hostname or "127.0.0.1"
    netloc = f"{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}@{host}"
    if u.port:
        netloc += f":{u.port}"
    return urllib.parse.urlunsplit((u.scheme or "amqp", netloc, u.path, u.query, u.fragment))


class Peer:
    """One client connection, driven from the test thread.

    Every method returns once the reactor thread ran it; `wait(...)` polls the recorded views.
    Use as a context manager: leaving closes the connection and stops the thread.
    """

    def __init__(
        self,
        url: str,
        *,
        container_id: str | None = None,
        virtual_host: str | None = None,
        properties: dict[str, Any] | None = None,
        mechanisms: str | None = None,
        timeout: float = WAIT,
        wait_open: bool = True,
        heartbeat: float | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.container_id = container_id or f"peer-{uuid.uuid4().hex[:12]}"
        self.view = PeerView()
        self._views: dict[str, LinkView] = {}
        self._links: dict[str, Any] = {}
        self._deliveries: dict[str, list[Any]] = {}
        self._auto_accept: dict[str, bool] = {}
        self._detaching: dict[str, bool] = {}
        self._sent_index: dict[tuple[str, str], int] = {}
        self._closing = False
        self._calls: queue.Queue[Callable[[], None]] = queue.Queue()
        self._injector = EventInjector()
        self._container = Container(_PeerHandler(self))
        self._container.container_id = self.container_id
        self._container.selectable(self._injector)
        self._crash: str | None = None
        self._conn: Any = None
        self._session: Any = None
        self._thread = threading.Thread(target=self._loop, name=f"peer-{self.container_id}", daemon=True)
        self._thread.start()
        kwargs: dict[str, Any] = {"reconnect": False, "container_id": self.container_id}
        # Proton's SASL client takes the first mechanism the server offers that it supports:
        # RabbitMQ offers ANONYMOUS first, so credentials in the URL would silently go unused.
        # A client with a user and password authenticates with PLAIN, as a broker's users do.
        if mechanisms is None and urllib.parse.urlsplit(url).username:
            mechanisms = "PLAIN"
        if mechanisms is not None:
            kwargs["allowed_mechs"] = mechanisms
        if virtual_host is not None:
            kwargs["virtual_host"] = virtual_host
        if properties is not None:
            kwargs["properties"] = properties
        if heartbeat is not None:  # the idle timeout the open frame says
            kwargs["heartbeat"] = heartbeat

        def connect() -> None:
            self._conn = self._container.connect(url, **kwargs)

        self.call(connect)
        if wait_open:
            self.wait(lambda: self.view.remote_opened or self.ended)

    # -- plumbing -----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._container.run()
        except Exception as e:  # recorded: a crash of the client machinery fails the scenario
            self._crash = f"{type(e).__name__}: {e}"

    def _run_calls(self) -> None:
        while True:
            try:
                fn = self._calls.get_nowait()
            except queue.Empty:
                return
            fn()

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` in the reactor thread and return its result."""
        if not self._thread.is_alive():
            raise ScenarioError(f"client thread of {self.container_id} is gone ({self._crash})")
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            try:
                box.append((True, fn()))
            except Exception as e:
                box.append((False, e))
            finally:
                done.set()

        self._calls.put(run)
        self._injector.trigger(ApplicationEvent("peer_call"))
        if not done.wait(10):
            raise ScenarioError(f"reactor of {self.container_id} did not run a call within 10 s ({self._crash})")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def wait(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Poll `predicate` (reading views only) until true or the deadline; returns the last value."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return bool(predicate())
            time.sleep(0.01)

    @property
    def ended(self) -> bool:
        """The connection is over from the client's point of view (closed by the peer or lost)."""
        return self.view.disconnected or any(level in ("connection", "transport") for level, _ in self.view.errors)

    # -- endpoints ----------------------------------------------------------------------------

    def _default_session(self) -> Any:
        if self._session is None:
            self._session = self._conn.session()
            self._session.open()
        return self._session

    def sender(
        self, address: str | None, *, name: str | None = None, new_session: bool = False, dynamic: bool = False
    ) -> LinkView:
        """Attach a sender (at-least-once) to `address` (None: the anonymous relay; with
        dynamic=True, a target the broker is asked to make)."""
        name = name or f"sender-{uuid.uuid4().hex[:8]}"

        def attach() -> LinkView:
            ssn = self._conn.session() if new_session else self._default_session()
            if new_session:
                ssn.open()
            link = ssn.sender(name)
            link.target.address = address
            link.target.dynamic = dynamic
            link.source.address = name
            view = self._views[name] = LinkView(name, is_sender=True)
            self._links[name] = link
            link.open()
            return view

        return self.call(attach)

    def receiver(
        self,
        address: str,
        *,
        name: str | None = None,
        credit: int = 0,
        auto_accept: bool = True,
        durable: bool = False,
        new_session: bool = False,
    ) -> LinkView:
        """Attach a receiver from `address` and grant `credit` at once (0: none yet).

        durable=True asks for a durable subscription: unsettled-state durability, expiry never.
        auto_accept=False keeps deliveries unsettled until `settle` is called.
        """
        name = name or f"receiver-{uuid.uuid4().hex[:8]}"

        def attach() -> LinkView:
            ssn = self._conn.session() if new_session else self._default_session()
            if new_session:
                ssn.open()
            link = ssn.receiver(name)
            link.source.address = address
            link.target.address = name
            if durable:
                link.source.durability = Terminus.DELIVERIES
                link.source.expiry_policy = Terminus.EXPIRE_NEVER
            view = self._views[name] = LinkView(name, is_sender=False, credit=credit)
            self._links[name] = link
            self._auto_accept[name] = auto_accept
            link.open()
            if credit:
                link.flow(credit)
            return view

        return self.call(attach)

    def send(self, link: LinkView, message: Message) -> int:
        """Send `message` unsettled on `link` (buffered by Proton until there is credit);
        returns its index in `link.outcomes`."""

        def do() -> int:
            index = len(link.outcomes)
            link.outcomes.append(None)
            dlv = self._links[link.name].send(message)
            self._sent_index[(link.name, dlv.tag)] = index
            return index

        return self.call(do)

    def flow(self, link: LinkView, credit: int) -> None:
        def do() -> None:
            self._links[link.name].flow(credit)
            link.credit = self._links[link.name].credit

        self.call(do)

    def drain(self, link: LinkView, credit: int) -> None:
        """Grant `credit` with drain on: the sender must use it or hand it back at once."""

        def do() -> None:
            link.drain_requested = True
            link.drained = False
            self._links[link.name].drain(credit)

        self.call(do)

    def settle(self, link: LinkView, index: int, outcome: str, *, delivery_failed: bool = False) -> None:
        """Settle the index-th delivery received on `link` with accepted / released / rejected /
        modified (with delivery-failed if asked)."""

        def do() -> None:
            dlv = self._deliveries[link.name][index]
            if outcome == "modified":
                dlv.local.failed = delivery_failed
            state = {v: k for k, v in _OUTCOMES.items()}[outcome]
            dlv.update(state)
            dlv.settle()

        self.call(do)

    def update(self, link: LinkView, index: int, outcome: str) -> None:
        """Give the index-th delivery received on `link` an outcome and leave it unsettled
        (the peer may settle it)."""

        def do() -> None:
            state = {v: k for k, v in _OUTCOMES.items()}[outcome]
            self._deliveries[link.name][index].update(state)

        self.call(do)

    def settled_by_peer(self, link: LinkView, index: int) -> str | None:
        """The outcome the peer settled the index-th delivery received on `link` with,
        or None while the peer has not settled it."""

        def read() -> str | None:
            dlv = self._deliveries[link.name][index]
            return _OUTCOMES.get(dlv.remote_state, str(dlv.remote_state)) if dlv.settled else None

        return self.call(read)

    def detach(self, link: LinkView, *, close: bool = True, wait: bool = True) -> bool:
        """End a link: close=True is a closing detach, False a plain detach (a durable
        subscription survives it). Returns True when the peer answered in time."""

        def do() -> None:
            self._detaching[link.name] = True
            lnk = self._links[link.name]
            if close:
                lnk.close()
            else:
                lnk.detach()

        self.call(do)
        return self.wait(lambda: link.remote_closed is not None or self.ended) if wait else True

    def close(self, timeout: float = 3.0) -> None:
        """Close the connection (waiting briefly for the peer's close), then stop the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(ScenarioError):

            def do() -> None:
                self._closing = True
                if self._conn is not None and self._conn.state & self._conn.LOCAL_ACTIVE:
                    self._conn.close()

            self.call(do)
            self.wait(lambda: self.view.disconnected, timeout)

        with contextlib.suppress(ScenarioError):
            self.call(self._container.stop)
        self._injector.close()
        self._thread.join(5)

    def abort(self) -> None:
        """Stop at once without a close handshake (the client process "goes away")."""
        with contextlib.suppress(ScenarioError):

            def do() -> None:
                self._closing = True
                self._container.stop()

            self.call(do)
        self._injector.close()
        self._thread.join(5)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def message(body: Any, **fields: Any) -> Message:
    """A Message with `body` and any other Message attribute set by keyword."""
    m = Message(body=body)
    for key, value in fields.items():
        setattr(m, key, value)
    return m


def bodies(link: LinkView) -> list[Any]:
    return [r.body for r in link.received]


# --- bystander -------------------------------------------------------------------------------


class Bystander:
    """A separate client doing send/receive round trips on its own queue while a scenario runs.

    Start it (it connects and completes a first round trip), run the scenario, then `result()`:
    it keeps going until at least `count` round trips are done, does one more after the scenario,
    and answers "N round trips completed" when every one of them finished within `WAIT` seconds,
    or how it stalled. That string is what two runs compare.
    """

    def __init__(self, url: str, count: int = 5, pace: float = 0.05) -> None:
        self.url = url
        self.count = count
        self.pace = pace
        self.address = f"bystander-{uuid.uuid4().hex[:10]}"
        self.done = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bystander", daemon=True)

    def __enter__(self) -> Bystander:
        self._thread.start()
        if not self._started.wait(2 * WAIT + 5):
            self.error = self.error or "did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(3 * WAIT)

    def _run(self) -> None:
        try:
            with Peer(self.url) as peer:
                if not peer.view.remote_opened:
                    self.error = f"not opened: {peer.view.errors}"
                    return
                receiver = peer.receiver(self.address)
                sender = peer.sender(self.address)
                final = False
                while True:
                    index = len(receiver.received)
                    peer.flow(receiver, 1)
                    peer.send(sender, message(f"round-trip-{index}"))
                    if not peer.wait(lambda i=index: len(receiver.received) > i):  # type: ignore[misc]
                        self.error = f"round trip {index + 1} did not come back within {WAIT}s: {peer.view.errors}"
                        return
                    if receiver.received[index].body != f"round-trip-{index}":
                        self.error = f"round trip {index + 1} came back as {receiver.received[index].body!r}"
                        return
                    self.done += 1
                    self._started.set()
                    if final:
                        return
                    if self._stop.is_set() and self.done >= self.count:
                        final = True  # one more, after the scenario
                    else:
                        time.sleep(self.pace)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._started.set()

    def result(self) -> str:
        """Wait for the last round trip and return the comparable summary."""
        self._stop.set()
        self._thread.join(3 * WAIT)
        if self._thread.is_alive():
            return f"stalled after {self.done} round trips (still running)"
        if self.error is not None:
            return f"stalled after {self.done} round trips: {self.error}"
        return f"{self.count}+ round trips completed"


# --- direct and through ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a scenario's clients connect: `url` (with the broker's own credentials, so the
    client identity is the same either way), and the broker behind it for broker-side checks."""

    url: str
    broker: Broker
    through: bool

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return urllib.parse.urlsplit(self.url).port or 5672

    def url_as(self, user: str, password: str) -> str:
        return with_credentials(self.url, user, password)


def run_both(
    scenario: Callable[[Target], T], broker: Broker, start_router: Callable[..., RouterProcess]
) -> tuple[T, T]:
    """Run `scenario` once against `broker` directly, then once through a fresh qpid-flow in
    front of it; return (direct, through). Clients send the same credentials both ways."""
    direct = scenario(Target(broker.url, broker, through=False))
    router = start_router(broker_url=broker.url)
    through = scenario(Target(with_credentials(router.url, broker.user, broker.password), broker, through=True))
    return direct, through


# --- the broker's own view -------------------------------------------------------------------


def ctl(broker: Broker, *args: str) -> str:
    """`rabbitmqctl ARGS` on the test broker; stdout. Fails clearly on a broker the harness does
    not run (QPID_FLOW_TEST_BROKER_URL), where there is no rabbitmqctl to call."""
    run = getattr(broker, "ctl", None)
    if run is None:
        raise ScenarioError(f"{type(broker).__name__} has no rabbitmqctl; this scenario needs the harness's broker")
    result: subprocess.CompletedProcess[str] = run(*args)
    if result.returncode != 0:
        raise ScenarioError(f"rabbitmqctl {' '.join(args)}: rc={result.returncode}\n{result.stderr}")
    return result.stdout


def ctl_rows(broker: Broker, *args: str) -> list[dict[str, Any]]:
    """A `rabbitmqctl list_*` command's rows as dicts (its JSON formatter)."""
    out = ctl(broker, *args, "--formatter", "json")
    rows: list[dict[str, Any]] = json.loads(out or "[]")
    return rows


def open_connections_of(broker: Broker, user: str) -> int:
    """How many connections the broker holds for `user` right now (AMQP 1.0 connections are not
    in `list_connections` on RabbitMQ 3.10, but its connection tracking has them)."""
    quoted = user.replace("\\", "\\\\").replace('"', '\\"')
    # tracked_connection records: element 11 is the user name.
    expr = f'length([C || C <- rabbit_connection_tracking:list(), element(11, C) =:= <<"{quoted}">>]).'
    out = ctl(broker, "eval", expr)
    return int(out.strip())


_LOGIN = re.compile(r"^(\S+ \S+) \[info\] <[^>]*> AMQP 1\.0 connection (<[^>]*>): user '([^']*)' authenticated")


def amqp10_logins_since(broker: Broker, since: float) -> list[str]:
    """Users of the AMQP 1.0 connections the broker accepted after wall-clock time `since`, one
    per connection, in order, from its log ("AMQP 1.0 connection <pid>: user 'U' authenticated",
    logged at SASL and again at the first session). A connection that lives a few milliseconds
    (a reconnect loop) is in the log even when no sample of the broker's connection list could
    catch it."""
    users: dict[str, str] = {}
    for line in broker.log_tail(20_000).splitlines():
        m = _LOGIN.match(line)
        if m is None:
            continue
        with contextlib.suppress(ValueError):
            if datetime.fromisoformat(m.group(1)).timestamp() > since:
                users.setdefault(m.group(2), m.group(3))
    return list(users.values())


def subscription_queues(broker: Broker, exchange: str, key: str | None = None) -> list[str]:
    """Names of the server-named queues (amq.gen-*) RabbitMQ bound to `exchange` (with routing
    key `key` if given): what a `/topic/...` or `/exchange/...` receiver got, and what is left of
    it after it detached."""
    rows = ctl_rows(broker, "list_bindings", "source_name", "destination_name", "routing_key")
    return sorted(
        r["destination_name"]
        for r in rows
        if r["source_name"] == exchange
        and str(r["destination_name"]).startswith("amq.gen-")
        and (key is None or r["routing_key"] == key)
    )


def queue_rows(broker: Broker, names: list[str]) -> list[tuple[bool, int]]:
    """(durable, messages) of each named queue, sorted: comparable whatever the generated names."""
    rows = ctl_rows(broker, "list_queues", "name", "durable", "messages")
    wanted = set(names)
    return sorted((bool(r["durable"]), int(r["messages"])) for r in rows if r["name"] in wanted)


def delete_queues(broker: Broker, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(ScenarioError):
            ctl(broker, "delete_queue", name)


# --- other client libraries ------------------------------------------------------------------


def run_c_examples(examples: ProtonCExamples, host: str, port: int, address: str, count: int) -> dict[str, Any]:
    """Send `count` messages with Proton C's `send`, then receive them with `receive`; return
    what each printed that is comparable (exit codes, the summary lines, the bodies)."""
    sent = subprocess.run(
        [str(examples.send), host, str(port), address, str(count)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    got = subprocess.run(
        [str(examples.receive), host, str(port), address, str(count)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = got.stdout.splitlines()
    return {
        "send_rc": sent.returncode,
        "send_summary": sent.stdout.strip().splitlines()[-1:] if sent.stdout.strip() else [],
        "receive_rc": got.returncode,
        "receive_summary": [ln for ln in lines if "messages received" in ln],
        "bodies": [ln for ln in lines if "sequence" in ln],
    }


def rhea_available() -> Path:
    """The rhea client script, after checking node and the rhea package are installed."""
    script = RHEA_DIR / "client.js"
    if not (RHEA_DIR / "node_modules" / "rhea").is_dir():
        raise ScenarioError(f"rhea is not installed in {RHEA_DIR}/node_modules; run `bash .ci/install-deps`")
    return script


def run_rhea(url: str, *args: str, timeout: float = 30, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the rhea client (`node client.js URL ARGS`) and return its JSON report; ``env``
    adds variables (RHEA_TLS_CA, RHEA_TLS_CERT, RHEA_TLS_KEY for amqps URLs)."""
    script = rhea_available()
    proc = subprocess.run(
        ["node", str(script), url, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "NODE_PATH": str(RHEA_DIR / "node_modules"), **(env or {})},
    )
    try:
        report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as e:
        raise ScenarioError(f"rhea client printed no JSON (rc={proc.returncode}): {proc.stdout}\n{proc.stderr}") from e
    return report
