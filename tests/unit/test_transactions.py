"""qpid_flow/core/transactions.py alone: outcomes read from a transactional state, txn-ids
scoped to their connection, and when a commit can no longer be applied whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import Destination
from qpid_flow.core.model import Consumer, Message, Outcome
from qpid_flow.core.transactions import Transactions, settlement_from_outcome
from qpid_flow.plugin.manager import Hooks, build_plugin_manager


@dataclass
class Described:
    """What Proton decodes a described list into (descriptor and value)."""

    descriptor: Any
    value: Any


def test_outcomes_by_code_and_by_name() -> None:
    assert settlement_from_outcome(Described(0x24, [])).outcome is Outcome.ACCEPTED  # type: ignore[union-attr]
    assert settlement_from_outcome(Described("amqp:released:list", [])).outcome is Outcome.RELEASED  # type: ignore[union-attr]
    rejected = settlement_from_outcome(Described(0x25, [Described(0x1D, ["amqp:not-allowed", "no", None])]))
    assert rejected is not None
    assert (rejected.outcome, rejected.condition, rejected.description) == (Outcome.REJECTED, "amqp:not-allowed", "no")
    modified = settlement_from_outcome(Described(0x27, [True, False]))
    assert modified is not None and modified.delivery_failed and not modified.undeliverable_here
    assert settlement_from_outcome(None) is None
    assert settlement_from_outcome(Described(0x99, [])) is None


def test_a_txn_id_is_good_on_its_own_connection_only() -> None:
    transactions = Transactions()
    first = transactions.declare("c1", controller="link-1")
    second = transactions.declare("c1", controller="link-1")
    assert first.id != second.id
    assert transactions.find(first.id, "c1") is first
    assert transactions.find(memoryview(first.id), "c1") is first  # as Proton may hand it over
    assert transactions.find(first.id, "c2") is None
    assert transactions.find("not binary", "c1") is None
    assert list(transactions.declared_by("link-1")) == [first, second]
    transactions.end(first)
    assert transactions.find(first.id, "c1") is None and len(transactions) == 1


def _destination(address: str, **policy: Any) -> Destination:
    return Destination(address, DestinationPolicy.of(pattern=address, **policy), Hooks(build_plugin_manager()))


def test_a_commit_is_refused_when_it_would_overfill_a_destination() -> None:
    destination = _destination("q", max_count=5)
    for _ in range(3):
        destination.enqueue(Message(b"x" * 10, "q"))
    txn = Transactions().declare("c1", None)
    for _ in range(2):
        txn.stage_transfer(destination, Message(b"y", "q"))
    assert txn.commit_refusal(lambda d: True) is None  # 3 + 2 fit in 5
    txn.stage_transfer(destination, Message(b"y", "q"))
    refusal = txn.commit_refusal(lambda d: True)
    assert refusal is not None and "3 messages do not fit" in refusal
    ring = _destination("r", max_count=1, limit_policy="ring")
    ring.enqueue(Message(b"x", "r"))
    ring_txn = Transactions().declare("c1", None)
    ring_txn.stage_transfer(ring, Message(b"y", "r"))
    ring_txn.stage_transfer(ring, Message(b"z", "r"))
    assert ring_txn.commit_refusal(lambda d: True) is None  # a ring makes room


def test_a_commit_is_not_refused_for_room_expired_messages_hold() -> None:
    """An expired message is dequeued (SEMANTICS 7) whenever the sweep comes: a full
    destination of expired messages refused a transaction's commit that a plain send made
    after them was let in for."""
    import time

    destination = _destination("q", max_count=3)
    for _ in range(3):
        expired = Message(b"x", "q")
        expired.expires = time.time() - 1
        destination.enqueue(expired)
    destination.expiring = True
    txn = Transactions().declare("c1", None)
    txn.stage_transfer(destination, Message(b"y", "q"))
    assert txn.commit_refusal(lambda d: True) is None
    assert (destination.expired, destination.depth) == (3, 0)


def test_a_destination_counts_what_open_transactions_staged_for_it() -> None:
    """Flow control reads these: staged transfers will land at the commit, credit or not."""
    first, second = _destination("a"), _destination("b")
    txn = Transactions().declare("c1", None)
    txn.stage_transfer(first, Message(b"x" * 10, "a"))
    txn.stage_transfer(first, Message(b"y" * 5, "a"))
    txn.stage_transfer(second, Message(b"z", "b"))
    assert (first.staged_count, first.staged_bytes, second.staged_count) == (2, 15, 1)
    assert first.depth == 0  # not enqueued before the commit
    txn.unstage()
    assert (first.staged_count, first.staged_bytes, second.staged_count, second.staged_bytes) == (0, 0, 0, 0)


def test_a_commit_is_refused_when_a_destination_was_deleted() -> None:
    destination = _destination("gone")
    txn = Transactions().declare("c1", None)
    txn.stage_transfer(destination, Message(b"y", "gone"))
    refusal = txn.commit_refusal(lambda d: False)
    assert refusal is not None and "deleted" in refusal


def test_a_commit_is_refused_when_a_settled_message_went_back() -> None:
    destination = _destination("q")
    message = Message(b"x", "q")
    destination.enqueue(message)
    consumer = Consumer("q", lambda c, m: None)
    destination.add_consumer(consumer)
    destination.credit_changed(consumer, 1)
    assert message.sequence in consumer.held
    txn = Transactions().declare("c1", None)
    txn.stage_outcome(consumer, message, settlement_from_outcome(Described(0x24, [])), None)  # type: ignore[arg-type]
    assert txn.commit_refusal(lambda d: True) is None
    destination.remove_consumer(consumer)  # its link went: the message is back on the queue
    refusal = txn.commit_refusal(lambda d: True)
    assert refusal is not None and "no longer held" in refusal


def test_a_recorded_failure_refuses_the_commit() -> None:
    txn = Transactions().declare("c1", None)
    txn.failure = "a producer left before flow control admitted its transfer"
    assert txn.commit_refusal(lambda d: True) == txn.failure
