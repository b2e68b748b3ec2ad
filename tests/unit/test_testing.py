"""qpid_flow.testing, the pytest plugin shipped for plugin authors: its values behave as the
router's own, and its router fixture loads a plugin module that is not installed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qpid_flow import hookimpl
from qpid_flow.core.model import Message, Reject
from qpid_flow.testing import (
    ManualControl,
    RouterProcess,
    make_consumer,
    make_destination,
    make_hooks,
    make_message,
    make_producer,
)


class SmallOnly:
    @hookimpl
    def qpid_flow_transfer_arrived(self, message: Message) -> Reject | None:
        return Reject("too big") if message.size > 100 else None


def test_a_plugin_passed_to_make_hooks_answers_before_the_built_ins() -> None:
    plugin = SmallOnly()
    hooks = make_hooks(plugin, plugin)  # passed twice (or already installed): registered once
    destination = make_destination("orders", hooks=hooks, max_count=10, shared_groups=True)
    assert destination.policy.setting("shared_groups") is True
    assert destination.dispatched_by_plugin  # the groups plugin heard destination_created
    big, small = make_message("x" * 500, "orders"), make_message("x", "orders")
    producer = make_producer("orders")
    assert hooks.transfer_arrived(producer=producer, message=big, destination=destination) == Reject("too big")
    assert type(hooks.transfer_arrived(producer=producer, message=small, destination=destination)).__name__ == "Admit"


def test_messages_are_really_encoded_and_consumers_receive_them() -> None:
    message = make_message("hello", "orders", group_id="g1", properties={"region": "eu"})
    by_header = make_message("hello", "orders", group_id="g1", properties={"region": "eu"})
    assert (message.group_id(), by_header.group_id("region")) == ("g1", "eu")
    received: list[str] = []
    destination = make_destination("orders")
    consumer = make_consumer("orders", credit=5, deliver=lambda _c, m: received.append(m.group_id()))
    destination.add_consumer(consumer)
    destination.enqueue(message)
    assert received == ["g1"]


def test_manual_control_runs_timers_when_time_passes_them_in_order() -> None:
    control = ManualControl()
    fired: list[str] = []
    control.schedule(2.0, lambda: fired.append("second"))
    control.schedule(1.0, lambda: fired.append("first"))
    control.advance(0.5)
    assert fired == []
    control.advance(2.0)
    assert fired == ["first", "second"]


def test_the_router_fixture_loads_a_plugin_module_that_is_not_installed(
    qpid_flow_router: Callable[..., RouterProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "greeting_plugin.py").write_text(
        "import structlog\n"
        "from qpid_flow import hookimpl\n"
        "@hookimpl\n"
        "def qpid_flow_started(control):\n"
        "    structlog.get_logger('greeting').info('greeting_plugin_started')\n"
    )
    monkeypatch.chdir(tmp_path)  # as a plugin author runs pytest from their project
    router = qpid_flow_router(plugins=["greeting_plugin"])
    records: list[dict[str, Any]] = [json.loads(line) for line in router.log_text().splitlines()[1:]]
    listening = next(r for r in records if r["event"] == "listening")
    assert "greeting_plugin" in listening["plugins"]
    assert any(r["event"] == "greeting_plugin_started" for r in records)
