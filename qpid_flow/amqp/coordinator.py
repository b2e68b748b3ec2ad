"""The transaction coordinator of standalone qpid-flow (AMQP 1.0 part 4): the Proton side.

A client attaches a link to a ``coordinator`` target and sends it ``declare`` and
``discharge`` messages; this answers them (``declared`` with a txn-id, ``accepted``, or
``rejected`` with a transaction error) and applies a discharge to the router's state. What
a transaction holds, and whether a commit can go through, is qpid_flow/core/transactions.py.

In front of a broker the coordinator link is the broker's (qpid_flow/amqp/linkroute.py passes
it through); this module is standalone only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from proton import UNDESCRIBED, Array, Condition, Data, Delivery, Described, Link, symbol
from proton import Message as ProtonMessage

from qpid_flow.amqp.endpoints import keep_link
from qpid_flow.core.transactions import ROLLBACK, UNKNOWN_ID, Transaction, Transactions, plain_descriptor

if TYPE_CHECKING:
    from qpid_flow.amqp.endpoints import LeanDelivery
    from qpid_flow.amqp.router import Router
    from qpid_flow.core.destination import Destination

__all__ = ["Coordinator"]

log = structlog.get_logger(__name__)

DECLARED = 0x33  # the declared delivery state (part 4.5.3): carries the txn-id
_DECLARE = (0x31, "amqp:declare:list")
_DISCHARGE = (0x32, "amqp:discharge:list")
CONTROL_CREDIT = 100  # control messages a client may have in flight


class Coordinator:
    """Answers coordinator links and discharges transactions on the router's state."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.transactions = Transactions()

    # --- the coordinator link ---------------------------------------------------------

    def attach(self, link: Link) -> None:
        """Answer a coordinator attach: its target, with of the capabilities asked for
        only those qpid-flow has (local transactions), and credit for control messages."""
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        _only_local_transactions(link.target.capabilities)
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        link.qf_coordinator = True
        keep_link(link)
        link.flow(CONTROL_CREDIT)

    def controller_gone(self, link: Link) -> None:
        """The coordinator link went: its open transactions are rolled back (part 4.3)."""
        for txn in self.transactions.declared_by(link):
            self._rollback(txn, "its coordinator link went")

    def on_control(self, link: Link, delivery: LeanDelivery, data: bytes) -> None:
        """A declare or discharge arrived on a coordinator link."""
        link.flow(1)  # one in, one more may come
        body = _control_body(data)
        kind = plain_descriptor(getattr(body, "descriptor", None))
        fields = list(body.value) if isinstance(getattr(body, "value", None), list | tuple) else []
        if kind in _DECLARE:
            if fields and fields[0] is not None:
                _answer(delivery, Delivery.REJECTED, condition=Condition("amqp:not-implemented", "global transactions"))
                return
            txn = self.transactions.declare(link.connection.qf_id, link)
            log.info("transaction_declared", txn=txn.id.decode(), connection=txn.connection_id)
            _answer(delivery, DECLARED, data=[txn.id])
        elif kind in _DISCHARGE:
            found = self.transactions.find(fields[0] if fields else None, link.connection.qf_id)
            if found is None:
                unknown = Condition(UNKNOWN_ID, f"no transaction {_txn_name(fields)}")
                _answer(delivery, Delivery.REJECTED, condition=unknown)
                return
            fail = bool(fields[1]) if len(fields) > 1 else False
            if fail:
                self._rollback(found, "the client asked for it")
                _answer(delivery, Delivery.ACCEPTED)
            else:
                found.waiting = delivery
                self.try_commit(found)
        else:
            _answer(
                delivery,
                Delivery.REJECTED,
                condition=Condition("amqp:decode-error", "a coordinator takes declare and discharge only"),
            )

    # --- discharge ---------------------------------------------------------------------

    def try_commit(self, txn: Transaction) -> None:
        """Commit ``txn`` if its discharge came and no transfer of it is undecided; else
        wait (a policy holds some of its transfers, and will decide them)."""
        if txn.waiting is None or txn.undecided:
            return
        delivery, txn.waiting = txn.waiting, None
        router = self.router
        refusal = txn.commit_refusal(lambda d: router.destinations.find(d.address) is d)
        if refusal is not None:
            self._rollback(txn, refusal)
            _answer(delivery, Delivery.REJECTED, condition=Condition(ROLLBACK, f"rolled back: {refusal}"))
            return
        self.transactions.end(txn)
        txn.unstage()
        touched: dict[int, Destination] = {}
        for destination, message in txn.transfers:
            router.memory.sub(message.size)
            message.txn = None
            router.backend.forward(destination, message, _committed)
            touched[id(destination)] = destination
        for staged in txn.outcomes.values():
            if staged.delivery is not None:
                router.forget_sent(staged.consumer, staged.delivery)
            settled_on = router.destinations.find(staged.consumer.address)
            if settled_on is not None:
                settled_on.settle(staged.consumer, staged.message, staged.settlement)
                touched[id(settled_on)] = settled_on
        for destination in touched.values():
            router.backend.demand_changed(destination)
        log.info("transaction_committed", txn=txn.id.decode(), enqueued=len(txn.transfers), settled=len(txn.outcomes))
        _answer(delivery, Delivery.ACCEPTED)

    def _rollback(self, txn: Transaction, reason: str) -> None:
        """Undo ``txn``: its transfers are dropped, its consumers' outcomes undone (what a
        client had already settled goes back to the queue; the rest stays out to its
        consumer, for the client to settle again)."""
        self.transactions.end(txn)
        txn.unstage()
        router = self.router
        router.drop_held_in(txn)
        for _, message in txn.transfers:
            router.memory.sub(message.size)
        # The room the staged transfers took is free again: transfers held because they
        # counted (flow control counts what is staged) are asked about again, then whoever
        # waits for credit there (the transaction's own producer, if it stays) may have it.
        for address in {destination.address for destination, _ in txn.transfers}:
            router.recheck_held(address)
            router.grant_all(address)
        given_back: dict[int, Destination] = {}
        for staged in txn.outcomes.values():
            if staged.delivery is not None:
                # Still out to its consumer (the client settles it again, Proton's releases
                # it): a failed attempt all the same, as when the client had settled it and
                # it comes back below, and as JMS brokers count a rollback. (It came back at
                # 1 or 0 depending on whether the client had settled its transactional accept.)
                staged.message.delivery_failed()
            else:  # the client settled it: it comes back to the queue
                destination = router.destinations.find(staged.consumer.address)
                if destination is not None:
                    destination.release_held(staged.consumer, [staged.message])
                    given_back[id(destination)] = destination
        for destination in given_back.values():
            # Consumers with credit (the one that rolled back, often) take them now, not
            # when some other event comes along.
            destination.dispatch()
            router.backend.demand_changed(destination)
        if txn.waiting is not None:
            waiting, txn.waiting = txn.waiting, None
            _answer(waiting, Delivery.REJECTED, condition=Condition(ROLLBACK, f"rolled back: {reason}"))
        log.info("transaction_rolled_back", txn=txn.id.decode(), reason=reason, dropped=len(txn.transfers))


LOCAL_TRANSACTIONS = "amqp:local-transactions"


def _only_local_transactions(capabilities: Data) -> None:
    """Keep, of the txn-capabilities in ``capabilities``, local transactions: a client that
    asks for distributed or promotable ones must not be told it has them (it learnt only at
    its declare, from amqp:not-implemented)."""
    capabilities.rewind()
    asked: list[str] = []
    if capabilities.next() is not None:
        value = capabilities.get_object()
        elements = getattr(value, "elements", None)  # an array of symbols, or one symbol
        asked = [str(v) for v in elements] if elements is not None else [str(value)]
    capabilities.clear()
    if LOCAL_TRANSACTIONS in asked:
        capabilities.put_object(Array(UNDESCRIBED, Data.SYMBOL, symbol(LOCAL_TRANSACTIONS)))


def _committed(_message: Any, _settlement: Any) -> None:
    """A committed transfer's enqueue outcome: its producer had its (transactional) answer
    at arrival, and the commit checked there is room."""


def _control_body(data: bytes) -> Any:
    message = ProtonMessage()
    try:
        message.decode(data)
    except Exception:  # any decode failure is the same answer: not a control message
        return None
    body = message.body
    # Copied out before ``message`` goes: Proton hands binary fields (the txn-id) out as
    # views of the message's own buffer, freed with it. A txn-id read from such a view
    # was garbage for every discharge with a numeric descriptor (qpid-jms, rhea, .NET).
    return _owned(body) if isinstance(body, Described) else None


def _txn_name(fields: list[Any]) -> str:
    """The txn-id a discharge named, for its error: readable text where it is text."""
    txn = fields[0] if fields else None
    if isinstance(txn, bytes):
        try:
            return repr(txn.decode("ascii"))
        except UnicodeDecodeError:
            return txn.hex()
    return repr(txn)


def _owned(value: Any) -> Any:
    """``value`` with every buffer view in it copied into bytes of its own."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, Described):
        return Described(value.descriptor, _owned(value.value))
    if isinstance(value, list | tuple):
        return [_owned(item) for item in value]
    return value


def _answer(
    delivery: LeanDelivery, state: int, data: list[Any] | None = None, condition: Condition | None = None
) -> None:
    full = delivery.proton()
    if data is not None:
        full.local.data = data
    if condition is not None:
        full.local.condition = condition
    full.update(state)
    full.settle()
