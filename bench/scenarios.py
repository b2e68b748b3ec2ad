"""The scenarios of the benchmark suite (bench/run.py). Not a test.

Each scenario runs its compared paths in the same run, alternating within each round,
and returns ``{"runs": {path: [run, ...]}, "summary": ..., "targets": [...], "table": [...]}``
where ``table`` is the printed summary. A run that fails is recorded as ``{"error": ...}``
and the scenario carries on; everything a run starts is stopped when it ends.

Rates are messages per second of wall time; ``cpu_us`` is the CPU time (utime + stime from
/proc/PID/stat) the intermediary (qpid-flow or the minimal relay) used during the run,
in microseconds per message; ``broker_cpu_us`` the same for RabbitMQ's Erlang VM.
"""

from __future__ import annotations

import json
import os
import pstats
import shutil
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    BENCH,
    PYTHON,
    BenchError,
    CpuMeter,
    Proc,
    Processes,
    Server,
    Spread,
    client_result,
    cpu_seconds,
    median_of,
    peak_rss_bytes,
    percentile,
    print_table,
    rss_bytes,
    run_pyclient,
    spread_fmt,
    start_minimal_forwarder,
    start_minimal_relay,
    start_qpid_flow,
    summarise,
    verdict,
)

from tests.integration.harness.cexamples import ProtonCExamples, build_c_program, build_examples
from tests.integration.harness.net import free_port
from tests.integration.harness.rabbitmq import RabbitMQBroker

RUN_TIMEOUT = 180.0  # seconds: no single run of any scenario may take longer

IDLE_FLOW_CONFIG = """\
[destinations."bench.>"]
max_count = 10000000
flow_stop_count = 9000000
flow_resume_count = 8000000
"""

GROUPS_CONFIG = """\
[destinations."bench-groups.>"]
shared_groups = true
"""


@dataclass
class Context:
    """What the scenarios share: sizes, the C clients, the broker (started on first use)."""

    workdir: Path
    rounds: int
    quick: bool
    size_factor: float
    connections: int
    latency_rate: float | None = None  # --latency-rate: pace scenario 3 at this rate
    log: Callable[[str], None] = print
    examples: ProtonCExamples | None = None
    broker: RabbitMQBroker | None = None
    broker_error: str | None = None
    previous: dict[str, Any] = field(default_factory=dict)  # results of earlier scenarios

    def count(self, default: int, quick: int) -> int:
        return max(100, int((quick if self.quick else default) * self.size_factor))

    def c_examples(self) -> ProtonCExamples:
        if self.examples is None:
            self.examples = build_examples(BENCH / "results" / "c-examples")
        return self.examples

    def latency_client(self) -> Path:
        """bench/c/latency.c, built on first use."""
        return build_c_program(BENCH / "c" / "latency.c", BENCH / "results" / "c-examples")

    def broker_url(self) -> str:
        """RabbitMQ's URL, starting the private broker the first time."""
        if self.broker_error:
            raise BenchError(self.broker_error)
        if self.broker is None:
            self.log("starting RabbitMQ ...")
            t0 = time.monotonic()
            broker = RabbitMQBroker(start_timeout=120)
            self.broker = broker
            try:
                broker.start()
            except Exception as exc:
                self.broker_error = f"RabbitMQ did not start: {exc}"
                raise BenchError(self.broker_error) from exc
            self.log(f"RabbitMQ up on port {broker.port} in {time.monotonic() - t0:.1f} s")
        return self.broker.url

    def broker_pid(self) -> int | None:
        return self.broker.pid if self.broker is not None else None

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None


def address(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def load_average() -> float:
    return os.getloadavg()[0]


# --- one run of each kind ----------------------------------------------------------------


def run_c_clients(
    ctx: Context, procs: Processes, port: int, addr: str, count: int, server_pid: int | None, *, broker: bool = False
) -> dict[str, Any]:
    """The Proton C send and receive examples, concurrently, at-least-once, against
    127.0.0.1:port. Rates from the start of both to the sender's last acknowledgement
    (``send_rate``) and to the receiver's last message (``rate``)."""
    examples = ctx.c_examples()
    meter = CpuMeter(server=server_pid, broker=ctx.broker_pid() if broker else None).start()
    t0 = time.perf_counter()
    receiver = procs.start(
        "c-receive", [str(examples.receive), "127.0.0.1", str(port), addr, str(count)], stdout_to_log=False
    )
    sender = procs.start("c-send", [str(examples.send), "127.0.0.1", str(port), addr, str(count)])
    send_code = sender.wait(RUN_TIMEOUT)
    sent_at = time.perf_counter()
    receive_code = receiver.wait(max(10.0, RUN_TIMEOUT - (sent_at - t0)))
    done = time.perf_counter()
    cpu = meter.stop()
    if send_code or receive_code:
        raise BenchError(
            f"C clients failed (send {send_code}, receive {receive_code})\n{sender.tail()}\n{receiver.tail()}"
        )
    return run_figures(count, t0, sent_at, done, cpu)


def run_figures(count: int, t0: float, sent_at: float, done: float, cpu: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messages": count,
        "seconds": done - t0,
        "send_rate": count / (sent_at - t0),
        "rate": count / (done - t0),
    }
    if "server" in cpu:
        out["cpu_us"] = 1e6 * cpu["server"] / count
        out["server_cpu_share"] = cpu["server"] / (done - t0)
    if "broker" in cpu:
        out["broker_cpu_us"] = 1e6 * cpu["broker"] / count
    return out


def run_py_clients(
    ctx: Context,
    procs: Processes,
    url: str,
    addr: str,
    count: int,
    server_pid: int | None,
    *,
    groups: int = 0,
    c_receiver_port: int | None = None,
    broker: bool = False,
) -> dict[str, Any]:
    """The Python Proton producer and consumer (bench/pyclients.py, each in its own
    process), concurrently; with ``c_receiver_port`` the consumer is the C receive example."""
    meter = CpuMeter(server=server_pid, broker=ctx.broker_pid() if broker else None).start()
    t0 = time.perf_counter()
    consumer = None
    c_receiver = None
    if c_receiver_port is None:
        consumer = run_pyclient(procs, "py-consume", ["consume", url, addr, str(count), "--timeout", str(RUN_TIMEOUT)])
    else:
        examples = ctx.c_examples()
        c_receiver = procs.start(
            "c-receive",
            [str(examples.receive), "127.0.0.1", str(c_receiver_port), addr, str(count)],
            stdout_to_log=False,
        )
    producer_args = ["produce", url, addr, str(count), "--timeout", str(RUN_TIMEOUT)]
    if groups:
        producer_args += ["--groups", str(groups)]
    producer = run_pyclient(procs, "py-produce", producer_args)
    produced = client_result(producer, RUN_TIMEOUT + 30)
    if consumer is not None:
        last = client_result(consumer, RUN_TIMEOUT + 30)["last"]
    else:
        assert c_receiver is not None
        if c_receiver.wait(RUN_TIMEOUT):
            raise BenchError(f"C receive failed\n{c_receiver.tail()}")
        last = time.time()
    done = time.perf_counter()
    cpu = meter.stop()
    out = run_figures(count, t0, done, done, cpu)
    # Client start-up (interpreter, imports, building the messages) is not the path under
    # test: rates count from the producer's first transfer (time.time() in both processes).
    first = produced["first"]
    out["send_rate"] = count / (produced["last"] - first)
    out["rate"] = count / (max(last, produced["last"]) - first)
    out["seconds"] = max(last, produced["last"]) - first
    return out


StartClients = Callable[[int, float], tuple[Proc, Proc]]


def latency_run(
    procs: Processes,
    clients: StartClients,
    count: int,
    rate: float,
    server_pid: int | None,
    broker_pid: int | None,
) -> dict[str, Any]:
    """One paced run: ``clients(count, rate)`` starts the timing consumer, then the paced
    producer, and returns both (either pair prints the same JSON result)."""
    meter = CpuMeter(server=server_pid, broker=broker_pid).start()
    t0 = time.perf_counter()
    consumer, producer = clients(count, rate)
    produced = client_result(producer, RUN_TIMEOUT + 30)
    consumed = client_result(consumer, RUN_TIMEOUT + 30)
    cpu = meter.stop()
    elapsed = time.perf_counter() - t0
    latencies = consumed["latencies_ms"]
    warmup = max(100, len(latencies) // 50)  # connection set-up and the first credit grants
    steady = latencies[warmup:] or latencies
    out = {
        "messages": count,
        "target_rate": rate,
        "send_rate": count / (produced["last"] - produced["first"]),
        "p50_ms": percentile(steady, 50),
        "p90_ms": percentile(steady, 90),
        "p99_ms": percentile(steady, 99),
        "max_ms": max(steady),
        "warmup_discarded": min(warmup, len(latencies)),
    }
    if "server" in cpu:
        out["cpu_us"] = 1e6 * cpu["server"] / count
    # Share of the run each process spent runnable but waiting for a core (percent).
    for name, waited in meter.waited.items():
        out[f"{name}_runq_pct"] = 100 * waited / elapsed
    return out


def latency_clients(ctx: Context, kind: str, procs: Processes, port: int, url: str) -> StartClients:
    """The C latency clients against 127.0.0.1:port, or the Python ones against url."""
    return c_latency_clients(ctx, procs, port) if kind == "C" else py_latency_clients(procs, url)


def c_latency_clients(ctx: Context, procs: Processes, port: int) -> StartClients:
    """bench/c/latency.c, receive then send, against 127.0.0.1:port."""
    exe = str(ctx.latency_client())

    def start(count: int, rate: float) -> tuple[Proc, Proc]:
        addr = address("bench-latency")
        host = ["127.0.0.1", str(port), addr, str(count)]
        consumer = procs.start("c-latency-receive", [exe, "receive", *host], capture=True)
        time.sleep(0.3)  # the consumer's link is attached before the first message
        producer = procs.start("c-latency-send", [exe, "send", *host, str(rate)], capture=True)
        return consumer, producer

    return start


def py_latency_clients(procs: Processes, url: str) -> StartClients:
    """bench/pyclients.py, consume then produce, against url."""

    def start(count: int, rate: float) -> tuple[Proc, Proc]:
        addr = address("bench-latency")
        timeout = ["--timeout", str(RUN_TIMEOUT)]
        consumer = run_pyclient(procs, "py-consume", ["consume", url, addr, str(count), "--latency", *timeout])
        producer = run_pyclient(procs, "py-produce", ["produce", url, addr, str(count), "--rate", str(rate), *timeout])
        return consumer, producer

    return start


def guarded(ctx: Context, label: str, fn: Callable[[Processes], dict[str, Any]]) -> dict[str, Any]:
    """Run one measurement with its own process set, stopped whatever happens."""
    procs = Processes(ctx.workdir)
    load = load_average()
    try:
        result = fn(procs)
    except BenchError as exc:
        result = {"error": str(exc).splitlines()[0]}
        ctx.log(f"  {label}: FAILED: {exc}")
    finally:
        procs.close()
    result["load_before"] = round(load, 2)
    if "error" not in result:
        shown = {k: v for k, v in result.items() if isinstance(v, int | float) and k != "messages"}
        ctx.log(f"  {label}: " + ", ".join(f"{k} {_short(v)}" for k, v in shown.items()))
    return result


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def rounds_of(ctx: Context, paths: dict[str, Callable[[Processes], dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Every path once per round, the order rotating from round to round."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    names = list(paths)
    for r in range(ctx.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(guarded(ctx, f"round {r + 1} {name}", paths[name]))
    return runs


def relay_container_available() -> bool:
    try:
        from qpid_flow.amqp.reactor import RelayContainer  # noqa: F401
    except ImportError:
        return False
    return True


def ratio_per_round(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for a, b in zip(runs_a, runs_b, strict=False):
        if key in a and key in b and b[key]:
            out.append(a[key] / b[key])
    return out


def ratio_of_medians(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]], key: str) -> float | None:
    a, b = median_of(runs_a, key), median_of(runs_b, key)
    return None if a is None or not b else a / b


def rate_table(
    runs: dict[str, list[dict[str, Any]]], labels: dict[str, str], baseline: str | None = None
) -> list[list[str]]:
    rows = []
    for name, path_runs in runs.items():
        ok = [r for r in path_runs if "error" not in r]
        ratio = ""
        if baseline is not None and baseline in runs:
            rm = ratio_of_medians(path_runs, runs[baseline], "rate")
            ratio = "n/a" if rm is None else f"{rm:.2f}"
        rows.append(
            [
                labels.get(name, name),
                spread_fmt(r["rate"] for r in ok),
                spread_fmt(r.get("send_rate") for r in ok),
                spread_fmt((r.get("cpu_us") for r in ok), 1),
                spread_fmt((r.get("broker_cpu_us") for r in ok), 1),
                *([ratio] if baseline is not None else []),
                f"{len(ok)}/{len(path_runs)}",
            ]
        )
    return rows


def capture_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines: list[str] = []
    print_table(headers, rows, lines.append)
    return lines


RATE_HEADERS = ["path", "msg/s end-to-end", "msg/s producer", "CPU us/msg", "broker CPU us/msg"]


# --- 1. transparent ------------------------------------------------------------------------


def transparent(ctx: Context) -> dict[str, Any]:
    count = ctx.count(20_000, 5_000)
    broker_url = ctx.broker_url()
    broker = ctx.broker
    assert broker is not None

    def direct(procs: Processes) -> dict[str, Any]:
        return run_py_clients(ctx, procs, broker_url, address("bench-transparent"), count, None, broker=True)

    def through(procs: Processes) -> dict[str, Any]:
        server = start_qpid_flow(procs, broker_url=broker_url)
        return run_py_clients(ctx, procs, server.url, address("bench-transparent"), count, server.pid, broker=True)

    runs = rounds_of(ctx, {"direct": direct, "through": through})
    ratios = ratio_per_round(runs["through"], runs["direct"], "rate")
    ratio = ratio_of_medians(runs["through"], runs["direct"], "rate")
    labels = {"direct": "Python clients -> RabbitMQ", "through": "Python clients -> qpid-flow -> RabbitMQ"}
    table = [
        f"1. transparent: 1 Python Proton producer + 1 consumer, {count:,} x 100-byte messages, at-least-once, "
        f"{ctx.rounds} rounds (median (min-max))",
        *capture_table([*RATE_HEADERS, "runs"], rate_table(runs, labels)),
        f"ratio through/direct (end-to-end rate): {_fmt(ratio, 2)}  per round: {spread_fmt(ratios, 2)}",
    ]
    targets = [
        {"target": "transparent: through/direct >= 0.95", "value": ratio, "verdict": verdict(ratio, 0.95)},
    ]
    return {
        "messages": count,
        "runs": runs,
        "summary": _summary(runs),
        "ratio": ratio,
        "targets": targets,
        "table": table,
    }


def _fmt(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    keys = ["rate", "send_rate", "cpu_us", "broker_cpu_us", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
    return {name: summarise(path_runs, keys) for name, path_runs in runs.items()}


# --- 2. saturated --------------------------------------------------------------------------


def saturated(ctx: Context) -> dict[str, Any]:
    count = ctx.count(50_000, 15_000)
    paths: dict[str, Callable[[Processes], dict[str, Any]]] = {}

    def qf_standalone(procs: Processes) -> dict[str, Any]:
        server = start_qpid_flow(procs)
        return run_c_clients(ctx, procs, server.port, address("bench-saturated"), count, server.pid)

    def relay(procs: Processes) -> dict[str, Any]:
        server = start_minimal_relay(procs)
        return run_c_clients(ctx, procs, server.port, address("bench-saturated"), count, server.pid)

    def relay_qf_reactor(procs: Processes) -> dict[str, Any]:
        server = start_minimal_relay(procs, container="qpid-flow")
        return run_c_clients(ctx, procs, server.port, address("bench-saturated"), count, server.pid)

    paths["a_qpid_flow"] = qf_standalone
    paths["b_minimal_relay"] = relay
    if relay_container_available():
        paths["b2_minimal_relay_qf_reactor"] = relay_qf_reactor
    try:
        broker_url = ctx.broker_url()
        broker_port = ctx.broker.port if ctx.broker else 0

        def direct(procs: Processes) -> dict[str, Any]:
            return run_c_clients(ctx, procs, broker_port, address("bench-saturated"), count, None, broker=True)

        def through(procs: Processes) -> dict[str, Any]:
            server = start_qpid_flow(procs, broker_url=broker_url)
            return run_c_clients(ctx, procs, server.port, address("bench-saturated"), count, server.pid, broker=True)

        def floor(procs: Processes) -> dict[str, Any]:
            server = start_minimal_forwarder(procs, broker_url)
            return run_c_clients(ctx, procs, server.port, address("bench-saturated"), count, server.pid, broker=True)

        paths["c_rabbitmq"] = direct
        paths["d_qpid_flow_rabbitmq"] = through
        paths["e_minimal_forwarder_rabbitmq"] = floor
    except BenchError as exc:
        ctx.log(f"  (c) and (d) skipped: {exc}")
    runs = rounds_of(ctx, paths)
    labels = {
        "a_qpid_flow": "(a) C clients -> qpid-flow standalone",
        "b_minimal_relay": "(b) C clients -> minimal relay (Proton's reactor)",
        "b2_minimal_relay_qf_reactor": "(b') ... minimal relay on qpid-flow's reactor",
        "c_rabbitmq": "(c) C clients -> RabbitMQ",
        "d_qpid_flow_rabbitmq": "(d) C clients -> qpid-flow -> RabbitMQ",
        "e_minimal_forwarder_rabbitmq": "(e) C clients -> minimal forwarder (the floor) -> RabbitMQ",
    }
    vs_relay = ratio_of_medians(runs["a_qpid_flow"], runs["b_minimal_relay"], "rate")
    vs_relay_rounds = ratio_per_round(runs["a_qpid_flow"], runs["b_minimal_relay"], "rate")
    cpu_vs_relay = ratio_of_medians(runs["a_qpid_flow"], runs["b_minimal_relay"], "cpu_us")
    standalone = median_of(runs["a_qpid_flow"], "rate")
    vs_relay2 = None
    if "b2_minimal_relay_qf_reactor" in runs:
        vs_relay2 = ratio_of_medians(runs["a_qpid_flow"], runs["b2_minimal_relay_qf_reactor"], "rate")
        vs_relay2_rounds = ratio_per_round(runs["a_qpid_flow"], runs["b2_minimal_relay_qf_reactor"], "rate")
        cpu_vs_relay2 = ratio_of_medians(runs["a_qpid_flow"], runs["b2_minimal_relay_qf_reactor"], "cpu_us")
    table = [
        f"2. saturated: Proton C send + receive examples, concurrently, {count:,} messages (~30-byte bodies), "
        f"at-least-once, {ctx.rounds} rounds",
        *capture_table([*RATE_HEADERS, "runs"], rate_table(runs, labels)),
        f"qpid-flow standalone / minimal relay (rate): {_fmt(vs_relay, 2)}  per round: {spread_fmt(vs_relay_rounds, 2)}"
        f"  CPU per message qpid-flow / relay: {_fmt(cpu_vs_relay, 2)}",
    ]
    if vs_relay2 is not None:
        table.append(
            f"qpid-flow standalone / minimal relay on the same reactor (b'): {_fmt(vs_relay2, 2)}  "
            f"per round: {spread_fmt(vs_relay2_rounds, 2)}  CPU per message: {_fmt(cpu_vs_relay2, 2)}"
        )
    if "d_qpid_flow_rabbitmq" in runs:
        through_ratio = ratio_of_medians(runs["d_qpid_flow_rabbitmq"], runs["c_rabbitmq"], "rate")
        table.append(f"(d)/(c) through qpid-flow / direct to RabbitMQ (rate): {_fmt(through_ratio, 2)}")
        broker_cpu = median_of(runs["d_qpid_flow_rabbitmq"], "cpu_us")
        floor_ratio = ratio_of_medians(runs["e_minimal_forwarder_rabbitmq"], runs["c_rabbitmq"], "rate")
        qf_vs_floor = ratio_of_medians(runs["d_qpid_flow_rabbitmq"], runs["e_minimal_forwarder_rabbitmq"], "rate")
        floor_cpu = median_of(runs["e_minimal_forwarder_rabbitmq"], "cpu_us")
        table.append(
            f"(e)/(c) the floor: one Python process, two Proton passes, nothing else / direct (rate): "
            f"{_fmt(floor_ratio, 2)}  (d)/(e) qpid-flow / floor: {_fmt(qf_vs_floor, 2)}  "
            f"CPU us/msg qpid-flow {_fmt(broker_cpu, 0)}, floor {_fmt(floor_cpu, 0)}"
        )
    broker_targets = []
    if "d_qpid_flow_rabbitmq" in runs:
        through_vs_direct = ratio_of_medians(runs["d_qpid_flow_rabbitmq"], runs["c_rabbitmq"], "rate")
        cpu = median_of(runs["d_qpid_flow_rabbitmq"], "cpu_us")
        broker_targets = [
            {
                "target": "broker mode: through qpid-flow / direct >= 0.6 (d)/(c)",
                "value": through_vs_direct,
                "verdict": verdict(through_vs_direct, 0.6),
            },
            {
                "target": "broker mode: qpid-flow CPU <= 50 us per message at saturation (d)",
                "value": cpu,
                "verdict": verdict(cpu, 50, higher_is_better=False),
            },
        ]
    targets = [
        *broker_targets,
        {
            "target": "saturated: qpid-flow standalone >= 0.9 x minimal relay (b)",
            "value": vs_relay,
            "verdict": verdict(vs_relay, 0.9),
        },
        *(
            [
                {
                    "target": "saturated: qpid-flow standalone >= 0.9 x minimal relay on the same reactor (b')",
                    "value": vs_relay2,
                    "verdict": verdict(vs_relay2, 0.9),
                }
            ]
            if vs_relay2 is not None
            else []
        ),
        {
            "target": "saturated: qpid-flow standalone >= 10,000 msg/s",
            "value": standalone,
            "verdict": verdict(standalone, 10_000),
        },
    ]
    return {
        "messages": count,
        "runs": runs,
        "summary": _summary(runs),
        "ratio_vs_relay": vs_relay,
        "targets": targets,
        "table": table,
    }


# --- 3. latency ------------------------------------------------------------------------------


LOW_LATENCY_RATE = 200.0  # msg/s: the second, lightly loaded, latency point


def latency(ctx: Context) -> dict[str, Any]:
    """Added latency, direct to RabbitMQ and through qpid-flow, at three points:

    - ``half``: half the saturated rate, with the C latency clients (bench/c/latency.c).
      The targets are judged here. C clients, because this machine has two cores: Python
      clients at this rate take about one of them, and what is then measured is mostly
      the clients, the broker and qpid-flow queueing for a core (``py`` below).
    - ``low``: 200 msg/s, C clients: what qpid-flow adds when nothing queues.
    - ``py``: the Python clients of scenario 1 (bench/pyclients.py), at half the
      saturated rate capped to what they sustain; for information.
    """
    broker_url = ctx.broker_url()
    assert ctx.broker is not None  # started by broker_url()
    broker_port = ctx.broker.port
    rate, why = latency_rate(ctx)
    py_rate, py_why = python_latency_rate(ctx, rate, why)
    seconds = 4 if ctx.quick else 10
    points = [
        ("half", rate, why, "C"),
        ("low", LOW_LATENCY_RATE, "light load", "C"),
        ("py", py_rate, py_why, "Python"),
    ]
    paths: dict[str, Callable[[Processes], dict[str, Any]]] = {}
    counts = {}
    for key, point_rate, _why, kind in points:
        count = max(500, int(point_rate * seconds * ctx.size_factor))
        counts[key] = count

        def direct(procs: Processes, r: float = point_rate, n: int = count, c: str = kind) -> dict[str, Any]:
            clients = latency_clients(ctx, c, procs, broker_port, broker_url)
            return latency_run(procs, clients, n, r, None, ctx.broker_pid())

        def through(procs: Processes, r: float = point_rate, n: int = count, c: str = kind) -> dict[str, Any]:
            server = start_qpid_flow(procs, broker_url=broker_url)
            clients = latency_clients(ctx, c, procs, server.port, server.url)
            return latency_run(procs, clients, n, r, server.pid, ctx.broker_pid())

        paths[f"{key}_direct"] = direct
        paths[f"{key}_through"] = through
    ctx.log(f"  C clients paced at {rate:,.0f} and {LOW_LATENCY_RATE:,.0f} msg/s, Python at {py_rate:,.0f} ({why})")
    runs = rounds_of(ctx, paths)
    added: dict[str, dict[str, list[float]]] = {}
    rows = []
    for key, point_rate, _why, kind in points:
        added[key] = {
            p: ratio_free_diff(runs[f"{key}_through"], runs[f"{key}_direct"], p) for p in ("p50_ms", "p90_ms", "p99_ms")
        }
        for name, label in ((f"{key}_direct", "direct to RabbitMQ"), (f"{key}_through", "through qpid-flow")):
            ok = [r for r in runs[name] if "error" not in r]
            rows.append(
                [
                    f"{kind} clients, {point_rate:,.0f} msg/s, {label}",
                    spread_fmt(r["send_rate"] for r in ok),
                    spread_fmt((r["p50_ms"] for r in ok), 2),
                    spread_fmt((r["p90_ms"] for r in ok), 2),
                    spread_fmt((r["p99_ms"] for r in ok), 2),
                    spread_fmt((r["max_ms"] for r in ok), 1),
                    spread_fmt((r.get("cpu_us") for r in ok), 1),
                    spread_fmt((r.get("server_runq_pct") for r in ok), 1),
                    spread_fmt((r.get("broker_runq_pct") for r in ok), 1),
                    f"{len(ok)}/{len(runs[name])}",
                ]
            )
    table = [
        "3. latency: enqueue-to-delivery (application property sent_at, wall clock), paced producer -> consumer; "
        f"C clients (bench/c/latency.c) at {rate:,.0f} msg/s ({why}) and {LOW_LATENCY_RATE:,.0f} msg/s, "
        f"Python clients (bench/pyclients.py) at {py_rate:,.0f} msg/s ({py_why}); "
        f"{seconds} s of messages per run, {ctx.rounds} rounds",
        *capture_table(
            [
                *["path", "sent msg/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "CPU us/msg"],
                *["qf runq %", "broker runq %", "runs"],
            ],
            rows,
        ),
        "runq %: share of the run qpid-flow (qf) / RabbitMQ spent runnable but waiting for a core "
        "(/proc/PID/task/*/schedstat)",
    ]
    for key, point_rate, _why, kind in points:
        table.append(
            f"added by qpid-flow, {kind} clients at {point_rate:,.0f} msg/s (through - direct, per round, "
            "median (min-max)): " + ", ".join(f"{p[:3]} {spread_fmt(v, 2, ' ms')}" for p, v in added[key].items())
        )
    p50 = Spread.of(added["half"]["p50_ms"])
    p99 = Spread.of(added["half"]["p99_ms"])
    targets = [
        {
            "target": f"latency: added p50 <= 1 ms (C clients at {rate:,.0f} msg/s)",
            "value": p50.median if p50 else None,
            "verdict": verdict(p50.median if p50 else None, 1.0, higher_is_better=False),
        },
        {
            "target": f"latency: added p99 <= 5 ms (C clients at {rate:,.0f} msg/s)",
            "value": p99.median if p99 else None,
            "verdict": verdict(p99.median if p99 else None, 5.0, higher_is_better=False),
        },
    ]
    return {
        "messages": counts,
        "rate": rate,
        "rate_from": why,
        "low_rate": LOW_LATENCY_RATE,
        "python_rate": py_rate,
        "python_rate_from": py_why,
        "runs": runs,
        "summary": _summary(runs),
        "added_ms": added,
        "targets": targets,
        "table": table,
    }


def ratio_free_diff(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]], key: str) -> list[float]:
    return [a[key] - b[key] for a, b in zip(runs_a, runs_b, strict=False) if key in a and key in b]


def latency_rate(ctx: Context) -> tuple[float, str]:
    """Half of the saturated rate through qpid-flow in front of RabbitMQ (2d), when that
    was measured in this run (else of 2(a), else 2,000 msg/s); or --latency-rate."""
    if ctx.latency_rate:
        return ctx.latency_rate, "--latency-rate"
    saturated_runs = ctx.previous.get("saturated", {}).get("runs", {})
    sat = median_of(saturated_runs.get("d_qpid_flow_rabbitmq", []), "rate")
    if sat is not None:
        return round(sat / 2, -1), "half the saturated rate of 2(d)"
    sat = median_of(saturated_runs.get("a_qpid_flow", []), "rate")
    if sat is not None:
        return round(sat / 2, -1), "half the saturated rate of 2(a)"
    return 2000.0, "default: 2(d) not measured"


def python_latency_rate(ctx: Context, rate: float, why: str) -> tuple[float, str]:
    """``rate``, capped at 80 % of what the Python clients sustained (scenario 1), so that
    the paced Python producer is not itself the bottleneck."""
    py_rates = [
        median_of(ctx.previous.get("transparent", {}).get("runs", {}).get(p, []), "rate") for p in ("direct", "through")
    ]
    py = min((r for r in py_rates if r), default=None)
    if py and rate > 0.8 * py:
        return round(0.8 * py, -1), f"80% of the Python clients' rate in scenario 1; {why} is {rate:,.0f}"
    return rate, why


# --- 4. policies -----------------------------------------------------------------------------


def policies(ctx: Context) -> dict[str, Any]:
    count = ctx.count(50_000, 15_000)
    py_count = ctx.count(20_000, 5_000)
    groups = 1000

    def c_run(config: str | None = None, events: str | None = None) -> Callable[[Processes], dict[str, Any]]:
        """``events``: the event log's format (None: no event log)."""

        def run(procs: Processes) -> dict[str, Any]:
            events_path = procs.workdir / f"events-{uuid.uuid4().hex[:6]}" if events else None
            server = start_qpid_flow(procs, config=config, events=events_path, events_format=events or "jsonl")
            out = run_c_clients(ctx, procs, server.port, address("bench"), count, server.pid)
            if events_path is not None:
                server.proc.stop()  # the last batch written, the segment finished
                written = [p for p in procs.workdir.glob(events_path.name + "*") if p.is_file()]
                written += [p for p in events_path.glob("*") if p.is_file()] if events_path.is_dir() else []
                out["events_bytes"] = sum(p.stat().st_size for p in written)
                for p in written:
                    p.unlink(missing_ok=True)
                if events_path.is_dir():
                    shutil.rmtree(events_path, ignore_errors=True)
            return out

        return run

    def py_run(group_count: int) -> Callable[[Processes], dict[str, Any]]:
        def run(procs: Processes) -> dict[str, Any]:
            server = start_qpid_flow(procs, config=GROUPS_CONFIG)
            prefix = "bench-groups" if group_count else "bench-plain"
            return run_py_clients(
                ctx,
                procs,
                server.url,
                address(prefix),
                py_count,
                server.pid,
                groups=group_count,
                c_receiver_port=server.port,
            )

        return run

    paths = {
        "c_baseline": c_run(),
        "c_flow_idle": c_run(IDLE_FLOW_CONFIG),
        "c_events": c_run(events="jsonl"),
        "c_events_parquet": c_run(events="parquet"),
        "py_no_groups": py_run(0),
        "py_groups": py_run(groups),
    }
    runs = rounds_of(ctx, paths)
    labels = {
        "c_baseline": "C clients, qpid-flow standalone, no policy (= 2a)",
        "c_flow_idle": "... + flow control configured, not triggered",
        "c_events": "... + event log on (--events, JSON lines)",
        "c_events_parquet": "... + event log on (--events-format parquet)",
        "py_no_groups": f"Python producer -> C receive, no groups ({py_count:,} msgs)",
        "py_groups": f"... group_id round robin over {groups:,} groups (shared_groups)",
    }
    c_runs = {k: runs[k] for k in ("c_baseline", "c_flow_idle", "c_events", "c_events_parquet")}
    py_runs = {k: runs[k] for k in ("py_no_groups", "py_groups")}
    headers = [*RATE_HEADERS, "rate / baseline", "runs"]
    table = [
        f"4. policies: qpid-flow standalone, {ctx.rounds} rounds; C rows {count:,} messages, Python rows {py_count:,}",
        *capture_table(headers, rate_table(c_runs, labels, "c_baseline") + rate_table(py_runs, labels, "py_no_groups")),
    ]
    cpu_notes = []
    for name, base in (
        ("c_flow_idle", "c_baseline"),
        ("c_events", "c_baseline"),
        ("c_events_parquet", "c_baseline"),
        ("py_groups", "py_no_groups"),
    ):
        r = ratio_of_medians(runs[name], runs[base], "cpu_us")
        cpu_notes.append(f"{name} {_fmt(r, 2)}")
    table.append("CPU per message relative to its baseline: " + ", ".join(cpu_notes))
    targets = [
        {
            "target": f"event log on / off >= 0.8 (rate, C clients, {fmt})",
            "value": (value := ratio_of_medians(runs[name], runs["c_baseline"], "rate")),
            "verdict": verdict(value, 0.8),
        }
        for name, fmt in (("c_events", "JSON lines"), ("c_events_parquet", "parquet"))
    ]
    return {
        "messages": count,
        "python_messages": py_count,
        "groups": groups,
        "runs": runs,
        "summary": _summary(runs),
        "targets": targets,
        "table": table,
    }


# --- 5. scale ---------------------------------------------------------------------------------


def scale(ctx: Context) -> dict[str, Any]:
    connections = ctx.connections
    per_connection = 10

    def many_connections(procs: Processes) -> dict[str, Any]:
        server = start_qpid_flow(procs)
        addr = address("bench-scale")
        # A consumer drains the address while the producers send, so the depth stays low.
        # (Before commit ba2f496 it was also needed for the run to finish at all: qpid-flow
        # gives a fresh destination one credit until it knows a message size, and re-asked
        # the producers it starved that way only when the depth fell.)
        receiver = procs.start(
            "c-receive",
            [str(ctx.c_examples().receive), "127.0.0.1", str(server.port), addr, str(connections * per_connection)],
            stdout_to_log=False,
        )
        time.sleep(0.5)
        rss_idle = rss_bytes(server.pid)
        meter = CpuMeter(server=server.pid).start()
        client = procs.start(
            "scale-client",
            [
                PYTHON,
                str(BENCH / "scale_client.py"),
                server.url,
                addr,
                str(connections),
                str(per_connection),
                "--timeout",
                str(RUN_TIMEOUT),
            ],
            capture=True,
        )
        result = _scale_result(client, server)
        if receiver.wait(30):
            raise BenchError(f"C receive failed\n{receiver.tail()}")
        cpu = meter.stop()
        result["rss_idle_mib"] = rss_idle / 2**20
        connect_cpu = result.pop("cpu_at_connected") - meter.start_values["server"]
        result["connect_cpu_ms"] = 1e3 * connect_cpu / connections
        result["cpu_us"] = 1e6 * (cpu.get("server", 0.0) - connect_cpu) / max(1, result["messages"])
        result["rss_per_connection_kib"] = (result["rss_connected_mib"] - result["rss_idle_mib"]) * 1024 / connections
        return result

    conn_runs = [guarded(ctx, f"run {r + 1} {connections} connections", many_connections) for r in range(ctx.rounds)]
    ok = [r for r in conn_runs if "error" not in r]
    table = [
        f"5. scale: {connections:,} connections from one Python process, one producer link each, "
        f"{per_connection} messages each (a C receiver drains them), qpid-flow standalone, {len(conn_runs)} runs",
        *capture_table(
            ["metric", "median (min-max)"],
            [
                ["connect (all links attached), s", spread_fmt((r["connect_s"] for r in ok), 2)],
                ["connections/s", spread_fmt(r["connect_rate"] for r in ok)],
                ["send rate, msg/s (all accepted)", spread_fmt(r["rate"] for r in ok)],
                ["qpid-flow RSS idle, MiB", spread_fmt((r["rss_idle_mib"] for r in ok), 1)],
                ["qpid-flow RSS connected, MiB", spread_fmt((r["rss_connected_mib"] for r in ok), 1)],
                ["qpid-flow RSS after sending, MiB", spread_fmt((r["rss_after_mib"] for r in ok), 1)],
                ["RSS per connection, KiB", spread_fmt((r["rss_per_connection_kib"] for r in ok), 1)],
                ["qpid-flow CPU ms per connection (connect)", spread_fmt((r["connect_cpu_ms"] for r in ok), 2)],
                ["qpid-flow CPU us/msg (send phase)", spread_fmt((r["cpu_us"] for r in ok), 1)],
            ],
        ),
        f"runs ok: {len(ok)}/{len(conn_runs)}" + (f"; error: {conn_runs[0]['error']}" if not ok else ""),
    ]
    drain_runs, drain_table, drain_target = group_drains(ctx)
    table += ["", *drain_table]
    groups_result = guarded(ctx, "bench/groups.py", lambda procs: run_groups_script(ctx, procs))
    if "error" not in groups_result:
        table += ["", "100,000 groups (bench/groups.py, in process):", *groups_result.pop("lines")]
    else:
        table += ["", f"bench/groups.py failed: {groups_result['error']}"]
    return {
        "connections": connections,
        "per_connection": per_connection,
        "runs": {"connections": conn_runs},
        "summary": {
            "connections": summarise(
                conn_runs,
                [
                    "connect_s",
                    "connect_rate",
                    "rate",
                    "rss_connected_mib",
                    "rss_after_mib",
                    "rss_per_connection_kib",
                    "connect_cpu_ms",
                    "cpu_us",
                ],
            )
        },
        "groups": groups_result,
        "group_drains": drain_runs,
        "summary_group_drains": _summary(drain_runs),
        "targets": [drain_target],
        "table": table,
    }


def group_drains(ctx: Context) -> tuple[dict[str, list[dict[str, Any]]], list[str], dict[str, Any]]:
    """Through qpid-flow: a grouped destination filled with as many messages as groups
    (100,000: every group active at once), then drained by the C receive example; against
    the same messages over 10 groups. The drain is the part the group table is on: every
    message is dispatched, assigned, delivered and settled, and its group freed."""
    count = ctx.count(100_000, 20_000)

    def drain(group_count: int) -> Callable[[Processes], dict[str, Any]]:
        def run(procs: Processes) -> dict[str, Any]:
            server = start_qpid_flow(procs, config=GROUPS_CONFIG)
            addr = address("bench-groups")
            producer = run_pyclient(
                procs,
                "py-produce",
                ["produce", server.url, addr, str(count), "--groups", str(group_count), "--timeout", str(RUN_TIMEOUT)],
            )
            client_result(producer, RUN_TIMEOUT + 30)  # all accepted: every message waits in qpid-flow
            meter = CpuMeter(server=server.pid).start()
            t0 = time.perf_counter()
            receiver = procs.start(
                "c-receive",
                [str(ctx.c_examples().receive), "127.0.0.1", str(server.port), addr, str(count)],
                stdout_to_log=False,
            )
            if receiver.wait(RUN_TIMEOUT):
                raise BenchError(f"C receive failed\n{receiver.tail()}")
            done = time.perf_counter()
            return run_figures(count, t0, done, done, meter.stop())

        return run

    many = ctx.count(100_000, 20_000)
    runs = rounds_of(ctx, {"groups_10": drain(10), "groups_many": drain(many)})
    labels = {
        "groups_10": f"drain {count:,} waiting messages over 10 groups",
        "groups_many": f"drain {count:,} waiting messages over {many:,} groups",
    }
    rows = rate_table(runs, labels, "groups_10")
    rate_ratio = ratio_of_medians(runs["groups_many"], runs["groups_10"], "rate")
    cpu_ratio = ratio_of_medians(runs["groups_10"], runs["groups_many"], "cpu_us")
    # Each round runs both paths back to back, so a per-round ratio shows how much of the
    # spread is the machine drifting between rounds rather than the group count.
    round_ratios = ratio_per_round(runs["groups_many"], runs["groups_10"], "rate")
    table = [
        f"{many:,} groups through qpid-flow standalone: a Python producer fills a shared_groups destination "
        f"(group_id round robin), then the C receive example drains it; {ctx.rounds} rounds",
        *capture_table([*RATE_HEADERS, "rate / 10 groups", "runs"], rows),
        f"rate({many:,} groups) / rate(10 groups) = {_fmt(rate_ratio, 2)} "
        f"(target >= 0.8: {verdict(rate_ratio, 0.8)}); per round: {spread_fmt(round_ratios, 2)}; "
        f"CPU per message, 10 groups / {many:,} groups = {_fmt(cpu_ratio, 2)}",
    ]
    target = {
        "target": f"{many:,} groups: drain rate through qpid-flow >= 0.8 x 10 groups",
        "value": rate_ratio,
        "verdict": verdict(rate_ratio, 0.8),
    }
    return runs, table, target


def _scale_result(client: Any, server: Server) -> dict[str, Any]:
    """Follow the scale client's progress lines and sample qpid-flow's RSS at each stage."""
    assert client.popen.stdout is not None
    deadline = time.monotonic() + RUN_TIMEOUT + 30
    result: dict[str, Any] = {}
    rss: dict[str, float] = {}
    for raw in client.popen.stdout:
        line = raw.decode(errors="replace").strip()
        if line == "connected":
            rss["connected"] = rss_bytes(server.pid) / 2**20
            result["cpu_at_connected"] = cpu_seconds(server.pid)
        elif line.startswith("{"):
            result.update(json.loads(line))
        if time.monotonic() > deadline:
            break
    client.wait(30)
    if not result or result.get("error"):
        raise BenchError(f"scale client: {result.get('error') if result else 'no result'}\n{client.tail()}")
    result.pop("error", None)
    result["rss_connected_mib"] = rss.get("connected", float("nan"))
    result["rss_after_mib"] = rss_bytes(server.pid) / 2**20
    result["rss_peak_mib"] = peak_rss_bytes(server.pid) / 2**20
    return result


def run_groups_script(ctx: Context, procs: Processes) -> dict[str, Any]:
    out_json = procs.workdir / f"groups-{uuid.uuid4().hex[:6]}.json"
    args = [PYTHON, str(BENCH / "groups.py"), "--json", str(out_json)]
    if ctx.quick:
        args += ["--messages", "50000", "--rounds", "1"]
    proc = procs.start("groups.py", args)
    code = proc.wait(600)
    text = proc.log.read_text(errors="replace") if proc.log else ""
    if code or not out_json.exists():
        raise BenchError(f"bench/groups.py exited with code {code}\n{proc.tail()}")
    data = json.loads(out_json.read_text())
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("groups") and "dispatch" in line), 0)
    data["lines"] = [line for line in lines[start:] if not line.startswith("$ ")]
    return data


# --- profile (opt-in) ---------------------------------------------------------------------------


def profile(ctx: Context, broker: bool = False, events: str | None = None) -> dict[str, Any]:
    """Scenario 2(a) (``broker``: 2(d)) once with qpid-flow under cProfile; the top
    functions by tottime. ``events``: with the event log on, in that format."""
    count = ctx.count(50_000, 15_000)
    prof = ctx.workdir / f"qpid-flow{'-broker' if broker else ''}{'-events' if events else ''}.prof"
    broker_url = ctx.broker_url() if broker else None
    events_path = ctx.workdir / "profile-events" if events else None

    def run(procs: Processes) -> dict[str, Any]:
        server = start_qpid_flow(
            procs, profile=prof, broker_url=broker_url, events=events_path, events_format=events or "jsonl"
        )
        out = run_c_clients(
            ctx, procs, server.port, address("bench-profile"), count, server.pid, broker=broker_url is not None
        )
        server.proc.stop(signal.SIGINT, timeout=30)  # cProfile writes its file on a clean exit
        return out

    scenario = "2(d)" if broker else "2(a)"
    result = guarded(ctx, f"{scenario} under cProfile", run)
    table = [
        f"profile: qpid-flow {'in front of RabbitMQ' if broker else 'standalone'} under cProfile, "
        f"scenario {scenario}, {count:,} messages "
        f"(rate under the profiler: {_fmt(result.get('rate'))} msg/s)"
    ]
    if prof.exists():
        stats = pstats.Stats(str(prof))
        # time.sleep: start-up and the shutdown grace period, not the data path.
        slept = sum(v[2] for k, v in stats.stats.items() if k[2] == "<built-in method time.sleep>")  # type: ignore[attr-defined]
        total = stats.total_tt - slept  # type: ignore[attr-defined]
        rows = []
        entries = sorted(
            ((k, v) for k, v in stats.stats.items() if k[2] != "<built-in method time.sleep>"),  # type: ignore[attr-defined]
            key=lambda kv: kv[1][2],
            reverse=True,
        )
        for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in entries[:25]:
            where = f"{_short_path(filename)}:{line}({func})" if line else func
            rows.append(
                [
                    where,
                    f"{ncalls:,}",
                    f"{tottime:.2f}",
                    f"{100 * tottime / total:.1f}%",
                    f"{cumtime:.2f}",
                    f"{1e6 * tottime / count:.1f}",
                ]
            )
        table += capture_table(["function", "calls", "tottime s", "share", "cumtime s", "us/msg"], rows)
        table.append(
            f"total profiled time (time.sleep excluded; start-up included) {total:.2f} s "
            f"= {1e6 * total / count:.0f} us per message"
        )
        result["top"] = [
            dict(zip(["function", "calls", "tottime", "share", "cumtime", "us_per_msg"], r, strict=True)) for r in rows
        ]
    else:
        table.append("no profile written")
    return {"messages": count, "runs": {"profile": [result]}, "targets": [], "table": table}


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "/work/main/", str(BENCH.parent) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return Path(filename).name if "/" in filename else filename


# --- metrics scraping ----------------------------------------------------------------------


SCRAPE_INTERVAL = 1.0  # seconds, a busy Prometheus' rate


class _Scraper(threading.Thread):
    """GET /metrics every SCRAPE_INTERVAL until stopped, as Prometheus would."""

    def __init__(self, admin: str) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{admin}/metrics"
        self.stopping = threading.Event()
        self.scrapes = 0
        self.bytes = 0

    def run(self) -> None:
        while not self.stopping.wait(SCRAPE_INTERVAL):
            with urllib.request.urlopen(self.url, timeout=10) as response:
                self.bytes = len(response.read())
            self.scrapes += 1


def scrape(ctx: Context) -> dict[str, Any]:
    """Scenario 2(a) (C clients, standalone) with the admin endpoint on, without and with a
    scraper polling /metrics every second, in one run: what collecting costs the data path.
    Runs long enough (~8 s each) for several scrapes to land in each."""
    count = ctx.count(300_000, 60_000)
    scrapes: list[int] = []

    def run(procs: Processes, scraped: bool) -> dict[str, Any]:
        admin = f"127.0.0.1:{free_port()}"
        server = start_qpid_flow(procs, config=f'admin = "{admin}"\n')
        scraper = _Scraper(admin)
        if scraped:
            scraper.start()
        try:
            return run_c_clients(ctx, procs, server.port, address("bench-scrape"), count, server.pid)
        finally:
            scraper.stopping.set()
            if scraped:
                scraper.join(15)
                scrapes.append(scraper.scrapes)

    paths: dict[str, Callable[[Processes], dict[str, Any]]] = {
        "a_unscraped": lambda procs: run(procs, False),
        "b_scraped": lambda procs: run(procs, True),
    }
    runs = rounds_of(ctx, paths)
    labels = {
        "a_unscraped": "(a) qpid-flow standalone, admin endpoint on, no scraper",
        "b_scraped": f"(b) the same, /metrics scraped every {SCRAPE_INTERVAL:.0f} s",
    }
    ratio = ratio_of_medians(runs["b_scraped"], runs["a_unscraped"], "rate")
    rounds = ratio_per_round(runs["b_scraped"], runs["a_unscraped"], "rate")
    cpu = ratio_of_medians(runs["b_scraped"], runs["a_unscraped"], "cpu_us")
    table = [
        f"metrics: C clients, {count:,} messages, standalone, {ctx.rounds} rounds; scrapes per run: {scrapes}",
        *capture_table([*RATE_HEADERS, "runs"], rate_table(runs, labels)),
        f"scraped / unscraped (rate): {_fmt(ratio, 3)}  per round: {spread_fmt(rounds, 3)}"
        f"  CPU per message: {_fmt(cpu, 3)}",
    ]
    targets = [
        {
            "target": "metrics: standalone rate scraped every second >= 0.95 x unscraped",
            "value": ratio,
            "verdict": verdict(ratio, 0.95),
        }
    ]
    return {"messages": count, "runs": runs, "summary": _summary(runs), "targets": targets, "table": table}


SCENARIOS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "transparent": transparent,
    "saturated": saturated,
    "scrape": scrape,
    "latency": latency,
    "policies": policies,
    "scale": scale,
}
OPT_IN: dict[str, Callable[[Context], dict[str, Any]]] = {
    "profile": profile,
    "profile_broker": lambda ctx: profile(ctx, broker=True),
    "profile_events": lambda ctx: profile(ctx, events="parquet"),
}


def stop_all(ctx: Context) -> None:
    ctx.stop_broker()


__all__ = ["OPT_IN", "SCENARIOS", "Context", "stop_all"]
