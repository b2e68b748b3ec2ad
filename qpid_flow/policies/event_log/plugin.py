"""The event log: a record for every message and state change (docs/events.md).

Written when ``events = PATH`` (``qpid-flow serve --events PATH``) is set, as JSON lines
(``events_format = "jsonl"``, rotated by ``events_max_bytes`` / ``events_backups``) or as
columnar segments Spark reads without parsing text (``"parquet"``). The reactor only
appends each event's fields to columns; every ``FLUSH_EVERY`` seconds a writer thread hands
them to a child process that formats and writes them (process.py, writers.py),
so a kill -9 loses at most that much. The analytics pipeline
(``qpid-flow report``) reads both formats. Off, it costs nothing: without a path this
plugin is unregistered, and no per-message hook is called for it.
"""

from __future__ import annotations

import atexit
import itertools
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qpid_flow import hookimpl
from qpid_flow.config import ConfigError
from qpid_flow.core.model import group_key
from qpid_flow.policies.event_log.process import EventLogUnavailable, ProcessSink
from qpid_flow.policies.event_log.writers import Batch, WriterThread
from qpid_flow.policies.flow_control.thresholds import flow_limits

if TYPE_CHECKING:
    import pluggy

    from qpid_flow.config import RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Message, Producer, Settlement
    from qpid_flow.plugin.control import RouterControl

FLUSH_EVERY = 0.5  # seconds: how much a kill -9 may lose, and how stale the files are
_now = time.time  # a global name: one lookup less, four times a message


def _group(destination: Destination, message: Message) -> str | None:
    """The group column: the group a grouped destination dispatches the message in, else
    its ``group-id`` (None without one)."""
    group_of = getattr(destination.queue, "group_of", None)  # a queue that dispatches by group
    if group_of is not None:
        return group_of(message)
    raw = message.group_id()
    return None if raw is None else group_key(raw)


class Plugin:
    """Registered always; writes only when configured (see :meth:`active`).

    Per event the reactor appends each field to its column (a :class:`Batch`: a clock
    read, a counter and the fields); every ``FLUSH_EVERY`` seconds the batch goes to the
    writer thread, which does everything else (writers.py)."""

    def __init__(self) -> None:
        self._batch: Batch | None = None
        # Per per-message event, the ``append`` of each of its columns in the batch.
        self._enqueue: tuple[Any, ...] = ()
        self._deliver: tuple[Any, ...] = ()
        self._settle: tuple[Any, ...] = ()
        self._transfer_settled: tuple[Any, ...] = ()
        self._writer: WriterThread | None = None
        self._control: RouterControl | None = None
        self._config: RouterConfig | None = None
        self._number = itertools.count(1).__next__  # n: orders a run's events exactly (timestamps tie)
        self._run = uuid.uuid4().hex[:12]

    @property
    def active(self) -> bool:
        return self._batch is not None

    # Last of all plugins: the writer makes the log's folders and files, which a start that
    # another plugin's settings stop must not leave behind.
    @hookimpl(trylast=True)
    def qpid_flow_configure(self, config: RouterConfig, manager: pluggy.PluginManager) -> None:
        if not config.events:
            manager.unregister(self)  # no event log: none of its hooks called per message
            return
        self._config = config
        path = Path(config.events)
        try:
            sink = ProcessSink(
                config.events_format,
                path,
                self._run,
                config.events_max_bytes,
                config.events_backups,
                config.events_writer_nice,
                config.log_level,
                config.log_format,
            )
        except EventLogUnavailable as exc:
            raise ConfigError("events", config.events, str(exc)) from None
        self._writer = WriterThread(sink)
        atexit.register(self._close)
        self._new_batch()

    def _new_batch(self) -> None:
        batch = self._batch = Batch()
        columns = batch.columns
        self._enqueue = tuple(column.append for column in columns["enqueue"])
        self._deliver = tuple(column.append for column in columns["deliver"])
        self._settle = tuple(column.append for column in columns["settle"])
        self._transfer_settled = tuple(column.append for column in columns["transfer_settled"])

    @hookimpl
    def qpid_flow_started(self, control: RouterControl) -> None:
        if self._writer is not None:
            self._control = control
            control.schedule(FLUSH_EVERY, self._flush)

    def _hand_over(self) -> None:
        if self._writer is not None and self._batch is not None and len(self._batch):
            batch = self._batch
            self._new_batch()
            self._writer.submit(batch)

    def _flush(self) -> None:
        if self._control is not None:
            self._hand_over()
            self._control.schedule(FLUSH_EVERY, self._flush)

    def _close(self) -> None:
        self._hand_over()
        if self._writer is not None:
            self._writer.close()

    def _emit(self, event: str, address: str | None, **fields: Any) -> None:
        """A state event (rare): a row with its fields as a dict."""
        if self._batch is not None:
            self._batch.states.append((event, time.time(), self._number(), address, fields))

    # The per-message events: one append per field, in MESSAGE_FIELDS' order.

    @hookimpl
    def qpid_flow_message_enqueued(self, destination: Destination, message: Message) -> None:
        if self._batch is None:
            return
        ts, n, address, seq, message_id, size, group, producer, depth, size_bytes = self._enqueue
        ts(_now())
        n(self._number())
        address(destination.address)
        seq(message.sequence)
        message_id(message.identity()[0])  # as read: the writer makes it text (message_id_text)
        size(message.size)
        group(_group(destination, message))
        producer(message.producer_id)
        depth(destination.depth)
        size_bytes(destination.bytes)

    @hookimpl
    def qpid_flow_message_delivered(self, destination: Destination, message: Message, consumer: Consumer) -> None:
        if self._batch is None:
            return
        ts, n, address, seq, size, group, consumer_id, delivery_count = self._deliver
        ts(_now())
        n(self._number())
        address(destination.address)
        seq(message.sequence)
        size(message.size)
        group(_group(destination, message))
        consumer_id(consumer.id)
        delivery_count(message.delivery_count)

    @hookimpl
    def qpid_flow_message_settled(
        self, destination: Destination, message: Message, consumer: Consumer | None, settlement: Settlement
    ) -> None:
        if self._batch is None:
            return
        ts, n, address, seq, size, group, consumer_id, outcome, condition, depth, size_bytes = self._settle
        ts(_now())
        n(self._number())
        address(destination.address)
        seq(message.sequence)
        size(message.size)
        group(_group(destination, message))
        consumer_id(consumer.id if consumer is not None else None)
        outcome(settlement.outcome._value_)  # the enum's value, without its property's call
        condition(settlement.condition)
        depth(destination.depth)
        size_bytes(destination.bytes)

    @hookimpl
    def qpid_flow_transfer_settled(self, producer: Producer, message: Message, settlement: Settlement) -> None:
        if self._batch is None:
            return
        ts, n, address, seq, size, producer_id, outcome, condition = self._transfer_settled
        ts(_now())
        n(self._number())
        address(message.address)
        seq(message.sequence)
        size(message.size)
        producer_id(producer.id)
        outcome(settlement.outcome._value_)  # the enum's value, without its property's call
        condition(settlement.condition)

    @hookimpl
    def qpid_flow_flow_changed(self, destination: Destination, stopped: bool, limits: dict[str, int]) -> None:
        self._emit(
            "flow_stopped" if stopped else "flow_resumed",
            destination.address,
            depth=destination.depth,
            bytes=destination.bytes,
            producers=len(destination.producers),
            **limits,
        )

    @hookimpl
    def qpid_flow_destination_created(self, destination: Destination) -> None:
        if self._batch is not None:
            self._policy(destination)

    @hookimpl
    def qpid_flow_destination_policy_changed(self, destination: Destination) -> None:
        if self._batch is not None:
            self._policy(destination)

    def _policy(self, destination: Destination) -> None:
        """What the analytics need to judge a destination's thresholds: its maximum, the
        thresholds in force, and whether it is a ring or grouped."""
        assert self._config is not None
        policy = destination.policy
        try:
            config = self._config
            in_force, _ = flow_limits(policy, config.default_flow_stop_threshold, config.default_flow_resume_threshold)
            limits = in_force.as_dict()
        except ValueError:
            limits = {}  # refused when configured; nothing in force to report
        self._emit(
            "destination",
            destination.address,
            maxCount=policy.max_count or 0,
            maxSize=policy.max_size or 0,
            limitPolicy=policy.when_full,
            grouped=bool(policy.setting("shared_groups")),
            producerWindow=self._config.producer_window,
            **limits,
        )

    @hookimpl
    def qpid_flow_producer_attached(self, producer: Producer, destination: Destination | None) -> None:
        if self._batch is not None:
            assert self._config is not None
            self._emit(
                "producer_attached",
                producer.address,
                producer=producer.id,
                window=self._config.producer_window,
            )

    @hookimpl
    def qpid_flow_producer_detached(self, producer: Producer, destination: Destination | None) -> None:
        if self._batch is not None:
            self._emit("producer_detached", producer.address, producer=producer.id)

    @hookimpl
    def qpid_flow_group_assigned(self, destination: Destination, group: str, consumer: Consumer) -> None:
        if self._batch is not None:
            self._emit("group_assigned", destination.address, group=group, consumer=consumer.id)

    @hookimpl
    def qpid_flow_group_released(self, destination: Destination, group: str, consumer: Consumer, reason: str) -> None:
        if self._batch is not None:
            self._emit("group_released", destination.address, group=group, consumer=consumer.id, reason=reason)

    @hookimpl
    def qpid_flow_stopping(self) -> None:
        # Shutdown itself still releases messages (events): what comes after this is
        # handed over at exit (atexit), when the writer also finishes its files.
        self._hand_over()
