"""Contain a bug in one event handler to the connection it happened on.

Proton's reactor lets an exception from a handler end ``Container.run()``: one bad
event would stop qpid-flow for every client. Handlers decorated here log the error
and close the connection the event belongs to with ``amqp:internal-error``.

Closing is what makes the error visible: a handler that fails half-way through a
delivery or a credit update leaves its link in a state nobody will move again, and
the peer would wait on it forever. Closed, the client sees the condition and its own
reconnect takes over, while every other connection carries on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from proton import Condition, Connection, Endpoint

__all__ = ["contain_errors"]

log = structlog.get_logger(__name__)

H = TypeVar("H", bound=type)

DECODE_ERROR = "amqp:decode-error"
INTERNAL_ERROR = "amqp:internal-error"


def _connection_of(event: Any) -> Connection | None:
    """The connection ``event`` belongs to, for every kind of event qpid-flow handles.

    Proton's ``Event`` has it; the data path's lean ``DeliveryEvent`` and ``LinkFlowEvent``
    (:mod:`qpid_flow.amqp.endpoints`) carry only their link. A timer has none."""
    connection = getattr(event, "connection", None)
    if connection is None:
        link = getattr(event, "link", None)
        connection = link.connection if link is not None else None
    return connection


def _contain(handler: Any, method: str, event: Any, error: Exception) -> None:
    """Log ``error`` and close the connection of ``event`` with ``amqp:internal-error``.

    Never raises: this runs where the reactor would otherwise see the exception."""
    where = {"handler": type(handler).__name__, "method": method}
    connection: Connection | None = None
    connection_id = None
    try:
        connection = _connection_of(event)
        connection_id = getattr(connection, "qf_id", None)
    except Exception as lookup_error:
        # Still log the handler's own error below, and close nothing: no way to know what.
        log.error("handler_error_connection_unknown", **where, exc_info=lookup_error)
    log.error("handler_error", **where, connection=connection_id, exc_info=error)
    if connection is None:
        return
    try:
        if not connection.state & Endpoint.LOCAL_CLOSED:
            connection.condition = _condition_for(error)
            connection.close()
    except Exception as close_error:
        log.error("handler_error_close_failed", **where, connection=connection_id, exc_info=close_error)


def _condition_for(error: Exception) -> Condition:
    """A peer's text that is not UTF-8 (a container id, a link name: Proton decodes them
    as the handler reads them) is the peer's error, said as AMQP says it; anything else
    is qpid-flow's own."""
    if isinstance(error, UnicodeDecodeError):
        return Condition(DECODE_ERROR, f"a text field is not valid UTF-8: {error.reason}")
    return Condition(INTERNAL_ERROR, "qpid-flow failed on this connection")


def _guard(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(self: Any, event: Any) -> Any:
        try:
            return method(self, event)
        except Exception as error:
            _contain(self, method.__name__, event, error)
            return None

    return guarded


def contain_errors(cls: H) -> H:
    """Class decorator: guard every ``on_*`` event method of a Proton handler class."""
    for name, value in list(vars(cls).items()):
        if name.startswith("on_") and callable(value):
            setattr(cls, name, _guard(value))
    return cls
