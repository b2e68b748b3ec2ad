"""What plugins may do to a running router (handed to them by ``qpid_flow_started``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qpid_flow.amqp.bridge import ReactorBridge
    from qpid_flow.amqp.router import Router
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.memory import MemoryMeter
    from qpid_flow.core.registry import Destinations
    from qpid_flow.plugin.manager import Hooks

__all__ = ["RouterControl"]


# Runs a callback on the reactor thread after a delay in seconds (the reactor's timers).
Scheduler = Callable[[float, Callable[[], Any]], None]


class RouterControl:
    """A narrow, stable facade over the router for plugins. Reactor thread only, except
    :meth:`call_from_thread`."""

    def __init__(
        self,
        schedule: Scheduler,
        router: Router,
        destinations: Destinations,
        bridge: ReactorBridge,
        memory: MemoryMeter,
        hooks: Hooks,
    ) -> None:
        self._schedule = schedule
        self._router = router
        self._destinations = destinations
        self._bridge = bridge
        # Bytes of messages qpid-flow holds, against ``memory_limit`` (read ``.over``).
        self.memory = memory
        # Every hook, for a plugin that reports events of its own to other plugins.
        self.hooks = hooks

    def call_from_thread(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` on the reactor thread soon. The one method that is safe to call
        from another thread: a plugin's worker thread hands its results over with it."""
        self._bridge.call_soon(callback)

    def schedule(self, delay: float, callback: Callable[[], Any]) -> None:
        """Run ``callback`` on the reactor thread after ``delay`` seconds."""
        self._schedule(delay, callback)

    def destination(self, address: str) -> Destination | None:
        """The destination of ``address`` if it exists."""
        return self._destinations.find(address)

    def destinations(self) -> Iterator[Destination]:
        return iter(self._destinations)

    def wake(self, address: str | None = None) -> None:
        """A policy's answer may have changed: re-ask it about held transfers, delayed
        settlements, producer credit and waiting messages (for ``address``, or everywhere)."""
        targets = [self._destinations.find(address)] if address else list(self._destinations)
        for destination in targets:
            if destination is None:
                continue
            self._router.recheck_held(destination.address)
            destination.dispatch()
        self._router.grant_all(address)

    def held_transfers(self, address: str) -> int:
        """How many transfers to ``address`` a policy is holding unforwarded."""
        return self._router.held_count(address)

    def delayed_producers(self, address: str) -> int:
        """How many producers wait for the settlement of a transfer to ``address``."""
        return self._router.delayed_producers(address)
