"""A destination: the messages of one address waiting for consumers, and their accounting.

Plain Python, no Proton: the router hands it messages and consumers, and it calls
``consumer.deliver`` when a message should go out. Which consumer gets which message
is the ``qpid_flow_consumer_select`` hook's answer.

Standalone, a destination is the queue itself. In front of a broker, consumers' links are
mirrored to the broker and the destination only counts (depth, consumers); for a grouped
destination it holds what qpid-flow's own upstream receiver fetched ahead for its
consumers; those messages stay unsettled upstream until a consumer settles them
(``Message.on_dequeue``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from qpid_flow.core.model import SELECT_AFTER_FAILURE, Consumer, Hold, Message, Outcome, Producer, Settlement
from qpid_flow.core.queues import FifoQueue, MessageQueue

if TYPE_CHECKING:
    from qpid_flow.config import DestinationPolicy
    from qpid_flow.core.memory import MemoryMeter
    from qpid_flow.plugin.manager import Hooks

__all__ = ["Destination", "MirroredConsumer"]

log = structlog.get_logger(__name__)

# How far past a message that must wait the dispatcher looks for others that can go.
DEFAULT_LOOKAHEAD = 1000

# How long the broker's readings must keep finding the depth above what the broker can hold
# before it is lowered: longer than a burst of transfers or confirmations takes to land.
BROKER_EXCESS_SETTLE = 1.0

RING_DROPPED = Settlement(Outcome.REJECTED, "qpid-flow:ring-dropped", "dropped to make room on a ring destination")
PURGED = Settlement(Outcome.REJECTED, "qpid-flow:purged", "purged by an operator")
DELETED = Settlement(Outcome.REJECTED, "qpid-flow:deleted", "its destination was deleted")
# The pauses before a destination hands messages out again after its consumer selection
# failed: the first, and the longest (as for producer credit after a failed policy).
SELECT_RETRY_FIRST = 1.0
SELECT_RETRY_LONGEST = 30.0
_NO_CONSUMER_TAKES_IT = Hold("no ready consumer takes it (selector, max-message-size)")
EXPIRED = Settlement(Outcome.REJECTED, "qpid-flow:expired", "its time to live ran out before it was delivered")


class MirroredConsumer(Protocol):
    """In front of a broker: a consumer whose link is mirrored to the broker's queue.

    The broker hands it messages directly; they never enter the destination's queue, but
    the broker no longer counts them ready until the client settles them."""

    @property
    def held(self) -> int:
        """Messages the broker handed it and the client has not settled (waiting here for
        the client's credit, or out to the client)."""
        ...

    @property
    def broker_credit(self) -> int:
        """Credit the broker has outstanding on its link: messages it may have sent that
        have not arrived yet."""
        ...


class LeftUnsettled(Protocol):
    """In front of a broker: a mirrored consumer's link gone with messages unsettled.
    RabbitMQ neither redelivers them nor counts them ready while the link's session lasts
    (it requeues them when the session ends)."""

    @property
    def held(self) -> int:
        """Messages the broker still holds for the gone link (0 once its session ended)."""
        ...


class Destination:
    """One address: its waiting messages, consumers, producers and counters."""

    def __init__(
        self,
        address: str,
        policy: DestinationPolicy,
        hooks: Hooks,
        lookahead: int = DEFAULT_LOOKAHEAD,
        memory: MemoryMeter | None = None,
    ) -> None:
        self.address = address
        self.policy = policy
        self._hooks = hooks
        self._memory = memory
        # Waiting for a consumer; a plugin may install another kind (message groups).
        self._turn = 0
        self._selective = 0  # consumers with a selector or a size limit: only then is each message checked
        self.browsers: list[Consumer] = []  # distribution-mode copy: they see, others take
        # A message went back to the queue since the browsers last looked at all of it: it
        # keeps its older sequence, below where a browser has got to (see enqueue).
        self._requeued_for_browsers = False
        self.queue: MessageQueue = FifoQueue(self.queue_select, lookahead)
        self.consumers: list[Consumer] = []
        self.producers: set[Producer] = set()
        # Depth counts every message admitted and not yet dequeued: waiting ones and those
        # a consumer holds unsettled (as qpidd counts acquired messages). In front of a
        # broker it is what passed through qpid-flow (and what a plugin learns from the
        # broker); standalone, what the queue holds.
        self.depth = 0
        self.bytes = 0
        self.enqueued_total = 0
        self.dequeued_total = 0
        self.ring_dropped = 0
        self.expired = 0
        # Producers' transfers rejected (a policy, a full destination, a message that
        # cannot be decoded, or the broker): qpidd counts its own as discardsOverflow.
        self.refused = 0
        # What consumers did with it (metrics and statistics; read, never reset):
        # handed out, and settled accepted / rejected / released or modified.
        self.delivered_total = 0
        self.acknowledged = 0
        self.rejected = 0
        self.released = 0
        self.expiring = False  # a message with a time to live has been here: sweep it
        self.temporary = False  # made for a dynamic source: deleted with its link
        self.idle_since: float | None = None  # when it was last found unused (forgetting)
        self.largest_message = 0  # for estimating how many more messages fit in bytes
        self.newest_in = 0  # the sequence number of the message counted in last
        # Transfers admitted in open transactions, enqueued at their commit: not in the
        # depth yet, but flow control must not grant credit as if they were not coming.
        self.staged_count = 0
        self.staged_bytes = 0
        # In front of a broker: forwarded, and the broker has not given its outcome yet.
        self.in_flight = 0
        # In front of a broker: credit the shared upstream receiver has outstanding (what
        # the broker may have sent that has not arrived yet).
        self.upstream_credit = 0
        # In front of a broker: consumers whose links are mirrored to the broker (they get
        # their messages from it directly, not from this destination's queue).
        self.mirrored: set[MirroredConsumer] = set()
        # In front of a broker: consumers of an address that is no queue (an exchange, a
        # topic), each reading a queue of its own the broker made: counted, with no depth.
        self.subscribers = 0
        # In front of a broker: the broker is known to have this queue (it took a link to it).
        self.at_broker = False
        # In front of a broker: consumers gone with messages unsettled that the broker
        # still holds for them (as unacknowledged, not ready) until their session ends.
        self.left_unsettled: list[LeftUnsettled] = []
        # (side, since when): the broker's readings have found the depth above (1) or
        # below (-1) the bounds they prove, since then.
        self._outside_broker_bounds: tuple[int, float] | None = None
        # Whether a plugin reads the broker's own figure for it (set_broker_backlog).
        self.broker_backlog_read = False
        # Per-destination state that plugins keep, by plugin name.
        self.plugin_state: dict[str, Any] = {}
        # When to hand messages out again after a failed consumer selection (monotonic
        # clock; None: none failed), and the pause before that.
        self.select_retry: float | None = None
        self._select_pause = SELECT_RETRY_FIRST

    @property
    def hooks(self) -> Hooks:
        """The hooks this destination calls (for the queues and policies plugins install)."""
        return self._hooks

    # --- room ---------------------------------------------------------------------------

    def queue_select(
        self, *, destination: Destination, message: Message, consumers: Sequence[Consumer], taking: bool = False
    ) -> Any:
        """The consumer-selection hook, as queues call it (plugins' queues too). ``None``
        from every plugin is no opinion: the consumers take turns. Consumers that do not
        take the message (:meth:`Consumer.takes`: selector, max-message-size) are not
        offered it; ``taking``: the queue gives only consumers it found take it (a
        selector is not evaluated twice per message)."""
        if self._selective and not taking:
            consumers = [c for c in consumers if c.takes(message)]
            if not consumers:
                return _NO_CONSUMER_TAKES_IT
        # A tuple of its own: the list is the queue's, which a plugin's pop() emptied for
        # the rest of the pass (and a plugin that kept it would see it change).
        offered = tuple(consumers)
        choice = self._hooks.consumer_select(destination=destination, message=message, consumers=offered)
        if choice is None:
            self._turn += 1
            return offered[self._turn % len(offered)]
        if choice is SELECT_AFTER_FAILURE and self.select_retry is None:
            # Nothing else may hand the message out again (no consumer's credit or
            # settlement need come): the housekeeping asks again (dispatch_again).
            self.select_retry = time.monotonic() + self._select_pause
        return choice

    def dispatch_again(self, now: float) -> None:
        """Hand messages out again once the pause after a failed consumer selection (a
        plugin raised, or answered no consumer offered) is over; the pause doubles, up to
        SELECT_RETRY_LONGEST, while the selection keeps failing (each failure is logged)."""
        if self.select_retry is None or now < self.select_retry:
            return
        self.select_retry = None
        self.dispatch()
        if self.select_retry is None:
            self._select_pause = SELECT_RETRY_FIRST
        else:  # failed again
            self._select_pause = min(self._select_pause * 2, SELECT_RETRY_LONGEST)
            self.select_retry = now + self._select_pause

    def has_room_for(self, message: Message) -> bool:
        """False when ``message`` would take the destination past ``max_count`` / ``max_size``."""
        max_count = self.policy.max_count or 0
        max_size = self.policy.max_size or 0
        if max_count and self.depth + 1 > max_count:
            return False
        return not (max_size and self.bytes + message.size > max_size)

    def expire_to_fit(self, count: int, size: int) -> None:
        """An expired message is dequeued whenever the sweep comes and holds no room: when
        ``count`` more messages of ``size`` bytes would not fit, the expired ones go now
        (a full ring dropped a live message and kept one that had expired; a full queue
        refused a message, or a transaction's commit, that would have fitted)."""
        if not self.has_room_for_many(count, size):
            self.expire(time.time())

    def room_by_dropping_waiting(self, message: Message) -> bool:
        """Whether dropping waiting messages can make room for ``message``: not if it is
        larger than ``max_size`` alone."""
        max_size = self.policy.max_size or 0
        return not (max_size and message.size > max_size)

    def has_room_for_many(self, count: int, size: int) -> bool:
        """False when ``count`` more messages of ``size`` bytes in all would not fit (a
        transaction's commit enqueues all of them or none)."""
        max_count = self.policy.max_count or 0
        max_size = self.policy.max_size or 0
        if max_count and self.depth + count > max_count:
            return False
        return not (max_size and self.bytes + size > max_size)

    def limit_description(self) -> str:
        return (
            f"destination {self.address!r} is full: depth {self.depth} of max_count "
            f"{self.policy.max_count or 'unlimited'}, {self.bytes} bytes of max_size "
            f"{self.policy.max_size or 'unlimited'}"
        )

    # --- messages in --------------------------------------------------------------------

    def count_in(self, message: Message) -> None:
        """A message was admitted to this destination: it counts in the depth now."""
        self._counted_in(message)
        self._hooks.depth_changed(destination=self)

    def _counted_in(self, message: Message) -> None:
        size = message.size
        self.depth += 1
        self.bytes += size
        self.enqueued_total += 1
        if size > self.largest_message:
            self.largest_message = size
        self.newest_in = message.sequence

    def count_out(self, message: Message) -> None:
        """A message left for good (or never made it to the broker)."""
        self._left(message.size)
        self._hooks.depth_changed(destination=self)

    def settled_at_broker(self, message: Message | None, consumer: Any, settlement: Settlement) -> None:
        """A consumer mirrored to the broker's queue settled ``message`` (None: one qpid-flow
        kept no record of): it leaves the depth if the outcome removes it, and plugins hear
        of it, its settle before the depth change it causes (as :meth:`_dequeue`: a
        flow_resumed numbered before the settle that caused it read as a resume above
        the resume threshold)."""
        leaves = bool(self.depth) and settlement.outcome.removes_message
        if leaves:
            self._left(self._relayed_size())
        if message is not None:
            self._hooks.message_settled(destination=self, message=message, consumer=consumer, settlement=settlement)
        if leaves:
            self._hooks.depth_changed(destination=self)

    def _relayed_size(self) -> int:
        """What a message the broker delivered takes out of ``bytes``. Its bytes as the
        broker sent them are not the bytes counted in (RabbitMQ re-encodes a message, and a
        producer may have sent it to the broker directly), and subtracting those let
        ``bytes`` drift from the backlog, away from zero with the queue empty. The
        backlog's average size leaves instead: the bytes reach zero with the depth."""
        return self.bytes // self.depth if self.depth else 0

    def _left(self, size: int) -> None:
        # Messages a producer put in the broker directly are consumed through qpid-flow
        # without having been counted in: never go below zero.
        self.depth = max(0, self.depth - 1)
        self.bytes = max(0, self.bytes - size)
        self.dequeued_total += 1

    def enqueue(self, message: Message, counted: bool = True) -> None:
        """Add a message at the back and hand it out if a consumer can take it.

        ``counted=False`` for a message fetched from the broker: it was counted when it
        passed through qpid-flow on its way in (or the broker's backlog counts it).
        """
        self.queue.append(message)
        if self._memory is not None:
            self._memory.add(message.size)
        if counted:
            self._counted_in(message)
        # The message's record before what it causes (flow control turning ON): the event
        # log numbers events in this order, and a reader replaying it saw flow stop at a
        # depth below the threshold, the enqueue that passed it only after.
        self._hooks.message_enqueued(destination=self, message=message)
        if counted:
            self._hooks.depth_changed(destination=self)
        if self.browsers:
            if self._requeued_for_browsers:
                # A message went back meanwhile, behind where browsers have got to: look
                # at the whole queue once.
                self._requeued_for_browsers = False
                for browser in self.browsers:
                    self.browse(browser)
            else:
                now = time.time()
                for browser in self.browsers:
                    # A browser with credit left has seen every message waiting before
                    # this one (a browse ends with no credit or past the last): show it
                    # just this one, not a scan of the whole queue for every message.
                    if browser.credit > 0 and message.sequence > browser.browse_after:
                        self._show(browser, message, now)
        if self.consumers:
            self.dispatch()

    @property
    def dispatched_by_plugin(self) -> bool:
        """Whether a plugin hands this destination's messages out with a queue of its own
        (:meth:`replace_queue`; message groups do). In front of a broker, qpid-flow then
        reads the broker's queue itself rather than mirroring each consumer to it."""
        return not isinstance(self.queue, FifoQueue)

    def replace_queue(self, queue: MessageQueue | None = None) -> None:
        """Switch to another kind of queue (None: plain FIFO), keeping the waiting messages."""
        new = queue if queue is not None else FifoQueue(self.queue_select)
        for message in self.queue:
            new.append(message)
        self.queue = new
        self.dispatch()

    # --- consumers ----------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        if consumer.browser:
            self.browsers.append(consumer)
            self._hooks.consumer_attached(consumer=consumer, destination=self)
            return
        if consumer.choosy:
            self._selective += 1
        self.consumers.append(consumer)
        self._hooks.consumer_attached(consumer=consumer, destination=self)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach a consumer: everything it held goes back to the front, in order."""
        if consumer in self.browsers:
            self.browsers.remove(consumer)
            consumer.credit = 0
            self._hooks.consumer_detached(consumer=consumer, destination=self)
            return
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if consumer.choosy:
                self._selective -= 1
        consumer.credit = 0
        # A queue that reports why groups are freed (message groups) is told it is a detach.
        reason = getattr(self.queue, "release_reason", None)
        with reason("detached") if reason is not None else nullcontext():
            self.release_held(consumer)
        self.queue.consumer_gone(consumer)
        self._hooks.consumer_detached(consumer=consumer, destination=self)
        self.dispatch()

    def release_held(self, consumer: Consumer, messages: list[Message] | None = None) -> None:
        """Release what ``consumer`` holds (all, or just ``messages``) back in order, as if
        it had released them itself: on detach, on shutdown, when a group lease expires."""
        if messages is None:
            messages = list(consumer.held.values())
        released = Settlement.released()
        for message in sorted(messages, key=_sequence_of, reverse=True):
            if consumer.held.pop(message.sequence, None) is None:
                continue
            message.delivery_failed()  # handed out, never settled: a failed attempt
            self.count_settled(Outcome.RELEASED)  # as the event log's settle records it
            self.queue.released(consumer, message)
            self.queue.requeue(message)
            self._requeued_for_browsers = True
            self._hooks.message_settled(destination=self, message=message, consumer=None, settlement=released)

    def credit_changed(self, consumer: Consumer, credit: int) -> None:
        """The consumer's link credit is now ``credit``; send what it can take."""
        if consumer.browser:
            consumer.credit = credit
            self.browse(consumer)
            return
        had_none = consumer.credit <= 0
        consumer.credit = credit
        if credit > 0 and self.queue:
            if had_none:
                self.queue.consumer_ready(consumer)
            self.dispatch()

    def browse(self, browser: Consumer) -> None:
        """Send a browser copies of the waiting messages it has not seen, in order, as its
        credit allows; the messages stay where they are."""
        if browser.credit <= 0 or not self.queue:
            return
        now = time.time()
        for message in list(self.queue):
            if browser.credit <= 0:
                return
            if message.sequence > browser.browse_after:
                self._show(browser, message, now)

    def _show(self, browser: Consumer, message: Message, now: float) -> None:
        """Send ``browser`` a copy of ``message`` (one it has not seen) if it takes it."""
        browser.browse_after = message.sequence
        if message.expires is not None and message.expires <= now:
            return
        if browser.choosy and not browser.takes(message):
            return
        browser.credit -= 1
        browser.deliver(browser, message)

    def dispatch(self) -> None:
        """Hand waiting messages to consumers with credit."""
        if not self.queue:
            return
        ready = [c for c in self.consumers if c.credit > 0]
        if ready:
            self.queue.dispatch(self, ready, self._send)

    def _send(self, consumer: Consumer, message: Message) -> None:
        if message.expires is not None and message.expires <= time.time():
            # Chosen, but never delivered: it leaves as expired and the credit stays.
            self.queue.released(consumer, message, True)
            self.expired += 1
            self._dequeue(message, None, EXPIRED)
            return
        consumer.credit -= 1
        message.delivery_count += 1
        self.delivered_total += 1
        if consumer.presettled:
            self.acknowledged += 1  # settled on sending: at-most-once counts as accepted
            consumer.deliver(consumer, message)
            self._hooks.message_delivered(destination=self, message=message, consumer=consumer)
            self.queue.released(consumer, message, True)
            self._dequeue(message, consumer, Settlement.accepted())
            return
        consumer.held[message.sequence] = message
        consumer.deliver(consumer, message)
        self._hooks.message_delivered(destination=self, message=message, consumer=consumer)

    # --- settlement ---------------------------------------------------------------------

    def settle(self, consumer: Consumer, message: Message, settlement: Settlement) -> None:
        """A consumer settled ``message``: it leaves (accepted, rejected, modified
        undeliverable-here) or goes back (released, modified)."""
        if consumer.held.pop(message.sequence, None) is None:
            return  # already released (consumer detached) or settled twice
        self.count_settled(settlement.outcome)
        # undeliverable-here: it must not go back to this consumer (AMQP 1.0, 3.4.5); it
        # leaves, as RabbitMQ drops it. In front of a broker, the broker is told modified
        # and may route it elsewhere.
        leaves = settlement.outcome.removes_message or (
            settlement.outcome is Outcome.MODIFIED and settlement.undeliverable_here
        )
        self.queue.released(consumer, message, leaves)
        if leaves:
            self._dequeue(message, consumer, settlement)
            if self.queue:
                self.dispatch()  # settling may free a message group for others
            return
        if settlement.delivery_failed:
            message.delivery_failed()  # modified(delivery-failed); released does not count
        self.queue.requeue(message)
        self._requeued_for_browsers = True
        self._hooks.message_settled(destination=self, message=message, consumer=consumer, settlement=settlement)
        self.dispatch()

    def replace_data(self, message: Message, data: bytes) -> None:
        """``message`` goes out as ``data`` from now on (annotations a ``modified`` outcome
        added): its size, this destination's bytes and the memory meter follow."""
        delta = len(data) - message.size
        message.replace_data(data)
        if not message.upstream_epoch:
            # A message fetched from the broker was never counted in (its bytes leave as the
            # backlog's average): counted here, they stayed with the queue empty, and a
            # destination over flow_stop_size stayed stopped for good.
            self.bytes = max(0, self.bytes + delta)
        if self._memory is not None:
            if delta > 0:
                self._memory.add(delta, messages=0)
            else:
                self._memory.sub(-delta, messages=0)

    def count_settled(self, outcome: Outcome) -> None:
        """Count a consumer's outcome (also called for consumers mirrored to a broker)."""
        if outcome is Outcome.ACCEPTED:
            self.acknowledged += 1
        elif outcome is Outcome.REJECTED:
            self.rejected += 1
        else:
            self.released += 1  # released or modified (back, unless undeliverable-here)

    def _dequeue(self, message: Message, consumer: Consumer | None, settlement: Settlement) -> None:
        if self._memory is not None:
            self._memory.sub(message.size)
        if message.on_dequeue is not None:
            message.on_dequeue(settlement)
        # Fetched from the broker, in the broker's encoding: see _relayed_size.
        self._left(self._relayed_size() if message.upstream_epoch else message.size)
        # Its record before what it causes (flow control turning OFF), as in enqueue.
        self._hooks.message_settled(destination=self, message=message, consumer=consumer, settlement=settlement)
        self._hooks.depth_changed(destination=self)

    def drop_oldest(self) -> bool:
        """Ring: drop the oldest waiting message to make room. False if none is waiting."""
        message = self.queue.pop_oldest()
        if message is None:
            return False
        self.ring_dropped += 1
        self._dequeue(message, None, RING_DROPPED)
        return True

    def expire(self, now: float) -> int:
        """Take out waiting messages whose time to live ran out (those consumers hold are
        checked if they come back). Returns how many."""
        gone = self.queue.remove_where(lambda m: m.expires is not None and m.expires <= now)
        for message in gone:
            self.expired += 1
            self._dequeue(message, None, EXPIRED)
        if gone and self.queue:
            # What an expired message kept waiting (a group's head no consumer takes, its
            # group behind it) may go now.
            self.dispatch()
        return len(gone)

    def purge(self) -> int:
        """Drop every waiting message (not those consumers hold). Returns how many."""
        dropped = 0
        while (message := self.queue.pop_oldest()) is not None:
            self._dequeue(message, None, PURGED)
            dropped += 1
        return dropped

    def broker_lost(self) -> None:
        """In front of a broker: the broker was lost, and what qpid-flow counted in it may
        be gone with it (RabbitMQ declares plain queue names non-durable: a restart empties
        them). Counted as still there, a stopped destination would stay stopped for good.
        So, unless a plugin reads the broker's own figure (and will correct it), the depth
        restarts from what qpid-flow itself holds: an undercount, if the broker kept them,
        lets producers pass the threshold once by at most that backlog."""
        if self.broker_backlog_read:
            return
        held = len(self.queue) + sum(len(c.held) for c in self.consumers)
        if self.depth <= held:
            return
        average = self.bytes // self.depth if self.depth else 0
        self.depth = held
        self.bytes = held * average
        self._outside_broker_bounds = None
        self._hooks.depth_changed(destination=self)

    def set_broker_backlog(self, ready: int, now: float | None = None) -> None:
        """What the broker says it holds ready for this address (from a plugin); ``now``:
        the reading's ``time.monotonic()``, when the caller knows it.

        The broker's figure proves a lower bound: ready + what qpid-flow fetched and holds
        unsettled (for its own consumers, and for mirrored ones: RabbitMQ counts a message
        out to a consumer as unacknowledged, not ready). The depth may exceed it by what
        qpid-flow forwarded and the broker has not confirmed (the broker may have queued
        it already, and then it is among the ready: it cannot count twice) and by the
        credit the upstream links have outstanding (messages the broker sent that have not
        arrived): that is the upper bound.

        qpid-flow's own count is kept when it lies within those bounds (it is exact for
        what passed through). Below the lower bound it is raised (a backlog left in the
        broker): at once while no consumer holds any of its messages, else once the
        readings have found it below for ``BROKER_EXCESS_SETTLE`` seconds, since a reading
        taken a moment ago may count as ready messages held here by now. Above the upper
        bound it is lowered (messages consumed elsewhere) once the readings have found it
        above for that long: a single reading can catch messages in no count (on their way
        to a consumer, as RabbitMQ sends beyond the credit it was given; or confirmed to
        qpid-flow between the reading and its arrival here), and lowering on it would
        resume producers against a full queue. Bytes are estimated from the average size
        of the messages seen.
        """
        self.broker_backlog_read = True
        fetched = len(self.queue) + sum(len(c.held) for c in self.consumers)
        fetched += sum(m.held for m in self.mirrored) + self.held_for_gone_consumers()
        lowest = max(0, ready) + fetched
        highest = lowest + self.in_flight + self.upstream_credit + sum(max(m.broker_credit, 0) for m in self.mirrored)
        if self.depth > highest:
            if not self._outside_broker_bounds_for_a_while(1, now):
                return
            depth = highest
        elif self.depth < lowest:
            # With messages out to consumers, a reading taken a moment ago may count as
            # ready some that are held here now: raise only if it lasts.
            if fetched and not self._outside_broker_bounds_for_a_while(-1, now):
                return
            depth = lowest
        else:
            self._outside_broker_bounds = None
            return
        self._outside_broker_bounds = None
        average = self.bytes // self.depth if self.depth else self.largest_message
        self.depth = depth
        self.bytes = depth * average
        self._hooks.depth_changed(destination=self)

    def consumer_left_unsettled(self, left: LeftUnsettled) -> None:
        """A mirrored consumer went with messages the broker still holds for it."""
        self.held_for_gone_consumers()  # drops those whose session has ended since
        self.left_unsettled.append(left)

    def held_for_gone_consumers(self) -> int:
        """Messages the broker holds for gone consumers (``left_unsettled``), forgetting
        the gone consumers whose session has ended."""
        counts = [left.held for left in self.left_unsettled]
        if 0 in counts:
            self.left_unsettled = [left for left, count in zip(self.left_unsettled, counts, strict=True) if count]
        return sum(counts)

    def _outside_broker_bounds_for_a_while(self, side: int, now: float | None) -> bool:
        """The broker's readings have found the depth on ``side`` of their bounds (1 above,
        -1 below) for ``BROKER_EXCESS_SETTLE`` seconds, this one included."""
        now = time.monotonic() if now is None else now
        if self._outside_broker_bounds is None or self._outside_broker_bounds[0] != side:
            self._outside_broker_bounds = (side, now)
        return now - self._outside_broker_bounds[1] >= BROKER_EXCESS_SETTLE

    def forget(self, predicate: Callable[[Message], bool]) -> int:
        """Drop messages matching ``predicate`` without an outcome (their source is gone).

        Used when the broker connection drops: the broker still has those messages and
        will deliver them again, so they still count in the depth. Returns how many.
        """
        gone: list[Message] = []
        for consumer in self.consumers:
            for sequence, message in list(consumer.held.items()):
                if predicate(message):
                    del consumer.held[sequence]
                    self.queue.released(consumer, message)
                    gone.append(message)
        gone.extend(self.queue.remove_where(predicate))
        if self._memory is not None:
            self._memory.sub(sum(m.size for m in gone), messages=len(gone))
        return len(gone)

    # --- reading --------------------------------------------------------------------------

    @property
    def unused(self) -> bool:
        """Nothing refers to it any more: it can be forgotten."""
        return not (
            self.consumers
            or self.browsers
            or self.producers
            or self.depth
            or self.mirrored
            or self.in_flight
            or self.subscribers
        )

    def delete(self) -> int:
        """Drop every waiting message (the destination is going away); how many."""
        dropped = 0
        while (message := self.queue.pop_oldest()) is not None:
            self._dequeue(message, None, DELETED)
            dropped += 1
        return dropped

    def stats(self) -> dict[str, Any]:
        """The destination's statistics; plugins add theirs (``qpid_flow_destination_stats``)."""
        record: dict[str, Any] = {
            "name": self.address,
            "depth": self.depth,
            "bytes": self.bytes,
            "waiting": len(self.queue),
            "held": sum(len(c.held) for c in self.consumers),
            "enqueued": self.enqueued_total,
            "dequeued": self.dequeued_total,
            "delivered": self.delivered_total,
            "acknowledged": self.acknowledged,
            "rejected": self.rejected,
            "released": self.released,
            "ringDropped": self.ring_dropped,
            "expired": self.expired,
            "refused": self.refused,
            "producers": len(self.producers),
            "consumers": len(self.consumers) + len(self.browsers) + len(self.mirrored) + self.subscribers,
            "maxCount": self.policy.max_count or 0,
            "maxSize": self.policy.max_size or 0,
            "limitPolicy": self.policy.when_full,
            "policy": self.policy.pattern,
        }
        # qpid-flow's own fields stay as they are: a plugin's "depth" made every statistics
        # reader, and the metric, say what it chose. Between plugins, as pluggy calls
        # them: the one called last (registered first: the built-ins) has the last word.
        own = set(record)
        for extra in self._hooks.destination_stats(destination=self) or ():
            for field, value in (extra or {}).items():
                if field in own:
                    _field_taken(field, value)
                else:
                    record[field] = value
        return record


def _field_taken(field: str, value: Any) -> None:
    from qpid_flow.plugin.manager import PLUGIN_ERRORS  # only here: core does not import plugins

    PLUGIN_ERRORS["qpid_flow_destination_stats"] += 1
    log.error(
        "plugin_error",
        hook="qpid_flow_destination_stats",
        answer=repr({field: value}),
        plugin="(a destination_stats implementation)",
        error=f"field {field!r} is qpid-flow's own: left out",
    )


def _sequence_of(message: Message) -> int:
    return message.sequence
