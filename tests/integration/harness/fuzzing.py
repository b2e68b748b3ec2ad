"""Listener fuzzing, shared by tests/integration/test_fuzz.py and bench/fuzz.py.

- a recorded Proton client session (client-to-listener bytes, one protocol header or frame
  per unit, and where the client waited for an answer): :func:`record_session` records one
  through a TCP proxy, :func:`load_session` / :func:`save_session` keep it in a small text
  file (tests/integration/data/proton-session.txt);
- :func:`mutate`: input number ``index`` of seed ``seed``, always the same bytes: bit flips,
  byte insertions and deletions, truncations, duplicated, dropped and swapped frames, frame
  sizes and headers, garbage after a valid protocol header, performative fields replaced
  with other AMQP values (the frame size kept right, so the bytes reach the decoders), all
  sent at once instead of step by step, and a client that hangs up without reading. Half of
  the mutations aim at the SASL part (the SASL header, the sasl-init, the AMQP header);
- :func:`send_batch`: each input on a fresh TCP connection, several at once: send step by
  step, read until the listener closes or a short timeout, close; it notes which inputs were
  in flight when the process died, and :func:`reproduce` finds the one that kills a fresh
  process; :func:`left_open` tells the connections the listener never closed;
- :func:`round_trip` and :class:`Bystander`: well-behaved clients, to tell that the listener
  still works for everyone else;
- :class:`LeakCheck`: the listening process's open file descriptors and resident memory
  (Linux /proc) after a warm-up and at the end, once the fuzzed connections are closed
  (:func:`settled_sample`): descriptors back to the warm-up level, memory growth per fuzzed
  connection under a bound.

Everything here speaks the protocol (AMQP 1.0 parts 2.3, 5.3): nothing knows how qpid-flow
implements its listener.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from .blocking_clients import receive_messages, send_messages
from .router import RouterProcess

SESSION_FILE = Path(__file__).resolve().parents[1] / "data" / "proton-session.txt"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
# The 23-byte regression: the SASL header and one sasl-init whose mechanism is null.
NULL_MECHANISM_INIT = SASL_HEADER + bytes.fromhex("0000000f0201000000534" + "1c0020140")

_SASL_NAMES = {0x40: "sasl-mechanisms", 0x41: "sasl-init", 0x42: "sasl-challenge", 0x43: "sasl-response"}
_SASL_NAMES[0x44] = "sasl-outcome"
_AMQP_NAMES = dict(enumerate(["open", "begin", "attach", "flow", "transfer", "disposition", "detach", "end"], 0x10))
_AMQP_NAMES[0x18] = "close"


# --- the session: units, names, files -------------------------------------------------------

# A session is a list of units: bytes (a protocol header or a frame, see split_units) and,
# where the client waited for the listener's answer, an int: how many units the listener had
# sent it by then (its protocol headers and frames since the connection opened).
Unit = bytes | int


def split_units(stream: bytes) -> list[bytes]:
    """Protocol headers and frames, in order; a trailing partial frame is one unit too."""
    units, pos = [], 0
    while pos < len(stream):
        if stream[pos : pos + 4] == b"AMQP":
            end = pos + 8
        else:
            size = int.from_bytes(stream[pos : pos + 4], "big")
            end = pos + max(size, 4)
        units.append(stream[pos:end])
        pos = end
    return units


def describe(unit: bytes) -> str:
    """'sasl header', 'sasl-init', 'attach'... for a unit of :func:`split_units`."""
    if unit.startswith(b"AMQP"):
        return {SASL_HEADER: "sasl header", AMQP_HEADER: "amqp header"}.get(unit, f"header {unit[:8].hex()}")
    if len(unit) <= 8:
        return "empty frame" if len(unit) == 8 else "partial frame"
    parsed = _parse(unit)
    names = _SASL_NAMES if unit[5] == 1 else _AMQP_NAMES
    if parsed is None or len(parsed.prefix) < 3 or parsed.prefix[-2] != 0x53:
        return "frame"
    return names.get(parsed.prefix[-1], "frame")


def load_session(path: Path = SESSION_FILE) -> list[Unit]:
    """A session file: one unit a line (hex, then its name); `-- N` where the client waited
    until the listener had sent N units; `#` comments."""
    lines = (line.split("#", 1)[0].split() for line in path.read_text().splitlines())
    return [int(words[1]) if words[0] == "--" else bytes.fromhex(words[0]) for words in lines if words]


def save_session(path: Path, units: Sequence[Unit], comment: str) -> None:
    text = "".join(f"# {line}\n".replace("# \n", "#\n") for line in comment.splitlines())
    for unit in units:
        text += f"-- {unit}\n" if isinstance(unit, int) else f"{unit.hex()} {describe(unit)}\n"
    path.write_text(text)


def record_session(host: str, port: int, address: str = "fuzz", timeout: float = 10.0) -> list[Unit]:
    """What a Proton BlockingConnection sends to host:port to connect (SASL ANONYMOUS), send
    one message, receive it, detach both links and close, recorded by a proxy in between;
    between two of its writes, how many units the listener had sent it."""
    from proton.utils import BlockingConnection

    listener = socket.create_server(("127.0.0.1", 0))
    sent: list[bytes] = []  # the client's writes (one read of the proxy each)
    answered: list[int] = []  # before each, the listener's units so far
    back_bytes = bytearray()
    lock = threading.Lock()

    def pump(src: socket.socket, dst: socket.socket, client: bool) -> None:
        while data := _recv(src):
            with lock:
                if client:
                    answered.append(_complete_units(back_bytes))
                    sent.append(data)
                else:
                    back_bytes.extend(data)
            dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def proxy() -> None:
        client, _ = listener.accept()
        with client, socket.create_connection((host, port)) as upstream:
            back = threading.Thread(target=pump, args=(upstream, client, False))
            back.start()
            pump(client, upstream, True)
            back.join(timeout)

    thread = threading.Thread(target=proxy, daemon=True)
    thread.start()
    with listener:
        conn = BlockingConnection(f"amqp://127.0.0.1:{listener.getsockname()[1]}", timeout=timeout)
        sender = conn.create_sender(address)
        sender.send(Message(body="fuzz"))
        receiver = conn.create_receiver(address, credit=1)
        receiver.receive(timeout=timeout)
        receiver.accept()
        receiver.close()
        sender.close()
        conn.close()
        thread.join(timeout)
    # A pause where the listener had answered more before the client's next write.
    starts = dict(zip(itertools.accumulate(len(chunk) for chunk in [b"", *sent]), answered, strict=False))
    units: list[Unit] = []
    pos, seen = 0, 0
    for unit in split_units(b"".join(sent)):
        if starts.get(pos, seen) > seen:
            seen = starts[pos]
            units.append(seen)
        units.append(unit)
        pos += len(unit)
    return units


def _complete_units(stream: bytes | bytearray) -> int:
    """How many units of ``stream`` are whole (the last one may not be yet)."""
    units = split_units(bytes(stream))
    last = units[-1] if units else b"AMQP\0\0\0\0"
    whole = len(last) == 8 if last.startswith(b"AMQP") else len(last) == max(int.from_bytes(last[:4], "big"), 4)
    return len(units) - (not whole)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


# --- AMQP values, just enough to find a performative's fields ----------------------------


def _value_end(buf: bytes, pos: int) -> int:
    code = buf[pos]
    if code == 0x00:  # described: descriptor, then the value
        return _value_end(buf, _value_end(buf, pos + 1))
    kind = code >> 4
    if 4 <= kind <= 9:
        end = pos + 1 + (0, 1, 2, 4, 8, 16)[kind - 4]
    elif kind in (0xA, 0xC, 0xE):
        end = pos + 2 + buf[pos + 1]
    elif kind in (0xB, 0xD, 0xF):
        end = pos + 5 + int.from_bytes(buf[pos + 1 : pos + 5], "big")
    else:
        raise ValueError(f"type code {code:#x}")
    if end > len(buf):
        raise ValueError("past the end")
    return end


@dataclass
class _Performative:
    prefix: bytes  # frame header, extended header, 0x00 and the descriptor
    fields: list[bytes]  # each field's encoded value
    payload: bytes  # what follows the list (a transfer's message)

    def build(self, count: int | None = None) -> bytes:
        items = b"".join(self.fields)
        n = len(self.fields) if count is None else count
        if len(items) < 255 and n < 256:
            body = bytes([0xC0, len(items) + 1, n]) + items
        else:
            body = b"\xd0" + (len(items) + 4).to_bytes(4, "big") + n.to_bytes(4, "big") + items
        frame = self.prefix + body + self.payload
        return len(frame).to_bytes(4, "big") + frame[4:]


def _parse(frame: bytes) -> _Performative | None:
    try:
        pos = frame[4] * 4
        if frame[pos] != 0x00:
            return None
        pos = _value_end(frame, pos + 1)  # the descriptor's end: the list's start
        code, fields = frame[pos], []
        if code == 0x45:
            start, count, end = pos + 1, 0, pos + 1
        elif code == 0xC0:
            start, count, end = pos + 3, frame[pos + 2], pos + 2 + frame[pos + 1]
        elif code == 0xD0:
            size, count = (
                int.from_bytes(frame[pos + 1 : pos + 5], "big"),
                int.from_bytes(frame[pos + 5 : pos + 9], "big"),
            )
            start, end = pos + 9, pos + 5 + size
        else:
            return None
        at = start
        for _ in range(count):
            fields.append(frame[at : (at := _value_end(frame, at))])
        return _Performative(frame[:pos], fields, frame[end:]) if at == end else None
    except (IndexError, ValueError):
        return None


# Field values to put in a performative: nulls, other types, edge numbers, mechanism names,
# credentials, bad UTF-8, lengths and counts that lie, nested performatives.
_VALUES = [
    b"\x40", b"\x41", b"\x42", b"\x43", b"\x44", b"\x45", b"\x50\xff", b"\x52\x00", b"\x60\xff\xff",
    b"\x70\xff\xff\xff\xff", b"\x70\x7f\xff\xff\xff", b"\x71\x80\x00\x00\x00", b"\x80" + b"\xff" * 8,
    b"\x98" + bytes(16), b"\xa3\x00", b"\xa3\x05PLAIN", b"\xa3\x08EXTERNAL", b"\xa3\x09ANONYMOUS",
    b"\xa3\x0bPLAIN\x00PLAIN", b"\xa3\x04\x00\xff\xfe\x80", b"\xa3\xff" + b"A" * 255,
    b"\xb3\x00\x00\x10\x00" + b"M" * 4096, b"\xa0\x00", b"\xa0\x0c\x00guest\x00guest",
    b"\xa0\x07\x00\x00guest", b"\xa0\x01\x00", b"\xa1\x00", b"\xa1\x03\xc3\x28\xa0", b"\xa1\x09localhost",
    b"\xa3\xff" + b"AB", b"\xa0\xff\x00", b"\xb3\xff\xff\xff\xff", b"\xb0\x7f\xff\xff\xff\x00", b"\xa1\x05ab",
    b"\xc0\x02\x05\x40", b"\xd0\xff\xff\xff\xff\x00\x00\x00\x01\x40", b"\xc1\x01\x01", b"\xc1\x03\x01\x40",
    b"\xd1\x00\x00\x00\x04\x00\x00\x00\x03", b"\xe0\x03\x02\xa3\x00", b"\xf0\xff\xff\xff\xff\x00\x00\x00\x01\x40",
    b"\xe0\x02\x05\x40", b"\x00\x53\x41\x45", b"\x00\x53\x44\xc0\x02\x01\x50", b"\x00\xa3\x04none\x40",
    b"\x00\x00\x00\x00\x40", b"\x00", b"\xff", b"\x3f", b"\x57", b"\xa3",
]  # fmt: skip
_BYTES = [0x00, 0x01, 0x02, 0x03, 0x40, 0x41, 0x45, 0x53, 0x7F, 0x80, 0xA0, 0xA1, 0xA3, 0xB3, 0xC0, 0xD0, 0xE0, 0xFF]
_SIZES = [0, 1, 2, 4, 7, 8, 9, 12, 255, 256, 511, 512, 4096, 65535, 65536, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
_HEADERS = [
    SASL_HEADER, AMQP_HEADER, b"AMQP\x02\x01\x00\x00", b"AMQP\x03\x01\x00\x01", b"AMQP\x03\x00\x00\x00",
    b"AMQP\x01\x01\x00\x0a", b"AMQP\x00\x00\x09\x01", b"AMQP", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00",
]  # fmt: skip


@dataclass(frozen=True)
class Input:
    index: int
    mutation: str
    data: bytes
    # (offset in data, n): before sending on from there, wait until the listener has sent
    # n units since the connection opened (or step_wait has passed)
    pauses: tuple[tuple[int, int], ...] = ()
    hang_up: bool = False  # close at once after the last step, without reading

    def steps(self) -> list[tuple[bytes, int]]:
        """(bytes to send, how many more units the listener answers them with), in order."""
        cuts = [0, *(at for at, _ in self.pauses), len(self.data)]
        counts = [n for _, n in self.pauses]
        more = [b - a for a, b in itertools.pairwise([0, *counts])] + [0]
        return [(self.data[a:b], n) for (a, b), n in zip(itertools.pairwise(cuts), more, strict=True)]

    def __str__(self) -> str:
        return self.show(len(self.data))

    def show(self, limit: int = 1024) -> str:
        """As str(), with at most ``limit`` bytes of hex."""
        more = f"... ({len(self.data) - limit} bytes more)" if len(self.data) > limit else ""
        then = ", then hangs up at once" if self.hang_up else ""
        return (
            f"input #{self.index} ({self.mutation}), {len(self.data)} bytes, sent in steps "
            f"(offset, listener's units to wait for) {list(self.pauses)}{then}:\n{self.data[:limit].hex()}{more}"
        )


def from_units(index: int, mutation: str, units: Sequence[Unit], hang_up: bool = False) -> Input:
    pauses: list[tuple[int, int]] = []
    data = b""
    for unit in units:
        if isinstance(unit, bytes):
            data += unit
        elif data and (not pauses or pauses[-1][0] < len(data)):
            pauses.append((len(data), unit))
    return Input(index, mutation, data, tuple(p for p in pauses if p[0] < len(data)), hang_up)


def mutate(session: Sequence[Unit], seed: int, index: int) -> Input:
    """Input ``index`` of run ``seed``: 1-3 mutations of the session (deterministic)."""
    rng = random.Random(f"qpid-flow-fuzz:{seed}:{index}")
    work = list(session)
    names = [_mutate_once(rng, work) for _ in range(rng.choice((1, 1, 1, 1, 2, 3)))]
    hang_up = rng.random() < 0.1  # a client gone before the listener answers
    return from_units(index, "; ".join(names), work, hang_up)


def _mutate_once(rng: random.Random, work: list[Unit]) -> str:
    real = [k for k, unit in enumerate(work) if isinstance(unit, bytes) and unit]
    if not real:
        work[:], real = [SASL_HEADER], [0]
    # Half the time the SASL part: the SASL header, the sasl-init, the AMQP header after it.
    i = rng.choice(real[:3] if rng.random() < 0.5 else real)
    unit = work[i]
    assert isinstance(unit, bytes)
    name = f"{describe(unit)}@{i}"
    op = rng.choices(_OPS, weights=_WEIGHTS)[0]
    parsed = _parse(unit) if op in ("field", "fields") else None
    if (op in ("size", "frame header") and (unit.startswith(b"AMQP") or len(unit) < 8)) or (
        op in ("field", "fields") and parsed is None
    ):
        op = "flip"
    if op == "field" and parsed is not None and parsed.fields:
        f = rng.randrange(len(parsed.fields))
        parsed.fields[f] = rng.choice(_VALUES)
        work[i] = parsed.build()
        return f"{name} field {f} = {parsed.fields[f][:12].hex()}"
    if op in ("field", "fields") and parsed is not None:
        how = rng.choice(("fewer", "more", "count lies"))
        if how == "fewer":
            del parsed.fields[rng.randrange(len(parsed.fields) + 1) :]
            work[i] = parsed.build()
        elif how == "more":
            parsed.fields += [rng.choice(_VALUES) for _ in range(rng.randint(1, 20))]
            work[i] = parsed.build()
        else:
            work[i] = parsed.build(count=rng.choice((0, 1, len(parsed.fields) + 1, 255)))
        return f"{name} fields {how} ({len(parsed.fields)})"
    if op == "flip":
        data = bytearray(unit)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        work[i] = bytes(data)
        return f"{name} bits flipped"
    if op == "byte":
        data = bytearray(unit)
        at = rng.randrange(len(data))
        data[at] = rng.choice(_BYTES) if rng.random() < 0.7 else rng.randrange(256)
        work[i] = bytes(data)
        return f"{name} byte {at} = {data[at]:02x}"
    if op in ("insert", "delete"):
        at = rng.randrange(len(unit) + 1)
        n = rng.choice((1, 1, 2, 4, 16, 100))
        new = unit[:at] + rng.randbytes(n) + unit[at:] if op == "insert" else unit[:at] + unit[at + n :]
        resized = not unit.startswith(b"AMQP") and len(new) >= 8 and rng.random() < 0.5
        work[i] = len(new).to_bytes(4, "big") + new[4:] if resized else new
        return f"{name} {op} {n} at {at}{' resized' if resized else ''}"
    if op == "truncate":
        sizes = [len(u) if isinstance(u, bytes) else 0 for u in work]
        total = sum(sizes)
        cut = rng.randrange(sum(sizes[: real[min(1, len(real) - 1)] + 1]) + 1)  # in the SASL part
        cut = cut if rng.random() < 0.5 else rng.randrange(total)
        kept: list[Unit] = []
        pos = 0
        for u, size in zip(work, sizes, strict=True):
            if pos + size > cut:
                kept.append(u[: cut - pos] if isinstance(u, bytes) else u)
                break
            kept.append(u)
            pos += size
        work[:] = kept
        return f"truncated at {cut} of {total}"
    if op == "duplicate":
        work.insert(i, unit)
        return f"{name} duplicated"
    if op == "drop":
        del work[i]
        return f"{name} dropped"
    if op == "swap":
        j = rng.choice(real)
        other = work[i] = work[j]
        work[j] = unit
        return f"{name} swapped with {describe(other) if isinstance(other, bytes) else other}@{j}"
    if op == "pipelined":
        work[:] = [u for u in work if isinstance(u, bytes)]
        return "pipelined (no waiting for answers)"
    if op == "size":
        size = rng.choice(_SIZES) if rng.random() < 0.8 else rng.randrange(1 << 32)
        work[i] = size.to_bytes(4, "big") + unit[4:]
        return f"{name} size = {size}"
    if op == "frame header":
        data = bytearray(unit)
        at = rng.randrange(4, 8)  # doff, type, channel
        data[at] = rng.choice((0, 1, 2, 3, 0x7F, 0xFF)) if rng.random() < 0.7 else rng.randrange(256)
        work[i] = bytes(data)
        return f"{name} frame header byte {at} = {data[at]:02x}"
    if op == "garbage":
        n = rng.choice((1, 8, 64, 512, 8192))
        if rng.random() < 0.5:
            header = rng.choice((SASL_HEADER, AMQP_HEADER))
            work[:] = [header, rng.randbytes(n)]
            return f"garbage ({n} bytes) after {describe(header)}"
        at = next((k for k in real if work[k] == AMQP_HEADER), real[0])
        work[:] = [*work[: at + 1], rng.randbytes(n)]
        return f"garbage ({n} bytes) after unit {at}"
    # "header": another protocol header in the place of one
    at = i if unit.startswith(b"AMQP") else real[0]
    header = work[at] = rng.choice(_HEADERS)
    return f"protocol header @{at} = {header[:8]!r}"


_OPS_WEIGHTS = {
    "field": 6, "fields": 2, "flip": 3, "byte": 2, "insert": 2, "delete": 2, "truncate": 2, "duplicate": 1,
    "drop": 1, "swap": 1, "pipelined": 1, "size": 2, "frame header": 1, "garbage": 1, "header": 1,
}  # fmt: skip
_OPS = list(_OPS_WEIGHTS)
_WEIGHTS = list(_OPS_WEIGHTS.values())


# --- sending ----------------------------------------------------------------------------------


@dataclass
class Result:
    input: Input
    closed_by_router: bool = False  # EOF or reset before our timeout
    client_port: int = 0
    connect_error: str = ""
    response: bytes = b""
    start: float = 0.0
    end: float = 0.0


def send_one(host: str, port: int, item: Input, read_timeout: float, step_wait: float = 0.1) -> Result:
    """Send one input on a fresh connection, step by step as the client did (after each
    step, until the listener's answer is in, at most ``step_wait``), read until the listener
    closes it or ``read_timeout`` passes, then close."""
    result = Result(item, start=time.monotonic())
    response = bytearray()
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        result.connect_error = f"{type(exc).__name__}: {exc}"
        result.end = time.monotonic()
        return result
    result.client_port = sock.getsockname()[1]
    with sock:
        try:
            for data, more in item.steps():
                sock.settimeout(5)
                sock.sendall(data)
                # Wait for as many units more as the client did (fewer when the last step
                # got fewer: one missing answer costs one step_wait, not one for every step).
                wait_for = _complete_units(response) + more if more > 0 else 0
                deadline = time.monotonic() + (step_wait if wait_for else 0 if item.hang_up else read_timeout)
                while (not wait_for or _complete_units(response) < wait_for) and (
                    left := deadline - time.monotonic()
                ) > 0:
                    sock.settimeout(left)
                    try:
                        chunk = sock.recv(65536)
                    except TimeoutError:
                        break
                    if not chunk:
                        result.closed_by_router = True
                        break
                    if len(response) < 65536:
                        response += chunk
                if result.closed_by_router:
                    break
        except TimeoutError:
            pass  # the listener stopped reading
        except OSError:  # reset by the listener, in sendall or recv
            result.closed_by_router = True
    result.response = bytes(response)
    result.end = time.monotonic()
    return result


def left_open(port: int) -> set[int]:
    """Client ports of the connections to local ``port`` that the client closed and the
    listener did not (CLOSE_WAIT in /proc/net/tcp): each one holds a descriptor."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if state == "08" and int(local.split(":")[1], 16) == port:
            found.add(int(remote.split(":")[1], 16))
    return found


def answers(response: bytes) -> list[str]:
    """What the listener said, briefly: 'sasl-outcome 1', error conditions it named."""
    said = []
    for unit in split_units(response):
        parsed = _parse(unit) if len(unit) > 8 else None
        if describe(unit) == "sasl-outcome" and parsed is not None and parsed.fields:
            said.append(f"sasl-outcome {parsed.fields[0][1:].hex() or '?'}")
    # Error conditions: symbols (sym8), not descriptions; not outcome descriptors (amqp:accepted:list).
    symbols = (m[2 : 2 + m[1]] for m in re.findall(rb"\xa3[\x05-\x40]amqp:[a-z:-]+", response))
    said += sorted({s.decode() for s in symbols if not s.endswith(b":list")})
    return said


@dataclass
class Batch:
    results: list[Result] = field(default_factory=list)
    died: bool = False
    # Inputs in flight, or just ended, after the process was last seen alive.
    suspects: list[Input] = field(default_factory=list)


def send_batch(
    host: str,
    port: int,
    inputs: Sequence[Input],
    alive: Callable[[], bool],
    concurrency: int = 16,
    read_timeout: float = 0.5,
    grace: float = 0.5,
) -> Batch:
    """Each input on its own connection, ``concurrency`` at a time, then ``grace`` seconds to
    die. An input is not sent once the process is seen dead; ``suspects`` are then the ones
    that may have killed it."""
    batch = Batch()
    lock = threading.Lock()
    last_alive = [time.monotonic()]

    def one(item: Input) -> Result | None:
        if batch.died or not alive():
            batch.died = True
            return None
        result = send_one(host, port, item, read_timeout)
        deadline = time.monotonic() + (1.0 if result.connect_error else 0.0)
        while alive() and time.monotonic() < deadline:  # refused: by a process on its way out?
            time.sleep(0.05)
        if alive():
            with lock:
                last_alive[0] = max(last_alive[0], time.monotonic())
        else:
            batch.died = True
            if result.connect_error:
                return None  # refused by a dead process: not sent
        return result

    with ThreadPoolExecutor(concurrency) as pool:
        done = [r for r in pool.map(one, inputs) if r is not None]
    batch.results = done
    deadline = time.monotonic() + grace  # the last inputs' effect may come after their close
    while not batch.died and time.monotonic() < deadline:
        batch.died = not alive()
        time.sleep(0.02)
    if batch.died:
        batch.suspects = [r.input for r in done if r.end >= last_alive[0] - 1.0]
    return batch


def alive(router: RouterProcess) -> Callable[[], bool]:
    return lambda: router.returncode is None


def reproduce(
    suspects: Sequence[Input], start: Callable[[], RouterProcess], wait: float = 0.5
) -> tuple[Input | None, RouterProcess | None]:
    """The suspect that kills a fresh process by itself, and that process: halves of the
    suspects go to fresh processes until one input is left (None when it does not kill)."""
    candidates = list(suspects)
    while candidates:
        router = start()
        half = candidates[: max(1, len(candidates) // 2)]
        if send_batch(router.host, router.port, half, alive(router), 8, wait, wait).died:
            if len(half) == 1:
                return half[0], router
            candidates = half
        elif len(candidates) == 1:
            return None, None
        else:
            candidates = candidates[len(half) :]
    return None, None


@dataclass
class Tally:
    """Figures over a run."""

    inputs: int = 0
    closed_by_router: int = 0
    timed_out: int = 0
    hung_up: int = 0  # we closed at once (Input.hang_up)
    connect_errors: int = 0
    answers: Counter[str] = field(default_factory=Counter)

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            self.inputs += 1
            if r.connect_error:
                self.connect_errors += 1
            elif r.closed_by_router:
                self.closed_by_router += 1
            elif r.input.hang_up:
                self.hung_up += 1
            else:
                self.timed_out += 1
            self.answers.update(answers(r.response))


# --- well-behaved clients -----------------------------------------------------------------


def round_trip(url: str, timeout: float = 30.0) -> None:
    """A fresh client sends one message to a new address, another receives it."""
    address = f"fuzz-check-{uuid.uuid4().hex[:10]}"
    body = f"round trip {address}"
    send_messages(url, address, [Message(body=body)], timeout=timeout)
    got = receive_messages(url, address, 1, timeout=timeout)
    assert [m.body for m in got] == [body], f"round trip through {url}: got {got}"


class Bystander(MessagingHandler):
    """A client connected before the fuzzing: one connection, a sender and a receiver on
    one address, a message every ``interval`` s; never reconnects, notes every loss."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        super().__init__(prefetch=0)
        self.url = url
        self.address = f"fuzz-bystander-{uuid.uuid4().hex[:10]}"
        self.interval = interval
        self.sent = self.received = 0
        self.errors: list[str] = []
        self.ready = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: Container(self).run(), daemon=True)
        self._conn: Any = None
        self._sender: Any = None
        self._receiver: Any = None

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        if not self.ready.wait(timeout):
            raise AssertionError(f"bystander not connected to {self.url} in {timeout}s: {self.errors}")

    def on_start(self, event: Any) -> None:
        self._conn = event.container.connect(self.url, reconnect=False)
        self._sender = event.container.create_sender(self._conn, self.address)
        self._receiver = event.container.create_receiver(self._conn, self.address)
        self._receiver.flow(100)
        event.container.schedule(self.interval, self)

    def on_link_opened(self, event: Any) -> None:
        if self._sender.state & self._sender.REMOTE_ACTIVE and self._receiver.state & self._receiver.REMOTE_ACTIVE:
            self.ready.set()

    def on_timer_task(self, event: Any) -> None:
        if self._stopping.is_set() or self.errors:
            self._conn.close()
            return
        if self._sender.credit:
            self._sender.send(Message(body=self.sent))
            self.sent += 1
        if self._receiver.credit < 50:
            self._receiver.flow(100 - self._receiver.credit)
        event.container.schedule(self.interval, self)

    def on_message(self, event: Any) -> None:
        if event.message.body != self.received:
            self.errors.append(f"message {event.message.body} arrived as number {self.received}")
        self.received += 1

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f"transport error: {event.transport.condition}")

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f"connection closed: {event.connection.remote_condition}")

    def on_session_error(self, event: Any) -> None:
        self.errors.append(f"session ended: {event.session.remote_condition}")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link detached: {event.link.remote_condition}")

    def on_disconnected(self, event: Any) -> None:
        if not self._stopping.is_set():
            self.errors.append("disconnected")

    def probe(self, timeout: float = 30.0) -> bool:
        """True once a message sent from now on has come back on the same connection."""
        target = self.sent + 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.errors:
            if self.received >= target:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(15)


# --- leak check -----------------------------------------------------------------------------

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# What a fuzzed connection may leave behind in resident memory once it is closed, on average
# over a run after the warm-up. With no leak a run measures well under 1 KiB (allocator
# noise, messages a fuzzed session left in a standalone queue); a leak of a connection's
# Proton objects (its transport's buffers: the ~7.5-9 KiB per connection once seen in front
# of RabbitMQ) is several times this.
RSS_PER_CONNECTION = 3 * 1024
# Descriptors allowed above the warm-up level at the end: a client and its upstream socket
# (in front of a broker) whose close is still under way when the wait for it ends, e.g. a
# broker slow to answer a close. A leak strands one or two for every connection affected:
# tens or hundreds over a run, far past this.
FD_SLACK = 2


@dataclass(frozen=True)
class Sample:
    """The listening process's open descriptors and resident memory after ``inputs`` fuzzed connections."""

    inputs: int
    fds: int
    rss: int  # bytes

    def __str__(self) -> str:
        return f"{self.inputs:>7} inputs: {self.fds:>4} fds, RSS {self.rss / 2**20:6.1f} MiB"


def sample(pid: int, inputs: int) -> Sample:
    """Open file descriptors (/proc/PID/fd) and resident bytes (/proc/PID/statm) of ``pid`` now."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return Sample(inputs, fds, pages * _PAGE_SIZE)


def settled_sample(
    pid: int, inputs: int, at_most_fds: int | None = None, timeout: float = 10.0, steady: float = 0.5
) -> Sample:
    """A sample once the connections the fuzzer closed are closed in the process too: its
    descriptor count unchanged for ``steady`` seconds and, when given, at most
    ``at_most_fds``; or the last sample after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = sample(pid, inputs)
    since = time.monotonic()
    while time.monotonic() < deadline:
        if (at_most_fds is None or last.fds <= at_most_fds) and time.monotonic() - since >= steady:
            break
        time.sleep(0.05)
        now = sample(pid, inputs)
        if now.fds != last.fds:
            since = time.monotonic()
        last = now
    return last


@dataclass
class LeakCheck:
    """Samples of one process over a fuzz run. ``baseline``: after the warm-up (the process
    has made what it makes once: destinations, its broker reader, allocator arenas); then the
    end, compared with it: descriptors at most ``fd_slack`` above it, resident memory grown
    by at most ``rss_per_connection`` bytes per fuzzed connection since."""

    pid: int
    fd_slack: int = FD_SLACK
    rss_per_connection: float = RSS_PER_CONNECTION
    samples: list[Sample] = field(default_factory=list)
    baseline: Sample | None = None
    end: Sample | None = None

    def after_batch(self, inputs: int) -> Sample:
        """A sample now (connections of the batch may still be closing)."""
        self.samples.append(sample(self.pid, inputs))
        return self.samples[-1]

    def warmed_up(self, inputs: int) -> Sample:
        self.baseline = settled_sample(self.pid, inputs)
        self.samples.append(self.baseline)
        return self.baseline

    def finish(self, inputs: int, timeout: float = 10.0) -> Sample:
        """The end sample, once the descriptors are back to the baseline (or ``timeout``)."""
        assert self.baseline is not None, "no warm-up sample"
        self.end = settled_sample(self.pid, inputs, self.baseline.fds, timeout)
        self.samples.append(self.end)
        return self.end

    @property
    def connections(self) -> int:
        """Fuzzed connections between the baseline and the end."""
        assert self.baseline is not None and self.end is not None
        return self.end.inputs - self.baseline.inputs

    @property
    def rss_growth_per_connection(self) -> float:
        assert self.baseline is not None and self.end is not None
        return (self.end.rss - self.baseline.rss) / max(self.connections, 1)

    def problems(self) -> list[str]:
        """What leaks, in words (empty: nothing)."""
        assert self.baseline is not None and self.end is not None
        found = []
        if self.end.fds > self.baseline.fds + self.fd_slack:
            found.append(
                f"open descriptors {self.baseline.fds} after the warm-up, {self.end.fds} at the end "
                f"(more than {self.fd_slack} above)"
            )
        if self.rss_growth_per_connection > self.rss_per_connection:
            found.append(
                f"resident memory grew {(self.end.rss - self.baseline.rss) / 2**20:.1f} MiB over "
                f"{self.connections} fuzzed connections: {self.rss_growth_per_connection / 1024:.2f} KiB per "
                f"connection (bound {self.rss_per_connection / 1024:.2f} KiB)"
            )
        return found

    def summary(self) -> str:
        assert self.baseline is not None and self.end is not None
        return (
            f"fds {self.baseline.fds} -> {self.end.fds}, RSS {self.baseline.rss / 2**20:.1f} -> "
            f"{self.end.rss / 2**20:.1f} MiB over {self.connections} connections after the warm-up "
            f"({self.rss_growth_per_connection / 1024:+.2f} KiB per connection, "
            f"{self.rss_growth_per_connection * 1000 / 2**20:+.2f} MiB per 1,000)"
        )

    def table(self) -> str:
        """One sample a line; the two compared (settled) marked."""
        notes = {id(self.baseline): "  <- after the warm-up, settled", id(self.end): "  <- the end, settled"}
        return "\n".join(f"{s}{notes.get(id(s), '')}" for s in self.samples)
