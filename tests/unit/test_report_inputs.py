"""``qpid-flow report`` on odd inputs: a run read twice, a damaged stream, a wall clock
set back, a field of the wrong type, files Spark cannot read, an ``--out`` that cannot
take the report. Each is counted and shown, or refused in one line."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qpid_flow.analytics.report import main, run_report


def summary_row(page: str, name: str) -> str | None:
    """The value of the page summary's row ``name``, or None if there is no such row."""
    found = re.search(rf"<th>{re.escape(name)}</th><td>([^<]*)</td>", page)
    return found.group(1) if found else None


def write_lines(path: Path, records: list[dict[str, Any]], extra: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + extra)


def run_a(offset: float = 0.0) -> list[dict[str, Any]]:
    """A run whose wall clock is set back 10 s after its 4th event: the flow-stopped
    period and both latencies of message 1 end before they start; message 3's are sound
    (100 ms to delivery, 300 ms to settlement)."""
    events: list[tuple[float, str, dict[str, Any]]] = [
        (1000.0, "destination", {"maxCount": 10, "flowStopCount": 8, "flowResumeCount": 6}),
        (1001.0, "flow_stopped", {"depth": 8, "producers": 1, "flowStopCount": 8}),
        (1002.0, "enqueue", {"seq": 1, "size": 5, "depth": 8}),
        (1003.0, "enqueue", {"seq": 2, "size": 5, "depth": 9}),
        (993.5, "flow_resumed", {"depth": 6, "producers": 1, "flowStopCount": 8}),
        (994.0, "deliver", {"seq": 1, "consumer": 1, "delivery_count": 1}),
        (994.5, "settle", {"seq": 1, "consumer": 1, "outcome": "accepted", "depth": 7}),
        (995.0, "enqueue", {"seq": 3, "size": 5, "depth": 8}),
        (995.1, "deliver", {"seq": 3, "consumer": 1, "delivery_count": 1}),
        (995.3, "settle", {"seq": 3, "consumer": 1, "outcome": "accepted", "depth": 7}),
    ]
    return [
        {"v": 1, "ts": ts + offset, "run": "a", "n": n, "event": event, "address": "q", **fields}
        for n, (ts, event, fields) in enumerate(events, 1)
    ]


def write_damaged_stream(path: Path) -> None:
    """An open segment's stream whose 2nd batch of 3 is corrupt (offsets out of order):
    the 3 records of its 1st batch are readable."""
    import pyarrow as pa

    from qpid_flow.policies.event_log.writers import arrow_schema

    schema = arrow_schema()

    def batch(first: int, count: int) -> Any:
        rows = [
            {"v": 1, "ts": 2000.0 + n, "run": "c", "n": n, "event": "enqueue", "address": "s", "seq": n}
            for n in range(first, first + count)
        ]
        return pa.RecordBatch.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)

    good, bad = batch(1, 3), batch(4, 3)
    event = schema.get_field_index("event")
    offsets = pa.py_buffer(pa.array([0, 14, 7, 21], pa.int32()).buffers()[1])
    broken = pa.Array.from_buffers(pa.string(), 3, [None, offsets, bad.column(event).buffers()[2]])
    bad = pa.RecordBatch.from_arrays([broken if k == event else c for k, c in enumerate(bad.columns)], schema=schema)
    with pa.ipc.new_stream(str(path), schema) as stream:
        for each in (good, bad, batch(7, 1)):
            stream.write_batch(each)


def test_odd_inputs_are_counted_once_and_shown_on_the_page(spark: Any, tmp_path: Path) -> None:
    """One folder holds: run a as JSON lines and a Parquet copy of it (each event read
    twice), its clock set back mid-run; run b with a field of the wrong type; run c's open
    stream, damaged at its 2nd batch. Before: run a counted twice, silently; negative
    durations in the sums and percentiles; the wrong-typed record read with a null depth;
    the stream's damage unsaid."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from qpid_flow.policies.event_log.writers import arrow_schema

    logs = tmp_path / "logs"
    logs.mkdir()
    records = run_a()
    write_lines(logs / "a.jsonl", records)
    schema = arrow_schema()
    pq.write_table(
        pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in records], schema=schema), logs / "a.parquet"
    )
    b = {"v": 1, "ts": 3000.0, "run": "b", "event": "enqueue", "address": "r", "seq": 1, "size": 5}
    write_lines(logs / "b.jsonl", [dict(b, n=1, depth=1), dict(b, n=2, seq=2, depth="2")])
    write_damaged_stream(logs / "events-c-00001.arrows")

    result = run_report(spark, sorted(str(p) for p in logs.iterdir()), tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    flow = {r["address"]: r for r in result.flow}["q"]
    latency = {r["address"]: r for r in result.latency}["q"]
    damaged = f"{logs / 'events-c-00001.arrows'}: batch 2: In column 4: Invalid: Offset invariant failure"
    observed = {
        "events": result.events,
        "unreadable": summary_row(page, "unreadable lines"),
        "repeated": summary_row(page, "repeated records (dropped)"),
        "damaged on the page": damaged in (summary_row(page, "damaged streams (read up to the damage)") or ""),
        "left out": summary_row(page, "durations left out (clock went back)"),
        "notes": getattr(result, "notes", None),
        "flowStoppedCount": flow["flowStoppedCount"],
        "stopped_seconds": flow["stopped_seconds"],
        "to_deliver_count": latency["to_deliver_count"],
        "to_settle_count": latency["to_settle_count"],
        "to_deliver_p50_ms": round(latency["to_deliver_p50_ms"]),
        "to_settle_max_ms": round(latency["to_settle_max_ms"]),
    }
    assert observed == {
        "events": 10 + 1 + 3,  # run a once, run b's sound record, run c's 1st batch
        "unreadable": "1",  # run b's "depth": "2"
        "repeated": "10",
        "damaged on the page": True,
        "left out": "3",  # the flow-stopped period, message 1's delivery and settlement
        "notes": [
            f"damaged stream {logs / 'events-c-00001.arrows'}: batch 2: In column 4: Invalid: Offset invariant "
            "failure: non-monotonic offset at slot 2: 7 < 14 (3 records read before it)",
            "10 repeated records dropped (a run read twice: a file and a copy of it?)",
        ],
        "flowStoppedCount": 1,  # it happened; its length is unknown
        "stopped_seconds": 0.0,
        "to_deliver_count": 1,  # message 3 only (2 was never delivered)
        "to_settle_count": 1,
        "to_deliver_p50_ms": 100,
        "to_settle_max_ms": 300,
    }


def test_a_truncated_gzip_fails_in_one_line_naming_the_file(tmp_path: Path) -> None:
    """Before: ~85 lines of Java stack trace, then "Spark failed: An error occurred while
    calling o445.collectToPython", naming no file."""
    pytest.importorskip("pyspark")
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in run_a()).encode())
    log = tmp_path / "events.jsonl.1.gz"
    log.write_bytes(whole[: len(whole) // 2])
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "report", str(log), "--out", str(tmp_path / "out"), "--no-class-archive"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if "incubator" not in line]
    assert result.returncode == 1
    assert not [line for line in lines if line.startswith(("\tat ", "Caused by", "org.apache"))], result.stderr
    assert lines[-1] == f"qpid-flow report: Spark failed: {log}: java.io.EOFException: Unexpected end of input stream"
    assert len(lines) < 20, result.stderr


def test_a_damaged_parquet_file_is_refused_before_spark_starts(tmp_path: Path, capsys: Any) -> None:
    """Before: the JVM started, then failed mid-report with a Java stack trace."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    import pyarrow.parquet as pq

    good = tmp_path / "events-a-00001.parquet"
    pq.write_table(pa.table({"v": [1], "n": [1]}), good)
    whole = good.read_bytes()
    cut = tmp_path / "events-b-00001.parquet"
    cut.write_bytes(whole[: len(whole) // 2])
    assert main([str(good), str(cut), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"qpid-flow report: cannot read {cut}: Parquet magic bytes not found in footer. "
        "Either the file is corrupted or this is not a parquet file."
    ]


def test_an_out_that_cannot_take_the_report_is_refused_before_spark_starts(tmp_path: Path, capsys: Any) -> None:
    """Before: a file (or a path that cannot be made) was reported after the JVM started,
    as "Spark failed: [Errno 17] ..."; an input folder was accepted, and the next report
    read the tables of this one as events."""
    logs = tmp_path / "logs"
    (logs / "old").mkdir(parents=True)
    (logs / "events.jsonl").write_text("{}\n")
    (logs / "old" / "events.jsonl.1").write_text("{}\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refused = {
        str(a_file): f"{str(a_file)!r} is a file, not a folder",
        str(a_file / "out"): f"cannot create {str(a_file / 'out')!r}: Not a directory",
        str(logs): f"{str(logs)!r} is the input folder {str(logs)!r} or inside it: the next report would read this one",
        str(logs / "report"): f"{str(logs / 'report')!r} is the input folder {str(logs)!r} or inside it: "
        "the next report would read this one",
    }
    for out, why in refused.items():
        assert main([str(logs), "--out", out]) == 2, out
        assert capsys.readouterr().err.splitlines() == [f"qpid-flow report: --out: {why}"]
    # An input file inside the report's folder.
    inside = str(logs / "old" / "events.jsonl.1")
    assert main([inside, "--out", str(logs)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"qpid-flow report: --out: {str(logs)!r} holds the input {inside!r}: the next report would read this one"
    ]
    assert not (logs / "report").exists()
