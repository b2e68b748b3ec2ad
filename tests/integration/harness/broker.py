"""What every test broker offers, whoever runs it (local Debian RabbitMQ, Docker, or external)."""

from __future__ import annotations

import time
import urllib.parse
from abc import ABC, abstractmethod

from .net import wait_for_port


class BrokerError(RuntimeError):
    """The broker could not be started, probed, or controlled."""


class Broker(ABC):
    """An AMQP 1.0 broker (RabbitMQ with the AMQP 1.0 plugin) listening on host:port.

    AMQP 1.0 and AMQP 0-9-1 share the same listener on RabbitMQ, which is why `queue_depth` can
    use pika on `port`.
    """

    host: str = "127.0.0.1"
    port: int = 0
    user: str = "guest"
    password: str = "guest"
    #: False when the harness does not own the broker process (kill/restart impossible).
    controllable: bool = True

    @property
    def url(self) -> str:
        """amqp://user:password@host:port, for Proton (`Container.connect`) and for qpid-flow."""
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.port}"

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def kill(self) -> None: ...

    @abstractmethod
    def restart(self) -> None: ...

    def log_tail(self, lines: int = 60) -> str:
        return ""

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float, alive: object = None) -> None:
        """Wait for the TCP port, then for a real AMQP 1.0 open/close handshake.

        The port alone is not enough: Docker's port proxy accepts before RabbitMQ listens, and
        a broker that accepts TCP may still be booting plugins.
        """
        deadline = time.monotonic() + timeout
        is_alive = alive if callable(alive) else None
        if not wait_for_port(self.host, self.port, timeout, alive=is_alive):
            raise BrokerError(
                f"broker port {self.host}:{self.port} not accepting after {timeout:.0f}s"
                f" (or its process died)\n{self.log_tail()}"
            )
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                amqp1_handshake(self.url, timeout=5)
                return
            except Exception as e:  # Proton raises several unrelated types here
                last = e
                time.sleep(0.3)
        raise BrokerError(
            f"broker at {self.host}:{self.port} accepts TCP but no AMQP 1.0 open within"
            f" {timeout:.0f}s: {last!r}\n{self.log_tail()}"
        )

    def queue_depth(self, name: str) -> int:
        """Exact number of ready messages in queue `name` (AMQP 1.0 address `name` or
        `/queue/name`), via an AMQP 0-9-1 passive queue.declare (~20 ms, no lag, unlike the
        management API). Raises LookupError if the queue does not exist."""
        import pika  # test dependency only
        import pika.exceptions

        params = pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            credentials=pika.PlainCredentials(self.user, self.password),
            connection_attempts=1,
            socket_timeout=5,
            blocked_connection_timeout=5,
        )
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            try:
                ok = ch.queue_declare(queue=name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                if e.reply_code == 404:
                    raise LookupError(f"no queue {name!r} on {self.host}:{self.port}") from e
                raise
            return int(ok.method.message_count)
        finally:
            if conn.is_open:
                conn.close()


def amqp1_handshake(url: str, timeout: float = 5) -> None:
    """Open and close one AMQP 1.0 connection (SASL included), raising on failure."""
    from proton.utils import BlockingConnection  # reconnect=False when a single url is given

    conn = BlockingConnection(url, timeout=timeout)
    conn.close()


class ExternalBroker(Broker):
    """A broker someone else runs (e.g. the `rabbitmq` service in compose.yaml), selected with
    QPID_FLOW_TEST_BROKER_URL. The harness cannot kill or restart it."""

    controllable = False

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("amqp", "") or not u.hostname:
            raise BrokerError(f"QPID_FLOW_TEST_BROKER_URL must be amqp://user:pass@host:port: {url}")
        self.host = u.hostname
        self.port = u.port or 5672
        self.user = urllib.parse.unquote(u.username or "guest")
        self.password = urllib.parse.unquote(u.password or "guest")

    def start(self) -> None:
        # The external broker may still be booting (compose healthchecks are coarse).
        self.wait_ready(timeout=90)

    def stop(self) -> None:
        pass  # not ours

    def kill(self) -> None:
        raise BrokerError(
            "the broker from QPID_FLOW_TEST_BROKER_URL is not controlled by the harness;"
            " use the `fresh_rabbitmq` fixture to kill/restart a broker"
        )

    restart = kill
