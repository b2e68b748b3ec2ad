"""The event log's files are written by a child process, not by a thread of the router.

Formatting a batch (Arrow arrays or JSON text from Python values) holds Python's global
interpreter lock, so on a thread of the router it takes turns with the reactor: at
saturation every microsecond it spends is a microsecond less for the clients. In a child
process it runs beside the router instead, on another core. The router's writer thread
(:class:`~qpid_flow.policies.event_log.writers.WriterThread`) only pickles each batch (about
0.5 us a message) and writes it to the child's standard input: :class:`ProcessSink`.

The child (``python -m qpid_flow.policies.event_log.process FORMAT PATH RUN MAX_BYTES BACKUPS
NICE LOG_LEVEL LOG_FORMAT``) logs as the router was told to, and runs at a lower CPU priority
(``events_writer_nice``, 10 by default): on a busy machine the clients' traffic through the
router comes first, and the writer catches up in the gaps, with the pipe and the writer
thread's queue (64 batches) to absorb the lag. It reads length-prefixed batches and hands
them to the real sink (``JsonLinesSink`` or ``SegmentSink``). Its standard input closing is
its only way to stop: the router closes it at shutdown, and the kernel closes it when the
router dies, even by kill -9; either way the child writes what it has received and
finishes its files (a segment becomes Parquet). It ignores SIGINT, SIGTERM and SIGHUP, which a
terminal or a service manager sends to the whole process group, so that it outlives the
router's own shutdown and loses nothing of it. A child that takes nothing more (stopped,
or stuck on a hung disk) does not hold up the router's exit: when the writer thread's
deadline passes, :meth:`ProcessSink.abort` kills it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import structlog

from qpid_flow.policies.event_log.writers import Batch, JsonLinesSink, SegmentSink, Sink

log = structlog.get_logger(__name__)

_LENGTH = struct.Struct(">Q")  # each batch: its pickle's length, then the pickle
_READY = b"ready\n"  # the child's first line once its sink is open; anything else is why not


RESTART_BACKOFF = 10.0  # seconds between attempts to start a writer again


class EventLogUnavailable(Exception):
    """The event log's writer could not start (its one-line reason is the message)."""


def _package_root() -> str:
    import qpid_flow

    return str(Path(qpid_flow.__file__).resolve().parent.parent)


class ProcessSink:
    """A :class:`~qpid_flow.policies.event_log.writers.Sink` whose files a child process writes.

    Called on the writer thread only, like any sink: a slow child blocks that thread (and
    then the writer's queue drops batches), never the reactor."""

    def __init__(
        self,
        format_: str,
        path: Path,
        run: str,
        max_bytes: int,
        backups: int,
        nice: int = 0,
        log_level: str = "info",
        log_format: str = "auto",
    ) -> None:
        self._args = [format_, str(path), run, str(max_bytes), str(backups), str(nice), log_level, log_format]
        self._child: subprocess.Popen[bytes] | None = None
        self._next_start = 0.0  # a writer that cannot start is tried again after RESTART_BACKOFF
        self._aborted = False  # set by abort(): no child is started again
        self._start()

    def _start(self) -> None:
        env = dict(os.environ)
        # The child imports qpid_flow from where the router did, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
        child = subprocess.Popen(
            [sys.executable, "-m", "qpid_flow.policies.event_log.process", *self._args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert child.stdout is not None
        answer = child.stdout.readline()
        child.stdout.close()
        if answer != _READY:
            child.wait(30)
            reason = answer.decode("utf-8", "replace").strip() or f"it exited with {child.returncode}"
            raise EventLogUnavailable(reason)
        self._child = child

    def write(self, batch: Batch) -> None:
        data = pickle.dumps((batch.columns, batch.states), protocol=pickle.HIGHEST_PROTOCOL)
        if self._child is not None:
            try:
                _send(self._child.stdin, data)
                return
            except (BrokenPipeError, ValueError):
                # The child died (a bug, a kill, the out-of-memory killer): another takes
                # over; starting, it converts what the dead one left, like any start.
                exit_code = self._child.wait()
                self._child = None
                if not self._aborted:
                    log.error("event_log_writer_died", exit_code=exit_code)
        if self._aborted:
            raise EventLogUnavailable("the event log's writer was killed: it was stuck")
        if time.monotonic() < self._next_start:
            raise EventLogUnavailable("the event log's writer is not running")  # counted as lost
        self._next_start = time.monotonic() + RESTART_BACKOFF
        self._start()
        assert self._child is not None
        _send(self._child.stdin, data)

    def close(self, timeout: float = 25.0) -> None:
        """Close the child's input and wait for it to finish its files; after ``timeout``
        (within the writer thread's 30 s at exit) kill it: what it wrote stays readable,
        and the next start converts an unfinished segment."""
        child, self._child = self._child, None
        if child is None:
            return
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            child.stdin.close()
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("event_log_writer_stuck", seconds=timeout)
            child.kill()

    def abort(self) -> None:
        """Kill the child now, from any thread: the writer thread gave up waiting for it.
        A write blocked on its full pipe then fails at once, and no other child is started.
        What it wrote stays readable, and the next start converts an unfinished segment."""
        self._aborted = True
        child = self._child
        if child is not None:
            child.kill()


def _send(pipe: IO[bytes] | None, data: bytes) -> None:
    assert pipe is not None
    pipe.write(_LENGTH.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _open_sink(format_: str, path: Path, run: str, max_bytes: int, backups: int) -> Sink:
    if format_ == "parquet":
        return SegmentSink(path, run, max_bytes, backups)
    return JsonLinesSink(path, run, max_bytes, backups)


def _batches(stream: IO[bytes]) -> Any:
    """Each batch the router sent, until its end of the pipe closes; a batch cut short by
    the router's death is left out."""
    while len(head := stream.read(_LENGTH.size)) == _LENGTH.size:
        data = stream.read(_LENGTH.unpack(head)[0])
        if len(data) < _LENGTH.unpack(head)[0]:
            return
        columns, states = pickle.loads(data)
        batch = Batch()
        batch.columns, batch.states = columns, states
        yield batch


def main(argv: list[str]) -> int:
    """The child: open the sink, say so, write every batch, finish the files at the end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from qpid_flow.logs import configure_logging

    format_, path, run, max_bytes, backups, nice, log_level, log_format = argv
    configure_logging(log_level, log_format)  # its lines go to the router's stderr: alike
    os.nice(int(nice))  # background work: under full load the router's traffic comes first
    try:
        sink = _open_sink(format_, Path(path), run, int(max_bytes), int(backups))
    except Exception as exc:  # reported to the router, which refuses to start with it
        sys.stdout.buffer.write(f"cannot write the event log at {path}: {exc}\n".encode())
        sys.stdout.buffer.flush()
        return 1
    sys.stdout.buffer.write(_READY)
    sys.stdout.buffer.flush()
    failed = 0
    for batch in _batches(sys.stdin.buffer):
        try:
            sink.write(batch)
        except Exception:
            failed += len(batch)
            log.exception("event_log_write_failed", events=len(batch), failed_total=failed)
    sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
