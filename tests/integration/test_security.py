"""Security with real clients (Proton and rhea) against the real qpid-flow process:
TLS, PLAIN against a users file, EXTERNAL from a client certificate, anonymous only where
allowed, per-user ACLs on attach and on anonymous-relay transfers, connection / session /
link limits, idle and SASL deadlines, in both modes (docs/security.md).

Each refusal is checked for its AMQP condition, and a bystander connected before the
trouble keeps round-tripping messages: one client's refusal stays its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Endpoint, Message, SSLDomain
from proton.utils import BlockingConnection, LinkDetached, SendException

from qpid_flow.security.sasl import MechanismsReader
from qpid_flow.security.users import UsersFile

from .harness.broker import Broker, BrokerError
from .harness.certs import Certificates, foreign_client, make_certificates
from .harness.forwarder import Forwarder
from .harness.net import free_port
from .harness.rabbitmq import RabbitMQBroker
from .harness.rawclient import RawClient
from .harness.router import RouterProcess, StartRouter
from .harness.scenario import run_rhea

UNAUTHORIZED = "amqp:unauthorized-access"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    users = UsersFile()
    users.add("alice", "alice-secret")
    users.add("bob", "bob-secret")
    path = tmp_path_factory.mktemp("users") / "users"
    users.save(path)
    return path


@dataclass
class Secured:
    """A qpid-flow with a plain and a TLS listener."""

    process: RouterProcess
    plain: int
    tls: int

    def url(self, user: str | None = None, password: str | None = None, tls: bool = False) -> str:
        credentials = f"{user}:{password}@" if user is not None else ""
        if tls:
            return f"amqps://{credentials}localhost:{self.tls}"
        return f"amqp://{credentials}127.0.0.1:{self.plain}"


def start_secured(
    start: StartRouter,
    certificates: Certificates,
    settings: str = "",
    broker_url: str | None = None,
) -> Secured:
    plain, tls = free_port(), free_port()
    config = f"""
listen = ["127.0.0.1:{plain}", "amqps://127.0.0.1:{tls}"]
tls_cert = "{certificates.server.cert}"
tls_key = "{certificates.server.key}"
tls_ca = "{certificates.ca}"
{settings}
"""
    process = start(
        broker_url=broker_url, config_text=config, extra_args=["--listen", f"127.0.0.1:{plain},amqps://127.0.0.1:{tls}"]
    )
    return Secured(process, plain, tls)


def client_domain(certificates: Certificates, client: Any = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(certificates.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if client is not None:
        domain.set_credentials(str(client.cert), str(client.key), None)
    return domain


def connect(url: str, **options: Any) -> BlockingConnection:
    return BlockingConnection(url, timeout=10, **options)


def round_trip(connection: BlockingConnection, address: str) -> str:
    body = f"hello {address} {time.monotonic()}"
    sender = connection.create_sender(address, name=f"{address}-out-{body}")
    sender.send(Message(body=body))
    receiver = connection.create_receiver(address, name=f"{address}-in-{body}")
    message = receiver.receive(timeout=10)
    receiver.accept()
    # Links stay attached: RabbitMQ answers a close with a detach that is not one, which a
    # BlockingConnection would wait for until its timeout (directly as through qpid-flow).
    assert message.body == body
    return str(message.body)


def refusal_of(exc: BaseException) -> str:
    """The AMQP condition name in a Proton BlockingConnection error."""
    text = str(exc)
    for name in (UNAUTHORIZED, RESOURCE_LIMIT, "amqp:connection:forced", "amqp:not-found"):
        if name in text:
            return name
    return text


@pytest.fixture
def bystander_factory() -> Iterator[list[BlockingConnection]]:
    opened: list[BlockingConnection] = []
    yield opened
    for connection in opened:
        with contextlib.suppress(Exception):
            connection.close()


# --- TLS and sign-in ---------------------------------------------------------------------------


def test_tls_round_trip_with_plain_and_external(
    qpid_flow_process: StartRouter, certificates: Certificates, users_file: Path
) -> None:
    router = start_secured(qpid_flow_process, certificates, f'users_file = "{users_file}"')
    # PLAIN inside TLS, Proton.
    with_password = connect(
        router.url("alice", "alice-secret", tls=True), ssl_domain=client_domain(certificates), allowed_mechs="PLAIN"
    )
    round_trip(with_password, "tls.plain")
    with_password.close()
    # EXTERNAL: the certificate's common name is the identity.
    carol = certificates.client("carol")
    with_certificate = connect(
        router.url(tls=True), ssl_domain=client_domain(certificates, carol), allowed_mechs="EXTERNAL"
    )
    round_trip(with_certificate, "tls.external")
    with_certificate.close()
    log = router.process.log_text()
    assert '"user": "alice"' in log and '"user": "carol"' in log
    # rhea, a second library: PLAIN over TLS, then EXTERNAL with a client certificate.
    sent = run_rhea(router.url("bob", "bob-secret", tls=True), "send", "tls.rhea", "3", env=_rhea_tls(certificates))
    assert sent["outcomes"] == {"accepted": 3}, sent
    received = run_rhea(router.url(tls=True), "receive", "tls.rhea", "3", env=_rhea_tls(certificates, carol))
    assert received["received"] == ["rhea-0", "rhea-1", "rhea-2"], received


def _rhea_tls(certificates: Certificates, client: Any = None) -> dict[str, str]:
    env = {"RHEA_TLS_CA": str(certificates.ca)}
    if client is not None:
        env |= {"RHEA_TLS_CERT": str(client.cert), "RHEA_TLS_KEY": str(client.key)}
    return env


def test_plain_right_wrong_and_anonymous_refused_once_users_exist(
    qpid_flow_process: StartRouter, certificates: Certificates, users_file: Path, bystander_factory: list[Any]
) -> None:
    router = start_secured(qpid_flow_process, certificates, f'users_file = "{users_file}"')
    bystander = connect(router.url("bob", "bob-secret"), allowed_mechs="PLAIN")
    bystander_factory.append(bystander)
    alice = connect(router.url("alice", "alice-secret"), allowed_mechs="PLAIN")
    round_trip(alice, "plain.right")
    alice.close()
    with pytest.raises(ConnectionException) as wrong:
        connect(router.url("alice", "not-her-password"), allowed_mechs="PLAIN")
    assert refusal_of(wrong.value) == UNAUTHORIZED
    with pytest.raises(ConnectionException) as unknown:
        connect(router.url("mallory", "alice-secret"), allowed_mechs="PLAIN")
    assert refusal_of(unknown.value) == UNAUTHORIZED
    with pytest.raises(ConnectionException) as anonymous:
        connect(router.url(), allowed_mechs="ANONYMOUS")
    assert refusal_of(anonymous.value) == UNAUTHORIZED
    # A client that skips SASL altogether is refused too (AMQP answers with the SASL header).
    with socket.create_connection(("127.0.0.1", router.plain), timeout=5) as raw:
        raw.sendall(b"AMQP\x00\x01\x00\x00")
        assert _read_until_closed(raw).startswith(b"AMQP\x03\x01\x00\x00")
    rhea_wrong = run_rhea(router.url("alice", "wrong"), "send", "plain.rhea", "1")
    assert rhea_wrong["sent"] == 0 and rhea_wrong["errors"], rhea_wrong
    rhea_right = run_rhea(router.url("alice", "alice-secret"), "send", "plain.rhea", "1")
    assert rhea_right["outcomes"] == {"accepted": 1}, rhea_right
    round_trip(bystander, "plain.bystander")


def _sasl_outcomes(port: int, clients: int, user: str, password: str) -> list[int | None]:
    """``clients`` raw connections from this host send a PLAIN sasl-init at once; the
    sasl-outcome code each gets (0 ok, 1 auth, 4 sys-temp)."""
    from qpid_flow.security.sasl import SASL_HEADER, ClientHandshake, SaslInit

    init = ClientHandshake(SaslInit("PLAIN", f"\0{user}\0{password}".encode(), None))._init_frame
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(clients)]
    for sock in sockets:
        sock.sendall(SASL_HEADER + init)
    codes: list[int | None] = []
    for sock in sockets:
        data = b""
        while b"\x00\x53\x44" not in data or len(data) < data.find(b"\x00\x53\x44") + 8:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        at = data.find(b"\x00\x53\x44")  # the sasl-outcome descriptor; its list's first field is the code
        codes.append(data[at + 7] if at >= 0 else None)
        sock.close()
    return codes


def test_sign_ins_beyond_the_checks_under_way_are_told_to_try_later_not_refused(
    qpid_flow_process: StartRouter, certificates: Certificates, users_file: Path
) -> None:
    """24 clients of one host sign in at once with the right password, as a reconnect storm
    after a restart does: 16 checks run, the others are answered sys-temp (try again). They
    were answered auth (a wrong password), which qpid-jms takes as final."""
    router = start_secured(qpid_flow_process, certificates, f'users_file = "{users_file}"')
    codes = _sasl_outcomes(router.plain, 24, "alice", "alice-secret")
    assert set(codes) == {0, 4} and codes.count(0) >= 16, codes
    assert _sasl_outcomes(router.plain, 1, "alice", "not-her-password") == [1]


def test_anonymous_allowed_beside_users_when_configured(
    qpid_flow_process: StartRouter, certificates: Certificates, users_file: Path
) -> None:
    router = start_secured(qpid_flow_process, certificates, f'users_file = "{users_file}"\nallow_anonymous = true')
    anonymous = connect(router.url(), allowed_mechs="ANONYMOUS")
    round_trip(anonymous, "anonymous.allowed")
    anonymous.close()


def test_client_certificates_required_and_verified(qpid_flow_process: StartRouter, certificates: Certificates) -> None:
    router = start_secured(qpid_flow_process, certificates, "tls_require_client_cert = true\nallow_anonymous = false")
    dave = certificates.client("dave")
    trusted = connect(router.url(tls=True), ssl_domain=client_domain(certificates, dave), allowed_mechs="EXTERNAL")
    round_trip(trusted, "cert.required")
    trusted.close()
    with pytest.raises(ConnectionException):
        connect(router.url(tls=True), ssl_domain=client_domain(certificates), allowed_mechs="EXTERNAL")
    stranger = foreign_client(certificates.folder, "eve")
    with pytest.raises(ConnectionException):
        connect(router.url(tls=True), ssl_domain=client_domain(certificates, stranger), allowed_mechs="EXTERNAL")
    # Without a certificate nothing is left to sign in with on the plain listener either.
    with pytest.raises(ConnectionException):
        connect(router.url(), allowed_mechs="ANONYMOUS")
    assert router.process.returncode is None


# --- authorization -------------------------------------------------------------------------------

ACL = """
[[acl]]
user = "alice"
send = ["a.>"]
receive = ["a.>"]

[[acl]]
user = "alice"
action = "deny"
send = ["b.>"]

[[acl]]
user = "*"
send = ["public.>"]
receive = ["public.>"]
"""


def _check_acl(router_url: str, prefix: str, bystander: BlockingConnection, **options: Any) -> None:
    """alice may use a.> both ways, not b.>; anyone may use public.>; what no entry allows is denied."""
    alice = connect(router_url, **options)
    round_trip(alice, f"a.{prefix}")
    round_trip(alice, f"public.{prefix}")
    for attach in (alice.create_sender, alice.create_receiver):
        with pytest.raises(LinkDetached) as refused:
            attach(f"b.{prefix}")
        assert refusal_of(refused.value) == UNAUTHORIZED
        assert f"b.{prefix}" in str(refused.value)
    with pytest.raises(LinkDetached) as unlisted:
        alice.create_receiver(f"c.{prefix}")
    assert refusal_of(unlisted.value) == UNAUTHORIZED
    # Anonymous relay: checked per transfer's `to`.
    relay = alice.create_sender(None)
    relay.send(Message(address=f"a.{prefix}", body="relayed"))
    with pytest.raises(SendException) as rejected:
        relay.send(Message(address=f"b.{prefix}", body="not allowed"))
    assert rejected.value.state == Delivery.REJECTED
    relay.close()
    receiver = alice.create_receiver(f"a.{prefix}", name="relayed")
    assert receiver.receive(timeout=10).body == "relayed"
    receiver.accept()
    alice.close()
    round_trip(bystander, f"public.{prefix}.bystander")


def test_acl_standalone(
    qpid_flow_process: StartRouter, certificates: Certificates, users_file: Path, bystander_factory: list[Any]
) -> None:
    router = start_secured(qpid_flow_process, certificates, f'users_file = "{users_file}"\n{ACL}')
    bystander = connect(router.url("bob", "bob-secret"))
    bystander_factory.append(bystander)
    _check_acl(router.url("alice", "alice-secret"), "standalone", bystander)
    with pytest.raises(LinkDetached) as bob_refused:
        bystander.create_sender("a.standalone")
    assert refusal_of(bob_refused.value) == UNAUTHORIZED
    round_trip(bystander, "public.still-fine")
    # rhea sees the same refusal on its link, and the allowed address works for it.
    denied = run_rhea(router.url("alice", "alice-secret"), "send", "b.rhea", "1")
    assert ["link", UNAUTHORIZED] in denied["errors"] and denied["outcomes"] == {}, denied
    allowed = run_rhea(router.url("alice", "alice-secret"), "send", "a.rhea", "1")
    assert allowed["outcomes"] == {"accepted": 1}, allowed


def test_acl_in_front_of_rabbitmq(
    qpid_flow_process: StartRouter, certificates: Certificates, rabbitmq: Broker, bystander_factory: list[Any]
) -> None:
    """In front of a broker the identity is the one the broker authenticated (PLAIN passed
    through); qpid-flow's ACL applies to it on top of the broker's own permissions.

    The clients ask for PLAIN: offered RabbitMQ's list (ANONYMOUS AMQPLAIN PLAIN), as at
    RabbitMQ itself, Proton's client would otherwise sign in ANONYMOUS whatever its URL
    says (test_transparency.py)."""
    user, password = rabbitmq.user, rabbitmq.password
    acl = ACL.replace('user = "alice"', f'user = "{user}"')
    router = start_secured(qpid_flow_process, certificates, acl, broker_url=rabbitmq.url)
    bystander = connect(router.url(user, password), allowed_mechs="PLAIN")
    bystander_factory.append(bystander)
    _check_acl(router.url(user, password), "broker", bystander, allowed_mechs="PLAIN")
    with pytest.raises(ConnectionException) as wrong:
        connect(router.url(user, "wrong-password"), allowed_mechs="PLAIN")
    assert refusal_of(wrong.value) == UNAUTHORIZED
    # TLS on the listener in front of the broker too.
    tls = connect(router.url(user, password, tls=True), ssl_domain=client_domain(certificates), allowed_mechs="PLAIN")
    round_trip(tls, "public.broker.tls")
    tls.close()


GUEST_DENIED_ACL = """
[[acl]]
user = "guest"
action = "deny"
send = ["anon.secret.>"]

[[acl]]
user = "*"
send = [">"]
receive = [">"]
"""


@pytest.mark.parametrize("sign_in", ["ANONYMOUS", "no SASL"])
def test_acl_for_the_user_rabbitmq_signs_anonymous_clients_in_as(
    sign_in: str, qpid_flow_process: StartRouter, certificates: Certificates, rabbitmq: Broker
) -> None:
    """RabbitMQ signs a client in as ``guest`` (its amqp1_0.default_user) when it uses
    ANONYMOUS or skips SASL: a deny written for ``guest`` holds for it too. (The ACLs
    named it ``anonymous``: choosing ANONYMOUS got past every rule for guest.)"""
    router = start_secured(qpid_flow_process, certificates, GUEST_DENIED_ACL, broker_url=rabbitmq.url)
    options = {"allowed_mechs": "ANONYMOUS"} if sign_in == "ANONYMOUS" else {"sasl_enabled": False}
    client = connect(router.url(), **options)
    with pytest.raises(LinkDetached) as refused:
        client.create_sender("anon.secret.orders")
    assert refusal_of(refused.value) == UNAUTHORIZED
    round_trip(client, "anon.public")  # what the deny does not name still goes
    client.close()


FORMS_ACL = """
[[acl]]
user = "*"
action = "deny"
send = ["/queue/forms.orders", "/exchange/>", "/topic/>", "/queue/%2Fforms.secret"]
receive = ["/amq/queue/forms.pay.*"]

[[acl]]
user = "*"
send = [">"]
receive = [">"]
"""


def test_acl_patterns_in_rabbitmq_address_forms(
    qpid_flow_process: StartRouter, certificates: Certificates, rabbitmq: Broker, bystander_factory: list[Any]
) -> None:
    """A deny written as ``/queue/X`` guards queue X however a client writes it, and
    ``/exchange/>`` and ``/topic/>`` (what docs/security.md tells operators to deny) guard
    every exchange and topic address. (The patterns were compared with the queue's bare
    name, and ``/exchange/>`` was one literal segment: every one of these attaches opened.)"""
    user, password = rabbitmq.user, rabbitmq.password
    router = start_secured(qpid_flow_process, certificates, FORMS_ACL, broker_url=rabbitmq.url)
    client = connect(router.url(user, password), allowed_mechs="PLAIN")
    bystander_factory.append(client)
    denied = [
        (client.create_sender, "forms.orders"),
        (client.create_sender, "/queue/forms.orders"),
        (client.create_sender, "/amq/queue/forms.orders"),
        (client.create_sender, "/exchange/amq.direct/forms.orders"),
        (client.create_sender, "/exchange/amq.topic/a.b"),
        (client.create_sender, "/topic/a.b"),
        # Queue "/forms.secret": a name that starts with "/" was taken for an exchange's.
        (client.create_sender, "/queue/%2Fforms.secret"),
        (client.create_sender, "/amq/queue/%2Fforms.secret"),
        (client.create_receiver, "forms.pay.eu"),
        (client.create_receiver, "/queue/forms.pay.eu"),
    ]
    for attach, address in denied:
        with pytest.raises(LinkDetached) as refused:
            attach(address)
        assert refusal_of(refused.value) == UNAUTHORIZED, address
    relay = client.create_sender(None)
    with pytest.raises(SendException) as rejected:
        relay.send(Message(address="/queue/forms.orders", body="not allowed"))
    assert rejected.value.state == Delivery.REJECTED
    relay.close()
    # What no deny names is allowed, in every form.
    round_trip(client, "forms.orders.other")
    round_trip(client, "/queue/forms.pay")
    client.create_receiver("/topic/a.b")
    client.create_receiver("forms.orders")


# --- limits --------------------------------------------------------------------------------------


def test_connection_limits_total_and_per_user(
    qpid_flow_process: StartRouter, certificates: Certificates, users_file: Path
) -> None:
    router = start_secured(
        qpid_flow_process,
        certificates,
        f'users_file = "{users_file}"\nmax_connections = 3\nmax_connections_per_user = 2',
    )
    alice = [connect(router.url("alice", "alice-secret")) for _ in range(2)]
    with pytest.raises(ConnectionException) as per_user:
        connect(router.url("alice", "alice-secret"))
    assert refusal_of(per_user.value) == RESOURCE_LIMIT
    assert "max_connections_per_user" in str(per_user.value)
    bob = connect(router.url("bob", "bob-secret"))
    with pytest.raises(ConnectionException) as total:
        connect(router.url("bob", "bob-secret"))
    assert refusal_of(total.value) == RESOURCE_LIMIT
    assert "max_connections" in str(total.value)
    round_trip(alice[0], "limits.connections")  # those let in are unaffected
    alice[1].close()
    again = connect(router.url("alice", "alice-secret"))  # a freed place can be taken again
    round_trip(again, "limits.connections.again")
    for connection in (alice[0], bob, again):
        connection.close()
    assert '"event": "connection_refused"' in router.process.log_text()


def test_session_and_link_limits(qpid_flow_process: StartRouter, certificates: Certificates) -> None:
    router = start_secured(
        qpid_flow_process, certificates, "max_sessions_per_connection = 2\nmax_links_per_connection = 3"
    )
    connection = connect(router.url())
    links = [connection.create_receiver(f"limits.link.{n}") for n in range(3)]
    with pytest.raises(LinkDetached) as over:
        connection.create_receiver("limits.link.3")
    assert refusal_of(over.value) == RESOURCE_LIMIT
    links[0].close()
    connection.create_receiver("limits.link.4")  # a detached link frees its place
    connection.close()
    # Sessions: Proton's BlockingConnection opens one per link; a raw engine checks the end.
    assert _session_refusal(router.plain, sessions=3) == [None, None, RESOURCE_LIMIT]
    # A detach that does not close (a JMS durable subscriber's), and the end of a session,
    # free a link's place too: they were counted for the connection's life.
    assert _links_after(router.plain, "detach") == [None, None]
    assert _links_after(router.plain, "end session") == [None, None]


def _links_after(port: int, how: str) -> list[str | None]:
    """Three links (the limit) go by ``how``; then two more attach: their refusals."""
    client = RawClient(port)
    client.connection.open()
    session = client.connection.session()
    session.open()
    first = [session.receiver(f"limits.free.{n}") for n in range(3)]
    for link in first:
        link.source.address = link.name
        link.open()
    client.pump(lambda: all(link.state & Endpoint.REMOTE_ACTIVE for link in first))
    if how == "detach":
        for link in first:
            link.detach()
        # Fixed: a detach that does not close changes no state to wait on; 1 s for the answers.
        client.pump(lambda: False, 1)
    else:
        session.close()
        client.pump(lambda: bool(session.state & Endpoint.REMOTE_CLOSED))
        session = client.connection.session()
        session.open()
    later = [session.receiver(f"limits.later.{n}") for n in range(2)]
    for link in later:
        link.source.address = link.name
        link.open()
    client.pump(lambda: all(link.state & (Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED) for link in later))
    answers = [link.remote_condition.name if link.remote_condition else None for link in later]
    client.close()
    return answers


def _session_refusal(port: int, sessions: int) -> list[str | None]:
    client = RawClient(port)
    client.connection.open()
    opened = []
    for _ in range(sessions):
        session = client.connection.session()
        session.open()
        opened.append(session)

    def answered() -> bool:
        return all(s.state & (Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED) for s in opened)

    client.pump(answered)
    client.close()
    return [s.remote_condition.name if s.remote_condition else None for s in opened]


def _read_until_closed(sock: socket.socket, timeout: float = 10) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_sasl_deadline_and_idle_timeout_drop_silent_peers(
    qpid_flow_process: StartRouter, certificates: Certificates
) -> None:
    router = start_secured(qpid_flow_process, certificates, 'sasl_timeout = "1s"\nidle_timeout = "2s"')
    # Connected, never speaks: dropped at the SASL deadline.
    with socket.create_connection(("127.0.0.1", router.plain), timeout=10) as silent:
        started = time.monotonic()
        assert _read_until_closed(silent) == b""
        assert time.monotonic() - started < 8
    # Signed in and opened, then silent: dropped by the advertised idle timeout.
    idle = RawClient(router.plain)
    idle.connection.open()
    assert idle.pump(lambda: idle.connection.state & Endpoint.REMOTE_ACTIVE)
    # Proton advertises half its own timeout: the open frame asks for a keep-alive within
    # 1 s, and silence closes after idle_timeout (2 s) at the soonest, twice it at the
    # latest (it could close after 1 s, half).
    assert idle.transport.remote_idle_timeout == 1.0
    started = time.monotonic()
    answer = _read_until_closed(idle.sock)  # from now on the client says nothing at all
    assert 1.9 < time.monotonic() - started < 6
    idle.close()
    assert b"amqp:resource-limit-exceeded" in answer  # Proton's local-idle-timeout close
    # A client that keeps talking is not affected. (A BlockingConnection sends keep-alives only
    # while the test is inside one of its calls: it could not wait beside the silent ones.)
    live = connect(router.url())
    round_trip(live, "deadline.live")
    live.close()
    assert router.process.returncode is None


# --- TLS to the broker ---------------------------------------------------------------------------


@pytest.fixture
def tls_rabbitmq(certificates: Certificates) -> Iterator[RabbitMQBroker]:
    """A private RabbitMQ with a TLS listener (certificate for localhost, signed by the test CA)."""
    broker = RabbitMQBroker(tls=(certificates.ca, certificates.server.cert, certificates.server.key))
    try:
        broker.start()
    except BrokerError as exc:
        pytest.fail(f"RabbitMQ with TLS did not start: {exc}", pytrace=False)
    yield broker
    broker.stop()


def test_tls_to_the_broker(
    qpid_flow_process: StartRouter, certificates: Certificates, tls_rabbitmq: RabbitMQBroker
) -> None:
    broker = f"amqps://{tls_rabbitmq.user}:{tls_rabbitmq.password}@localhost:{tls_rabbitmq.tls_port}"
    trusted = qpid_flow_process(
        broker_url=broker,
        config_text=f'broker_tls_ca = "{certificates.ca}"\n[destinations."grouped.tls"]\nshared_groups = true\n',
    )
    client = connect(f"amqp://{tls_rabbitmq.user}:{tls_rabbitmq.password}@127.0.0.1:{trusted.port}")
    round_trip(client, "tls.upstream")
    round_trip(client, "grouped.tls")  # read by qpid-flow's own (TLS) broker connection
    client.close()
    assert '"event": "upstream_connected"' in trusted.log_text()
    # A broker whose certificate does not verify: no client gets through, and the log says why.
    untrusted = qpid_flow_process(broker_url=broker)  # the system's CAs do not know the test CA
    with pytest.raises(ConnectionException):
        connect(f"amqp://{tls_rabbitmq.user}:{tls_rabbitmq.password}@127.0.0.1:{untrusted.port}")
    assert '"event": "broker_tls_failed"' in untrusted.log_text()
    assert untrusted.returncode is None


# --- the admin endpoint ----------------------------------------------------------------------------


def _http(admin: str, method: str, path: str, body: bytes | None = None, **headers: Any) -> tuple[int, bytes]:
    import http.client

    connection = http.client.HTTPConnection(admin, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_admin_endpoint_needs_its_token_and_refuses_cross_site_requests(qpid_flow_process: StartRouter) -> None:
    admin = f"127.0.0.1:{free_port()}"
    # The environment wins over the file: the suite may set a token for every router it runs.
    token = os.environ.get("QPID_FLOW_ADMIN_TOKEN", "s3cret-token")
    router = qpid_flow_process(config_text=f'admin_token = "{token}"\n', extra_args=["--admin", admin])
    producer = connect(router.url)
    sender = producer.create_sender("admin.guarded")
    sender.send(Message(body="before"))
    json_body = {"Content-Type": "application/json"}
    # No token, a wrong token: refused, and nothing stopped.
    assert _http(admin, "POST", "/v1/producers/stop", b'{"pattern": ">"}', **json_body)[0] == 401
    wrong = {**json_body, "Authorization": "Bearer guess"}
    assert _http(admin, "POST", "/v1/producers/stop", b"{}", **wrong)[0] == 401
    # The attack of the issue: a page on another site posting text/plain (no preflight needed).
    cross_site = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
    assert _http(admin, "POST", "/v1/producers/stop", b"{}", **cross_site)[0] in (403, 415)
    with_token_cross_site = {**cross_site, "Authorization": f"Bearer {token}"}
    assert _http(admin, "POST", "/v1/producers/stop", b"{}", **with_token_cross_site)[0] in (403, 415)
    assert _http(admin, "OPTIONS", "/v1/producers/stop", None, Origin="http://evil.example")[0] in (403, 405)
    sender.send(Message(body="still flowing"))  # none of the above stopped anything
    # Reads on loopback need no token; a change with the token works.
    assert _http(admin, "GET", "/v1/destinations")[0] == 200
    right = {**json_body, "Authorization": f"Bearer {token}"}
    everything = b'{"pattern": ">"}'
    status, answer = _http(admin, "POST", "/v1/producers/stop", everything, **right)
    assert status == 200, answer
    assert _http(admin, "POST", "/v1/producers/start", everything, **right)[0] == 200
    producer.close()


def test_a_client_that_signs_in_and_never_opens_is_dropped(qpid_flow_process: StartRouter) -> None:
    """Standalone, after SASL a client's AMQP open must come within sasl_timeout too.
    Connections count against the limits at their open, and keep-alive frames kept one
    past the idle timeout: 40 such clients were held for good, counted nowhere. (In front
    of a broker the broker's own handshake timeout ends the client's upstream connection,
    and with it the client's.)"""
    from .harness.frames import FrameSocket

    router = qpid_flow_process(config_text='sasl_timeout = "1s"\nidle_timeout = "2s"\n')
    peer = FrameSocket(router.port)  # SASL ANONYMOUS done, the AMQP header sent; no open
    empty_frame = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # a keep-alive
    deadline = time.monotonic() + 8
    while not peer.closed_by_peer and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            peer.send(empty_frame)
        peer.read_until(lambda: False, timeout=0.3)
    assert peer.closed_by_peer, "a client that never opened was still connected after 8 s"
    assert '"open_timeout"' in router.log_text()
    peer.close()


def test_an_attach_refused_before_the_broker_began_its_session_is_still_answered(
    rabbitmq, qpid_flow_process: StartRouter
) -> None:
    """In front of a broker a client's session begins when the broker's begin comes back.
    An attach the ACL refused before that was closed on a session Proton had not begun:
    no attach or detach ever reached the client, which waited for good."""
    from .harness.frames import FrameSocket, begin_frame, open_frame, sender_attach

    router = qpid_flow_process(broker_url=rabbitmq.url, config_text='[[acl]]\nuser = "*"\nsend = ["ok.>"]\n')
    peer = FrameSocket(router.port)
    peer.send(open_frame(), begin_frame(), sender_attach("early", 0, "denied.q"))  # one write
    assert peer.read_until(lambda: bool(peer.named("detach")), timeout=10), peer.received
    assert [p.name for p in peer.received if p.name in ("begin", "attach", "detach")] == ["begin", "attach", "detach"]
    assert peer.named("detach")[0].condition() == "amqp:unauthorized-access"
    peer.close()


def test_a_tls_client_is_offered_the_mechanisms_of_a_broker_down_at_start(
    rabbitmq: Broker, qpid_flow_process: StartRouter, certificates: Certificates
) -> None:
    """While the broker's mechanisms are unknown (it was down at start), a client's
    handshake learns them from the broker first. A TLS client's SASL header, read after
    the TLS handshake while the broker had not answered yet, started that again: the
    learning connection was dropped, the next broker of the list tried (none), and the
    client closed (broker_unavailable), every TLS client alike."""
    port = free_port()
    router = start_secured(qpid_flow_process, certificates, broker_url=f"amqp://127.0.0.1:{port}")
    forwarder = Forwarder(port, rabbitmq.port, answer_delay=0.5)  # the broker answers slowly
    try:
        context = ssl.create_default_context(cafile=str(certificates.ca))
        with context.wrap_socket(
            socket.create_connection(("localhost", router.tls), timeout=10), server_hostname="localhost"
        ) as sock:
            time.sleep(0.1)  # the SASL header in a read of its own, after the TLS handshake
            offered = MechanismsReader().read_from(sock)
    finally:
        forwarder.close()
    assert offered == ("ANONYMOUS", "AMQPLAIN", "PLAIN")  # RabbitMQ's, in its order


class _TlsListener:
    """A TLS server that only counts the handshakes it completed: a broker's impostor."""

    def __init__(self, cert: Path, key: str | Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert), str(key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        self.attempts = 0
        import threading

        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            self.attempts += 1
            try:
                with self.context.wrap_socket(raw, server_side=True) as tls:
                    self.handshakes += 1
                    tls.recv(8)  # what the client says first once it trusts us: its SASL header
            except OSError:
                continue

    def close(self) -> None:
        self.sock.close()


def test_qpid_flows_own_broker_connection_trusts_broker_tls_ca_alone(
    qpid_flow_process: StartRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With broker_tls_ca naming a private CA, clients' upstream connections refused a
    certificate another CA signed, but qpid-flow's own connection (Proton's TLS) trusted the
    system's CAs as well: an impostor with any publicly signed certificate got it, and its
    sign-in with the broker password. The system store is stood in for by SSL_CERT_FILE."""
    from .harness.certs import _signed, make_ca

    trusted, _ = make_ca(tmp_path / "trusted", "private-ca")
    public, public_key = make_ca(tmp_path / "public", "public-ca")
    impostor_pair = _signed(tmp_path / "public", "impostor", "localhost", public, public_key, server=True)
    impostor = _TlsListener(impostor_pair.cert, impostor_pair.key)
    monkeypatch.setenv("SSL_CERT_FILE", str(public))  # the "system" trusts the public CA
    try:
        router = qpid_flow_process(
            broker_url=f"amqps://svc:broker-secret@localhost:{impostor.port}",
            config_text=f'broker_tls_ca = "{trusted}"\n',
            extra_args=["--disable-plugin", "rabbitmq_depth"],
        )
        deadline = time.monotonic() + 15
        while impostor.attempts < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the own connection tries at start, then again after a back-off
        assert impostor.attempts >= 2, router.log_tail()
        assert impostor.handshakes == 0
    finally:
        impostor.close()
