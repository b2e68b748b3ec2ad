"""Sockets before and after the gate: a byte stream, plain or TLS, and its hand-over to Proton.

During a handshake (:mod:`qpid_flow.amqp.gate`) each socket is a :class:`Stream`: clear bytes in
and out, whether or not TLS is under them. Afterwards, a plain socket goes to a Proton
transport as it is; a TLS one cannot (its TLS state lives in Python's ``ssl``), so Proton
gets one end of a local socket pair and a :class:`TlsTunnel` carries bytes between the other
end and the network, encrypting and decrypting. Only TLS connections pay for that copy.
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING, Any

from proton import Transport, Url
from proton.handlers import IOHandler

if TYPE_CHECKING:
    from proton import Connection
    from proton._selectable import Selectable
    from proton.reactor import Container

    from qpid_flow.security.tls import TlsChannel

__all__ = ["Stream", "TlsTunnel", "bind_transport", "new_selectable"]

_RECV_SIZE = 65536
# A side that is not reading keeps at most this much waiting for the other: past it, the
# tunnel stops reading from the fast side until the slow one has taken some.
_HIGH_WATER = 1024 * 1024


class Stream:
    """One socket of a handshake, as clear bytes; TLS underneath when ``tls`` is given."""

    def __init__(self, container: Container, handler: Any, sock: socket.socket, tls: TlsChannel | None) -> None:
        self.sock = sock
        self.tls = tls
        self.selectable = new_selectable(container, handler, sock)
        self._out = b""  # network bytes not yet written
        self._clear_waiting = b""  # clear bytes written before TLS's handshake finished
        self.ended = False
        if tls is not None:
            self._out = tls.data_to_send()  # a client's hello

    @property
    def tls_error(self) -> str | None:
        return None if self.tls is None else self.tls.error

    def watch(self, reading: bool, writing: bool = False) -> None:
        self.selectable.reading = reading
        self.selectable.writing = writing or bool(self._out)
        self.selectable.update()

    def receive(self) -> bytes | None:
        """Clear bytes the peer sent (b"" once it ended or broke TLS); None when there are
        none yet (nothing to read, or TLS records still incomplete)."""
        raw = _recv(self.sock)
        if raw is None:
            return None
        tls = self.tls
        if tls is None:
            if not raw:
                self.ended = True
            return raw
        was_done = tls.handshake_done
        tls.receive(raw)
        if tls.handshake_done and not was_done and self._clear_waiting:
            tls.write(self._clear_waiting)
            self._clear_waiting = b""
        self._queue(tls.data_to_send())
        clear = tls.read()
        if clear:
            return clear
        if not raw or tls.error is not None or tls.closed:
            self.ended = True
            return b""
        return None

    def send(self, clear: bytes) -> None:
        if not clear:
            return
        tls = self.tls
        if tls is None:
            self._queue(clear)
        elif not tls.handshake_done:
            self._clear_waiting += clear
        else:
            tls.write(clear)
            self._queue(tls.data_to_send())

    def flush(self) -> bool:
        """Write what the socket takes now; True when nothing is left."""
        self._out = _send(self.sock, self._out)
        if self.selectable.writing != bool(self._out):
            self.selectable.writing = bool(self._out)
            self.selectable.update()
        return not self._out

    def send_now(self) -> bool:
        """Write everything queued, waiting for the socket if need be (a few bytes into an
        empty buffer: the SASL outcome before Proton writes after it). False if it failed."""
        if not self._out:
            return True
        self.sock.setblocking(True)
        try:
            self.sock.sendall(self._out)
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                self.sock.setblocking(False)
        self._out = b""
        return True

    def release(self) -> None:
        """Stop watching the socket without closing it: someone else takes it over."""
        self.selectable.release()
        self.selectable.terminate()
        self.selectable.update()

    def close(self) -> None:
        if not self.selectable.is_terminal:
            self.selectable.terminate()
            self.selectable.update()  # closes the socket

    def _queue(self, data: bytes) -> None:
        if data:
            self._out += data
            self.flush()


class TlsTunnel:
    """Carries one TLS connection's bytes between the network and Proton's end of a
    socket pair, for the connection's whole life."""

    def __init__(self, container: Container, stream: Stream, local: socket.socket, pending_clear: bytes) -> None:
        assert stream.tls is not None
        self._tls = stream.tls
        stream.release()
        self._network = new_selectable(container, self, stream.sock)
        self._network_sock = stream.sock
        self._local = new_selectable(container, self, local)
        self._local_sock = local
        self._to_network = stream._out
        self._to_local = pending_clear
        self._network_ended = False
        self._local_ended = False
        self._update()

    def on_selectable_readable(self, event: Any) -> None:
        if event.selectable is self._network:
            self._from_network()
        else:
            self._from_local()
        self._update()

    def on_selectable_writable(self, _event: Any) -> None:
        self._update()

    def _from_network(self) -> None:
        raw = _recv(self._network_sock)
        if raw is None:
            return
        tls = self._tls
        tls.receive(raw)
        self._to_local += tls.read()
        self._to_network += tls.data_to_send()  # e.g. TLS 1.3 key updates
        if not raw or tls.closed or tls.error is not None:
            self._network_ended = True

    def _from_local(self) -> None:
        data = _recv(self._local_sock)
        if data is None:
            return
        if not data:
            self._local_ended = True
            self._tls.close()
        else:
            self._tls.write(data)
        self._to_network += self._tls.data_to_send()

    def _update(self) -> None:
        self._to_network = _send(self._network_sock, self._to_network)
        self._to_local = _send(self._local_sock, self._to_local)
        if self._local_ended and not self._to_network:
            self._end()  # Proton closed its socket, TLS said goodbye: done
            return
        if self._network_ended and not self._to_local:
            # The peer is gone: Proton reads the end of its socket and closes its connection.
            with contextlib.suppress(OSError):
                self._local_sock.shutdown(socket.SHUT_WR)
        self._watch(self._network, not self._network_ended and len(self._to_local) < _HIGH_WATER, self._to_network)
        self._watch(self._local, not self._local_ended and len(self._to_network) < _HIGH_WATER, self._to_local)

    @staticmethod
    def _watch(selectable: Selectable, reading: bool, waiting: bytes) -> None:
        writing = bool(waiting)
        if selectable.reading != reading or selectable.writing != writing:
            selectable.reading = reading
            selectable.writing = writing
            selectable.update()

    def _end(self) -> None:
        for selectable in (self._network, self._local):
            if not selectable.is_terminal:
                selectable.terminate()
                selectable.update()


def new_selectable(container: Container, handler: Any, sock: socket.socket) -> Any:
    """A socket watched by the reactor for ``handler`` (not by a Proton transport)."""
    selectable = container.selectable(handler=handler, delegate=sock)
    selectable.reading = False
    selectable.writing = False
    selectable._transport = None
    container.update(selectable)
    return selectable


def bind_transport(
    container: Container,
    handler: Any,
    stream: Stream,
    mode: int,
    leftover: bytes,
    url: Url,
    idle_timeout: float | None = None,
) -> Connection:
    """A Proton connection over ``stream``'s socket (or, for TLS, a tunnel to it), SASL done,
    as Proton's own acceptor builds one."""
    # Set up before the socket changes hands: a failure here leaves it with ``stream``,
    # whose close still closes it.
    transport = Transport(mode)
    if idle_timeout:
        # Proton advertises half its local idle timeout, and drops a peer once a tick finds
        # it silent since the tick before, the ticks a timeout apart when nothing else
        # comes: after between one and two timeouts of silence. Given the whole setting, a
        # peer is never dropped sooner (given half, a review measured 28.7 s of silence
        # closing a client at the default 60 s).
        transport.idle_timeout = idle_timeout
    if stream.tls is None:
        stream.release()
        sock = stream.sock
    else:
        sock, tunnel_end = socket.socketpair()
        sock.setblocking(False)
        tunnel_end.setblocking(False)
        TlsTunnel(container, stream, tunnel_end, b"")
    connection = container.connection(handler)
    # Proton's I/O handler leaves a connection with an acceptor alone (it has its socket).
    connection._acceptor = True
    connection.url = url
    transport.bind(connection)
    selectable = container.selectable(delegate=sock)
    selectable._transport = transport
    transport._selectable = selectable
    _push(transport, leftover)
    IOHandler.update(transport, selectable, container.now)
    return connection


def _push(transport: Transport, data: bytes) -> None:
    """Hand the bytes a client sent ahead of the SASL outcome to its transport, as much
    as it takes at a time (Proton processes each push, which frees room for the next);
    what it cannot take at all ends the connection, as too much input would."""
    view = memoryview(data)
    while view:
        room = transport.capacity()
        if room <= 0:
            transport.close_tail()
            return
        transport.push(bytes(view[:room]))
        view = view[room:]


def _recv(sock: socket.socket) -> bytes | None:
    """What the socket has (b"" at its end); None when nothing is there after all."""
    try:
        return sock.recv(_RECV_SIZE)
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
