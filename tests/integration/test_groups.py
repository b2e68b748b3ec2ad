"""Shared message groups with real consumers, in front of RabbitMQ (no groups of its own) and standalone.

Correctness is judged from the consumers' own records (see group_consumer.py), never
from qpid-flow's logs: for every group, messages are processed in send order, and no two
consumers ever hold unsettled messages of the same group at overlapping times.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from qpid_flow.policies.event_log.writers import read_rows

from .clients import Consumer, Producer, Received, run_all, unique
from .harness.net import free_port
from .harness.router import admin_request
from .harness.waiting import wait_until

pytestmark = pytest.mark.integration

CONSUMER = Path(__file__).with_name("group_consumer.py")


@pytest.fixture(params=["broker", "standalone"])
def router_url(request, qpid_flow_process):
    def start(config_text: str, extra_args: tuple[str, ...] = ()):
        broker_url = request.getfixturevalue("rabbitmq").url if request.param == "broker" else None
        return qpid_flow_process(broker_url=broker_url, config_text=config_text, extra_args=list(extra_args))

    return start


def grouped_config(address: str, extra: str = "") -> str:
    return f'[destinations."{address}"]\nshared_groups = true\nmax_count = 0\nmax_size = 0\n{extra}'


def group_messages(groups: int, per_group: int, producer: int, producers: int) -> list[Message]:
    """Messages of the groups this producer owns (g % producers == producer), interleaved."""
    mine = [g for g in range(groups) if g % producers == producer]
    return [
        Message(body=f"g{g}-{seq}", group_id=f"g{g}", properties={"seq": seq}) for seq in range(per_group) for g in mine
    ]


def start_consumer(url: str, address: str, prefetch: int, delay_ms: float, out: Path, *flags: str):
    return subprocess.Popen(
        [sys.executable, str(CONSUMER), url, address, str(prefetch), str(delay_ms), str(out), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def read_records(path: Path) -> list[tuple[str, str, int, float]]:
    records = []
    for line in path.read_text().splitlines():
        kind, group, seq, at = line.split()
        records.append((kind, group, int(seq), float(at)))
    return records


def audit(
    records: dict[str, list[tuple[str, str, int, float]]], killed_at: dict[str, float] | None = None
) -> tuple[set[tuple[str, int]], int]:
    """Check order and exclusivity from the consumers' records; return what was accepted and
    how many group hand-overs between consumers there were."""
    killed_at = killed_at or {}
    intervals: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    settles: dict[str, list[tuple[float, int]]] = defaultdict(list)
    dead_settles: dict[tuple[str, str], list[int]] = defaultdict(list)
    accepted: set[tuple[str, int]] = set()
    for consumer, lines in records.items():
        open_at: dict[tuple[str, int], float] = {}
        for kind, group, seq, at in lines:
            if kind == "R":
                open_at[(group, seq)] = at
            else:
                intervals[group].append((open_at.pop((group, seq)), at, consumer))
                if consumer in killed_at:
                    dead_settles[(consumer, group)].append(seq)
                else:
                    settles[group].append((at, seq))
                accepted.add((group, seq))
        end = killed_at.get(consumer, float("inf"))
        for (group, _seq), start in open_at.items():
            intervals[group].append((start, end, consumer))
    handovers = 0
    for group, spans in intervals.items():
        spans.sort()
        busy_until: dict[str, float] = {}
        previous = None
        for start, end, consumer in spans:
            for other, until in busy_until.items():
                assert other == consumer or until <= start, (
                    f"group {group}: {consumer} held a message from {start} while {other} held one until {until}"
                )
            busy_until[consumer] = max(busy_until.get(consumer, 0.0), end)
            handovers += previous is not None and previous != consumer
            previous = consumer
    for group, done in settles.items():
        sequences = [seq for _, seq in sorted(done)]
        assert sequences == sorted(sequences), f"group {group} processed out of order: {sequences[:20]}"
    # A killed consumer processed its messages in order too. Those whose accept it sent
    # but qpid-flow never received (it died first) are delivered again to the next owner
    # (at-least-once), so the survivors' order is checked apart from the dead one's.
    for (consumer, group), dead_order in dead_settles.items():
        assert dead_order == sorted(dead_order), (
            f"group {group} processed out of order by {consumer}: {dead_order[:20]}"
        )
    return accepted, handovers


def kill_after(consumer: subprocess.Popen, log: Path, started: int, timeout: float = 60) -> None:
    """SIGKILL ``consumer`` once its log shows ``started`` messages (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while (not log.exists() or log.read_text().count("S ") < started) and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer.send_signal(signal.SIGKILL)


def wait_all(processes: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.wait(max(1.0, deadline - time.monotonic()))


def test_200_groups_20000_messages_4_consumers_in_order_and_exclusive(router_url, tmp_path) -> None:
    address = unique("groups")
    router = router_url(grouped_config(address))
    consumers = {
        f"c{i}": start_consumer(router.url, address, prefetch, delay, tmp_path / f"c{i}.log")
        for i, (prefetch, delay) in enumerate([(1, 0), (5, 0.2), (20, 1), (50, 2)])
    }
    producers = [Producer(router.url, address, group_messages(200, 100, p, 2), timeout=300) for p in range(2)]
    run_all(*producers, timeout=300)
    assert all(p.error is None and len(p.outcomes) == 10_000 for p in producers)
    wait_all(list(consumers.values()), 300)
    records = {name: read_records(tmp_path / f"{name}.log") for name in consumers}
    accepted, handovers = audit(records)
    assert accepted == {(f"g{g}", seq) for g in range(200) for seq in range(100)}
    assert all(any(kind == "S" for kind, *_ in lines) for lines in records.values()), "a consumer got nothing"
    assert handovers > 0, "groups never moved between consumers: the test would prove nothing"


def test_a_killed_consumers_groups_move_on_in_order_and_nothing_is_lost(router_url, tmp_path) -> None:
    address = unique("groups-kill")
    router = router_url(grouped_config(address))
    names = ["c0", "c1", "c2", "victim"]
    consumers = {
        name: start_consumer(router.url, address, prefetch, delay, tmp_path / f"{name}.log")
        for name, (prefetch, delay) in zip(names, [(5, 0.5), (10, 0.5), (20, 1), (20, 1)], strict=True)
    }
    producer = Producer(router.url, address, group_messages(50, 100, 0, 1), timeout=300)
    sending = threading.Thread(target=run_all, args=(producer,), kwargs={"timeout": 300})
    sending.start()
    kill_after(consumers["victim"], tmp_path / "victim.log", 300)
    killed_at = time.monotonic()
    sending.join(300)
    wait_all([p for n, p in consumers.items() if n != "victim"], 300)
    records = {name: read_records(tmp_path / f"{name}.log") for name in names}
    accepted, _ = audit(records, killed_at={"victim": killed_at})
    assert accepted == {(f"g{g}", seq) for g in range(50) for seq in range(100)}, "messages were lost"
    victims_groups = {group for kind, group, _, _ in records["victim"]}
    survivors = {group for name in names[:3] for kind, group, _, at in records[name] if at > killed_at}
    assert victims_groups & survivors, "the killed consumer's groups did not move to the others"


def test_a_stuck_consumer_loses_its_groups_after_the_lease(router_url, tmp_path) -> None:
    address = unique("groups-lease")
    router = router_url(grouped_config(address, 'group_lease = "1s"\n'))
    producer = Producer(router.url, address, group_messages(20, 20, 0, 1), timeout=120)
    run_all(producer)
    assert len(producer.outcomes) == 400
    stuck = start_consumer(router.url, address, 10, 0, tmp_path / "stuck.log", "--stuck")
    deadline = time.monotonic() + 20
    while (not (tmp_path / "stuck.log").exists() or (tmp_path / "stuck.log").read_text().count("R ") < 10) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    workers = {f"w{i}": start_consumer(router.url, address, 10, 0.2, tmp_path / f"w{i}.log") for i in range(2)}
    wait_all(list(workers.values()), 120)
    stuck.send_signal(signal.SIGKILL)
    stuck.wait(10)
    records = {name: read_records(tmp_path / f"{name}.log") for name in [*workers, "stuck"]}
    # The lease takes groups away from a consumer that still thinks it holds them (that is
    # its point), so exclusivity is audited among the working consumers.
    accepted, _ = audit({name: records[name] for name in workers})
    assert accepted == {(f"g{g}", seq) for g in range(20) for seq in range(20)}, "the others did not finish"
    assert {group for _, group, _, _ in records["stuck"]}, "the stuck consumer took nothing"
    assert "group_lease_expired" in router.log_text()


def test_groups_cli_lists_each_group_with_owner_held_and_waiting(qpid_flow_process) -> None:
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(
        config_text='[destinations."carts"]\nshared_groups = true\ngroup_header = "JMSXGroupID"\n',
        extra_args=["--admin", admin],
    )
    messages = [Message(body=f"{g}-{i}", properties={"JMSXGroupID": g, "seq": i}) for g in ("a", "b") for i in range(3)]
    producer = Producer(router.url, "carts", messages)
    run_all(producer)
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "groups", "carts", "--json", "--admin", admin],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    groups = {g["group"]: g for g in json.loads(result.stdout)["groups"]}
    assert {k: (v["owner"], v["held"], v["waiting"]) for k, v in groups.items()} == {
        "a": (None, 0, 3),
        "b": (None, 0, 3),
    }
    with urllib.request.urlopen(admin_request(admin, "/v1/destinations/carts"), timeout=10) as response:
        record = json.load(response)
    assert record["groups"] == 2 and record["groupHeader"] == "JMSXGroupID"


@pytest.mark.parametrize("events_format", ["jsonl", "parquet"])
def test_the_event_log_records_messages_and_groups(qpid_flow_process, tmp_path, events_format) -> None:
    """Both formats record the same events; parquet's segment is finished at shutdown."""
    events = tmp_path / "events" / ("events.jsonl" if events_format == "jsonl" else "segments")
    router = qpid_flow_process(
        config_text='[destinations."logged"]\nshared_groups = true\n',
        extra_args=["--events", str(events), "--events-format", events_format],
    )
    producer = Producer(router.url, "logged", group_messages(3, 5, 0, 1))
    run_all(producer)
    consumer = start_consumer(router.url, "logged", 5, 0, tmp_path / "c.log")
    wait_all([consumer], 60)
    router.stop()
    if events_format == "jsonl":
        records = read_rows([events])
    else:
        assert not list(events.glob("*.arrows")), "a clean stop leaves only Parquet"
        records = read_rows(sorted(events.glob("*.parquet")))
    assert {r["v"] for r in records} == {1} and len({r["run"] for r in records}) == 1
    kinds: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        kinds.setdefault(record["event"], []).append(record)
    assert len(kinds["enqueue"]) == len(kinds["deliver"]) == len(kinds["transfer_settled"]) == 15
    assert sorted(r["outcome"] for r in kinds["settle"]) == ["accepted"] * 15
    assert {r["group"] for r in kinds["deliver"]} == {"g0", "g1", "g2"}
    assert {r["group"] for r in kinds["group_assigned"]} == {"g0", "g1", "g2"}
    assert {r["reason"] for r in kinds["group_released"]} == {"settled"}
    consumer_ids = {r["consumer"] for r in kinds["deliver"]}
    assert len(consumer_ids) == 1 and None not in consumer_ids


class _DurableSource:
    """A receiver whose source asks for a durable node, as a consumer of a durable queue does."""

    def apply(self, link: Any) -> None:
        from proton import Terminus

        link.source.durability = Terminus.DELIVERIES

    def test(self, link: Any) -> bool:
        return bool(link.is_receiver)


def test_a_grouped_durable_queue_is_read_as_its_consumers_ask(rabbitmq, qpid_flow_process) -> None:
    """qpid-flow's reader asked for every grouped queue with a non-durable source: RabbitMQ
    refuses that for a durable queue and ends the reader's session, and the consumers
    (attached without error) got nothing, with nothing logged."""
    import pika
    from proton.utils import BlockingConnection

    address = unique("grouped-durable")
    channel = pika.BlockingConnection(
        pika.URLParameters(f"amqp://{rabbitmq.user}:{rabbitmq.password}@{rabbitmq.host}:{rabbitmq.port}/%2F")
    ).channel()
    channel.queue_declare(address, durable=True)
    channel.connection.close()
    router = qpid_flow_process(broker_url=rabbitmq.url, config_text=grouped_config(address))
    connection = BlockingConnection(router.url, timeout=15)
    try:
        sender = connection.create_sender(address, options=_DurableTarget())
        for n in range(5):
            sender.send(Message(body=f"m{n}", group_id="A", durable=True))
        receiver = connection.create_receiver(address, credit=5, options=_DurableSource())
        bodies = []
        for _ in range(5):
            bodies.append(receiver.receive(timeout=15).body)
            receiver.accept()
        assert bodies == [f"m{n}" for n in range(5)]
    finally:
        connection.close()


def test_a_grouped_destination_applies_selectors_and_browsing_in_front_of_the_broker(
    rabbitmq, qpid_flow_process
) -> None:
    """On a shared_groups destination qpid-flow dispatches, not RabbitMQ (which applies no
    selector and no distribution-mode copy): a browser sees copies and takes nothing, a
    consumer selecting red gets only the red group, and the answers say so. (Once, both were
    handed everything, and a browser took the messages.)"""
    from proton import Terminus
    from proton.reactor import Copy, Selector
    from proton.utils import BlockingConnection

    address = unique("grouped-selected")
    router = qpid_flow_process(broker_url=rabbitmq.url, config_text=grouped_config(address))
    connection = BlockingConnection(router.url, timeout=15)
    try:
        sender = connection.create_sender(address)
        for n, colour in enumerate(["red", "blue", "red", "blue"]):
            sender.send(Message(body=f"{colour}-{n}", group_id=colour, properties={"colour": colour}))
        browser = connection.create_receiver(address, name="browser", options=Copy())
        assert browser.link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
        seen = [browser.receive(timeout=15).body for _ in range(4)]
        assert seen == ["red-0", "blue-1", "red-2", "blue-3"]
        red = connection.create_receiver(address, name="red", options=Selector("colour = 'red'"))
        taken = [red.receive(timeout=15).body for _ in range(2)]
        red.accept()
        red.accept()
        assert taken == ["red-0", "red-2"]
        rest = connection.create_receiver(address, name="rest")
        left = [rest.receive(timeout=15).body for _ in range(2)]
        rest.accept()
        rest.accept()
        assert left == ["blue-1", "blue-3"]
    finally:
        connection.close()


class _DurableTarget:
    def apply(self, link: Any) -> None:
        from proton import Terminus

        link.target.durability = Terminus.DELIVERIES

    def test(self, link: Any) -> bool:
        return bool(link.is_sender)


def test_the_reader_signs_in_as_the_broker_user_given_and_its_refusal_reaches_consumers(
    rabbitmq, qpid_flow_process
) -> None:
    """The reader of grouped destinations signed in ANONYMOUS (RabbitMQ offers it first), so
    the --broker user's password was never checked nor its rights used. Now it signs in as
    that user: one with no rights is refused the queue, and the consumer is told."""
    from proton.utils import BlockingConnection, LinkDetached

    user = unique("reader")
    rabbitmq.ctl("add_user", user, "reader-secret")
    rabbitmq.ctl("set_permissions", "-p", "/", user, "^$", "^$", "^$")  # no queue at all
    address = unique("grouped-denied")
    broker_url = f"amqp://{user}:reader-secret@{rabbitmq.host}:{rabbitmq.port}"
    router = qpid_flow_process(broker_url=broker_url, config_text=grouped_config(address))
    # The client signs in as itself (guest, who may read the queue): its own attach passes.
    client_url = f"amqp://{rabbitmq.user}:{rabbitmq.password}@{router.url.removeprefix('amqp://')}"
    connection = BlockingConnection(client_url, timeout=15, allowed_mechs="PLAIN")
    try:
        connection.create_sender(address).send(Message(body="m0", group_id="A"))
        with pytest.raises(LinkDetached) as refused:
            receiver = connection.create_receiver(address, credit=1)
            receiver.receive(timeout=15)
        assert "access" in str(refused.value).lower(), refused.value
    finally:
        connection.close()


def test_a_grouped_consumer_in_another_vhost_reads_nothing_of_the_readers_vhost(rabbitmq, qpid_flow_process) -> None:
    """A user with rights in vhost "tenant" only, attaching to a grouped destination from
    that vhost: the broker allowed its check in tenant, and qpid-flow's reader (in the
    broker URL's vhost, "/") handed it the messages of "/"'s queue. Directly, that user
    reads tenant's own (empty) queue. Now the consumer is refused (amqp:not-allowed), and
    the message stays in "/"."""
    from proton.utils import BlockingConnection, LinkDetached

    vhost, user = unique("tenant"), unique("tenant-user")
    rabbitmq.ctl("add_vhost", vhost)
    rabbitmq.ctl("add_user", user, "tenant-secret")
    rabbitmq.ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")  # nothing in "/"
    address = unique("grouped-secret")
    router = qpid_flow_process(broker_url=rabbitmq.url, config_text=grouped_config(address))
    direct = BlockingConnection(rabbitmq.url, timeout=15)
    tenant = BlockingConnection(
        f"amqp://{user}:tenant-secret@{router.url.removeprefix('amqp://')}",
        timeout=15,
        allowed_mechs="PLAIN",
        virtual_host=f"vhost:{vhost}",
    )
    try:
        direct.create_sender(address).send(Message(body="secret of /", group_id="A"))
        with pytest.raises(LinkDetached) as refused:
            tenant.create_receiver(address, credit=1).receive(timeout=15)
        assert "amqp:not-allowed" in str(refused.value), refused.value
    finally:
        for connection in (tenant, direct):
            with contextlib.suppress(Exception):
                connection.close()
        rabbitmq.ctl("delete_vhost", vhost)
        rabbitmq.ctl("delete_user", user)
    router.stop()
    assert rabbitmq.queue_depth(address) == 1, "the message left the reader's vhost"


def _connections_to(pid: int, port: int) -> list[int]:
    """Local ports of process ``pid``'s established TCP connections to ``port``."""
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( dport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    return [int(line.split()[2].rsplit(":", 1)[1]) for line in listed.splitlines() if f"pid={pid}," in line]


def test_a_consumer_holding_a_group_is_detached_when_the_reader_connection_is_lost(rabbitmq, qpid_flow_process) -> None:
    """qpid-flow's own connection (the reader) went while C1 held group A's messages
    unsettled: qpid-flow forgot them (the broker delivers them again) and freed the group,
    but C1 was not told, so C2 got group A while C1 still worked on it. Now C1's link is
    detached (amqp:link:detach-forced), and C2 gets every message again."""
    from proton.utils import BlockingConnection, LinkDetached

    address = unique("grouped-reader-lost")
    router = qpid_flow_process(
        broker_url=rabbitmq.url,
        config_text=grouped_config(address),
        extra_args=["--disable-plugin", "rabbitmq_depth"],  # its AMQP 0-9-1 connection aside
    )
    first = BlockingConnection(router.url, timeout=15)
    second = BlockingConnection(router.url, timeout=15)
    try:
        sender = first.create_sender(address)
        for n in range(4):
            sender.send(Message(body=f"a{n}", group_id="A"))
        # qpid-flow's connections to the broker so far: its probe and the clients' own.
        before = set(_connections_to(router.pid, rabbitmq.port))
        holder = first.create_receiver(address, credit=4)
        assert [holder.receive(timeout=15).body for _ in range(4)] == ["a0", "a1", "a2", "a3"]  # held, unsettled
        # The one the first grouped consumer added: the destination's reader.
        [reader] = set(_connections_to(router.pid, rabbitmq.port)) - before
        # A network fault on that one connection: both ends see it reset.
        reset = ["ss", "-K", "-tn", f"( sport = :{reader} and dport = :{rabbitmq.port} )"]
        subprocess.run(reset, check=True, capture_output=True)
        with pytest.raises(LinkDetached) as detached:
            first.wait(lambda: False, timeout=10)
        assert "amqp:link:detach-forced" in str(detached.value)
        other = second.create_receiver(address, credit=4)
        again = []
        for _ in range(4):
            again.append(other.receive(timeout=15).body)
            other.accept()
        assert again == ["a0", "a1", "a2", "a3"]
    finally:
        for connection in (first, second):
            with contextlib.suppress(Exception):
                connection.close()


def expire_behind_the_owner(connection: Any, address: str) -> None:
    """A1, A2 (time to live 0.5 s), A3 of group A: A2 waits behind A1, out to a consumer, for
    2 s, and the consumer gets A3 next, never A2."""
    sender = connection.create_sender(address)
    for n in (1, 2, 3):
        message = Message(body=f"A{n}", group_id="A")
        if n == 2:
            message.ttl = 0.5
        sender.send(message)
    receiver = connection.create_receiver(address, credit=0)  # one at a time: each receive asks for one
    assert receiver.receive(timeout=15).body == "A1"
    time.sleep(2.0)  # A2's time to live runs out while A1 holds the group
    receiver.accept()
    assert receiver.receive(timeout=15).body == "A3"
    receiver.accept()


def test_a_message_that_expires_waiting_behind_its_group_is_never_delivered(router_url) -> None:
    """A1 is out to a consumer; A2, with a time to live of 0.5 s, waits behind it (same
    group) for 2 s. RabbitMQ alone drops A2, and so does standalone qpid-flow. In front of
    RabbitMQ it was delivered anyway: to the broker, A2 is an unsettled delivery to
    qpid-flow's reader, which it never expires."""
    from proton.utils import BlockingConnection

    address = unique("grouped-ttl")
    router = router_url(grouped_config(address))
    connection = BlockingConnection(router.url, timeout=15)
    try:
        expire_behind_the_owner(connection, address)
    finally:
        connection.close()


def test_a_grouped_queue_declared_with_arguments_is_read(rabbitmq, qpid_flow_process) -> None:
    """qpid-flow's reader asked for a grouped queue by its plain name, which RabbitMQ takes
    as a declaration: for a queue declared with arguments (a dead-letter exchange, a length
    limit) it refused it (precondition-failed), and the consumers of /amq/queue/X, whose
    own attach the broker took, were detached with that error. The reader now reads
    /amq/queue/X, which declares nothing."""
    import pika
    from proton.utils import BlockingConnection

    address = unique("grouped-arguments")
    broker = pika.URLParameters(f"amqp://{rabbitmq.user}:{rabbitmq.password}@{rabbitmq.host}:{rabbitmq.port}/%2F")
    with pika.BlockingConnection(broker) as setup:
        setup.channel().queue_declare(address, arguments={"x-max-length": 1000})
    router = qpid_flow_process(broker_url=rabbitmq.url, config_text=grouped_config(address))
    connection = BlockingConnection(router.url, timeout=15)
    try:
        sender = connection.create_sender(f"/amq/queue/{address}")
        for n in range(3):
            sender.send(Message(body=f"A{n}", group_id="A"))
        receiver = connection.create_receiver(f"/amq/queue/{address}", credit=3)
        bodies = []
        for _ in range(3):
            bodies.append(receiver.receive(timeout=15).body)
            receiver.accept()
        assert bodies == ["A0", "A1", "A2"]
    finally:
        connection.close()


def test_a_grouped_queue_with_a_slash_in_its_name_is_read_and_named_by_its_address(rabbitmq, qpid_flow_process) -> None:
    """Queue ``x/y`` is ``/queue/x%2Fy`` to RabbitMQ, which refuses the plain ``x/y``: the
    reader asked for it so, and every consumer was detached (unknown_destination). The
    admin API names it by the address form too, as ``config add`` does (GET answered 404)."""
    from proton.utils import BlockingConnection

    name = f"{unique('grouped')}/slash"
    address = "/queue/" + name.replace("/", "%2F")
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(broker_url=rabbitmq.url, config_text=grouped_config(name), extra_args=["--admin", admin])
    connection = BlockingConnection(router.url, timeout=15)
    try:
        sender = connection.create_sender(address)
        for n in range(3):
            sender.send(Message(body=f"A{n}", group_id="A"))
        receiver = connection.create_receiver(address, credit=3)
        bodies = [receiver.receive(timeout=15).body for _ in range(3)]
        assert bodies == ["A0", "A1", "A2"]
        quoted = urllib.parse.quote(address, safe="")
        with urllib.request.urlopen(admin_request(admin, f"/v1/groups/{quoted}"), timeout=10) as response:
            groups = json.load(response)
        assert groups["name"] == name
        assert [(g["group"], g["held"]) for g in groups["groups"]] == [("A", 3)]
        with urllib.request.urlopen(admin_request(admin, f"/v1/destinations/{quoted}"), timeout=10) as response:
            assert json.load(response)["name"] == name
        receiver.accept()
    finally:
        connection.close()


def test_a_grouped_message_that_expires_in_qpid_flow_is_dead_lettered_as_the_broker_would(
    rabbitmq, qpid_flow_process
) -> None:
    """RabbitMQ dead-letters a message whose ttl ran out with the reason ``expired``. One of
    a grouped destination, expired waiting behind its group's owner in qpid-flow, was told
    rejected: dead-lettered with the reason ``rejected``."""
    import pika
    from proton.utils import BlockingConnection

    address, dead = unique("grouped-dlx"), unique("dead-letters")
    broker = pika.URLParameters(f"amqp://{rabbitmq.user}:{rabbitmq.password}@{rabbitmq.host}:{rabbitmq.port}/%2F")
    with pika.BlockingConnection(broker) as setup:
        channel = setup.channel()
        channel.queue_declare(dead)
        channel.queue_declare(address, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    router = qpid_flow_process(broker_url=rabbitmq.url, config_text=grouped_config(address))
    connection = BlockingConnection(router.url, timeout=15)
    try:
        expire_behind_the_owner(connection, f"/amq/queue/{address}")
    finally:
        connection.close()
    reasons: list[str] = []

    def dead_lettered() -> bool:
        with pika.BlockingConnection(broker) as check:
            method, properties, _body = check.channel().basic_get(dead, auto_ack=True)
        if method is not None:
            reasons.extend(death["reason"] for death in properties.headers["x-death"])
        return bool(reasons)

    wait_until(dead_lettered, timeout=15)
    assert reasons == ["expired"]


def test_a_modified_outcomes_annotations_reach_the_next_delivery(router_url) -> None:
    """AMQP 1.0 3.4.5: a modified outcome's message-annotations are merged into the message
    for its next delivery (docs/behaviour.md, "Outcomes on qpid-flow's own destinations",
    standalone and for grouped destinations in front of a broker). In front of RabbitMQ
    the redelivery came without them."""
    from proton import Delivery, symbol
    from proton.utils import BlockingConnection

    address = unique("grouped-modified")
    router = router_url(grouped_config(address))
    connection = BlockingConnection(router.url, timeout=15)
    try:
        connection.create_sender(address).send(Message(body="A1", group_id="A"))
        receiver = connection.create_receiver(address, credit=1)
        first = receiver.receive(timeout=15)
        assert first.body == "A1" and not first.annotations
        delivery = receiver.fetcher.unsettled[0]
        delivery.local.failed = True
        delivery.local.annotations = {symbol("x-opt-retry-reason"): "timeout"}
        receiver.settle(Delivery.MODIFIED)
        again = receiver.receive(timeout=15)
        receiver.accept()
        assert again.body == "A1"
        assert again.delivery_count == 1
        assert again.annotations == {symbol("x-opt-retry-reason"): "timeout"}
    finally:
        connection.close()


class _ModifyAndLeave(Consumer):
    """Takes one message, settles it modified(delivery-failed, an annotation) and leaves."""

    def on_message(self, event: Any) -> None:
        from proton import Delivery, symbol

        self.received.append(Received(event.message, time.monotonic()))
        delivery = event.delivery
        delivery.local.failed = True
        delivery.local.annotations = {symbol("x-opt-retry-reason"): "timeout"}
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
        self.finish()


def test_what_the_last_consumer_left_waits_for_the_next_as_it_was_left(router_url) -> None:
    """The only consumer of a grouped destination settles A1 modified(delivery-failed, an
    annotation) and leaves; another comes at once (a consumer per request, a poison
    message's retry loop). In front of RabbitMQ the reader gave everything it had fetched
    back to the broker the moment the last consumer left: A1 came again with
    delivery-count 0 and without the annotation, and B1, fetched ahead and never
    delivered to anyone, came first-acquirer false. What was fetched now waits through
    the reader's linger (docs/behaviour.md)."""
    from proton import symbol

    address = unique("grouped-left")
    router = router_url(grouped_config(address))
    run_all(
        Producer(
            router.url,
            address,
            [
                Message(body="A1", group_id="A", first_acquirer=True),
                Message(body="B1", group_id="B", first_acquirer=True),
            ],
        )
    )
    first = _ModifyAndLeave(router.url, address, prefetch=1)
    run_all(first)
    assert [r.message.body for r in first.received] == ["A1"]
    later = Consumer(router.url, address, count=2, prefetch=2)
    run_all(later)
    got = {r.message.body: r.message for r in later.received}
    assert (got["A1"].delivery_count, got["A1"].annotations) == (1, {symbol("x-opt-retry-reason"): "timeout"})
    assert (got["B1"].delivery_count, got["B1"].first_acquirer) == (0, True)


def test_groups_turned_off_while_the_reader_lingers_release_what_it_fetched_at_once(router_url) -> None:
    """The last consumer of a grouped destination left (what the reader fetched waits for
    the next through the reader's linger), then an operator turns shared_groups off: the
    next consumer reads the broker's queue directly. It got nothing for 9.5 s, then the
    messages out of order: the fetched ones waited for the linger, unsettled, out of its
    sight. They go back to the broker at once, in order."""
    from proton.utils import BlockingConnection

    address = unique("grouped-off")
    admin = f"127.0.0.1:{free_port()}"
    router = router_url(grouped_config(address), extra_args=("--admin", admin))
    bodies = [f"{'AB'[i % 2]}{i}" for i in range(6)]
    run_all(Producer(router.url, address, [Message(body=b, group_id=b[0]) for b in bodies]))
    # It takes A0 and leaves; one more may reach it first: never settled, it goes back.
    first = Consumer(router.url, address, count=1, prefetch=1, decide=lambda m: "accept" if m.body == "A0" else "hold")
    run_all(first)
    assert [r.message.body for r in first.received][:1] == ["A0"]
    left = bodies[1:]
    time.sleep(0.5)  # the consumer's detach reached qpid-flow: the reader lingers
    change = admin_request(admin, f"/v1/destinations/{address}")
    change.method = "PUT"
    change.data = json.dumps({"max_count": 0, "max_size": 0}).encode()
    change.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(change, timeout=10) as response:
        assert response.status == 200
    connection = BlockingConnection(router.url, timeout=15)
    try:
        receiver = connection.create_receiver(address, credit=10)
        got = []
        for _ in left:
            got.append(receiver.receive(timeout=3).body)  # well within the 10 s linger
            receiver.accept()
    finally:
        connection.close()
    assert got == left
