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
  converted the next time qpid-flow starts on the folder (:func:`recover_segments`). Its
  writer holds a lock on the open stream, so that a second writer on the folder tells a
  live segment from a crashed one.

Faults cost the batches they hit, never the log: a failed write cuts the stream back to
its last complete batch (:meth:`_OpenStream.append`), JSON lines reopen their file, and a
stream that cannot be converted is set aside (``.bad``) rather than refusing the start.
A file taken away under the writer (deleted, its folder with it, or moved aside) is made
again at the next batch: each sink compares, once per batch, what its path names with the
file it holds open (:func:`_file_gone`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import queue
import threading
import time
from collections.abc import Iterable
from itertools import repeat
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, Protocol, TextIO

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
    """JSON lines, rotated by size: ``PATH``, then ``PATH.1`` ... ``PATH.backups`` (every
    rotated file when ``backups`` is 0).

    A write that fails (a full disk) closes the file, and the next batch opens it again: the
    log carries on by itself once there is room, with the failed batch counted as lost by
    the caller."""

    def __init__(self, path: Path, run: str, max_bytes: int, backups: int) -> None:
        self.path = path
        self.run = run
        self.max_bytes = max_bytes
        self.backups = backups
        self._file: TextIO
        self._size = 0
        self._open()
        self._templates = _line_templates(run)

    def _open(self) -> None:
        """Open ``path`` to append to it. A last line cut short (a crash or a full disk in
        the middle of a write) is ended first: the next record would be glued to it
        otherwise, and lost with it. Its folder is made if it is not there (again: deleted
        under the writer)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = open(self.path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        try:
            if file.tell() and not _ends_with_newline(self.path):
                file.write("\n")
                file.flush()
        except BaseException:
            _close_quietly(file)
            raise
        self._file = file
        self._size = file.tell()

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
        if self._file.closed:
            self._open()  # an earlier write or rotation failed: try again, with this batch
        elif reason := _file_gone(self.path, self._file.fileno()):
            # Deleted or moved aside under the writer: written on, the records would go to a
            # file no one can read, for ever (as WatchedFileHandler, open the path again).
            log.warning("event_log_file_gone", path=str(self.path), reason=reason)
            _close_quietly(self._file)
            self._open()
        lines = self._lines(batch)
        try:
            self._append(lines)
            self._file.flush()
        except OSError:
            # What the buffer still holds is dropped with the file: kept, it would be written
            # after a torn line, or fail every later flush. Reopened by the next batch.
            _close_quietly(self._file)
            raise

    def _append(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n" if lines else ""
        if not self.max_bytes or self._size + len(text) < self.max_bytes:
            self._file.write(text)  # the usual case: the whole batch fits in this file
            self._size += len(text)
            return
        for line in lines:
            self._file.write(line)
            self._file.write("\n")
            self._size += len(line) + 1
            if self._size >= self.max_bytes:
                self._rotate()

    def _rotate(self) -> None:
        """Move the full file aside and start an empty one. Closing flushes the buffer, which
        a full disk fails: the renames and the new file happen all the same, then the error
        goes on to the caller."""
        try:
            self._file.close()
        finally:
            try:
                self._shift_backups()
            finally:
                self._open()

    def _shift_backups(self) -> None:
        """``PATH.i`` becomes ``PATH.i+1`` (the oldest beyond ``backups`` is replaced), then
        ``PATH`` becomes ``PATH.1``. ``backups`` 0 keeps every file, as the parquet log keeps
        every segment and docs/configuration.md says (it deleted the log at each rotation):
        all of ``PATH.1`` ... ``PATH.N`` move up one, ``N`` growing without bound."""
        keep = self.backups or self._last_backup() + 1
        for index in range(keep - 1, 0, -1):
            older = self._backup(index)
            if older.exists():
                older.rename(self._backup(index + 1))
        self.path.rename(self._backup(1))

    def _backup(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def _last_backup(self) -> int:
        """The ``N`` of the run ``PATH.1`` ... ``PATH.N`` there is (0: none). A file past a gap
        (one deleted by hand) is left where it is: shifting up to the gap overwrites nothing."""
        last = 0
        while self._backup(last + 1).exists():
            last += 1
        return last

    def close(self) -> None:
        self._file.close()


def _file_gone(path: Path, descriptor: int) -> str | None:
    """Why ``path`` no longer names the file open as ``descriptor``: ``"deleted"`` (the file
    or its folder), ``"replaced"`` (moved aside, another file or none in its place); None if
    it still does, or if that cannot be told (the file is written on). Two system calls:
    made once per batch, not per record."""
    try:
        named = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "deleted"
    except OSError:
        return None
    opened = os.fstat(descriptor)
    if (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
        return "replaced"
    return None


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def _close_quietly(file: IO[Any]) -> None:
    """Close ``file`` after a failed write: closing flushes, which fails again on a full disk
    (the descriptor is closed all the same)."""
    with contextlib.suppress(OSError):
        file.close()


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
    """The record batches of an Arrow IPC stream up to its end, or to a torn tail (a crash
    mid-write) or a corrupt batch, which is left out with everything after it; none for a
    stream whose head cannot be read. Raises FileNotFoundError for a stream that has gone
    (its writer finished it meanwhile)."""
    return read_stream(path)[0]


def read_stream(path: Path) -> tuple[list[Any], str | None]:
    """:func:`stream_batches`, and what was wrong with the batch it stopped at if that one
    was corrupt, or with the stream's head if it cannot be opened (a torn tail is how a
    crashed run's stream ends, not a fault; nor is a head its writer never finished)."""
    pa = _arrow()
    # Memory-mapped: the batches point into the file rather than being copied (a segment
    # is read back whole when it becomes Parquet).
    source = pa.memory_map(str(path), "r")
    batches: list[Any] = []
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError) as exc:
        if _never_flushed(source):
            return batches, None  # empty: its writer died before or during its first flush
        return batches, f"stream head: {exc}"  # damaged, or no Arrow stream: not to be deleted
    with reader:
        while True:
            try:
                batch = _next_batch(reader, source)
            except _CorruptBatch as exc:
                return batches, f"batch {len(batches) + 1}: {exc}"
            if batch is None:
                break
            try:
                # Reading checks a batch's framing only: one whose offsets point outside
                # its buffers (written over a torn batch) crashes whatever reads its values.
                batch.validate(full=True)
            except pa.ArrowInvalid as exc:
                return batches, f"batch {len(batches) + 1}: {exc}"
            batches.append(batch)
    return batches, None


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


@functools.cache
def _schema_message() -> bytes:
    """What a segment's stream starts with: the schema's IPC message (written with the first
    batch)."""
    return bytes(arrow_schema().serialize().to_pybytes())


def _never_flushed(source: Any) -> bool:
    """Whether the stream ``source``, which cannot be opened, holds no more than the start of
    what its writer writes first: the schema message, or, for a segment given up at its
    first batch (:meth:`_OpenStream.append`), the end-of-stream marker alone. Anything else
    (damaged bytes, a file that is no Arrow stream) may hold what someone wants back."""
    size = int(source.size())
    if size >= len(_schema_message()):
        return False
    head = bytes(source.read_at(size, 0)) if size else b""
    return _schema_message().startswith(head) or _END_OF_STREAM.startswith(head)


class _CorruptBatch(Exception):
    """A batch that cannot be read and is not where the stream was cut short."""


def _next_batch(reader: Any, source: Any) -> Any | None:
    """The stream's next record batch; None at its end, or at a tail torn by a crash.
    Raises _CorruptBatch for a batch damaged otherwise.

    Torn or damaged is told by where reading stopped: a message cut short by a crash
    (whatever Arrow says of it: "only N bytes available", "Expected to read N bytes")
    was read to the end of the file; one that cannot be parsed in the middle of the
    file ("Invalid flatbuffers message") is damage, with whatever follows it unreadable."""
    pa = _arrow()
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None
    except (pa.ArrowInvalid, OSError) as exc:
        if source.tell() >= source.size():
            return None
        raise _CorruptBatch(str(exc)) from None


def _write_parquet(batches: list[Any], target: Path) -> None:
    """``batches`` as the Parquet file ``target``, written under a hidden name and renamed,
    so that a reader never sees half a file."""
    pa = _arrow()
    hidden = target.with_name(f".{target.name}.tmp")
    table = pa.Table.from_batches(batches, schema=arrow_schema())
    try:
        pa.parquet.write_table(table, str(hidden), compression="snappy")
        os.replace(hidden, target)
    except BaseException:
        hidden.unlink(missing_ok=True)  # on a full disk, give its space back at once
        raise


def _to_parquet(stream: Path) -> Path | None:
    """Rewrite a segment's stream as Parquet, then delete the stream; return the Parquet
    file. A stream with a corrupt batch is kept, renamed ``.bad``, beside the Parquet of
    the batches before it: nothing after a corrupt batch can be read reliably. One with
    nothing readable before its fault (a damaged head) is only kept so, and None returned.
    Raises FileNotFoundError, writing nothing, for a stream that has gone."""
    batches, corrupt = read_stream(stream)
    if corrupt is not None and not batches:
        _quarantine(stream, corrupt)
        return None
    target = stream.with_suffix(".parquet")
    _write_parquet(batches, target)
    if corrupt is None:
        stream.unlink()
    else:
        _quarantine(stream, corrupt)
    return target


def _quarantine(stream: Path, reason: str) -> None:
    bad = stream.with_name(f"{stream.name}.bad")
    os.replace(stream, bad)
    log.warning("event_log_segment_quarantined", path=str(stream), kept_as=str(bad), reason=reason)


def _lock_if_abandoned(path: Path) -> int | None:
    """A descriptor holding the lock on the stream ``path`` if no writer holds it (its
    writer died); None if a live writer holds it, or it has gone. Closing the descriptor
    releases the lock."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    if os.fstat(descriptor).st_nlink == 0:  # its writer finished and deleted it since the listing
        os.close(descriptor)
        return None
    return descriptor


def _recover(stream: Path) -> Path | None:
    """Convert one stream left by a writer that died, if it was; never raises, so that a
    damaged segment cannot stop qpid-flow from starting."""
    lock = _lock_if_abandoned(stream)
    if lock is None:
        return None
    try:
        return _to_parquet(stream)
    except OSError as exc:
        # The disk rather than the file (full, failing): kept for the next start to retry.
        log.error("event_log_segment_not_recovered", path=str(stream), error=str(exc))
    except Exception as exc:  # the file itself: unreadable, not an event log's schema
        with contextlib.suppress(OSError):
            _quarantine(stream, str(exc))
    finally:
        os.close(lock)
    return None


def recover_segments(folder: Path) -> list[Path]:
    """Convert to Parquet the open segments that writers which died left in ``folder``.
    A live writer's segment (another qpid-flow writing the same folder) is left alone: its
    writer holds a lock on it (see :class:`_OpenStream`)."""
    recovered = [target for stream in sorted(folder.glob("events-*.arrows")) if (target := _recover(stream))]
    _remove_leftovers(folder)
    return recovered


def _remove_leftovers(folder: Path) -> None:
    """Remove what writers which died left half-made: a conversion cut short (its stream,
    if still there, is converted again) and a stream that never got its name."""
    for torn in folder.glob(".events-*.parquet.tmp"):
        stream = folder / (torn.name[1 : -len(".parquet.tmp")] + ".arrows")
        if not stream.exists():  # else a live writer is converting it, or it was just converted again
            torn.unlink(missing_ok=True)
    for unnamed in folder.glob(".events-*.arrows.new"):
        lock = _lock_if_abandoned(unnamed)
        if lock is not None:
            unnamed.unlink(missing_ok=True)
            os.close(lock)


def _check_writable(folder: Path) -> None:
    """Create and remove a file in ``folder``. Segments are created at the first flush:
    without this, a folder qpid-flow cannot write (read-only, another user's) would be
    accepted at start and every event lost."""
    probe = folder / f".probe-{os.getpid()}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    probe.unlink()


class _OpenStream:
    """The open segment's Arrow IPC stream, and the lock that tells other writers on the
    folder it is live: :func:`recover_segments` takes only streams nobody holds."""

    def __init__(self, path: Path) -> None:
        pa = _arrow()
        self.path = path
        # Created and locked under a hidden name, then renamed: the stream is locked from
        # the moment a writer starting on the folder can see it.
        hidden = path.with_name(f".{path.name}.new")
        self.lock = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self.file: Any = None
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.file = pa.OSFile(str(hidden), "wb")
            # Uncompressed: the stream is a journal, rewritten as compressed Parquet when full.
            self.writer = pa.ipc.new_stream(self.file, arrow_schema())
            os.rename(hidden, path)
        except BaseException:
            if self.file is not None:
                self.file.close()
            hidden.unlink(missing_ok=True)
            os.close(self.lock)
            raise
        self.broken = False  # written after a torn batch it could not cut off: to be finished
        self.events = 0  # how many it holds

    def append(self, record_batches: list[Any]) -> int:
        """Write ``record_batches``; return the stream's size. If a write fails part-way (a
        full disk), the file is cut back to where it was, so that the stream still ends with
        a complete batch and the next one is written after it, then the error is raised."""
        start = self.file.tell()
        try:
            for record_batch in record_batches:
                self.writer.write_batch(record_batch)
            self.file.flush()
        except BaseException:
            # Cut back to nothing, the stream has lost its schema (written with the first
            # batch), and the writer would not write it again: give the stream up too.
            self.broken = not self._cut(start) or start == 0
            raise
        return int(self.file.tell())

    def _cut(self, position: int) -> bool:
        try:
            os.ftruncate(self.lock, position)
            os.lseek(self.file.fileno(), position, os.SEEK_SET)  # the writer goes on from there
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Write the end-of-stream marker and close the file; the lock is kept (see
        :meth:`release`). Readers do without the marker: if it cannot be written, it is cut."""
        end = self.file.tell()
        try:
            self.writer.close()
        except Exception:
            self._cut(end)
        self.file.close()

    def release(self) -> None:
        os.close(self.lock)


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
        _check_writable(folder)
        recover_segments(folder)
        # pyarrow's first scalar costs ~0.2 s of lazy initialisation, holding the GIL: paid
        # here, at start, rather than by the clients during the first flush.
        _record_batches(Batch.of([("enqueue", 0.0, 0, "", 0, None, 0, None, None, 0, 0)]), run)
        # Number on from this run's segments already there: a writer started again for the
        # same run (its predecessor died) must not overwrite them.
        numbers = (p.stem.rsplit("-", 1)[1] for p in folder.glob(f"events-{run}-*.parquet"))
        self._index = max((int(k) for k in numbers if k.isdigit()), default=0)
        self._stream: _OpenStream | None = None

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        # Built before the file is touched: a value Arrow refuses fails here, writing nothing.
        record_batches = _record_batches(batch, self.run)
        if self._stream is not None and (reason := _file_gone(self._stream.path, self._stream.lock)):
            self._abandon(reason)
        if self._stream is None:
            self.folder.mkdir(parents=True, exist_ok=True)  # again, if it was deleted under the writer
            self._stream = _OpenStream(self.folder / f"events-{self.run}-{self._index + 1:05d}.arrows")
            self._index += 1
        try:
            size = self._stream.append(record_batches)
        except BaseException:
            if self._stream.broken:
                self._finish()  # what it holds up to the torn batch; the next batch opens a new segment
            raise
        self._stream.events += len(batch)
        if self.max_bytes and size >= self.max_bytes:
            self._finish()

    def _finish(self) -> None:
        """Close the open segment and rewrite it as Parquet. If that fails (a full disk),
        the stream is left, unlocked, for the next start on the folder to convert: its
        events are on disk, so the failure is logged, not raised."""
        stream = self._stream
        if stream is None:
            return
        if reason := _file_gone(stream.path, stream.lock):
            self._abandon(reason)
            return
        self._stream = None
        try:
            stream.close()
            _to_parquet(stream.path)
        except Exception:
            log.exception("event_log_segment_not_finished", path=str(stream.path))
        finally:
            stream.release()
        self._prune()

    def _abandon(self, reason: str) -> None:
        """Give up the open segment, whose stream was taken from the folder (deleted, with
        the folder maybe, or moved aside): its records went with it. Logged once, with
        their number; the next batch starts a new segment (in the folder made again)."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        log.warning("event_log_file_gone", path=str(stream.path), reason=reason, lost_events=stream.events)
        with contextlib.suppress(Exception):
            stream.close()
        stream.release()

    def _prune(self) -> None:
        if not self.backups:
            return
        finished = []
        for path in self.folder.glob("events-*.parquet"):
            with contextlib.suppress(FileNotFoundError):  # pruned by another writer on the folder
                finished.append((path.stat().st_mtime, path))
        for _, old in sorted(finished)[: -self.backups]:
            old.unlink(missing_ok=True)

    def close(self) -> None:
        self._finish()


ROOM_WAIT = 5.0  # seconds closing waits for room in a full queue before dropping a batch for it
ABORT_GRACE = 5.0  # seconds the thread gets to wind up once a stuck sink was aborted


class WriterThread:
    """Hands batches to a :class:`Sink` on its own thread; never blocks the caller."""

    def __init__(self, sink: Sink, max_pending: int = 64) -> None:
        self.sink = sink
        self.dropped = 0  # events lost because the writer fell behind
        self.failed = 0  # events lost because the sink raised
        self._queue: queue.Queue[Batch | None] = queue.Queue(max_pending)
        self._abandoned = threading.Event()  # closing gave up on the sink: drop what is left
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
            self._drop(batch)

    def _drop(self, batch: Batch) -> None:
        self.dropped += len(batch)
        log.warning("event_log_behind", dropped_events=len(batch), dropped_total=self.dropped)

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._abandoned.is_set():
                self.dropped += len(batch)
                continue
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
        """Write what is queued and finish the files, all within ``timeout`` s. A sink still
        busy then is stuck (a writer process stopped, a hung disk): it is aborted if it can be
        (``abort()``: a ProcessSink kills its child), and what was still queued is lost."""
        if not self._thread.is_alive():
            return
        deadline = time.monotonic() + timeout
        self._queue_end(deadline)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._abort(timeout)

    def _queue_end(self, deadline: float) -> None:
        """Queue the end marker behind the pending batches. A queue that stays full means a
        sink that takes nothing: then the oldest pending batches are dropped to make room,
        rather than waiting for ever (the marker must be queued for the thread to stop)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=max(0.0, min(ROOM_WAIT, deadline - time.monotonic())))
            return
        while True:
            with contextlib.suppress(queue.Empty):
                oldest = self._queue.get_nowait()
                if oldest is not None:
                    self._drop(oldest)
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)
                return

    def _abort(self, timeout: float) -> None:
        log.error("event_log_writer_stuck", seconds=timeout, pending_batches=self._queue.qsize())
        self._abandoned.set()
        abort = getattr(self.sink, "abort", None)  # a sink in this process cannot be interrupted
        if abort is not None:
            abort()
        self._thread.join(ABORT_GRACE)


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
