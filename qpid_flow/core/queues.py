"""The waiting messages of a destination and the order they go out in.

A destination keeps its waiting messages in a :class:`MessageQueue`. The plain one,
:class:`FifoQueue`, hands messages out in order and asks the ``qpid_flow_consumer_select``
hook which consumer gets each. Message groups (``qpid_flow.policies.groups.grouped_queue``) use another
queue with the same interface. Plain Python, no Proton.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from qpid_flow.core.model import Consumer, Hold, Message

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination

__all__ = ["FifoQueue", "MessageQueue", "Select", "Send"]

# Hands a message to a consumer (the destination's bookkeeping and the wire).
Send = Callable[[Consumer, Message], None]
# The consumer-selection hook: (destination=, message=, consumers=[, taking=]) -> Consumer | Hold | None.
Select = Callable[..., Any]


class MessageQueue(Protocol):
    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Message]:
        """The waiting messages, oldest first."""
        ...

    def append(self, message: Message) -> None:
        """A new message, at the back."""

    def requeue(self, message: Message) -> None:
        """A released message goes back in its original place."""

    def pop_oldest(self) -> Message | None:
        """Take out the oldest waiting message (ring drop, purge); None if empty."""

    def remove_where(self, predicate: Callable[[Message], bool]) -> list[Message]:
        """Take out every waiting message matching ``predicate``."""

    def dispatch(self, destination: Destination, ready: list[Consumer], send: Send) -> None:
        """Hand waiting messages to ``ready`` consumers (all with credit) by calling ``send``."""

    def released(self, consumer: Consumer, message: Message, removed: bool = False) -> None:
        """``consumer`` no longer holds ``message``: settled with any outcome, or released.
        ``removed`` when it left the destination (accepted or rejected)."""

    def consumer_ready(self, consumer: Consumer) -> None:
        """``consumer`` went from no credit to some."""

    def consumer_gone(self, consumer: Consumer) -> None:
        """``consumer`` detached (after its messages were released). A queue may also have
        ``release_reason(reason)``, a context manager naming why what follows is released
        (``detached``, ``lease``): the destination uses it around a detach's releases."""


def _sequence_of(message: Message) -> int:
    return message.sequence


class FifoQueue:
    """First in, first out; the selection hook picks the consumer of each message.

    A message that must wait does not stop the ones behind it. Two kinds wait:

    - messages no ready consumer takes (:meth:`Consumer.takes`: a selector that does not
      match, a message over a consumer's max-message-size). That never changes for a
      (consumer, message) pair, so each consumer with a filter keeps a cursor: the
      sequence number up to which it takes none of the waiting messages. A scan starts
      past the lowest cursor of the ready consumers, moves cursors on as it goes, and such
      messages cost no look-ahead: however deep they lie, a matching message behind them
      is found (a consumer is not starved by a backlog it does not want), and each is
      looked at about once per consumer, not once per dispatch.
    - messages the hook holds back (``Hold``; a plugin's reason): the dispatcher looks up
      to ``lookahead`` of those deep.
    """

    def __init__(self, select: Select, lookahead: int = 1000) -> None:
        self._messages: deque[Message] = deque()
        self._select = select
        self._lookahead = lookahead
        # Consumer with a filter -> sequence number up to which it takes no waiting message.
        self._refused_through: dict[Consumer, int] = {}

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self._messages)

    def __getitem__(self, index: int) -> Message:
        return self._messages[index]

    def append(self, message: Message) -> None:
        self._messages.append(message)

    def requeue(self, message: Message) -> None:
        messages = self._messages
        if not messages or message.sequence < messages[0].sequence:
            messages.appendleft(message)
        else:
            messages.insert(bisect.bisect_left(messages, message.sequence, key=_sequence_of), message)
        # It is waiting again below some cursors: they go back to just before it (a
        # consumer that does not take it moves past it again on the next scan).
        cursors = self._refused_through
        for consumer, through in cursors.items():
            if through >= message.sequence:
                cursors[consumer] = message.sequence - 1

    def pop_oldest(self) -> Message | None:
        return self._messages.popleft() if self._messages else None

    def remove_where(self, predicate: Callable[[Message], bool]) -> list[Message]:
        gone: list[Message] = []
        kept: deque[Message] = deque()
        for message in self._messages:
            (gone if predicate(message) else kept).append(message)
        self._messages = kept
        return gone

    def dispatch(self, destination: Destination, ready: list[Consumer], send: Send) -> None:
        messages = self._messages
        if not messages:
            return
        select = self._select
        cursors = self._refused_through
        choosy = [c for c in ready if c.choosy]
        index = 0
        if choosy and len(choosy) == len(ready):
            # Every ready consumer filters: what all of them refused is skipped unseen.
            lowest = min(cursors.get(c, 0) for c in choosy)
            if lowest >= messages[0].sequence:
                index = bisect.bisect_right(messages, lowest, key=_sequence_of)
        # Consumers whose cursor can still move in this scan: a cursor stops at a message its
        # consumer takes that stays waiting, and with a consumer that runs out of credit.
        moving = choosy
        held = 0
        while ready and index < len(messages) and held < self._lookahead:
            message = messages[index]
            sequence = message.sequence
            if choosy:
                takers = [c for c in ready if not c.choosy or (sequence > cursors.get(c, 0) and c.takes(message))]
            else:
                takers = ready  # no consumer filters: every one takes every message
            if takers:
                choice = select(destination=destination, message=message, consumers=takers, taking=True)
                if choice is not None and not isinstance(choice, Hold):
                    del messages[index]
                    send(choice, message)
                    if choice.credit <= 0:
                        ready.remove(choice)
                        if moving:
                            moving = [c for c in moving if c is not choice]
                    continue
                held += 1  # this one waits; the ones behind it need not
                if moving:
                    moving = [c for c in moving if c not in takers]
            # It stays waiting, and the consumers still moving do not take it: past it, for good.
            for consumer in moving:
                if cursors.get(consumer, 0) < sequence:
                    cursors[consumer] = sequence
            index += 1

    def released(self, consumer: Consumer, message: Message, removed: bool = False) -> None:
        pass

    def consumer_ready(self, consumer: Consumer) -> None:
        pass

    def consumer_gone(self, consumer: Consumer) -> None:
        self._refused_through.pop(consumer, None)
