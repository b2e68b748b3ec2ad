"""What plugins may do to a running router (handed to them by ``qpid_flow_started``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qpid_flow.amqp.bridge import ReactorBridge
    from qpid_flow.amqp.router import Router
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.memory import MemoryMeter
    from qpid_flow.core.model import Message
    from qpid_flow.core.registry import Destinations
    from qpid_flow.plugin.manager import Hooks

__all__ = ["RouterControl"]


# Runs a callback on the reactor thread after a delay in seconds (the reactor's timers).
Scheduler = Callable[[float, Callable[[], Any]], None]


class RouterControl:
    """What a plugin may do to a running router: a narrow, stable facade, handed to every
    plugin by :func:`~qpid_flow.plugin.hookspecs.qpid_flow_started` (keep it).

    Reactor thread only (where hooks, timers set with :meth:`schedule` and callbacks handed
    over with :meth:`call_from_thread` run), except :meth:`call_from_thread`: the one method
    another thread may call.

    :ivar memory: the bytes of messages qpid-flow holds (each its encoded size plus
        ``memory.per_message``: what holding it costs), against ``memory_limit``
        (:class:`~qpid_flow.core.memory.MemoryMeter`): read ``memory.over`` (True while
        the bytes in use are at the limit: the built-in flow control then gives no producer
        credit), ``memory.held`` (every byte), ``memory.waiting`` (those of transfers held
        unforwarded, which are not in use: admitting one moves its bytes),
        ``memory.in_use``, ``memory.limit`` (0: no limit) and ``memory.charge(size)``
        (what a message of ``size`` bytes counts for); ``memory.when_below(callback)``
        calls ``callback`` each time the bytes in use fall back below the limit (the
        built-in flow control resumes producers that way).
    :ivar hooks: every hook, as the router calls them (:class:`~qpid_flow.plugin.manager.Hooks`:
        one attribute per hook, named without the ``qpid_flow_`` prefix, called with
        keyword arguments), for a plugin that reports events of its own to other plugins:
        the built-in flow control calls ``control.hooks.flow_changed(...)``.
    """

    def __init__(
        self,
        schedule: Scheduler,
        router: Router,
        destinations: Destinations,
        bridge: ReactorBridge,
        memory: MemoryMeter,
        hooks: Hooks,
    ) -> None:
        self._schedule = schedule
        self._router = router
        self._destinations = destinations
        self._bridge = bridge
        # Public attributes are documented with ``:ivar`` in the class docstring (the hook
        # reference, qpid_flow.plugin.reference, renders them and refuses one left out).
        self.memory = memory
        self.hooks = hooks

    def call_from_thread(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` on the reactor thread soon, after the calls handed over before it.

        The one method that is safe to call from another thread: a plugin's worker thread
        (one that polls a broker's management API, say) hands its results over with it,
        and the callback may then use everything else here."""
        self._bridge.call_soon(callback)

    def schedule(self, delay: float, callback: Callable[[], Any]) -> None:
        """Run ``callback`` on the reactor thread after ``delay`` seconds (0: once the current
        event is handled). A timer cannot be cancelled: a callback that may no longer be
        wanted checks for itself when it runs."""
        self._schedule(delay, callback)

    def destination(self, address: str) -> Destination | None:
        """The destination of ``address`` if it exists (never creates one), else None.

        Here and in the methods below, ``address`` is a destination's name
        (``destination.address``) or an address as clients write it: in front of RabbitMQ
        ``/queue/X`` and ``/amq/queue/X`` are queue ``X`` (:meth:`destination_name`)."""
        found = self._destinations.find(address)
        return found if found is not None else self._destinations.find(self._router.destination_name(address))

    def _name(self, address: str) -> str:
        # A destination's own name first: one whose name reads as another address form
        # (a queue named "/x") must still be found by it.
        if self._destinations.find(address) is not None:
            return address
        return self._router.destination_name(address)

    def destination_name(self, address: str) -> str:
        """The destination name ``address`` stands for: ``address`` itself standalone; in
        front of a broker, as the broker reads it (RabbitMQ's ``/queue/X`` and
        ``/amq/queue/X`` are ``X``). For names and patterns an operator gives, which may be
        written as clients write addresses."""
        return self._router.destination_name(address)

    def address_forms(self, name: str) -> tuple[str, ...]:
        """Every address that names destination ``name``, ``name`` first, for matching a
        pattern an operator gave against it (with ``qpid_flow.config.matches_any(pattern, forms)``):
        standalone, the name alone; in front of RabbitMQ, queue ``X`` is also
        ``/queue/X`` and ``/amq/queue/X``, so that ``/queue/>`` names every queue and no
        topic."""
        return self._router.address_forms(name)

    def destinations(self) -> Iterator[Destination]:
        """Every destination that exists now (a snapshot: destinations may come and go while
        it is read)."""
        return iter(self._destinations)

    def wake(self, address: str | None = None) -> None:
        """A policy's answers may have changed: ask the policies again, for ``address`` (or
        for every destination when None).

        In this order: the transfers held for the address
        (:func:`~qpid_flow.plugin.hookspecs.qpid_flow_transfer_arrived`, in arrival order)
        and its delayed settlements
        (:func:`~qpid_flow.plugin.hookspecs.qpid_flow_settlement_delay`, in order); its
        waiting messages (the destination hands messages out:
        :func:`~qpid_flow.plugin.hookspecs.qpid_flow_consumer_select`); producer credit
        (:func:`~qpid_flow.plugin.hookspecs.qpid_flow_producer_credit`) for every producer
        of the address and every anonymous-relay producer, or every producer when None.

        The hooks are asked before it returns: from a hook about a message, which runs in
        the middle of the data path, schedule it instead (``control.schedule(0, ...)``), as
        the built-in flow control does. Never call it from a question hook (one whose answer
        qpid-flow waits for: ``transfer_arrived``, ``producer_credit``, ``consumer_select``,
        ``settlement_delay``, ``producers_held``): it asks them again, which calls it again
        (a ``RecursionError``, logged ``plugin_error``, and the answer lost)."""
        name = self._name(address) if address else None
        targets = [self._destinations.find(name)] if name else list(self._destinations)
        for destination in targets:
            if destination is None:
                continue
            self._router.recheck_held(destination.address)
            destination.dispatch()
        self._router.grant_all(name)

    def held_transfers(self, address: str) -> int:
        """How many transfers to ``address`` a policy is holding unforwarded (answered
        ``Hold`` by :func:`~qpid_flow.plugin.hookspecs.qpid_flow_transfer_arrived`)."""
        return self._router.held_count(self._name(address))

    def held_messages(self, address: str) -> list[Message]:
        """The transfers to ``address`` a policy is holding unforwarded, in arrival order.
        Only the first is asked again when the destination changes
        (:func:`~qpid_flow.plugin.hookspecs.qpid_flow_transfer_arrived`): a policy that
        starts a clock on each (``reject_after``) reads the others here."""
        return self._router.held_messages(self._name(address))

    def delayed_producers(self, address: str) -> int:
        """How many producers wait for the settlement of a transfer to ``address`` (delayed by
        :func:`~qpid_flow.plugin.hookspecs.qpid_flow_settlement_delay`)."""
        return self._router.delayed_producers(self._name(address))

    def waiting_producers(self, address: str) -> set[int]:
        """The ids (``Producer.id``) of the producers that wait for the answer to a transfer
        to ``address``: held unforwarded, or its settlement delayed."""
        return self._router.waiting_producers(self._name(address))
