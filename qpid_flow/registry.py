"""The destinations qpid-flow knows, by address, and the policies that apply to them.

Policies come from the configuration file and can be added, replaced or removed at
runtime (``qpid-flow config add destination``); every existing destination they match
picks the change up at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from qpid_flow.config import DestinationPolicy, RouterConfig, is_pattern, pattern_matches, resolve_policy
from qpid_flow.destination import Destination
from qpid_flow.manager import Hooks
from qpid_flow.memory import MemoryMeter

__all__ = ["Destinations"]


class Destinations:
    def __init__(self, config: RouterConfig, hooks: Hooks, memory: MemoryMeter | None = None) -> None:
        self._config = config
        self._hooks = hooks
        self._memory = memory
        self._by_address: dict[str, Destination] = {}
        self.policies: dict[str, DestinationPolicy] = dict(config.destinations)

    def policy_for(self, address: str) -> DestinationPolicy:
        return resolve_policy(self.policies, address, self._config.base_policy())

    def get(self, address: str) -> Destination | None:
        """The destination for ``address``; created if unknown and creation is allowed."""
        destination = self._by_address.get(address)
        if destination is not None:
            return destination
        if not self._config.auto_create and address not in self.policies:
            return None
        destination = Destination(address, self.policy_for(address), self._hooks, memory=self._memory)
        self._by_address[address] = destination
        self._hooks.destination_created(destination=destination)
        return destination

    def create_configured(self) -> None:
        """Configured names (not patterns) exist from the start, like declared queues."""
        for name in list(self.policies):
            if not is_pattern(name):
                self.get(name)

    def find(self, address: str) -> Destination | None:
        """The destination for ``address`` if it exists (never creates one)."""
        return self._by_address.get(address)

    def set_policy(self, name: str, policy: DestinationPolicy) -> list[Destination]:
        """Add or replace the policy for ``name`` (a name or pattern); returns the
        destinations whose policy changed. Raises ConfigError for impossible values."""
        self._config.check_flow_limits(policy.merged_over(self._config.base_policy()), f'destinations."{name}"')
        self.policies[name] = policy
        return self._reapply(name)

    def remove_policy(self, name: str) -> list[Destination]:
        """Remove the policy for ``name``; KeyError if there is none."""
        del self.policies[name]
        return self._reapply(name)

    def _reapply(self, name: str) -> list[Destination]:
        changed = []
        for destination in self._by_address.values():
            if destination.address == name or pattern_matches(name, destination.address):
                destination.policy = self.policy_for(destination.address)
                self._hooks.destination_policy_changed(destination=destination)
                changed.append(destination)
        return changed

    def expire(self, now: float) -> int:
        """Drop the waiting messages whose time to live ran out, everywhere; how many."""
        return sum(d.expire(now) for d in list(self._by_address.values()) if d.expiring)

    def __iter__(self) -> Iterator[Destination]:
        return iter(list(self._by_address.values()))

    def __len__(self) -> int:
        return len(self._by_address)
