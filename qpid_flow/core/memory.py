"""Bytes of message data qpid-flow holds in memory, against the router-wide limit.

The counterpart of ActiveMQ's ``systemUsage/memoryUsage``: once the bytes held reach
``memory_limit`` (ActiveMQ's usage is full at 100 %), no producer gets credit until they
fall below it again. Message bytes are counted where they are
held: on destinations (standalone queues, messages fetched from the broker) and in
the broker backend (forwarded, awaiting the broker's outcome).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MemoryMeter"]


class MemoryMeter:
    """``held``: every byte of message data qpid-flow holds. ``waiting``: the part of it
    that is transfers a policy holds unforwarded (they wait on the policy's word, and
    admitting one moves its bytes: it adds none). What counts against the limit is the
    rest: counted with the waiting bytes, held transfers that alone passed the limit would
    wait for each other for good."""

    __slots__ = ("_below_listeners", "held", "limit", "waiting")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: no limit
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

    def add(self, size: int) -> None:
        self.held += size

    def sub(self, size: int) -> None:
        was_over = self.over
        self.held -= size
        if was_over and not self.over:
            for callback in self._below_listeners:
                callback()

    def hold(self, size: int) -> None:
        """A transfer is held unforwarded: its bytes are held, not in use."""
        self.held += size
        self.waiting += size

    def unhold(self, size: int) -> None:
        """A held transfer leaves the wait (admitted, which adds its bytes again where it
        goes, or dropped)."""
        self.held -= size
        self.waiting -= size
