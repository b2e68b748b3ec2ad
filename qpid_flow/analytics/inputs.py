"""Which files a report reads: files, folders and glob patterns, plain or gzip.

Kept free of Spark so that a bad argument fails fast, before a JVM starts.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path


class InputError(ValueError):
    """An EVENTS argument that names nothing readable."""


def _is_event_file(path: Path) -> bool:
    # Rotated logs are PATH, PATH.1, PATH.2 ...; compressed copies end in .gz.
    return path.is_file() and not path.name.startswith((".", "_"))


def expand_inputs(specs: Sequence[str]) -> list[str]:
    """Every event file named by ``specs``, sorted and without duplicates.

    A folder contributes every file in it (recursively, hidden files and Spark's
    ``_SUCCESS``-style markers excepted); a pattern is expanded like a shell glob
    (``**`` included); a URL (``hdfs://``, ``s3a://``, ``file://`` ...) is passed to Spark
    as it is. Raises :class:`InputError` for an argument that matches nothing.
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
    return sorted(dict.fromkeys(found))
