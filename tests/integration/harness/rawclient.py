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

    def __init__(self, port: int) -> None:
        self.transport = Transport()
        self.connection = Connection()
        self.transport.bind(self.connection)
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.settimeout(0.1)

    def pump(self, until: Callable[[], Any], timeout: float = 10) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not until():
            pending = self.transport.pending()
            if pending > 0:
                self.sock.sendall(self.transport.peek(pending))
                self.transport.pop(pending)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                self.transport.close_tail()
                break
            self.transport.push(data)
        return bool(until())

    def close(self) -> None:
        self.sock.close()
