"""AMQP 1.0 frames written and read by hand, for the tests that need a peer breaking a rule
no client library lets it break (sending beyond its link credit, for one).

Performatives are encoded with Proton's codec (:class:`proton.Data`); only the few a
producer needs are here. :class:`FrameSocket` does the SASL ANONYMOUS exchange, then
sends frames and reads back what qpid-flow answers, decoded.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from proton import Data, Described, Message, symbol, ubyte, uint, ulong

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
NAMES = {
    0x10: "open",
    0x11: "begin",
    0x12: "attach",
    0x13: "flow",
    0x14: "transfer",
    0x15: "disposition",
    0x16: "detach",
    0x17: "end",
    0x18: "close",
    0x40: "sasl-mechanisms",
    0x44: "sasl-outcome",
}


def _encoded(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return data.encode()


def frame(code: int, fields: list[Any], channel: int = 0, payload: bytes = b"", frame_type: int = 0) -> bytes:
    body = _encoded(Described(ulong(code), fields)) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


def sasl_anonymous() -> bytes:
    return frame(0x41, [symbol("ANONYMOUS"), b"anonymous"], frame_type=1)


def open_frame(container: str = "frames") -> bytes:
    return frame(0x10, [container])


def begin_frame(window: int = 2048) -> bytes:
    return frame(0x11, [None, uint(0), uint(window), uint(window)])


def sender_attach(name: str, handle: int, address: str) -> bytes:
    # role sender (False); source, target; initial-delivery-count 0.
    source = Described(ulong(0x28), [None])
    target = Described(ulong(0x29), [address])
    return frame(0x12, [name, uint(handle), False, ubyte(0), ubyte(0), source, target, None, None, uint(0)])


def transfer_frame(handle: int, delivery_id: int, body: Any) -> bytes:
    payload = Message(body=body).encode()
    tag = b"%d" % delivery_id
    return frame(0x14, [uint(handle), uint(delivery_id), tag, uint(0), False, False], payload=payload)


class Performative:
    """A frame qpid-flow sent: its name and its fields (as Proton decodes them)."""

    def __init__(self, name: str, fields: list[Any]) -> None:
        self.name = name
        self.fields = fields

    def __repr__(self) -> str:
        return f"{self.name}{self.fields!r}"

    def condition(self) -> str | None:
        """The error condition a detach, end or close carries (its last field), if any."""
        error = self.fields[-1] if self.fields else None
        return str(error.value[0]) if isinstance(error, Described) and error.value else None


def _decode(body: bytes) -> Performative | None:
    data = Data()
    data.decode(body)
    value = data.get_object()
    if not isinstance(value, Described):
        return None
    return Performative(NAMES.get(int(value.descriptor), hex(int(value.descriptor))), list(value.value or []))


class FrameSocket:
    """A socket to qpid-flow that speaks in frames: SASL ANONYMOUS, then the AMQP header."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._buffer = b""
        self.received: list[Performative] = []
        self.closed_by_peer = False
        self.sock.sendall(SASL_HEADER + sasl_anonymous())
        self.read_until(lambda: any(p.name == "sasl-outcome" for p in self.received))
        self.sock.sendall(AMQP_HEADER)

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read_until(self, done: Any, timeout: float = 5.0) -> bool:
        """Read and decode frames until ``done()`` or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline and not self.closed_by_peer:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                self.closed_by_peer = True
                break
            self._buffer += data
            self._split()
        return bool(done())

    def named(self, name: str) -> list[Performative]:
        return [p for p in self.received if p.name == name]

    def _split(self) -> None:
        while True:
            if self._buffer[:4] == b"AMQP" and len(self._buffer) >= 8:
                self._buffer = self._buffer[8:]
                continue
            if len(self._buffer) < 8:
                return
            size, offset = struct.unpack(">IB", self._buffer[:5])
            if len(self._buffer) < size:
                return
            body = self._buffer[offset * 4 : size]
            self._buffer = self._buffer[size:]
            if body:  # an empty frame is a heartbeat
                performative = _decode(body)
                if performative is not None:
                    self.received.append(performative)

    def close(self) -> None:
        self.sock.close()
