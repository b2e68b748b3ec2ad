"""The columnar event log across a crash: kill -9 loses at most the last flush interval,
what is left is readable, and the next start on the folder turns it into Parquet; a
router killed alone leaves its writer to finish the files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qpid_flow.policies.event_log.writers import read_rows
from qpid_flow.testing import free_ports

from .clients import Consumer, Producer, make_message, run_all
from .harness.router import PROJECT_ROOT


def _records(folder: Path) -> list[dict]:
    return read_rows(sorted(folder.glob("events-*.arrows")) + sorted(folder.glob("events-*.parquet")))


def _traffic_on_disk(router, folder: Path, count: int = 200) -> None:
    """``count`` messages through ``router``: enqueue, transfer_settled, deliver and settle
    each. Returns once the writer has them all on disk (a flush every 0.5 s)."""
    run_all(Producer(router.url, "crash", [make_message("p", i) for i in range(count)]))
    run_all(Consumer(router.url, "crash", count=count))
    deadline = time.monotonic() + 30
    while sum(r["event"] == "settle" for r in _records(folder)) < count:
        assert time.monotonic() < deadline, "the events never reached the open segment"
        time.sleep(0.2)


def test_a_killed_router_leaves_a_readable_log_that_the_next_start_recovers(qpid_flow_process, tmp_path) -> None:
    folder = tmp_path / "segments"
    args = ["--events", str(folder), "--events-format", "parquet"]
    router = qpid_flow_process(extra_args=args)
    _traffic_on_disk(router, folder)
    # Then kill without a chance to finish: the whole process group at once, router and its
    # writer, as a power cut would (the router alone: the next test).
    os.killpg(router.pid, signal.SIGKILL)
    router.stop()
    (stream,) = folder.glob("events-*.arrows")
    assert not list(folder.glob("events-*.parquet")), "nothing was finished before the kill"
    left = read_rows([stream])
    for event in ("enqueue", "transfer_settled", "deliver", "settle"):
        assert sorted(r["seq"] for r in left if r["event"] == event) == sorted(
            r["seq"] for r in left if r["event"] == "enqueue"
        ), event
    assert sum(r["event"] == "enqueue" for r in left) == 200

    # The next start on the folder converts the crashed run's stream to Parquet.
    again = qpid_flow_process(extra_args=args)
    deadline = time.monotonic() + 30
    while stream.exists():
        assert time.monotonic() < deadline, "the crashed run's stream was never converted"
        time.sleep(0.2)
    (recovered,) = [p for p in folder.glob("events-*.parquet") if p.stem == stream.stem]
    assert read_rows([recovered]) == left
    again.stop()


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int(child) for task in tasks for child in (task / "children").read_text().split()]


def test_a_killed_router_s_writer_finishes_what_it_was_sent(qpid_flow_process, tmp_path) -> None:
    """kill -9 of the router alone (its writer process survives, as when the kernel's
    out-of-memory killer picks the router): the writer sees its input close, writes what it
    had and finishes the segment, so the log is complete and needs no recovery."""
    folder = tmp_path / "segments"
    router = qpid_flow_process(extra_args=["--events", str(folder), "--events-format", "parquet"])
    _traffic_on_disk(router, folder)
    (writer,) = _children(router.pid)
    os.kill(router.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{writer}").exists() and "Z" not in Path(f"/proc/{writer}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the writer did not finish after the router died"
        time.sleep(0.1)
    assert not list(folder.glob("events-*.arrows"))
    records = read_rows(sorted(folder.glob("events-*.parquet")))
    for event in ("enqueue", "transfer_settled", "deliver", "settle"):
        assert sum(r["event"] == event for r in records) == 200, event


def test_a_second_router_on_the_folder_leaves_the_first_one_s_segment_alone(qpid_flow_process, tmp_path) -> None:
    """Two routers on one folder: the second's start converts only what writers that died
    left, not the first one's open segment, which the first finishes whole at its stop."""
    folder = tmp_path / "segments"
    args = ["--events", str(folder), "--events-format", "parquet"]
    first = qpid_flow_process(extra_args=args)
    _traffic_on_disk(first, folder)
    (stream,) = folder.glob("events-*.arrows")
    second = qpid_flow_process(extra_args=args)
    assert stream.exists(), "the second router took the first one's open segment"
    assert not list(folder.glob("events-*.parquet"))
    second.stop()
    first.stop()
    records = read_rows(sorted(folder.glob("events-*.parquet")))
    (run,) = {r["run"] for r in records if r["event"] == "enqueue"}
    assert stream.stem.startswith(f"events-{run}-")
    for event in ("enqueue", "transfer_settled", "deliver", "settle"):
        assert sum(r["event"] == event for r in records) == 200, event


def _not_an_event_log(path: Path) -> None:
    import pyarrow as pa

    path.parent.mkdir(parents=True)
    schema = pa.schema([("x", pa.int64())])
    with pa.OSFile(str(path), "wb") as file, pa.ipc.new_stream(file, schema) as writer:
        writer.write_batch(pa.record_batch([pa.array([1])], schema=schema))


def test_the_writer_process_logs_in_the_router_s_format(tmp_path) -> None:
    """``--log-format console``: the writer's lines (here, that it set aside a stream it
    could not convert) are in that format too, not JSON, in the router's log."""
    folder = tmp_path / "segments"
    _not_an_event_log(folder / "events-odd-00001.arrows")
    log_path = tmp_path / "qpid-flow.log"
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "qpid_flow", "serve", "--listen", f"127.0.0.1:{port}", "--log-format", "console"]
    argv += ["--events", str(folder), "--events-format", "parquet"]
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    with log_path.open("wb") as log:
        router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log_path.read_text(errors="replace"):
            assert router.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(60)
    lines = [line for line in log_path.read_text().splitlines() if "event_log_segment_quarantined" in line]
    assert len(lines) == 1, log_path.read_text()
    assert not lines[0].startswith("{"), "the writer logged JSON, not the router's console format"
