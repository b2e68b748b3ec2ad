"""Standalone mode: qpid-flow's destinations are the queues (bounded, in memory)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qpid_flow import codec
from qpid_flow.core.model import Outcome, Settlement

if TYPE_CHECKING:
    from qpid_flow.core.backend import OutcomeCallback
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Message

__all__ = ["StandaloneBackend"]

_ACCEPTED = Settlement.accepted()


class StandaloneBackend:
    """Messages are enqueued on their destination, accepted once they are there."""

    def writable(self, address: str | None) -> bool:
        return True

    def producer_attached(self, destination: Destination) -> None:
        pass

    def forward(self, destination: Destination, message: Message, done: OutcomeCallback) -> None:
        if message.properties_at == -1:  # not read yet: the router reads it as it arrives
            try:
                message.expires, message.properties_at = codec.expiry_and_properties(message.data, message.arrived)
            except codec.MalformedMessage:
                message.expires = None  # the router refuses what no client could decode
        if message.expires is not None:
            destination.expiring = True
        if destination.expiring:
            destination.expire_to_fit(1, message.size)
        # A ring keeps the newest messages: make room by dropping the oldest waiting, unless
        # no dropping can (a message larger than max_size): then it is refused and nothing
        # is lost, as qpidd's ring does.
        if (
            not destination.has_room_for(message)
            and destination.policy.when_full == "ring"
            and destination.room_by_dropping_waiting(message)
        ):
            while not destination.has_room_for(message) and destination.drop_oldest():
                pass
        if not destination.has_room_for(message):
            # A full queue refuses, as qpidd's default limit policy does.
            done(message, Settlement(Outcome.REJECTED, "amqp:resource-limit-exceeded", destination.limit_description()))
            return
        destination.enqueue(message)
        done(message, _ACCEPTED)

    def consumer_attached(self, destination: Destination) -> None:
        pass

    def consumer_detached(self, destination: Destination) -> None:
        pass

    def demand_changed(self, destination: Destination) -> None:
        pass

    def in_flight(self) -> int:
        return 0

    def shutdown(self) -> None:
        pass
