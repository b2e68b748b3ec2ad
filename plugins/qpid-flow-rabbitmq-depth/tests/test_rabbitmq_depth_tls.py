"""An amqps:// broker: the plugin's pika connection trusts what qpid-flow's own broker
connections trust (broker_tls_ca, broker_tls_cert/key, broker_tls_verify_hostname).

No broker: the TLS handshake runs in memory between pika's context and a server context
with the test certificates (qpid-flow's TlsChannel, over memory buffers)."""

from __future__ import annotations

import ssl
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pika
import pytest
from qpid_flow.config import ConfigError, RouterConfig
from qpid_flow.security.tls import TlsChannel

from qpid_flow_rabbitmq_depth import PikaDepthReader, RabbitMQDepth, Settings, parse_settings

PROJECT_ROOT = Path(__file__).resolve().parents[3]
# The test certificates come from qpid-flow's harness: run these tests in its source tree.
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from tests.integration.harness.certs import Certificates, make_certificates  # noqa: E402


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _configured(broker: str, **config: Any) -> Settings:
    """The settings the plugin builds at configure time (no connection is made)."""
    made: list[Settings] = []

    def factory(settings: Settings) -> PikaDepthReader:
        made.append(settings)
        return PikaDepthReader(lambda: pytest.fail("no connection in these tests"))

    plugin = RabbitMQDepth(factory, threaded=False)
    plugin.qpid_flow_configure(config=RouterConfig(broker=broker, **config))
    assert made and plugin.settings is made[0]
    return made[0]


def _handshake(certificates: Certificates, params: pika.URLParameters) -> TlsChannel:
    """pika's TLS options against a broker whose certificate the test CA signed (for
    localhost and 127.0.0.1); returns the client end once the exchange is over."""
    assert params.ssl_options is not None
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(certificates.server.cert, certificates.server.key)
    server = TlsChannel(server_context, server_side=True)
    client = TlsChannel(
        params.ssl_options.context, server_side=False, server_hostname=params.ssl_options.server_hostname
    )
    for _ in range(10):
        to_server, to_client = client.data_to_send(), server.data_to_send()
        if not to_server and not to_client:
            break
        if to_server:
            server.receive(to_server)
        if to_client:
            client.receive(to_client)
    return client


def test_a_broker_signed_by_broker_tls_ca_is_trusted(certificates: Certificates) -> None:
    """pika verified against the system's CAs: with a private CA, every reading failed
    for good (rabbitmq_depth_unavailable ... CERTIFICATE_VERIFY_FAILED)."""
    settings = _configured("amqps://guest:guest@localhost:5671", broker_tls_ca=str(certificates.ca))
    params = settings.connection_parameters()
    assert params.ssl_options is not None and params.ssl_options.server_hostname == "localhost"
    client = _handshake(certificates, params)
    assert client.error is None and client.handshake_done


def test_the_host_name_is_checked_unless_qpid_flow_does_not(certificates: Certificates) -> None:
    """The certificate names localhost and 127.0.0.1, not 127.0.0.2."""
    wrong_name = _configured(
        "amqps://guest:guest@localhost:5671",
        broker_tls_ca=str(certificates.ca),
        plugins={"rabbitmq_depth": {"amqp091_url": "amqps://guest:guest@127.0.0.2:5671"}},
    )
    client = _handshake(certificates, wrong_name.connection_parameters())
    assert not client.handshake_done and client.error is not None and "CERTIFICATE_VERIFY_FAILED" in client.error
    unchecked = _configured(
        "amqps://guest:guest@localhost:5671",
        broker_tls_ca=str(certificates.ca),
        broker_tls_verify_hostname=False,
        plugins={"rabbitmq_depth": {"amqp091_url": "amqps://guest:guest@127.0.0.2:5671"}},
    )
    assert _handshake(certificates, unchecked.connection_parameters()).handshake_done


def test_the_client_certificate_is_presented(certificates: Certificates) -> None:
    carol = certificates.client("carol")
    settings = _configured(
        "amqps://localhost:5671",
        broker_tls_ca=str(certificates.ca),
        broker_tls_cert=str(carol.cert),
        broker_tls_key=str(carol.key),
    )
    params = settings.connection_parameters()
    assert params.ssl_options is not None
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certificates.ca))
    server_context.verify_mode = ssl.CERT_REQUIRED
    server_context.load_cert_chain(certificates.server.cert, certificates.server.key)
    server = TlsChannel(server_context, server_side=True)
    client = TlsChannel(params.ssl_options.context, server_side=False, server_hostname="localhost")
    for _ in range(10):
        if to_server := client.data_to_send():
            server.receive(to_server)
        if to_client := server.data_to_send():
            client.receive(to_client)
    assert server.handshake_done and server.peer_name() == "carol"


def test_a_bad_broker_tls_file_stops_the_start_naming_its_key(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ConfigError) as raised:
        _configured("amqps://localhost:5671", broker_tls_ca=str(not_pem))
    assert raised.value.key == "broker_tls_ca"


def test_a_plain_broker_needs_no_tls_settings(tmp_path: Path) -> None:
    """amqp:// : broker_tls_* are not even loaded (as qpid-flow's own connections)."""
    settings = _configured("amqp://localhost:5672", broker_tls_ca=str(tmp_path / "never-read.pem"))
    assert settings.ssl_context is None and settings.connection_parameters().ssl_options is None


def test_settings_take_the_context_without_a_router_config(certificates: Certificates) -> None:
    context = ssl.create_default_context()
    settings = parse_settings({}, "amqps://u:p@rabbit.example")
    assert settings.ssl_context is None  # pika's own default then (the system's CAs)
    params = Settings(settings.interval, settings.amqp091_url, settings.vhost, ssl_context=context)
    options = params.connection_parameters().ssl_options
    assert options is not None and options.context is context and options.server_hostname == "rabbit.example"
    # An ssl_options query option in the URL is pika's own, left as given.
    query = urllib.parse.urlencode({"ssl_options": repr({"ca_certs": str(certificates.ca)})})
    given = Settings(2.0, f"amqps://rabbit.example:5671/?{query}", "/", ssl_context=context)
    pika_own = given.connection_parameters().ssl_options
    assert pika_own is not None and pika_own.context is not context
