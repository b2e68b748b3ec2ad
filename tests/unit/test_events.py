"""The event log's writers: JSON lines rotated by size, columnar segments that survive a
crash, and a writer thread that never blocks the reactor."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from qpid_flow.policies.event_log.writers import (
    COLUMNS,
    Batch,
    JsonLinesSink,
    Row,
    SegmentSink,
    WriterThread,
    read_rows,
    recover_segments,
)
from tests.unit.extras import needs_pyarrow


def _enqueue(n: int) -> Row:
    return ("enqueue", 1700000000.0 + n, n, "q", n, f"id-{n}", 40, None, 3, n, 40 * n)


def _rows(count: int, first: int = 1) -> list[Row]:
    rows: list[Row] = []
    for n in range(first, first + count):
        rows.append(_enqueue(n))
    return rows


def test_jsonl_lines_have_the_documented_fields_in_order(tmp_path: Path) -> None:
    sink = JsonLinesSink(tmp_path / "events.jsonl", "run1", max_bytes=0, backups=0)
    sink.write(
        Batch.of(
            [
                _enqueue(1),
                ("deliver", 2.0, 2, "q", 1, 40, "g", 7, 1),
                ("settle", 3.0, 3, "q", 1, 40, "g", 7, "accepted", None, 0, 0),
                ("transfer_settled", 4.0, 4, "q", 1, 40, 3, "accepted", None),
                ("flow_stopped", 5.0, 5, "q", {"depth": 9, "bytes": 90, "producers": 1}),
            ]
        )
    )
    sink.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    expected = ["v", "ts", "run", "n", "event", "address", "seq", "id", "size", "group", "producer", "depth", "bytes"]
    assert list(records[0]) == expected
    assert records[0]["run"] == "run1" and records[0]["v"] == 1
    assert records[1] == {
        "v": 1,
        "ts": 2.0,
        "run": "run1",
        "n": 2,
        "event": "deliver",
        "address": "q",
        "seq": 1,
        "size": 40,
        "group": "g",
        "consumer": 7,
        "delivery_count": 1,
    }
    assert records[2]["outcome"] == "accepted" and records[2]["condition"] is None
    assert records[3]["producer"] == 3
    assert records[4]["event"] == "flow_stopped" and records[4]["depth"] == 9


def test_jsonl_rotates_by_size_and_keeps_the_configured_backups(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path, "r", max_bytes=1000, backups=2)
    for n in range(1, 101):
        sink.write(Batch.of([_enqueue(n)]))
    sink.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    assert all(f.stat().st_size <= 1000 + 200 for f in files)
    numbers = sorted(record["n"] for record in read_rows(files))
    # The newest lines are all there, in order, with nothing torn; the oldest went away.
    assert numbers == list(range(numbers[0], 101))


def test_jsonl_with_backups_0_keeps_every_rotated_file(tmp_path: Path) -> None:
    """docs/configuration.md: ``events_backups = 0`` keeps all (as the parquet log does);
    the JSON-lines log was deleted at every rotation instead, each file's records lost."""
    from qpid_flow.analytics.inputs import expand_inputs

    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path, "r", max_bytes=1000, backups=0)
    for n in range(1, 201):
        sink.write(Batch.of([_enqueue(n)]))
    sink.close()
    rotated = sorted((f for f in tmp_path.iterdir() if f != path), key=lambda f: int(f.suffix[1:]))
    count = len(rotated)
    assert count >= 12  # past PATH.9: the numbers are compared as numbers, not text
    assert [f.name for f in rotated] == [f"events.jsonl.{i}" for i in range(1, count + 1)]
    # Logrotate's numbering: the higher the number, the older the file.
    firsts = [json.loads(f.read_text().splitlines()[0])["n"] for f in [path, *rotated]]
    assert firsts == sorted(firsts, reverse=True)
    # Every record is kept, and a report given the folder reads every file.
    files = [Path(f) for f in expand_inputs([str(tmp_path)])]
    assert sorted(files) == sorted([path, *rotated])
    assert sorted(record["n"] for record in read_rows(files)) == list(range(1, 201))


def test_jsonl_with_backups_0_leaves_a_file_past_a_gap_alone(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    (tmp_path / "events.jsonl.1").write_text('{"n": -1}\n')
    (tmp_path / "events.jsonl.3").write_text('{"n": -3}\n')  # .2 deleted by hand
    sink = JsonLinesSink(path, "r", max_bytes=100, backups=0)
    sink.write(Batch.of([_enqueue(1)]))
    sink.close()
    assert (tmp_path / "events.jsonl.2").read_text() == '{"n": -1}\n'
    assert (tmp_path / "events.jsonl.3").read_text() == '{"n": -3}\n'
    assert json.loads((tmp_path / "events.jsonl.1").read_text())["n"] == 1


def test_jsonl_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"n": -1}\n')
    sink = JsonLinesSink(path, "r", max_bytes=0, backups=0)
    sink.write(Batch.of([_enqueue(1)]))
    sink.close()
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [-1, 1]


@needs_pyarrow
def test_segments_become_parquet_with_every_documented_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    sink = SegmentSink(tmp_path, "run1", max_bytes=0, backups=0)
    sink.write(Batch.of(_rows(10)))
    sink.write(Batch.of([("group_assigned", 9.0, 11, "q", {"group": "g", "consumer": 2})]))
    sink.close()
    (parquet,) = tmp_path.glob("*.parquet")
    assert parquet.name == "events-run1-00001.parquet"
    assert not list(tmp_path.glob("*.arrows")), "the stream of a finished segment is deleted"
    table = pq.read_table(parquet)
    assert table.schema.names == [name for name, _ in COLUMNS]
    records = sorted(table.to_pylist(), key=lambda r: r["n"])
    assert [r["n"] for r in records] == list(range(1, 12))
    assert records[0]["id"] == "id-1" and records[0]["producer"] == 3 and records[0]["consumer"] is None
    assert records[-1]["event"] == "group_assigned" and records[-1]["group"] == "g" and records[-1]["seq"] is None
    assert {r["run"] for r in records} == {"run1"} and {r["v"] for r in records} == {1}


@needs_pyarrow
def test_a_full_segment_is_closed_and_the_oldest_pruned(tmp_path: Path) -> None:
    sink = SegmentSink(tmp_path, "r", max_bytes=2000, backups=2)
    for first in range(1, 2001, 100):
        sink.write(Batch.of(_rows(100, first)))
    sink.close()
    finished = sorted(p.name for p in tmp_path.glob("*.parquet"))
    assert len(finished) == 2, finished
    numbers = sorted(r["n"] for r in read_rows(tmp_path.glob("*.parquet")))
    assert numbers[-1] == 2000 and numbers == list(range(numbers[0], 2001))


def _as_if_killed(sink: SegmentSink) -> None:
    """What kill -9 of a writer leaves: its open stream as written so far, no longer locked
    (the kernel closes a dead process's descriptors)."""
    stream = sink._stream
    assert stream is not None
    stream.file.close()
    stream.release()
    sink._stream = None


@needs_pyarrow
def test_a_killed_writer_leaves_a_stream_read_to_its_last_flush(tmp_path: Path) -> None:
    """kill -9 between flushes: the open stream is readable up to the last complete batch,
    a torn tail is left out, and the next start converts it to Parquet."""
    sink = SegmentSink(tmp_path, "r", max_bytes=0, backups=0)
    sink.write(Batch.of(_rows(50)))
    sink.write(Batch.of(_rows(50, 51)))
    _as_if_killed(sink)
    (stream,) = tmp_path.glob("*.arrows")
    # What a crash mid-write leaves: the start of a third batch and no end-of-stream marker.
    with stream.open("ab") as torn:
        torn.write(b"\xff\xff\xff\xff\x10\x02\x00\x00partial batch")
    assert [r["n"] for r in read_rows([stream])] == list(range(1, 101))
    recovered = recover_segments(tmp_path)
    assert [p.suffix for p in recovered] == [".parquet"]
    assert not stream.exists()
    assert [r["n"] for r in read_rows(recovered)] == list(range(1, 101))


@needs_pyarrow
def test_a_fresh_start_recovers_what_a_crash_left(tmp_path: Path) -> None:
    sink = SegmentSink(tmp_path, "old", max_bytes=0, backups=0)
    sink.write(Batch.of(_rows(5)))
    _as_if_killed(sink)
    SegmentSink(tmp_path, "new", max_bytes=0, backups=0).close()
    assert [p.name for p in tmp_path.iterdir()] == ["events-old-00001.parquet"]


class _SlowSink:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.rows: list[Row] = []
        self.closed = False

    def write(self, batch: Batch) -> None:
        self.release.wait(10)
        self.rows.extend(batch.rows())

    def close(self) -> None:
        self.closed = True


def test_the_writer_thread_drops_and_counts_when_the_disk_falls_behind() -> None:
    sink = _SlowSink()
    writer = WriterThread(sink, max_pending=2)
    for first in range(1, 41, 10):  # one taken by the thread and stuck, two queued, one dropped
        writer.submit(Batch.of(_rows(10, first)))
    assert writer.dropped >= 10
    sink.release.set()
    writer.close()
    assert sink.closed
    assert len(sink.rows) + writer.dropped == 40


class _FailingSink:
    closed = False

    def write(self, batch: Batch) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        self.closed = True


def test_a_failing_sink_is_counted_and_does_not_stop_the_writer() -> None:
    sink = _FailingSink()
    writer = WriterThread(sink)
    writer.submit(Batch.of(_rows(3)))
    writer.submit(Batch.of(_rows(4)))
    writer.close()
    assert writer.failed == 7 and sink.closed


def test_parquet_needs_pyarrow_only_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real module, imported before the patch hides it, so that it is back for the other tests.
    pa = pytest.importorskip("pyarrow")
    from qpid_flow.config import ConfigError, RouterConfig, load_config

    assert RouterConfig().events_format == "jsonl"
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(ConfigError, match="events_format = 'parquet': needs pyarrow"):
        load_config(None, {"events_format": "parquet"}, {})
    assert load_config(None, {"events_format": "jsonl"}, {}).events_format == "jsonl"
    assert pa  # imported above: the real one is back for the other tests


def test_jsonl_lines_are_what_json_dumps_makes_of_the_record(tmp_path: Path) -> None:
    """The per-event line templates give the very text of ``json.dumps``: escapes,
    non-ASCII text, null, floats and big integers included."""
    tricky = 'a "quoted", back\\slash, tab\t, é, 雪, \U0001f600'
    rows: list[Row] = [
        ("enqueue", 1764045600.123456, 1, tricky, 2**63 - 1, tricky, 0, None, None, 0, 0),
        ("deliver", 0.1, 2, "q", 1, 40, tricky, 7, 3),
        ("settle", 1e-7, 3, None, 1, 40, None, None, "rejected", "amqp:x: \n", 0, 0),
        ("transfer_settled", 2.5, 4, "q", 1, 40, 3, "accepted", None),
    ]
    sink = JsonLinesSink(tmp_path / "events.jsonl", 'run"1', max_bytes=0, backups=0)
    sink.write(Batch.of(rows))
    sink.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    for line, row in zip(lines, rows, strict=True):
        record = json.loads(line)
        assert line == json.dumps(record)
        assert record["run"] == 'run"1' and record["event"] == row[0] and record["address"] == row[3]
    assert json.loads(lines[0])["id"] == tricky and json.loads(lines[0])["seq"] == 2**63 - 1


def test_jsonl_columns_of_mixed_values_and_interleaved_events_come_out_in_event_order(tmp_path: Path) -> None:
    """Columns are converted whole; one that mixes texts, numbers and nulls, and state
    events between message events, still give json.dumps's text, ordered by ``n``."""
    rows: list[Row] = [
        ("enqueue", 1.5, 1, "q", 1, "id-1", 10, "g", 7, 1, 10),
        ("enqueue", 1.25, 2, "q", 2, None, 11, None, None, 2, 21),
        ("flow_stopped", 1.75, 3, "q", {"depth": 2, "bytes": 21, "producers": 1, "flowStopCount": 2}),
        ("deliver", 2.0, 4, "q", 1, 10, "g", 3, 1),
        ("settle", 2.25, 6, "q", 2, 11, None, 3, "rejected", "qpid-flow:ring-dropped", 0, 0),
        ("settle", 2.5, 5, "q", 1, 10, "g", None, "released", None, 1, 11),
        ("transfer_settled", 3.0, 7, "q", 2, 11, 7, "accepted", None),
    ]
    sink = JsonLinesSink(tmp_path / "events.jsonl", "r", max_bytes=0, backups=0)
    sink.write(Batch.of(rows))
    sink.close()
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [r["n"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    by_n = {row[2]: row for row in rows}
    for record in records:
        row = by_n[record["n"]]
        assert record["event"] == row[0] and record["ts"] == row[1] and record["address"] == row[3]
    assert records[1]["id"] is None and records[1]["producer"] is None and records[0]["producer"] == 7
    assert records[4]["consumer"] is None and records[5]["condition"] == "qpid-flow:ring-dropped"


@pytest.mark.parametrize("format_", ["jsonl", pytest.param("parquet", marks=needs_pyarrow)])
def test_message_ids_recorded_as_read_are_written_as_text(tmp_path: Path, format_: str) -> None:
    """The reactor appends a message-id as the codec read it; both formats write it as
    docs/events.md says: text as is, a number or UUID as its str, binary as hex."""
    import uuid

    an_uuid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    ids: list[object] = [7, "id-2", an_uuid, b"\x01\xff", None, 2**64 - 1]
    rows: list[Row] = [("enqueue", 1.0 + n, n, "q", n, value, 1, None, None, 0, 0) for n, value in enumerate(ids, 1)]
    expected = ["7", "id-2", str(an_uuid), "01ff", None, str(2**64 - 1)]
    if format_ == "jsonl":
        jsonl = JsonLinesSink(tmp_path / "events.jsonl", "r", max_bytes=0, backups=0)
        jsonl.write(Batch.of(rows))
        jsonl.close()
        written = [json.loads(line)["id"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    else:
        segments = SegmentSink(tmp_path / "events", "r", max_bytes=0, backups=0)
        segments.write(Batch.of(rows))
        segments.close()
        written = [r["id"] for r in read_rows(sorted((tmp_path / "events").glob("*.parquet")))]
    assert written == expected
    only_numbers = Batch.of([("enqueue", 1.0, 1, "q", 1, 42, 1, None, None, 0, 0)])
    assert only_numbers.rows()[0][5] == "42"
