"""Benchmark: what flow control costs, and how fast producers resume. Not a test.

    .venv/bin/python bench/flow_control.py [--messages 50000] [--rounds 3] [--json out.json]

Runs qpid-flow standalone with the Proton C example clients (one sender, one receiver,
at-least-once, running together) in three configurations, alternating, several rounds:

- ``off``: no thresholds on the destination;
- ``on-idle``: thresholds configured but never reached;
- ``on-cycling``: stop 900 / resume 500 with the receiver running: flow turns ON and OFF
  as the receiver falls behind.

Then, with Python Proton clients, the resume latency: a destination is filled to its stop
threshold, a consumer drains it, and the time from the consumer's settlement that takes
the depth below the resume threshold to the producer's next accepted transfer is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.clients import Consumer, Producer, make_message, run_all, start  # noqa: E402
from tests.integration.harness.cexamples import build_examples  # noqa: E402
from tests.integration.harness.net import free_port, wait_for_port  # noqa: E402

CONFIGS = {
    "off": "",
    "on-idle": '[destinations."bench"]\nmax_count = 10000000\nflow_stop_count = 9000000\nflow_resume_count = 8000000\n',
    "on-cycling": '[destinations."bench"]\nmax_count = 1000\nflow_stop_count = 900\nflow_resume_count = 500\n',
}


def start_router(config: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    path = workdir / f"qpid-flow-{port}.toml"
    path.write_text(config)
    log = open(workdir / f"qpid-flow-{port}.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "qpid_flow", "serve", "--listen", f"127.0.0.1:{port}", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    if not wait_for_port("127.0.0.1", port, 30, alive=lambda: proc.poll() is None):
        raise RuntimeError("qpid-flow did not start")
    return proc, port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(examples, config: str, messages: int, workdir: Path) -> dict[str, float]:
    proc, port = start_router(config, workdir)
    try:
        cpu0 = cpu_seconds(proc.pid)
        t0 = time.perf_counter()
        receiver = subprocess.Popen(
            [str(examples.receive), "127.0.0.1", str(port), "bench", str(messages)], stdout=subprocess.DEVNULL
        )
        sender = subprocess.run(
            [str(examples.send), "127.0.0.1", str(port), "bench", str(messages)], capture_output=True, timeout=600
        )
        sent_at = time.perf_counter()
        receiver.wait(600)
        elapsed = time.perf_counter() - t0
        if sender.returncode or receiver.returncode:
            raise RuntimeError(f"clients failed: {sender.stderr.decode()}")
        return {
            "producer_rate": messages / (sent_at - t0),
            "end_to_end_rate": messages / elapsed,
            "cpu_us_per_message": 1e6 * (cpu_seconds(proc.pid) - cpu0) / messages,
        }
    finally:
        proc.terminate()
        proc.wait(20)


def resume_latency(workdir: Path) -> float:
    proc, port = start_router(CONFIGS["on-cycling"], workdir)
    url = f"amqp://127.0.0.1:{port}"
    try:
        producer = Producer(url, "bench", [make_message("p", i) for i in range(1000)], timeout=60)
        threads = start(producer)
        while len(producer.outcomes) < 901:
            time.sleep(0.01)
        time.sleep(0.5)
        stopped_at = max(producer.settled_at.values())
        consumer = Consumer(url, "bench", count=1000, prefetch=10, timeout=60)
        run_all(consumer)
        for t in threads:
            t.join(30)
        # The 402nd settlement takes the depth from 901 to 499: below the resume threshold.
        crossing = sorted(r.settled_at for r in consumer.received)[401]
        resumed = min(t for t in producer.settled_at.values() if t > stopped_at)
        return resumed - crossing
    finally:
        proc.terminate()
        proc.wait(20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qpid-flow-bench-") as tmp:
        workdir = Path(tmp)
        examples = build_examples(workdir / "c")
        results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
        for round_number in range(args.rounds):
            for name, config in CONFIGS.items():  # alternate configurations within each round
                results[name].append(throughput(examples, config, args.messages, workdir))
                print(f"round {round_number + 1} {name:11s} {results[name][-1]}", flush=True)
        latencies = [resume_latency(workdir) for _ in range(args.rounds)]
    summary: dict[str, object] = {"messages": args.messages, "rounds": args.rounds, "cores": os.cpu_count()}
    print(f"\n{'config':11s} {'producer msg/s (median, min-max)':>34s} {'CPU us/msg':>11s}")
    for name, runs in results.items():
        rates = [r["producer_rate"] for r in runs]
        cpu = statistics.median(r["cpu_us_per_message"] for r in runs)
        print(f"{name:11s} {statistics.median(rates):>16.0f} ({min(rates):.0f}-{max(rates):.0f}) {cpu:>14.1f}")
        summary[name] = {"producer_rate_median": statistics.median(rates), "runs": runs, "cpu_us_per_message": cpu}
    ms = [1000 * x for x in latencies]
    print(
        f"\nresume latency (depth below resume -> producer's next accepted transfer): "
        f"median {statistics.median(ms):.1f} ms, min {min(ms):.1f}, max {max(ms):.1f}"
    )
    summary["resume_latency_ms"] = ms
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
