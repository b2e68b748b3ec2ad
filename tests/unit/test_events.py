"""The event log's file: one line per event, rotated by size, nothing lost across rotation."""

from __future__ import annotations

import json
from pathlib import Path

from qpid_flow.builtin.events import RotatingEventFile


def test_lines_rotate_by_size_and_keep_the_configured_backups(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = RotatingEventFile(path, max_bytes=1000, backups=2)
    for i in range(100):
        log.info(json.dumps({"n": i, "pad": "x" * 40}))
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    assert all(f.stat().st_size <= 1000 + 60 for f in files)
    numbers = sorted(json.loads(line)["n"] for f in files for line in f.read_text().splitlines())
    # The newest lines are all there, in order, with nothing torn; the oldest went away.
    assert numbers == list(range(numbers[0], 100))


def test_an_existing_file_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"n": -1}\n')
    log = RotatingEventFile(path, max_bytes=0, backups=0)
    log.info('{"n": 0}')
    log.close()
    assert path.read_text().splitlines() == ['{"n": -1}', '{"n": 0}']
