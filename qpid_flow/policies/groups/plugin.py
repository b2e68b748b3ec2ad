"""Shared message groups (seed 001), as a plugin.

A destination with ``shared_groups = true`` gets a :class:`~qpid_flow.policies.groups.grouped_queue.GroupedQueue`:
one owner per group at a time, groups never blocking each other, released messages back
at the front of their group. This plugin installs it, chooses the consumer of a free
group (the one owning the fewest groups, then the one with the most credit), enforces
``group_lease`` and reports groups in the statistics.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import structlog

from qpid_flow import hookimpl
from qpid_flow.config import ConfigError, parse_boolean, parse_duration, parse_string
from qpid_flow.plugin.declarations import AdminRequest, AdminRoute, DestinationSetting
from qpid_flow.policies.groups.grouped_queue import GroupedQueue

if TYPE_CHECKING:
    from collections.abc import Sequence

    from qpid_flow.config import RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer
    from qpid_flow.plugin.control import RouterControl

log = structlog.get_logger(__name__)

# How often leases are checked: a lease is honoured to within this.
LEASE_SWEEP = 0.1


def _positive_duration(value: Any, key: str) -> float:
    seconds = parse_duration(value, key)
    if seconds <= 0:
        raise ConfigError(key, value, "must be a positive duration")
    return seconds


# The keys this plugin adds to destination tables; ``qpid.*`` are qpidd's queue-declare names.
SETTINGS = [
    DestinationSetting("shared_groups", parse_boolean, ("qpid.shared_msg_group",), "pin each message group"),
    DestinationSetting(
        "group_header", parse_string, ("qpid.group_header_key",), "application property naming the group"
    ),
    DestinationSetting("group_lease", _positive_duration, (), "release a group its owner holds longer than this"),
]


class Plugin:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._default_group = "qpid.no-group"
        self._control: RouterControl | None = None
        self._grouped: dict[str, Destination] = {}
        self._sweeping = False

    @hookimpl
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        self._default_group = config.default_message_group

    @hookimpl
    def qpid_flow_destination_settings(self) -> list[DestinationSetting]:
        return SETTINGS

    @hookimpl
    def qpid_flow_admin_routes(self) -> list[AdminRoute]:
        return [AdminRoute("GET", "/v1/groups/{name}", self._groups_route, not_found="destination")]

    def _groups_route(self, request: AdminRequest) -> dict[str, Any]:
        """GET /v1/groups/{name}: each group of a grouped destination, its owner and messages."""
        name = request.params["name"]
        control = self._control
        if control is not None:
            name = control.destination_name(name)  # /queue/carts: carts, as config add names it
        destination = control.destination(name) if control is not None else None
        if destination is None:
            raise KeyError(f"no destination {name!r}")
        queue = destination.queue
        if not isinstance(queue, GroupedQueue):
            raise KeyError(f"message groups are not enabled on {name!r} (shared_groups = true)")
        return {"name": name, "groups": queue.describe()}

    @hookimpl
    def qpid_flow_started(self, control: RouterControl) -> None:
        self._control = control
        self._sweep_if_leased()

    def _sweep_if_leased(self) -> None:
        """Keep the lease sweep running while some grouped destination has a lease, only:
        an idle router should not wake ten times a second for nothing."""
        leased = any(d.policy.setting("group_lease") for d in self._grouped.values())
        if leased and not self._sweeping and self._control is not None:
            self._sweeping = True
            self._control.schedule(LEASE_SWEEP, self._sweep_leases)

    @hookimpl
    def qpid_flow_destination_created(self, destination: Destination) -> None:
        policy = destination.policy
        if policy.setting("shared_groups"):
            self._install(destination)
            return
        unused = [key for key in ("group_header", "group_lease") if policy.setting(key) is not None]
        if unused:
            log.warning(
                "groups_config_warning",
                address=destination.address,
                warning=f"{', '.join(unused)} has no effect without shared_groups = true",
            )

    @hookimpl
    def qpid_flow_destination_policy_changed(self, destination: Destination) -> None:
        queue = destination.queue
        grouped = isinstance(queue, GroupedQueue)
        if destination.policy.setting("shared_groups"):
            if not isinstance(queue, GroupedQueue) or queue.header != destination.policy.setting("group_header"):
                self._install(destination)
        elif grouped:
            self._grouped.pop(destination.address, None)
            destination.replace_queue(None)
            log.info("groups_disabled", address=destination.address)
        self._sweep_if_leased()  # a lease added at runtime needs the sweep running

    @hookimpl
    def qpid_flow_destination_deleted(self, destination: Destination) -> None:
        # Forgotten (idle, or a temporary queue): its queue and groups go with it. Kept, a
        # pattern's one-off grouped names piled up here for good, each swept for leases
        # ten times a second (5,000 an hour: +32 MB and +7 % of a core, idle).
        if self._grouped.get(destination.address) is destination:
            del self._grouped[destination.address]

    def _install(self, destination: Destination) -> None:
        address = destination.address
        queue = GroupedQueue(
            destination.policy.setting("group_header"),
            destination.queue_select,
            self._default_group,
            self._clock,
            lambda event, group, consumer: self._group_event(destination, event, group, consumer),
            # Assignments and releases go to the debug log and two hooks: skip them (two
            # calls per message with many short groups) when neither is read.
            ownership_events=log.is_enabled_for(logging.DEBUG)
            or destination.hooks.listened("group_assigned", "group_released"),
            # Asked first (no other plugin answers before it), this plugin's chooser gives
            # a lone ready consumer every free group.
            sole_consumer_takes_free_groups=not destination.hooks.asked_before("qpid_flow_consumer_select", self),
        )
        for consumer in destination.consumers:
            for message in sorted(consumer.held.values(), key=lambda m: m.sequence):
                queue.adopt(consumer, message)
        self._grouped[address] = destination
        destination.replace_queue(queue)
        self._sweep_if_leased()
        log.info(
            "groups_enabled", address=address, group_header=destination.policy.setting("group_header") or "group-id"
        )

    def _group_event(self, destination: Destination, event: str, group: str, consumer: Consumer) -> None:
        hooks = destination.hooks
        if event == "out_of_order":
            log.warning(
                "group_out_of_order",
                address=destination.address,
                group=group,
                consumer=consumer.id,
                reason="an earlier message of the group was released and is waiting again",
            )
            return
        if event == "assigned":
            log.debug("group_assigned", address=destination.address, group=group, consumer=consumer.id)
            hooks.group_assigned(destination=destination, group=group, consumer=consumer)
            return
        log.debug("group_released", address=destination.address, group=group, consumer=consumer.id, reason=event)
        hooks.group_released(destination=destination, group=group, consumer=consumer, reason=event)

    @hookimpl
    def qpid_flow_consumer_select(self, destination: Destination, consumers: Sequence[Consumer]) -> Consumer | None:
        queue = destination.queue
        if not isinstance(queue, GroupedQueue):
            return None
        if len(consumers) == 1:
            return consumers[0]  # the common case, once per free group: no ranking to do
        # A free group goes to the consumer owning the fewest groups, then the one with most
        # credit: groups spread over consumers instead of piling on the first.
        owned_by = queue.owned_by
        return min(consumers, key=lambda c: (owned_by(c), -c.credit))

    def _sweep_leases(self) -> None:
        self._sweeping = False
        control = self._control
        if control is None:
            return
        now = self._clock()
        for destination in list(self._grouped.values()):
            lease = destination.policy.setting("group_lease")
            queue = destination.queue
            if not lease or not isinstance(queue, GroupedQueue):
                continue
            for consumer, group in queue.expired(lease, now):
                messages = [m for m in consumer.held.values() if queue.group_of(m) == group]
                log.warning(
                    "group_lease_expired",
                    address=destination.address,
                    group=group,
                    consumer=consumer.id,
                    released=len(messages),
                    lease=lease,
                )
                # For one more lease it gets no free group: else, owning the fewest, it would
                # be given this one straight back (the sweep's dispatch below re-offers it).
                queue.bar(consumer, now + lease)
                with queue.release_reason("lease"):
                    destination.release_held(consumer, messages)
            destination.dispatch()
        self._sweep_if_leased()

    @hookimpl
    def qpid_flow_destination_stats(self, destination: Destination) -> dict[str, Any] | None:
        queue = destination.queue
        if not isinstance(queue, GroupedQueue):
            return None
        return {
            "groups": queue.group_count,
            "sharedGroups": True,
            "groupHeader": queue.header or "group-id",
            "groupLease": destination.policy.setting("group_lease"),
        }
