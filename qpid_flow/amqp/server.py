"""Assemble and run the router: plugins, destinations, backend, listener, signals.

Shutdown on SIGINT / SIGTERM / SIGHUP, in this order: stop accepting connections and stop
granting credit; wait (up to ``shutdown_timeout``) for the outcomes of transfers
already forwarded, so producers learn them; release everything consumers hold and
everything fetched ahead from the broker; close every connection; stop.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog
from proton import Handler
from proton.reactor import Container

from qpid_flow.admin.http import AdminServer
from qpid_flow.admin.operations import Operations
from qpid_flow.amqp.bridge import ReactorBridge
from qpid_flow.amqp.gate import Gate
from qpid_flow.amqp.linkroute import BrokerRouter
from qpid_flow.amqp.reactor import RelayContainer
from qpid_flow.amqp.router import SHUTTING_DOWN, Router
from qpid_flow.amqp.timers import Call
from qpid_flow.amqp.upstream import GroupReader
from qpid_flow.config import RouterConfig, declared_settings
from qpid_flow.core.backend import Backend
from qpid_flow.core.memory import MESSAGE_OVERHEAD, MemoryMeter
from qpid_flow.core.registry import Destinations
from qpid_flow.core.standalone import StandaloneBackend
from qpid_flow.plugin.control import RouterControl
from qpid_flow.plugin.manager import Hooks, build_plugin_manager, disabled_plugins, loaded_plugins
from qpid_flow.security.auth import Authenticator
from qpid_flow.security.tls import broker_context, listener_context

__all__ = ["Server"]

log = structlog.get_logger(__name__)

_SHUTDOWN_POLL = 0.05
# How often waiting messages are checked for expiry (a message is also checked when it is
# about to be delivered, so a consumer never gets an expired one whatever this is).
_HOUSEKEEPING_INTERVAL = 1.0


class ListenError(OSError):
    """A client listener's address (``listen``) cannot be bound."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))


class Server(Handler):
    """Owns the container and everything that runs in it."""

    def __init__(self, config: RouterConfig) -> None:
        super().__init__()
        plugins = build_plugin_manager(config.disable_plugins)
        # The keys a runtime policy change may use are those of the plugins loaded here.
        declared = declared_settings(s for group in plugins.hook.qpid_flow_destination_settings() for s in group)
        config = dataclasses.replace(config, destination_settings=declared)
        self.config = config
        # configure always goes through pluggy; tracing (QPID_FLOW_TRACE_HOOKS) is switched on
        # once, by the facade below.
        Hooks(plugins, through_pluggy=False).configure(config=config, manager=plugins)
        # Bound after configuration (a plugin may have left): a notification nobody
        # implements costs nothing.
        self.hooks = Hooks(plugins)
        self.container = RelayContainer(container_id=f"qpid-flow-{socket.gethostname()}-{os.getpid()}")
        self.memory = MemoryMeter(config.memory_limit, per_message=MESSAGE_OVERHEAD)
        self.destinations = Destinations(config, self.hooks, self.memory)
        self.router: Router
        self.group_reader: GroupReader | None = None
        if config.broker is None:
            self.router = Router(config, self.hooks, self.destinations, StandaloneBackend(), self.memory)
        else:
            # In front of a broker: every client mirrored on a connection of its own
            # (linkroute); qpid-flow's own connection reads grouped destinations.
            self.group_reader = GroupReader(
                self.container,
                config,
                self.destinations,
                on_link_failed=lambda *failure: self.router.upstream_link_failed(*failure),
                on_holders_lost=lambda address, consumer_ids: self.router.reader_lost_for(address, consumer_ids),
                on_broker_lost=lambda: self.router.broker_lost(),
            )
            self.router = BrokerRouter(config, self.hooks, self.destinations, self.group_reader, self.memory)
        self.router.container_id = self.container.container_id
        self.backend: Backend = self.router.backend
        self.bridge = ReactorBridge()
        # TLS contexts and the users file are read now: a bad file stops the start.
        self.listener_tls = listener_context(config)
        brokers = config.broker_addresses
        self.broker_tls = broker_context(config) if any(b.scheme == "amqps" for b in brokers) else None
        self.authenticator: Authenticator | None = None
        if config.broker is None:
            self.authenticator = Authenticator(
                config.users_file, config.anonymous_allowed, _load_users, self.bridge.call_soon
            )
        self.control = RouterControl(
            self._schedule, self.router, self.destinations, self.bridge, self.memory, self.hooks
        )
        self.gates: list[Gate] = []
        self.admin: AdminServer | None = None
        if config.admin is not None:
            operations = Operations(self.destinations, self.control, self.router, self.readiness)
            self.admin = AdminServer(
                config.admin,
                operations,
                self.bridge.call,
                routes=self.hooks.admin_routes(),
                token=config.admin_token,
                metrics_max_destinations=config.metrics_max_destinations,
            )
        self._deadline = 0.0
        self._stopping = False

    def run(self) -> None:
        self.container.handler = self.router
        self.container.selectable(self.bridge.injector)
        for scheme, host, port in self.config.listeners:
            try:
                self.gates.append(self._gate(host, port, self.listener_tls if scheme == "amqps" else None))
            except OSError as exc:
                raise ListenError(exc) from exc
        if isinstance(self.router, BrokerRouter):
            self.router.probe = self.gates[0].probe
        # SIGHUP too: its default ended the process on the spot (a closed terminal, a
        # `kill -HUP` meant as a reload, which qpid-flow has not), the event log's last
        # records and every held producer's outcome lost.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        if self.group_reader is not None:
            self.group_reader.start()
        self.hooks.started(control=self.control)
        if self.admin is not None:
            self.admin.start()  # after qpid_flow_started: plugins' routes have their control
        log.info(
            "listening",
            listen=self._listen_addresses(),
            admin=self._admin_address(),
            mode="standalone" if self.config.broker is None else "broker",
            plugins=loaded_plugins(self.hooks.pm),
            disabled=disabled_plugins(self.hooks.pm),
        )
        self.container.schedule(
            _HOUSEKEEPING_INTERVAL,
            _Housekeeping(
                self.container, self.destinations, self.config.destination_idle_timeout, self.router.waits_on
            ),
        )
        self.destinations.create_configured()
        # What start-up built (modules, plugins, configuration) lives as long as the
        # process: keep it out of the cyclic collector's full passes, which otherwise walk
        # it again every time, on top of every waiting message.
        gc.collect()
        gc.freeze()
        self.container.run()
        log.info("stopped")

    def _schedule(self, delay: float, callback: Callable[[], Any]) -> None:
        self.container.schedule(delay, Call(callback))

    def readiness(self) -> tuple[bool, str]:
        """Ready: listening for clients, not shutting down, and (in front of a broker)
        qpid-flow's own connection to the broker open (/readyz, ``qpid_flow_ready``)."""
        if self._stopping or not self.router.accepting:
            return False, "shutting down"
        if not self.gates:
            return False, "not listening yet"
        if self.group_reader is not None and not self.group_reader.connected:
            return False, "the broker is not reachable (qpid-flow's own connection to it is not open)"
        return True, "listening" if self.group_reader is None else "listening; the broker is reachable"

    def _gate(self, host: str, port: int, tls: Any) -> Gate:
        config = self.config
        if isinstance(self.router, BrokerRouter):
            return Gate(
                self.container,
                host,
                port,
                self.router,
                tls=tls,
                brokers=config.broker_addresses,
                broker_tls=self.broker_tls,
                on_pair=self.router.pair_opened,
                deadline=config.sasl_timeout,
                anonymous_user=config.broker_anonymous_user,
            )
        return Gate(
            self.container,
            host,
            port,
            self.router,
            tls=tls,
            sign_in=self.authenticator,
            on_client=self.router.client_opened,
            deadline=config.sasl_timeout,
            idle_timeout=config.idle_timeout,
        )

    def _listen_addresses(self) -> str:
        """The listeners as ``listen`` is written, with the ports in use (``HOST:0`` picks one)."""
        addresses = []
        for (scheme, host, _), gate in zip(self.config.listeners, self.gates, strict=True):
            where = f"[{host}]:{gate.port}" if ":" in host else f"{host}:{gate.port}"
            addresses.append(where if scheme == "amqp" else f"{scheme}://{where}")
        return ",".join(addresses)

    def _admin_address(self) -> str | None:
        if self.admin is None or self.config.admin is None:
            return None
        return f"{self.config.admin.rsplit(':', 1)[0]}:{self.admin.port}"

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Signal handlers run between bytecodes: hand over to the reactor thread safely.
        self.bridge.call_soon(self._begin_shutdown)

    def _begin_shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("shutdown_started")
        self.hooks.stopping()
        self.router.accepting = False
        for gate in self.gates:
            gate.close()
        if self.authenticator is not None:
            self.authenticator.close()
        self._deadline = time.monotonic() + self.config.shutdown_timeout
        self.container.schedule(0, self)

    def on_timer_task(self, _event: Any) -> None:
        waiting = self.backend.in_flight()
        if waiting and time.monotonic() < self._deadline:
            self.container.schedule(_SHUTDOWN_POLL, self)
            return
        if waiting:
            log.warning("shutdown_outcomes_missing", transfers=waiting)
        self.router.release_consumers()
        self.router.give_delayed_outcomes()
        self.backend.shutdown()
        self.router.close_connections(SHUTTING_DOWN)
        if self.admin is not None:
            self.admin.stop()
        self.bridge.close()
        # Let the close frames go out, then end the loop even if a peer never answers.
        self.container.schedule(1.0, _Stop(self.container))


def _load_users(path: str) -> Any:
    from qpid_flow.security.users import UsersFile  # read only when a users file is configured

    return UsersFile.load(path)


class _Housekeeping(Handler):
    """Upkeep, once a second: expired messages leave (their room frees, so flow control
    can resume producers even with no consumer; standalone only, a broker expires its
    own), messages a failed consumer selection left waiting are handed out again, and
    auto-created destinations unused for ``idle_timeout`` are forgotten."""

    def __init__(
        self, container: Container, destinations: Destinations, idle_timeout: float, busy: Callable[[str], bool]
    ) -> None:
        super().__init__()
        self._container = container
        self._destinations = destinations
        self._idle_timeout = idle_timeout
        self._busy = busy  # the router still has transfers or settlements waiting on an address

    def on_timer_task(self, _event: Any) -> None:
        now = time.time()
        self._destinations.expire(now)
        self._destinations.dispatch_again(time.monotonic())
        if self._idle_timeout:
            self._destinations.forget_idle(time.monotonic(), self._idle_timeout, self._busy)
        self._container.schedule(_HOUSEKEEPING_INTERVAL, self)


class _Stop(Handler):
    def __init__(self, container: Container) -> None:
        super().__init__()
        self._container = container

    def on_timer_task(self, _event: Any) -> None:
        self._container.stop()
