"""outcomes.py: Proton delivery states to qpid-flow's Settlement and back, on real deliveries.

Each case sends one transfer between two real Proton engine ends in memory
(:mod:`tests.unit.proton_pairs`), lets one end give it a state and checks what the other end
reads: the mapping is tested on the wire, both ways, not on Proton's Python objects alone.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Condition, Delivery, Described, Endpoint, Receiver, Sender, symbol, ulong

from qpid_flow.amqp.endpoints import LeanDelivery
from qpid_flow.amqp.outcomes import (
    TRANSACTIONAL_STATE,
    apply_settlement,
    apply_transactional,
    relay_state,
    remote_settlement,
)
from qpid_flow.core.model import Outcome, Settlement
from qpid_flow.core.transactions import settlement_from_outcome
from tests.unit.proton_pairs import End, move_bytes


class Wire:
    """A sender at one end, a receiver with credit at the other, bytes moved by :meth:`pump`."""

    def __init__(self, name: str = "wire") -> None:
        self.sending = End(server=False)
        self.receiving = End(server=True)
        self.sending.connection.open()
        self.receiving.connection.open()
        session = self.sending.connection.session()
        session.open()
        self.sender: Sender = session.sender(name)
        self.sender.open()
        self.pump()
        self.receiving.connection.session_head(0).open()
        receiver = self.receiving.connection.link_head(0)
        assert receiver is not None and receiver.is_receiver
        self.receiver: Receiver = receiver
        self.receiver.open()
        self.receiver.flow(100)
        self.pump()
        assert self.sender.state & Endpoint.REMOTE_ACTIVE and self.sender.credit == 100
        self._count = 0

    def pump(self) -> None:
        while move_bytes(self.sending.transport, self.receiving.transport) | move_bytes(
            self.receiving.transport, self.sending.transport
        ):
            pass
        self.sending.take_events()
        self.receiving.take_events()

    def transfer(self, data: bytes = b"\x00Sw\xa1\x05order") -> tuple[Delivery, Delivery]:
        """One transfer: (the sender's delivery, the receiver's)."""
        self._count += 1
        sent = self.sender.delivery(f"t-{self._count}")
        self.sender.send(data)
        self.sender.advance()
        self.pump()
        received = self.receiver.current
        assert received is not None and received.readable and not received.partial
        assert self.receiver.recv(received.pending) == data
        self.receiver.advance()
        return sent, received


def lean(delivery: Delivery) -> LeanDelivery:
    return LeanDelivery(delivery._impl)


@pytest.fixture
def wire() -> Wire:
    return Wire()


# What a peer may do to a delivery it received: give it a state (Proton's way), and settle.


def accept(delivery: Delivery) -> None:
    delivery.update(Delivery.ACCEPTED)


def release(delivery: Delivery) -> None:
    delivery.update(Delivery.RELEASED)


def reject_with_condition(delivery: Delivery) -> None:
    delivery.local.condition = Condition("amqp:not-allowed", "orders are closed", {symbol("queue"): "orders"})
    delivery.update(Delivery.REJECTED)


def reject_bare(delivery: Delivery) -> None:
    delivery.update(Delivery.REJECTED)


def modify_fully(delivery: Delivery) -> None:
    delivery.local.failed = True
    delivery.local.undeliverable = True
    delivery.local.annotations = {symbol("x-opt-why"): "later"}
    delivery.update(Delivery.MODIFIED)


def modify_bare(delivery: Delivery) -> None:
    delivery.update(Delivery.MODIFIED)


def settle_only(delivery: Delivery) -> None:
    pass


PEER_OUTCOMES: list[tuple[str, Callable[[Delivery], None], Settlement]] = [
    ("accepted", accept, Settlement.accepted()),
    ("released", release, Settlement.released()),
    (
        "rejected-with-condition",
        reject_with_condition,
        Settlement(Outcome.REJECTED, "amqp:not-allowed", "orders are closed", info={"queue": "orders"}),
    ),
    ("rejected-bare", reject_bare, Settlement(Outcome.REJECTED)),
    (
        "modified-fully",
        modify_fully,
        Settlement(Outcome.MODIFIED, delivery_failed=True, undeliverable_here=True, annotations={"x-opt-why": "later"}),
    ),
    ("modified-bare", modify_bare, Settlement(Outcome.MODIFIED)),
    ("settled-without-outcome", settle_only, Settlement.accepted()),
]


# --- remote_settlement: the peer's state, read ----------------------------------------------------


@pytest.mark.parametrize(("give", "expected"), [case[1:] for case in PEER_OUTCOMES], ids=[c[0] for c in PEER_OUTCOMES])
def test_the_peers_outcome_reads_as_its_settlement(
    wire: Wire, give: Callable[[Delivery], None], expected: Settlement
) -> None:
    """Each terminal state the peer gives (with its condition, flags, annotations) reads as
    the Settlement carrying the same; a peer that settles without a state has accepted."""
    sent, received = wire.transfer()
    give(received)
    received.settle()
    wire.pump()
    assert sent.settled
    assert remote_settlement(lean(sent)) == expected


def test_accepted_and_released_read_as_the_shared_settlements(wire: Wire) -> None:
    """The two outcomes of nearly every message are the shared instances (no allocation)."""
    first, received_first = wire.transfer()
    second, received_second = wire.transfer()
    received_first.update(Delivery.ACCEPTED)
    received_second.update(Delivery.RELEASED)
    wire.pump()
    assert remote_settlement(lean(first)) is Settlement.accepted()
    assert remote_settlement(lean(second)) is Settlement.released()


def test_no_outcome_yet_reads_as_none(wire: Wire) -> None:
    """Nothing from the peer, or only a non-terminal state (received), is no outcome yet."""
    untouched, _ = wire.transfer()
    partway, received = wire.transfer()
    received.local.section_number = 2
    received.local.section_offset = 10
    received.update(Delivery.RECEIVED)
    wire.pump()
    assert partway.remote_state == Delivery.RECEIVED
    assert remote_settlement(lean(untouched)) is None
    assert remote_settlement(lean(partway)) is None


def test_a_state_the_caller_read_already_is_the_one_mapped(wire: Wire) -> None:
    """``state`` given: it is mapped, not read again (the router reads it once per event)."""
    sent, received = wire.transfer()
    received.update(Delivery.ACCEPTED)
    wire.pump()
    assert remote_settlement(lean(sent), Delivery.RELEASED) is Settlement.released()
    assert remote_settlement(lean(sent), 0) is None  # unsettled, and no state given


def test_an_unsettled_terminal_state_still_reads_as_the_outcome(wire: Wire) -> None:
    sent, received = wire.transfer()
    received.update(Delivery.ACCEPTED)
    wire.pump()
    assert not sent.settled
    assert remote_settlement(lean(sent)) is Settlement.accepted()


# --- apply_settlement: a settlement, given ---------------------------------------------------------

SETTLEMENTS = {
    "accepted": Settlement.accepted(),
    "released": Settlement.released(),
    "rejected-with-condition": Settlement(
        Outcome.REJECTED, "amqp:resource-limit-exceeded", "destination 'orders' is full", info={"depth": 1000}
    ),
    "rejected-bare": Settlement(Outcome.REJECTED),
    "modified-fully": Settlement(
        Outcome.MODIFIED, delivery_failed=True, undeliverable_here=True, annotations={"x-opt-retry": 3}
    ),
    "modified-failed": Settlement(Outcome.MODIFIED, delivery_failed=True),
}
_STATES = {
    Outcome.ACCEPTED: Delivery.ACCEPTED,
    Outcome.REJECTED: Delivery.REJECTED,
    Outcome.RELEASED: Delivery.RELEASED,
    Outcome.MODIFIED: Delivery.MODIFIED,
}


@pytest.mark.parametrize("settlement", SETTLEMENTS.values(), ids=SETTLEMENTS.keys())
def test_a_settlement_given_reaches_the_peer_settled_with_its_details(wire: Wire, settlement: Settlement) -> None:
    """What qpid-flow gives a producer's transfer: the peer sees the state, settled, with the
    condition (name, description, info) or the flags and annotations; and reads it back as
    the same Settlement (the mapping both ways)."""
    sent, received = wire.transfer()
    apply_settlement(lean(received), settlement)
    wire.pump()
    assert (sent.remote_state, sent.settled) == (_STATES[settlement.outcome], True)
    remote = sent.remote
    if settlement.outcome is Outcome.REJECTED:
        if settlement.condition is None:
            assert remote.condition is None
        else:
            condition = remote.condition
            assert (condition.name, condition.description, condition.info) == (
                settlement.condition,
                settlement.description,
                settlement.info,
            )
    if settlement.outcome is Outcome.MODIFIED:
        assert (remote.failed, remote.undeliverable) == (settlement.delivery_failed, settlement.undeliverable_here)
        assert remote.annotations == settlement.annotations
    assert remote_settlement(lean(sent)) == settlement


def test_accepted_and_released_are_sent_as_bare_dispositions(wire: Wire) -> None:
    """The short path (no content to copy): one disposition frame each, settled."""
    _, received_first = wire.transfer()
    _, received_second = wire.transfer()
    apply_settlement(lean(received_first), Settlement.accepted())
    apply_settlement(lean(received_second), Settlement.released())
    wire.pump()
    written = [frame for frame in wire.receiving.frames if " -> @disposition(" in frame]
    assert len(written) == 2
    assert "settled=true, state=@accepted(36) []" in written[0]
    assert "settled=true, state=@released(38) []" in written[1]


# --- apply_transactional: a settlement inside a transaction -------------------------------------------

TRANSACTIONAL = {
    "accepted": Settlement.accepted(),
    "released": Settlement.released(),
    "rejected": Settlement(Outcome.REJECTED, "amqp:resource-limit-exceeded", "full"),
    "modified": Settlement(Outcome.MODIFIED, delivery_failed=True, undeliverable_here=False),
}


@pytest.mark.parametrize("settlement", TRANSACTIONAL.values(), ids=TRANSACTIONAL.keys())
def test_a_transactional_settlement_reaches_the_peer_as_transactional_state(wire: Wire, settlement: Settlement) -> None:
    """The peer sees transactional-state (0x34) holding the txn-id and the outcome, settled;
    the outcome reads back (as the coordinator reads it) as the same Settlement."""
    sent, received = wire.transfer()
    apply_transactional(lean(received), b"txn-7", settlement)
    wire.pump()
    assert (sent.remote_state, sent.settled) == (TRANSACTIONAL_STATE, True)
    txn_id, outcome = sent.remote.data
    assert bytes(txn_id) == b"txn-7"
    assert isinstance(outcome, Described)
    codes = {Outcome.ACCEPTED: 0x24, Outcome.REJECTED: 0x25, Outcome.RELEASED: 0x26, Outcome.MODIFIED: 0x27}
    assert outcome.descriptor == codes[settlement.outcome]
    assert settlement_from_outcome(outcome) == settlement


# --- relay_state: a consumer's state, passed on to the broker ------------------------------------------


def relay(give: Callable[[Delivery], None], settle: bool) -> tuple[Settlement | None, Delivery]:
    """A consumer gives qpid-flow's delivery a state (settling it or not); qpid-flow relays it
    to the delivery it got from the broker. Returns what relay_state returned and the broker's
    delivery, as the broker sees it."""
    to_consumer = Wire("to-consumer")  # qpid-flow sends, the consumer receives
    from_broker = Wire("from-broker")  # the broker sends, qpid-flow receives
    ours_out, consumers = to_consumer.transfer()
    brokers, ours_in = from_broker.transfer()
    give(consumers)
    if settle:
        consumers.settle()
    to_consumer.pump()
    result = relay_state(lean(ours_out), lean(ours_in))
    from_broker.pump()
    return result, brokers


@pytest.mark.parametrize(("give", "expected"), [case[1:] for case in PEER_OUTCOMES], ids=[c[0] for c in PEER_OUTCOMES])
def test_a_consumers_settled_outcome_is_relayed_as_given(
    give: Callable[[Delivery], None], expected: Settlement
) -> None:
    """Settled by the consumer: the broker's delivery gets the same state and details, settled,
    and relay_state returns the outcome."""
    result, brokers = relay(give, settle=True)
    assert result == expected
    assert brokers.settled
    assert remote_settlement(lean(brokers)) == expected
    if give is settle_only:
        assert brokers.remote_state == 0, "a bare settle is passed on bare"


def test_a_consumers_unsettled_state_is_relayed_unsettled() -> None:
    """Accepted but not settled (the consumer settles later): the broker sees accepted, not
    settled, and relay_state returns None (no terminal outcome yet)."""
    result, brokers = relay(accept, settle=False)
    assert result is None
    assert (brokers.remote_state, brokers.settled) == (Delivery.ACCEPTED, False)


def test_a_received_state_is_relayed_with_its_section_and_offset() -> None:
    def received(delivery: Delivery) -> None:
        delivery.local.section_number = 2
        delivery.local.section_offset = 10
        delivery.update(Delivery.RECEIVED)

    result, brokers = relay(received, settle=False)
    assert result is None
    assert brokers.remote_state == Delivery.RECEIVED
    assert (brokers.remote.section_number, brokers.remote.section_offset) == (2, 10)
    assert not brokers.settled


def test_a_transactional_state_is_relayed_as_it_came() -> None:
    def in_transaction(delivery: Delivery) -> None:
        delivery.local.data = [b"txn-3", Described(ulong(0x24), [])]
        delivery.update(TRANSACTIONAL_STATE)

    # What relay_state returns is not checked here: it reads any settled transactional state
    # as accepted, whatever outcome the transaction carries (questionable, not pinned).
    _, brokers = relay(in_transaction, settle=True)
    assert (brokers.remote_state, brokers.settled) == (TRANSACTIONAL_STATE, True)
    txn_id, outcome = brokers.remote.data
    assert bytes(txn_id) == b"txn-3"
    assert settlement_from_outcome(outcome) == Settlement.accepted()
