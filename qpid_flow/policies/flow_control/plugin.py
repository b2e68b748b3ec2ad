"""Producer flow control (Qpid C++ broker and ActiveMQ semantics), as a plugin.

Per destination, a :class:`~qpid_flow.policies.flow_control.thresholds.FlowState` follows the depth; what happens
when it is ON depends on the destination's ``limit_policy``:

- ``flow`` (default): producers are held back. Named-target links get credit in
  increments never exceeding the headroom below the stop threshold (so the transfer that
  crosses it is the last one admitted), and none while ON. Anonymous-relay links cannot
  be stopped per destination by credit: their transfers to a destination that is ON are
  forwarded but their settlement waits until it is OFF again (qpidd's withheld
  completion).
- ``flow`` with ``reject_after``: a transfer arriving while ON waits, unforwarded, and is
  rejected if the destination is still ON when the timeout passes (ActiveMQ
  ``sendFailIfNoSpaceAfterTimeout``).
- ``reject``: a transfer arriving while ON is rejected at once (``sendFailIfNoSpace``).
- ``ring``: never flow-controlled (the destination drops its oldest message instead).

Router-wide, ``memory_limit``: credit is sized by the room left under it (by the largest
message seen), none once it is reached, and what named-target links send on credit given
before waits, unforwarded and unsettled, until memory frees. Operators can stop and start
all producers of a destination pattern.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from qpid_flow import hookimpl
from qpid_flow.config import (
    ConfigError,
    RouterConfig,
    check_pattern,
    matches_any,
    parse_duration,
    parse_non_negative_int,
    parse_size,
)
from qpid_flow.core.credit import window_need
from qpid_flow.core.model import Hold, Outcome, Reject
from qpid_flow.plugin.declarations import AdminRequest, AdminRoute, DestinationSetting, required_string
from qpid_flow.policies.flow_control.thresholds import FlowLimits, FlowState, FlowTransition, LimitError, flow_limits

if TYPE_CHECKING:
    from qpid_flow.config import DestinationPolicy
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Decision, Message, Producer, Settlement
    from qpid_flow.plugin.control import RouterControl

log = structlog.get_logger(__name__)

STATE_KEY = "flow"
_OPERATOR_HOLD = Hold("producers stopped by an operator")
_PAST_THE_STOP = Hold("past the stop threshold: waits for flow to resume")
_MEMORY_FULL = Hold("the router's memory_limit is reached: waits for memory to free")
# Reactor timers may fire a little before the deadline by our clock: close enough is due.
_TIMER_SLACK = 0.005


@dataclass
class _Entry:
    """What the plugin keeps per destination."""

    state: FlowState
    starved: bool = False  # a producer got less credit than it wanted: re-ask when depth falls
    wake_pending: bool = False
    deadlines: dict[int, float] = field(default_factory=dict)  # reject_after: message sequence -> deadline
    timer_due: float | None = None  # reject_after: when the pending re-check fires
    reject_after: float | None = None  # the reject_after the held transfers' clocks follow
    # The sequence number of the message counted in when flow last went ON (the crossing
    # one): anonymous-relay settlements are held from it on (see qpid_flow_settlement_delay).
    stopped_from: int = 0


# The keys this plugin adds to destination tables; ``qpid.*`` are qpidd's queue-declare names.
SETTINGS = [
    DestinationSetting(
        "flow_stop_count", parse_non_negative_int, ("qpid.flow_stop_count",), "stop producers above this depth"
    ),
    DestinationSetting(
        "flow_resume_count", parse_non_negative_int, ("qpid.flow_resume_count",), "resume them below this depth"
    ),
    DestinationSetting("flow_stop_size", parse_size, ("qpid.flow_stop_size",), "stop producers above these bytes"),
    DestinationSetting("flow_resume_size", parse_size, ("qpid.flow_resume_size",), "resume them below these bytes"),
    DestinationSetting("reject_after", parse_duration, (), "hold a transfer this long while stopped, then reject it"),
]


def limits_in_force(config: RouterConfig, policy: DestinationPolicy) -> tuple[FlowLimits, list[str]]:
    """The thresholds ``policy`` sets, or the router's defaults as percentages of its
    maximum, and warnings worth logging (:func:`thresholds.flow_limits`)."""
    return flow_limits(policy, config.default_flow_stop_threshold, config.default_flow_resume_threshold)


class Plugin:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._config: RouterConfig | None = None
        self._control: RouterControl | None = None
        self._window = 100
        self._stopped_patterns: set[str] = set()  # "producers stop PATTERN"
        self._wake_all_pending = False
        self._largest_seen = 0  # router-wide: the size to assume where a destination saw none
        self._memory_starved = False  # a grant was cut short by the memory limit
        self._producer_links = 0  # named-target and anonymous-relay: they share the memory room

    # --- lifecycle ------------------------------------------------------------------------

    @hookimpl
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        self._config = config
        self._window = config.producer_window

    @hookimpl
    def qpid_flow_destination_settings(self) -> list[DestinationSetting]:
        return SETTINGS

    @hookimpl
    def qpid_flow_destination_policy_check(self, config: RouterConfig, policy: DestinationPolicy, where: str) -> None:
        reject_after = policy.setting("reject_after")
        if reject_after is not None and policy.when_full != "flow":
            raise ConfigError(
                f"{where}.reject_after", reject_after, f"does not combine with limit_policy {policy.when_full!r}"
            )
        try:
            limits_in_force(config, policy)
        except LimitError as exc:
            raise ConfigError(f"{where}.{exc.key}", exc.value, exc.rule) from exc

    @hookimpl
    def qpid_flow_admin_routes(self) -> list[AdminRoute]:
        body = '{"pattern": "..."}'
        return [
            AdminRoute("POST", "/v1/producers/stop", lambda request: self._producers_route("stop", request), body),
            AdminRoute("POST", "/v1/producers/start", lambda request: self._producers_route("start", request), body),
        ]

    @hookimpl
    def qpid_flow_started(self, control: RouterControl) -> None:
        self._control = control
        control.memory.when_below(lambda: self._wake_soon(None))

    @hookimpl
    def qpid_flow_destination_created(self, destination: Destination) -> None:
        self._entry(destination)

    @hookimpl
    def qpid_flow_destination_policy_changed(self, destination: Destination) -> None:
        entry = self._entry(destination)
        transition = entry.state.change_limits(
            self._limits_for(destination), destination.depth, destination.bytes, self._clock()
        )
        log.info("flow_policy_changed", address=destination.address, **entry.state.limits.as_dict())
        self._transitioned(destination, entry, transition)
        self._start_reject_after_clocks(destination, entry)
        self._wake_soon(destination.address)  # a looser policy may free credit at once

    def _start_reject_after_clocks(self, destination: Destination, entry: _Entry) -> None:
        """A change that sets ``reject_after`` (or a new value of it): the transfers held
        before it wait that long from now, each, whatever clock they had. Only the first
        held transfer is asked again, so the others would start their clocks one after
        another: the n-th rejected after n x reject_after. A change of something else
        leaves their clocks as they are."""
        reject_after = destination.policy.settings.get("reject_after")
        changed, entry.reject_after = reject_after != entry.reject_after, reject_after
        if reject_after is None or self._control is None:
            return
        due = self._clock() + reject_after
        held = self._control.held_messages(destination.address)
        for message in held:
            if changed:
                entry.deadlines[message.sequence] = due
            else:
                entry.deadlines.setdefault(message.sequence, due)
        if held:
            self._wake_at(destination, entry, reject_after)

    def _limits_for(self, destination: Destination) -> Any:
        if self._config is None:
            self._config = RouterConfig()  # a destination made outside the router: defaults
        limits, warnings = limits_in_force(self._config, destination.policy)
        for warning in warnings:
            log.warning("flow_config_warning", address=destination.address, warning=warning)
        return limits

    def _entry(self, destination: Destination) -> _Entry:
        entry: _Entry | None = destination.plugin_state.get(STATE_KEY)
        if entry is None:  # a destination made outside the registry (tests, other plugins)
            entry = destination.plugin_state[STATE_KEY] = _Entry(
                FlowState(self._limits_for(destination)), reject_after=destination.policy.settings.get("reject_after")
            )
        return entry

    # --- following the depth ----------------------------------------------------------------

    @hookimpl
    def qpid_flow_depth_changed(self, destination: Destination) -> None:
        entry = self._entry(destination)
        if destination.largest_message > self._largest_seen:
            self._largest_seen = destination.largest_message
        transition = entry.state.update(destination.depth, destination.bytes, self._clock())
        if transition is not None:
            self._transitioned(destination, entry, transition)
        elif self._memory_starved:
            self._wake_soon(None)  # the memory room may have changed: everyone asks again
        elif entry.starved:
            # A producer got less credit than it asked for: the room, or what we know of
            # message sizes, has changed since; ask again for everyone (once per turn).
            self._wake_soon(destination.address)

    @hookimpl
    def qpid_flow_producer_attached(self, producer: Producer) -> None:
        self._producer_links += 1

    @hookimpl
    def qpid_flow_producer_detached(self, producer: Producer, destination: Destination | None) -> None:
        # Every link, whatever became of its destination: one deleted meanwhile (a dynamic
        # target whose link went) left the count raised for good, every share smaller.
        self._producer_links = max(0, self._producer_links - 1)
        # The credit it held is free again: whoever went short may have it.
        if self._memory_starved:
            self._wake_soon(None)
        elif destination is not None and self._entry(destination).starved:
            self._wake_soon(destination.address)

    def _transitioned(self, destination: Destination, entry: _Entry, transition: FlowTransition | None) -> None:
        if transition is None:
            return
        log.info(
            transition.value,
            address=destination.address,
            depth=destination.depth,
            bytes=destination.bytes,
            flowStoppedCount=entry.state.stopped_count,
            **entry.state.limits.as_dict(),
        )
        if self._control is not None:
            self._control.hooks.flow_changed(
                destination=destination,
                stopped=transition is FlowTransition.STOPPED,
                limits=entry.state.limits.as_dict(),
            )
        if transition is FlowTransition.RESUMED:
            self._wake_soon(destination.address)
        else:
            entry.stopped_from = destination.newest_in

    def _wake_soon(self, address: str | None) -> None:
        """Re-ask for credit, held transfers and delayed settlements, once, after this event.

        Deferred to the next turn of the reactor: the depth changes in the middle of
        forwarding a message, and waking there would re-enter the data path.
        """
        control = self._control
        if control is None:
            return
        if address is None:
            if not self._wake_all_pending:
                self._wake_all_pending = True
                control.schedule(0, self._wake_all)
            return
        destination = control.destination(address)
        if destination is None:
            return
        entry = self._entry(destination)
        if entry.wake_pending:
            return
        entry.wake_pending = True

        def wake() -> None:
            entry.wake_pending = False
            entry.starved = False
            control.wake(address)

        control.schedule(0, wake)

    def _wake_all(self) -> None:
        self._wake_all_pending = False
        self._memory_starved = False
        if self._control is not None:
            self._control.wake(None)

    # --- the questions ------------------------------------------------------------------

    def _blocked(self, destination: Destination) -> bool:
        """Producers of this destination must wait: flow is ON or an operator stopped them."""
        return self._entry(destination).state.stopped or self.stopped_by_operator(destination.address)

    def _full_for(self, destination: Destination) -> bool:
        """``reject`` and ``reject_after``: whether a transfer arriving now finds the
        destination full. Blocked, or past a stop threshold counting what open
        transactions staged for it: staged transfers are not in the depth until the commit,
        so every transfer of a transaction got in while OFF and the commit put the depth far
        past the stop (seed 004: a transacted send to a full destination fails too)."""
        entry = self._entry(destination)
        return self._blocked(destination) or self._past_the_stop(destination, entry.state.limits)

    def holds_producers(self, destination: Destination) -> bool:
        """Whether this destination's producers wait now: its flow is stopped, an operator
        stopped them, or the router is over its memory limit."""
        return self._blocked(destination) or self._memory_full()

    # --- the router-wide memory limit ------------------------------------------------------

    def _memory_full(self) -> bool:
        """The limit is reached (SEMANTICS: "when reached, all producer credit stops"). The
        bytes of transfers held unforwarded do not count (``MemoryMeter.in_use``)."""
        return self._control is not None and self._control.memory.over

    def _memory_cap(self, need: int, producer: Producer, destination: Destination | None) -> int:
        """``need``, cut to what fits in the room left under ``memory_limit``: credit is
        never revoked, so a full window whatever the room let every producer pass the
        limit by a window (memory_limit 10 KB admitted 100 messages of 1 KB). As the
        threshold headroom, sized by the largest message seen (this destination's, or any
        if it has seen none); the transfer that reaches the limit is admitted. Until a
        message has been seen anywhere its size is unknown: a full window, as a first
        grant below a size threshold is (what passes the limit on it waits)."""
        control = self._control
        if control is None or not control.memory.limit:
            return need
        room = control.memory.limit - control.memory.in_use
        if room <= 0:
            return 0
        message_size = (destination.largest_message if destination is not None else 0) or self._largest_seen
        if not need or not message_size:
            return need
        fits = -(-room // control.memory.charge(message_size))
        # Each producer link's share of the room, anonymous-relay links included (left out,
        # each of 20 relay links got the whole room: 20 times the limit went in), its own
        # credit in it. Not the room less all the credit
        # out: a link that got a window and never sends kept every other at 0 for good,
        # memory empty. Credit given before counts against nobody else: what it carries
        # past the limit waits (_memory_hold).
        share = -(-fits // max(1, self._producer_links))
        grant = min(need, share - producer.credit)
        if grant < need:
            self._memory_starved = True  # ask everyone again when memory or depths change
        return max(0, grant)

    def _memory_hold(self, producer: Producer, message: Message) -> Decision | None:
        """A named-target link's transfer, sent on credit given before the limit was
        reached, waits until memory frees (its credit cannot be taken back). Not a
        transactional one: what its own transaction staged counts in the memory used, and
        leaves only at the commit, which would wait for it for good (see _past_the_bound)."""
        if producer.address is not None and message.txn is None and self._memory_full():
            return _MEMORY_FULL
        return None

    def stopped_by_operator(self, address: str) -> bool:
        if not self._stopped_patterns:
            return False
        forms = self._control.address_forms(address) if self._control is not None else (address,)
        return any(matches_any(p, forms) for p in self._stopped_patterns)

    def _stopped(self, address: str | None) -> bool:
        return address is not None and bool(self._stopped_patterns) and self.stopped_by_operator(address)

    @hookimpl
    def qpid_flow_producer_credit(self, producer: Producer, destination: Destination | None) -> int:
        need = self._memory_cap(window_need(self._window, producer), producer, destination)
        if not need or destination is None:
            return need  # anonymous relay: held back by settlement instead
        if self.stopped_by_operator(destination.address):
            return 0
        policy = destination.policy
        if policy.when_full != "flow" or policy.settings.get("reject_after") is not None:
            return need  # reject / reject_after must see the transfers to answer them
        entry = self._entry(destination)
        limits = entry.state.limits
        if not limits.enabled:
            return need
        # Until a message of this destination has been seen its size is unknown, and the
        # size threshold cannot say how many fit: each producer link gets a full window
        # (within the count threshold), as a client may send only in its first
        # on_sendable. (A size guessed to fit one window below the stop size capped all the
        # links together at one window: a link that attached third got no credit, and if
        # it was the one to send first, nothing ever changed the depth to ask again.)
        # What passes the stop size on that credit waits (_past_the_bound); every later
        # grant is sized by the largest message seen.
        message_size = destination.largest_message or 1
        # What open transactions staged for it counts as if enqueued: their commit will put
        # it there, credit or not (the transactional producer then waits for its commit).
        headroom = entry.state.headroom(
            destination.depth + destination.staged_count, destination.bytes + destination.staged_bytes, message_size
        )
        if headroom is None:
            return need
        producers = destination.producers
        outstanding = sum(p.credit for p in producers)
        # No producer holds more than its share of the headroom: the one whose settlement
        # asks first would otherwise take it all, every time, and the others none (seen:
        # 18,883 messages against 0). The rest goes to the others when they are asked
        # (a short grant marks the destination starved: all are asked again soon).
        share = -(-headroom // max(1, len(producers)))
        grant = min(need, headroom - outstanding, share - producer.credit)
        if grant < need:
            entry.starved = True
        return max(0, grant)

    @hookimpl
    def qpid_flow_transfer_arrived(
        self, producer: Producer, message: Message, destination: Destination
    ) -> Decision | None:
        if message.size > self._largest_seen:
            self._largest_seen = message.size
        policy = destination.policy
        # An operator's stop of the address the producer wrote, where the broker routes the
        # message to this destination (RabbitMQ's /queue by subject), stops it as a stop of
        # this destination would: a reject policy refuses, reject_after waits and refuses.
        stopped_as_written = message.routed_from is not None and self._stopped(message.routed_from)
        if policy.when_full == "reject":
            if stopped_as_written:
                return Reject(_stopped_by_operator(message.routed_from))
            if self._full_for(destination):
                return Reject(self._full(destination))
            return self._memory_hold(producer, message)
        reject_after = policy.settings.get("reject_after")
        if reject_after is None:
            if policy.when_full == "flow":
                return self._past_the_bound(producer, destination, message) or self._memory_hold(producer, message)
            # A ring never stops its producers, but an operator's stop (seed 004) holds them.
            return self._operator_hold(producer, destination) or self._memory_hold(producer, message)
        entry = self._entry(destination)
        if not stopped_as_written and not self._full_for(destination):
            entry.deadlines.pop(message.sequence, None)
            return self._memory_hold(producer, message)
        now = self._clock()
        deadline = entry.deadlines.get(message.sequence)
        if deadline is None:
            memory = self._control.memory if self._control is not None else None
            if memory is not None and memory.holds_too_much(message.size):
                # The router would refuse to hold it: refused here, with no clock left
                # behind (each such clock stayed for good: +11 MiB per 100,000).
                return Reject(memory.held_past_limit())
            deadline = entry.deadlines[message.sequence] = now + reject_after
        remaining = deadline - now
        if remaining <= _TIMER_SLACK:
            del entry.deadlines[message.sequence]
            full = _stopped_by_operator(message.routed_from) if stopped_as_written else self._full(destination)
            return Reject(f"{full}; waited {reject_after:g}s")
        self._wake_at(destination, entry, remaining)
        return Hold("flow stopped")

    def _past_the_bound(self, producer: Producer, destination: Destination, message: Message) -> Decision | None:
        """Credit a named-target link was given before its limits tightened or an operator
        stopped it cannot be taken back (AMQP credit only grows from the receiver's side):
        what it sends past the bound (a stop threshold, count or bytes, plus the crossing
        transfer, or nothing while stopped by an operator) waits, unforwarded and unsettled, until it
        is OFF again. Anonymous-relay transfers are held back by their settlement instead."""
        if producer.address is None:
            return None
        if (held := self._operator_hold(producer, destination)) is not None:
            return held
        if message.txn is not None:
            # Staged, not held: its commit enqueues it, credit or not. Held, it would wait for
            # flow to turn OFF while what its own transaction staged keeps it ON, and the
            # commit waits for it: neither ever came (20 transfers of 100 B against a
            # flow_stop_size of 1000: 11 held, the discharge never answered). Credit, which
            # counts what open transactions staged, is what bounds a transactional producer.
            return None
        state = self._entry(destination).state
        # While ON, whatever the depth: flow stays ON until below the resume thresholds
        # (seed 000: "it remains 'ON' until the total number of enqueued messages is less
        # than 500"), and held transfers go in only once it is OFF. (Checked against the stop
        # thresholds alone, a re-check while ON let one in each time the depth fell to the
        # stop value: it stayed pinned at stop + 1 and never had to go below resume.)
        if state.stopped or self._past_the_stop(destination, state.limits):
            return _PAST_THE_STOP
        return None

    @staticmethod
    def _past_the_stop(destination: Destination, limits: FlowLimits) -> bool:
        """The depth, with what open transactions staged for it (their commit puts it there),
        is past a stop threshold: count, or bytes (credit is sized by the largest message
        seen so far, so larger ones, or a stop size lowered at runtime, can reach past the
        byte threshold on it). The crossing transfer is not past it: it is admitted."""
        if limits.stop_count and destination.depth + destination.staged_count > limits.stop_count:
            return True
        return bool(limits.stop_size and destination.bytes + destination.staged_bytes > limits.stop_size)

    def _operator_hold(self, producer: Producer, destination: Destination) -> Decision | None:
        """What a named-target link sends while an operator has stopped its producers waits
        (its credit, given before the stop, cannot be taken back)."""
        if producer.address is not None and self._stopped_patterns and self.stopped_by_operator(destination.address):
            return _OPERATOR_HOLD
        return None

    def _wake_at(self, destination: Destination, entry: _Entry, delay: float) -> None:
        """Re-ask about held transfers after ``delay``; one timer per destination, the earliest."""
        control = self._control
        if control is None:
            return
        due = self._clock() + delay
        if entry.timer_due is not None and entry.timer_due <= due:
            return
        entry.timer_due = due
        address = destination.address

        def fire() -> None:
            if entry.timer_due == due:
                entry.timer_due = None
            control.wake(address)

        control.schedule(delay, fire)

    @hookimpl
    def qpid_flow_settlement_delay(
        self, producer: Producer, message: Message, destination: Destination, settlement: Settlement
    ) -> bool | None:
        if not producer.anonymous or settlement.outcome is not Outcome.ACCEPTED:
            return None
        if self._stopped_patterns and (
            self.stopped_by_operator(destination.address)
            or (message.routed_from is not None and self.stopped_by_operator(message.routed_from))
        ):
            # Whatever the policy: an operator's stop holds every producer, by the address it
            # wrote too. (reject and reject_after refused theirs on arrival: none comes here.)
            return True
        policy = destination.policy
        if policy.when_full != "flow" or policy.settings.get("reject_after") is not None:
            return None
        # As qpidd holds the completion of what is enqueued while flow is ON (seed 000),
        # not of what was in before the stop. In front of a broker an outcome comes after
        # the transfers that followed it were counted: decided at the outcome alone, a
        # window of transfers sent at once was held whole, the first five of a stop at 5
        # included.
        entry = self._entry(destination)
        return entry.state.stopped and message.sequence >= entry.stopped_from

    def _full(self, destination: Destination) -> str:
        limits = self._entry(destination).state.limits
        if self.stopped_by_operator(destination.address):
            return _stopped_by_operator(destination.address)
        staged = (
            f" (+ {destination.staged_count} messages / {destination.staged_bytes} bytes in open transactions)"
            if destination.staged_count
            else ""
        )
        return (
            f"destination {destination.address!r} is full: depth {destination.depth} messages / "
            f"{destination.bytes} bytes{staged}, flow_stop_count {limits.stop_count}, "
            f"flow_stop_size {limits.stop_size}"
        )

    # --- operators ----------------------------------------------------------------------

    def stop_producers(self, pattern: str) -> None:
        self._stopped_patterns.add(pattern)
        log.info("producers_stopped", pattern=pattern)

    def start_producers(self, pattern: str) -> bool:
        """Undo ``stop_producers(pattern)`` (``>`` starts everything). False if nothing was stopped."""
        if pattern == ">":
            found = bool(self._stopped_patterns)
            self._stopped_patterns.clear()
        else:
            found = pattern in self._stopped_patterns
            self._stopped_patterns.discard(pattern)
        if found:
            log.info("producers_started", pattern=pattern)
            self._wake_soon(None)
        return found

    @property
    def stopped_patterns(self) -> list[str]:
        return sorted(self._stopped_patterns)

    def _producers_route(self, action: str, request: AdminRequest) -> dict[str, Any]:
        """POST /v1/producers/{stop,start} {"pattern": ...}: what ``qpid-flow producers`` sends."""
        pattern = required_string(request.body, "pattern")
        if self._control is not None:
            pattern = self._control.destination_name(pattern)  # /queue/orders: orders
        check_pattern(pattern, "pattern")  # as the configuration's destination patterns are
        if action == "stop":
            self.stop_producers(pattern)
        elif not self.start_producers(pattern):
            # Only a stop's own pattern (or ">") undoes it: say so rather than answer as if
            # the producers were going again (answered 404).
            in_force = ", ".join(repr(p) for p in self.stopped_patterns) or "none"
            raise KeyError(f"no producers stopped by {pattern!r}; stops in force: {in_force}")
        control = self._control
        addresses = [d.address for d in control.destinations()] if control is not None else []
        matching = [address for address in addresses if self.stopped_by_operator(address)]
        return {"action": action, "pattern": pattern, "stopped": self.stopped_patterns, "destinations": matching}

    @hookimpl
    def qpid_flow_producers_held(self, destination: Destination) -> bool:
        return self.holds_producers(destination)

    # --- statistics -----------------------------------------------------------------------

    @hookimpl
    def qpid_flow_destination_stats(self, destination: Destination) -> dict[str, Any]:
        entry = self._entry(destination)
        state = entry.state
        blocked = self._blocked(destination) or self._memory_full()
        # Blocked: without credit while flow is stopped, or waiting for the answer to a
        # transfer (held unforwarded, or its settlement delayed); each counted once.
        blocked_ids = {p.id for p in destination.producers if p.credit == 0} if blocked else set()
        control = self._control
        if control is not None:
            blocked_ids |= control.waiting_producers(destination.address)
        held = control.held_transfers(destination.address) if control is not None else 0
        return {
            "flowStopped": state.stopped,
            "flowStoppedCount": state.stopped_count,
            "flowStoppedSeconds": round(state.seconds_stopped(self._clock()), 3),
            "producersStopped": self.stopped_by_operator(destination.address),
            "producersBlocked": len(blocked_ids),
            "transfersHeld": held,  # unforwarded, unsettled, waiting for room (any cause)
            **state.limits.as_dict(),
        }


def _stopped_by_operator(address: str | None) -> str:
    return f"producers of {address!r} are stopped by an operator"
