"""Bytes of message data qpid-flow holds in memory, against the router-wide limit.

The counterpart of ActiveMQ's ``systemUsage/memoryUsage``: once the bytes held reach
``memory_limit`` (ActiveMQ's usage is full at 100 %), no producer gets credit until they
fall below it again. Message bytes are counted where they are
held: on destinations (standalone queues, messages fetched from the broker) and in
the broker backend (forwarded, awaiting the broker's outcome).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MESSAGE_OVERHEAD", "MemoryMeter"]

# What a message costs qpid-flow beyond its encoded bytes (its record, the bytes object's
# header, its places in the queue's structures): about 350 bytes measured resident per
# message held, rounded up. The router counts it for each message against memory_limit, as
# ActiveMQ counts each message at 1 KiB at least: counted by their bytes alone, 10-byte
# messages filled 794 MB under a 50 MB limit.
MESSAGE_OVERHEAD = 512


class MemoryMeter:
    """``held``: every byte of message data qpid-flow holds. ``waiting``: the part of it
    that is transfers a policy holds unforwarded (they wait on the policy's word, and
    admitting one moves its bytes: it adds none). What counts against the limit is the
    rest: counted with the waiting bytes, held transfers that alone passed the limit would
    wait for each other for good."""

    __slots__ = ("_below_listeners", "held", "limit", "per_message", "waiting")

    def __init__(self, limit: int = 0, per_message: int = 0) -> None:
        self.limit = limit  # 0: no limit
        # Counted for each message on top of its bytes (the router's: MESSAGE_OVERHEAD).
        self.per_message = per_message
        self.held = 0
        self.waiting = 0
        self._below_listeners: list[Callable[[], None]] = []

    def when_below(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the bytes in use fall back below the limit (any
        number of plugins may listen)."""
        self._below_listeners.append(callback)

    @property
    def in_use(self) -> int:
        """The bytes that count against the limit: held, but not waiting."""
        return self.held - self.waiting

    @property
    def over(self) -> bool:
        return bool(self.limit) and self.held - self.waiting >= self.limit

    def charge(self, size: int, messages: int = 1) -> int:
        """What ``messages`` messages of ``size`` bytes in all count for."""
        return size + messages * self.per_message

    def holds_too_much(self, size: int) -> bool:
        """Whether holding one more transfer of ``size`` bytes unforwarded would take the
        held ones past the limit (the router then refuses it)."""
        return bool(self.limit) and self.waiting + size + self.per_message > self.limit

    def held_past_limit(self) -> str:
        """The description a transfer refused by :meth:`holds_too_much` is rejected with."""
        return f"the transfers held unforwarded would pass memory_limit ({self.limit} bytes)"

    def add(self, size: int, messages: int = 1) -> None:
        """``messages`` messages (``size`` bytes in all) are held; 0 messages: a message
        held already changed size."""
        self.held += size + messages * self.per_message

    def sub(self, size: int, messages: int = 1) -> None:
        was_over = self.over
        self.held -= size + messages * self.per_message
        if was_over and not self.over:
            for callback in self._below_listeners:
                callback()

    def hold_arriving(self, size: int) -> None:
        """``size`` more bytes of a message still arriving are held. Like a held transfer's
        they wait (they are in no destination yet); they carry no per-message cost until
        the message is complete."""
        self.held += size
        self.waiting += size

    def release_arriving(self, size: int) -> None:
        """A message's ``size`` arriving bytes are complete (counted again where it goes),
        refused or dropped."""
        self.held -= size
        self.waiting -= size

    def hold(self, size: int) -> None:
        """A transfer is held unforwarded: its bytes are held, not in use."""
        charge = size + self.per_message
        self.held += charge
        self.waiting += charge

    def unhold(self, size: int, messages: int = 1) -> None:
        """Held transfers leave the wait (admitted, which adds their bytes again where they
        go, or dropped)."""
        charge = size + messages * self.per_message
        self.held -= charge
        self.waiting -= charge
