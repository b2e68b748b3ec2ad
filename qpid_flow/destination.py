"""A destination: the messages of one address waiting for consumers, and their accounting.

Plain Python, no Proton: the router hands it messages and consumers, and it calls
``consumer.deliver`` when a message should go out. Which consumer gets which message
is the ``qpid_flow_consumer_select`` hook's answer.

Standalone, a destination is the queue itself. In front of a broker it holds what the
shared upstream receiver fetched ahead for the local consumers; those messages stay
unsettled upstream until a consumer settles them (``Message.on_dequeue``).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qpid_flow.model import Consumer, Hold, Message, Outcome, Producer, Settlement

if TYPE_CHECKING:
    from qpid_flow.config import DestinationPolicy
    from qpid_flow.manager import Hooks

__all__ = ["Destination"]

# How far past a message that must wait the dispatcher looks for others that can go.
DEFAULT_LOOKAHEAD = 1000


class Destination:
    """One address: its waiting messages, consumers, producers and counters."""

    def __init__(
        self,
        address: str,
        policy: DestinationPolicy,
        hooks: Hooks,
        clock: Callable[[], float] = time.monotonic,
        lookahead: int = DEFAULT_LOOKAHEAD,
    ) -> None:
        self.address = address
        self.policy = policy
        self._hooks = hooks
        self._clock = clock
        self._lookahead = lookahead
        self.queue: deque[Message] = deque()  # ready for a consumer, in order
        self.consumers: list[Consumer] = []
        self.producers: set[Producer] = set()
        # Depth counts every message not yet dequeued: waiting ones and those a consumer
        # holds unsettled (as qpidd counts acquired messages).
        self.depth = 0
        self.bytes = 0
        self.enqueued_total = 0
        self.dequeued_total = 0
        # Per-destination state that plugins keep, by plugin name.
        self.plugin_state: dict[str, Any] = {}

    # --- room ---------------------------------------------------------------------------

    def has_room_for(self, message: Message) -> bool:
        """False when ``message`` would take the destination past ``max_count`` / ``max_size``."""
        max_count = self.policy.max_count or 0
        max_size = self.policy.max_size or 0
        if max_count and self.depth + 1 > max_count:
            return False
        return not (max_size and self.bytes + message.size > max_size)

    def limit_description(self) -> str:
        return (
            f"destination {self.address!r} is full: depth {self.depth} of max_count "
            f"{self.policy.max_count or 'unlimited'}, {self.bytes} bytes of max_size "
            f"{self.policy.max_size or 'unlimited'}"
        )

    # --- messages in --------------------------------------------------------------------

    def enqueue(self, message: Message) -> None:
        """Add a message at the back and hand it out if a consumer can take it."""
        message.enqueued_at = self._clock()
        self.queue.append(message)
        self.depth += 1
        self.bytes += message.size
        self.enqueued_total += 1
        self._hooks.message_enqueued(destination=self, message=message)
        if self.consumers:
            self.dispatch()

    def _requeue(self, message: Message) -> None:
        """Put a released message back in its original place (before later messages)."""
        queue = self.queue
        if not queue or message.sequence < queue[0].sequence:
            queue.appendleft(message)
        else:
            index = bisect.bisect_left(queue, message.sequence, key=_sequence_of)
            queue.insert(index, message)

    # --- consumers ----------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._hooks.consumer_attached(consumer=consumer, destination=self)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach a consumer: everything it held goes back to the front, in order."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        consumer.credit = 0
        self.release_held(consumer)
        self._hooks.consumer_detached(consumer=consumer, destination=self)
        self.dispatch()

    def release_held(self, consumer: Consumer) -> None:
        """Release every message ``consumer`` holds, as if it had released them itself."""
        held = sorted(consumer.held.values(), key=_sequence_of, reverse=True)
        consumer.held.clear()
        released = Settlement.released()
        for message in held:
            self._requeue(message)
            self._hooks.message_settled(destination=self, message=message, consumer=None, settlement=released)

    def credit_changed(self, consumer: Consumer, credit: int) -> None:
        """The consumer's link credit is now ``credit``; send what it can take."""
        consumer.credit = credit
        if credit > 0 and self.queue:
            self.dispatch()

    def dispatch(self) -> None:
        """Hand waiting messages to consumers with credit, as the selection hook decides."""
        queue = self.queue
        if not queue:
            return
        ready = [c for c in self.consumers if c.credit > 0]
        index = 0
        select = self._hooks.consumer_select
        while ready and index < len(queue) and index < self._lookahead:
            message = queue[index]
            choice = select(destination=self, message=message, consumers=ready)
            if choice is None or isinstance(choice, Hold):
                index += 1  # this one waits; groups behind it must not
                continue
            del queue[index]
            self._send(choice, message)
            if choice.credit <= 0:
                ready.remove(choice)

    def _send(self, consumer: Consumer, message: Message) -> None:
        consumer.credit -= 1
        message.delivery_count += 1
        if consumer.presettled:
            consumer.deliver(consumer, message)
            self._hooks.message_delivered(destination=self, message=message, consumer=consumer)
            self._dequeue(message, consumer, Settlement.accepted())
            return
        consumer.held[message.sequence] = message
        consumer.deliver(consumer, message)
        self._hooks.message_delivered(destination=self, message=message, consumer=consumer)

    # --- settlement ---------------------------------------------------------------------

    def settle(self, consumer: Consumer, message: Message, settlement: Settlement) -> None:
        """A consumer settled ``message``: it leaves (accepted, rejected) or goes back."""
        if consumer.held.pop(message.sequence, None) is None:
            return  # already released (consumer detached) or settled twice
        if settlement.outcome.removes_message or (
            settlement.outcome is Outcome.MODIFIED and settlement.undeliverable_here and message.on_dequeue
        ):
            # undeliverable-here in front of a broker: let the broker route it elsewhere.
            self._dequeue(message, consumer, settlement)
            return
        self._requeue(message)
        self._hooks.message_settled(destination=self, message=message, consumer=consumer, settlement=settlement)
        self.dispatch()

    def _dequeue(self, message: Message, consumer: Consumer | None, settlement: Settlement) -> None:
        self.depth -= 1
        self.bytes -= message.size
        self.dequeued_total += 1
        if message.on_dequeue is not None:
            message.on_dequeue(settlement)
        self._hooks.message_settled(destination=self, message=message, consumer=consumer, settlement=settlement)

    def forget(self, predicate: Callable[[Message], bool]) -> int:
        """Drop messages matching ``predicate`` without an outcome (their source is gone).

        Used when the broker connection drops: the broker still has those messages and
        will deliver them again. Returns how many were dropped.
        """
        dropped = 0
        for consumer in self.consumers:
            for sequence, message in list(consumer.held.items()):
                if predicate(message):
                    del consumer.held[sequence]
                    dropped += 1
                    self.depth -= 1
                    self.bytes -= message.size
        kept = deque(m for m in self.queue if not predicate(m))
        for message in self.queue:
            if predicate(message):
                dropped += 1
                self.depth -= 1
                self.bytes -= message.size
        self.queue = kept
        return dropped

    # --- reading --------------------------------------------------------------------------

    @property
    def unused(self) -> bool:
        """Nothing refers to it any more: it can be forgotten."""
        return not (self.consumers or self.producers or self.depth)

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.address,
            "depth": self.depth,
            "bytes": self.bytes,
            "waiting": len(self.queue),
            "enqueued": self.enqueued_total,
            "dequeued": self.dequeued_total,
            "producers": len(self.producers),
            "consumers": len(self.consumers),
            "max_count": self.policy.max_count,
            "max_size": self.policy.max_size,
        }


def _sequence_of(message: Message) -> int:
    return message.sequence
