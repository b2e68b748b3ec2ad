"""A Proton engine pumped by hand over a socket, for tests that need frames a messaging
client would not send, or a peer that falls silent."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from proton import Connection, Transport


class RawClient:
    """A Proton engine pumped by hand over a socket: the test decides when it talks, and
    can fall silent (no heartbeats) to play a dead peer."""

    def __init__(self, port: int, receive_buffer: int | None = None) -> None:
        """``receive_buffer``: the socket's SO_RCVBUF, set before it connects (a small one
        makes a client that stops reading fill up at once)."""
        self.transport = Transport()
        self.connection = Connection()
        self.transport.bind(self.connection)
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(5)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(0.1)

    def pump(self, until: Callable[[], Any], timeout: float = 10) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not until():
            pending = self.transport.pending()
            if pending > 0:
                self.sock.sendall(self.transport.peek(pending))
                self.transport.pop(pending)
            capacity = self.transport.capacity()
            if capacity <= 0:
                break  # Proton takes no more input (an error, or the end)
            try:
                data = self.sock.recv(min(capacity, 65536))
            except TimeoutError:
                continue
            if not data:
                self.transport.close_tail()
                break
            self.transport.push(data)
        return bool(until())

    def close(self) -> None:
        self.sock.close()
