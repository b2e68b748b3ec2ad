"""The event log when its files are taken from under it: a log file or folder deleted (or
moved aside) while the writer runs is made again, and said so, rather than the records
going on into a deleted file; a leftover stream that cannot be opened is kept aside, and
said so, rather than deleted."""

from __future__ import annotations

import shutil
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from qpid_flow.policies.event_log.writers import (
    Batch,
    JsonLinesSink,
    Row,
    SegmentSink,
    arrow_schema,
    read_rows,
    recover_segments,
)
from tests.unit.extras import needs_pyarrow


def _rows(first: int, count: int) -> list[Row]:
    return [("enqueue", 1.0 + n, n, "q", n, f"id-{n}", 40, None, 3, n, 40 * n) for n in range(first, first + count)]


def _numbers(records: list[dict[str, Any]]) -> list[int]:
    return sorted(record["n"] for record in records)


def _take_away(path: Path, how: str) -> None:
    """What an operator does to a log under a running writer."""
    if how == "rm file":
        path.unlink()
    elif how == "rm -rf folder":
        shutil.rmtree(path.parent)
    else:  # "mv file": a rotation by an outside tool (logrotate without copytruncate)
        path.rename(path.with_name(path.name + ".old"))


def _events(logs: list[MutableMapping[str, Any]], prefix: str = "event_log_") -> list[str]:
    return [entry["event"] for entry in logs if entry["event"].startswith(prefix)]


# --- a file or folder deleted while the writer runs ----------------------------------------


@pytest.mark.parametrize("how", ["rm file", "rm -rf folder", "mv file"])
def test_jsonl_makes_its_file_again_when_it_is_taken_away(tmp_path: Path, how: str) -> None:
    """The next batch after the file (or its folder) went goes to a new file at the path,
    once logged; it used to go on, silently, into the deleted file."""
    path = tmp_path / "logs" / "events.jsonl"
    sink = JsonLinesSink(path, "r", max_bytes=0, backups=0)
    sink.write(Batch.of(_rows(1, 5)))
    _take_away(path, how)
    with structlog.testing.capture_logs() as logs:
        sink.write(Batch.of(_rows(6, 3)))
        sink.write(Batch.of(_rows(9, 2)))
    sink.close()
    assert path.exists(), "the file was not made again"
    assert _numbers(read_rows([path])) == list(range(6, 11))
    assert _events(logs) == ["event_log_file_gone"]
    assert logs[0]["path"] == str(path)
    if how == "mv file":
        assert _numbers(read_rows([path.with_name("events.jsonl.old")])) == list(range(1, 6))


@needs_pyarrow
@pytest.mark.parametrize("how", ["rm file", "rm -rf folder"])
def test_a_segment_taken_away_is_replaced_by_a_new_one(tmp_path: Path, how: str) -> None:
    """The open segment's stream (or the whole folder) deleted: the next batch starts a new
    segment in the folder, made again, and the loss of the old one's records is logged
    with their number. It used to write on into the deleted stream until the shutdown."""
    folder = tmp_path / "logs" / "events"
    sink = SegmentSink(folder, "r", 0, 0)
    sink.write(Batch.of(_rows(1, 10)))
    _take_away(folder / "events-r-00001.arrows", how)
    with structlog.testing.capture_logs() as logs:
        sink.write(Batch.of(_rows(11, 5)))
        sink.write(Batch.of(_rows(16, 5)))
        sink.close()
    assert sorted(p.name for p in folder.iterdir()) == ["events-r-00002.parquet"]
    assert _numbers(read_rows([folder / "events-r-00002.parquet"])) == list(range(11, 21))
    assert _events(logs) == ["event_log_file_gone"], logs
    assert logs[0]["path"] == str(folder / "events-r-00001.arrows")
    assert logs[0]["lost_events"] == 10


@needs_pyarrow
def test_a_segment_taken_away_after_its_last_batch_is_logged_as_gone_at_close(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    sink = SegmentSink(folder, "r", 0, 0)
    sink.write(Batch.of(_rows(1, 4)))
    shutil.rmtree(folder)
    with structlog.testing.capture_logs() as logs:
        sink.close()
    assert _events(logs) == ["event_log_file_gone"], logs
    assert logs[0]["lost_events"] == 4
    assert not folder.exists()


# --- a leftover stream that cannot be opened -----------------------------------------------


def _stream_bytes() -> bytes:
    """A segment's stream as its writer leaves it: the schema, two batches, the end."""
    import pyarrow as pa

    from qpid_flow.policies.event_log.writers import _record_batches

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, arrow_schema()) as writer:
        for first in (1, 11):
            for record_batch in _record_batches(Batch.of(_rows(first, 10)), "old"):
                writer.write_batch(record_batch)
    return bytes(sink.getvalue().to_pybytes())


def _damaged_head() -> bytes:
    data = bytearray(_stream_bytes())
    data[0:8] = bytes(8)  # the schema message's framing
    return bytes(data)


@needs_pyarrow
@pytest.mark.parametrize(
    "content",
    [_damaged_head, lambda: b"not an arrow stream at all, " * 40, lambda: b"junk"],
    ids=["first bytes damaged", "junk", "short junk"],
)
def test_a_leftover_stream_that_cannot_be_opened_is_kept_aside(tmp_path: Path, content: Any) -> None:
    """It used to be taken for an empty segment: an empty Parquet file written, the stream
    deleted, nothing logged."""
    folder = tmp_path / "events"
    folder.mkdir()
    data = content()
    (folder / "events-old-00001.arrows").write_bytes(data)
    with structlog.testing.capture_logs() as logs:
        SegmentSink(folder, "new", 0, 0).close()
    assert sorted(p.name for p in folder.iterdir()) == ["events-old-00001.arrows.bad"]
    assert (folder / "events-old-00001.arrows.bad").read_bytes() == data
    assert _events(logs) == ["event_log_segment_quarantined"], logs
    assert logs[0]["kept_as"] == str(folder / "events-old-00001.arrows.bad")


@needs_pyarrow
@pytest.mark.parametrize("length", [0, 5, 100], ids=["empty", "torn marker", "torn schema"])
def test_a_leftover_stream_its_writer_never_flushed_is_removed_quietly(tmp_path: Path, length: int) -> None:
    """A stream with nothing or part of its schema message (its writer died before or during
    its first flush) holds no record: it is removed, with nothing set aside or logged."""
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "events-old-00001.arrows").write_bytes(_stream_bytes()[:length])
    with structlog.testing.capture_logs() as logs:
        recover_segments(folder)
    assert not list(folder.glob("events-old-00001.arrows*"))
    assert _events(logs) == []
    assert _numbers(read_rows(sorted(folder.glob("*.parquet")))) == []


@needs_pyarrow
def test_a_leftover_stream_with_a_torn_tail_still_converts_what_is_readable(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    data = _stream_bytes()
    (folder / "events-old-00001.arrows").write_bytes(data[: len(data) - 100])  # the second batch torn
    with structlog.testing.capture_logs() as logs:
        recovered = recover_segments(folder)
    assert [p.name for p in recovered] == ["events-old-00001.parquet"]
    assert _numbers(read_rows(recovered)) == list(range(1, 11))
    assert sorted(p.name for p in folder.iterdir()) == ["events-old-00001.parquet"]
    assert _events(logs) == []
