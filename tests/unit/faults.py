"""Injected faults for unit tests of the handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def fail_next(obj: object, method: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``obj.method`` raise the next time it is called (once only); the returned list
    names the call that failed."""
    original: Callable[..., Any] = getattr(obj, method)
    failed: list[str] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(method)
            raise RuntimeError(f"{method} failed")
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, method, failing)
    return failed
