"""Encode an AMQP 1.0 message as a client would send it (for tests and plugin authors'
tests: the data path itself never encodes, it forwards the bytes it received), and the one
change a broker makes to a message it keeps: the annotations a ``modified`` outcome adds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proton import Data, Described, ulong
from proton import Message as ProtonMessage

from qpid_flow import codec

__all__ = ["encode_message", "with_message_annotations"]

_MESSAGE_ANNOTATIONS = 0x72


def encode_message(
    body: Any = None,
    *,
    group_id: str | None = None,
    properties: Mapping[str, Any] | None = None,
    subject: str | None = None,
    message_id: Any = None,
    ttl: float | None = None,
    durable: bool = False,
) -> bytes:
    """The bytes of one message: header, properties, application properties and body."""
    message = ProtonMessage(
        body=body,
        group_id=group_id,
        properties=dict(properties) if properties else None,
        subject=subject,
        id=message_id,
        durable=durable,
    )
    if ttl is not None:
        message.ttl = ttl
    return bytes(message.encode())


def with_message_annotations(data: bytes, added: Mapping[Any, Any]) -> bytes:
    """``data`` with ``added`` merged into its message-annotations (added keys replace the
    message's own), as AMQP 1.0 3.4.5 asks of a ``modified`` outcome's annotations. Only
    that section is re-encoded; every other byte is kept. Raises
    :class:`~qpid_flow.codec.MalformedMessage` for a message it cannot read."""
    where = codec.section_bounds(data, _MESSAGE_ANNOTATIONS)
    annotations: dict[Any, Any] = {}
    if isinstance(where, tuple):
        start, end = where
        section = Data()
        section.decode(data[start:end])
        section.rewind()
        section.next()
        value = section.get_object()
        if isinstance(value, Described) and isinstance(value.value, dict):
            annotations.update(value.value)
    else:
        start = end = where
    annotations.update(added)
    encoded = Data()
    encoded.put_object(Described(ulong(_MESSAGE_ANNOTATIONS), annotations))
    return data[:start] + encoded.encode() + data[end:]
