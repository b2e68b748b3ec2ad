"""The AMQP 1.0 SASL layer (part 5.3), sans-IO, for both ends of a relayed handshake.

In front of a broker, qpid-flow authenticates a client by passing the client's credentials
through to the broker: it offers PLAIN and ANONYMOUS, takes the client's sasl-init, replays
it to the broker on a fresh upstream socket and hands the broker's sasl-outcome back. Proton
cannot do this itself: its SASL server never shows PLAIN credentials to the application, and
it crashes (SIGSEGV) on a sasl-init whose mechanism is null. So Proton never sees SASL bytes:
:class:`ServerHandshake` and :class:`ClientHandshake` run the exchange on raw bytes, and after
a successful outcome both sockets go to Proton transports with SASL disabled.

Both classes are fed untrusted network bytes in any split; ``receive`` never raises. A
protocol violation sets ``error`` instead, and the caller closes the socket after sending
whatever ``data_to_send`` holds.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AMQP_HEADER",
    "OUTCOME_AUTH",
    "OUTCOME_OK",
    "OUTCOME_SYS",
    "OUTCOME_SYS_PERM",
    "OUTCOME_SYS_TEMP",
    "SASL_HEADER",
    "TRY_LATER",
    "ClientHandshake",
    "MechanismsReader",
    "SaslInit",
    "ServerHandshake",
]

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"

OUTCOME_OK, OUTCOME_AUTH, OUTCOME_SYS, OUTCOME_SYS_PERM, OUTCOME_SYS_TEMP = 0, 1, 2, 3, 4

# What a sign-in check answers, instead of a user or None (refused), when it could not check
# now (too many checks under way): answered sys-temp, so that the client tries again rather
# than taking its password for wrong. No user name can be it: PLAIN separates fields by NUL.
TRY_LATER = "\x00try later"

# SASL performative descriptors (part 5.3.3), numeric and symbolic forms.
_MECHANISMS, _INIT, _CHALLENGE, _RESPONSE, _OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
_NAMES = {_MECHANISMS: "sasl-mechanisms", _INIT: "sasl-init", _CHALLENGE: "sasl-challenge"}
_NAMES |= {_RESPONSE: "sasl-response", _OUTCOME: "sasl-outcome"}
_SYMBOLIC = {f"amqp:{name}:list".encode(): code for code, name in _NAMES.items()}

_SASL_FRAME = 1
_FRAME_HEADER = struct.Struct(">IBBH")  # size, doff, type, channel
_U32 = struct.Struct(">I")


class _Symbol(str):
    """A decoded symbol, told apart from a string: a mechanism must be a symbol."""


Value = str | bytes | int | tuple[_Symbol, ...] | None


class _ProtocolError(Exception):
    """The peer broke the SASL protocol; the message says how."""


def _clip(value: object) -> str:
    """A peer's value for an error message: a frame can hold 64 KiB, a log line should not."""
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


@dataclass(frozen=True, slots=True)
class SaslInit:
    """A client's sasl-init: what qpid-flow replays to the broker."""

    mechanism: str
    initial_response: bytes | None
    hostname: str | None


# --- encoding: only the few shapes the two ends send -------------------------------------


def _sized(small: int, large: int, payload: bytes | None) -> bytes:
    """A variable-width value (the one-byte-size form when it fits), or null."""
    if payload is None:
        return b"\x40"
    if len(payload) <= 255:
        return bytes((small, len(payload))) + payload
    return bytes((large,)) + _U32.pack(len(payload)) + payload


def _symbol_array(values: Sequence[str]) -> bytes:
    names = [v.encode("ascii") for v in values]
    small = b"".join(bytes((len(n),)) + n for n in names)
    if len(small) + 2 <= 255 and all(len(n) <= 255 for n in names):
        return bytes((0xE0, len(small) + 2, len(names), 0xA3)) + small
    large = b"".join(_U32.pack(len(n)) + n for n in names)
    return b"\xf0" + _U32.pack(len(large) + 5) + _U32.pack(len(names)) + b"\xb3" + large


def _frame(performative: int, fields: list[bytes]) -> bytes:
    """A SASL frame carrying one performative; trailing null fields are left out, as allowed."""
    while fields and fields[-1] == b"\x40":
        fields = fields[:-1]
    count = len(fields)
    items = b"".join(fields)
    if not fields:
        body = b"\x45"
    elif len(items) + 1 <= 255 and count <= 255:
        body = bytes((0xC0, len(items) + 1, count)) + items
    else:
        body = b"\xd0" + _U32.pack(len(items) + 4) + _U32.pack(count) + items
    body = bytes((0x00, 0x53, performative)) + body
    return _FRAME_HEADER.pack(8 + len(body), 2, _SASL_FRAME, 0) + body


# --- decoding ------------------------------------------------------------------------------


class _Reader:
    """Reads values from a frame body; every read past the end is a protocol error."""

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data, self.pos, self.end = data, pos, len(data) if end is None else end

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise _ProtocolError("an encoded value runs past the end of its frame or list")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def byte(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def value(self) -> Value:
        """One field value: only the types a SASL performative's fields may hold."""
        code = self.byte()
        if code == 0x40:
            return None
        if code == 0x50:
            return self.byte()
        if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
            raw = self.take(self.byte() if code < 0xB0 else self.u32())
            if code in (0xA0, 0xB0):
                return raw
            try:
                # Symbols are ASCII (part 1.6.21); a non-ASCII one can match no mechanism anyway.
                return raw.decode("utf-8") if code in (0xA1, 0xB1) else _Symbol(raw.decode("ascii"))
            except UnicodeDecodeError:
                raise _ProtocolError("a string or symbol field is not valid text") from None
        if code in (0xE0, 0xF0):
            return self._symbol_array(code)
        raise _ProtocolError(f"unexpected AMQP type code 0x{code:02x} in a SASL field")

    def _symbol_array(self, code: int) -> tuple[_Symbol, ...]:
        size = self.byte() if code == 0xE0 else self.u32()
        body = _Reader(self.take(size))
        count = body.byte() if code == 0xE0 else body.u32()
        element = body.byte()
        if element not in (0xA3, 0xB3):
            raise _ProtocolError(f"an array field holds type 0x{element:02x}, not symbols")
        names = []
        for _ in range(count):  # each element costs at least one byte, so count is bounded by size
            raw = body.take(body.byte() if element == 0xA3 else body.u32())
            try:
                names.append(_Symbol(raw.decode("ascii")))
            except UnicodeDecodeError:
                raise _ProtocolError("a symbol is not ASCII") from None
        return tuple(names)


def _decode_body(body: bytes) -> tuple[int, list[Value]]:
    """A frame body: the performative's descriptor code and its fields (missing ones as None)."""
    r = _Reader(body)
    if r.byte() != 0x00:
        raise _ProtocolError("the frame body is not a described performative")
    code = r.byte()
    if code == 0x53:
        descriptor = r.byte()
    elif code == 0x80:
        descriptor = int.from_bytes(r.take(8), "big")
    elif code in (0xA3, 0xB3):
        name = r.take(r.byte() if code == 0xA3 else r.u32())
        if name not in _SYMBOLIC:
            raise _ProtocolError(f"not a SASL performative: descriptor {_clip(bytes(name))}")
        descriptor = _SYMBOLIC[name]
    else:
        raise _ProtocolError(f"unsupported descriptor type 0x{code:02x}")
    if descriptor not in _NAMES:
        raise _ProtocolError(f"not a SASL performative: descriptor {descriptor:#x}")
    code = r.byte()
    fields: list[Value] = []
    if code in (0xC0, 0xD0):
        size = r.byte() if code == 0xC0 else r.u32()
        items = _Reader(body, r.pos, r.pos + size)
        r.take(size)
        count = items.byte() if code == 0xC0 else items.u32()
        fields = [items.value() for _ in range(count)]  # bounded: each value takes a byte
    elif code != 0x45:
        raise _ProtocolError(f"the performative is type 0x{code:02x}, not a list")
    return descriptor, fields + [None] * 3  # the longest SASL performative has 3 fields


class _Handshake:
    """What both ends share: header check, frame splitting, buffering, the error state."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self.error: str | None = None
        self._buffer = bytearray()  # appends in place: a byte-at-a-time peer costs linear time
        self._outgoing = b""
        self._header_seen = False
        self._stopped = False  # after the last SASL frame: later bytes are for the AMQP layer

    def receive(self, data: bytes) -> None:
        """Take bytes from the peer, in any split; then read the state attributes."""
        self._buffer += data
        try:
            self._advance()
        except _ProtocolError as exc:
            self._fail(str(exc))
        except Exception as exc:  # a bug here must not take the server down: treat it as bad input
            self._fail(f"unreadable SASL input ({type(exc).__name__}: {exc})")

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call."""
        data, self._outgoing = self._outgoing, b""
        return data

    def leftover(self) -> bytes:
        """The bytes after the SASL exchange: the start of the AMQP layer, for Proton."""
        return bytes(self._buffer)

    def _fail(self, message: str) -> None:
        self.error = message
        self._stopped = True

    def _advance(self) -> None:
        while not self._stopped:
            if not self._header_seen:
                if len(self._buffer) < 8:
                    return
                self._header_seen = True
                if self._on_header(bytes(self._buffer[:8])):
                    del self._buffer[:8]
                continue
            frame = self._next_frame()
            if frame is None:
                return
            if frame:  # an empty frame is a heartbeat
                self._on_frame(*_decode_body(frame))

    def _next_frame(self) -> bytes | None:
        """The next whole frame's body (b"" for a heartbeat), or None until more bytes arrive."""
        if len(self._buffer) < 8:
            return None
        size, doff, kind, _channel = _FRAME_HEADER.unpack_from(self._buffer)
        # Checked before the frame is complete, so garbage fails at once rather than waiting.
        if size < 8 or size > self.max_frame_size:
            raise _ProtocolError(f"bad frame size {size} (limit {self.max_frame_size})")
        if doff < 2 or doff * 4 > size:
            raise _ProtocolError(f"bad data offset {doff} in a frame of {size} bytes")
        if kind != _SASL_FRAME:
            raise _ProtocolError(f"frame type {kind} during the SASL exchange, not a SASL frame")
        if len(self._buffer) < size:
            return None
        body = bytes(self._buffer[doff * 4 : size])
        del self._buffer[:size]
        return body

    def _on_header(self, header: bytes) -> bool:
        """Handle the peer's protocol header; return False to keep it in the buffer."""
        raise NotImplementedError

    def _on_frame(self, performative: int, fields: list[Value]) -> None:
        raise NotImplementedError


def _offered(fields: list[Value]) -> tuple[str, ...]:
    """The mechanism names of a sasl-mechanisms frame, in the order offered."""
    offered = fields[0] if fields else None
    if isinstance(offered, _Symbol):  # a multiple field may hold a single value
        offered = (offered,)
    if not isinstance(offered, tuple):
        raise _ProtocolError("sasl-mechanisms does not list symbols")
    return tuple(str(name) for name in offered)


class MechanismsReader(_Handshake):
    """Reads a SASL server's header and its sasl-mechanisms frame, and nothing more: what a
    broker offers, learnt before a client asks (qpid-flow offers its clients the same)."""

    def __init__(self) -> None:
        super().__init__(65536)
        self.offered: tuple[str, ...] | None = None
        self._outgoing = SASL_HEADER

    def read_from(self, sock: Any) -> tuple[str, ...] | None:
        """Send the header on a connected (blocking) socket and read the answer: the
        mechanisms offered, or None (``error`` says why, unless the peer just hung up)."""
        sock.sendall(self.data_to_send())
        while self.offered is None and self.error is None:
            data = sock.recv(4096)
            if not data:
                break
            self.receive(data)
        return self.offered

    def _on_header(self, header: bytes) -> bool:
        if header != SASL_HEADER:
            raise _ProtocolError(f"the broker answered with protocol header {header!r}, not SASL's")
        return True

    def _on_frame(self, performative: int, fields: list[Value]) -> None:
        if performative != _MECHANISMS:
            raise _ProtocolError(f"the broker sent {_NAMES.get(performative, performative)} first")
        self.offered = _offered(fields)
        self._stopped = True


class ServerHandshake(_Handshake):
    """The client-facing end: qpid-flow is the SASL server."""

    def __init__(self, mechanisms: Sequence[str], max_frame_size: int = 65536) -> None:
        super().__init__(max_frame_size)
        if not mechanisms:
            raise ValueError("a SASL server must offer at least one mechanism")
        self.mechanisms = tuple(mechanisms)
        self._mechanisms_frame = _frame(_MECHANISMS, [_symbol_array(self.mechanisms)])  # bad names fail here
        self.init: SaslInit | None = None
        self.no_sasl = False
        self.done = False
        self._offered = False  # the mechanisms went out: a refusal can now be a sasl-outcome

    def send_outcome(self, code: int, additional_data: bytes | None = None) -> None:
        """Answer the client's sasl-init; after OUTCOME_OK the next bytes are the AMQP layer's."""
        if self.init is None or self.done:
            raise RuntimeError("send_outcome() needs a sasl-init not yet answered")
        self._outgoing += _frame(_OUTCOME, [bytes((0x50, code)), _sized(0xA0, 0xB0, additional_data)])
        self.done = code == OUTCOME_OK

    def _on_header(self, header: bytes) -> bool:
        if header == AMQP_HEADER:
            # The client skips SASL; the caller decides whether to allow that. The header stays
            # in the buffer so that whoever handles the AMQP layer sees the bytes as sent.
            self.no_sasl = True
            self._stopped = True
            return False
        self._outgoing += SASL_HEADER  # the header we support, even when we then close
        if header != SASL_HEADER:
            raise _ProtocolError(f"the client sent protocol header {header!r}, not SASL's")
        self._outgoing += self._mechanisms_frame
        self._offered = True
        return True

    def _fail(self, message: str) -> None:
        # Whatever is wrong with the client's SASL frames, it gets an outcome it can report
        # (authentication failed) before the close, rather than a bare dropped connection.
        if self._offered and self.init is None:
            self._outgoing += _frame(_OUTCOME, [bytes((0x50, OUTCOME_AUTH))])
        super()._fail(message)

    def _on_frame(self, performative: int, fields: list[Value]) -> None:
        if performative != _INIT:
            raise _ProtocolError(f"the client sent {_NAMES[performative]}, expected sasl-init")
        mechanism, response, hostname = fields[:3]
        # A null mechanism is the input Proton's SASL server crashes on; here it is a refusal.
        if not isinstance(mechanism, _Symbol):
            raise _ProtocolError(f"sasl-init mechanism is {_clip(mechanism)}, not a symbol")
        if mechanism not in self.mechanisms:
            raise _ProtocolError(f"sasl-init mechanism {_clip(str(mechanism))} is not one of {list(self.mechanisms)}")
        # The hostname must be a string; a symbol is a str subclass here, so it is excluded by name.
        if not isinstance(response, bytes | None) or isinstance(hostname, _Symbol | bytes | int | tuple):
            raise _ProtocolError("sasl-init initial-response or hostname has the wrong type")
        self.init = SaslInit(str(mechanism), response, hostname)
        # The client now waits for the outcome; anything it sends meanwhile (a pipelined AMQP
        # header) belongs to the AMQP layer and stays in the buffer for leftover().
        self._stopped = True


class ClientHandshake(_Handshake):
    """The upstream end: qpid-flow replays a client's sasl-init to the broker."""

    def __init__(self, init: SaslInit | None, max_frame_size: int = 65536) -> None:
        super().__init__(max_frame_size)
        self._init = init
        self._init_frame = b""  # encoded now, so that a mechanism that is not ASCII fails here
        if init is not None:
            hostname = None if init.hostname is None else init.hostname.encode("utf-8")
            self._init_frame = _frame(
                _INIT,
                [
                    _sized(0xA3, 0xB3, init.mechanism.encode("ascii")),  # symbol
                    _sized(0xA0, 0xB0, init.initial_response),  # binary
                    _sized(0xA1, 0xB1, hostname),  # string
                ],
            )
        self.outcome: int | None = None
        self.additional_data: bytes | None = None
        self.offered: tuple[str, ...] = ()
        self._init_sent = False
        # No init: the client did not use SASL, so neither does the upstream connection.
        self.done = init is None
        self._stopped = init is None
        if init is not None:
            self._outgoing = SASL_HEADER

    def _on_header(self, header: bytes) -> bool:
        if header == AMQP_HEADER:
            raise _ProtocolError("the broker does not use SASL (it answered with the AMQP header)")
        if header != SASL_HEADER:
            raise _ProtocolError(f"the broker sent protocol header {header!r}, not SASL's")
        return True

    def _on_frame(self, performative: int, fields: list[Value]) -> None:
        assert self._init is not None  # no frames are read without an init
        if performative == _MECHANISMS and not self._init_sent:
            self.offered = _offered(fields)
            if self._init.mechanism not in self.offered:
                offered_text = _clip(list(self.offered))
                raise _ProtocolError(f"the broker does not offer {self._init.mechanism}; it offers {offered_text}")
            self._outgoing += self._init_frame
            self._init_sent = True
        elif performative == _OUTCOME and self._init_sent:
            code, data = fields[:2]
            if not isinstance(code, int) or not isinstance(data, bytes | None):
                raise _ProtocolError("sasl-outcome code or additional-data has the wrong type")
            self.outcome, self.additional_data, self.done = code, data, True
            self._stopped = True
        elif performative == _CHALLENGE:
            raise _ProtocolError("the broker sent a sasl-challenge; only PLAIN and ANONYMOUS are relayed")
        else:
            raise _ProtocolError(f"the broker sent {_NAMES[performative]} out of order")
