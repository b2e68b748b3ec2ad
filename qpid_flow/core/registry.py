"""The destinations qpid-flow knows, by address, and the policies that apply to them.

Policies come from the configuration file and can be added, replaced or removed at
runtime (``qpid-flow config add destination``); every existing destination they match
picks the change up at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

from qpid_flow.config import DestinationPolicy, RouterConfig, is_pattern, matches_any, resolve_policy
from qpid_flow.core.destination import Destination
from qpid_flow.core.dialect import PLAIN, Dialect
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.plugin.manager import Hooks

__all__ = ["TEMPORARY_PREFIX", "Destinations"]


# Names of the temporary queues made for dynamic sources (request/response reply queues).
TEMPORARY_PREFIX = "qpid-flow.temporary."


class Destinations:
    def __init__(self, config: RouterConfig, hooks: Hooks, memory: MemoryMeter | None = None) -> None:
        self._config = config
        self._hooks = hooks
        self._memory = memory
        self._by_address: dict[str, Destination] = {}
        self.policies: dict[str, DestinationPolicy] = dict(config.destinations)
        # Messages in (enqueued) and out (delivered) of destinations deleted or forgotten:
        # router-wide totals must not go down when a destination goes.
        self.retired_in = 0
        self.retired_out = 0
        # Called with each destination deleted, after its last counts (the metrics keep
        # what a deleted destination counted since their last scrape).
        self.deletion_listeners: list[Callable[[Destination], None]] = []
        # How the broker reads addresses: the forms a destination's name may be written in,
        # which patterns may match. Names alone until the broker's dialect is known.
        self._dialect: Dialect = PLAIN

    def policy_for(self, address: str) -> DestinationPolicy:
        dialect = self._dialect
        forms = dialect.address_forms(address)[1:]
        return resolve_policy(self.policies, address, self._config.base_policy(), forms, dialect.pattern_core)

    def use_dialect(self, dialect: Dialect) -> None:
        """Match patterns against each name's address forms in ``dialect`` from now on
        (in front of RabbitMQ, ``/queue/>`` matches queue ``orders`` as ``/queue/orders``);
        a destination whose policy that changes is told to plugins."""
        self._dialect = dialect
        for destination in self._by_address.values():
            policy = self.policy_for(destination.address)
            if policy != destination.policy:
                destination.policy = policy
                self._hooks.destination_policy_changed(destination=destination)

    def get(self, address: str) -> Destination | None:
        """The destination for ``address``; created if unknown and creation is allowed."""
        destination = self._by_address.get(address)
        if destination is not None:
            return destination
        if address.startswith(TEMPORARY_PREFIX):
            # Made only by a dynamic attach, and gone for good once deleted: a late reply to
            # one would otherwise make a queue nobody can ever read, accepted and kept.
            return None
        if not self._config.auto_create and address not in self.policies:
            return None
        destination = Destination(address, self.policy_for(address), self._hooks, memory=self._memory)
        self._by_address[address] = destination
        self._hooks.destination_created(destination=destination)
        return destination

    def create_temporary(self) -> Destination:
        """A new temporary destination for a dynamic source, whatever ``auto_create`` says:
        a unique name the client gets in its attach answer, deleted with its link."""
        address = f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}"
        destination = Destination(address, self.policy_for(address), self._hooks, memory=self._memory)
        destination.temporary = True
        self._by_address[address] = destination
        self._hooks.destination_created(destination=destination)
        return destination

    def delete(self, destination: Destination) -> int:
        """Delete ``destination``: its waiting messages are dropped (counted, and settled
        in the event log as deleted). Returns how many were dropped."""
        if self._by_address.get(destination.address) is not destination:
            return 0
        dropped = destination.delete()
        del self._by_address[destination.address]
        self.retired_in += destination.enqueued_total
        self.retired_out += destination.delivered_total
        for listener in self.deletion_listeners:
            listener(destination)
        self._hooks.destination_deleted(destination=destination)
        return dropped

    def forget_idle(self, now: float, idle_timeout: float, busy: Callable[[str], bool] = lambda _address: False) -> int:
        """Delete auto-created destinations unused (no producer, consumer or message) for
        ``idle_timeout`` seconds: one-off names must not pile up. Destinations named in
        the configuration stay, and so do those ``busy(address)`` says the router still
        has work for (transfers held for them, settlements waiting on them). Returns how
        many went."""
        forgotten = 0
        for destination in list(self._by_address.values()):
            if not destination.unused or destination.address in self.policies or busy(destination.address):
                destination.idle_since = None
            elif destination.idle_since is None:
                destination.idle_since = now
            elif now - destination.idle_since >= idle_timeout:
                self.delete(destination)
                forgotten += 1
        if forgotten > 1000:
            # A dict keeps the table it grew to: copy it so that a burst of names gives
            # its memory back.
            self._by_address = dict(self._by_address)
        return forgotten

    def create_configured(self) -> None:
        """Configured names (not patterns) exist from the start, like declared queues."""
        for name in list(self.policies):
            if not is_pattern(name):
                self.get(name)

    def find(self, address: str) -> Destination | None:
        """The destination for ``address`` if it exists (never creates one)."""
        return self._by_address.get(address)

    def parse_policy(self, name: str, table: Any) -> DestinationPolicy:
        """A table of settings given at runtime (TOML keys, the admin API's body)."""
        return self._config.parse_destination(name, table)

    def set_policy(self, name: str, policy: DestinationPolicy) -> list[Destination]:
        """Add or replace the policy for ``name`` (a name or pattern); returns the
        destinations whose policy changed. Raises ConfigError for impossible values."""
        self._hooks.destination_policy_check(
            config=self._config, policy=policy.merged_over(self._config.base_policy()), where=f'destinations."{name}"'
        )
        self.policies[name] = policy
        return self._reapply(name)

    def remove_policy(self, name: str) -> list[Destination]:
        """Remove the policy for ``name``; KeyError if there is none."""
        del self.policies[name]
        return self._reapply(name)

    def _reapply(self, name: str) -> list[Destination]:
        # Only where the policy in force changes: a more specific policy keeps its
        # destinations (the logs, the event log and plugins were told X.a had taken the
        # new X.> though its own X.a policy still ruled it).
        changed = []
        for destination in self._by_address.values():
            if not matches_any(name, self._dialect.address_forms(destination.address)):
                continue
            policy = self.policy_for(destination.address)
            if policy != destination.policy:
                destination.policy = policy
                self._hooks.destination_policy_changed(destination=destination)
                changed.append(destination)
        return changed

    def expire(self, now: float) -> int:
        """Drop the waiting messages whose time to live ran out, everywhere; how many."""
        return sum(d.expire(now) for d in list(self._by_address.values()) if d.expiring)

    def dispatch_again(self, now: float) -> None:
        """Destinations whose consumer selection failed hand messages out again once their
        pause is over (``now``: the monotonic clock)."""
        for destination in list(self._by_address.values()):
            if destination.select_retry is not None:
                destination.dispatch_again(now)

    def __iter__(self) -> Iterator[Destination]:
        return iter(list(self._by_address.values()))

    def __len__(self) -> int:
        return len(self._by_address)
