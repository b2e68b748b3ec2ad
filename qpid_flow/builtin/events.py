"""The event log: one JSON object per line for every message and state change.

Written when ``events = PATH`` (``qpid-flow serve --events PATH``) is set, through
structlog into size-rotated files (``events_max_bytes``, ``events_backups``), buffered
and flushed twice a second. The
analytics pipeline (``qpid-flow report``) reads it; docs/events.md is the schema.
Off, it costs nothing: without a path this plugin registers no per-message work.
"""

from __future__ import annotations

import atexit
import itertools
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from qpid_flow import codec, hookimpl
from qpid_flow.groups import GroupedQueue, group_key

if TYPE_CHECKING:
    from qpid_flow.config import RouterConfig
    from qpid_flow.control import RouterControl
    from qpid_flow.destination import Destination
    from qpid_flow.model import Consumer, Message, Producer, Settlement

SCHEMA_VERSION = 1
FLUSH_EVERY = 0.5  # seconds: how stale the file may be while the router runs


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
    raw = message.group_id()
    return None if raw is None else group_key(raw)


class Plugin:
    """Registered always; writes only when configured (see :meth:`active`)."""

    def __init__(self) -> None:
        self._log: Any = None
        self._file: RotatingEventFile | None = None
        self._control: RouterControl | None = None
        self._config: RouterConfig | None = None
        self._run = uuid.uuid4().hex[:12]

    @property
    def active(self) -> bool:
        return self._log is not None

    @hookimpl
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        if not config.events:
            return
        self._config = config
        self._file = RotatingEventFile(Path(config.events), config.events_max_bytes, config.events_backups)
        atexit.register(self._file.close)
        self._log = structlog.wrap_logger(
            self._file,
            processors=[_add_envelope(self._run), structlog.processors.JSONRenderer(serializer=json.dumps)],
            wrapper_class=structlog.BoundLogger,
            cache_logger_on_first_use=True,
        )

    @hookimpl
    def qpid_flow_started(self, control: RouterControl) -> None:
        if self._file is not None:
            self._control = control
            control.schedule(FLUSH_EVERY, self._flush)

    def _flush(self) -> None:
        if self._file is not None and self._control is not None:
            self._file.flush()
            self._control.schedule(FLUSH_EVERY, self._flush)

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
            bytes=destination.bytes,
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
            bytes=destination.bytes,
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
    def qpid_flow_destination_created(self, destination: Destination) -> None:
        if self._log is not None:
            self._policy(destination)

    @hookimpl
    def qpid_flow_destination_policy_changed(self, destination: Destination) -> None:
        if self._log is not None:
            self._policy(destination)

    def _policy(self, destination: Destination) -> None:
        """What the analytics need to judge a destination's thresholds: its maximum, the
        thresholds in force, and whether it is a ring or grouped."""
        assert self._config is not None
        policy = destination.policy
        try:
            limits = self._config.flow_limits(policy)[0].as_dict()
        except ValueError:
            limits = {}  # refused when configured; nothing in force to report
        self._emit(
            "destination",
            address=destination.address,
            maxCount=policy.max_count or 0,
            maxSize=policy.max_size or 0,
            limitPolicy=policy.policy,
            grouped=bool(policy.shared_groups),
            producerWindow=self._config.producer_window,
            **limits,
        )

    @hookimpl
    def qpid_flow_producer_attached(self, producer: Producer, destination: Destination | None) -> None:
        if self._log is not None:
            assert self._config is not None
            self._emit(
                "producer_attached",
                address=producer.address,
                producer=producer.id,
                window=self._config.producer_window,
            )

    @hookimpl
    def qpid_flow_producer_detached(self, producer: Producer, destination: Destination | None) -> None:
        if self._log is not None:
            self._emit("producer_detached", address=producer.address, producer=producer.id)

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
        # Shutdown itself still releases messages (events); the file closes at exit.
        if self._file is not None:
            self._file.flush()


class RotatingEventFile:
    """The file structlog writes event lines to: buffered, rotated by size.

    Lines are not flushed one by one (a system call per event would cost more than the
    event); the plugin flushes every ``FLUSH_EVERY`` seconds and at shutdown.
    """

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        self._size = self._file.tell()

    def msg(self, line: str) -> None:
        self._file.write(line)
        self._file.write("\n")
        self._size += len(line) + 1
        if self.max_bytes and self._size >= self.max_bytes:
            self._rotate()

    info = msg

    def _rotate(self) -> None:
        self._file.close()
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
        if self.backups:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        self._file = open(self.path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        self._size = 0

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _add_envelope(run: str) -> Any:
    numbers = itertools.count(1)

    def envelope(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        # n orders a run's events exactly: timestamps can tie, and files are read in parallel.
        return {"v": SCHEMA_VERSION, "ts": time.time(), "run": run, "n": next(numbers), **event_dict}

    return envelope
