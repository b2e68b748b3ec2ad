"""Contain a bug in one event handler to the connection it happened on.

Proton's reactor lets an exception from a handler end ``Container.run()``: one bad
event would stop qpid-flow for every client. Handlers decorated here log the error
and close the connection the event belongs to with ``amqp:internal-error``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from proton import Condition, Endpoint

__all__ = ["contain_errors"]

log = structlog.get_logger("qpid_flow.guard")

H = TypeVar("H", bound=type)


def _close_connection_of(event: Any) -> None:
    connection = getattr(event, "connection", None)
    if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
        connection.condition = Condition("amqp:internal-error", "qpid-flow failed on this connection")
        connection.close()


def _guard(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(self: Any, event: Any) -> Any:
        try:
            return method(self, event)
        except Exception:
            log.exception("handler_error", handler=type(self).__name__, method=method.__name__)
            _close_connection_of(event)
            return None

    return guarded


def contain_errors(cls: H) -> H:
    """Class decorator: guard every ``on_*`` event method of a Proton handler class."""
    for name, value in list(vars(cls).items()):
        if name.startswith("on_") and callable(value):
            setattr(cls, name, _guard(value))
    return cls
