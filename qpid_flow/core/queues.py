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
# The consumer-selection hook: (destination=, message=, consumers=) -> Consumer | Hold | None.
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
        """``consumer`` detached (after its messages were released)."""


def _sequence_of(message: Message) -> int:
    return message.sequence


class FifoQueue:
    """First in, first out; the selection hook picks the consumer of each message.

    A message the hook holds back (``Hold``) does not stop the ones behind it: the
    dispatcher looks up to ``lookahead`` messages deep.
    """

    def __init__(self, select: Select, lookahead: int = 1000) -> None:
        self._messages: deque[Message] = deque()
        self._select = select
        self._lookahead = lookahead

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
        index = 0
        select = self._select
        while ready and index < len(messages) and index < self._lookahead:
            message = messages[index]
            choice = select(destination=destination, message=message, consumers=ready)
            if choice is None or isinstance(choice, Hold):
                index += 1  # this one waits; the ones behind it need not
                continue
            del messages[index]
            send(choice, message)
            if choice.credit <= 0:
                ready.remove(choice)

    def released(self, consumer: Consumer, message: Message, removed: bool = False) -> None:
        pass

    def consumer_ready(self, consumer: Consumer) -> None:
        pass

    def consumer_gone(self, consumer: Consumer) -> None:
        pass
