"""Proton's socket I/O handler, with transport updates batched per turn of the reactor.

Proton's Python reactor re-computes a connection's socket interest (and posts a
``selectable_updated`` event) on every ``PN_TRANSPORT`` event, and Proton emits one for
almost every change to a delivery: about six per message relayed. Only the state at
the moment the reactor goes back to ``select()`` matters, so this handler notes which
transports changed and updates each once, when the reactor has no other events left.
"""

from __future__ import annotations

from typing import Any

from proton.handlers import IOHandler

__all__ = ["BatchingIOHandler"]


class BatchingIOHandler(IOHandler):
    def __init__(self) -> None:
        super().__init__()
        self._dirty: dict[int, Any] = {}

    def on_transport(self, event: Any) -> None:
        transport = event.transport
        self._dirty[id(transport._impl)] = transport

    def on_reactor_quiesced(self, event: Any) -> None:
        if self._dirty:
            dirty = list(self._dirty.values())
            self._dirty.clear()
            for transport in dirty:
                selectable = transport._selectable
                if selectable and not selectable.is_terminal:
                    self.update(transport, selectable, transport._reactor.now)
            # The updates posted events: let the reactor handle them, then quiesce again.
        super().on_reactor_quiesced(event)
