"""TlsChannel in memory: two ends joined by the test, no socket (qpid_flow.security.tls)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from qpid_flow.config import ConfigError, build_config
from qpid_flow.security.tls import TlsChannel, broker_context, listener_context
from tests.integration.harness.certs import Certificates, foreign_client, make_certificates


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _contexts(
    certificates: Certificates, client_cert: object = None, require: bool = False
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    config = build_config(
        {
            "tls_cert": str(certificates.server.cert),
            "tls_key": str(certificates.server.key),
            "tls_ca": str(certificates.ca),
            "tls_require_client_cert": require,
            "broker_tls_ca": str(certificates.ca),
            **(
                {"broker_tls_cert": str(client_cert.cert), "broker_tls_key": str(client_cert.key)}  # type: ignore[attr-defined]
                if client_cert is not None
                else {}
            ),
        }
    )
    server = listener_context(config)
    assert server is not None
    return server, broker_context(config)


def _shuttle(client: TlsChannel, server: TlsChannel, rounds: int = 10) -> None:
    for _ in range(rounds):
        to_server, to_client = client.data_to_send(), server.data_to_send()
        if not to_server and not to_client:
            return
        if to_server:
            server.receive(to_server)
        if to_client:
            client.receive(to_client)


def test_handshake_and_data_both_ways_in_any_split(certificates: Certificates) -> None:
    server_context, client_context = _contexts(certificates)
    server = TlsChannel(server_context, server_side=True)
    client = TlsChannel(client_context, server_side=False, server_hostname="localhost")
    _shuttle(client, server)
    assert client.handshake_done and server.handshake_done
    assert server.peer_name() is None  # no client certificate
    client.write(b"AMQP\x03\x01\x00\x00" * 1000)
    wire = client.data_to_send()
    for i in range(0, len(wire), 7):  # a byte-trickling network
        server.receive(wire[i : i + 7])
    assert server.read() == b"AMQP\x03\x01\x00\x00" * 1000
    server.write(b"answer")
    client.receive(server.data_to_send())
    assert client.read() == b"answer"
    client.close()
    server.receive(client.data_to_send())
    assert server.read() == b"" and server.closed


def test_verified_client_certificate_names_the_peer(certificates: Certificates) -> None:
    server_context, client_context = _contexts(certificates, certificates.client("alice"))
    server = TlsChannel(server_context, server_side=True)
    client = TlsChannel(client_context, server_side=False, server_hostname="localhost")
    _shuttle(client, server)
    client.write(b"x")
    server.receive(client.data_to_send())
    assert server.read() == b"x"
    assert server.peer_name() == "alice"


def test_untrusted_client_certificate_fails_the_handshake(certificates: Certificates) -> None:
    stranger = foreign_client(certificates.folder, "eve")
    server_context, client_context = _contexts(certificates, stranger)
    server = TlsChannel(server_context, server_side=True)
    client = TlsChannel(client_context, server_side=False, server_hostname="localhost")
    _shuttle(client, server)
    assert server.error is not None and not server.peer_name()


def test_wrong_host_name_fails_on_the_client(certificates: Certificates) -> None:
    server_context, client_context = _contexts(certificates)
    server = TlsChannel(server_context, server_side=True)
    client = TlsChannel(client_context, server_side=False, server_hostname="broker.example")
    _shuttle(client, server)
    assert client.error is not None and "certificate" in client.error.lower()


def test_garbage_is_an_error_not_an_exception(certificates: Certificates) -> None:
    server_context, _ = _contexts(certificates)
    server = TlsChannel(server_context, server_side=True)
    server.receive(b"AMQP\x00\x01\x00\x00 this is not TLS")
    assert server.error is not None
    assert server.read() == b""


def test_bad_files_refuse_to_start_naming_the_key(certificates: Certificates, tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    config = build_config({"tls_cert": str(certificates.server.cert), "tls_key": str(not_pem)})
    with pytest.raises(ConfigError, match=r"^tls_key = "):
        listener_context(config)
    config = build_config({"broker_tls_ca": str(not_pem)})
    with pytest.raises(ConfigError, match=r"^broker_tls_ca = "):
        broker_context(config)
    with pytest.raises(ConfigError, match=r"^tls_cert = .*no such file"):
        build_config({"tls_cert": str(tmp_path / "missing.pem"), "tls_key": str(not_pem)})
    with pytest.raises(ConfigError, match=r"^tls_cert = None: is required by the TLS listener"):
        build_config({"listen": "amqps://0.0.0.0:5671"})
    with pytest.raises(ConfigError, match=r"^tls_require_client_cert = True: needs tls_ca"):
        build_config(
            {
                "tls_cert": str(certificates.server.cert),
                "tls_key": str(certificates.server.key),
                "tls_require_client_cert": True,
            }
        )


def test_broker_tls_ca_replaces_the_system_store_rather_than_adding_to_it(certificates: Certificates) -> None:
    """Pinning the broker to a private CA: a certificate any public CA signed for the
    broker's name was accepted too, the system's CAs being loaded first."""
    pinned = broker_context(build_config({"broker_tls_ca": str(certificates.ca)}))
    subjects = [str(c["subject"]) for c in pinned.get_ca_certs()]
    assert len(subjects) == 1 and "qpid-flow test ca" in subjects[0], subjects
    assert pinned.verify_mode == ssl.CERT_REQUIRED and pinned.check_hostname
    assert pinned.minimum_version == ssl.TLSVersion.TLSv1_2
