"""Benchmark: ``qpid-flow report`` against a bare Spark read of the same events. Not a test.

    .venv/bin/python bench/report.py [--sizes 2000000] [--format jsonl|parquet] [--keep DIR] [--json FILE]

For each size, generates an event log (qpid_flow.analytics.synthetic: a grouped
destination with releases and injected violations, a flow-controlled one; 8 runs, one
file each), then, each in a fresh process as a user would run it:

- **read and count** (twice, the faster taken): a Spark session that reads the files
  with the event schema and counts the rows (``spark.read.schema(...).json(files).count()``, or ``.parquet``): the
  least any report on Spark can take (for JSON, Spark parses no field to count rows);
- **read and parse**: the same, counting the values of every field the report reads
  (each parsed, as the report must);
- **report**: ``python -m qpid_flow report FILES --out DIR`` three times: without the
  class archive (``--no-class-archive``), recording it (once, in a folder of this run's
  own), and mapping it as every later report on a machine does; that last run is timed
  step by step from its progress lines;
- **the floor**: the least any report on Spark does with these events, in a fresh process
  whose JVM maps the same class archive: parse every field the report reads and follow
  each message through its events once (the per-message pass, and the latency table
  from it), in one job. What a report adds beyond that is the cache of the parsed events
  its other analyses share, those analyses, its tables, plots and page;

and prints report (archive mapped) / read-and-count (target: <= 2.0 at 2M events), the
floor / read-and-count, the ratio without the archive, the peak resident
memory of each run's JVM (the java child's VmHWM in /proc, sampled every 0.2 s), and whether the report found exactly
the injected violations. Both runs get the same driver memory (``--driver-memory``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qpid_flow.analytics.synthetic import generate  # noqa: E402

# Events per grouped message: enqueue, deliver, settle, group assigned and released.
EVENTS_PER_MESSAGE = 5.0
PYTHON = sys.executable

# argv: driver memory, format, "count", "parse" or "floor", files. "count" counts rows:
# for JSON lines with a schema, Spark then parses no field (it counts lines). "parse"
# counts the values of every field the report reads, so that each is parsed, as the
# report must. "floor" is the least a report does, on a JVM that maps the class archive
# as the report's does: it parses those fields and follows each message through its
# events once (the per-message pass, and the latency table computed from it), in one job.
_COUNT = """
import sys
from pyspark.sql import functions as F
from qpid_flow.analytics.class_archive import class_archive, java_binary
from qpid_flow.analytics.inputs import expand_inputs
from qpid_flow.analytics.report import _UNUSED_FIELDS
from qpid_flow.analytics.schema import EVENT_SCHEMA
from qpid_flow.analytics.session import build_session
mode = sys.argv[3]
archive = class_archive(java_binary()) if mode == "floor" else None
spark = build_session(None, sys.argv[1], archive if archive is not None and not archive.recording else None)
files = expand_inputs(sys.argv[4:])
reader = spark.read.schema(EVENT_SCHEMA)
frame = reader.parquet(*files) if sys.argv[2] == "parquet" else reader.json(files)
used = [name for name in EVENT_SCHEMA.names if name not in _UNUSED_FIELDS]
if mode == "count":
    print(frame.count())
elif mode == "parse":
    print(frame.select(*[F.count(name) for name in used]).first()[0])
else:
    from qpid_flow.analytics import latency, messages
    events = frame.select(*used)
    moves = messages.message_moves(events, events.where(F.lit(False)).select("run", "address"))
    print(len(latency.latency_by_destination(latency.message_latencies(events, moves)).collect()))
spark.stop()
"""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _java_pids(pid: int) -> list[int]:
    found = []
    for child in _descendants(pid):
        try:
            if "java" in Path(f"/proc/{child}/comm").read_text():
                found.append(child)
        except OSError:
            continue
    return found


def _peak(pids: list[int]) -> int:
    """The largest VmHWM (bytes) of ``pids`` now."""
    peak = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            continue
    return peak


def timed(argv: list[str], environment: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` (with ``environment`` added); its wall time, output, the times its
    progress lines appeared, and the peak memory of the JVM it started."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(environment or {})},
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        # Reads the status of the java processes found; walks /proc for them again once a
        # second (a short-lived launcher JVM comes before the real one), not at every
        # sample: the sampler shares the 2 cores with what it measures.
        nonlocal peak
        pids: list[int] = []
        for tick in itertools.count():
            if done.wait(0.2):
                break
            if tick % 5 == 0:
                pids = _java_pids(proc.pid)
            peak = max(peak, _peak(pids))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    marks: list[tuple[str, float]] = []
    assert proc.stderr is not None and proc.stdout is not None
    err_lines = []
    for line in proc.stderr:
        err_lines.append(line)
        if line.startswith("report: ["):
            marks.append((line.split("]", 1)[1].strip(), time.perf_counter() - started))
    out = proc.stdout.read()
    code = proc.wait()
    done.set()
    sampler.join()
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"{argv[:4]} exited {code}: {''.join(err_lines)[-2000:]}")
    steps = {name: (marks[i + 1][1] if i + 1 < len(marks) else seconds) - at for i, (name, at) in enumerate(marks)}
    first = marks[0][1] if marks else 0.0
    return {"seconds": seconds, "start_s": first, "steps_s": steps, "jvm_peak_bytes": peak, "stdout": out}


def to_parquet(logs: Path, target: Path) -> None:
    """The same events as the router's parquet format would hold them (one file per run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qpid_flow.policies.event_log.writers import COLUMNS, arrow_schema

    target.mkdir(parents=True, exist_ok=True)
    schema = arrow_schema()
    for path in sorted(logs.iterdir()):
        with path.open() as lines:
            records = [json.loads(line) for line in lines]
        columns = {name: [r.get(name) for r in records] for name, _ in COLUMNS}
        table = pa.table({name: pa.array(columns[name], type=schema.field(name).type) for name, _ in COLUMNS})
        pq.write_table(table, target / f"{path.stem}.parquet", compression="zstd")


def run_size(events: int, workdir: Path, fmt: str, driver_memory: str) -> dict[str, Any]:
    from pyspark import __version__ as spark_version

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
    if fmt == "parquet":
        columnar = workdir / f"parquet-{events}"
        to_parquet(logs, columnar)
        shutil.rmtree(logs)
        logs = columnar
    generated = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in logs.iterdir())
    # The bar, run twice and the faster taken: on a 2-core machine one fresh JVM now and
    # then starts seconds late (seen: 14.4 s for 1M events against 11.6 s for 2M).
    count = min(
        (timed([PYTHON, "-c", _COUNT, driver_memory, fmt, "count", str(logs)]) for _ in range(2)),
        key=lambda run: run["seconds"],
    )
    parse = timed([PYTHON, "-c", _COUNT, driver_memory, fmt, "parse", str(logs)])
    out = workdir / f"out-{events}"
    command = [PYTHON, "-m", "qpid_flow", "report", str(logs), "--out", str(out), "--driver-memory", driver_memory]
    # The report as a user runs it: its JVM maps the class archive the first report on the
    # machine recorded. Here the archive lives in a folder of its own, made by the first of
    # these runs; the run without it and the recording run are reported beside.
    plain = timed([*command, "--no-class-archive"])
    archives = workdir / "cache"
    shutil.rmtree(archives, ignore_errors=True)
    recording = timed(command, {"XDG_CACHE_HOME": str(archives)})
    report = timed(command, {"XDG_CACHE_HOME": str(archives)})
    floor = timed([PYTHON, "-c", _COUNT, driver_memory, fmt, "floor", str(logs)], {"XDG_CACHE_HOME": str(archives)})
    order = _read_csv_rows(out / "csv" / "group_order_violations")
    overlap = _read_csv_rows(out / "csv" / "group_overlap_violations")
    found_order = {(r["address"], r["group"], int(r["seq"])) for r in order}
    found_overlap = {(r["address"], r["group"], int(r["consumer"])) for r in overlap}
    shutil.rmtree(out, ignore_errors=True)
    return {
        "events": expected.events,
        "format": fmt,
        "bytes": size,
        "generate_s": generated,
        "count_s": count["seconds"],
        "counted": int(count["stdout"].strip().splitlines()[-1]),
        "count_jvm_peak_bytes": count["jvm_peak_bytes"],
        "parse_s": parse["seconds"],
        "parse_jvm_peak_bytes": parse["jvm_peak_bytes"],
        "ratio_parse": report["seconds"] / parse["seconds"],
        "floor_s": floor["seconds"],
        "floor_jvm_peak_bytes": floor["jvm_peak_bytes"],
        "ratio_floor": floor["seconds"] / count["seconds"],
        "report_s": report["seconds"],
        "report_no_archive_s": plain["seconds"],
        "report_recording_s": recording["seconds"],
        "ratio_no_archive": plain["seconds"] / count["seconds"],
        "report_start_s": report["start_s"],
        "steps_s": report["steps_s"],
        "report_jvm_peak_bytes": report["jvm_peak_bytes"],
        "ratio": report["seconds"] / count["seconds"],
        "violations_ok": found_order == expected.order and found_overlap == expected.overlap,
        "spark": spark_version,
    }


def _read_csv_rows(folder: Path) -> list[dict[str, str]]:
    import csv

    rows: list[dict[str, str]] = []
    for part in sorted(folder.glob("part-*.csv")):
        with part.open() as f:
            rows.extend(csv.DictReader(f))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2000000")
    parser.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--keep", type=Path, help="keep the logs in this folder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="qpid-flow-bench-report-"))
    workdir.mkdir(parents=True, exist_ok=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"machine: {os.cpu_count()} cores, {memory:.1f} GiB, Python {platform.python_version()}", flush=True)
    free = shutil.disk_usage(workdir).free
    need = max(int(s) for s in args.sizes.split(",")) * 170 * 2  # ~170 bytes a JSON event, and room to spare
    print(f"free disk in {workdir}: {free / 2**30:.1f} GiB (the largest size needs ~{need / 2**30:.1f})", flush=True)
    if free < need:
        print("not enough disk for the largest size", file=sys.stderr)
        return 2
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            print(f"\n{size:,} events ({args.format}) ...", flush=True)
            f = run_size(size, workdir, args.format, args.driver_memory)
            results.append(f)
            kind = "JSON lines" if f["format"] == "jsonl" else "Parquet"
            print(
                f"  {f['events']:,} events, {f['bytes'] / 2**20:,.0f} MiB of {kind} "
                f"(generated in {f['generate_s']:.0f} s)\n"
                f"  read and count, fresh Spark process: {f['count_s']:.1f} s ({f['counted']:,} rows), "
                f"JVM peak {f['count_jvm_peak_bytes'] / 2**20:,.0f} MiB\n"
                f"  read and parse every field the report reads, fresh Spark process: {f['parse_s']:.1f} s, "
                f"JVM peak {f['parse_jvm_peak_bytes'] / 2**20:,.0f} MiB\n"
                f"  qpid-flow report, fresh process, no class archive (--no-class-archive): "
                f"{f['report_no_archive_s']:.1f} s: {f['ratio_no_archive']:.2f} x read and count\n"
                f"  qpid-flow report, fresh process, recording the class archive (once): "
                f"{f['report_recording_s']:.1f} s\n"
                f"  qpid-flow report, fresh process, class archive mapped: {f['report_s']:.1f} s, JVM peak "
                f"{f['report_jvm_peak_bytes'] / 2**20:,.0f} MiB (driver memory {args.driver_memory})\n"
                f"    start (Python, JVM, session): {f['report_start_s']:.1f} s\n"
                + "".join(f"    {name}: {seconds:.1f} s\n" for name, seconds in f["steps_s"].items())
                + f"  TARGET report / read and count: {f['ratio']:.2f}  (target <= 2.0: "
                f"{'met' if f['ratio'] <= 2.0 else 'NOT met'})\n"
                f"  report / read and parse the fields it reads: {f['ratio_parse']:.2f}\n"
                f"  the floor (fresh process, class archive mapped: parse those fields, one "
                f"per-message pass): {f['floor_s']:.1f} s: {f['ratio_floor']:.2f} x read and count; "
                f"report / floor: {f['report_s'] / f['floor_s']:.2f}\n"
                f"  injected violations found exactly: {f['violations_ok']}",
                flush=True,
            )
            shutil.rmtree(workdir / f"logs-{size}", ignore_errors=True)
            shutil.rmtree(workdir / f"parquet-{size}", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "results": results}, indent=2))
    return 0 if all(r["violations_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
