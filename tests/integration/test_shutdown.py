"""qpid-flow's own shutdown (SIGTERM), as its clients and its operators see it
(docs/behaviour.md, "Shutdown"): standalone and in front of RabbitMQ.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .clients import Producer, make_message, run_all, start, unique
from .harness.frames import FrameSocket, begin_frame, open_frame, sender_attach, transfer_frame
from .harness.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(params=["broker", "standalone"])
def broker_url(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("rabbitmq").url if request.param == "broker" else None


def log_events(router: Any, name: str) -> list[dict[str, Any]]:
    records = []
    for line in router.log_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == name:
            records.append(record)
    return records


def test_the_outcomes_flow_control_was_holding_reach_their_producer_before_the_close(
    qpid_flow_process: Any, broker_url: str | None, request: pytest.FixtureRequest
) -> None:
    """An anonymous-relay producer's transfers past the stop threshold are taken (enqueued,
    or accepted by the broker) and their outcomes held until the destination resumes. At
    shutdown those outcomes were dropped with the connection: the producer, told nothing,
    would send the messages again, and they would be there twice."""
    name = unique("held-at-shutdown")
    router = qpid_flow_process(
        broker_url=broker_url,
        config_text=f'[destinations."{name}"]\nflow_stop_count = 5\nflow_resume_count = 2\n',
        extra_args=["--disable-plugin", "rabbitmq_depth"],
    )
    messages = [make_message("anon", i, to=name) for i in range(20)]
    producer = Producer(router.url, None, messages, timeout=60)
    threads = start(producer)
    wait_until(lambda: len(producer.outcomes) >= 5, timeout=30)
    time.sleep(1.0)  # every transfer arrived; the ones past the stop wait for their outcome
    assert len(producer.outcomes) < 20, "flow control held no outcome: nothing to test"

    assert router.stop() == 0
    for thread in threads:
        thread.join(30)
    assert Counter(producer.outcomes.values()) == {"accepted": 20}
    if broker_url is not None:
        assert request.getfixturevalue("rabbitmq").queue_depth(name) == 20


def test_transfers_sent_before_the_client_heard_the_close_are_not_taken(qpid_flow_process: Any, tmp_path: Path) -> None:
    """A producer with credit left sends after qpid-flow's close went out (it had not read
    it yet). No outcome can reach it any more, so the message must not be taken: it was
    enqueued and logged as accepted, while the producer, told nothing, sends it again."""
    name = unique("after-close")
    events = tmp_path / "events.jsonl"
    router = qpid_flow_process(extra_args=["--events", str(events)])
    client = FrameSocket(router.port)
    client.send(open_frame("late-producer"), begin_frame(), sender_attach("late", 0, name))
    assert client.read_until(lambda: client.named("flow")), client.received

    router.proc.send_signal(signal.SIGTERM)
    assert client.read_until(lambda: client.named("close"), timeout=10), client.received
    client.send(*(transfer_frame(0, i, f"late-{i}") for i in range(5)))
    assert router.proc.wait(20) == 0
    client.close()

    records = [json.loads(line) for line in events.read_text().splitlines()]
    taken = [r for r in records if r.get("event") in ("enqueue", "transfer_settled") and r.get("address") == name]
    assert taken == []
    assert client.named("close")[0].condition() == "amqp:connection:forced"


def test_a_client_that_opens_after_the_shutdown_began_is_closed_as_forced(
    qpid_flow_process: Any, broker_url: str | None
) -> None:
    """A client still in its handshake when the shutdown began (signed in, its open not sent
    yet) was let in: standalone its open and begin were answered, then the socket closed
    with no close frame; in front of a broker it got a close with no error. Either way a
    client may not reconnect. It gets its open answered and a close with
    amqp:connection:forced, as every other client does, as RabbitMQ closes its own."""
    router = qpid_flow_process(broker_url=broker_url, extra_args=["--disable-plugin", "rabbitmq_depth"])
    late = FrameSocket(router.port)  # signed in, no open yet
    router.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: log_events(router, "shutdown_started"), timeout=10)
    late.send(open_frame("late"), begin_frame())
    assert late.read_until(lambda: late.named("close"), timeout=10), late.received
    assert late.named("close")[0].condition() == "amqp:connection:forced"
    assert not late.named("begin"), "a session was begun on a connection refused at shutdown"
    late.close()
    assert router.proc.wait(20) == 0


def test_a_clean_shutdown_in_front_of_a_broker_logs_no_warning(qpid_flow_process: Any, rabbitmq: Any) -> None:
    """The broker answering qpid-flow's own close was logged as the broker closing the
    connection (``upstream_closed_by_broker``, a warning): every restart fired the alerts
    that watch for it."""
    router = qpid_flow_process(broker_url=rabbitmq.url, extra_args=["--disable-plugin", "rabbitmq_depth"])
    wait_until(lambda: log_events(router, "upstream_connected"), timeout=15)
    assert router.stop() == 0
    records = [json.loads(line) for line in router.log_text().splitlines() if line.startswith("{")]
    assert [r["event"] for r in records if r.get("level") in ("warning", "error")] == []
    assert log_events(router, "stopped")


def test_sighup_shuts_down_cleanly_and_the_event_log_keeps_its_last_records(
    qpid_flow_process: Any, tmp_path: Path
) -> None:
    """SIGHUP (a terminal closed, or `kill -HUP` meant as a reload, which qpid-flow has
    not) ended the process on the spot: no shutdown, and the event log empty when it came
    within its flush interval."""
    path = tmp_path / "events.jsonl"
    router = qpid_flow_process(extra_args=["--events", str(path), "--events-format", "jsonl"])
    name = unique("hangup")
    producer = Producer(router.url, name, [make_message("hup", i) for i in range(5)], timeout=30)
    run_all(producer)
    assert Counter(producer.outcomes.values()) == {"accepted": 5}
    assert router.stop(signal.SIGHUP) == 0
    assert log_events(router, "stopped")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(1 for r in records if r["event"] == "enqueue" and r["address"] == name) == 5, records[-5:]
