"""What plugins may do to a running router (handed to them by ``qpid_flow_started``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from proton import Handler

if TYPE_CHECKING:
    from proton.reactor import Container

    from qpid_flow.bridge import ReactorBridge
    from qpid_flow.destination import Destination
    from qpid_flow.manager import Hooks
    from qpid_flow.memory import MemoryMeter
    from qpid_flow.registry import Destinations
    from qpid_flow.router import Router

__all__ = ["RouterControl"]


class _Timer(Handler):
    def __init__(self, callback: Callable[[], Any]) -> None:
        super().__init__()
        self._callback = callback

    def on_timer_task(self, event: Any) -> None:
        self._callback()


class RouterControl:
    """A narrow, stable facade over the router for plugins. Reactor thread only, except
    :meth:`call_from_thread`."""

    def __init__(
        self,
        container: Container,
        router: Router,
        destinations: Destinations,
        bridge: ReactorBridge,
        memory: MemoryMeter,
        hooks: Hooks,
    ) -> None:
        self._container = container
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
        self._container.schedule(delay, _Timer(callback))

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
