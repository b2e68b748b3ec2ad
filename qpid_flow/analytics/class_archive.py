"""A class archive for the report's JVM: Spark's classes loaded and verified once, mapped
from a file at each later start (HotSpot's application class-data sharing, AppCDS).

A cold JVM spends seconds finding, parsing and verifying the ~22,000 classes a Spark job
loads; the classes of one report are the classes of the next. The first report on a
machine records them when its JVM exits (``-XX:ArchiveClassesAtExit``: the JVM exits when
its stdin closes, so the command closes it and waits, then moves the finished file into
place); every later report maps that file (``-XX:SharedArchiveFile``). Measured on 2
cores: a session starts in 3.9 s instead of 7.4 s and its first query runs in 2.2 s
instead of 3.8 s; recording takes 12-21 s, once (docs/report.md).

The archive is only valid for the JVM build and the class path that wrote it, so its file
name is a digest of both: another Java or another Spark gets an archive of its own. A
JVM that still refuses the file (a damaged file) falls back to loading classes as usual
(``-Xshare:auto``, the default), quietly: HotSpot's CDS log is turned off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# HotSpot's CDS log: a refused archive or an unsupported class would print warnings on
# the report's terminal, before and after the report's own lines.
_QUIET = "-Xlog:cds=off,cds+dynamic=off"
# How long the first report waits for its JVM to write the archive (measured 12-21 s).
_RECORD_TIMEOUT_S = 120.0


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/qpid-flow`` (``~/.cache/qpid-flow``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qpid-flow"


def java_binary() -> Path | None:
    """The ``java`` PySpark starts: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home, "bin", "java") if home else None
    if candidate is None or not candidate.exists():
        found = shutil.which("java")
        candidate = Path(found) if found else None
    return candidate.resolve() if candidate is not None else None


def archive_name(java: Path, jars: Path) -> str:
    """A file name for the archive of this JVM build and this class path: changes when the
    JDK is upgraded (its launcher and libjvm are replaced) or Spark's jars change."""
    digest = hashlib.sha256()
    for part in (java, java.parent.parent / "lib" / "server" / "libjvm.so"):
        if part.exists():
            stat = part.stat()
            digest.update(f"{part}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    return f"spark-classes-{digest.hexdigest()[:16]}.jsa"


@dataclass(frozen=True)
class ClassArchive:
    """The archive a session maps (``recording`` False) or records (True) at ``path``."""

    path: Path
    recording: bool

    @property
    def partial(self) -> Path:
        # Each recording JVM writes a file of its own: two first reports at once must not
        # write into one file. The finished one is renamed into place (atomic).
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")

    def java_options(self) -> list[str]:
        if self.recording:
            return [f"-XX:ArchiveClassesAtExit={self.partial}", _QUIET]
        return [f"-XX:SharedArchiveFile={self.path}", _QUIET]

    def finish(self, gateway: Any) -> bool:
        """After ``spark.stop()``: when recording, end the JVM (close its stdin), wait for
        it to write the archive and move the file into place. True if one was recorded."""
        if not self.recording:
            return False
        proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
        if proc is None or proc.stdin is None:
            return False
        try:
            proc.stdin.close()
            code = proc.wait(timeout=_RECORD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            code = None
        if code == 0 and self.partial.exists() and self.partial.stat().st_size > 0:
            self.partial.replace(self.path)
            return True
        self.partial.unlink(missing_ok=True)
        return False


def class_archive(java: Path, folder: Path | None = None) -> ClassArchive | None:
    """The archive for ``java`` (:func:`java_binary`) and the PySpark found here: mapped
    when it exists, recorded otherwise. None when ``folder`` cannot be written."""
    import pyspark

    folder = folder if folder is not None else default_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(folder, os.W_OK):
        return None
    path = folder / archive_name(java, Path(pyspark.__file__).parent / "jars")
    if path.exists():
        return ClassArchive(path, recording=False)
    _forget_abandoned(folder)
    return ClassArchive(path, recording=True)


def _forget_abandoned(folder: Path) -> None:
    # A recording cut short (the report killed) leaves its partial file; one older than
    # any recording can take is abandoned.
    for partial in folder.glob("spark-classes-*.partial"):
        try:
            if time.time() - partial.stat().st_mtime > 2 * _RECORD_TIMEOUT_S:
                partial.unlink()
        except OSError:
            continue
