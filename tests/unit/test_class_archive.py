"""The report JVM's class archive: named by the JVM build and the class path, recorded by
the first report (the JVM ends when its stdin closes, then the file is moved into place),
mapped by the next ones. The recording is exercised with a real child process standing in
for the JVM: it writes its partial file once its stdin closes, as the JVM does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from qpid_flow.analytics.class_archive import ClassArchive, archive_name, class_archive
from tests.unit.extras import needs_pyspark


def _java_and_jars(tmp_path: Path) -> tuple[Path, Path]:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"launcher")
    (tmp_path / "jdk" / "lib" / "server").mkdir(parents=True)
    (tmp_path / "jdk" / "lib" / "server" / "libjvm.so").write_bytes(b"jvm")
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"core")
    return java, jars


def test_the_name_changes_with_the_jvm_build_and_with_the_jars(tmp_path: Path) -> None:
    java, jars = _java_and_jars(tmp_path)
    first = archive_name(java, jars)
    assert first == archive_name(java, jars)
    assert first.startswith("spark-classes-") and first.endswith(".jsa")
    (tmp_path / "jdk" / "lib" / "server" / "libjvm.so").write_bytes(b"a newer jvm")
    upgraded = archive_name(java, jars)
    assert upgraded != first
    (jars / "spark-sql.jar").write_bytes(b"sql")
    assert archive_name(java, jars) != upgraded


@needs_pyspark
def test_an_archive_is_recorded_when_absent_and_mapped_once_there(tmp_path: Path) -> None:
    java, _ = _java_and_jars(tmp_path)
    folder = tmp_path / "cache"
    first = class_archive(java, folder)
    assert first is not None and first.recording
    assert first.java_options()[0] == f"-XX:ArchiveClassesAtExit={first.partial}"
    first.path.write_bytes(b"archive")
    second = class_archive(java, folder)
    assert second == ClassArchive(first.path, recording=False)
    assert second.java_options()[0] == f"-XX:SharedArchiveFile={first.path}"
    # HotSpot's CDS warnings would land on the report's terminal.
    assert all(any(o.startswith("-Xlog:cds=off") for o in a.java_options()) for a in (first, second))


@needs_pyspark
def test_an_unwritable_folder_means_no_archive(tmp_path: Path) -> None:
    java, _ = _java_and_jars(tmp_path)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert class_archive(java, blocked / "cache") is None


def _jvm_like(partial: Path, code: int = 0) -> subprocess.Popen[bytes]:
    # Waits for its stdin to close, then writes the archive and exits, as the JVM does.
    script = f"import sys; sys.stdin.buffer.read(); open({str(partial)!r}, 'wb').write(b'classes'); sys.exit({code})"
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


def test_recording_ends_the_jvm_and_moves_the_finished_file_into_place(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-classes-x.jsa", recording=True)
    proc = _jvm_like(archive.partial)
    assert archive.finish(SimpleNamespace(proc=proc))
    assert proc.returncode == 0
    assert archive.path.read_bytes() == b"classes"
    assert not archive.partial.exists()


def test_a_failed_recording_leaves_no_file_and_the_next_report_tries_again(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-classes-x.jsa", recording=True)
    assert not archive.finish(SimpleNamespace(proc=_jvm_like(archive.partial, code=1)))
    assert not archive.path.exists() and not archive.partial.exists()
    # No gateway process (spark-submit's): nothing to wait for, nothing recorded.
    assert not archive.finish(SimpleNamespace())


def test_mapping_an_archive_records_nothing(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-classes-x.jsa", recording=False)
    proc = _jvm_like(archive.partial)
    try:
        assert not archive.finish(SimpleNamespace(proc=proc))
        assert proc.poll() is None, "a mapping report's JVM is left to end as usual"
    finally:
        proc.kill()
        proc.wait()


@needs_pyspark
@pytest.mark.parametrize(("age_s", "kept"), [(10.0, True), (3600.0, False)])
def test_a_partial_file_older_than_any_recording_is_removed(tmp_path: Path, age_s, kept) -> None:
    java, _ = _java_and_jars(tmp_path)
    folder = tmp_path / "cache"
    folder.mkdir()
    partial = folder / "spark-classes-0123456789abcdef.jsa.4242.partial"
    partial.write_bytes(b"cut short")
    then = time.time() - age_s
    os.utime(partial, (then, then))
    assert class_archive(java, folder) is not None
    assert partial.exists() == kept
