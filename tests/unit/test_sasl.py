"""The sans-IO SASL layer talks to real Proton peers, in memory, and survives any input.

Each Proton peer is a Transport bound to a Connection, driven with push/peek/pop: the same
bytes a socket would carry, without one.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest
from proton import SASL, Connection, Endpoint, Transport

from qpid_flow.security.sasl import (
    AMQP_HEADER,
    OUTCOME_AUTH,
    OUTCOME_OK,
    SASL_HEADER,
    ClientHandshake,
    MechanismsReader,
    SaslInit,
    ServerHandshake,
)

MECHANISMS = ["PLAIN", "ANONYMOUS"]
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
# The sasl-init with a null mechanism that crashes Proton's own SASL server.
CRASH_INPUT = SASL_HEADER + bytes.fromhex("0000000f02010000005341c0020140")

Handshake = ServerHandshake | ClientHandshake


def proton_client(mechanism: str, user: str | None = None, password: str | None = None) -> tuple[Transport, SASL]:
    transport = Transport()
    sasl = transport.sasl()
    sasl.allowed_mechs(mechanism)
    sasl.allow_insecure_mechs = True  # PLAIN over a connection without TLS
    connection = Connection()
    connection.hostname = "broker.example"
    connection.container = "test-client"
    if user is not None:
        connection.user = user
        connection.password = password
    transport.bind(connection)
    connection.open()
    return transport, sasl


def proton_server(mechanisms: str = "ANONYMOUS") -> tuple[Transport, SASL, Connection]:
    transport = Transport(Transport.SERVER)
    sasl = transport.sasl()
    sasl.allowed_mechs(mechanisms)
    connection = Connection()
    transport.bind(connection)
    return transport, sasl, connection


def take_output(transport: Transport) -> bytes:
    pending = transport.pending()
    if pending <= 0:
        return b""
    data = bytes(transport.peek(pending))
    transport.pop(pending)
    return data


def pump(transport: Transport, handshake: Handshake, feed: Callable[[bytes], None] | None = None) -> bytes:
    """Move bytes both ways until both sides are quiet; return what Proton sent the handshake."""
    feed = feed or handshake.receive
    sent = b""
    while True:
        from_proton = take_output(transport) if not transport.closed else b""
        if from_proton:
            feed(from_proton)
            sent += from_proton
        to_proton = handshake.data_to_send()
        if to_proton:
            transport.push(to_proton)
        if not from_proton and not to_proton:
            return sent


def byte_by_byte(handshake: Handshake) -> Callable[[bytes], None]:
    def feed(data: bytes) -> None:
        for i in range(len(data)):
            handshake.receive(data[i : i + 1])

    return feed


def sasl_frame(body: bytes, doff: int = 2) -> bytes:
    """A SASL frame around ``body``; a ``doff`` above 2 pads the header (extended header)."""
    return struct.pack(">IBBH", doff * 4 + len(body), doff, 1, 0) + b"\0" * (doff * 4 - 8) + body


def proton_client_exchange(split: bool) -> tuple[ServerHandshake, Transport, SASL, bytes]:
    transport, sasl = proton_client("PLAIN", "user", "pass")
    server = ServerHandshake(MECHANISMS)
    sent = pump(transport, server, byte_by_byte(server) if split else None)
    return server, transport, sasl, sent


# --- ServerHandshake against a Proton client --------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["whole", "byte-by-byte"])
def test_plain_from_a_proton_client_then_amqp_follows(split: bool) -> None:
    server, transport, sasl, _ = proton_client_exchange(split)
    assert server.error is None
    # Proton (without Cyrus) never sends the connection's hostname in its sasl-init.
    assert server.init == SaslInit("PLAIN", b"\0user\0pass", None)
    assert server.data_to_send() == b""

    server.send_outcome(OUTCOME_OK)
    pump(transport, server, byte_by_byte(server) if split else None)
    assert server.done and server.error is None
    assert sasl.outcome == SASL.OK
    assert transport.condition is None
    assert server.leftover().startswith(AMQP_HEADER)

    # The bytes after SASL are the AMQP layer's: a Proton server without SASL accepts them.
    upstream = Transport(Transport.SERVER)
    connection = Connection()
    upstream.bind(connection)
    upstream.push(server.leftover())
    assert connection.state & Endpoint.REMOTE_ACTIVE
    assert connection.remote_hostname == "broker.example"


def test_long_credentials_use_the_four_byte_size_forms() -> None:
    transport, sasl = proton_client("PLAIN", "user", "p" * 300)
    server = ServerHandshake(MECHANISMS)
    sent = pump(transport, server)
    assert b"\xb0\x00\x00\x01\x32" in sent  # Proton sent the response as vbin32 (306 bytes)
    assert server.init is not None and server.init.initial_response == b"\0user\0" + b"p" * 300

    transport, sasl, _ = proton_server("ANONYMOUS")
    client = ClientHandshake(SaslInit("ANONYMOUS", b"x" * 300, "h" * 300))
    pump(transport, client)
    assert client.error is None and client.outcome == OUTCOME_OK and sasl.outcome == SASL.OK


def test_auth_outcome_fails_the_proton_client() -> None:
    server, transport, sasl, _ = proton_client_exchange(split=False)
    server.send_outcome(OUTCOME_AUTH)
    pump(transport, server)
    assert not server.done
    assert sasl.outcome == SASL.AUTH
    assert transport.condition is not None
    assert transport.condition.name == "amqp:unauthorized-access"


def test_anonymous_from_a_proton_client() -> None:
    transport, sasl = proton_client("ANONYMOUS")
    server = ServerHandshake(MECHANISMS)
    pump(transport, server)
    assert server.init is not None and server.error is None
    assert server.init.mechanism == "ANONYMOUS"
    server.send_outcome(OUTCOME_OK)
    pump(transport, server)
    assert sasl.outcome == SASL.OK
    assert server.leftover().startswith(AMQP_HEADER)


def test_the_proton_crash_input_is_refused_with_an_auth_outcome() -> None:
    server = ServerHandshake(MECHANISMS)
    server.receive(CRASH_INPUT)
    out = server.data_to_send()
    assert server.error is not None and server.init is None
    assert out.startswith(SASL_HEADER)
    assert out.endswith(sasl_frame(bytes.fromhex("005344c003015001")))  # sasl-outcome code 1

    # And a Proton client reads that outcome as an authentication failure.
    transport, sasl = proton_client("ANONYMOUS")
    take_output(transport)
    transport.push(out)
    assert sasl.outcome == SASL.AUTH


@pytest.mark.parametrize(
    "init_body",
    [
        "005341c0020140",  # mechanism null
        "00534145",  # no fields at all (list0)
        "005341c00301a300",  # empty symbol
        "005341c00801a105504c41494e",  # a string, not a symbol
        "005341c00801a305504c41494f",  # "PLAIO": not offered
    ],
)
def test_a_bad_mechanism_gets_an_auth_outcome(init_body: str) -> None:
    server = ServerHandshake(MECHANISMS)
    server.receive(SASL_HEADER + sasl_frame(bytes.fromhex(init_body)))
    assert server.error is not None and server.error.startswith("sasl-init mechanism")
    assert server.init is None
    assert server.data_to_send().endswith(sasl_frame(bytes.fromhex("005344c003015001")))


def test_the_amqp_header_means_no_sasl() -> None:
    server = ServerHandshake(MECHANISMS)
    server.receive(AMQP_HEADER[:3])
    assert not server.no_sasl
    server.receive(AMQP_HEADER[3:] + b"open...")
    assert server.no_sasl and server.error is None and server.init is None
    assert server.data_to_send() == b""
    assert server.leftover() == AMQP_HEADER + b"open..."


@pytest.mark.parametrize("header", [TLS_HEADER, b"GET / HTTP/1.1\r\n"])
def test_another_header_is_answered_with_sasls_then_an_error(header: bytes) -> None:
    server = ServerHandshake(MECHANISMS)
    server.receive(header)
    assert server.error is not None
    assert server.data_to_send() == SASL_HEADER


def test_descriptor_forms_heartbeats_and_a_pipelined_amqp_header() -> None:
    fields = bytes.fromhex("c00801a305504c41494e")  # [:PLAIN]
    symbolic = b"\x00\xa3\x13amqp:sasl-init:list" + fields
    ulong = b"\x00\x80" + (0x41).to_bytes(8, "big") + fields
    for body in (symbolic, ulong):
        server = ServerHandshake(MECHANISMS)
        server.receive(SASL_HEADER + sasl_frame(b"") + sasl_frame(body, doff=3))  # a heartbeat first
        assert server.error is None
        assert server.init == SaslInit("PLAIN", None, None)
    # A client may send its AMQP header without waiting for the outcome: it is kept, not parsed.
    server.receive(AMQP_HEADER)
    server.send_outcome(OUTCOME_OK)
    assert server.leftover() == AMQP_HEADER


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (struct.pack(">IBBH", 70000, 2, 1, 0), "size"),
        (struct.pack(">IBBH", 4, 2, 1, 0), "size"),
        (struct.pack(">IBBH", 16, 1, 1, 0), "offset"),
        (struct.pack(">IBBH", 16, 5, 1, 0), "offset"),
        (struct.pack(">IBBH", 16, 2, 0, 0), "type"),
        (sasl_frame(bytes.fromhex("005344c003015000")), "sasl-outcome"),
        (sasl_frame(bytes.fromhex("005345c0020140")), "descriptor"),
        (sasl_frame(bytes.fromhex("005341c00701a30a504c41494e")), "past the end"),
    ],
)
def test_frame_errors(frame: bytes, reason: str) -> None:
    server = ServerHandshake(MECHANISMS)
    server.receive(SASL_HEADER + frame)
    assert server.error is not None and reason in server.error
    server.receive(b"more")  # after an error, bytes are only buffered
    assert server.leftover().endswith(b"more")


# --- ClientHandshake against a Proton server --------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["whole", "byte-by-byte"])
def test_replaying_an_init_to_a_proton_server(split: bool) -> None:
    transport, sasl, connection = proton_server("ANONYMOUS")
    client = ClientHandshake(SaslInit("ANONYMOUS", b"anonymous", None))
    assert not client.done
    pump(transport, client, byte_by_byte(client) if split else None)
    assert client.error is None
    assert client.offered == ("ANONYMOUS",)
    assert client.done and client.outcome == OUTCOME_OK and client.additional_data is None
    assert sasl.outcome == SASL.OK and sasl.user == "anonymous"

    # The upstream socket now carries plain AMQP: a Proton client without SASL continues.
    amqp = Transport()
    amqp_connection = Connection()
    amqp_connection.container = "qpid-flow"
    amqp.bind(amqp_connection)
    amqp_connection.open()
    transport.push(client.leftover() + take_output(amqp))
    assert connection.state & Endpoint.REMOTE_ACTIVE


def test_a_mechanism_the_broker_does_not_offer() -> None:
    transport, _, _ = proton_server("ANONYMOUS")
    client = ClientHandshake(SaslInit("PLAIN", b"\0user\0pass", "broker.example"))
    pump(transport, client)
    assert client.error is not None and "ANONYMOUS" in client.error
    assert client.offered == ("ANONYMOUS",) and not client.done


@pytest.mark.parametrize("split", [False, True])
def test_the_mechanisms_a_server_offers_are_read_in_its_order(split: bool) -> None:
    """What qpid-flow learns from a broker before any client asks (it offers clients the same)."""
    server = ServerHandshake(["ANONYMOUS", "AMQPLAIN", "PLAIN"])
    reader = MechanismsReader()
    server.receive(reader.data_to_send())
    answer = server.data_to_send()
    for piece in [answer[i : i + 1] for i in range(len(answer))] if split else [answer]:
        reader.receive(piece)
    assert reader.error is None and reader.offered == ("ANONYMOUS", "AMQPLAIN", "PLAIN")
    wrong = MechanismsReader()
    wrong.receive(AMQP_HEADER)
    assert wrong.error is not None and wrong.offered is None


def test_an_init_with_every_field_is_accepted_by_a_proton_server() -> None:
    transport, sasl, _ = proton_server("ANONYMOUS")
    client = ClientHandshake(SaslInit("ANONYMOUS", b"someone", "broker.example"))
    pump(transport, client)
    assert client.error is None and client.outcome == OUTCOME_OK and sasl.outcome == SASL.OK


def test_proton_without_cyrus_offers_no_plain() -> None:
    # Proton's built-in SASL server knows only ANONYMOUS and EXTERNAL: asked for PLAIN, it
    # offers an empty array. The error must say so rather than fail on the empty list.
    transport, sasl, _ = proton_server("PLAIN")
    sasl.allow_insecure_mechs = True
    client = ClientHandshake(SaslInit("PLAIN", b"\0user\0pass", None))
    pump(transport, client)
    assert client.offered == ()
    assert client.error == "the broker does not offer PLAIN; it offers []"


def test_client_refuses_a_broker_without_sasl_or_with_a_challenge() -> None:
    client = ClientHandshake(SaslInit("PLAIN", b"\0u\0p", None))
    client.receive(AMQP_HEADER)
    assert client.error is not None and "does not use SASL" in client.error

    client = ClientHandshake(SaslInit("PLAIN", b"\0u\0p", None))
    mechanisms = sasl_frame(bytes.fromhex("005340c00801a305504c41494e"))  # a single symbol, not an array
    client.receive(SASL_HEADER + mechanisms)
    assert client.error is None and client.offered == ("PLAIN",)
    client.receive(sasl_frame(bytes.fromhex("005342c00301a000")))
    assert client.error is not None and "challenge" in client.error


def test_no_init_means_no_sasl_upstream() -> None:
    client = ClientHandshake(None)
    assert client.done and client.data_to_send() == b""
    client.receive(AMQP_HEADER)
    assert client.leftover() == AMQP_HEADER and client.error is None


# --- fuzz: mutated real exchanges, random splits -----------------------------------------


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == 2:
            del buf[pos : pos + rng.randint(1, 8)]
        elif kind == 3:
            del buf[pos:]
        elif kind == 4:
            buf += rng.randbytes(rng.randint(1, 40))
        elif kind == 5 and len(buf) > 4:  # another protocol id: AMQP, TLS, SASL
            buf[4] = rng.choice([0, 2, 3])
        elif len(buf) >= 12:  # a random size field in the first frame (after the header)
            size = rng.choice([0, 7, 8, 9, 15, len(buf) - 8, 0xFFFFFFFF, rng.randrange(1 << 32)])
            buf[8:12] = size.to_bytes(4, "big")
    return bytes(buf)


def feed_in_splits(handshake: Handshake, data: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 12)
        handshake.receive(data[pos : pos + n])
        pos += n


def state(h: Handshake) -> tuple[object, ...]:
    if isinstance(h, ServerHandshake):
        return h.init, h.no_sasl, h.error, h.data_to_send()
    return h.outcome, h.additional_data, h.offered, h.error, h.done, h.data_to_send()


def test_fuzz_the_server_with_a_mutated_proton_client() -> None:
    _, _, _, recorded = proton_client_exchange(split=False)
    rng = random.Random(20240517)
    seen = set()
    for _ in range(5000):
        data = mutate(recorded, rng)
        split, whole = ServerHandshake(MECHANISMS), ServerHandshake(MECHANISMS)
        feed_in_splits(split, data, rng)
        whole.receive(data)
        assert state(split) == state(whole), data.hex()
        if split.init is not None:
            assert split.error is None and split.init.mechanism in MECHANISMS
            seen.add("init")
        elif split.no_sasl:
            assert split.error is None and split.leftover() == data
            seen.add("no_sasl")
        elif split.error is not None:
            assert not split.error.startswith("unreadable"), split.error  # the catch-all is for bugs
            seen.add("error")
        else:
            seen.add("waiting")
    assert seen == {"init", "no_sasl", "error", "waiting"}


def test_fuzz_the_client_with_a_mutated_proton_server() -> None:
    transport, _, _ = proton_server("ANONYMOUS")
    client = ClientHandshake(SaslInit("ANONYMOUS", b"anonymous", None))
    recorded = pump(transport, client)
    assert client.outcome == OUTCOME_OK
    rng = random.Random(20240518)
    seen = set()
    for _ in range(3000):
        data = mutate(recorded, rng)
        init = SaslInit("ANONYMOUS", b"anonymous", None)
        split, whole = ClientHandshake(init), ClientHandshake(init)
        feed_in_splits(split, data, rng)
        whole.receive(data)
        assert state(split) == state(whole), data.hex()
        if split.error is not None:
            assert not split.error.startswith("unreadable"), split.error
            assert not split.done
            seen.add("error")
        elif split.done:
            assert split.outcome is not None and 0 <= split.outcome <= 255 and split.offered
            seen.add("done")
        else:
            seen.add("waiting")
    assert seen == {"error", "done", "waiting"}
