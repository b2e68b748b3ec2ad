"""Waiting for something to happen by polling it, rather than sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.05) -> T:
    """Call ``condition`` until it returns a true value or ``timeout`` seconds have passed;
    return its last value. It asserts nothing: the assertions after it say what was
    expected, and fail as they would have if it never came. The timeout is generous: it
    only bounds a wait for something that does not come, and costs nothing otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
