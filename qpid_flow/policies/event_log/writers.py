"""Where the event log's records go: a writer thread, and a file format behind it.

The reactor only appends each event's fields (see ``plugin.py``) and, every flush
interval, hands the batch to :class:`WriterThread`, which the reactor never waits for: a
full queue drops the batch and counts it. In the router the thread's sink is
``process.ProcessSink``, which passes each batch to a child process; the child
runs the sinks below, so everything that costs (formatting JSON, building Arrow columns,
compressing, system calls) happens outside the router's process.

The reactor fills a :class:`Batch`: per-message events column by column, the rare state
events as rows ``(event, ts, n, address, fields)``. A row of a per-message event is
``(event, ts, n, address, *values)``, its values those of :data:`MESSAGE_FIELDS`.

Two formats, both with docs/events.md's field names:

- ``jsonl``: :class:`JsonLinesSink`, one JSON object per line, rotated by size, for people
  who tail the log and for any tool;
- ``parquet``: :class:`SegmentSink`, columnar, for Spark. The open segment is an Arrow IPC
  stream (``events-RUN-K.arrows``, uncompressed) that gets record batches per flush: a stream is
  readable up to its last complete batch, so a kill -9 loses at most the last flush.
  A full segment is rewritten as Parquet (``events-RUN-K.parquet``, written under a
  hidden name and renamed) and its stream deleted; a stream left behind by a crash is
  converted the next time qpid-flow starts on the folder (:func:`recover_segments`).
"""

from __future__ import annotations

import functools
import json
import os
import queue
import threading
from collections.abc import Iterable
from itertools import repeat
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

import structlog

SCHEMA_VERSION = 1

log = structlog.get_logger(__name__)

# The per-message events and their fields after (ts, n, address): one tuple each.
MESSAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "enqueue": ("seq", "id", "size", "group", "producer", "depth", "bytes"),
    "deliver": ("seq", "size", "group", "consumer", "delivery_count"),
    "settle": ("seq", "size", "group", "consumer", "outcome", "condition", "depth", "bytes"),
    "transfer_settled": ("seq", "size", "producer", "outcome", "condition"),
}

# Every column of the columnar format, with its Arrow type name: docs/events.md's fields.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("v", "int64"),
    ("ts", "float64"),
    ("run", "string"),
    ("n", "int64"),
    ("event", "string"),
    ("address", "string"),
    ("seq", "int64"),
    ("id", "string"),
    ("size", "int64"),
    ("group", "string"),
    ("producer", "int64"),
    ("consumer", "int64"),
    ("depth", "int64"),
    ("bytes", "int64"),
    ("delivery_count", "int64"),
    ("outcome", "string"),
    ("condition", "string"),
    ("reason", "string"),
    ("window", "int64"),
    ("producers", "int64"),
    ("flowStopCount", "int64"),
    ("flowResumeCount", "int64"),
    ("flowStopSize", "int64"),
    ("flowResumeSize", "int64"),
    ("maxCount", "int64"),
    ("maxSize", "int64"),
    ("limitPolicy", "string"),
    ("grouped", "bool_"),
    ("producerWindow", "int64"),
)

Row = tuple[Any, ...]


def message_id_text(value: Any) -> str | None:
    """A message-id as the log writes it: text as it is, binary as hex, a number or UUID as
    its ``str``."""
    if value is None or value.__class__ is str:
        return value
    return value.hex() if isinstance(value, (bytes, bytearray)) else str(value)


_ID = 3 + MESSAGE_FIELDS["enqueue"].index("id")  # the column of enqueue's message-id


def _ids_as_text(batch: Batch) -> None:
    """Make the message-id column text. The reactor appends each id as it was read (its
    conversion costs less here, a column at a time)."""
    ids = batch.columns["enqueue"][_ID]
    kinds = set(map(type, ids))
    if kinds <= {str, type(None)}:
        return
    ids[:] = map(str, ids) if kinds == {int} else map(message_id_text, ids)


class Batch:
    """What the reactor hands to the writer: each per-message event's fields column by
    column (``columns[event][i]`` is the list of field ``i`` of ``("ts", "n", "address",
    *MESSAGE_FIELDS[event])``), and the rare state events as rows.

    Columns rather than a tuple per event: appending to a list allocates nothing the
    garbage collector tracks, and the columnar sink turns each list into an array in one
    call, with nothing to transpose."""

    __slots__ = ("columns", "states")

    def __init__(self) -> None:
        self.columns: dict[str, tuple[list[Any], ...]] = {
            event: tuple([] for _ in range(3 + len(names))) for event, names in MESSAGE_FIELDS.items()
        }
        self.states: list[Row] = []

    @classmethod
    def of(cls, rows: Iterable[Row]) -> Batch:
        """A batch holding ``rows`` (as :class:`Row`): for tests and tools."""
        batch = cls()
        for row in rows:
            columns = batch.columns.get(row[0])
            if columns is None:
                batch.states.append(row)
            else:
                for column, value in zip(columns, row[1:], strict=True):
                    column.append(value)
        return batch

    def __len__(self) -> int:
        return sum(len(columns[0]) for columns in self.columns.values()) + len(self.states)

    def rows(self) -> list[Row]:
        """Every event as a :class:`Row`, in the order of ``n``."""
        _ids_as_text(self)
        rows: list[Row] = list(self.states)
        for event, columns in self.columns.items():
            if columns[0]:
                rows.extend(zip(repeat(event), *columns))
        rows.sort(key=itemgetter(2))
        return rows


class Sink(Protocol):
    """A file format: called on the writer thread only."""

    def write(self, batch: Batch) -> None:
        """Write ``batch`` and hand it to the operating system (a kill -9 keeps it)."""

    def close(self) -> None:
        """Finish the files (a segment becomes Parquet)."""


def _as_dict(row: Row) -> dict[str, Any]:
    """A row as the JSON object of docs/events.md, keys in the documented order."""
    event, ts, n, address = row[0], row[1], row[2], row[3]
    head: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": ts, "run": None, "n": n, "event": event, "address": address}
    names = MESSAGE_FIELDS.get(event)
    if names is None:
        head.update(row[4])
    else:
        head.update(zip(names, row[4:], strict=True))
    return head


def _json_value(value: Any) -> str:
    """One value as JSON: what ``json.dumps`` gives, on the common types' short paths."""
    cls = value.__class__
    if cls is str:
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if cls is int or cls is float:
        return repr(value)
    return json.dumps(value)


def _json_column(values: list[Any]) -> Iterable[str]:
    """Each value of a column as JSON. A column of one type (the usual case: ints, floats or
    texts without a null) is converted by a builtin mapped over it, with no Python call per
    value; anything else value by value."""
    kinds = set(map(type, values))
    if len(kinds) == 1:
        kind = kinds.pop()
        if kind is int or kind is float:
            return map(repr, values)  # json.dumps writes ints and (finite) floats as repr does
        if kind is str:
            return map(encode_basestring_ascii, values)
        if kind is type(None):
            return repeat("null", len(values))
    return map(_json_value, values)


def _line_templates(run: str) -> dict[str, str]:
    """Per per-message event, its JSON line with ``%s`` for each value after the event's
    name: the same text ``json.dumps`` makes of the record, at half the cost."""
    templates = {}
    for event, names in MESSAGE_FIELDS.items():
        head = (
            f'{{"v": {SCHEMA_VERSION}, "ts": %s, "run": {json.dumps(run)}, "n": %s, '
            f'"event": {json.dumps(event)}, "address": %s'
        )
        templates[event] = head + "".join(f", {json.dumps(name)}: %s" for name in names) + "}"
    return templates


class JsonLinesSink:
    """JSON lines, rotated by size: ``PATH``, then ``PATH.1`` ... ``PATH.backups``."""

    def __init__(self, path: Path, run: str, max_bytes: int, backups: int) -> None:
        self.path = path
        self.run = run
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        self._size = self._file.tell()
        self._templates = _line_templates(run)

    def _line(self, row: Row) -> str:
        template = self._templates.get(row[0])
        if template is not None:
            return template % tuple(map(_json_value, row[1:]))
        record = _as_dict(row)
        record["run"] = self.run
        return json.dumps(record)

    def _lines(self, batch: Batch) -> list[str]:
        """Every event of ``batch`` as a JSON line, in the order of ``n``. Built column by
        column: each column is converted to JSON text in one pass (:func:`_json_column`),
        and each line is its template filled from the converted columns."""
        _ids_as_text(batch)
        numbers: list[int] = []
        lines: list[str] = []
        for event, columns in batch.columns.items():
            if columns[0]:
                numbers.extend(columns[1])
                lines.extend(map(self._templates[event].__mod__, zip(*map(_json_column, columns), strict=True)))
        for row in batch.states:
            numbers.append(row[2])
            lines.append(self._line(row))
        order = sorted(range(len(numbers)), key=numbers.__getitem__)
        return list(map(lines.__getitem__, order))

    def write(self, batch: Batch) -> None:
        lines = self._lines(batch)
        text = "\n".join(lines) + "\n" if lines else ""
        if not self.max_bytes or self._size + len(text) < self.max_bytes:
            self._file.write(text)  # the usual case: the whole batch fits in this file
            self._size += len(text)
        else:
            for line in lines:
                self._file.write(line)
                self._file.write("\n")
                self._size += len(line) + 1
                if self._size >= self.max_bytes:
                    self._rotate()
        self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
        if self.backups:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        self._file = open(self.path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        self._file.close()


def _arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as exc:  # checked when the configuration is read; here for direct users
        raise RuntimeError("events_format = 'parquet' needs pyarrow: pip install 'qpid-flow[analytics]'") from exc
    return pyarrow


@functools.cache
def arrow_schema() -> Any:
    pa = _arrow()
    return pa.schema([(name, getattr(pa, type_name)()) for name, type_name in COLUMNS])


def _record_batches(batch: Batch, run: str) -> list[Any]:
    """``batch`` as Arrow record batches, one per kind of event: each column list becomes
    an array in one call, the columns an event does not have are all-null arrays, and the
    constant ones are repeated scalars."""
    pa = _arrow()
    schema = arrow_schema()
    _ids_as_text(batch)
    batches = []
    for event, columns in batch.columns.items():
        count = len(columns[0])
        if not count:
            continue
        given = dict(zip(("ts", "n", "address", *MESSAGE_FIELDS[event]), columns, strict=True))
        arrays = []
        for field in schema:
            name = field.name
            if name == "v":
                arrays.append(pa.repeat(pa.scalar(SCHEMA_VERSION, field.type), count))
            elif name == "run":
                arrays.append(pa.repeat(pa.scalar(run, field.type), count))
            elif name == "event":
                arrays.append(pa.repeat(pa.scalar(event, field.type), count))
            elif name in given:
                arrays.append(pa.array(given[name], type=field.type))
            else:
                arrays.append(pa.nulls(count, field.type))
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    if batch.states:
        records = [_as_dict(row) | {"run": run} for row in batch.states]
        batches.append(pa.RecordBatch.from_pylist(records, schema=schema))
    return batches


def stream_batches(path: Path) -> list[Any]:
    """The complete record batches of an Arrow IPC stream; a torn last batch is left out."""
    pa = _arrow()
    batches: list[Any] = []
    try:
        # Memory-mapped: the batches point into the file rather than being copied (a
        # segment is read back whole when it becomes Parquet).
        with pa.ipc.open_stream(pa.memory_map(str(path), "r")) as reader:
            while True:
                batches.append(reader.read_next_batch())
    except StopIteration:
        pass
    except (pa.ArrowInvalid, OSError):
        pass  # torn by a crash, or empty: what came before is kept
    return batches


def _to_parquet(stream: Path) -> Path:
    """Rewrite a segment's stream as Parquet (hidden name, then renamed), then delete it."""
    pa = _arrow()
    target = stream.with_suffix(".parquet")
    hidden = target.with_name(f".{target.name}.tmp")
    table = pa.Table.from_batches(stream_batches(stream), schema=arrow_schema())
    pa.parquet.write_table(table, str(hidden), compression="snappy")
    os.replace(hidden, target)
    stream.unlink()
    return target


def recover_segments(folder: Path) -> list[Path]:
    """Convert the open segments a crashed run left in ``folder`` to Parquet."""
    recovered = []
    for stream in sorted(folder.glob("events-*.arrows")):
        recovered.append(_to_parquet(stream))
    for torn in folder.glob(".events-*.parquet.tmp"):
        torn.unlink()  # a conversion cut short: its stream was kept and is converted above
    return recovered


class SegmentSink:
    """Columnar segments in ``folder``: an Arrow IPC stream while open, Parquet once full.

    ``max_bytes`` bounds a segment's stream; ``backups`` is how many finished Parquet
    segments are kept besides the open one (0: all are kept)."""

    def __init__(self, folder: Path, run: str, max_bytes: int, backups: int) -> None:
        self.folder = folder
        self.run = run
        self.max_bytes = max_bytes
        self.backups = backups
        folder.mkdir(parents=True, exist_ok=True)
        recover_segments(folder)
        # pyarrow's first scalar costs ~0.2 s of lazy initialisation, holding the GIL: paid
        # here, at start, rather than by the clients during the first flush.
        _record_batches(Batch.of([("enqueue", 0.0, 0, "", 0, None, 0, None, None, 0, 0)]), run)
        # Number on from this run's segments already there: a writer started again for the
        # same run (its predecessor died) must not overwrite them.
        numbers = (p.stem.rsplit("-", 1)[1] for p in folder.glob(f"events-{run}-*.parquet"))
        self._index = max((int(k) for k in numbers if k.isdigit()), default=0)
        self._writer: Any = None
        self._sink: Any = None
        self._stream: Path | None = None

    def _open(self) -> None:
        pa = _arrow()
        self._index += 1
        self._stream = self.folder / f"events-{self.run}-{self._index:05d}.arrows"
        self._sink = pa.OSFile(str(self._stream), "wb")
        # Uncompressed: the stream is a journal, rewritten as compressed Parquet when full.
        self._writer = pa.ipc.new_stream(self._sink, arrow_schema())

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self._writer is None:
            self._open()
        for record_batch in _record_batches(batch, self.run):
            self._writer.write_batch(record_batch)
        self._sink.flush()
        if self.max_bytes and self._sink.tell() >= self.max_bytes:
            self._finish()

    def _finish(self) -> None:
        if self._writer is None or self._stream is None:
            return
        self._writer.close()
        self._sink.close()
        self._writer = None
        _to_parquet(self._stream)
        self._stream = None
        self._prune()

    def _prune(self) -> None:
        if not self.backups:
            return
        finished = sorted(self.folder.glob("events-*.parquet"), key=lambda p: p.stat().st_mtime)
        for old in finished[: -self.backups]:
            old.unlink()

    def close(self) -> None:
        self._finish()


class WriterThread:
    """Hands batches to a :class:`Sink` on its own thread; never blocks the caller."""

    def __init__(self, sink: Sink, max_pending: int = 64) -> None:
        self.sink = sink
        self.dropped = 0  # events lost because the writer fell behind
        self.failed = 0  # events lost because the sink raised
        self._queue: queue.Queue[Batch | None] = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._run, name="qpid-flow-events", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        size = len(batch)
        if not size:
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            # The disk cannot keep up: losing log records beats stalling every client.
            self.dropped += size
            log.warning("event_log_behind", dropped_events=size, dropped_total=self.dropped)

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            try:
                self.sink.write(batch)
            except Exception:
                self.failed += len(batch)
                log.exception("event_log_write_failed", events=len(batch))
        try:
            self.sink.close()
        except Exception:
            log.exception("event_log_close_failed")

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, finish the files, and wait for it (at most ``timeout`` s)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)


def read_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every record of event files of either format, as dicts (tests and small tools)."""
    records: list[dict[str, Any]] = []
    for path in paths:
        if path.suffix == ".parquet":
            records.extend(_arrow().parquet.read_table(str(path)).to_pylist())
        elif path.suffix == ".arrows":
            for batch in stream_batches(path):
                records.extend(batch.to_pylist())
        else:
            records.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return records
