"""What an operator sees of a running qpid-flow: Prometheus metrics, health and readiness,
connections and links (docs/operations.md), with real clients and RabbitMQ.

The flow-control numbers are seed 000's: max 1000, stop at 900, resume at 500.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import ConnectionException, Message
from proton.reactor import Container
from proton.utils import BlockingConnection

from qpid_flow.admin.metrics import OTHER
from qpid_flow.security.users import UsersFile

from .clients import Consumer, Producer, make_message, run_all, start, unique
from .harness.broker import Broker
from .harness.net import free_port
from .harness.router import PROJECT_ROOT, RouterProcess, StartRouter, admin_request
from .harness.scenario import Peer

pytestmark = pytest.mark.integration


def _get(admin: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(admin_request(admin, path), timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def scrape(admin: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed by prometheus_client: (name, labels) -> value."""
    status, body = _get(admin, "/metrics")
    assert status == 200, body
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def of(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, destination: str) -> float:
    return samples[(name, (("destination", destination),))]


def wait_for(condition: Callable[[], Any], limit: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {limit:.0f} s")


def cli(admin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qpid_flow", *args, "--admin", admin], capture_output=True, text=True, timeout=30
    )


@pytest.fixture(params=["standalone", "broker"])
def mode(request: pytest.FixtureRequest) -> str | None:
    """None standalone, else the session RabbitMQ's URL."""
    return None if request.param == "standalone" else request.getfixturevalue("rabbitmq").url


def test_metrics_follow_a_flood_past_stop_and_a_drain(qpid_flow_process: StartRouter, mode: str | None) -> None:
    name = unique("metered")
    admin = f"127.0.0.1:{free_port()}"
    config = f'[destinations."{name}"]\nmax_count = 1000\nflow_stop_count = 900\nflow_resume_count = 500\n'
    router = qpid_flow_process(broker_url=mode, config_text=config, extra_args=["--admin", admin])
    # 960 in all: past the stop threshold once, and never again once the drain resumes them.
    producers = [
        Producer(router.url, name, [make_message(f"p{k}", i) for i in range(320)], timeout=120) for k in range(3)
    ]
    threads = start(*producers)

    # Flooded: 901 admitted (the transfer that crosses 900 turns flow on), producers held.
    def stopped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        samples = scrape(admin)
        flooded = of(samples, "qpid_flow_destination_flow_stopped", name) == 1
        return samples if flooded and of(samples, "qpid_flow_destination_depth_messages", name) == 901 else None

    samples = wait_for(stopped, 60, "flow stopped at depth 901")
    assert of(samples, "qpid_flow_destination_flow_stops_total", name) == 1
    assert of(samples, "qpid_flow_destination_depth_messages", name) > of(
        samples, "qpid_flow_destination_flow_stop_messages", name
    )
    assert of(samples, "qpid_flow_destination_flow_stop_messages", name) == 900
    assert of(samples, "qpid_flow_destination_flow_resume_messages", name) == 500
    assert of(samples, "qpid_flow_destination_max_messages", name) == 1000
    # A producer that sent all its 320 before the stop has gone; each one left is held.
    assert of(samples, "qpid_flow_destination_producers_blocked", name) >= 1
    assert of(samples, "qpid_flow_destination_producers_blocked", name) == of(
        samples, "qpid_flow_destination_producers", name
    )
    assert of(samples, "qpid_flow_destination_messages_enqueued_total", name) == 901
    assert samples[("qpid_flow_connections", ())] >= 1
    assert samples[("qpid_flow_links", (("direction", "in"),))] >= 1
    assert samples[("qpid_flow_ready", ())] == 1

    consumer = Consumer(router.url, name, count=960, prefetch=20, timeout=120)
    run_all(consumer)
    for thread in threads:
        thread.join(60)
    assert consumer.error is None, consumer.error

    # Drained: flowing again (0), stopped once (1), every message in, out and acknowledged.
    def drained() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        samples = scrape(admin)
        done = of(samples, "qpid_flow_destination_depth_messages", name) == 0
        return (
            samples if done and of(samples, "qpid_flow_destination_messages_acknowledged_total", name) == 960 else None
        )

    samples = wait_for(drained, 30, "depth 0 and 960 acknowledged")
    assert of(samples, "qpid_flow_destination_flow_stopped", name) == 0
    assert of(samples, "qpid_flow_destination_flow_stops_total", name) == 1
    assert of(samples, "qpid_flow_destination_flow_stopped_seconds_total", name) > 0
    assert of(samples, "qpid_flow_destination_messages_enqueued_total", name) == 960
    assert of(samples, "qpid_flow_destination_messages_delivered_total", name) >= 960
    assert of(samples, "qpid_flow_destination_messages_rejected_total", name) == 0
    assert samples[("qpid_flow_messages_in_total", ())] >= 960
    assert samples[("qpid_flow_messages_out_total", ())] >= 960


def test_other_keeps_what_a_destination_counted_after_the_last_scrape(qpid_flow_process: StartRouter) -> None:
    """With room for one name, B is summed under _other. B is scraped once (5 enqueued),
    then its 5 are delivered and acknowledged, and it is forgotten as idle before the
    next scrape; C is made, used and forgotten between two scrapes. _other keeps both:
    what a deleted destination counted went with it (delivered 0 for B, nothing for C)."""
    admin = f"127.0.0.1:{free_port()}"
    keeper, summed, unseen = unique("keeper"), unique("summed"), unique("unseen")
    config = (
        f'metrics_max_destinations = 1\ndestination_idle_timeout = "1s"\n[destinations."{keeper}"]\nmax_count = 100\n'
    )
    router = qpid_flow_process(config_text=config, extra_args=["--admin", admin])
    assert of(scrape(admin), "qpid_flow_destination_depth_messages", keeper) == 0  # the one label: keeper's
    run_all(Producer(router.url, summed, [make_message("p", i) for i in range(5)]))
    samples = scrape(admin)
    assert of(samples, "qpid_flow_destination_messages_enqueued_total", OTHER) == 5
    assert of(samples, "qpid_flow_destination_messages_delivered_total", OTHER) == 0
    consumer = Consumer(router.url, summed, count=5)
    run_all(consumer)
    producer = Producer(router.url, unseen, [make_message("q", i) for i in range(3)])
    run_all(producer)
    run_all(Consumer(router.url, unseen, count=3))

    def both_forgotten() -> bool:
        status, body = _get(admin, "/v1/destinations")
        names = {d["name"] for d in json.loads(body)["destinations"]}
        return status == 200 and summed not in names and unseen not in names

    wait_for(both_forgotten, 30, "both destinations forgotten as idle")
    samples = scrape(admin)
    assert of(samples, "qpid_flow_destination_messages_enqueued_total", OTHER) == 8
    assert of(samples, "qpid_flow_destination_messages_delivered_total", OTHER) == 8
    assert of(samples, "qpid_flow_destination_messages_acknowledged_total", OTHER) == 8
    assert samples[("qpid_flow_messages_out_total", ())] == 8


def test_health_and_readiness_standalone(qpid_flow_process: StartRouter) -> None:
    admin = f"127.0.0.1:{free_port()}"
    qpid_flow_process(extra_args=["--admin", admin])
    status, body = _get(admin, "/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    status, body = _get(admin, "/readyz")
    assert status == 200 and json.loads(body)["status"] == "ready", body


def test_readiness_follows_the_broker(qpid_flow_process: StartRouter, fresh_rabbitmq: Broker) -> None:
    """Ready while the broker is reachable; 503 with the reason while it is down (the process
    still healthy); ready again once it is back."""
    admin = f"127.0.0.1:{free_port()}"
    qpid_flow_process(broker_url=fresh_rabbitmq.url, extra_args=["--admin", admin])
    wait_for(lambda: _get(admin, "/readyz")[0] == 200, 30, "ready with the broker up")
    fresh_rabbitmq.kill()
    _, body = wait_for(
        lambda: (lambda answer: answer if answer[0] == 503 else None)(_get(admin, "/readyz")), 30, "not ready"
    )
    assert json.loads(body) == {
        "status": "not ready",
        "reason": "the broker is not reachable (qpid-flow's own connection to it is not open)",
    }
    assert _get(admin, "/healthz")[0] == 200
    assert scrape(admin)[("qpid_flow_ready", ())] == 0
    fresh_rabbitmq.restart()
    wait_for(lambda: _get(admin, "/readyz")[0] == 200, 60, "ready again after the broker restarted")


def _users(tmp_path: Path) -> Path:
    users = UsersFile()
    users.add("alice", "alice-secret")
    users.add("bob", "bob-secret")
    path = tmp_path / "users"
    users.save(path)
    return path


def _connect(router: RouterProcess, user: str, password: str, container: str) -> BlockingConnection:
    url = f"amqp://{user}:{password}@{router.host}:{router.port}"
    reactor = Container()
    reactor.container_id = container  # what the open frame says: the "container" column
    return BlockingConnection(url, timeout=10, allowed_mechs="PLAIN", container=reactor)


def test_connections_and_links_are_listed_and_one_can_be_closed(qpid_flow_process: StartRouter, tmp_path: Path) -> None:
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(config_text=f'users_file = "{_users(tmp_path)}"\n', extra_args=["--admin", admin])
    alice = _connect(router, "alice", "alice-secret", "alice-app")
    bob = _connect(router, "bob", "bob-secret", "bob-app")  # the bystander
    try:
        sender = alice.create_sender("ops.orders")
        for n in range(3):
            sender.send(Message(body=f"order {n}"))
        receiver = bob.create_receiver("ops.orders", credit=10)
        assert receiver.receive(timeout=10).body == "order 0"

        listed = cli(admin, "stat", "connections", "--json")
        assert listed.returncode == 0, listed.stderr
        connections = json.loads(listed.stdout)
        by_user = {record["user"]: record for record in connections.values()}
        assert set(by_user) == {"alice", "bob"}
        assert (by_user["alice"]["container"], by_user["bob"]["container"]) == ("alice-app", "bob-app")
        assert by_user["alice"]["remote"].startswith("127.0.0.1:")
        assert (by_user["alice"]["links"], by_user["alice"]["state"]) == (1, "open")

        listed = cli(admin, "stat", "links", "--json")
        assert listed.returncode == 0, listed.stderr
        links = {(link["connection"], link["role"]): link for link in json.loads(listed.stdout)}
        produced = links[(by_user["alice"]["id"], "producer")]
        consumed = links[(by_user["bob"]["id"], "consumer")]
        assert (produced["address"], produced["direction"], produced["deliveries"]) == ("ops.orders", "in", 3)
        assert (consumed["address"], consumed["direction"], consumed["deliveries"]) == ("ops.orders", "out", 3)
        assert consumed["unsettled"] == 3 and produced["blocked"] is False

        table = cli(admin, "stat", "connections")
        assert table.returncode == 0 and "alice-app" in table.stdout and "container" in table.stdout, table

        closed = cli(admin, "connection", "close", by_user["alice"]["id"])
        assert closed.returncode == 0, closed.stderr
        assert f"closed connection {by_user['alice']['id']} (user alice)" in closed.stdout
        with pytest.raises(ConnectionException, match="amqp:connection:forced"):
            alice.wait(lambda: False, timeout=10)
        with contextlib.suppress(ConnectionException):
            alice.close()  # the client's side of the close handshake
        # Bob carries on: his link still gets messages.
        assert [receiver.receive(timeout=10).body for _ in range(2)] == ["order 1", "order 2"]
        receiver.accept()
        remaining = wait_for(
            lambda: (lambda r: r if len(r) == 1 else None)(
                json.loads(_get(admin, "/v1/connections")[1])["connections"]
            ),
            10,
            "alice's connection gone from the list",
        )
        assert remaining[0]["user"] == "bob"
        gone = cli(admin, "connection", "close", by_user["alice"]["id"])
        assert gone.returncode != 0 and "no connection" in gone.stderr
    finally:
        bob.close()
        with contextlib.suppress(ConnectionException):
            alice.close()


def test_connections_in_front_of_a_broker_name_their_upstream(qpid_flow_process: StartRouter, rabbitmq: Broker) -> None:
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(broker_url=rabbitmq.url, extra_args=["--admin", admin])
    reactor = Container()
    reactor.container_id = "upstream-check"
    client = BlockingConnection(router.url, timeout=10, container=reactor)
    try:
        client.create_sender(unique("ops.upstream"))
        records = json.loads(_get(admin, "/v1/connections")[1])["connections"]
        (record,) = [r for r in records if r["container"] == "upstream-check"]
        assert record["upstream"] == "open"
        assert record["broker"].endswith(f"@{rabbitmq.host}:{rabbitmq.port}") and "guest@" not in record["broker"]
        samples = scrape(admin)
        # the client's own upstream connection and qpid-flow's
        assert samples[("qpid_flow_upstream_connections", (("state", "open"),))] >= 2
    finally:
        client.close()


def test_a_queue_the_broker_refuses_to_a_consumer_leaves_no_destination(
    qpid_flow_process: StartRouter, rabbitmq: Broker
) -> None:
    """Consumers of `/amq/queue/<missing>`: RabbitMQ ends each one's session
    (amqp:not-found). qpid-flow made a destination for each attach before the broker
    answered and kept it for destination_idle_timeout: /v1/destinations listed queues the
    broker does not have, and the depth plugin asked the broker for each every 2 s (1,000
    of them: 23 % of a core, the admin endpoint answering in up to 0.7 s). A queue a
    consumer reads stays listed."""
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(broker_url=rabbitmq.url, extra_args=["--admin", admin])
    kept_name = unique("ops.kept")
    missing = [unique("ops.missing") for _ in range(5)]
    # Two clients ask for each at once: neither attach may keep it for the other.
    with Peer(router.url) as peer, Peer(router.url) as other:
        peer.receiver(kept_name, credit=1)
        for name in missing:
            peer.receiver(f"/amq/queue/{name}", credit=1, new_session=True)
            other.receiver(f"/amq/queue/{name}", credit=1, new_session=True)

        def refused_all(client: Peer) -> bool:
            return len(client.view.errors) >= len(missing)

        for client in (peer, other):
            client.wait(functools.partial(refused_all, client))
            assert client.view.errors == [("session", "amqp:not-found")] * len(missing)
        names = {d["name"] for d in json.loads(_get(admin, "/v1/destinations")[1])["destinations"]}
        assert kept_name in names
        assert names.isdisjoint(missing), sorted(names & set(missing))


def test_the_listening_event_names_the_ports_picked_for_host_0(tmp_path: Path) -> None:
    """``--listen 127.0.0.1:0`` binds a free port: the ``listening`` event said
    ``127.0.0.1:0``, so nobody could tell where to connect (the admin address was told)."""
    log_path = tmp_path / "qpid-flow.log"
    argv = [sys.executable, "-m", "qpid_flow", "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
    with log_path.open("wb") as log:
        router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
    try:
        deadline = time.monotonic() + 30
        while '"event": "listening"' not in log_path.read_text(errors="replace"):
            assert router.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
        line = next(x for x in log_path.read_text().splitlines() if '"event": "listening"' in x)
        listening = json.loads(line)
        host, port = listening["listen"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0, listening
        connection = BlockingConnection(f"amqp://{listening['listen']}", timeout=15)
        try:
            connection.create_sender("listen.zero").send(Message(body="here"))
            assert connection.create_receiver("listen.zero").receive(timeout=15).body == "here"
        finally:
            connection.close()
    finally:
        router.terminate()
        router.wait(60)
