"""Plugins loaded the documented way into a real standalone qpid-flow, and plugins that
fail there: the docs' example works through ``QPID_FLOW_PLUGINS``, the ``listening`` event
lists what is loaded, a plugin with no hook stops the start with one line, and a link whose
credit policy failed once gets its credit a moment later (the real reactor's timer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qpid_flow.testing import RouterProcess

from .clients import Producer, make_message, run_all

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"

FLAKY_CREDIT = """
from qpid_flow import hookimpl

_calls = [0]


@hookimpl
def qpid_flow_producer_credit(producer, destination):
    _calls[0] += 1
    if _calls[0] == 1:
        raise ConnectionError("transient: my quota cache was not loaded yet")
    return None
"""


def docs_example() -> str:
    """The example plugin docs/plugins.md opens with (``# my_policy.py``)."""
    text = DOC.read_text()
    start = text.index("```python\n# my_policy.py\n") + len("```python\n")
    return text[start : text.index("```", start)]


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder for plugin modules, the working directory (qpid_flow_router puts it on the
    router's PYTHONPATH, as for a plugin that is not installed)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def listening(router: RouterProcess) -> dict[str, Any]:
    for line in router.log_text().splitlines():
        if '"event": "listening"' in line:
            event: dict[str, Any] = json.loads(line)
            return event
    raise AssertionError(f"no listening event in\n{router.log_tail()}")


def test_the_docs_example_plugin_loaded_as_documented_refuses_big_messages(
    plugin_dir: Path, qpid_flow_router: Callable[..., RouterProcess]
) -> None:
    (plugin_dir / "my_policy.py").write_text(docs_example())
    router = qpid_flow_router(plugins=["my_policy"])
    assert "my_policy" in listening(router)["plugins"]
    big = make_message("p", 0, size=1_100_000)
    small = make_message("p", 1)
    producer = Producer(router.url, "small.orders", [big, small], timeout=20)
    run_all(producer, timeout=30)
    assert producer.error is None
    assert producer.outcomes == {0: "rejected", 1: "accepted"}
    assert producer.conditions == {0: "amqp:resource-limit-exceeded"}


def test_the_listening_event_lists_the_plugins_loaded_and_apart_the_names_disabled(
    plugin_dir: Path, qpid_flow_router: Callable[..., RouterProcess]
) -> None:
    router = qpid_flow_router(env={"QPID_FLOW_DISABLE_PLUGINS": "groups"})
    event = listening(router)
    assert "groups" not in event["plugins"]
    assert {"passthrough", "flow"} <= set(event["plugins"])  # "events" leaves itself when no log is set
    assert event["disabled"] == ["groups"]


def test_a_name_to_disable_that_names_no_plugin_stops_the_start_with_one_line() -> None:
    """A typo in a name to disable (``flw``) disabled nothing, silently: flow control stayed on."""
    environment = {**os.environ, "QPID_FLOW_DISABLE_PLUGINS": "groups,no_such_plugin"}
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "serve", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "qpid-flow: configuration error: QPID_FLOW_DISABLE_PLUGINS = 'groups,no_such_plugin': "
        "'no_such_plugin' names no plugin; known: events, flow, groups, passthrough"
    )


def test_a_plugin_implementing_no_hook_stops_the_start_with_one_line(plugin_dir: Path) -> None:
    (plugin_dir / "hookless.py").write_text("def qpid_flow_transfer_arrived(message):\n    return None\n")
    environment = {**os.environ, "QPID_FLOW_PLUGINS": "hookless", "PYTHONPATH": str(plugin_dir)}
    argv = [sys.executable, "-m", "qpid_flow", "serve", "--listen", "127.0.0.1:0"]
    result = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30, cwd=plugin_dir)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "qpid-flow: configuration error: QPID_FLOW_PLUGINS = 'hookless': implements no qpid_flow hook "
        "(nothing in it carries @hookimpl); name the object that does: MODULE:NAME"
    ]


def test_a_link_whose_credit_policy_failed_once_gets_its_credit_a_moment_later(
    plugin_dir: Path, qpid_flow_router: Callable[..., RouterProcess]
) -> None:
    (plugin_dir / "flaky_credit.py").write_text(FLAKY_CREDIT)
    router = qpid_flow_router(plugins=["flaky_credit"])
    producer = Producer(router.url, "orders", [make_message("p", n) for n in range(3)], timeout=20)
    started = time.monotonic()
    run_all(producer, timeout=30)
    assert producer.error is None
    assert producer.outcomes == {0: "accepted", 1: "accepted", 2: "accepted"}
    assert min(producer.settled_at.values()) - started >= 0.9, "credit came before the pause"
    errors = [json.loads(line) for line in router.log_text().splitlines() if '"event": "plugin_error"' in line]
    assert [(e["hook"], e["plugin"]) for e in errors] == [("qpid_flow_producer_credit", "flaky_credit")]
