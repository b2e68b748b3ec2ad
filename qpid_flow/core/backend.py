"""Where producer messages go and where consumer messages come from.

Two backends implement this: :class:`~qpid_flow.core.standalone.StandaloneBackend` (the
destinations are the queues) and, in front of a broker, the one of
:mod:`qpid_flow.amqp.linkroute` (producers' own upstream links, and
:class:`~qpid_flow.amqp.upstream.GroupReader` for grouped destinations). The router talks to
whichever it was given and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Message, Settlement

# Called once with the outcome the backend gave a forwarded message.
OutcomeCallback = Callable[["Message", "Settlement"], None]

__all__ = ["Backend", "OutcomeCallback"]


class Backend(Protocol):
    def writable(self, address: str | None) -> bool:
        """Whether producers of ``address`` (None: any) may be given new credit now."""

    def producer_attached(self, destination: Destination) -> None:
        """A producer link to ``destination`` attached: get ready to forward to it."""

    def forward(self, destination: Destination, message: Message, done: OutcomeCallback) -> None:
        """Take ``message`` for ``destination``; call ``done`` with the outcome, once."""

    def consumer_attached(self, destination: Destination) -> None:
        """A consumer of ``destination`` attached: start feeding it."""

    def consumer_detached(self, destination: Destination) -> None:
        """A consumer of ``destination`` went away."""

    def demand_changed(self, destination: Destination) -> None:
        """Consumers of ``destination`` took messages or gained credit."""

    def in_flight(self) -> int:
        """Forwarded messages still waiting for their outcome."""

    def shutdown(self) -> None:
        """Give back what is held (released) and close."""
