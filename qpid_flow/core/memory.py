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
    __slots__ = ("_below_listeners", "_level_listeners", "held", "limit")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: no limit
        self.held = 0
        self._below_listeners: list[Callable[[], None]] = []
        self._level_listeners: dict[Callable[[], None], int] = {}

    def when_below(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the held bytes fall back below the limit (any number
        of plugins may listen)."""
        self._below_listeners.append(callback)

    def when_below_level(self, level: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the held bytes fall below ``level``; asking
        again with the same callback moves its level.

        For a policy that knows part of the held bytes waits on its own word (transfers it
        holds unforwarded are held bytes too, and the limit alone would never be left
        while they are more than it)."""
        self._level_listeners[callback] = level

    @property
    def over(self) -> bool:
        return bool(self.limit) and self.held >= self.limit

    def add(self, size: int) -> None:
        self.held += size

    def sub(self, size: int) -> None:
        was_over = self.over
        self.held -= size
        if was_over and not self.over:
            for callback in self._below_listeners:
                callback()
        if self._level_listeners:
            due = [callback for callback, level in self._level_listeners.items() if self.held < level]
            for callback in due:
                del self._level_listeners[callback]
                callback()
