"""What operators can do at runtime, on the reactor thread (behind the admin endpoint).

Seed 004's management needs: change a destination's policy without a restart, stop and
start all producers of a destination pattern, and see every destination's statistics.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import structlog

from qpid_flow.config import is_pattern, parse_destination
from qpid_flow.groups import GroupedQueue

if TYPE_CHECKING:
    from qpid_flow.builtin.flow import Plugin as FlowPlugin
    from qpid_flow.config import DestinationPolicy
    from qpid_flow.control import RouterControl
    from qpid_flow.registry import Destinations

__all__ = ["Operations"]

log = structlog.get_logger("qpid_flow.operations")


def _policy_record(name: str, policy: DestinationPolicy) -> dict[str, Any]:
    values = {k: v for k, v in asdict(policy).items() if v is not None and k != "pattern"}
    return {"name": name, "policy": values}


class Operations:
    """Implements :class:`qpid_flow.admin.AdminOperations`."""

    def __init__(self, destinations: Destinations, control: RouterControl, flow: FlowPlugin | None) -> None:
        self._destinations = destinations
        self._control = control
        self._flow = flow

    def stat(self) -> list[dict[str, Any]]:
        return sorted((d.stats() for d in self._destinations), key=lambda r: r["name"])

    def add_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        policy = parse_destination(name, settings)
        changed = self._destinations.set_policy(name, policy)
        if not is_pattern(name):
            self._destinations.get(name)  # a named destination exists once configured
        log.info("policy_set", name=name, destinations=[d.address for d in changed], **settings)
        return _policy_record(name, policy)

    def remove_destination(self, name: str) -> dict[str, Any]:
        if name not in self._destinations.policies:
            raise KeyError(f"no policy {name!r}")
        policy = self._destinations.policies[name]
        changed = self._destinations.remove_policy(name)
        log.info("policy_removed", name=name, destinations=[d.address for d in changed])
        return _policy_record(name, policy)

    def producers(self, action: str, pattern: str) -> dict[str, Any]:
        if self._flow is None:
            raise KeyError("flow control is disabled (plugin 'flow')")
        if action == "stop":
            self._flow.stop_producers(pattern)
        elif action == "start":
            self._flow.start_producers(pattern)
        else:
            raise ValueError(f"unknown action {action!r}: stop or start")
        matching = [d.address for d in self._destinations if self._flow.stopped_by_operator(d.address)]
        return {"action": action, "pattern": pattern, "stopped": self._flow.stopped_patterns, "destinations": matching}

    def groups(self, name: str) -> dict[str, Any]:
        destination = self._destinations.find(name)
        if destination is None:
            raise KeyError(f"no destination {name!r}")
        queue = destination.queue
        if not isinstance(queue, GroupedQueue):
            raise KeyError(f"message groups are not enabled on {name!r} (shared_groups = true)")
        return {"name": name, "groups": queue.describe()}
