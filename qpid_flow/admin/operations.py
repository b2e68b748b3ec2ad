"""What operators can do at runtime, on the reactor thread (behind the admin endpoint).

Seed 004's management needs: change a destination's policy without a restart, stop and
start all producers of a destination pattern, and see every destination's statistics.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from qpid_flow import __version__
from qpid_flow.admin.metrics import Snapshot, add_counters, counter_values
from qpid_flow.amqp import inventory
from qpid_flow.config import is_pattern
from qpid_flow.plugin.manager import PLUGIN_ERRORS

if TYPE_CHECKING:
    from qpid_flow.amqp.router import Router
    from qpid_flow.config import DestinationPolicy
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.registry import Destinations
    from qpid_flow.plugin.control import RouterControl

__all__ = ["Operations"]

log = structlog.get_logger(__name__)


def _policy_record(name: str, policy: DestinationPolicy) -> dict[str, Any]:
    return {"name": name, "policy": policy.values()}


class Operations:
    """Implements :class:`qpid_flow.admin.http.AdminOperations`."""

    def __init__(
        self,
        destinations: Destinations,
        control: RouterControl,
        router: Router | None = None,
        readiness: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self._destinations = destinations
        self._control = control
        self._router = router
        self._readiness = readiness or (lambda: (True, "ready"))
        # What the metrics need of destinations deleted between two snapshots (see
        # Snapshot.deleted): by name if the last snapshot listed them, else summed. Kept
        # from the first snapshot on: without metrics a deletion costs nothing more (it
        # reads the destination's statistics, plugins' included).
        self._listed: set[str] | None = None
        self._deleted: dict[str, dict[str, float]] = {}
        self._deleted_unlisted: dict[str, float] = {}

    def _destination_deleted(self, destination: Destination) -> None:
        final = counter_values(destination.stats())
        if self._listed is not None and destination.address in self._listed:
            # Deleted and made again under its name, more than once between scrapes: all of it.
            add_counters(self._deleted.setdefault(destination.address, {}), final)
        else:
            add_counters(self._deleted_unlisted, final)

    def stat(self) -> list[dict[str, Any]]:
        return sorted((d.stats() for d in self._destinations), key=lambda r: r["name"])

    def stat_of(self, name: str) -> dict[str, Any] | None:
        """The statistics of the destination ``name`` names (in front of RabbitMQ,
        ``/queue/orders`` is ``orders``, as for ``config add``), or None."""
        named = self._router.destination_name(name) if self._router is not None else name
        destination = self._destinations.find(named)
        return destination.stats() if destination is not None else None

    def _named(self, name: str) -> str:
        """A policy name or pattern as destinations are named (in front of RabbitMQ,
        ``/queue/orders`` is ``orders``): a policy under the address form would match no
        destination, and make one of its own."""
        named = self._router.destination_name(name) if self._router is not None else name
        if named != name:
            log.info("policy_name_mapped", given=name, name=named)
        return named

    def add_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        name = self._named(name)
        policy = self._destinations.parse_policy(name, settings)
        changed = self._destinations.set_policy(name, policy)
        self._applied(changed)
        if not is_pattern(name):
            self._destinations.get(name)  # a named destination exists once configured
        log.info("policy_set", name=name, destinations=[d.address for d in changed], **settings)
        return _policy_record(name, policy)

    def remove_destination(self, name: str) -> dict[str, Any]:
        name = self._named(name)
        if name not in self._destinations.policies:
            raise KeyError(f"no policy {name!r}")
        policy = self._destinations.policies[name]
        changed = self._destinations.remove_policy(name)
        self._applied(changed)
        log.info("policy_removed", name=name, destinations=[d.address for d in changed])
        return _policy_record(name, policy)

    def policies(self) -> list[dict[str, Any]]:
        # A pattern that matches nothing yet was seen nowhere, and `config del` needs its
        # exact name: qpid-config list and rabbitmqctl list_policies have their listing.
        ruled: dict[str, list[str]] = {}
        for destination in self._destinations:
            ruled.setdefault(destination.policy.pattern, []).append(destination.address)
        return [
            {**_policy_record(name, policy), "destinations": sorted(ruled.get(name, []))}
            for name, policy in sorted(self._destinations.policies.items())
        ]

    def _applied(self, changed: list[Destination]) -> None:
        """In front of a broker, consumers may need another route after a policy change
        (:meth:`BrokerRouter.policy_applied`)."""
        from qpid_flow.amqp.linkroute import BrokerRouter

        if isinstance(self._router, BrokerRouter):
            self._router.policy_applied(changed)

    # --- who is connected (qpid-flow stat connections / links) -------------------------------

    def _the_router(self) -> Router:
        if self._router is None:
            raise KeyError("no router")
        return self._router

    def connections(self) -> list[dict[str, Any]]:
        return inventory.connection_records(self._the_router())

    def links(self) -> list[dict[str, Any]]:
        hooks = self._control.hooks

        router = self._the_router()

        def blocked(address: str) -> bool:
            destination = self._destinations.find(router.destination_name(address))
            return destination is not None and bool(hooks.producers_held(destination=destination))

        return inventory.link_records(router, blocked, router.waiting_producers())

    def close_connection(self, connection_id: str) -> dict[str, Any]:
        record = inventory.close_connection(self._the_router(), connection_id, "closed by an operator")
        log.info("connection_closed_by_operator", connection=connection_id, user=record["user"])
        return record

    # --- health and metrics ------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        return self._readiness()

    def snapshot(self) -> Snapshot:
        """Everything a metrics scrape reads, in one pass on the reactor thread."""
        router = self._the_router()
        memory = self._control.memory
        sessions, links_in, links_out = inventory.endpoint_counts(router)
        upstream: Counter[str] = Counter()
        for record in inventory.connection_records(router) if router.connections else ():
            if record["upstream"] is not None:
                upstream[record["upstream"]] += 1
        reader = getattr(router.backend, "group_reader", None)  # in front of a broker
        if reader is not None:
            for is_open in reader.connection_states():
                upstream["open" if is_open else "opening"] += 1
        records = self.stat()
        destinations = list(self._destinations)
        if self._listed is None:
            self._destinations.deletion_listeners.append(self._destination_deleted)
        deleted, self._deleted = self._deleted, {}
        deleted_unlisted, self._deleted_unlisted = self._deleted_unlisted, {}
        self._listed = {str(record["name"]) for record in records}
        return Snapshot(
            version=__version__,
            proton=inventory.PROTON_VERSION,
            python=platform.python_version(),
            ready=self.readiness()[0],
            connections=len(router.connections),
            sessions=sessions,
            links_in=links_in,
            links_out=links_out,
            upstream=dict(upstream),
            messages_in=self._destinations.retired_in + sum(d.enqueued_total for d in destinations),
            messages_out=self._destinations.retired_out + sum(d.delivered_total for d in destinations),
            memory_bytes=memory.in_use,
            memory_waiting=memory.waiting,
            memory_limit=memory.limit,
            memory_over=memory.over,
            destinations=records,
            plugin_errors=dict(PLUGIN_ERRORS),
            deleted=deleted,
            deleted_unlisted=deleted_unlisted,
        )
