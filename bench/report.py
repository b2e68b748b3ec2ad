"""Benchmark: ``qpid-flow report`` on 1M and 5M generated events. Not a test.

    .venv/bin/python bench/report.py [--sizes 1000000,5000000] [--keep DIR]

For each size, generates an event log (qpid_flow.analytics.synthetic: a grouped
destination with releases and injected violations, a flow-controlled one; several runs,
one file each) and times, in one Spark session per size as the command would:

- session start (JVM and SparkSession),
- the whole report (read and cache, flow control, latency, group audit, advice, tables,
  plots, page), and each of its steps,

then checks the report found exactly the injected violations. Prints the machine's core
count, memory and versions with the figures, and writes them as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qpid_flow.analytics.inputs import expand_inputs  # noqa: E402
from qpid_flow.analytics.synthetic import generate  # noqa: E402

# Events per grouped message: enqueue, deliver, settle, group assigned and released.
EVENTS_PER_MESSAGE = 5.0


def run_size(events: int, workdir: Path) -> dict[str, Any]:
    from pyspark import __version__ as spark_version

    from qpid_flow.analytics.report import run_report
    from qpid_flow.analytics.session import build_session

    runs = 8
    messages = int(events / EVENTS_PER_MESSAGE / runs)
    logs = workdir / f"logs-{events}"
    t0 = time.perf_counter()
    expected = generate(
        logs,
        runs=runs,
        messages=messages,
        groups=2000,
        consumers=8,
        window=20,
        inject_order=12,
        inject_overlap=9,
        flow_cycles=20,
        stop=800,
        resume=600,
        maximum=1000,
    )
    generated = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in logs.iterdir())
    t1 = time.perf_counter()
    spark = build_session()
    started = time.perf_counter() - t1
    progress = io.StringIO()
    try:
        t2 = time.perf_counter()
        result = run_report(spark, expand_inputs([str(logs)]), workdir / f"out-{events}", progress_out=progress)
        report = time.perf_counter() - t2
    finally:
        spark.stop()
    found_order = {(r["address"], r["group"], r["seq"]) for r in result.order_violations}
    found_overlap = {(r["address"], r["group"], r["consumer"]) for r in result.overlap_violations}
    return {
        "events": expected.events,
        "bytes": size,
        "generate_s": generated,
        "session_start_s": started,
        "report_s": report,
        "events_per_s": expected.events / report,
        "steps_s": dict(result.step_seconds),
        "violations_ok": found_order == expected.order and found_overlap == expected.overlap,
        "spark": spark_version,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--keep", type=Path, help="keep the logs and reports in this folder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="qpid-flow-bench-report-"))
    workdir.mkdir(parents=True, exist_ok=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"machine: {os.cpu_count()} cores, {memory:.1f} GiB, Python {platform.python_version()}", flush=True)
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            print(f"\n{size:,} events ...", flush=True)
            figures = run_size(size, workdir)
            results.append(figures)
            print(
                f"  {figures['events']:,} events, {figures['bytes'] / 2**20:,.0f} MiB of JSON lines "
                f"(generated in {figures['generate_s']:.0f} s)\n"
                f"  Spark {figures['spark']} session start: {figures['session_start_s']:.1f} s\n"
                f"  report: {figures['report_s']:.1f} s ({figures['events_per_s']:,.0f} events/s)\n"
                + "".join(f"    {name}: {seconds:.1f} s\n" for name, seconds in figures["steps_s"].items())
                + f"  injected violations found exactly: {figures['violations_ok']}",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "results": results}, indent=2))
    return 0 if all(r["violations_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
