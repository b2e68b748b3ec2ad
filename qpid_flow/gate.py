"""In front of a broker: accept a client, authenticate it at the broker, then hand both
sockets to Proton.

Each client gets an upstream connection of its own, opened with the client's own
credentials, so the broker authenticates and authorizes it exactly as if it had connected
directly. Proton's SASL server cannot do that (it never hands a PLAIN password to the
application, and it crashes on a sasl-init without a mechanism), so the SASL exchange runs
here, on the raw sockets, before any byte reaches a Proton transport:

1. the client's SASL header gets PLAIN and ANONYMOUS offered (:class:`~qpid_flow.sasl.ServerHandshake`);
2. its sasl-init is replayed to the broker on a new socket, trying each broker address in
   order (:class:`~qpid_flow.sasl.ClientHandshake`);
3. the broker's sasl-outcome goes back to the client unchanged; on success both sockets get
   Proton transports with SASL off (the next bytes on each are the AMQP header), and the pair
   goes to the router, which mirrors the client's open onto the upstream connection.

A client that skips SASL gets an upstream connection that skips it too. A handshake that
does not finish within ``deadline`` seconds is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from proton import Transport, Url
from proton._io import IO
from proton.handlers import IOHandler

from qpid_flow.sasl import OUTCOME_SYS_TEMP, ClientHandshake, ServerHandshake

if TYPE_CHECKING:
    from proton import Connection
    from proton._selectable import Selectable
    from proton.reactor import Container

    from qpid_flow.brokers import BrokerAddress

__all__ = ["BrokerGate", "PairOpened"]

log = structlog.get_logger("qpid_flow.gate")

# What the router gets for each authenticated client: its connection, the upstream one,
# the broker address that answered, and the client's (host, port).
PairOpened = Callable[["Connection", "Connection", "BrokerAddress", tuple[str, int]], None]

MECHANISMS = ("PLAIN", "ANONYMOUS")
_BACKLOG = 1024  # Proton's listener uses 10: a burst of connecting clients would be refused


class BrokerGate:
    """The listener of broker mode: one per ``--listen`` address."""

    def __init__(
        self,
        container: Container,
        host: str,
        port: int,
        brokers: list[BrokerAddress],
        on_pair: PairOpened,
        handler: Any,
        deadline: float = 10.0,
    ) -> None:
        self._container = container
        self._brokers = brokers
        self._on_pair = on_pair
        self._handler = handler  # the Proton handler of both connections of every pair
        self._deadline = deadline
        sock = IO.listen(host, port)
        sock.listen(_BACKLOG)
        self.port = sock.getsockname()[1]
        self._listener = container.selectable(handler=self, delegate=sock)
        self._listener.reading = True
        self._listener._transport = None
        container.update(self._listener)
        self.handshakes: set[_Handshake] = set()
        self._probes: dict[BrokerAddress, list[Callable[[bool], None]]] = {}

    def probe(self, broker: BrokerAddress, on_result: Callable[[bool], None], timeout: float = 2.0) -> None:
        """Find out whether ``broker`` accepts connections now; ``on_result(True or False)``.

        A broker connection that ends without a close looks the same on the socket whether
        the broker dropped that one connection or the broker is gone; the router tells its
        clients apart by asking. Probes of one broker under way at once are shared."""
        waiting = self._probes.get(broker)
        if waiting is not None:
            waiting.append(on_result)
            return
        self._probes[broker] = [on_result]
        _Probe(self, broker, timeout)

    def _probed(self, broker: BrokerAddress, reachable: bool) -> None:
        for on_result in self._probes.pop(broker, []):
            on_result(reachable)

    def close(self) -> None:
        """Stop accepting clients (handshakes under way finish or time out)."""
        if not self._listener.is_terminal:
            self._listener.terminate()
            self._listener.update()

    def on_selectable_readable(self, _event: Any) -> None:
        try:
            sock, peer = IO.accept(self._listener)
        except OSError:
            return  # the client went away before we took it
        self.handshakes.add(_Handshake(self, sock, peer))

    # --- for _Handshake -----------------------------------------------------------------

    def _hand_over(self, handshake: _Handshake, upstream: socket.socket, broker: BrokerAddress) -> None:
        self.handshakes.discard(handshake)
        container = self._container
        client = _bind(container, self._handler, handshake.client, Transport.SERVER, handshake.server.leftover())
        client.url = Url(host=handshake.peer[0], port=handshake.peer[1])
        assert handshake.upstream_sasl is not None
        upstream_connection = _bind(
            container, self._handler, upstream, Transport.CLIENT, handshake.upstream_sasl.leftover()
        )
        upstream_connection.url = Url(host=broker.host, port=broker.port)
        self._on_pair(client, upstream_connection, broker, handshake.peer)


class _Handshake:
    """One client's SASL exchange with qpid-flow and, through it, with the broker."""

    def __init__(self, gate: BrokerGate, sock: socket.socket, peer: Any) -> None:
        self.gate = gate
        self.client = sock
        self.peer = (str(peer[0]), int(peer[1]))
        self.server = ServerHandshake(MECHANISMS)
        self.upstream_sasl: ClientHandshake | None = None
        self._upstream: socket.socket | None = None
        self._upstream_selectable: Selectable | None = None
        self._broker_index = -1
        self._closing = False
        self._client_out = b""
        self._upstream_out = b""
        container = gate._container
        self._client_selectable = _selectable(container, self, sock, reading=True)
        # A timer rather than a selectable deadline: Proton's I/O handler would update the
        # (absent) transport of an expired selectable.
        self._timer = container.schedule(gate._deadline, self)
        self._finished = False

    # --- events of either socket --------------------------------------------------------

    def on_selectable_readable(self, event: Any) -> None:
        if event.selectable is self._client_selectable:
            self._client_readable()
        else:
            self._upstream_readable()

    def on_selectable_writable(self, event: Any) -> None:
        if event.selectable is self._client_selectable:
            self._flush_client()
        elif self.upstream_sasl is None:
            self._upstream_connected()
        else:
            self._flush_upstream()

    def on_timer_task(self, _event: Any) -> None:
        if not self._finished:
            log.info("handshake_timeout", remote=_peer_text(self.peer))
            self._close_all()

    # --- the client -----------------------------------------------------------------------

    def _client_readable(self) -> None:
        data = _recv(self.client)
        if data is None:
            return
        if not data:
            self._close_all()  # the client gave up
            return
        server = self.server
        if self.upstream_sasl is not None or self._upstream is not None:
            server.receive(data)  # pipelined bytes: kept for Proton
            return
        server.receive(data)
        self._send_client(server.data_to_send())
        if server.error is not None:
            log.info("handshake_refused", remote=_peer_text(self.peer), reason=server.error)
            self._close_after_flush()
        elif server.init is not None or server.no_sasl:
            self._connect_next()

    def _send_client(self, data: bytes) -> None:
        if data:
            self._client_out += data
            self._flush_client()

    def _flush_client(self) -> None:
        self._client_out = _send(self.client, self._client_out)
        self._client_selectable.writing = bool(self._client_out)
        self._client_selectable.update()
        if self._closing and not self._client_out:
            self._close_all()

    def _close_after_flush(self) -> None:
        self._closing = True
        self._client_selectable.reading = False
        self._flush_client()

    # --- the broker -----------------------------------------------------------------------

    def _connect_next(self) -> None:
        """Try the next broker address; tell the client to come back later when none is left."""
        self._drop_upstream()
        brokers = self.gate._brokers
        self._broker_index += 1
        while self._broker_index < len(brokers):
            broker = brokers[self._broker_index]
            try:
                address = socket.getaddrinfo(broker.host, broker.port, socket.AF_UNSPEC, socket.SOCK_STREAM)[0]
                self._upstream = IO.connect(address)
            except OSError as exc:
                log.warning("broker_unreachable", broker=broker.redacted, error=str(exc))
                self._broker_index += 1
                continue
            self._upstream_selectable = _selectable(self.gate._container, self, self._upstream, writing=True)
            return
        # No outcome: a SASL failure reads as "authentication failed" to clients, and some
        # (qpid-jms) do not retry that; a dropped connection is what they retry, as they
        # would a broker that refuses connections.
        log.warning("broker_unavailable", remote=_peer_text(self.peer), brokers=len(brokers))
        self._close_all()

    def _upstream_connected(self) -> None:
        assert self._upstream is not None
        failure = self._upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failure:
            broker = self.gate._brokers[self._broker_index]
            log.warning("broker_unreachable", broker=broker.redacted, error=errno.errorcode.get(failure, failure))
            self._connect_next()
            return
        self.upstream_sasl = ClientHandshake(None if self.server.no_sasl else self.server.init)
        if self.upstream_sasl.done:
            self._finish()
            return
        assert self._upstream_selectable is not None
        self._upstream_selectable.reading = True
        self._upstream_out = self.upstream_sasl.data_to_send()
        self._flush_upstream()

    def _flush_upstream(self) -> None:
        assert self._upstream is not None and self._upstream_selectable is not None
        self._upstream_out = _send(self._upstream, self._upstream_out)
        self._upstream_selectable.writing = bool(self._upstream_out)
        self._upstream_selectable.update()

    def _upstream_readable(self) -> None:
        assert self._upstream is not None and self.upstream_sasl is not None
        data = _recv(self._upstream)
        if data is None:
            return
        sasl = self.upstream_sasl
        if not data:
            log.warning("broker_closed_handshake", broker=self.gate._brokers[self._broker_index].redacted)
            self._connect_next()
            return
        sasl.receive(data)
        self._upstream_out += sasl.data_to_send()
        self._flush_upstream()
        if sasl.error is not None:
            log.warning("broker_handshake_failed", remote=_peer_text(self.peer), reason=sasl.error)
            self.server.send_outcome(OUTCOME_SYS_TEMP)
            self._send_client(self.server.data_to_send())
            self._close_after_flush()
        elif sasl.done:
            self._finish()

    def _finish(self) -> None:
        """The broker answered: pass its outcome on; on success, hand both sockets over."""
        sasl = self.upstream_sasl
        assert sasl is not None and self._upstream is not None
        if not self.server.no_sasl:
            outcome = sasl.outcome if sasl.outcome is not None else OUTCOME_SYS_TEMP
            self.server.send_outcome(outcome, sasl.additional_data)
            self._send_client(self.server.data_to_send())
            if outcome != 0:
                log.info("authentication_failed", remote=_peer_text(self.peer), outcome=outcome)
                self._close_after_flush()
                return
        if self._client_out:
            # The outcome must be on the wire before Proton writes after it: a few bytes
            # into an empty socket buffer, so waiting for them is short.
            self.client.setblocking(True)
            try:
                self.client.sendall(self._client_out)
            except OSError:
                self._close_all()
                return
            finally:
                with contextlib.suppress(OSError):
                    self.client.setblocking(False)
            self._client_out = b""
        upstream = self._upstream
        self._finished = True
        self._timer.cancel()
        self._release(self._client_selectable)
        if self._upstream_selectable is not None:
            self._release(self._upstream_selectable)
        self._upstream = None
        self.gate._hand_over(self, upstream, self.gate._brokers[self._broker_index])

    # --- ending ---------------------------------------------------------------------------

    @staticmethod
    def _release(selectable: Selectable) -> None:
        """Stop watching a socket without closing it (Proton's selectable takes it over)."""
        selectable.release()
        selectable.terminate()
        selectable.update()

    def _drop_upstream(self) -> None:
        if self._upstream_selectable is not None:
            self._upstream_selectable.terminate()
            self._upstream_selectable.update()  # closes the socket
        self._upstream_selectable = None
        self._upstream = None
        self.upstream_sasl = None

    def _close_all(self) -> None:
        self._finished = True
        self._timer.cancel()
        self.gate.handshakes.discard(self)
        self._drop_upstream()
        if not self._client_selectable.is_terminal:
            self._client_selectable.terminate()
            self._client_selectable.update()


class _Probe:
    """One TCP connect to a broker, to learn whether it is there; closed at once."""

    def __init__(self, gate: BrokerGate, broker: BrokerAddress, timeout: float) -> None:
        self._gate = gate
        self._broker = broker
        self._done = False
        container = gate._container
        self._timer = container.schedule(timeout, self)
        try:
            address = socket.getaddrinfo(broker.host, broker.port, socket.AF_UNSPEC, socket.SOCK_STREAM)[0]
            sock = IO.connect(address)
        except OSError:
            self._selectable = None
            self._finish(False)
            return
        self._selectable = _selectable(container, self, sock, writing=True)

    def on_selectable_writable(self, _event: Any) -> None:
        assert self._selectable is not None
        self._finish(not self._selectable.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))

    def on_timer_task(self, _event: Any) -> None:
        self._finish(False)

    def _finish(self, reachable: bool) -> None:
        if self._done:
            return
        self._done = True
        self._timer.cancel()
        if self._selectable is not None:
            self._selectable.terminate()
            self._selectable.update()  # closes the socket
        self._gate._probed(self._broker, reachable)


# --- sockets and Proton's selectables ------------------------------------------------------


def _selectable(
    container: Container, handler: Any, sock: socket.socket, reading: bool = False, writing: bool = False
) -> Any:
    selectable = container.selectable(handler=handler, delegate=sock)
    selectable.reading = reading
    selectable.writing = writing
    selectable._transport = None
    container.update(selectable)
    return selectable


def _recv(sock: socket.socket) -> bytes | None:
    """What the socket has (b"" at its end); None when nothing is there after all."""
    try:
        return sock.recv(4096)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bytes:
    """Write what the socket takes now; return the rest."""
    if not data:
        return data
    try:
        sent = sock.send(data)
    except BlockingIOError:
        return data
    except OSError:
        return b""  # the peer is gone: its reading side will say so
    return data[sent:]


def _bind(container: Container, handler: Any, sock: socket.socket, mode: int, leftover: bytes) -> Connection:
    """A Proton connection over ``sock``, SASL done, as Proton's own acceptor builds one."""
    connection = container.connection(handler)
    # Proton's I/O handler leaves a connection with an acceptor alone (it has its socket).
    connection._acceptor = True
    transport = Transport(mode)
    transport.bind(connection)
    selectable = container.selectable(delegate=sock)
    selectable._transport = transport
    transport._selectable = selectable
    if leftover:
        transport.push(leftover)
    IOHandler.update(transport, selectable, container.now)
    return connection


def _peer_text(peer: tuple[str, int]) -> str:
    return f"{peer[0]}:{peer[1]}"
