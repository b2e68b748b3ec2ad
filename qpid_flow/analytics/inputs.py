"""Which files a report reads: files, folders and glob patterns, plain or gzip.

Kept free of Spark so that a bad argument fails fast, before a JVM starts.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path


class InputError(ValueError):
    """An EVENTS argument that names nothing readable."""


def _is_event_file(path: Path) -> bool:
    # Rotated logs are PATH, PATH.1, PATH.2 ...; compressed copies end in .gz. A columnar
    # log's damaged stream is set aside as .bad by the writer: it is no segment.
    return path.is_file() and not path.name.startswith((".", "_")) and path.suffix != ".bad"


def expand_inputs(specs: Sequence[str]) -> list[str]:
    """Every event file named by ``specs``, sorted and without duplicates.

    A folder contributes every file in it (recursively, hidden files, Spark's
    ``_SUCCESS``-style markers and the event log's ``.bad`` files excepted); a pattern is
    expanded like a shell glob (``**`` included); a URL (``hdfs://``, ``s3a://``,
    ``file://`` ...) is passed to Spark as it is. Raises :class:`InputError` for an
    argument that matches nothing.
    """
    found: list[str] = []
    for spec in specs:
        if "://" in spec:
            found.append(spec)
            continue
        path = Path(spec)
        if path.is_dir():
            files = sorted(str(p) for p in path.rglob("*") if _is_event_file(p))
        elif any(ch in spec for ch in "*?["):
            files = sorted(str(Path(p)) for p in glob.glob(spec, recursive=True) if _is_event_file(Path(p)))
        elif path.is_file():
            files = [str(path)]
        else:
            raise InputError(f"EVENTS: {spec!r} does not exist")
        if not files:
            raise InputError(f"EVENTS: {spec!r} matches no file")
        found.extend(files)
    return unique_files(sorted(found))


def unique_files(paths: Sequence[str]) -> list[str]:
    """``paths`` in their order, each file once: a local file named two ways (relative and
    absolute, through a symbolic link, a folder and a name in it) is one file, read once,
    under the first of its names. A URL is left as it is (Spark resolves it)."""
    seen: set[str] = set()
    unique: list[str] = []
    for path in paths:
        key = path if "://" in path else os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def current_files(paths: Sequence[str]) -> list[str]:
    """``paths``, listed by :func:`expand_inputs`, as they are now. A columnar log that a
    router is writing changes under a report (whose JVM takes seconds to start): an open
    segment's stream (``.arrows``) is replaced by its Parquet file once the segment is
    full, and the oldest Parquet files are pruned. So a stream whose Parquet file exists is
    read as that (the stream may still be there for an instant, as the Parquet file is
    written first), and a local file that has gone is left out."""
    current: list[str] = []
    for path in paths:
        if "://" not in path and path.endswith(".arrows"):
            finished = path.removesuffix(".arrows") + ".parquet"
            if os.path.exists(finished):
                path = finished
        if "://" in path or os.path.exists(path):
            current.append(path)
    # A stream and its Parquet file, listed under different names, may have become one file.
    return unique_files(current)


def damaged_parquet(paths: Sequence[str]) -> tuple[str, str] | None:
    """The first local Parquet file of ``paths`` whose footer cannot be read (a truncated
    copy, or no Parquet at all), and why. Read on the driver before Spark starts, a
    footer at a time (a few kilobytes each): Spark would fail on such a file in the middle
    of the report, with a Java trace. A file gone meanwhile is Spark's to skip."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in paths:
        if "://" in path or not path.endswith(".parquet"):
            continue
        try:
            pq.read_metadata(path)
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowException) as exc:
            return path, str(exc)
    return None
