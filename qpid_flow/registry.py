"""The destinations qpid-flow knows, by address, created on first use."""

from __future__ import annotations

from collections.abc import Iterator

from qpid_flow.config import RouterConfig
from qpid_flow.destination import Destination
from qpid_flow.manager import Hooks

__all__ = ["Destinations"]


class Destinations:
    def __init__(self, config: RouterConfig, hooks: Hooks) -> None:
        self._config = config
        self._hooks = hooks
        self._by_address: dict[str, Destination] = {}

    def get(self, address: str) -> Destination | None:
        """The destination for ``address``; created if unknown and creation is allowed."""
        destination = self._by_address.get(address)
        if destination is not None:
            return destination
        if not self._config.auto_create and address not in self._config.destinations:
            return None
        destination = Destination(address, self._config.policy_for(address), self._hooks)
        self._by_address[address] = destination
        self._hooks.destination_created(destination=destination)
        return destination

    def find(self, address: str) -> Destination | None:
        """The destination for ``address`` if it exists (never creates one)."""
        return self._by_address.get(address)

    def __iter__(self) -> Iterator[Destination]:
        return iter(list(self._by_address.values()))

    def __len__(self) -> int:
        return len(self._by_address)
