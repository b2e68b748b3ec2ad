"""Tests of the test harness itself, against real RabbitMQ, real Proton clients (Python and C)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from .harness.blocking_clients import (
    ClientError,
    numbered_messages,
    receive_messages,
    send_messages,
    unique_address,
)
from .harness.broker import Broker, amqp1_handshake
from .harness.cexamples import ProtonCExamples
from .harness.net import free_ports, port_accepts
from .harness.router import RouterStartError, StartRouter, start_router
from .harness.waiting import wait_until

pytestmark = pytest.mark.integration


def wait_depth(broker: Broker, queue: str, expected: int, timeout: float = 5.0) -> int:
    """Acks reach the queue asynchronously after the client settles: poll briefly."""
    deadline = time.monotonic() + timeout
    while True:
        depth = broker.queue_depth(queue)
        if depth == expected or time.monotonic() > deadline:
            return depth
        time.sleep(0.05)


def test_python_proton_round_trip_keeps_properties_and_group(rabbitmq: Broker) -> None:
    address = unique_address("harness-py")
    sent = numbered_messages(100, group_id="g-1")
    assert send_messages(rabbitmq.url, address, sent) == 100
    assert rabbitmq.queue_depth(address) == 100  # exact right after the sender's accepts

    got = receive_messages(rabbitmq.url, address, 100)

    assert [cast(dict[str, Any], m.body)["seq"] for m in got] == list(range(100))
    assert [m.id for m in got] == [m.id for m in sent]
    assert [m.properties for m in got] == [m.properties for m in sent]
    assert {m.group_id for m in got} == {"g-1"}
    assert [m.group_sequence for m in got] == list(range(100))
    assert wait_depth(rabbitmq, address, 0) == 0


def test_queue_depth_of_missing_queue_raises(rabbitmq: Broker) -> None:
    with pytest.raises(LookupError):
        rabbitmq.queue_depth(unique_address("missing"))


def test_c_example_clients_send_and_receive_1000(rabbitmq: Broker, proton_c_examples: ProtonCExamples) -> None:
    address = unique_address("harness-c")
    hp = [rabbitmq.host, str(rabbitmq.port), address, "1000"]
    send = subprocess.run([str(proton_c_examples.send), *hp], capture_output=True, text=True, timeout=60, check=False)
    assert send.returncode == 0, send.stderr
    assert "1000 messages sent and acknowledged" in send.stdout
    assert rabbitmq.queue_depth(address) == 1000

    recv = subprocess.run(
        [str(proton_c_examples.receive), *hp], capture_output=True, text=True, timeout=60, check=False
    )
    assert recv.returncode == 0, recv.stderr
    lines = recv.stdout.splitlines()
    assert lines[-1] == "1000 messages received"
    # Bodies print as {"sequence"=N}, N = 1..1000 in order (single sender, single queue).
    assert lines[:-1] == [f'{{"sequence"={n}}}' for n in range(1, 1001)]
    # No depth == 0 check here: `receive` detaches right after accepting its last message, and
    # RabbitMQ 3.10 sometimes requeues messages whose accepts arrived just before the detach
    # (measured: 0-224 of 1000 left, ~1 run in 3). Tests that count messages through the broker
    # must tolerate such redeliveries.
    assert rabbitmq.queue_depth(address) <= 1000


def test_fresh_broker_kill_and_restart_on_same_port(fresh_rabbitmq: Broker) -> None:
    broker = fresh_rabbitmq
    port = broker.port
    address = unique_address("harness-kill")

    # A receiver blocked on an empty queue when the broker dies must fail fast, not hang:
    # this is what "broker dies mid-stream" tests rely on.
    errors: list[BaseException] = []

    def wait_for_messages() -> None:
        try:
            receive_messages(broker.url, address, 1, timeout=30)
        except BaseException as e:
            errors.append(e)

    def attached() -> bool:  # RabbitMQ declares the queue of a plain address on attach
        try:
            broker.queue_depth(address)
        except LookupError:
            return False
        return True

    t = threading.Thread(target=wait_for_messages)
    t.start()
    wait_until(attached)
    t0 = time.monotonic()
    broker.kill()
    t.join(20)
    assert not t.is_alive()
    assert errors and isinstance(errors[0], ClientError), errors
    assert time.monotonic() - t0 < 10
    assert not port_accepts(broker.host, port)

    broker.restart()
    assert broker.port == port
    amqp1_handshake(broker.url)
    assert send_messages(broker.url, address, numbered_messages(5)) == 5
    assert broker.queue_depth(address) == 5


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20


# A stand-in for `python -m qpid_flow serve ...`: listens on --listen and echoes its argv, so the
# router launcher is tested without the real qpid-flow.
STUB = """\
#!{python}
import signal, socket, sys
args = sys.argv[3:]  # drop "-m qpid_flow"
print("stub args", args, flush=True)
if "--fail" in args:
    print("stub failing on purpose", flush=True)
    sys.exit(3)
host, port = args[args.index("--listen") + 1].rsplit(":", 1)
if "--config" in args:
    print("config:", open(args[args.index("--config") + 1]).read(), flush=True)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, int(port)))
s.listen()
print('{{"event": "listening"}}', flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
while True:
    s.accept()[0].close()
"""


@pytest.fixture
def stub_python(tmp_path: Path) -> str:
    path = tmp_path / "stub-python"
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def test_router_launcher_with_stub(tmp_path: Path, stub_python: str) -> None:
    router = start_router(
        tmp_path, "amqp://guest:guest@127.0.0.1:1", "[limits]\nx = 1\n", ["--verbose"], python=stub_python
    )
    try:
        assert port_accepts(router.host, router.port)
        assert router.url == f"amqp://127.0.0.1:{router.port}"
        argv = router.argv
        assert argv[1:6] == ["-m", "qpid_flow", "serve", "--listen", f"127.0.0.1:{router.port}"]
        assert argv[6:8] == ["--broker", "amqp://guest:guest@127.0.0.1:1"]
        assert argv[8] == "--config" and argv[9].endswith("qpid-flow.toml")
        assert argv[-1] == "--verbose"
        deadline = time.monotonic() + 5
        while "config: [limits]" not in router.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "config: [limits]" in router.log_text()
        assert router.stop() == 7  # SIGTERM handler ran
    finally:
        router.kill()


def test_router_launcher_reports_early_exit_with_log(tmp_path: Path, stub_python: str) -> None:
    with pytest.raises(RouterStartError, match="exited with code 3") as info:
        start_router(tmp_path, extra_args=["--fail"], python=stub_python)
    assert "stub failing on purpose" in str(info.value)


def test_qpid_flow_process_fixture_runs_the_real_cli(qpid_flow_process: StartRouter) -> None:
    router = qpid_flow_process()  # standalone: no broker needed
    amqp1_handshake(router.url)
    assert f"--listen 127.0.0.1:{router.port}" in router.log_text()
    rc = router.stop()
    assert rc != -signal.SIGKILL, f"qpid-flow ignored SIGTERM for 15 s:\n{router.log_tail()}"
