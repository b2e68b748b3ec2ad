"""The analytics pipeline (``qpid-flow report``), run for real on local Spark against
event logs whose answers are known (qpid_flow.analytics.synthetic)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qpid_flow.analytics.inputs import InputError, expand_inputs
from qpid_flow.analytics.report import run_report
from qpid_flow.analytics.synthetic import FLOWED, GROUPED, generate

# Without the analytics extra (pyspark, pyarrow, matplotlib) the tests that need it skip: the
# spark fixture (tests/spark.py) without pyspark, the others each where it imports what it needs.


def by_address(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["address"]: row for row in rows}


# --- inputs (no Spark) ----------------------------------------------------------------------


def test_inputs_expand_files_folders_and_globs(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for name in ("a/events.jsonl", "a/events.jsonl.1", "a/events.jsonl.2.gz", "b.jsonl", "a/.hidden", "a/_SUCCESS"):
        (tmp_path / name).write_text("{}\n")
    found = expand_inputs([str(tmp_path / "a"), str(tmp_path / "*.jsonl"), str(tmp_path / "b.jsonl")])
    assert [Path(p).name for p in found] == ["events.jsonl", "events.jsonl.1", "events.jsonl.2.gz", "b.jsonl"]
    with pytest.raises(InputError, match="does not exist"):
        expand_inputs([str(tmp_path / "nope.jsonl")])
    with pytest.raises(InputError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.log")])


def test_a_file_named_two_ways_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reviewer's case: a folder (relative) and a file in it (absolute) doubled every count.
    (tmp_path / "logs" / "flow").mkdir(parents=True)
    log = tmp_path / "logs" / "flow" / "events.jsonl"
    log.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(log)
    monkeypatch.chdir(tmp_path)
    found = expand_inputs(["logs/flow", str(log), "link.jsonl", "logs/../logs/flow/events.jsonl"])
    assert len(found) == 1 and os.path.samefile(found[0], log)
    # A URL is Spark's to resolve: kept as given, even naming a file listed already.
    assert sorted(expand_inputs(["logs/flow", f"file://{log}"])) == [f"file://{log}", "logs/flow/events.jsonl"]


def test_each_destination_gets_plot_files_of_its_own(tmp_path: Path) -> None:
    """Addresses that read alike as file names ('a/b', 'a_b', 'a b'; any two non-ASCII
    names) drew over each other's plots, each shown under the wrong title, and an address
    too long for a file name stopped the report (OSError) with the page left 'working'."""
    pytest.importorskip("matplotlib")
    from qpid_flow.analytics.plots import file_stem
    from qpid_flow.analytics.report import _plot_depths, _plot_latency

    addresses = ["a/b", "a_b", "a b", "заказы", "παραγγελίες", "q" * 302, "q" * 301]
    stems = [file_stem(a) for a in addresses]
    assert len(set(stems)) == len(addresses)
    assert all(len(f"latency-{stem}.png".encode()) <= 120 for stem in stems)
    assert file_stem("orders").startswith("orders-") and file_stem("a/b").startswith("a_b-")
    assert file_stem("заказы").startswith("destination-")

    (tmp_path / "plots").mkdir()
    ranked = [{"address": a, "flowStopCount": 0} for a in addresses]
    series = {a: {"r": [(1000.0, 1), (1001.0, 2 + i)]} for i, a in enumerate(addresses)}
    depths = _plot_depths(tmp_path, {}, ranked, series, [])
    buckets = [
        {
            "address": a,
            "bucket_start": 1000.0,
            **{f"{m}_{p}_ms": 1.0 + i for m in ("to_settle", "to_deliver") for p in ("p50", "p95", "p99")},
        }
        for i, a in enumerate(addresses)
    ]
    latencies = _plot_latency(tmp_path, buckets, addresses, 1.0)
    images = depths + latencies
    # One file per plot, each where the page's link points, under its own title.
    assert len({src for src, _ in images}) == len(images) == 2 * len(addresses)
    assert [alt for _, alt in depths] == [f"depth of {a}" for a in addresses]
    for src, _ in images:
        assert (tmp_path / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bucket_widths_are_round_numbers() -> None:
    pytest.importorskip("pyspark")  # qpid_flow.analytics.latency imports it
    from qpid_flow.analytics.latency import bucket_seconds

    assert bucket_seconds(30) == 1
    assert bucket_seconds(3600) == 60
    assert bucket_seconds(7 * 86400) == 21600  # a week in 28 buckets of 6 h
    assert bucket_seconds(365 * 86400) == 86400  # the widest bucket, whatever the span


def test_a_missing_events_file_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "report", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"qpid-flow report: EVENTS: {str(tmp_path / 'none.jsonl')!r} does not exist"
    ]


def test_no_java_runtime_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")  # without it the report stops before looking for Java
    events = tmp_path / "events.jsonl"
    events.write_text("")
    environment = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    environment["PATH"] = str(tmp_path)  # no java on it
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "report", str(events), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "qpid-flow report: no Java runtime found (Spark needs one): install openjdk-17-jre-headless"
    ]


def test_the_jit_options_are_ones_this_java_accepts_and_the_session_passes_them(tmp_path: Path) -> None:
    # A misspelt or withdrawn -XX option makes HotSpot refuse to start: every report would fail.
    from qpid_flow.analytics.class_archive import java_binary
    from qpid_flow.analytics.session import JIT_OPTIONS, local_settings

    java = java_binary()
    assert java is not None
    result = subprocess.run(
        [java, *JIT_OPTIONS, "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    final = {line.split()[1]: line.split()[3] for line in result.stdout.splitlines() if line.count("=") == 1}
    for option in JIT_OPTIONS:
        name, value = option.removeprefix("-XX:").split("=")
        assert final[name] == value
    passed = local_settings(tmp_path, "2g")["spark.driver.extraJavaOptions"].split()
    assert all(option in passed for option in JIT_OPTIONS)


def test_tables_are_put_in_order_as_spark_orders_them() -> None:
    pa = pytest.importorskip("pyarrow")
    from qpid_flow.analytics.report import _in_order

    table = pa.table(
        {
            "address": ["b", None, "a", "b", "\u00e9", "a"],
            "start": [2.0, 5.0, float("nan"), 1.0, 0.0, 3.0],
            "row": [0, 1, 2, 3, 4, 5],
        }
    )
    # Ascending, nulls first, NaN after every number, strings by code point.
    assert _in_order(table, ["address", "start"]).column("row").to_pylist() == [1, 5, 2, 3, 0, 4]
    assert _in_order(table.slice(0, 0), ["address"]).num_rows == 0


def test_serving_never_imports_pyspark() -> None:
    code = "import sys, qpid_flow.cli, qpid_flow.amqp.server; print('pyspark' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# --- the pipeline on Spark ------------------------------------------------------------------


def test_injected_violations_are_all_found_and_nothing_else(spark: Any, tmp_path: Path) -> None:
    expected = generate(
        tmp_path / "logs", runs=3, messages=3000, groups=40, consumers=4, inject_order=7, inject_overlap=5, seed=7
    )
    assert len(expected.order) == 7 and len(expected.overlap) == 5
    result = run_report(spark, expand_inputs([str(tmp_path / "logs")]), tmp_path / "out")

    assert result.events == expected.events and result.runs == 3
    found_order = {(r["address"], r["group"], r["seq"]) for r in result.order_violations}
    found_overlap = {(r["address"], r["group"], r["consumer"]) for r in result.overlap_violations}
    assert found_order == expected.order
    assert found_overlap == expected.overlap
    audit = by_address(result.audit)
    assert set(audit) == {GROUPED}, "only the grouped destination is audited"
    assert audit[GROUPED]["order_violations"] == 7 and audit[GROUPED]["overlap_violations"] == 5
    # Released messages delivered again are counted apart, never as order violations.
    assert audit[GROUPED]["redeliveries"] == expected.redeliveries > 0
    assert audit[GROUPED]["first_deliveries"] == 3 * 3000
    page = (tmp_path / "out" / "index.html").read_text()
    assert "7 order violation(s) and 5 overlap violation(s)" in page


def test_flow_control_statistics_match_the_log(spark: Any, tmp_path: Path) -> None:
    # Seed 000's numbers: max 1000, stop 900, resume 500; four stop/resume cycles per run.
    expected = generate(
        tmp_path / "logs", runs=2, messages=200, groups=10, flow_cycles=4, stop=900, resume=500, maximum=1000
    )
    result = run_report(spark, expand_inputs([str(tmp_path / "logs")]), tmp_path / "out")
    flow = by_address(result.flow)[FLOWED]
    assert flow["flowStoppedCount"] == expected.flow_stopped[FLOWED] == 8
    assert flow["peak_depth"] == 901 and flow["peak_bytes"] == 901 * 50
    assert flow["max_overshoot_count"] == 1  # the transfer that crossed 900
    assert flow["flowStopCount"] == 900
    assert flow["stopped_at_end"] == 0
    assert 0 < flow["longest_stop_seconds"] <= flow["stopped_seconds"]
    # Two producers were attached through every stopped period.
    assert flow["producer_seconds_blocked"] == pytest.approx(2 * flow["stopped_seconds"])
    assert by_address(result.flow)[GROUPED]["flowStoppedCount"] == 0
    # The periods table, as CSV: a header and one row per stopped period.
    csv_files = list((tmp_path / "out" / "csv" / "flow_periods").glob("*.csv"))
    assert len(csv_files) == 1 and len(csv_files[0].read_text().splitlines()) == 1 + 8


def test_threshold_advice_uses_the_producers_windows(spark: Any, tmp_path: Path) -> None:
    """Seed 000's example: windows of 50 and 15 can overshoot a stop threshold by 65, so on
    a destination of max 200 the stop threshold that cannot overflow is 135."""
    log = tmp_path / "logs" / "events.jsonl"
    log.parent.mkdir()
    records = [
        {
            "event": "destination",
            "maxCount": 200,
            "maxSize": 0,
            "flowStopCount": 100,
            "flowResumeCount": 70,
            "flowStopSize": 0,
            "flowResumeSize": 0,
            "limitPolicy": "flow",
            "grouped": False,
            "producerWindow": 100,
        },
        {"event": "producer_attached", "producer": 1, "window": 50},
        {"event": "producer_attached", "producer": 2, "window": 15},
        {"event": "enqueue", "seq": 1, "size": 10, "depth": 1, "bytes": 10},
        {"event": "producer_detached", "producer": 1},
        {"event": "producer_attached", "producer": 3, "window": 15},
    ]
    with log.open("w") as out:
        for n, record in enumerate(records, 1):
            out.write(json.dumps({"v": 1, "ts": 1000.0 + n, "run": "r", "n": n, "address": "q", **record}) + "\n")
    result = run_report(spark, [str(log)], tmp_path / "out")
    advice = by_address(result.advice)["q"]
    assert advice["peak_producers"] == 2
    assert advice["window_count"] == 65
    assert advice["advised_stop_count"] == 135
    assert advice["advised_resume_count"] == 94  # keeps the configured 70:100 ratio
    assert advice["max_count_fits_windows"] is True


def test_group_order_is_the_order_messages_were_enqueued_in(spark: Any, tmp_path: Path) -> None:
    """A transactional transfer gets its seq on arrival but is enqueued at commit: the
    router delivers in enqueue order, and so must the audit check (it used seq)."""
    log = tmp_path / "logs" / "events.jsonl"
    log.parent.mkdir()
    numbered: list[tuple[str, int | None, str | None]] = [
        ("destination", None, None),
        ("transfer_settled", 1, None),  # seq 1: staged in a transaction...
        ("enqueue", 2, "g"),
        ("deliver", 2, "g"),
        ("settle", 2, "g"),
        ("enqueue", 1, "g"),  # ... enqueued at its commit, after seq 2: in order
        ("deliver", 1, "g"),
        ("settle", 1, "g"),
        ("enqueue", 3, "h"),
        ("enqueue", 4, "h"),
        ("deliver", 4, "h"),
        ("deliver", 3, "h"),  # a violation: 3 was enqueued before 4
        ("settle", 4, "h"),
        ("settle", 3, "h"),
        ("enqueue", 6, "k"),  # 6 committed before 5 arrived
        ("enqueue", 5, "k"),
        ("deliver", 5, "k"),
        ("deliver", 6, "k"),  # a violation: 6 was enqueued before 5
        ("settle", 5, "k"),
        ("settle", 6, "k"),
        ("deliver", 7, "p"),  # enqueued before the log begins (a pruned segment)
        ("settle", 7, "p"),
        ("enqueue", 8, "p"),
        ("deliver", 8, "p"),
        ("settle", 8, "p"),
    ]
    # A log written before events were numbered: tied enqueue times are told apart by seq.
    unnumbered: list[tuple[float, str, int | None, str | None]] = [
        (1.0, "destination", None, None),
        (3.0, "enqueue", 1, "g"),
        (3.0, "enqueue", 2, "g"),
        (4.0, "deliver", 1, "g"),
        (4.0, "settle", 1, "g"),
        (5.0, "deliver", 2, "g"),
        (5.0, "settle", 2, "g"),
    ]
    grouped = {"grouped": True, "maxCount": 0, "maxSize": 0}
    with log.open("w") as out:
        for n, (event, seq, group) in enumerate(numbered, 1):
            record: dict[str, Any] = {"v": 1, "ts": 1000.0 + n, "run": "t", "n": n, "event": event, "address": "grp"}
            record.update(grouped if event == "destination" else {"seq": seq, "group": group, "consumer": 1})
            record.update({"delivery_count": 1} if event == "deliver" else {})
            record.update({"outcome": "accepted"} if event == "settle" else {})
            out.write(json.dumps(record) + "\n")
        for ts, event, seq, group in unnumbered:
            record = {"v": 1, "ts": ts, "run": "old", "event": event, "address": "grp"}
            record.update(grouped if event == "destination" else {"seq": seq, "group": group, "consumer": 1})
            record.update({"delivery_count": 1} if event == "deliver" else {})
            record.update({"outcome": "accepted"} if event == "settle" else {})
            out.write(json.dumps(record) + "\n")
    result = run_report(spark, [str(log)], tmp_path / "out")
    found = {(r["run"], r["group"], r["seq"], r["delivered_before"]) for r in result.order_violations}
    assert found == {("t", "h", 3, 4), ("t", "k", 6, 5)}
    assert by_address(result.audit)["grp"]["order_violations"] == 2
    assert result.overlap_violations == []


def test_latency_percentiles(spark: Any, tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl.gz"
    with gzip.open(log, "wt") as out:
        n = 0
        for i in range(1, 101):
            for event, ts in (("enqueue", 0.0), ("deliver", i / 1000), ("settle", 2 * i / 1000)):
                n += 1
                record = {"v": 1, "ts": 5000.0 + i + ts, "run": "r", "n": n, "event": event, "address": "lat", "seq": i}
                out.write(json.dumps(record) + "\n")
        # On "held", only the settles that end a message count (ms after its enqueue):
        # accepted, rejected (here an expiry, by qpid-flow), modified not followed by a
        # delivery (undeliverable-here: it left); not a release, by a consumer or by
        # qpid-flow (here at router stop), nor a modified that went back.
        held: list[tuple[int, float, str, int | None, str | None]] = [
            (101, 0, "enqueue", None, None),
            (101, 10, "deliver", 1, None),
            (101, 65, "settle", 1, "accepted"),  # counted: 65
            (102, 0, "enqueue", None, None),
            (102, 10, "deliver", 2, None),
            (102, 3565, "settle", None, "released"),  # held unsettled when the router stopped
            (103, 0, "enqueue", None, None),
            (103, 10, "deliver", 1, None),
            (103, 20, "settle", 1, "released"),  # never delivered again
            (104, 0, "enqueue", None, None),
            (104, 10, "deliver", 1, None),
            (104, 20, "settle", 1, "modified"),  # back in the queue...
            (104, 30, "deliver", 1, None),
            (104, 300, "settle", 1, "accepted"),  # ... counted: 300
            (105, 0, "enqueue", None, None),
            (105, 10, "deliver", 1, None),
            (105, 40, "settle", 1, "modified"),  # counted: 40
            (106, 0, "enqueue", None, None),
            (106, 10, "deliver", 1, None),
            (106, 20, "settle", 1, "modified"),
            (106, 30, "deliver", 1, None),
            (106, 3000, "settle", None, "released"),
            (107, 0, "enqueue", None, None),
            (107, 80, "settle", None, "rejected"),  # counted: 80 (expired, never delivered)
        ]
        for seq, ms, event, consumer, outcome in held:
            n += 1
            record = {"v": 1, "ts": 5200.0 + seq + ms / 1000, "run": "r", "n": n, "event": event, "address": "held"}
            record.update(seq=seq, consumer=consumer, outcome=outcome, delivery_count=1 if event == "deliver" else None)
            out.write(json.dumps(record) + "\n")
        out.write("not json at all\n")
        out.write(json.dumps({"v": 2, "ts": 1.0, "run": "r", "n": 0, "event": "enqueue", "address": "x"}) + "\n")
    result = run_report(spark, [str(log)], tmp_path / "out")
    row = by_address(result.latency)["lat"]
    assert row["to_deliver_count"] == row["to_settle_count"] == 100
    assert row["to_deliver_p50_ms"] == pytest.approx(50, abs=1)
    assert row["to_deliver_p99_ms"] == pytest.approx(99, abs=1)
    assert row["to_settle_p95_ms"] == pytest.approx(190, abs=2)
    assert row["to_settle_max_ms"] == pytest.approx(200, abs=0.01)
    held_row = by_address(result.latency)["held"]
    assert held_row["to_deliver_count"] == 6
    assert held_row["to_settle_count"] == 4
    assert held_row["to_settle_max_ms"] == pytest.approx(300, abs=0.01)
    assert held_row["to_settle_mean_ms"] == pytest.approx((65 + 300 + 40 + 80) / 4, abs=0.01)
    page = (tmp_path / "out" / "index.html").read_text()
    assert "unreadable lines</th><td>1</td>" in page
    assert "other schema versions (skipped)</th><td>1</td>" in page


def test_a_healthy_log_reports_no_violation_and_the_page_renders(spark: Any, tmp_path: Path) -> None:
    from qpid_flow.analytics.plots import file_stem

    generate(tmp_path / "logs", runs=1, messages=2000, groups=30, seed=3, gzip_files=True)
    out = tmp_path / "out"
    result = run_report(spark, expand_inputs([str(tmp_path / "logs")]), out)
    assert result.order_violations == [] and result.overlap_violations == []
    page = (out / "index.html").read_text()
    assert "No violation" in page and "refresh" not in page
    assert {Path(p).name for p in result.plots} >= {
        f"depth-{file_stem(FLOWED)}.png",
        f"latency-{file_stem(GROUPED)}.png",
    }
    for name in result.plots:
        assert (out / name).stat().st_size > 5000
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chromium_loads_every_image(out / "index.html", tmp_path / "screenshot.png") == len(result.plots)


def chromium_loads_every_image(page: Path, screenshot: Path) -> int:
    """Open ``page`` in headless Chromium; return how many images loaded (fails if any is
    broken), and leave a screenshot. The check script goes into a copy of the page."""
    browser = shutil.which("chromium") or "/usr/lib/chromium/chromium"
    assert Path(browser).exists(), "chromium is installed by .ci/install-deps"
    probe = page.with_name("index-check.html")
    script = (
        "<script>window.addEventListener('load', () => { const imgs = [...document.images];"
        " const bad = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));"
        " document.body.setAttribute('data-img-check', bad.length ? 'broken:' + bad.join(',') : 'ok:' + imgs.length);"
        " });</script>"
    )
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--hide-scrollbars",
        f"--user-data-dir={page.parent / '.chromium'}",
    ]
    dom = subprocess.run(
        [browser, *flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    subprocess.run(
        [browser, *flags, f"--screenshot={screenshot}", "--window-size=1200,3000", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    probe.unlink()
    marker = dom.stdout.split('data-img-check="', 1)[1].split('"', 1)[0] if "data-img-check" in dom.stdout else ""
    assert marker.startswith("ok:"), f"images did not load: {marker or dom.stderr[-2000:]}"
    assert screenshot.exists() and screenshot.stat().st_size > 10000
    return int(marker.split(":")[1])


def _as_columnar(logs: Path, target: Path) -> None:
    """The synthetic JSON-lines logs rewritten as the router's columnar log would hold
    them: each run a finished Parquet segment, except the last, left as an open Arrow
    stream (the segment of a router still running, or killed)."""
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    from qpid_flow.policies.event_log.writers import COLUMNS, arrow_schema

    schema = arrow_schema()
    target.mkdir()
    files = sorted(logs.iterdir())
    for index, path in enumerate(files):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        table = pa.Table.from_pylist([{name: r.get(name) for name, _ in COLUMNS} for r in records], schema=schema)
        if index < len(files) - 1:
            pq.write_table(table, target / f"events-run{index}-00001.parquet")
        else:
            with pa.ipc.new_stream(str(target / f"events-run{index}-00001.arrows"), schema) as stream:
                for batch in table.to_batches(max_chunksize=500):
                    stream.write_batch(batch)


def test_the_columnar_log_gives_the_same_report_as_json_lines(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate(logs, runs=3, messages=1500, groups=20, consumers=3, inject_order=2, inject_overlap=1, flow_cycles=2)
    columnar = tmp_path / "columnar"
    _as_columnar(logs, columnar)
    assert sorted(p.suffix for p in columnar.iterdir()) == [".arrows", ".parquet", ".parquet"]
    from_text = run_report(spark, expand_inputs([str(logs)]), tmp_path / "a")
    from_columns = run_report(spark, expand_inputs([str(columnar)]), tmp_path / "b")
    assert from_columns.events == from_text.events and from_columns.runs == from_text.runs == 3
    for table in ("flow", "latency", "audit", "order_violations", "overlap_violations", "advice"):
        assert getattr(from_columns, table) == getattr(from_text, table), table


def test_a_columnar_log_that_changes_under_the_report_is_read_as_it_is_now(spark: Any, tmp_path: Path) -> None:
    """A router is still writing the folder. After it was listed (before the JVM started) a
    finished segment was pruned and the open one finished (its stream became Parquet): the
    report reads what is there now, neither failing (PATH_NOT_FOUND) nor losing the segment
    finished meanwhile. A Parquet file pruned while Spark reads is skipped too."""
    pytest.importorskip("pyarrow")
    from qpid_flow.analytics.report import _read_inputs, load_events
    from qpid_flow.policies.event_log.writers import Batch, SegmentSink

    def segment(run: str) -> SegmentSink:
        sink = SegmentSink(folder, run, 0, 0)
        sink.write(Batch.of([("enqueue", 1.0 + n, n, "q", n, None, 1, None, None, 1, 1) for n in range(1, 11)]))
        return sink

    folder = tmp_path / "events"
    segment("a").close()
    segment("b").close()
    live = segment("c")
    listed = expand_inputs([str(folder)])
    assert sorted(Path(p).suffix for p in listed) == [".arrows", ".parquet", ".parquet"]
    (folder / "events-a-00001.parquet").unlink()
    live.close()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    events, stats = load_events(spark, listed, scratch)
    events.unpersist()
    assert stats.events == 20 and stats.runs == 2

    frame, _ = _read_inputs(spark, expand_inputs([str(folder)]), scratch)
    (folder / "events-b-00001.parquet").unlink()
    assert frame.count() == 10


def test_the_time_axis_cuts_idle_gaps_and_keeps_real_times() -> None:
    """Eight runs an hour apart, two minutes each: drawn side by side with the hours
    between them cut, every instant mapped and read back exactly; one lone instant still
    gets a readable span (not an axis from 2024 to 2030)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from qpid_flow.analytics.plots import TimeAxis

    base = 1_780_000_000.0
    axis_of_runs = TimeAxis((base + i * 3600, base + i * 3600 + 120) for i in range(8))
    assert len(axis_of_runs.segments) == 8
    assert axis_of_runs.width < 8 * 120 * 1.2, "the hours between runs are not drawn"
    instants = [base + i * 3600 + s for i in range(8) for s in (0, 60, 120)]
    xs = axis_of_runs.xs(instants)
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    assert [round(axis_of_runs.ts(x), 6) for x in xs] == instants
    # Gaps shorter than a fifth of the busy time stay: one segment.
    assert len(TimeAxis([(base, base + 600), (base + 700, base + 1300)]).segments) == 1

    lone = TimeAxis([(base, base)])
    figure, axis = plt.subplots()
    lone.style(axis)
    low, high = axis.get_xlim()
    assert 0 < high - low < 10
    plt.close(figure)


def test_the_ticks_of_a_short_run_read_distinct_times_and_none_in_the_padding() -> None:
    """Three seconds of activity starting at a fraction of a second: the tick labels were
    whole seconds, repeated ("02:13:17" three times, none at .000), and the ticks in the
    padding past the data repeated the last instant's time."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from qpid_flow.analytics.plots import TimeAxis

    base = 1_780_000_000.295
    axis_of_run = TimeAxis([(base, base + 3.0)])
    figure, axis = plt.subplots()
    axis_of_run.style(axis)
    figure.canvas.draw()
    labels = [(tick.get_loc(), tick.label1.get_text()) for tick in axis.xaxis.get_major_ticks()]
    shown = [text for x, text in labels if text]
    assert len(shown) == len(set(shown)) >= 3, labels
    assert all(text == "" for x, text in labels if x < 0 or x > axis_of_run.width), labels
    assert all(len(text.rsplit(".", 1)[-1]) == 3 for text in shown), shown
    plt.close(figure)


def test_a_session_leaves_no_scratch_folder_behind(tmp_path: Path) -> None:
    # Every report (and every test session) used to leave a qpid-flow-spark-* folder in /tmp.
    script = (
        "from qpid_flow.analytics.session import build_session\n"
        "spark = build_session(driver_memory='512m')\n"
        "print(spark.conf.get('spark.local.dir'))\n"
        "spark.range(10).count()\n"
        "spark.stop()\n"
    )
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, env=environment
    )
    assert result.returncode == 0, result.stderr
    scratch = Path(result.stdout.strip().splitlines()[-1])
    assert scratch.parent == tmp_path
    assert not scratch.exists()
    assert list(tmp_path.glob("qpid-flow-spark-*")) == []
