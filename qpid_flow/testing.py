"""Test helpers for plugin authors, shipped as a pytest plugin (entry point ``pytest11``, as
tox ships ``tox.pytest``): installed with qpid-flow, active in every pytest run.

Plain values to call hooks with, no network::

    from qpid_flow.testing import make_destination, make_message, make_producer

    def test_big_messages_are_refused(qpid_flow_plugin_hooks):
        hooks = qpid_flow_plugin_hooks(my_policy.plugin)
        destination = make_destination("small.orders", hooks=hooks)
        answer = hooks.transfer_arrived(
            producer=make_producer("small.orders"), message=make_message(b"x" * 2_000_000), destination=destination
        )
        assert answer.description.startswith("small.orders")

A real standalone qpid-flow with the plugin loaded, on a free port::

    def test_it_loads(qpid_flow_router):
        router = qpid_flow_router(plugins=["my_policy"], config_text='[plugins.my_policy]\\nlimit = 3\\n')
        # connect AMQP clients to router.url; router.log_text() holds its JSON log

The fixture stops every router it started when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from qpid_flow.config import DestinationPolicy, RouterConfig, build_config, is_pattern
from qpid_flow.core.destination import Destination
from qpid_flow.core.dialect import Dialect
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Consumer, Message, Producer
from qpid_flow.plugin.manager import Hooks, build_plugin_manager, module_plugin, refused_as, require_hooks

__all__ = [
    "ManualControl",
    "RouterProcess",
    "RouterStartError",
    "free_ports",
    "make_consumer",
    "make_destination",
    "make_hooks",
    "make_message",
    "make_producer",
    "start_router",
]


# --- plain values ------------------------------------------------------------------------


def make_hooks(*plugins: object, config: RouterConfig | Mapping[str, Any] | None = None) -> Hooks:
    """The hooks of qpid-flow's own plugins plus ``plugins``, configured as at start (each
    plugin's ``qpid_flow_configure`` runs; ``config`` is a RouterConfig or a parsed TOML
    table, default: none). Other installed plugins (entry points, ``$QPID_FLOW_PLUGINS``)
    are left out, so a test sees only the plugins it names; a plugin installed through an
    entry point may be passed as it is. A module is loaded as ``QPID_FLOW_PLUGINS`` loads
    it (its ``plugin`` object when it has one); a plugin implementing no hook raises
    ConfigError, as it stops qpid-flow's start."""
    table = {} if isinstance(config, RouterConfig) or config is None else dict(config)
    disabled = config.disable_plugins if isinstance(config, RouterConfig) else table.get("disable_plugins", ())
    pm = build_plugin_manager(disabled, installed=False)
    for index, given in enumerate(plugins):
        plugin = module_plugin(given, pm) if isinstance(given, types.ModuleType) else given
        if not pm.is_registered(plugin):
            with refused_as("make_hooks", pm):
                pm.register(plugin, name=f"{type(plugin).__name__.lower()}-{index}")
            require_hooks(pm, plugin, "make_hooks")
    with refused_as("make_hooks", pm):
        pm.check_pending()  # a hook name misspelt: refused at start, so here too
    if not isinstance(config, RouterConfig):
        config = build_config(table, plugins=pm)
    Hooks(pm, through_pluggy=False).configure(config=config, manager=pm)
    return Hooks(pm)


def make_destination(
    address: str = "q",
    *,
    hooks: Hooks | None = None,
    memory: MemoryMeter | None = None,
    **settings: Any,
) -> Destination:
    """A destination as the router builds one: ``settings`` are its policy's values by key
    (``max_count=1000``, ``shared_groups=True``, a plugin's own keys), already parsed.
    Plugins hear ``qpid_flow_destination_created`` as when a client first uses it."""
    hooks = hooks or make_hooks()
    destination = Destination(address, DestinationPolicy.of(pattern=address, **settings), hooks, memory=memory)
    hooks.destination_created(destination=destination)
    return destination


def make_producer(address: str | None = "q", *, name: str = "", connection_id: str = "") -> Producer:
    """A producer link (``address`` None: an anonymous-relay link)."""
    return Producer(address, name=name or f"producer-{address}", connection_id=connection_id)


def make_consumer(
    address: str = "q",
    *,
    credit: int = 0,
    deliver: Callable[[Consumer, Message], None] | None = None,
    name: str = "",
    connection_id: str = "",
) -> Consumer:
    """A consumer link holding ``credit``; what it is sent goes to ``deliver`` (default:
    kept unsettled in ``consumer.held``, as a client that has not settled yet)."""
    consumer = Consumer(address, deliver or (lambda _consumer, _message: None), name=name, connection_id=connection_id)
    consumer.credit = credit
    return consumer


def make_message(
    body: Any = "",
    address: str = "q",
    *,
    group_id: str | None = None,
    properties: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Message:
    """A message as a producer sends it: really encoded (AMQP 1.0), so the fields a policy
    reads (``group_id()``, application properties) are read from the bytes as in the
    router. ``fields``: ``subject``, ``message_id``, ``ttl``, ``durable``."""
    from qpid_flow.amqp.messages import encode_message

    return Message(encode_message(body, group_id=group_id, properties=properties, **fields), address)


class ManualControl:
    """Stands in for the control object a plugin gets in ``qpid_flow_started``, with time
    in the test's hands: timers wait until :meth:`advance` passes their delay.

    Standalone by default; ``dialect=qpid_flow.core.dialect.RABBITMQ`` names addresses as
    in front of RabbitMQ (``/queue/X`` is queue ``X``: :meth:`destination_name`,
    :meth:`address_forms`)."""

    def __init__(
        self,
        destinations: Iterable[Destination] = (),
        memory_limit: int = 0,
        hooks: Hooks | None = None,
        dialect: Dialect | None = None,
    ):
        self._dialect = dialect
        self._destinations = {d.address: d for d in destinations}
        self.memory = MemoryMeter(memory_limit)
        self.hooks = hooks or make_hooks()
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], Any]]] = []
        self.woken: list[str | None] = []

    def add(self, destination: Destination) -> None:
        self._destinations[destination.address] = destination

    def call_from_thread(self, callback: Callable[[], Any]) -> None:
        callback()  # the test is the reactor thread

    def schedule(self, delay: float, callback: Callable[[], Any]) -> None:
        self.timers.append((self.now + delay, callback))

    def advance(self, seconds: float) -> None:
        """Move time on, running every timer that falls due, in order."""
        self.now += seconds
        while True:
            due = sorted((t for t in self.timers if t[0] <= self.now), key=lambda t: t[0])
            if not due:
                return
            self.timers.remove(due[0])
            due[0][1]()

    def destination(self, address: str) -> Destination | None:
        found = self._destinations.get(address)
        return found if found is not None else self._destinations.get(self.destination_name(address))

    def destination_name(self, address: str) -> str:
        if self._dialect is None or is_pattern(address):
            return address  # standalone: an address is its destination's name
        node = self._dialect.node(address)
        return node.name if node.is_queue else address

    def address_forms(self, name: str) -> tuple[str, ...]:
        return self._dialect.address_forms(name) if self._dialect is not None else (name,)

    def destinations(self) -> Iterator[Destination]:
        return iter(list(self._destinations.values()))

    def wake(self, address: str | None = None) -> None:
        self.woken.append(address)
        targets = [self.destination(address)] if address else list(self._destinations.values())
        for destination in targets:
            if destination is not None:
                destination.dispatch()

    def held_transfers(self, address: str) -> int:
        return 0

    def held_messages(self, address: str) -> list[Message]:
        return []

    def delayed_producers(self, address: str) -> int:
        return 0

    def waiting_producers(self, address: str) -> set[int]:
        return set()


# --- a real qpid-flow --------------------------------------------------------------------


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago: every socket is held open
    until all are picked, so one call never repeats a port."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class RouterStartError(AssertionError):
    """qpid-flow exited or did not listen in time (the message holds its log's tail)."""


class RouterProcess:
    """One qpid-flow process listening on 127.0.0.1:port; its output goes to ``log_path``."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, log_path: Path, argv: list[str]) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path
        self.argv = argv

    @property
    def url(self) -> str:
        return f"amqp://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def resident_bytes(self) -> int:
        """The process's resident memory now (Linux /proc)."""
        pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")

    def peak_resident_bytes(self) -> int:
        """The most resident memory the process has had (Linux /proc VmHWM): unlike the
        resident memory now, not blurred by what the allocator keeps after a free."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/PID/status")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Send ``sig`` and wait up to ``timeout`` s; SIGKILL if it is still alive. Returns the
        exit code (negative: killed by that signal, as in subprocess)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reap_group()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (crash simulation)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)
        self._reap_group()

    def _reap_group(self) -> None:
        # Anything qpid-flow spawned (the event log's writer) shares its session.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<RouterProcess pid={self.pid} {self.url} rc={self.returncode}>"


def _wait_for_listening(log_path: Path, timeout: float, alive: Callable[[], bool]) -> bool:
    # qpid-flow's own "listening" event: probing the port with a bare TCP connect would put
    # a framing error in the log under test.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        if '"event": "listening"' in log_path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


def start_router(
    workdir: Path,
    broker_url: str | None = None,
    config_text: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    plugins: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    start_timeout: float = 30.0,
    python: str = sys.executable,
    port: int | None = None,
) -> RouterProcess:
    """Run ``python -m qpid_flow serve --listen 127.0.0.1:PORT [--broker URL] [--config F]
    EXTRA...`` on a free port (or ``port``) with the modules ``plugins`` loaded
    (``QPID_FLOW_PLUGINS``), JSON logs in ``workdir``; return once it listens."""
    port = port or free_ports(1)[0]
    # One folder per router (several may run in one test), named by port so logs never mix.
    workdir = workdir / f"qpid-flow-{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "qpid_flow", "serve", "--listen", f"127.0.0.1:{port}"]  # JSON logs: not a TTY
    if broker_url:
        argv += ["--broker", broker_url]
    if config_text is not None:
        config_path = workdir / "qpid-flow.toml"
        config_path.write_text(config_text)
        argv += ["--config", str(config_path)]
    argv += list(extra_args)
    log_path = workdir / "qpid-flow.log"
    # The test's working directory (pytest's rootdir, usually) on PYTHONPATH: a plugin module
    # that is not installed loads as it does in the test (the child runs in ``workdir``).
    pythonpath = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})}
    if plugins:
        loaded = [name for name in child_env.get("QPID_FLOW_PLUGINS", "").split(",") if name]
        child_env["QPID_FLOW_PLUGINS"] = ",".join([*loaded, *plugins])
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=workdir,
            start_new_session=True,
        )
    router = RouterProcess(proc, "127.0.0.1", port, log_path, argv)
    started = time.monotonic()
    if not _wait_for_listening(log_path, start_timeout, alive=lambda: proc.poll() is None):
        code = proc.poll()
        router.stop(timeout=5)
        why = f"exited with code {code}" if code is not None else f"did not listen within {start_timeout:.0f}s"
        raise RouterStartError(
            f"qpid-flow {why} after {time.monotonic() - started:.1f}s\n--- {log_path} (tail) ---\n{router.log_tail()}"
        )
    return router


# --- pytest fixtures ---------------------------------------------------------------------


@pytest.fixture
def qpid_flow_router(tmp_path: Path) -> Iterator[Callable[..., RouterProcess]]:
    """A factory: ``qpid_flow_router(plugins=["my_policy"], config_text=..., broker_url=...,
    extra_args=[...])`` starts a real qpid-flow (standalone unless ``broker_url``) with those
    plugin modules loaded, and returns its :class:`RouterProcess` once it listens. Every
    router started is stopped when the test ends."""
    started: list[RouterProcess] = []

    def start(**options: Any) -> RouterProcess:
        router = start_router(tmp_path, **options)
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()


@pytest.fixture
def qpid_flow_plugin_hooks() -> Callable[..., Hooks]:
    """A factory: ``qpid_flow_plugin_hooks(plugin, config={...})`` is :func:`make_hooks`."""
    return make_hooks
