"""BrokerRouter forgets a client that leaves while the broker is still answering it.

The listener fuzzer found it (BENCHMARKS.md, "Listener fuzzing"): in front of RabbitMQ,
qpid-flow's resident memory grew by 31-37 KiB for each client that left during or right after
its handshake (a quarter of the fuzzed ones). The broker's open (or attach) came back after
the client had gone, and the router registered the client then: its connection (with its
transport and buffers) stayed in ``connections`` for good, its producers in the producer
tables, and its place under ``max_connections`` was never given back, since no event of the
client was left to remove them. The same in-memory rig as tests/unit/test_linkroute.py:
real Proton ends, no socket, no broker process.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Endpoint

from qpid_flow.config import build_config
from tests.unit.test_linkroute import BROKER, Pair, Rig

# How a client leaves: an AMQP close, or its socket just ends (no close frame).
Leave = Callable[[Pair], None]


def _closes(pair: Pair) -> None:
    pair.client.connection.close()


def _hangs_up(pair: Pair) -> None:
    pair.client.transport.close_head()
    pair.client.transport.close_tail()


LEAVES = pytest.mark.parametrize("leave", [_closes, _hangs_up], ids=["close", "hang-up"])


def _forgotten(rig: Rig) -> list[str]:
    """What the router still holds for clients (nothing, once they all left)."""
    router = rig.router
    held = {
        "connections": len(router.connections),
        "pairs": len(router.pairs),
        "producers": len(router._producers),
        "producer routes": len(router._producer_routes),
        "consumers": len(router._consumers),
        "admitted": router.limits.open_connections(),
    }
    return [f"{name}: {n}" for name, n in held.items() if n]


def _broker_answers_and_closes(rig: Rig, pair: Pair) -> None:
    """The broker answers the open qpid-flow sent for the client, late, then the close."""
    broker = pair.broker.connection
    if broker.state & Endpoint.LOCAL_UNINIT:
        broker.open()
    rig.pump()
    if not broker.state & Endpoint.LOCAL_CLOSED:
        broker.close()
    rig.pump()


@LEAVES
def test_a_client_gone_before_the_brokers_open_is_forgotten(leave: Leave) -> None:
    rig = Rig(config=build_config({"broker": BROKER.url, "max_connections": 5}))
    pair = rig.connect()
    pair.client.connection.open()
    rig.pump()
    assert pair.broker.connection.state & Endpoint.REMOTE_ACTIVE, "the client's open did not reach the broker"
    assert rig.router.limits.open_connections() == 1
    leave(pair)
    rig.pump()
    _broker_answers_and_closes(rig, pair)
    assert not _forgotten(rig), _forgotten(rig)


def test_a_client_gone_before_its_own_open_is_forgotten() -> None:
    """SASL done, then garbage or nothing: qpid-flow opens and closes the upstream
    connection, and the broker's open comes back for a client that never opened."""
    rig = Rig()
    pair = rig.connect()
    _hangs_up(pair)
    rig.pump()
    _broker_answers_and_closes(rig, pair)
    assert not _forgotten(rig), _forgotten(rig)


@LEAVES
@pytest.mark.parametrize("address", ["orders", None], ids=["producer", "anonymous-relay"])
def test_a_client_gone_before_the_brokers_attach_or_begin_is_forgotten(leave: Leave, address: str | None) -> None:
    """A producer attached (or, for anonymous relay, waiting for the broker's begin) when
    the client leaves: the broker's late answer registers no producer."""
    rig = Rig()
    pair = rig.connect()
    pair.client.connection.open()
    rig.pump()
    pair.broker.connection.open()
    rig.pump()
    session = pair.client.connection.session()
    session.open()
    sender = session.sender("late-writer")
    sender.target.address = address
    sender.open()
    rig.pump()
    broker_session = pair.broker.connection.session_head(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
    assert broker_session is not None, "the client's begin did not reach the broker"
    leave(pair)
    rig.pump()
    broker_session.open()
    link = pair.broker.connection.link_head(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
    if link is not None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.open()
    _broker_answers_and_closes(rig, pair)
    assert not _forgotten(rig), _forgotten(rig)


def test_a_client_that_stays_is_still_registered() -> None:
    """The guard is for clients gone: one that stays is counted as before."""
    rig = Rig()
    pair = rig.connect()
    pair.client.connection.open()
    rig.pump()
    pair.broker.connection.open()
    rig.pump()
    assert pair.client.connection.state & Endpoint.REMOTE_ACTIVE
    assert len(rig.router.connections) == 1 and rig.router.limits.open_connections() == 1
