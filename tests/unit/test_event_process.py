"""The event log's child writer: what the router sends it is written whatever happens to
the router, a child that dies is replaced, and a path it cannot write is refused at start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qpid_flow.policies.event_log.process import EventLogUnavailable, ProcessSink
from qpid_flow.policies.event_log.writers import Batch, Row, read_rows
from tests.unit.extras import needs_pyarrow


def _rows(first: int, count: int) -> list[Row]:
    rows: list[Row] = []
    for seq in range(first, first + count):
        n = 2 * seq
        rows.append(("enqueue", 1.0 + seq, n - 1, "q", seq, seq, 10, None, 1, 1, 10))
        rows.append(("settle", 2.0 + seq, n, "q", seq, 10, None, 4, "accepted", None, 0, 0))
    return rows


def _written(format_: str, path: Path) -> list[dict[str, object]]:
    if format_ == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return read_rows(sorted(path.glob("events-*.arrows")) + sorted(path.glob("events-*.parquet")))


def _target(format_: str, tmp_path: Path) -> Path:
    return tmp_path / ("events.jsonl" if format_ == "jsonl" else "events")


def _wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid):
        assert time.monotonic() < deadline, f"process {pid} did not finish"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


@pytest.mark.parametrize("format_", ["jsonl", pytest.param("parquet", marks=needs_pyarrow)])
def test_batches_sent_to_the_child_are_in_the_files_once_it_is_closed(tmp_path: Path, format_: str) -> None:
    path = _target(format_, tmp_path)
    sink = ProcessSink(format_, path, "run1", 100 * 1024 * 1024, 5)
    sink.write(Batch.of(_rows(1, 50)))
    sink.write(Batch.of(_rows(51, 50)))
    sink.close()
    records = _written(format_, path)
    assert [r["seq"] for r in records if r["event"] == "enqueue"] == list(range(1, 101))
    assert [r["id"] for r in records if r["event"] == "enqueue"][:2] == ["1", "2"]  # made text in the child
    assert {r["run"] for r in records} == {"run1"}
    if format_ == "parquet":
        assert not list(path.glob("*.arrows")), "closing finishes the segment as Parquet"


def test_a_path_the_child_cannot_write_is_refused_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(EventLogUnavailable) as refused:
        ProcessSink("parquet", blocker / "events", "r", 0, 0)
    message = str(refused.value)
    assert "\n" not in message and str(blocker / "events") in message


@needs_pyarrow
def test_the_child_finishes_the_files_when_the_router_is_killed(tmp_path: Path) -> None:
    """kill -9 of the router closes the child's input: the child writes what it was sent
    and finishes the segment; nothing is left to recover."""
    path = tmp_path / "events"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from pathlib import Path
        from qpid_flow.policies.event_log.process import ProcessSink
        from qpid_flow.policies.event_log.writers import Batch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_event_process import _rows
        sink = ProcessSink("parquet", Path({str(path)!r}), "r", 0, 0)
        sink.write(Batch.of(_rows(1, 200)))
        print(sink._child.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    router = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert router.returncode == -signal.SIGKILL, router.stderr
    _wait_gone(int(router.stdout.strip()))
    assert not list(path.glob("*.arrows"))
    records = read_rows(sorted(path.glob("events-*.parquet")))
    assert sorted(r["seq"] for r in records if r["event"] == "settle") == list(range(1, 201))


@needs_pyarrow
def test_a_child_that_dies_is_replaced_and_nothing_it_wrote_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "events"
    sink = ProcessSink("parquet", path, "r", 0, 0)
    sink.write(Batch.of(_rows(1, 30)))
    first = sink._child
    assert first is not None
    deadline = time.monotonic() + 30  # it wrote the batch before it dies (a kill loses only what is in flight)
    while len(read_rows(sorted(path.glob("events-*.arrows")))) < 60:
        assert time.monotonic() < deadline, "the first child never wrote its batch"
        time.sleep(0.05)
    first.kill()
    first.wait(10)
    sink.write(Batch.of(_rows(31, 30)))  # noticed here: a new child, which converts the dead one's stream
    assert sink._child is not None and sink._child.pid != first.pid
    sink.close()
    records = read_rows(sorted(path.glob("events-*.parquet")))
    assert sorted(r["seq"] for r in records if r["event"] == "enqueue") == list(range(1, 61))


def test_interrupts_sent_to_the_process_group_do_not_stop_the_child(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group; the child keeps going until the router
    has finished its own shutdown and closes the pipe."""
    path = tmp_path / "events.jsonl"
    sink = ProcessSink("jsonl", path, "r", 0, 0)
    assert sink._child is not None
    os.kill(sink._child.pid, signal.SIGINT)
    os.kill(sink._child.pid, signal.SIGTERM)
    sink.write(Batch.of(_rows(1, 10)))
    sink.close()
    assert len(_written("jsonl", path)) == 20


def test_the_child_runs_at_the_configured_lower_priority(tmp_path: Path) -> None:
    sink = ProcessSink("jsonl", tmp_path / "events.jsonl", "r", 0, 0, nice=7)
    assert sink._child is not None
    child_nice = int(Path(f"/proc/{sink._child.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    sink.close()
    assert child_nice == min(os.getpriority(os.PRIO_PROCESS, 0) + 7, 19)


def test_the_writer_niceness_is_checked_at_start() -> None:
    from qpid_flow.config import ConfigError, load_config

    assert load_config(None, {}, {}).events_writer_nice == 10
    assert load_config(None, {"events_writer_nice": 0}, {}).events_writer_nice == 0
    with pytest.raises(ConfigError, match="events_writer_nice = 20: must be a niceness from 0"):
        load_config(None, {"events_writer_nice": 20}, {})
