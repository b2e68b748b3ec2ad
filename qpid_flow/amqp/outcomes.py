"""Translate between Proton delivery states and qpid-flow's :class:`Settlement`."""

from __future__ import annotations

from cproton import PN_ACCEPTED, PN_RELEASED
from proton import Condition, Delivery, Described, symbol, ulong

from qpid_flow.amqp.endpoints import LeanDelivery
from qpid_flow.core.model import Outcome, Settlement
from qpid_flow.core.transactions import settlement_from_outcome

__all__ = [
    "TRANSACTIONAL_STATE",
    "apply_settlement",
    "apply_transactional",
    "is_terminal",
    "relay_state",
    "remote_settlement",
]

# The transactional-state delivery state (AMQP 1.0 part 4.5.5): a transfer or disposition
# that is part of a transaction carries it, with the txn-id and the outcome inside.
TRANSACTIONAL_STATE = 0x34
_OUTCOME_CODES = {Outcome.ACCEPTED: 0x24, Outcome.REJECTED: 0x25, Outcome.RELEASED: 0x26, Outcome.MODIFIED: 0x27}
_ERROR_CODE = 0x1D

_TERMINAL = {
    Delivery.ACCEPTED: Outcome.ACCEPTED,
    Delivery.REJECTED: Outcome.REJECTED,
    Delivery.RELEASED: Outcome.RELEASED,
    Delivery.MODIFIED: Outcome.MODIFIED,
}
_STATE = {outcome: state for state, outcome in _TERMINAL.items()}


def remote_settlement(delivery: LeanDelivery, state: int | None = None) -> Settlement | None:
    """The outcome the peer gave ``delivery`` (whose remote state the caller may have read
    already: ``state``); None while it has given none.

    A peer that settles without an outcome is taken to have accepted: that is what
    clients that auto-settle mean, and the default outcome of a source with none set.
    """
    if state is None:
        state = delivery.remote_state
    outcome = _TERMINAL.get(state)
    if outcome is None:
        if state == TRANSACTIONAL_STATE:
            return _transactional_settlement(delivery)
        return Settlement.accepted() if delivery.settled else None
    if outcome is Outcome.ACCEPTED:
        return Settlement.accepted()
    if outcome is Outcome.RELEASED:
        return Settlement.released()
    remote = delivery.proton().remote  # rejected or modified: rare, and they carry more
    if outcome is Outcome.REJECTED:
        condition = remote.condition
        if condition is None:
            return Settlement(Outcome.REJECTED)
        return Settlement(
            Outcome.REJECTED, condition=condition.name, description=condition.description, info=condition.info
        )
    return Settlement(
        Outcome.MODIFIED,
        delivery_failed=bool(remote.failed),
        undeliverable_here=bool(remote.undeliverable),
        annotations=remote.annotations,
    )


def _transactional_settlement(delivery: LeanDelivery) -> Settlement | None:
    """The outcome inside a transactional state (txn-id, then the outcome, if any): what a
    broker answers a transfer sent in one of its transactions."""
    fields = delivery.proton().remote.data or []
    settlement = settlement_from_outcome(fields[1] if len(fields) > 1 else None)
    if settlement is None:
        return Settlement.accepted() if delivery.settled else None
    return settlement


def apply_settlement(delivery: LeanDelivery, settlement: Settlement) -> None:
    """Give ``delivery`` the outcome ``settlement`` and settle it."""
    outcome = settlement.outcome
    # Identity, not a dict: an Enum member hashes in Python.
    plain = PN_ACCEPTED if outcome is Outcome.ACCEPTED else PN_RELEASED if outcome is Outcome.RELEASED else None
    if plain is not None:
        delivery.settle_as(plain)  # accepted and released carry nothing
        return
    full = delivery.proton()  # rejected or modified: Proton copies their content across
    if outcome is Outcome.REJECTED and settlement.condition:
        full.local.condition = Condition(settlement.condition, settlement.description, settlement.info)
    elif outcome is Outcome.MODIFIED:
        full.local.failed = settlement.delivery_failed
        full.local.undeliverable = settlement.undeliverable_here
        if settlement.annotations:
            full.local.annotations = settlement.annotations
    full.update(_STATE[outcome])
    full.settle()


def apply_transactional(delivery: LeanDelivery, txn_id: bytes, settlement: Settlement) -> None:
    """Settle ``delivery`` with ``settlement`` inside transaction ``txn_id`` (a producer's
    transactional transfer: the outcome takes effect when the transaction commits)."""
    outcome = settlement.outcome
    fields: list[object] = []
    if outcome is Outcome.REJECTED and settlement.condition:
        fields = [Described(ulong(_ERROR_CODE), [symbol(settlement.condition), settlement.description, None])]
    elif outcome is Outcome.MODIFIED:
        fields = [settlement.delivery_failed, settlement.undeliverable_here]
    full = delivery.proton()
    full.local.data = [txn_id, Described(ulong(_OUTCOME_CODES[outcome]), fields)]
    full.update(TRANSACTIONAL_STATE)
    full.settle()


def is_terminal(state: int) -> bool:
    """Whether ``state`` is an outcome (accepted, rejected, released, modified)."""
    return state in _TERMINAL


def relay_state(source: LeanDelivery, target: LeanDelivery, settle: bool | None = None) -> Settlement | None:
    """Give ``target`` the state the peer gave ``source``, as it was given, settling it when
    the peer settled (or when ``settle`` says so): how a consumer's outcome reaches the
    broker in front of one.

    Accepted and released take the short path; every other state (rejected with its
    condition, modified with its flags and annotations, received) is copied through
    Proton's full wrapper. Returns the terminal outcome, or None while there is none.
    """
    state = source.remote_state
    settled = source.settled if settle is None else settle
    if state in (PN_ACCEPTED, PN_RELEASED):
        if not settled:
            target.proton().update(state)
            return None
        target.settle_as(state)
        return Settlement.accepted() if state == PN_ACCEPTED else Settlement.released()
    settlement = remote_settlement(source)
    if state:
        remote = source.proton().remote
        full = target.proton()
        local = full.local
        if state == Delivery.REJECTED:
            local.condition = remote.condition
        elif state == Delivery.MODIFIED:
            local.failed = remote.failed
            local.undeliverable = remote.undeliverable
            local.annotations = remote.annotations
        elif state == Delivery.RECEIVED:
            local.section_number = remote.section_number
            local.section_offset = remote.section_offset
        elif state not in _TERMINAL:
            local.data = remote.data  # a state of another kind (transactional): as it came
        full.update(state)
    if settled:
        target.settle()
    return settlement if settled else None
