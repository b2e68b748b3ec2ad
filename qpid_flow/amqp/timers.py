"""A reactor timer that calls a function: ``container.schedule(delay, Call(fn))``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proton import Handler

__all__ = ["Call"]


class Call(Handler):
    """Calls ``callback`` (no arguments) when its timer fires."""

    def __init__(self, callback: Callable[[], Any]) -> None:
        super().__init__()
        self._callback = callback

    def on_timer_task(self, _event: Any) -> None:
        self._callback()
