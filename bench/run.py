"""qpid-flow's benchmark suite: every scenario, side by side, in one command. Not a test.

    .venv/bin/python bench/run.py [--quick] [--only NAME[,NAME...]] [--rounds N] [--json bench/results/latest.json]

Scenarios (see BENCHMARKS.md for what each measures and the latest figures):

  transparent  Python Proton producer + consumer: direct to RabbitMQ vs through qpid-flow
  saturated    Proton C send + receive: qpid-flow standalone, the minimal relay
               (bench/minimal_relay.py), RabbitMQ direct, qpid-flow in front of RabbitMQ, and
               the minimal forwarder in front of RabbitMQ (bench/minimal_forwarder.py: the floor)
  scrape       2(a) with the admin endpoint on: no scraper vs /metrics polled every second
  latency      paced producer (C clients; Python clients for information), enqueue-to-delivery
               p50/p90/p99, direct vs through
  policies     2(a) with idle flow control, with the event log, and 1,000 message groups
  scale        1,000 connections with a producer each; 100,000 groups (bench/groups.py)
  profile      (only with --only profile) 2(a) with qpid-flow under cProfile: top functions
  profile_broker  (only with --only profile_broker) the same for 2(d), in front of RabbitMQ
  profile_events  (only with --only profile_events) the same for 2(a) with the parquet event log

Each scenario alternates its paths within each round (the order rotating), ``--rounds``
rounds (default 3; 1 with --quick), and prints median (min-max) over the rounds.
RabbitMQ (a private node on free ports) is started once, on first use, and stopped at
the end; every process started is stopped, also on error or Ctrl-C.

Other options: ``--size F`` multiplies every message count (bigger runs: ``--size 4``),
``--connections N`` (scale; default 1,000), ``--workdir DIR`` (logs of every process;
default: a temporary folder, removed at the end).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from common import ROOT, install_signal_handlers  # noqa: E402
from scenarios import OPT_IN, SCENARIOS, Context, stop_all  # noqa: E402


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str] = {"python": platform.python_version()}
    try:
        import proton

        versions["python-qpid-proton"] = ".".join(str(v) for v in proton.VERSION)
    except ImportError:
        versions["python-qpid-proton"] = "missing"
    for package in ("rabbitmq-server", "libqpid-proton11"):
        found = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
        versions[package] = found.stdout.strip() if found.returncode == 0 else "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "qpid_flow"], capture_output=True, text=True, cwd=ROOT)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu_model": cpu_model,
        "versions": versions,
        "qpid_flow_commit": commit.stdout.strip() + (" + uncommitted changes in qpid_flow/" if dirty.stdout else ""),
        "load_average": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts and 1 round (about 4 minutes)")
    parser.add_argument("--only", help="comma-separated scenarios: " + ", ".join([*SCENARIOS, *OPT_IN]))
    parser.add_argument("--rounds", type=int, help="rounds per scenario (default 3, --quick 1)")
    parser.add_argument("--size", type=float, default=1.0, help="multiply every message count by this")
    parser.add_argument("--connections", type=int, default=1000, help="connections in the scale scenario")
    parser.add_argument(
        "--latency-rate",
        type=float,
        help="pace scenario 3 at this rate (default: half of 2(d) measured in the same run, else 2,000)",
    )
    parser.add_argument("--json", type=Path, help="write the results here (e.g. bench/results/latest.json)")
    parser.add_argument("--workdir", type=Path, help="keep every process's log here")
    args = parser.parse_args()

    names = list(SCENARIOS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS and n not in OPT_IN]
        if unknown:
            parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join([*SCENARIOS, *OPT_IN])}")
    install_signal_handlers()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="qpid-flow-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(
        workdir=workdir,
        rounds=args.rounds or (1 if args.quick else 3),
        quick=args.quick,
        size_factor=args.size,
        connections=args.connections,
        latency_rate=args.latency_rate,
    )
    meta = machine_info()
    meta.update(rounds=ctx.rounds, quick=args.quick, size=args.size, scenarios=names)
    print(
        f"qpid-flow benchmarks {meta['date']}: {meta['cores']} cores ({meta['cpu_model']}), "
        f"Python {meta['versions']['python']}, python-qpid-proton {meta['versions']['python-qpid-proton']}, "
        f"RabbitMQ {meta['versions']['rabbitmq-server']}, qpid-flow {meta['qpid_flow_commit']}, "
        f"load average {meta['load_average'][0]:.2f}; {ctx.rounds} round(s)",
        flush=True,
    )
    results: dict[str, Any] = {"meta": meta, "scenarios": {}}
    started = time.monotonic()
    failed = False
    try:
        for name in names:
            fn = SCENARIOS.get(name) or OPT_IN[name]
            print(f"\n== {name}", flush=True)
            t0 = time.monotonic()
            try:
                result = fn(ctx)
            except Exception as exc:  # one scenario failing must not lose the others
                failed = True
                result = {"error": f"{type(exc).__name__}: {exc}", "table": [f"{name}: FAILED: {exc}"], "targets": []}
            result["seconds"] = time.monotonic() - t0
            results["scenarios"][name] = result
            ctx.previous[name] = result
            print("\n".join(result["table"]), flush=True)
            if args.json:
                write_json(args.json, results)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", file=sys.stderr, flush=True)
        failed = True
    finally:
        stop_all(ctx)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    results["meta"]["seconds"] = time.monotonic() - started
    print_summary(results)
    if args.json:
        write_json(args.json, results)
        print(f"\nresults written to {args.json}")
    return 1 if failed else 0


def print_summary(results: dict[str, Any]) -> None:
    meta = results["meta"]
    print("\n" + "=" * 100)
    print(
        f"SUMMARY {meta['date']}  {meta['cores']} cores, {meta['cpu_model']}  Python {meta['versions']['python']}, "
        f"python-qpid-proton {meta['versions']['python-qpid-proton']}, RabbitMQ {meta['versions']['rabbitmq-server']}"
    )
    print(f"qpid-flow {meta['qpid_flow_commit']}; {meta['rounds']} round(s); total {meta['seconds'] / 60:.1f} min")
    for result in results["scenarios"].values():
        print()
        print("\n".join(result["table"]))
    targets = [t for r in results["scenarios"].values() for t in r.get("targets", [])]
    if targets:
        print("\ntargets:")
        width = max(len(t["target"]) for t in targets)
        for t in targets:
            value = t["value"]
            shown = "n/a" if value is None else (f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}")
            print(f"  {t['target']:<{width}}  measured {shown:>8}  {t['verdict']}")


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in results.items()}
    path.write_text(json.dumps(clean, indent=2, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
