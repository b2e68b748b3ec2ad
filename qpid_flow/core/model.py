"""Plain value and state objects shared by the data path and the policies.

Nothing here imports Proton: policies see messages, producers and consumers as these
objects, so they can be unit-tested without a network. The router owns the mapping
from these objects to Proton links and deliveries.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from qpid_flow import codec

__all__ = [
    "DEFAULT_GROUP",
    "SELECT_AFTER_FAILURE",
    "Admit",
    "Consumer",
    "Decision",
    "Hold",
    "Message",
    "Outcome",
    "Producer",
    "Reject",
    "group_key",
]


class Outcome(enum.Enum):
    """The terminal states of a delivery (AMQP 1.0 part 3.4)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    RELEASED = "released"
    MODIFIED = "modified"

    @property
    def removes_message(self) -> bool:
        """True when the message leaves the destination (it is not handed out again)."""
        return self in (Outcome.ACCEPTED, Outcome.REJECTED)


@dataclass(frozen=True, slots=True)
class Settlement:
    """An outcome with the details some outcomes carry."""

    outcome: Outcome
    condition: str | None = None  # rejected: the error condition name
    description: str | None = None  # rejected: human-readable text
    delivery_failed: bool = False  # modified
    undeliverable_here: bool = False  # modified
    # What a broker's outcome carried besides, passed on to the producer as it came: the
    # error's info map (rejected) and the message annotations (modified).
    info: Any = None
    annotations: Any = None

    @classmethod
    def accepted(cls) -> Settlement:
        return _ACCEPTED

    @classmethod
    def released(cls) -> Settlement:
        return _RELEASED


_ACCEPTED = Settlement(Outcome.ACCEPTED)
_RELEASED = Settlement(Outcome.RELEASED)

_message_sequence = itertools.count(1)


class Message:
    """One message in flight through qpid-flow: its encoded bytes and bookkeeping.

    The bytes are forwarded as received. Fields a policy needs are read from them on
    first use and remembered.
    """

    __slots__ = (
        "_group_id",
        "_identity",
        "_next_size",
        "_selector_fields",
        "address",
        "arrived",
        "data",
        "delivery_count",
        "expires",
        "failed_attempts",
        "failed_delivery",
        "on_dequeue",
        "origin",
        "producer_id",
        "properties_at",
        "queue_handle",
        "relayed_txn",
        "routed_from",
        "sequence",
        "size",
        "txn",
        "upstream_epoch",
    )

    def __init__(
        self,
        data: bytes,
        address: str,
        producer_id: int | None = None,
        on_dequeue: Callable[[Settlement], None] | None = None,
    ) -> None:
        self.data = data
        self.size = len(data)  # read several times per message: kept rather than computed
        self.address = address
        self.producer_id = producer_id
        # Called once when the message leaves its destination for good; in front of a
        # broker it carries the consumer's outcome upstream.
        self.on_dequeue = on_dequeue
        # The router's handle on where the message came from (the producer's delivery
        # while it is unsettled); opaque to policies.
        self.origin: Any = None
        # Which broker connection it was fetched on (0: not fetched from a broker). When
        # that connection drops the broker delivers the message again.
        self.upstream_epoch = 0
        # Queue order: released messages go back in front of later ones by this number.
        self.sequence = next(_message_sequence)
        self.delivery_count = 0  # times handed to a consumer
        # Deliveries that failed (modified delivery-failed, or a consumer gone without
        # settling): what a redelivery adds to the header's delivery-count.
        self.failed_attempts = 0
        self.failed_delivery = 0  # the delivery (by delivery_count) last counted failed
        self.expires: float | None = None  # seconds since the epoch; None: never
        # When the transfer arrived: a header's time to live counts from here (AMQP 1.0
        # 3.2.1, "the time of arrival at an intermediary"), even if a policy holds the
        # transfer before it is enqueued.
        self.arrived = time.time()
        # The transaction (qpid_flow.core.transactions.Transaction) a transfer arrived in: it is
        # staged there, not enqueued, until the commit.
        self.txn: Any = None
        # In front of a broker: the txn-id of a transactional transfer, relayed to the
        # broker with the transfer (the broker runs the transaction, not qpid-flow).
        self.relayed_txn: bytes | None = None
        # In front of a broker: the address the producer wrote, where the broker routes the
        # message to another destination (RabbitMQ's /queue, by the message's subject).
        self.routed_from: str | None = None
        # Where the properties section starts, when something that walked the encoding
        # anyway found it (standalone reads expiry for every message): the message-id and
        # group-id are then read without walking the sections again. -1: not known.
        self.properties_at: int | None = -1
        # The queue's own note on the message while a consumer holds it (a grouped queue:
        # the group it went out in); opaque to everyone else.
        self.queue_handle: Any = None
        self._group_id: Any = _UNREAD
        self._identity: Any = _UNREAD
        self._selector_fields: Any = None
        # (failed_attempts, bytes) of a redelivery's wire form (next_wire_size): a
        # size-limited consumer asks each time the message is offered.
        self._next_size: tuple[int, int] | None = None

    def group_id(self, header: str | None = None) -> Any:
        """The raw group id (``properties.group-id`` or application property ``header``);
        None when the message has none, or its encoding cannot be read. Remembered with
        the header it was read by: a destination's group header can change at runtime."""
        read = self._group_id
        if read is not _UNREAD and read[0] == header:
            return read[1]
        if header is None:
            value = self.identity()[1]
        else:
            try:
                value = codec.application_property(self.data, header)
            except codec.MalformedMessage:
                value = None
        self._group_id = (header, value)
        return value

    def identity(self) -> tuple[Any, Any]:
        """Its message-id and group-id (``properties``), read in one pass on first use and
        remembered; both None when its encoding cannot be read."""
        if self._identity is _UNREAD:
            try:
                self._identity = codec.identity(self.data, self.properties_at)
            except codec.MalformedMessage:
                self._identity = (None, None)
        return self._identity

    def selector_fields(self) -> dict[str, Any]:
        """What selectors read (application properties and JMS header fields), decoded on
        first use by a consumer with a selector and remembered."""
        if self._selector_fields is None:
            try:
                # Its header's ttl counts where qpid-flow judges expiry (standalone).
                arrived = self.arrived if self.expires is not None else None
                self._selector_fields = codec.selector_fields(self.data, arrived)
            except codec.MalformedMessage:
                self._selector_fields = {}
        fields: dict[str, Any] = self._selector_fields
        if self.failed_attempts:
            # The header this delivery will carry (``wire``): raised by the failed attempts
            # only. A released message is not a failed attempt (AMQP 1.0 3.4.5).
            count = fields.get("JMSXDeliveryCount", 1) + self.failed_attempts
            fields = {**fields, "JMSRedelivered": True, "JMSXDeliveryCount": count}
        return fields

    def delivery_failed(self) -> None:
        """Its current delivery failed: counted once, however many ways that is told (a
        rolled-back transactional accept, then the consumer leaving with the message or
        settling it modified(delivery-failed), is one failed attempt)."""
        if self.failed_delivery != self.delivery_count:
            self.failed_delivery = self.delivery_count
            self.failed_attempts += 1

    def replace_data(self, data: bytes) -> None:
        """The message is ``data`` from now on (a broker's own change to a message it keeps,
        e.g. annotations merged): what was read from the old bytes is read again."""
        self.data = data
        self.size = len(data)
        self.properties_at = -1  # offsets into the old bytes
        self._selector_fields = None  # JMSType may come from the annotations
        self._next_size = None

    def wire(self) -> bytes:
        """The bytes to send a consumer now: as received, but a redelivery says so in its
        header (delivery-count, first-acquirer). Decoded only for redeliveries."""
        return self._wire_at(self.delivery_count)

    def waiting_wire(self) -> bytes:
        """The bytes a browser's copy of it shows while it waits in its queue: the header
        its next delivery will carry (a message that failed or went back once says so, as
        a browser's selector on JMSRedelivered or JMSXDeliveryCount reads it)."""
        return self._wire_at(self.delivery_count + 1)

    def next_wire_size(self) -> int:
        """How many bytes its next delivery puts on the wire (:meth:`wire` once it is
        counted delivered once more): a redelivery's header may be longer."""
        if self.delivery_count == 0:
            return self.size
        known = self._next_size
        if known is None or known[0] != self.failed_attempts:
            # A redelivery's header depends only on the failed attempts: measured once each.
            known = self._next_size = (self.failed_attempts, len(self._wire_at(self.delivery_count + 1)))
        return known[1]

    def _wire_at(self, delivery_count: int) -> bytes:
        if delivery_count <= 1:
            return self.data
        try:
            return codec.redelivered(self.data, self.failed_attempts)
        except codec.MalformedMessage:
            return self.data  # a header qpid-flow cannot read is passed on as it is

    def __repr__(self) -> str:
        return f"<Message #{self.sequence} to {self.address!r} {self.size} bytes>"


_UNREAD: Any = object()

_link_ids = itertools.count(1)


def next_link_id() -> int:
    """A process-wide unique id for a producer or consumer link (stable in logs)."""
    return next(_link_ids)


class Producer:
    """A producer link as the policies see it.

    ``address`` is None for an anonymous-relay link (each transfer names its ``to``), and
    for a link to an address the broker routes by each message's subject (RabbitMQ's
    ``/queue``).
    """

    __slots__ = ("address", "connection_id", "credit", "id", "last_grant", "name", "transfers", "unsettled")

    def __init__(self, address: str | None, name: str = "", connection_id: str = "") -> None:
        self.id = next_link_id()
        self.address = address
        self.name = name
        self.connection_id = connection_id
        self.credit = 0  # credit the producer holds right now
        self.last_grant = 0  # credit it held right after the last grant
        self.unsettled = 0  # transfers received and not yet settled back to it
        self.transfers = 0  # transfers received in all (qpid-flow stat links)

    @property
    def anonymous(self) -> bool:
        return self.address is None


class Consumer:
    """A consumer link as the policies and the destination see it.

    ``deliver`` is supplied by the router: it puts a message on the wire and returns.
    """

    __slots__ = (
        "address",
        "browse_after",
        "browser",
        "connection_id",
        "credit",
        "deliver",
        "delivered",
        "held",
        "id",
        "max_size",
        "name",
        "presettled",
        "selector",
    )

    def __init__(
        self,
        address: str,
        deliver: Callable[[Consumer, Message], None],
        presettled: bool = False,
        name: str = "",
        connection_id: str = "",
        selector: Any = None,
        browser: bool = False,
        max_size: int = 0,
    ) -> None:
        self.id = next_link_id()
        self.address = address
        self.deliver = deliver
        self.presettled = presettled  # at-most-once: messages count as accepted on send
        self.name = name
        self.connection_id = connection_id
        self.credit = 0
        self.delivered = 0  # messages sent to it in all (qpid-flow stat links)
        # Messages delivered and not settled yet, by sequence number: what a detach releases.
        self.held: dict[int, Message] = {}
        # A JMS selector (qpid_flow.core.jms_selector.Selector): only messages it matches come.
        self.selector = selector
        # A browser (distribution-mode copy) gets copies, the messages stay for others;
        # browse_after is the sequence number of the last message it saw.
        self.browser = browser
        self.browse_after = 0
        # The link's max-message-size (0: none). A larger message must not be sent to it
        # (AMQP 1.0 2.7.3; the receiver may end the link with message-size-exceeded): it
        # waits for a consumer that takes it, as for a selector that does not match.
        self.max_size = max_size

    @property
    def choosy(self) -> bool:
        """Whether some messages are not for it (a selector, or a size limit)."""
        return self.selector is not None or self.max_size > 0

    def takes(self, message: Message) -> bool:
        """Whether ``message`` may go to it: its selector (if any) matches, and the message
        fits in its max-message-size (if any)."""
        if self.max_size and message.next_wire_size() > self.max_size:
            return False
        return self.selector is None or self.selector.matches(message.selector_fields())

    def __repr__(self) -> str:
        return f"<Consumer {self.id} of {self.address!r} credit={self.credit} held={len(self.held)}>"


# --- Answers a policy gives about an arriving transfer ---------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """Forward the transfer to its destination now."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the transfer unsettled; the policy releases it later through the router."""

    reason: str = ""

    def __post_init__(self) -> None:
        _must_be_text(self, "reason", self.reason)


@dataclass(frozen=True, slots=True)
class Reject:
    """Settle the transfer ``rejected`` with this error condition, forwarding nothing."""

    description: str
    condition: str = "amqp:resource-limit-exceeded"

    def __post_init__(self) -> None:
        # Checked here, in the plugin that makes one: the router sends both on the wire,
        # where anything but text would fail on the client's whole connection.
        _must_be_text(self, "description", self.description)
        _must_be_text(self, "condition", self.condition)


def _must_be_text(decision: object, field: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{type(decision).__name__}.{field} must be a str, not {type(value).__name__}: {value!r}")


# What consumer selection answers when a plugin raised or answered wrong: the message
# waits, and its destination hands messages out again after a pause (known by identity).
SELECT_AFTER_FAILURE: Final[Hold] = Hold("a consumer-selection policy failed")


Decision = Admit | Hold | Reject
ADMIT = Admit()


# The group of a message without a group id (``default_message_group``).
DEFAULT_GROUP = "qpid.no-group"


def group_key(raw: Any, default_group: str = DEFAULT_GROUP) -> str:
    """The group a message belongs to: its id as a string, or the default group."""
    if raw is None or raw == "" or raw == b"":
        return default_group
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return str(raw)
