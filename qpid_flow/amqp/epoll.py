"""Proton's selector, waiting with ``epoll`` instead of ``select``.

Proton's ``IO.Selector`` hands ``select()`` every socket it reads or writes on every turn
(``select`` then asks each one for its ``fileno()`` through a Python method), walks every
selectable twice after each wait to find expired deadlines and the next one, and cannot
watch a descriptor numbered 1,024 or more: about a thousand connections at most. This one
registers each socket's interest with ``epoll`` when that interest changes, maps ready
descriptors back to their selectables, and walks the selectables only once the earliest
deadline has passed.

The interface is Proton's (``add``, ``update``, ``remove``, ``select``, ``selectables``,
``update_deadline``), so Proton's own I/O handling keeps working on it.
"""

from __future__ import annotations

import contextlib
import select
import time
from typing import Any

from proton._io import IO

__all__ = ["EpollSelector"]

_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
# Reported whether asked for or not: a socket in error or hung up is ready both ways, as
# select() would say.
_READ_READY = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
_WRITE_READY = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR


class EpollSelector(IO.Selector):
    def __init__(self) -> None:
        super().__init__()
        self._deadline: float | None = None
        self._epoll = select.epoll()
        # Selectable -> (descriptor, registered mask); descriptor -> selectable.
        self._registered: dict[Any, tuple[int, int]] = {}
        self._by_fd: dict[int, Any] = {}

    # --- Proton's interface ------------------------------------------------------------

    def add(self, selectable: Any) -> None:
        self._selectables.add(selectable)
        self.interest(selectable)
        self.lower_deadline(selectable._deadline)

    def update(self, selectable: Any) -> None:
        self.interest(selectable)
        self.lower_deadline(selectable._deadline)

    def remove(self, selectable: Any) -> None:
        self._selectables.discard(selectable)
        self._forget(selectable)

    def select(self, timeout: float | None) -> tuple[list[Any], list[Any], list[Any]]:
        """Wait for I/O, ``timeout`` seconds at most and no later than the earliest
        deadline; return the readable, writable and expired selectables."""
        deadline = self._deadline
        if deadline is not None:
            until = max(0.0, deadline - time.time())
            timeout = until if timeout is None else min(timeout, until)
        readable: list[Any] = []
        writable: list[Any] = []
        by_fd = self._by_fd
        # An interrupted wait is retried by Python itself (PEP 475).
        for fd, events in self._epoll.poll(-1 if timeout is None else timeout):
            selectable = by_fd.get(fd)
            if selectable is None:
                continue
            if events & _READ_READY and selectable.reading:
                readable.append(selectable)
            if events & _WRITE_READY and selectable.writing:
                writable.append(selectable)
        expired: list[Any] = []
        if deadline is not None:
            now = time.time()
            if now >= deadline:
                expired = [s for s in self._selectables if s._deadline and now > s._deadline]
                self._deadline = None
                self.update_deadline()
        return readable, writable, expired

    # --- for the I/O handler -------------------------------------------------------------

    def interest(self, selectable: Any) -> None:
        """Register what ``selectable`` waits for now (its ``reading`` and ``writing``)."""
        mask = (_IN if selectable.reading else 0) | (_OUT if selectable.writing else 0)
        entry = self._registered.get(selectable)
        if entry is None:
            if not mask:
                return
            fd = selectable.fileno()
            if fd < 0:
                return  # no socket (the timer)
            try:
                self._epoll.register(fd, mask)
            except FileExistsError:
                # A socket closed without being removed left its descriptor, now reused.
                self._epoll.modify(fd, mask)
            self._registered[selectable] = (fd, mask)
            self._by_fd[fd] = selectable
        elif not mask:
            # Registered with no interest, epoll would still report hang-ups on every wait.
            self._forget(selectable)
        elif mask != entry[1]:
            self._epoll.modify(entry[0], mask)
            self._registered[selectable] = (entry[0], mask)

    def lower_deadline(self, deadline: float) -> None:
        """Wake no later than ``deadline`` (0: none)."""
        if deadline and (self._deadline is None or deadline < self._deadline):
            self._deadline = deadline

    def _forget(self, selectable: Any) -> None:
        entry = self._registered.pop(selectable, None)
        if entry is None:
            return
        fd = entry[0]
        if self._by_fd.get(fd) is selectable:
            del self._by_fd[fd]
            with contextlib.suppress(OSError):  # already closed: the kernel dropped it
                self._epoll.unregister(fd)
