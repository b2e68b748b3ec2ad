"""Bytes of message data qpid-flow holds in memory, against the router-wide limit.

The counterpart of ActiveMQ's ``systemUsage/memoryUsage``: while the bytes held exceed
``memory_limit``, no producer gets credit. Message bytes are counted where they are
held: on destinations (standalone queues, messages fetched from the broker) and in
the broker backend (forwarded, awaiting the broker's outcome).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MemoryMeter"]


class MemoryMeter:
    __slots__ = ("held", "limit", "on_below")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: no limit
        self.held = 0
        # Called once each time the held bytes fall back to the limit or below.
        self.on_below: Callable[[], None] | None = None

    @property
    def over(self) -> bool:
        return bool(self.limit) and self.held > self.limit

    def add(self, size: int) -> None:
        self.held += size

    def sub(self, size: int) -> None:
        was_over = self.over
        self.held -= size
        if was_over and not self.over and self.on_below is not None:
            self.on_below()
