"""Local transactions (AMQP 1.0 part 4.4), standalone: what a transaction holds until it
is discharged, and whether a commit can be applied whole.

No Proton here: qpid_flow/amqp/coordinator.py decodes the declare and discharge messages and
answers them; the router hands in the transactional transfers and dispositions. A
transaction's work stays invisible until commit:

- a transfer is asked about by the policies as it arrives (flow control may hold it) and,
  once admitted, staged here, not enqueued: consumers see it only after the commit;
- a consumer's transactional outcome is staged too: the message stays out to that consumer
  (its group stays with it) until the commit applies the outcome, or the rollback undoes it.

A commit is all or nothing: when one part can no longer be applied (a consumer left and
its message went back to the queue, a destination has no room or is gone), the whole
transaction is rolled back and the discharge is rejected with ``amqp:transaction:rollback``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qpid_flow.core.model import Outcome, Settlement

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Message

__all__ = [
    "ROLLBACK",
    "UNKNOWN_ID",
    "StagedOutcome",
    "Transaction",
    "Transactions",
    "plain_descriptor",
    "settlement_from_outcome",
]

UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"

# Outcome descriptors (AMQP 1.0 part 3.4), by code and by name: Proton hands over either.
_OUTCOMES: dict[Any, Outcome] = {
    0x24: Outcome.ACCEPTED,
    0x25: Outcome.REJECTED,
    0x26: Outcome.RELEASED,
    0x27: Outcome.MODIFIED,
    "amqp:accepted:list": Outcome.ACCEPTED,
    "amqp:rejected:list": Outcome.REJECTED,
    "amqp:released:list": Outcome.RELEASED,
    "amqp:modified:list": Outcome.MODIFIED,
}


def settlement_from_outcome(outcome: Any) -> Settlement | None:
    """The settlement a transactional state's outcome field names (a described list as
    Proton decodes it: ``.descriptor`` and ``.value``); None for no outcome or an unknown one."""
    if outcome is None:
        return None
    kind = _OUTCOMES.get(plain_descriptor(getattr(outcome, "descriptor", None)))
    fields = getattr(outcome, "value", None)
    fields = list(fields) if isinstance(fields, list | tuple) else []
    if kind is Outcome.ACCEPTED:
        return Settlement.accepted()
    if kind is Outcome.RELEASED:
        return Settlement.released()
    if kind is Outcome.REJECTED:
        error = getattr(fields[0], "value", None) if fields else None
        error = list(error) if isinstance(error, list | tuple) else []
        condition = str(error[0]) if error and error[0] is not None else None
        description = str(error[1]) if len(error) > 1 and error[1] is not None else None
        return Settlement(Outcome.REJECTED, condition, description)
    if kind is Outcome.MODIFIED:
        return Settlement(
            Outcome.MODIFIED,
            delivery_failed=bool(fields[0]) if fields else False,
            undeliverable_here=bool(fields[1]) if len(fields) > 1 else False,
            annotations=fields[2] if len(fields) > 2 else None,
        )
    return None


def plain_descriptor(descriptor: Any) -> Any:
    """A descriptor as a plain int or str (Proton's ulong and symbol are subclasses);
    None for anything else."""
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str):
        return str(descriptor)
    return None


@dataclass(slots=True)
class StagedOutcome:
    """A consumer's transactional outcome for a message it holds, applied at commit.

    ``delivery`` is the router's handle on the consumer's delivery while the client has
    not settled it (the commit settles it); None once the client has.
    """

    consumer: Consumer
    message: Message
    settlement: Settlement
    delivery: Any = None


class Transaction:
    """One declared transaction: its staged transfers and outcomes."""

    __slots__ = ("connection_id", "controller", "failure", "id", "outcomes", "transfers", "undecided", "waiting")

    def __init__(self, txn_id: bytes, connection_id: str, controller: Any) -> None:
        self.id = txn_id
        self.connection_id = connection_id  # a txn-id is good on its controller's connection only
        self.controller = controller  # the coordinator link that declared it
        # Admitted transfers, in arrival order, with their destinations.
        self.transfers: list[tuple[Destination, Message]] = []
        # Consumers' outcomes, by (consumer id, message sequence): a later one replaces.
        self.outcomes: dict[tuple[int, int], StagedOutcome] = {}
        # Transfers that arrived and that no policy has decided yet (flow control holds
        # them): a commit waits for them.
        self.undecided = 0
        # Why a commit can no longer succeed (e.g. a producer left with transfers undecided).
        self.failure: str | None = None
        # A discharge that waits for the undecided transfers: the router's handle on it.
        self.waiting: Any = None

    def stage_transfer(self, destination: Destination, message: Message) -> None:
        self.transfers.append((destination, message))
        destination.staged_count += 1
        destination.staged_bytes += message.size

    def unstage(self) -> None:
        """The transfers leave the transaction (enqueued at the commit, or dropped at the
        rollback): their destinations stop counting them as staged."""
        for destination, message in self.transfers:
            destination.staged_count -= 1
            destination.staged_bytes -= message.size

    def stage_outcome(self, consumer: Consumer, message: Message, settlement: Settlement, delivery: Any) -> None:
        self.outcomes[consumer.id, message.sequence] = StagedOutcome(consumer, message, settlement, delivery)

    def commit_refusal(self, is_current: Callable[[Destination], bool]) -> str | None:
        """Why this transaction cannot be committed whole now; None if it can.

        ``is_current`` tells whether a destination is still the one its address names (a
        temporary or idle destination may have been deleted since a transfer was staged).
        """
        if self.failure:
            return self.failure
        for staged in self.outcomes.values():
            if staged.message.sequence not in staged.consumer.held:
                return (
                    f"message #{staged.message.sequence} of {staged.message.address!r} is no longer held by "
                    "the consumer that settled it in this transaction (its link went)"
                )
        needs: dict[int, tuple[Destination, int, int]] = {}
        for destination, message in self.transfers:
            _, count, size = needs.get(id(destination), (destination, 0, 0))
            needs[id(destination)] = (destination, count + 1, size + message.size)
        for destination, count, size in needs.values():
            if not is_current(destination):
                return f"destination {destination.address!r} was deleted"
            if destination.policy.when_full == "ring":
                continue  # a ring makes room
            if destination.expiring:
                destination.expire_to_fit(count, size)
            if not destination.has_room_for_many(count, size):
                return f"{count} messages do not fit: {destination.limit_description()}"
        return None


class Transactions:
    """The open transactions of a router, by txn-id."""

    def __init__(self) -> None:
        self._open: dict[bytes, Transaction] = {}
        self._numbers = itertools.count(1)

    def __len__(self) -> int:
        return len(self._open)

    def declare(self, connection_id: str, controller: Any) -> Transaction:
        txn = Transaction(f"txn:{next(self._numbers)}".encode(), connection_id, controller)
        self._open[txn.id] = txn
        return txn

    def find(self, txn_id: Any, connection_id: str) -> Transaction | None:
        """The open transaction ``txn_id`` names on connection ``connection_id``."""
        # Proton hands a binary over as bytes or as a memoryview, depending on the path.
        txn = self._open.get(bytes(txn_id)) if isinstance(txn_id, bytes | bytearray | memoryview) else None
        return txn if txn is not None and txn.connection_id == connection_id else None

    def end(self, txn: Transaction) -> None:
        self._open.pop(txn.id, None)

    def declared_by(self, controller: Any) -> Iterable[Transaction]:
        # Equal, not identical: Proton hands each event a new wrapper of the same link.
        return [txn for txn in self._open.values() if txn.controller == controller]
