"""The event log under faults: a full disk, a folder that cannot be written, a writer that
is stopped, two writers on one folder, a damaged file from an earlier run. Whatever
happens, qpid-flow starts, stops, and writes on once the fault is gone, losing no more
than the batches that met the fault."""

from __future__ import annotations

import array
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qpid_flow.analytics.inputs import expand_inputs
from qpid_flow.policies.event_log.process import EventLogUnavailable, ProcessSink
from qpid_flow.policies.event_log.writers import (
    Batch,
    JsonLinesSink,
    Row,
    SegmentSink,
    WriterThread,
    read_rows,
    stream_batches,
)
from tests.unit.extras import needs_pyarrow


def _rows(first: int, count: int) -> list[Row]:
    return [("enqueue", 1.0 + n, n, "q", n, f"id-{n}", 40, None, 3, n, 40 * n) for n in range(first, first + count)]


def _numbers(records: list[dict[str, Any]]) -> list[int]:
    return sorted(record["n"] for record in records)


# --- JSON lines ---------------------------------------------------------------------------

needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")


@needs_dev_full
def test_jsonl_carries_on_after_a_full_disk_failed_a_rotation(tmp_path: Path) -> None:
    """The file being rotated is on a full disk (/dev/full: every write fails with ENOSPC),
    so closing it fails. The rotation still happens, and the next batch goes to the new
    file rather than failing for ever with "I/O operation on closed file"."""
    path = tmp_path / "events.jsonl"
    path.symlink_to("/dev/full")  # renamed aside by the rotation: the new file is a real one
    sink = JsonLinesSink(path, "r", max_bytes=300, backups=2)
    with pytest.raises(OSError, match="No space left"):
        sink.write(Batch.of(_rows(1, 10)))
    sink.write(Batch.of(_rows(11, 1)))  # one line: less than max_bytes, no rotation
    sink.close()
    assert (tmp_path / "events.jsonl.1").is_symlink(), "the full file was rotated aside"
    assert _numbers(read_rows([path])) == [11]


@needs_dev_full
def test_jsonl_reopens_its_file_after_a_failed_write(tmp_path: Path) -> None:
    """A flush that fails (a full disk) is not retried for ever on the same descriptor: the
    next batch opens the file again, so once there is room (here: the path is a real file
    again) the log carries on, and what the failed flush left buffered is not written."""
    path = tmp_path / "events.jsonl"
    path.symlink_to("/dev/full")
    sink = JsonLinesSink(path, "r", max_bytes=0, backups=0)
    with pytest.raises(OSError, match="No space left"):
        sink.write(Batch.of(_rows(1, 3)))
    path.unlink()
    path.write_text("")
    sink.write(Batch.of(_rows(4, 2)))
    sink.close()
    assert _numbers(read_rows([path])) == [4, 5]


def test_jsonl_ends_a_torn_last_line_before_appending(tmp_path: Path) -> None:
    """A crash or a full disk can leave a last line without its newline; appended to as it
    is, the next run's first record would be glued to it and lost with it."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"n": -1}\n{"n": 0, "ev')
    sink = JsonLinesSink(path, "r", max_bytes=0, backups=0)
    sink.write(Batch.of(_rows(1, 2)))
    sink.close()
    lines = path.read_text().splitlines()
    assert lines[:2] == ['{"n": -1}', '{"n": 0, "ev']
    assert [json.loads(line)["n"] for line in lines[2:]] == [1, 2]


# --- Parquet: a failed write, a damaged stream ---------------------------------------------

# Writes a segment, then a batch the file size limit (RLIMIT_FSIZE: like a full disk, a
# write past it is cut short, then fails) lets in only in part, then, with the limit gone
# ("room again"), more batches; then closes the sink, or dies without closing it.
_WRITE_THROUGH_A_FULL_DISK = textwrap.dedent(
    """
    import os, resource, signal, sys
    from pathlib import Path
    from qpid_flow.policies.event_log.writers import Batch, SegmentSink

    folder, then = Path(sys.argv[1]), sys.argv[2]
    rows = lambda first: [("enqueue", 1.0 + n, n, "q", n, f"id-{n}", 40, None, 3, n, 40 * n)
                          for n in range(first, first + 100)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-limit write fails with EFBIG instead
    sink = SegmentSink(folder, "r", 0, 0)
    sink.write(Batch.of(rows(1)))
    (stream,) = folder.glob("*.arrows")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (stream.stat().st_size + 3000, hard))
    try:
        sink.write(Batch.of(rows(101)))
    except OSError as exc:
        print("failed:", exc, file=sys.stderr)
    else:
        sys.exit("the batch was written whole: the limit did not bite")
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    sink.write(Batch.of(rows(201)))
    sink.write(Batch.of(rows(301)))
    if then == "close":
        sink.close()
    else:
        os._exit(0)  # as kill -9 would: the stream stays, unfinished
    """
)

# Starts a writer on the folder (which recovers what is there), and prints every n in it.
_START_AND_READ = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from qpid_flow.policies.event_log.writers import SegmentSink, read_rows

    folder = Path(sys.argv[1])
    SegmentSink(folder, "next", 0, 0).close()
    print(json.dumps(sorted(r["n"] for r in read_rows(sorted(folder.glob("events-*.parquet"))))))
    """
)


def _python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)


@needs_pyarrow
@pytest.mark.parametrize("then", ["close", "die"])
def test_a_write_cut_short_by_a_full_disk_leaves_a_sound_segment(tmp_path: Path, then: str) -> None:
    """The torn batch is cut off the stream, and the batches after it are written after
    the last complete one: finished at close, or recovered at the next start, the segment
    holds every batch but the one that met the full disk (reading it used to fail, crash,
    or refuse the next start: "Length spanned by binary offsets ...")."""
    folder = tmp_path / "events"
    written = _python(_WRITE_THROUGH_A_FULL_DISK, str(folder), then)
    assert written.returncode == 0, written.stderr
    assert "failed:" in written.stderr
    read = _python(_START_AND_READ, str(folder))
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == [*range(1, 101), *range(201, 401)]
    assert not list(folder.glob("*.bad")), "nothing was damaged"


# The same, but the full disk meets the segment's first batch, which carries the schema.
_FIRST_WRITE_ON_A_FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from qpid_flow.policies.event_log.writers import Batch, SegmentSink

    folder = Path(sys.argv[1])
    rows = lambda first: [("enqueue", 1.0 + n, n, "q", n, f"id-{n}", 40, None, 3, n, 40 * n)
                          for n in range(first, first + 100)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sink = SegmentSink(folder, "r", 0, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300, hard))
    try:
        sink.write(Batch.of(rows(1)))
    except OSError as exc:
        print("failed:", exc, file=sys.stderr)
    else:
        sys.exit("the batch was written whole: the limit did not bite")
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    sink.write(Batch.of(rows(201)))
    sink.write(Batch.of(rows(301)))
    sink.close()
    """
)


@needs_pyarrow
def test_a_first_write_cut_short_by_a_full_disk_loses_only_that_batch(tmp_path: Path) -> None:
    """The stream's schema goes out with its first batch: cut back to nothing, the stream
    had none, and the batches after it were read as an empty segment (0 rows of 200,
    found by a review). The stream is now given up and the next batch starts a segment."""
    folder = tmp_path / "events"
    written = _python(_FIRST_WRITE_ON_A_FULL_DISK, str(folder))
    assert written.returncode == 0, written.stderr
    assert "failed:" in written.stderr
    read = _python(_START_AND_READ, str(folder))
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == [*range(201, 401)]


def _damaged_stream(path: Path) -> None:
    """A stream as a writer without the cut left it: a valid batch (n 1-10), one whose
    offsets point backwards (what a batch written over a torn one reads as), another valid one."""
    import pyarrow as pa

    from qpid_flow.policies.event_log.writers import _record_batches, arrow_schema

    schema = arrow_schema()
    first, damaged, last = (_record_batches(Batch.of(_rows(n, 10)), "old")[0] for n in (1, 11, 21))
    backwards = array.array("i", [0, 1, 2, 3, 9, 5, 6, 7, 8, 9, 10]).tobytes()
    address = pa.Array.from_buffers(pa.string(), 10, [None, pa.py_buffer(backwards), pa.py_buffer(b"q" * 10)])
    columns = [address if name == "address" else damaged.column(name) for name in schema.names]
    damaged = pa.RecordBatch.from_arrays(columns, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as file, pa.ipc.new_stream(file, schema) as writer:
        for batch in (first, damaged, last):
            writer.write_batch(batch)


@needs_pyarrow
def test_reading_a_stream_stops_at_its_first_corrupt_batch(tmp_path: Path) -> None:
    stream = tmp_path / "events-old-00001.arrows"
    _damaged_stream(stream)
    assert [row["n"] for batch in stream_batches(stream) for row in batch.to_pylist()] == list(range(1, 11))


@needs_pyarrow
def test_a_damaged_stream_does_not_stop_the_start_and_is_kept_aside(tmp_path: Path) -> None:
    """Recovery converts what comes before the corrupt batch, keeps the stream renamed
    ``.bad`` (which no reader takes for a segment), and the writer starts."""
    folder = tmp_path / "events"
    _damaged_stream(folder / "events-old-00001.arrows")
    SegmentSink(folder, "new", 0, 0).close()
    assert sorted(p.name for p in folder.iterdir()) == ["events-old-00001.arrows.bad", "events-old-00001.parquet"]
    assert _numbers(read_rows([folder / "events-old-00001.parquet"])) == list(range(1, 11))
    assert [Path(p).name for p in expand_inputs([str(folder)])] == ["events-old-00001.parquet"]  # the report's


def _stream_of_three_batches(path: Path) -> list[int]:
    """A clean stream of three batches (n 1-30); where each batch's message ends."""
    import pyarrow as pa

    from qpid_flow.policies.event_log.writers import _record_batches, arrow_schema

    ends = []
    with pa.OSFile(str(path), "wb") as file, pa.ipc.new_stream(file, arrow_schema()) as writer:
        for n in (1, 11, 21):
            writer.write_batch(_record_batches(Batch.of(_rows(n, 10)), "old")[0])
            ends.append(file.tell())
    return ends


@needs_pyarrow
def test_a_batch_whose_message_is_overwritten_is_damage_and_a_cut_one_a_torn_tail(tmp_path: Path) -> None:
    """A batch whose message Arrow cannot parse ("Invalid flatbuffers message") in the
    middle of a stream was taken for the torn tail of a crash: the stream read as ending
    there, said nothing, and its conversion at the next start deleted it with the batches
    after the damage. Only a message cut short is a torn tail now."""
    from qpid_flow.policies.event_log.writers import read_stream

    stream = tmp_path / "events-old-00001.arrows"
    ends = _stream_of_three_batches(stream)
    clean = stream.read_bytes()
    stream.write_bytes(clean[: ends[1]] + b"\xff" * 64 + clean[ends[1] + 64 :])  # the third batch's header
    batches, reason = read_stream(stream)
    assert _numbers([row for batch in batches for row in batch.to_pylist()]) == list(range(1, 21))
    assert reason is not None and reason.startswith("batch 3: ")
    # The third batch cut short by a crash, anywhere: in its body, or in the 8-byte prefix
    # Arrow writes in two calls (a kill between them leaves 4 bytes of it).
    for cut in (ends[2] - 100, *range(ends[1] + 1, ends[1] + 12)):
        stream.write_bytes(clean[:cut])
        batches, reason = read_stream(stream)
        rows = [row for batch in batches for row in batch.to_pylist()]
        assert (_numbers(rows), reason) == (list(range(1, 21)), None), cut - ends[1]


@needs_pyarrow
def test_a_stream_that_is_no_event_log_is_set_aside_at_start(tmp_path: Path) -> None:
    """A file named like a segment whose schema is not the event log's cannot be converted:
    it is renamed ``.bad`` rather than refusing the start."""
    import pyarrow as pa

    folder = tmp_path / "events"
    folder.mkdir()
    other = pa.schema([("x", pa.int64())])
    with pa.OSFile(str(folder / "events-odd-00001.arrows"), "wb") as file, pa.ipc.new_stream(file, other) as writer:
        writer.write_batch(pa.record_batch([pa.array([1])], schema=other))
    SegmentSink(folder, "new", 0, 0).close()
    assert [p.name for p in folder.iterdir()] == ["events-odd-00001.arrows.bad"]


# --- Parquet: a folder that cannot be written, two writers on one folder --------------------


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder this process cannot create files in: without write permission, and, for
    root (whom permissions do not stop), immutable. Where neither holds (root on a file
    system without the immutable flag, such as tmpfs), a folder of the kernel's, where no
    one creates files (/sys/kernel)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    immutable = os.geteuid() == 0 and shutil.which("chattr") is not None
    if immutable:
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        yield folder if not _can_create_in(folder) else _kernel_folder()
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def _can_create_in(folder: Path) -> bool:
    try:
        (folder / "probe").touch()
    except OSError:
        return False
    (folder / "probe").unlink()
    return True


def _kernel_folder() -> Path:
    for candidate in (Path("/sys/kernel"), Path("/proc/self")):
        if candidate.is_dir() and not _can_create_in(candidate):
            return candidate
    raise AssertionError("no folder this test can make read-only here (root, no chattr, no /sys)")


@needs_pyarrow
def test_a_parquet_folder_that_cannot_be_written_refuses_the_start(read_only_folder: Path) -> None:
    """Segments are only created at the first flush: the start checks the folder, rather
    than reporting ready and losing every event."""
    with pytest.raises(OSError):
        SegmentSink(read_only_folder, "r", 0, 0)
    with pytest.raises(EventLogUnavailable) as refused:
        ProcessSink("parquet", read_only_folder, "r", 0, 0)
    message = str(refused.value)
    assert "\n" not in message and f"cannot write the event log at {read_only_folder}" in message


@needs_pyarrow
def test_a_second_writer_on_the_folder_leaves_the_first_one_s_segment_alone(tmp_path: Path) -> None:
    """Starting, a writer converts the streams that writers which died left; a live
    writer's open stream is not one of them, and the live writer finishes it whole."""
    folder = tmp_path / "events"
    first = SegmentSink(folder, "one", 0, 0)
    first.write(Batch.of(_rows(1, 10)))
    second = SegmentSink(folder, "two", 0, 0)
    assert [p.name for p in folder.glob("*.arrows")] == ["events-one-00001.arrows"]
    assert not list(folder.glob("*.parquet"))
    first.write(Batch.of(_rows(11, 10)))
    second.write(Batch.of(_rows(101, 5)))
    first.close()
    second.close()
    assert _numbers(read_rows([folder / "events-one-00001.parquet"])) == list(range(1, 21))
    assert _numbers(read_rows([folder / "events-two-00001.parquet"])) == list(range(101, 106))


@needs_pyarrow
def test_finishing_a_stream_that_has_gone_never_empties_its_parquet(tmp_path: Path) -> None:
    from qpid_flow.policies.event_log.writers import _to_parquet

    sink = SegmentSink(tmp_path, "r", 0, 0)
    sink.write(Batch.of(_rows(1, 10)))
    sink.close()
    with pytest.raises(FileNotFoundError):
        _to_parquet(tmp_path / "events-r-00001.arrows")
    assert _numbers(read_rows([tmp_path / "events-r-00001.parquet"])) == list(range(1, 11))


# --- the writer process ----------------------------------------------------------------------


def test_a_stopped_writer_process_does_not_hang_the_shutdown(tmp_path: Path) -> None:
    """The child is stopped (SIGSTOP, or stuck on a hung disk): its pipe fills, the writer
    thread blocks on it, the queue fills. Closing still returns, soon after its deadline,
    having killed the child; what was pending is counted as lost."""
    sink = ProcessSink("jsonl", tmp_path / "events.jsonl", "r", 0, 0)
    child = sink._child
    assert child is not None
    writer = WriterThread(sink, max_pending=2)
    os.kill(child.pid, signal.SIGSTOP)
    try:
        for first in range(1, 200_001, 2000):
            writer.submit(Batch.of(_rows(first, 2000)))
            if writer.dropped:
                break
            time.sleep(0.02)
        assert writer.dropped, "the writer never fell behind the stopped child"
        closing = threading.Thread(target=writer.close, kwargs={"timeout": 2.0}, daemon=True)
        started = time.monotonic()
        closing.start()
        closing.join(20)
        assert not closing.is_alive(), "close() waited for ever on the stopped writer"
        assert time.monotonic() - started < 10
        assert child.poll() == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
            os.kill(child.pid, signal.SIGCONT)
        child.wait(10)


@needs_pyarrow
@pytest.mark.parametrize(("level", "format_"), [("warning", "console"), ("error", "json")])
def test_the_writer_process_logs_as_the_router_was_told_to(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], level: str, format_: str
) -> None:
    """The child's log lines (on the router's stderr) follow the router's ``log_level`` and
    ``log_format``: the warning that a damaged stream was set aside at start shows at
    ``warning`` and not at ``error``; a failed write, an error, shows in both."""
    folder = tmp_path / "events"
    _damaged_stream(folder / "events-old-00001.arrows")
    sink = ProcessSink("parquet", folder, "r", 0, 0, log_level=level, log_format=format_)
    sink.write(Batch.of([("flow_stopped", 1.0, 1, "q", {"depth": "not a number"})]))  # Arrow refuses it
    sink.close()
    lines = capfd.readouterr().err.splitlines()
    set_aside = [line for line in lines if "event_log_segment_quarantined" in line]
    failed = [line for line in lines if "event_log_write_failed" in line]
    assert len(failed) == 1, lines
    if level == "warning":
        assert len(set_aside) == 1, lines
    else:
        assert set_aside == []
    assert _is_json(failed[0]) == (format_ == "json")


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
