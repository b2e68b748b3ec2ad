"""The Proton objects of the data path, handled lean: deliveries, links, transfers.

Proton's Python wrappers cost more per message than qpid-flow's own work: a ``Delivery``
builds a record and two ``Disposition`` objects, ``Link.send`` and ``Link.recv`` go
through several Python calls each, and an attribute kept on a wrapper is read through a
failing lookup. What the data path touches for every message is here, on the C objects
through ``cproton`` directly; everything else stays Proton's.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from typing import Any

from cproton import (
    PN_EOS,
    ffi,
    lib,
    pn_decref,
    pn_delivery,
    pn_delivery_aborted,
    pn_delivery_partial,
    pn_delivery_pending,
    pn_delivery_readable,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_incref,
    pn_link_advance,
)
from proton import Delivery, Link

__all__ = [
    "DeliveryEvent",
    "LeanDelivery",
    "LinkFlowEvent",
    "delivery_tags",
    "keep_link",
    "kept",
    "new_delivery",
    "send_transfer",
    "take_transfer",
    "take_transfer_part",
]


def take_transfer(link: Link, size: int) -> bytes:
    """The ``size`` bytes of the current (complete) delivery on a receiving link, then on
    to the next delivery: ``link.recv`` and ``link.advance`` through Proton's C functions
    (its Python methods cost four calls and a ``hasattr`` more per message)."""
    buffer = bytearray(size)
    received = lib.pn_link_recv(link._impl, ffi.from_buffer(buffer), size)
    if received < 0 and received != PN_EOS:
        link._check(received)  # raises Proton's LinkException
    pn_link_advance(link._impl)
    return bytes(buffer) if received == size else bytes(buffer[: max(received, 0)])


def take_transfer_part(link: Link, size: int) -> bytes:
    """The ``size`` bytes the current (incomplete) delivery on a receiving link holds so
    far, staying on that delivery (its next transfers add to it)."""
    buffer = bytearray(size)
    received = lib.pn_link_recv(link._impl, ffi.from_buffer(buffer), size)
    if received < 0 and received != PN_EOS:
        link._check(received)  # raises Proton's LinkException
    return bytes(buffer[: max(received, 0)])


def send_transfer(link: Link, data: bytes) -> None:
    """``link.send(data)`` and ``link.advance()`` for the current delivery, in C."""
    sent = lib.pn_link_send(link._impl, ffi.from_buffer(data), len(data))
    if sent < 0:
        link._check(sent)  # raises Proton's LinkException
    pn_link_advance(link._impl)


def kept(wrapper: Any, name: str) -> Any:
    """What qpid-flow keeps on a Proton wrapper under ``name`` (None if nothing).

    Proton stores such attributes in the C object's record, and reading one with
    ``getattr`` first fails the normal lookup, which builds and discards an
    ``AttributeError`` with a formatted message: about 70 times the cost of a plain
    attribute, several times per message."""
    attrs = wrapper.__dict__["_attrs"]  # a dict, or Proton's EmptyAttrs for a bare object
    return attrs[name] if name in attrs else None  # noqa: SIM401 (EmptyAttrs has no get)


# Link wrappers in use, by C pointer. Weak: an entry goes when its wrapper goes, before
# Proton can free the link and reuse its address. (A plain dict of weak references rather
# than a WeakValueDictionary, whose get() is a Python method: this runs for every
# delivery event.)
_links: dict[Any, weakref.ref[Link]] = {}


def _link_of(link_impl: Any) -> Link:
    """The wrapper of a C link: the one already held (see :func:`keep_link`), else a new one."""
    ref = _links.get(link_impl)
    link = ref() if ref is not None else None
    return Link.wrap(link_impl) if link is None else link


def _forget_link(link_impl: Any, ref: weakref.ref[Link]) -> None:
    if _links.get(link_impl) is ref:  # not a newer wrapper kept under the same address
        del _links[link_impl]


class LeanDelivery:
    """The handful of ``Delivery`` operations the data path uses, straight on the C delivery.

    Proton's ``Delivery`` wrapper looks up (or creates) a Python record on the C object and
    builds two ``Disposition`` objects the first time a delivery is wrapped; a relayed
    message makes four deliveries, and that was about a tenth of qpid-flow's CPU per
    message in front of a broker. This holds a reference to the C delivery and nothing
    else; the rare paths that need dispositions with content (rejected with a condition,
    modified) go through Proton's full wrapper, :meth:`proton`.
    """

    __slots__ = ("_impl",)

    def __init__(self, impl: Any) -> None:
        pn_incref(impl)  # as Proton's wrapper does: the C delivery lives while this does
        self._impl = impl

    def __del__(self) -> None:
        pn_decref(self._impl)

    def proton(self) -> Delivery:
        """Proton's full wrapper of this delivery."""
        return Delivery.wrap(self._impl)

    @property
    def settled(self) -> bool:
        return bool(pn_delivery_settled(self._impl))

    @property
    def aborted(self) -> bool:
        return bool(pn_delivery_aborted(self._impl))

    @property
    def readable(self) -> bool:
        return bool(pn_delivery_readable(self._impl))

    @property
    def partial(self) -> bool:
        return bool(pn_delivery_partial(self._impl))

    @property
    def pending(self) -> int:
        return int(pn_delivery_pending(self._impl))

    @property
    def remote_state(self) -> int:
        """The peer's outcome as Proton's code (``Delivery.ACCEPTED`` etc. compare equal)."""
        return int(pn_delivery_remote_state(self._impl))

    def settle_as(self, state: int) -> None:
        """Give an outcome that carries nothing (accepted, released) and settle: no local
        disposition content to copy across, unlike ``Delivery.update``."""
        pn_delivery_update(self._impl, state)
        pn_delivery_settle(self._impl)

    def settle(self) -> None:
        pn_delivery_settle(self._impl)


def keep_link(link: Link) -> None:
    """Let deliveries of ``link`` hand back this wrapper for as long as the caller holds it."""
    impl = link._impl
    _links[impl] = weakref.ref(link, lambda ref: _forget_link(impl, ref))


def new_delivery(link: Link, tag: str | bytes) -> LeanDelivery:
    """``link.delivery(tag)``, made a :class:`LeanDelivery`. A ``bytes`` tag goes to C as
    it is (Proton's wrapper checks its type and encodes a ``str`` first)."""
    if tag.__class__ is bytes:
        return LeanDelivery(lib.pn_delivery(link._impl, (len(tag), ffi.from_buffer(tag))))
    return LeanDelivery(pn_delivery(link._impl, tag))


def delivery_tags() -> Iterator[bytes]:
    """Delivery tags for the deliveries qpid-flow creates: b"1", b"2", ... (unique per
    link, as AMQP asks, since they are unique per process)."""
    return (b"%d" % n for n in itertools.count(1))


class DeliveryEvent:
    """What a delivery handler reads from a ``PN_DELIVERY`` event.

    ``impl`` is the C delivery: a handler that keeps the deliveries it created in a dict
    keyed by it finds them without wrapping anything. ``delivery`` and ``link`` are
    wrapped on first use (the link from the wrappers already held, see :func:`keep_link`).
    """

    __slots__ = ("_delivery", "_link", "impl", "link_impl")

    def __init__(self, impl: Any, link_impl: Any) -> None:
        self.impl = impl
        self.link_impl = link_impl
        self._delivery: LeanDelivery | None = None
        self._link: Link | None = None  # a producer's delivery asks twice (broker mode)

    @property
    def delivery(self) -> LeanDelivery:
        if self._delivery is None:
            self._delivery = LeanDelivery(self.impl)
        return self._delivery

    @property
    def link(self) -> Link:
        link = self._link
        if link is None:
            link = self._link = _link_of(self.link_impl)
        return link


class LinkFlowEvent:
    """What a handler reads from a ``PN_LINK_FLOW`` event: the link (the wrapper already
    held, see :func:`keep_link`)."""

    __slots__ = ("link_impl",)

    def __init__(self, link_impl: Any) -> None:
        self.link_impl = link_impl

    @property
    def link(self) -> Link:
        return _link_of(self.link_impl)
