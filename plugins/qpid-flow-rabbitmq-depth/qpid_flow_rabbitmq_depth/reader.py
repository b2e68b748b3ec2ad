"""Read a queue's ready count from RabbitMQ: AMQP 0-9-1 passive ``queue.declare`` (pika).

Passive declare is exact and takes ~20 ms; the management HTTP API lags seconds behind,
which is too late for flow control. One connection and one channel are reused across
reads. pika objects are not thread-safe: a reader belongs to the one thread that calls it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import pika
import pika.exceptions
import structlog

__all__ = ["BrokerUnavailable", "DepthReader", "PikaDepthReader"]

log = structlog.get_logger(__name__)

NOT_FOUND = 404


class QuietNotFound(logging.Filter):
    """Drops pika's warning for a channel the broker closed with 404: a passive declare of
    a queue that does not exist (yet) answers so, the reader takes it as no backlog, and
    pika's warning came every read, for as long as the address was known (every 2 s for a
    producer's ``/amq/queue/X`` that was never declared). Other closes stay logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Channel.Close (404)" not in record.getMessage()


_PIKA_CHANNEL_LOG = logging.getLogger("pika.channel")


class BrokerUnavailable(Exception):
    """The broker cannot be reached (or the connection broke); try again later."""


class DepthReader(Protocol):
    """What the worker needs; tests substitute their own."""

    def __call__(self, queue: str) -> int | None:
        """Ready messages in ``queue`` (0 if it does not exist); None when the broker will
        not tell (e.g. another connection's exclusive queue). Raises BrokerUnavailable."""
        ...

    def idle(self) -> None:
        """Between reads: let the connection answer heartbeats. Never raises."""
        ...

    def close(self) -> None:
        """Let go of the connection. Never raises."""
        ...


class PikaDepthReader:
    """A :class:`DepthReader` over one reused pika ``BlockingConnection``.

    ``connect`` opens a connection (``pika.BlockingConnection(params)`` in production);
    it is injectable so the logic here can be tested without a broker.
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._connection: Any = None
        self._channel: Any = None
        self._refused: set[str] = set()  # queues whose refusal was logged already

    @classmethod
    def from_parameters(cls, params: pika.connection.Parameters) -> PikaDepthReader:
        if not any(isinstance(f, QuietNotFound) for f in _PIKA_CHANNEL_LOG.filters):
            _PIKA_CHANNEL_LOG.addFilter(QuietNotFound())
        return cls(lambda: pika.BlockingConnection(params))

    def __call__(self, queue: str) -> int | None:
        try:
            channel = self._open_channel()
            ok = channel.queue_declare(queue=queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            # The broker closes the channel on a failed passive declare; the connection is
            # fine, so the next read opens a fresh channel on it.
            self._channel = None
            if exc.reply_code == NOT_FOUND:
                return 0  # no queue, no backlog (deleted, or not declared yet)
            if queue not in self._refused:
                self._refused.add(queue)
                log.warning("rabbitmq_depth_queue_refused", queue=queue, code=exc.reply_code, reason=exc.reply_text)
            return None
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
        self._refused.discard(queue)
        return int(ok.method.message_count)

    def idle(self) -> None:
        if self._connection is None:
            return
        try:
            self._connection.process_data_events(time_limit=0)
        except (pika.exceptions.AMQPError, OSError):
            self.close()  # the next read reconnects, and reports if it cannot

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                if connection.is_open:
                    connection.close()

    def _open_channel(self) -> Any:
        if self._connection is None or not self._connection.is_open:
            self._connection = None
            self._channel = None
            self._connection = self._connect()
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel
