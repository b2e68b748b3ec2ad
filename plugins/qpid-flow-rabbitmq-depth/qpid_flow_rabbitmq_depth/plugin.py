"""The hooks: wire the worker thread to the router.

In front of a broker, qpid-flow only counts what passed through it; a backlog already in
RabbitMQ (left by an earlier run, or by producers that bypass qpid-flow) is invisible to
flow control. This plugin reads each queue's real ready count and hands it to the
destination (``Destination.set_broker_backlog``), which re-evaluates flow control.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from qpid_flow import hookimpl
from qpid_flow.config import is_pattern
from qpid_flow.security.tls import broker_context

from qpid_flow_rabbitmq_depth.reader import DepthReader, PikaDepthReader
from qpid_flow_rabbitmq_depth.settings import PLUGIN_NAME, Settings, check_settings, parse_settings
from qpid_flow_rabbitmq_depth.worker import DepthWorker

if TYPE_CHECKING:
    from qpid_flow.config import RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.plugin.control import RouterControl

__all__ = ["RabbitMQDepth"]

log = structlog.get_logger(__name__)

# How long qpid_flow_stopping waits for the worker: it wakes at once unless it is inside
# a broker call (bounded by the socket timeout); a daemon thread cannot hold the exit.
JOIN_TIMEOUT = 1.0


def _pika_reader(settings: Settings) -> DepthReader:
    return PikaDepthReader.from_parameters(settings.connection_parameters())


class RabbitMQDepth:
    """The plugin object (``qpid_flow_rabbitmq_depth:plugin``)."""

    def __init__(
        self, reader_factory: Callable[[Settings], DepthReader] = _pika_reader, *, threaded: bool = True
    ) -> None:
        """``reader_factory`` and ``threaded=False`` are test seams: a fake reader, and a
        worker the test steps through itself (``plugin.worker.poll_once()``)."""
        self._reader_factory = reader_factory
        self._threaded = threaded
        self.settings: Settings | None = None  # None: standalone, the plugin does nothing
        self.worker: DepthWorker | None = None
        self._control: RouterControl | None = None
        self._thread: threading.Thread | None = None

    @hookimpl
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        table = config.plugin_settings(PLUGIN_NAME)
        if config.broker is None:
            check_settings(table)  # a bad value stops the start in this mode too
            self.settings = None  # standalone: qpid-flow's own count is the real depth
            return
        # The first broker of the failover list: the one qpid-flow tries first.
        settings = parse_settings(table, config.broker_addresses[0].url)
        if settings.uses_tls:
            # qpid-flow's own broker TLS settings: a broker signed by a private CA
            # (broker_tls_ca) is trusted here too, a client certificate is presented.
            settings = dataclasses.replace(settings, ssl_context=broker_context(config))
        self.settings = settings
        # Built now, so destinations created before the thread starts are not missed.
        self.worker = DepthWorker(
            self._reader_factory(self.settings),
            self._deliver,
            self.settings.interval,
            broker=self.settings.display_url,
        )
        self._watch_configured(config, self.worker)

    @staticmethod
    def _watch_configured(config: RouterConfig, worker: DepthWorker) -> None:
        """Read the destinations named in the configuration from the worker's first poll.

        The router creates them only after qpid_flow_started, when the worker thread has
        already made its first poll (with nothing to read); added by
        qpid_flow_destination_created they would wait FRESH_DELAY, and a backlog present at
        start would count only a second later. No client can attach before the router
        runs, so no attach is declaring their queues for the read to race."""
        for name in config.destinations:
            if not is_pattern(name):
                worker.add(name, read_at_once=True)

    @hookimpl
    def qpid_flow_started(self, control: RouterControl) -> None:
        if self.worker is None or self._thread is not None:
            return
        self._control = control
        if not self._threaded:
            return
        self._thread = threading.Thread(target=self.worker.run, name="qpid-flow-rabbitmq-depth", daemon=True)
        self._thread.start()
        log.info("rabbitmq_depth_started", broker=self.settings.display_url if self.settings else None)

    @hookimpl
    def qpid_flow_destination_created(self, destination: Destination) -> None:
        if self.worker is not None:
            self.worker.add(destination.address)  # ignored unless it names one queue

    @hookimpl
    def qpid_flow_stopping(self) -> None:
        if self.worker is None:
            return
        self.worker.stop()  # the worker closes its own pika connection (pika is not thread-safe)
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT)
            if self._thread.is_alive():
                log.warning("rabbitmq_depth_stop_timeout", waited=JOIN_TIMEOUT)
            self._thread = None

    # --- worker thread -> reactor thread ------------------------------------------------------

    def _deliver(self, address: str, ready: int) -> None:
        """Worker thread: hand one reading to the reactor (the only thread-safe entry)."""
        if self._control is not None:
            self._control.call_from_thread(functools.partial(self._apply, address, ready))

    def _apply(self, address: str, ready: int) -> None:
        """Reactor thread: the destination is looked up here, where it may be touched."""
        if self._control is None:
            return
        destination = self._control.destination(address)
        if destination is None:
            # Forgotten since (no producers, consumers or messages left): stop reading it. If
            # the address is used again, qpid_flow_destination_created adds it back.
            if self.worker is not None:
                self.worker.discard(address)
            return
        destination.set_broker_backlog(ready)
