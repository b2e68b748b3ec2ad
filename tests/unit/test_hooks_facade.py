"""The typed ``Hooks`` facade: one method per hook, a snapshot by default, pluggy on request."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from qpid_flow import hookimpl
from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import Destination
from qpid_flow.core.model import Message, Producer, Reject
from qpid_flow.plugin import hookspecs
from qpid_flow.plugin.manager import PLUGIN_ERRORS, TRACE_ENVIRONMENT, Hooks, build_plugin_manager


@pytest.mark.parametrize("name", hookspecs.hook_names())
def test_every_hook_has_a_method_taking_its_arguments_by_keyword(name: str) -> None:
    method = getattr(Hooks, name.removeprefix("qpid_flow_"))
    parameters = list(inspect.signature(method).parameters.values())[1:]  # after self
    assert [p.name for p in parameters] == list(inspect.signature(getattr(hookspecs, name)).parameters)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters), name


class Late:
    def __init__(self) -> None:
        self.enqueued: list[str] = []

    @hookimpl
    def qpid_flow_message_enqueued(self, message: Message) -> None:
        self.enqueued.append(message.address)

    @hookimpl(tryfirst=True)
    def qpid_flow_transfer_arrived(self, message: Message) -> Reject | None:
        return Reject("late says no") if message.size > 3 else None


def _destination(hooks: Hooks) -> Destination:
    return Destination("q", DestinationPolicy.of(pattern="q"), hooks)


def _register_late_and_send(through_pluggy: bool) -> tuple[Hooks, Late, Message, object]:
    """A facade built, then a plugin registered, then a message enqueued and its transfer
    asked about: what the late plugin heard, and the answer."""
    pm = build_plugin_manager()
    hooks = Hooks(pm, through_pluggy=through_pluggy)
    late = Late()
    pm.register(late, name="late")
    message = Message(b"12345", "q")
    hooks.message_enqueued(destination=_destination(hooks), message=message)
    answer = hooks.transfer_arrived(producer=Producer("q"), message=message, destination=_destination(hooks))
    return Hooks(pm), late, message, answer


def test_the_snapshot_does_not_call_a_plugin_registered_after_it() -> None:
    fresh, late, message, answer = _register_late_and_send(through_pluggy=False)
    assert late.enqueued == []
    assert type(answer).__name__ == "Admit"
    # A facade built now sees it.
    assert fresh.transfer_arrived(producer=Producer("q"), message=message, destination=_destination(fresh)) == (
        Reject("late says no")
    )


def test_through_pluggy_a_plugin_registered_later_is_called() -> None:
    _, late, _, answer = _register_late_and_send(through_pluggy=True)
    assert late.enqueued == ["q"]
    assert answer == Reject("late says no")


@pytest.mark.parametrize("through_pluggy", [False, True])
def test_a_raising_plugin_gets_the_safest_answer_either_way(through_pluggy: bool) -> None:
    class Broken:
        @hookimpl(tryfirst=True)
        def qpid_flow_producer_credit(self) -> int:
            raise RuntimeError("bug")

    pm = build_plugin_manager()
    pm.register(Broken(), name="broken")
    before = PLUGIN_ERRORS["qpid_flow_producer_credit"]
    hooks = Hooks(pm, through_pluggy=through_pluggy)
    assert hooks.producer_credit(producer=Producer("q"), destination=None) == 0
    assert PLUGIN_ERRORS["qpid_flow_producer_credit"] == before + 1


def test_the_environment_switch_calls_through_pluggy_with_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_ENVIRONMENT, "1")
    pm = build_plugin_manager()
    hooks = Hooks(pm)
    assert hooks.through_pluggy
    traced: list[Any] = []
    pm.trace.root.setwriter(traced.append)  # what the facade writes to the debug log
    hooks.producer_credit(producer=Producer("q"), destination=None)
    assert any("qpid_flow_producer_credit" in line for line in traced)
    monkeypatch.setenv(TRACE_ENVIRONMENT, "0")
    assert not Hooks(build_plugin_manager()).through_pluggy


def test_a_plugin_registered_after_the_start_still_hears_qpid_flow_started() -> None:
    class Latecomer:
        def __init__(self) -> None:
            self.control: object = None

        @hookimpl
        def qpid_flow_started(self, control: object) -> None:
            self.control = control

    pm = build_plugin_manager()
    control = object()
    Hooks(pm).started(control=control)  # type: ignore[arg-type]
    latecomer = Latecomer()
    pm.register(latecomer, name="latecomer")
    assert latecomer.control is control
