"""Translate between Proton delivery states and qpid-flow's :class:`Settlement`."""

from __future__ import annotations

from cproton import PN_ACCEPTED, PN_RELEASED
from proton import Condition, Delivery

from qpid_flow.endpoints import LeanDelivery
from qpid_flow.model import Outcome, Settlement

__all__ = ["apply_settlement", "remote_settlement"]

_TERMINAL = {
    Delivery.ACCEPTED: Outcome.ACCEPTED,
    Delivery.REJECTED: Outcome.REJECTED,
    Delivery.RELEASED: Outcome.RELEASED,
    Delivery.MODIFIED: Outcome.MODIFIED,
}
_STATE = {outcome: state for state, outcome in _TERMINAL.items()}


def remote_settlement(delivery: LeanDelivery) -> Settlement | None:
    """The outcome the peer gave ``delivery``; None while it has given none.

    A peer that settles without an outcome is taken to have accepted: that is what
    clients that auto-settle mean, and the default outcome of a source with none set.
    """
    outcome = _TERMINAL.get(delivery.remote_state)
    if outcome is None:
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
        return Settlement(Outcome.REJECTED, condition=condition.name, description=condition.description)
    return Settlement(
        Outcome.MODIFIED,
        delivery_failed=bool(remote.failed),
        undeliverable_here=bool(remote.undeliverable),
    )


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
        full.local.condition = Condition(settlement.condition, settlement.description)
    elif outcome is Outcome.MODIFIED:
        full.local.failed = settlement.delivery_failed
        full.local.undeliverable = settlement.undeliverable_here
    full.update(_STATE[outcome])
    full.settle()
