"""Run qpid-flow (`python -m qpid_flow serve ...`) as a real child process for a test."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from qpid_flow import testing
from qpid_flow.testing import RouterProcess, RouterStartError

__all__ = ["ADMIN_TOKEN_VARIABLE", "RouterProcess", "RouterStartError", "StartRouter", "admin_request", "start_router"]

PROJECT_ROOT = Path(__file__).resolve().parents[3]

# The admin token every qpid-flow of the test session runs with, and that `qpid-flow` client
# subprocesses send: tests/integration/conftest.py sets it for the whole session, and child
# processes inherit it. Changes through the admin endpoint need it.
ADMIN_TOKEN_VARIABLE = "QPID_FLOW_ADMIN_TOKEN"


def admin_request(admin: str, path: str) -> urllib.request.Request:
    """A request to `http://ADMIN/PATH` with the session's admin token, for `urlopen`."""
    request = urllib.request.Request(f"http://{admin}{path}")
    token = os.environ.get(ADMIN_TOKEN_VARIABLE)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


class StartRouter(Protocol):
    """Type of the `qpid_flow_process` fixture (a factory), for annotations in tests."""

    def __call__(
        self,
        broker_url: str | None = None,
        config_text: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> RouterProcess: ...


def start_router(
    workdir: Path,
    broker_url: str | None = None,
    config_text: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    start_timeout: float = 30.0,
    python: str = sys.executable,
    port: int | None = None,
) -> RouterProcess:
    """:func:`qpid_flow.testing.start_router`, with the project root on ``PYTHONPATH`` so
    that ``-m qpid_flow`` works from a plain checkout too (the child runs in its own
    folder); with the editable install it changes nothing."""
    pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    return testing.start_router(
        workdir,
        broker_url,
        config_text,
        extra_args,
        env={"PYTHONPATH": pythonpath},
        start_timeout=start_timeout,
        python=python,
        port=port,
    )
