"""Which RabbitMQ queue an AMQP 1.0 address names, if exactly one.

Mirrors RabbitMQ's own address parsing (``rabbit_routing_util:parse_endpoint`` in the
AMQP 1.0 plugin of RabbitMQ 3.x): the address is split on ``/``, and ``%2F`` in a name
stands for a ``/``. Only addresses whose messages land in one named queue have a depth
worth reading; exchanges and topics fan out to a queue per receiver, so they have none.
"""

from __future__ import annotations

__all__ = ["destination_queue", "queue_name"]


def queue_name(address: str) -> str | None:
    """The queue behind ``address``, or None when it names no single queue.

    ``/queue/NAME``, ``/amq/queue/NAME`` and plain ``NAME`` (no ``/`` at all) map to
    ``NAME``; ``/exchange/...``, ``/topic/...``, ``/temp-queue/...``, ``/reply-queue/...``
    and anything RabbitMQ would refuse map to None.
    """
    parts = address.split("/")
    match parts:
        case [name]:
            pass
        case ["", "queue", name]:
            pass
        case ["", "amq", "queue", name]:
            pass
        case _:
            return None
    name = name.replace("%2F", "/")  # RabbitMQ unescapes exactly this (upper case only)
    # Empty: RabbitMQ would pick a server-generated name; over 255 bytes: no such queue
    # can exist, and pika refuses to send the declare.
    if not name or len(name.encode()) > 255:
        return None
    return name


def destination_queue(name: str) -> str | None:
    """The queue behind qpid-flow destination ``name``, or None when it names no single queue.

    In front of RabbitMQ qpid-flow names a destination by its queue, unescaped (the address
    ``/queue/a%2Fb`` is the destination ``a/b``): such a name is taken as it is, ``/`` and
    all (parsed as an address again, ``a/b`` named no queue and was never read). Only a
    name in an address form (``/queue/X``, ``/exchange/...``: named before qpid-flow knew
    the broker's dialect) is parsed as an address."""
    if name.startswith("/"):
        return queue_name(name)
    return name if name and len(name.encode()) <= 255 else None
