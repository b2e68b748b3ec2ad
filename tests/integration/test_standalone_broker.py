"""Standalone qpid-flow answers as a broker would (../shared/SEMANTICS.md section 7), seen
by real clients: the open frame, refused transactions, ..."""

from __future__ import annotations

from proton import Endpoint, Terminus
from proton.utils import BlockingConnection

from .harness.rawclient import RawClient
from .harness.router import StartRouter


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
