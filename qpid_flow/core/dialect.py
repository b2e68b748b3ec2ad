"""Which queue an address names, as the broker behind qpid-flow reads it.

qpid-flow counts depth, matches policies and keeps statistics per destination. RabbitMQ's
AMQP 1.0 plugin (3.x) reads several spellings as one queue: ``orders``, ``/queue/orders`` and
``/amq/queue/orders`` all name queue ``orders``. Taken literally they would be three
destinations, each with a part of the depth, and a ``flow_stop_count`` would never see the
queue's real depth. ``/exchange/E``, ``/exchange/E/KEY`` and ``/topic/KEY`` are no queue at
all: each receiver gets a private queue of its own and a sent message fans out, so there is
no depth qpid-flow could count for them.

Other brokers (Artemis, Qpid, ActiveMQ) and standalone mode take the address as the queue
name, unchanged: the plain dialect.

Address parsing follows RabbitMQ 3.10's ``rabbit_routing_util:parse_endpoint``: "/" splits
segments, and in a queue name only ``%2F`` (upper case, exactly) is decoded, to "/"; every
other ``%xx`` stays as written. Addresses RabbitMQ refuses (``/queue/``, ``/queue/a/b``,
``foo/bar``) name no queue: qpid-flow keeps no depth for them and the broker answers the
attach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["PLAIN", "RABBITMQ", "Dialect", "Node", "PlainDialect", "RabbitMQDialect", "dialect_for"]


@dataclass(frozen=True, slots=True)
class Node:
    """What an address names on the broker."""

    name: str  # the destination name policies match and statistics show
    is_queue: bool  # False: an exchange or topic (or nothing): qpid-flow keeps no depth for it
    # True: the broker routes each message to the queue its ``subject`` names (RabbitMQ's
    # ``/queue``, through the default exchange), so the address names no queue by itself.
    by_subject: bool = False
    # False: named as a queue (policies, ACLs and statistics match its every spelling),
    # but the broker stores nothing there, so qpid-flow counts no depth (RabbitMQ's direct
    # reply-to).
    keeps_depth: bool = True


class Dialect(Protocol):
    """How one kind of broker reads addresses, and which outcomes it takes."""

    name: str
    # Whether the broker takes the ``modified`` outcome. RabbitMQ 3.10 does not: it ends the
    # session the disposition came on with amqp:invalid-field ("Unrecognised state").
    takes_modified: bool
    # Whether the broker takes a consumer's outcome left unsettled. RabbitMQ 3.10 does not:
    # it ends the connection on a disposition that leaves ``settled`` out (as Proton writes
    # an unsettled one), and settles every outcome at once anyway.
    takes_unsettled_outcomes: bool
    # Whether a consumer's settlement without an outcome takes the message off the queue.
    # RabbitMQ 3.10's default outcome is released (and it ends the session): it does not.
    settling_without_outcome_removes: bool

    def node(self, address: str) -> Node:
        """The node ``address`` names."""
        ...

    def existing_queue(self, name: str) -> str:
        """The address qpid-flow's own reader reads queue ``name`` by: one that names the
        queue as it is, declaring nothing."""
        ...

    def address_forms(self, name: str) -> tuple[str, ...]:
        """Every address that names destination ``name`` (``name`` first): the spellings
        a pattern (policy, ACL, operator stop) may be written against."""
        ...

    def pattern_core(self, pattern: str) -> str:
        """The part of ``pattern`` that names a destination, without an address form's
        prefix (``/queue/orders.*`` is ``orders.*``): what its precedence is judged on."""
        ...


# The prefixes whose single segment that follows is a queue name (RabbitMQ unescapes it).
_QUEUE_PREFIXES = ("/queue/", "/amq/queue/")
# RabbitMQ takes everything after this prefix as the name of an existing queue, verbatim
# (no unescaping, "/" allowed): the form AMQP 0-9-1 reply-to addresses come back in.
_REPLY_QUEUE_PREFIX = "/reply-queue/"
# The first segments of the addresses RabbitMQ reads as no queue (exchanges, topics, the
# subject-routed /queue, and the forms it refuses): a destination named so is one of those.
_NO_QUEUE_SEGMENTS = frozenset({"exchange", "topic", "temp-queue", "queue", "amq", "reply-queue"})
# A sender to this address reaches the queue each message's subject names (the default
# exchange, routing key = subject); a message with no subject, or naming no queue, is dropped.
_SUBJECT_ROUTED = "/queue"


def _unescape(name: str) -> str:
    return name.replace("%2F", "/")  # as RabbitMQ does: this one escape, upper case only


def _escape(name: str) -> str:
    return name.replace("/", "%2F")


# RabbitMQ's direct reply-to (an AMQP 0-9-1 client's reply_to): a pseudo-queue that stores
# nothing, each reply handed straight to the requester's channel. Its depth counted, it
# only grew (no consumer reads it through qpid-flow), and a '>' policy held an RPC server's
# replies every few messages. Still named as a queue: an ACL on it covers every spelling.
_DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"


def _queue_node(name: str) -> Node:
    return Node(name, True, keeps_depth=not name.startswith(_DIRECT_REPLY_TO))


class RabbitMQDialect:
    """RabbitMQ's AMQP 1.0 plugin: ``X``, ``/queue/X`` and ``/amq/queue/X`` are queue X."""

    __slots__ = ()
    name = "rabbitmq"
    takes_modified = False
    takes_unsettled_outcomes = False
    settling_without_outcome_removes = False

    def node(self, address: str) -> Node:
        if "/" not in address:
            # An empty address is no queue name (RabbitMQ would make up a name of its own).
            return _queue_node(_unescape(address)) if address else Node(address, False)
        for prefix in _QUEUE_PREFIXES:
            if address.startswith(prefix):
                name = address[len(prefix) :]
                if name and "/" not in name:
                    return _queue_node(_unescape(name))
                return Node(address, False)
        if address.startswith(_REPLY_QUEUE_PREFIX) and len(address) > len(_REPLY_QUEUE_PREFIX):
            return _queue_node(address[len(_REPLY_QUEUE_PREFIX) :])
        if address == _SUBJECT_ROUTED:
            return Node(address, False, by_subject=True)
        # /exchange/..., /topic/..., /temp-queue/..., or refused.
        return Node(address, False)

    def existing_queue(self, name: str) -> str:
        # /amq/queue/ declares nothing: read by a plain name (or /queue/), a queue declared
        # with arguments (a dead-letter exchange) or durable refuses the declaration
        # (precondition-failed) and ends the reader's session. A "/" in the name is spelt
        # %2F (RabbitMQ decodes it, and refuses a plain "a/b"); a name with "%2F" in it
        # cannot be spelt by /amq/queue/ at all, and is read as named.
        if not name or "%2F" in name:
            return name
        return f"/amq/queue/{_escape(name)}"

    def address_forms(self, name: str) -> tuple[str, ...]:
        # Exchange and topic addresses (and /queue) are named as written: one spelling
        # each. A queue's name may start with "/" too (/queue/%2Fx is queue "/x").
        if not name or (name.startswith("/") and name[1:].split("/", 1)[0] in _NO_QUEUE_SEGMENTS):
            return (name,)
        escaped = _escape(name)
        return (name, f"/queue/{escaped}", f"/amq/queue/{escaped}")

    def pattern_core(self, pattern: str) -> str:
        for prefix in _QUEUE_PREFIXES:
            if pattern.startswith(prefix) and "/" not in pattern[len(prefix) :]:
                return _unescape(pattern[len(prefix) :])
        return pattern


class PlainDialect:
    """Brokers that take the address as the queue name (Artemis, Qpid, ActiveMQ, standalone)."""

    __slots__ = ()
    name = "plain"
    takes_modified = True
    takes_unsettled_outcomes = True
    settling_without_outcome_removes = True

    def node(self, address: str) -> Node:
        return Node(address, True)

    def existing_queue(self, name: str) -> str:
        return name

    def address_forms(self, name: str) -> tuple[str, ...]:
        return (name,)

    def pattern_core(self, pattern: str) -> str:
        return pattern


RABBITMQ = RabbitMQDialect()
PLAIN = PlainDialect()


def dialect_for(setting: str, product: str | None = None) -> Dialect:
    """The dialect for the ``broker_dialect`` setting.

    ``"auto"`` picks RabbitMQ's when the broker's open frame names ``product`` "RabbitMQ" (in
    any case), the plain one otherwise; ``"rabbitmq"`` and ``"plain"`` force one."""
    if setting == "rabbitmq":
        return RABBITMQ
    if setting == "plain":
        return PLAIN
    if setting == "auto":
        is_rabbitmq = isinstance(product, str) and product.strip().casefold() == "rabbitmq"
        return RABBITMQ if is_rabbitmq else PLAIN
    raise ValueError(f"broker_dialect {setting!r}: must be one of auto, rabbitmq, plain")
