"""Encode an AMQP 1.0 message as a client would send it (for tests and plugin authors'
tests: the data path itself never encodes, it forwards the bytes it received)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proton import Message as ProtonMessage

__all__ = ["encode_message"]


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
