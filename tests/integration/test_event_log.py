"""The columnar event log across a crash: kill -9 loses at most the last flush interval,
what is left is readable, and the next start on the folder turns it into Parquet."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from qpid_flow.builtin.event_writers import read_rows

from .clients import Consumer, Producer, make_message, run_all


def _records(folder: Path) -> list[dict]:
    return read_rows(sorted(folder.glob("events-*.arrows")) + sorted(folder.glob("events-*.parquet")))


def test_a_killed_router_leaves_a_readable_log_that_the_next_start_recovers(qpid_flow_process, tmp_path) -> None:
    folder = tmp_path / "segments"
    args = ["--events", str(folder), "--events-format", "parquet"]
    router = qpid_flow_process(extra_args=args)
    run_all(Producer(router.url, "crash", [make_message("p", i) for i in range(200)]))
    run_all(Consumer(router.url, "crash", count=200))
    # 200 messages: enqueue, transfer_settled, deliver, settle each. Wait until the writer
    # has them on disk (a flush every 0.5 s), then kill without a chance to finish.
    deadline = time.monotonic() + 30
    while sum(r["event"] == "settle" for r in _records(folder)) < 200:
        assert time.monotonic() < deadline, "the events never reached the open segment"
        time.sleep(0.2)
    router.stop(signal.SIGKILL)
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
