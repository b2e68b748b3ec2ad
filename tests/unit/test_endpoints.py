"""endpoints.py: the data path's lean handling of Proton deliveries, links and transfers.

On real Proton engine ends in memory (:class:`tests.unit.test_outcomes.Wire`): what the lean
calls put on the wire is what Proton's own calls would.
"""

from __future__ import annotations

import gc
import itertools

from cproton import PN_ACCEPTED, PN_RELEASED
from proton import Connection, Delivery

from qpid_flow.amqp.endpoints import (
    DeliveryEvent,
    LeanDelivery,
    LinkFlowEvent,
    delivery_tags,
    keep_link,
    kept,
    new_delivery,
    send_transfer,
    take_transfer,
)
from tests.unit.test_outcomes import Wire


def test_delivery_tags_count_from_one_as_bytes() -> None:
    assert list(itertools.islice(delivery_tags(), 3)) == [b"1", b"2", b"3"]
    assert next(delivery_tags()) == b"1", "each generator counts on its own"


def test_kept_reads_what_was_kept_on_a_wrapper_and_none_otherwise() -> None:
    connection = Connection()
    assert kept(connection, "qf_id") is None  # a bare object: Proton's EmptyAttrs
    connection.qf_id = "c7"
    assert kept(connection, "qf_id") == "c7"
    assert kept(connection, "qf_user") is None


def test_a_lean_transfer_arrives_as_sent_with_its_tag() -> None:
    """new_delivery + send_transfer at one end; take_transfer at the other reads the bytes and
    moves on to the next delivery. A str tag is encoded, a bytes tag goes as it is."""
    wire = Wire()
    first = new_delivery(wire.sender, b"\x00tag")
    send_transfer(wire.sender, b"first message")
    second = new_delivery(wire.sender, "text-tag")
    send_transfer(wire.sender, b"second")
    wire.pump()
    assert (first.settled, second.settled) == (False, False)

    receiver = wire.receiver
    delivery = receiver.current
    assert delivery is not None and delivery.tag == "\x00tag"  # Proton reads tags as text
    lean = LeanDelivery(delivery._impl)
    assert (lean.readable, lean.partial, lean.pending, lean.aborted) == (True, False, 13, False)
    assert take_transfer(receiver, lean.pending) == b"first message"
    following = receiver.current
    assert following is not None and following.tag == "text-tag"
    assert take_transfer(receiver, following.pending) == b"second"
    assert receiver.current is None
    tags = [line.split("delivery-tag=")[1].split(",")[0] for line in wire.receiving.frames if "@transfer(" in line]
    assert tags == ['b"\\x00tag"', 'b"text-tag"']


def test_settle_as_gives_a_bare_outcome_and_settles() -> None:
    wire = Wire()
    accepted, received_first = wire.transfer()
    released, received_second = wire.transfer()
    LeanDelivery(received_first._impl).settle_as(PN_ACCEPTED)
    LeanDelivery(received_second._impl).settle_as(PN_RELEASED)
    wire.pump()
    assert (accepted.remote_state, accepted.settled) == (Delivery.ACCEPTED, True)
    assert (released.remote_state, released.settled) == (Delivery.RELEASED, True)
    assert LeanDelivery(accepted._impl).remote_state == Delivery.ACCEPTED
    assert LeanDelivery(accepted._impl).settled


def test_a_lean_delivery_keeps_its_c_delivery_alive_and_wraps_it_in_full_on_demand() -> None:
    wire = Wire()
    sent, _ = wire.transfer()
    lean = LeanDelivery(sent._impl)
    tag = sent.tag
    del sent
    gc.collect()
    full = lean.proton()
    assert isinstance(full, Delivery) and full.tag == tag


def test_delivery_and_flow_events_hand_back_the_link_wrapper_kept() -> None:
    """After keep_link, an event of the link finds the very wrapper (and what is kept on it,
    like the router's qf_consumer); a link not kept gets a fresh wrapper of the same link."""
    wire = Wire()
    sender = wire.sender
    sender.qf_marker = "kept"
    keep_link(sender)
    delivery = sender.delivery("t-1")
    event = DeliveryEvent(delivery._impl, sender._impl)
    assert event.link is sender
    assert event.link is event.link
    assert event.delivery.settled is False and event.impl == delivery._impl
    assert LinkFlowEvent(sender._impl).link is sender

    receiver = wire.receiver
    flow = LinkFlowEvent(receiver._impl)
    assert flow.link is not receiver
    assert flow.link.name == receiver.name
