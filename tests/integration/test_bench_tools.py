"""The benchmark's own tools still work: the minimal relay (bench/minimal_relay.py) on both
reactors, the C latency clients (bench/c/latency.c), and the fresh Spark processes
bench/report.py measures the report against. A benchmark whose comparator fails prints
"n/a" where a ratio should be, so these run with the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness.blocking_clients import unique_address
from .harness.cexamples import ProtonCExamples, build_c_program
from .harness.net import free_port, port_accepts
from .harness.router import StartRouter, admin_request
from .harness.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["proton", "qpid-flow"])
def relay_port(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    log = open(tmp_path / "relay.log", "wb")  # noqa: SIM115 - closed below
    relay = [sys.executable, str(ROOT / "bench" / "minimal_relay.py"), "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*relay, "--container", request.param],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 20
        while not port_accepts("127.0.0.1", port):
            assert proc.poll() is None, (tmp_path / "relay.log").read_text()
            assert time.monotonic() < deadline, "the minimal relay did not start listening"
            time.sleep(0.05)
        yield port
        assert proc.poll() is None, "the relay died:\n" + (tmp_path / "relay.log").read_text()
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_minimal_relay_passes_c_clients_through(relay_port: int, proton_c_examples: ProtonCExamples) -> None:
    address = unique_address("relay")
    argv = ["127.0.0.1", str(relay_port), address, "2000"]
    receiver = subprocess.Popen([str(proton_c_examples.receive), *argv], stdout=subprocess.PIPE, text=True)
    sent = subprocess.run([str(proton_c_examples.send), *argv], capture_output=True, text=True, timeout=60)
    out, _ = receiver.communicate(timeout=60)
    assert sent.returncode == 0, sent.stderr
    assert "2000 messages sent and acknowledged" in sent.stdout
    assert receiver.returncode == 0
    assert "2000 messages received" in out


def consumers_of(admin: str, address: str) -> int:
    """How many consumers ``address`` has, from qpid-flow's admin endpoint (0 before it exists)."""
    try:
        with urllib.request.urlopen(admin_request(admin, f"/v1/destinations/{address}"), timeout=10) as response:
            return int(json.load(response)["consumers"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return 0
        raise


def test_c_latency_clients_time_every_message(tmp_path: Path, qpid_flow_process: StartRouter) -> None:
    exe = build_c_program(ROOT / "bench" / "c" / "latency.c", tmp_path)
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(extra_args=["--admin", admin])
    address = unique_address("latency")
    argv = ["127.0.0.1", str(router.port), address, "500"]
    receiver = subprocess.Popen([str(exe), "receive", *argv], stdout=subprocess.PIPE, text=True)
    wait_until(lambda: consumers_of(admin, address) >= 1)  # the receiver is attached before the sender sends
    sent = subprocess.run([str(exe), "send", *argv, "1000"], capture_output=True, text=True, timeout=60)
    out, _ = receiver.communicate(timeout=60)
    produced, consumed = json.loads(sent.stdout), json.loads(out)
    assert produced["error"] is None and produced["count"] == 500
    assert consumed["error"] is None and consumed["count"] == 500
    # Paced at 1,000 msg/s: 500 messages take about half a second, not an instant.
    assert produced["last"] - produced["first"] >= 0.45
    latencies = consumed["latencies_ms"]
    assert len(latencies) == 500 and all(0 <= x < 5000 for x in latencies)


@pytest.mark.parametrize("mode", ["count", "parse", "floor"])
def test_the_report_benchmark_bars_read_every_event(tmp_path: Path, mode: str) -> None:
    """bench/report.py's fresh-process runs beside the report: read and count, read and
    parse, and the floor (the per-message pass and its latency table: one row per
    destination the messages went to)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import report as report_bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from qpid_flow.analytics.synthetic import generate

    logs = tmp_path / "logs"
    expected = generate(logs, runs=2, messages=300)
    ran = subprocess.run(
        [sys.executable, "-c", report_bench._COUNT, "1g", "jsonl", mode, str(logs)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        # No class archive there: the floor must then run without one, and record none.
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    printed = int(ran.stdout.strip().splitlines()[-1])
    if mode == "floor":
        assert printed == 2  # the flow-controlled destination and the grouped one
        assert not list((tmp_path / "cache").rglob("*.jsa*"))
    else:
        assert printed == expected.events
