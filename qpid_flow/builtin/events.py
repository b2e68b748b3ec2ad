"""The event log: one JSON object per line for every message and state change.

Written when ``events = PATH`` (``qpid-flow serve --events PATH``) is set, through
structlog into size-rotated files (``events_max_bytes``, ``events_backups``). The
analytics pipeline (``qpid-flow report``) reads it; docs/events.md is the schema.
Off, it costs nothing: without a path this plugin registers no per-message work.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from qpid_flow import codec, hookimpl
from qpid_flow.groups import GroupedQueue, group_key

if TYPE_CHECKING:
    from qpid_flow.config import RouterConfig
    from qpid_flow.destination import Destination
    from qpid_flow.model import Consumer, Message, Producer, Settlement

SCHEMA_VERSION = 1


def _message_id(message: Message) -> str | None:
    try:
        value = codec.properties_field(message.data, "message_id")
    except codec.MalformedMessage:
        return None
    if value is None:
        return None
    return value.hex() if isinstance(value, bytes) else str(value)


def _group(destination: Destination, message: Message) -> str | None:
    queue = destination.queue
    if isinstance(queue, GroupedQueue):
        return queue.group_of(message)
    try:
        raw = message.group_id()
    except codec.MalformedMessage:
        return None
    return None if raw is None else group_key(raw)


class Plugin:
    """Registered always; writes only when configured (see :meth:`active`)."""

    def __init__(self) -> None:
        self._log: Any = None
        self._run = uuid.uuid4().hex[:12]

    @property
    def active(self) -> bool:
        return self._log is not None

    @hookimpl
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        if not config.events:
            return
        path = Path(config.events)
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=config.events_max_bytes, backupCount=config.events_backups, encoding="utf-8"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        stdlib = logging.getLogger(f"qpid_flow.events.{self._run}")
        stdlib.handlers[:] = [handler]
        stdlib.setLevel(logging.INFO)
        stdlib.propagate = False  # the event log is its own stream, not the console log
        self._log = structlog.wrap_logger(
            stdlib,
            processors=[_add_envelope(self._run), structlog.processors.JSONRenderer(serializer=json.dumps)],
            wrapper_class=structlog.BoundLogger,
        )

    def _emit(self, event: str, **fields: Any) -> None:
        self._log.info(event, **fields)

    @hookimpl
    def qpid_flow_message_enqueued(self, destination: Destination, message: Message) -> None:
        if self._log is None:
            return
        self._emit(
            "enqueue",
            address=destination.address,
            seq=message.sequence,
            id=_message_id(message),
            size=message.size,
            group=_group(destination, message),
            producer=message.producer_id,
            depth=destination.depth,
        )

    @hookimpl
    def qpid_flow_message_delivered(self, destination: Destination, message: Message, consumer: Consumer) -> None:
        if self._log is None:
            return
        self._emit(
            "deliver",
            address=destination.address,
            seq=message.sequence,
            size=message.size,
            group=_group(destination, message),
            consumer=consumer.id,
            delivery_count=message.delivery_count,
        )

    @hookimpl
    def qpid_flow_message_settled(
        self, destination: Destination, message: Message, consumer: Consumer | None, settlement: Settlement
    ) -> None:
        if self._log is None:
            return
        self._emit(
            "settle",
            address=destination.address,
            seq=message.sequence,
            size=message.size,
            group=_group(destination, message),
            consumer=consumer.id if consumer is not None else None,
            outcome=settlement.outcome.value,
            condition=settlement.condition,
            depth=destination.depth,
        )

    @hookimpl
    def qpid_flow_transfer_settled(self, producer: Producer, message: Message, settlement: Settlement) -> None:
        if self._log is None:
            return
        self._emit(
            "transfer_settled",
            address=message.address,
            seq=message.sequence,
            size=message.size,
            producer=producer.id,
            outcome=settlement.outcome.value,
            condition=settlement.condition,
        )

    @hookimpl
    def qpid_flow_flow_changed(self, destination: Destination, stopped: bool, limits: dict[str, int]) -> None:
        if self._log is None:
            return
        self._emit(
            "flow_stopped" if stopped else "flow_resumed",
            address=destination.address,
            depth=destination.depth,
            bytes=destination.bytes,
            producers=len(destination.producers),
            **limits,
        )

    @hookimpl
    def qpid_flow_group_assigned(self, destination: Destination, group: str, consumer: Consumer) -> None:
        if self._log is not None:
            self._emit("group_assigned", address=destination.address, group=group, consumer=consumer.id)

    @hookimpl
    def qpid_flow_group_released(self, destination: Destination, group: str, consumer: Consumer, reason: str) -> None:
        if self._log is not None:
            self._emit("group_released", address=destination.address, group=group, consumer=consumer.id, reason=reason)

    @hookimpl
    def qpid_flow_stopping(self) -> None:
        if self._log is not None:
            for handler in self._log._logger.handlers:
                handler.flush()


def _add_envelope(run: str) -> Any:
    def envelope(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, "ts": time.time(), "run": run, **event_dict}

    return envelope
