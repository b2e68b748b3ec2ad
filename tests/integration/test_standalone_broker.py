"""Standalone qpid-flow answers as a broker would (../shared/SEMANTICS.md section 7), seen
by real clients: the open frame, refused transactions, ..."""

from __future__ import annotations

from proton import Endpoint, Message, Terminus
from proton.utils import BlockingConnection

from .harness.rawclient import RawClient
from .harness.router import StartRouter
from .harness.scenario import run_rhea


def test_open_frame_names_the_broker(qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        remote = connection.conn
        assert remote.remote_container.startswith("qpid-flow-")
        properties = {str(key): value for key, value in (remote.remote_properties or {}).items()}
        assert properties["product"] == "qpid-flow"
        assert properties["version"]
    finally:
        connection.close()


def test_transaction_coordinator_refused_at_once(qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process()
    client = RawClient(router.port)
    client.connection.open()
    session = client.connection.session()
    session.open()
    coordinator = session.sender("txn-ctrl")
    coordinator.target.type = Terminus.COORDINATOR
    coordinator.open()
    assert client.pump(lambda: coordinator.state & Endpoint.REMOTE_CLOSED)
    assert coordinator.remote_condition is not None
    assert coordinator.remote_condition.name == "amqp:not-implemented"
    client.close()


def test_delivery_works_with_the_passthrough_policy_disabled(qpid_flow_process: StartRouter) -> None:
    """None from every plugin is "no opinion": the core gives producers a window and lets
    consumers take turns, so disabling the built-in policy (docs/plugins.md) stops nothing."""
    router = qpid_flow_process(extra_args=["--disable-plugin", "passthrough"])
    sent = run_rhea(router.url, "send", "no.passthrough", "5")
    assert sent["outcomes"] == {"accepted": 5}, sent
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("no.passthrough")
        sender.send(Message(body="proton"))
        receiver = connection.create_receiver("no.passthrough")
        bodies = [receiver.receive(timeout=10).body for _ in range(6)]
        receiver.accept()
    finally:
        connection.close()
    assert bodies == [f"rhea-{n}" for n in range(5)] + ["proton"]


def test_first_credit_on_a_new_destination_is_a_full_window(qpid_flow_process: StartRouter) -> None:
    """With the default configuration a new destination has a size threshold (80% of
    default_max_size) and no message size seen yet: its first producer still gets a normal
    window (producer_window, 100), not one credit, so a client that sends only in its first
    on_sendable does not stall (qpid-interop-test's shims do)."""
    router = qpid_flow_process()
    connection = BlockingConnection(router.url, timeout=10)
    try:
        sender = connection.create_sender("brand.new.destination")
        connection.wait(lambda: sender.link.credit > 0, timeout=10)
        assert sender.link.credit == 100
    finally:
        connection.close()
