"""Shared by the plugin's tests."""

from __future__ import annotations

import pytest

from qpid_flow_rabbitmq_depth import worker


@pytest.fixture(autouse=True)
def new_destinations_are_read_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests drive the worker by hand and read a destination as soon as it is made;
    the delay a running worker keeps before reading a new one (worker.FRESH_DELAY) is
    tested on its own, where a test sets it back."""
    monkeypatch.setattr(worker, "FRESH_DELAY", 0.0)
