"""The code stays ruff clean, formatted and typed: the checks the README asks of a change.

Run here so that CI refuses a change that breaks them. The versions are pinned in
pyproject.toml (``test`` extra): a new ruff or mypy release may add rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TYPED = ["qpid_flow", "bench", "tests", "plugins/qpid-flow-rabbitmq-depth"]


@pytest.mark.parametrize(
    "command",
    [
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "ruff"), "format", "--check", "."],
        [sys.executable, "-m", "mypy", *TYPED],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_static_check_passes(command: list[str]) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command[1:])} failed:\n{result.stdout}{result.stderr}"
