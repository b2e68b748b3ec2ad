"""``qpid-flow report`` on a real event log: qpid-flow (standalone) with --events runs a
flow-control scenario (seed 000's numbers) and a message-group scenario with a consumer
killed mid-stream; the report must count the flow stops that ``qpid-flow stat`` counted
and find no group violation."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .clients import Consumer, Producer, make_message, run_all, start, unique
from .harness.net import free_port
from .harness.router import admin_request
from .test_flow_control import seed_config, wait_until_quiet
from .test_groups import group_messages, grouped_config, kill_after, read_records, start_consumer, wait_all

pytestmark = pytest.mark.integration


def stat(admin: str, name: str) -> dict[str, Any]:
    with urllib.request.urlopen(admin_request(admin, "/v1/destinations"), timeout=10) as response:
        return next(r for r in json.load(response)["destinations"] if r["name"] == name)


def table(out: Path, name: str) -> dict[str, dict[str, str]]:
    (part,) = (out / "csv" / name).glob("*.csv")
    with part.open() as rows:
        return {row["address"]: row for row in csv.DictReader(rows)}


@pytest.mark.parametrize("events_format", ["jsonl", "parquet"])
def test_the_report_of_a_real_run_matches_stat_and_finds_no_group_violation(
    qpid_flow_process, tmp_path, events_format
) -> None:
    events = tmp_path / "events" / ("events.jsonl" if events_format == "jsonl" else "segments")
    admin = f"127.0.0.1:{free_port()}"
    flowed, grouped = unique("report-flow"), unique("report-groups")
    router = qpid_flow_process(
        config_text=seed_config(flowed) + grouped_config(grouped),
        extra_args=["--events", str(events), "--events-format", events_format, "--admin", admin],
    )

    # Flow control: 3 producers x 600 against max 1000 / stop 900 / resume 500.
    producers = [
        Producer(router.url, flowed, [make_message(f"p{k}", i) for i in range(600)], timeout=120) for k in range(3)
    ]
    threads = start(*producers)
    assert wait_until_quiet(producers) == 901
    during = stat(admin, flowed)
    assert during["flowStopped"] is True and during["flowStoppedCount"] == 1
    drain = Consumer(router.url, flowed, count=1800, prefetch=20, timeout=120)
    run_all(drain)
    for thread in threads:
        thread.join(60)
    assert drain.error is None and len(drain.received) == 1800
    after = stat(admin, flowed)

    # Groups: 20 groups x 50 messages, 3 consumers and one killed mid-stream (its
    # unsettled messages are released and delivered again).
    names = ["c0", "c1", "victim"]
    consumers = {
        name: start_consumer(router.url, grouped, prefetch, delay, tmp_path / f"{name}.log")
        for name, (prefetch, delay) in zip(names, [(5, 0.5), (10, 0.5), (20, 1)], strict=True)
    }
    sender = Producer(router.url, grouped, group_messages(20, 50, 0, 1), timeout=120)
    sending = threading.Thread(target=run_all, args=(sender,), kwargs={"timeout": 120})
    sending.start()
    kill_after(consumers["victim"], tmp_path / "victim.log", 100)
    sending.join(120)
    wait_all([consumers["c0"], consumers["c1"]], 120)
    processed = {(group, seq) for name in names for kind, group, seq, _ in read_records(tmp_path / f"{name}.log")}
    router.stop()  # flushes the event log

    out = tmp_path / "report"
    result = subprocess.run(
        # The class archive has a test of its own (below); this one leaves the user's cache be.
        [sys.executable, "-m", "qpid_flow", "report", str(events.parent), "--out", str(out), "--no-class-archive"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "report: [1/7] reading events" in result.stderr

    flow = table(out, "flow_by_destination")
    assert int(flow[flowed]["flowStoppedCount"]) == after["flowStoppedCount"] >= 1
    assert int(flow[flowed]["peak_depth"]) == 901
    assert int(flow[flowed]["max_overshoot_count"]) == 1
    assert int(flow[flowed]["flowStopCount"]) == 900
    assert int(flow[grouped]["flowStoppedCount"]) == 0

    audit = table(out, "group_audit")
    assert set(audit) == {grouped}
    assert int(audit[grouped]["order_violations"]) == 0
    assert int(audit[grouped]["overlap_violations"]) == 0
    assert int(audit[grouped]["first_deliveries"]) == 1000
    assert int(audit[grouped]["redeliveries"]) > 0, "the killed consumer's messages went out again"
    assert len(processed) == 1000

    latency = table(out, "latency_by_destination")
    assert int(latency[flowed]["to_settle_count"]) == 1800
    advice = table(out, "threshold_advice")
    # Producers with qpid-flow's default window of 100: max 1000 less their windows keeps
    # the destination under its max whatever the clients do. Usually all three are attached
    # at once (300, 700); under load one can send its 600 and go before the last attaches.
    peak = int(advice[flowed]["peak_producers"])
    assert peak in (2, 3)
    assert int(advice[flowed]["window_count"]) == 100 * peak
    assert int(advice[flowed]["advised_stop_count"]) == 1000 - 100 * peak
    page = (out / "index.html").read_text()
    assert "No violation" in page and 'src="plots/depth-' in page


def _report(logs: Path, out: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "report", str(logs), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _tables(out: Path) -> dict[str, str]:
    return {part.parent.name: part.read_text() for part in sorted((out / "csv").glob("*/*.csv"))}


def test_the_first_report_records_the_class_archive_and_the_next_ones_map_it(tmp_path: Path) -> None:
    """Same tables every time: recording, mapping, and with a damaged archive (the JVM
    refuses it and loads classes as usual, with no word of it on the terminal)."""
    from qpid_flow.analytics.synthetic import generate

    logs, cache = tmp_path / "logs", tmp_path / "cache"
    generate(logs, runs=2, messages=500, inject_order=2, inject_overlap=1)

    first = _report(logs, tmp_path / "first", cache)
    assert "recording the JVM's classes" in first.stderr
    (archive,) = (cache / "qpid-flow").glob("spark-classes-*.jsa")
    assert archive.stat().st_size > 10_000_000, "the archive holds Spark's classes"
    assert not list((cache / "qpid-flow").glob("*.partial"))

    second = _report(logs, tmp_path / "second", cache)
    assert "recording" not in second.stderr
    assert _tables(tmp_path / "second") == _tables(tmp_path / "first")

    archive.chmod(0o600)
    archive.write_bytes(b"not an archive" * 1000)
    damaged = _report(logs, tmp_path / "damaged", cache)
    assert "recording" not in damaged.stderr
    said = (damaged.stderr + damaged.stdout).lower()
    assert "[cds" not in said and "shared archive" not in said
    assert _tables(tmp_path / "damaged") == _tables(tmp_path / "first")
