"""The plugin seam: every hook documented, built-ins overridable and disableable, errors contained."""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from pathlib import Path

import pytest

from qpid_flow import hookimpl
from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import Destination
from qpid_flow.core.model import Consumer, Hold, Message, Producer, Reject
from qpid_flow.plugin import hookspecs
from qpid_flow.plugin.manager import Hooks, build_plugin_manager

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


@pytest.mark.parametrize("name", hookspecs.hook_names())
def test_every_hook_is_documented_with_its_exact_signature(name: str) -> None:
    signature = f"### `{name}{inspect.signature(getattr(hookspecs, name))}`"
    assert signature in DOC.read_text(), f"docs/plugins.md lacks {signature}"


def test_question_hooks_are_firstresult_and_notifications_are_not() -> None:
    for name in hookspecs.hook_names():
        firstresult = getattr(hookspecs, name).qpid_flow_spec["firstresult"]
        is_question = name in {
            "qpid_flow_producer_credit",
            "qpid_flow_transfer_arrived",
            "qpid_flow_settlement_delay",
            "qpid_flow_consumer_select",
            "qpid_flow_producers_held",
        }
        assert firstresult is is_question, name


def test_an_installed_plugin_is_asked_before_the_builtin() -> None:
    class Strict:
        @hookimpl
        def qpid_flow_transfer_arrived(self, message: Message) -> Reject | None:
            return Reject("too big") if message.size > 3 else None

    pm = build_plugin_manager()
    pm.register(Strict(), name="strict")
    hooks = Hooks(pm)
    dest = Destination("q", DestinationPolicy.of(), hooks)
    producer = Producer("q")
    assert hooks.transfer_arrived(producer=producer, message=Message(b"12345", "q"), destination=dest) == Reject(
        "too big"
    )
    assert type(hooks.transfer_arrived(producer=producer, message=Message(b"1", "q"), destination=dest)).__name__ == (
        "Admit"
    )


def test_a_builtin_can_be_disabled_by_name() -> None:
    pm = build_plugin_manager(disabled=["passthrough"])
    assert pm.get_plugin("passthrough") is None
    assert pm.is_blocked("passthrough")


def test_plugins_named_in_the_environment_are_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("qf_env_plugin")
    seen: list[str] = []

    @hookimpl
    def qpid_flow_destination_created(destination: Destination) -> None:
        seen.append(destination.address)

    module.qpid_flow_destination_created = qpid_flow_destination_created  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qf_env_plugin", module)
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "qf_env_plugin")
    hooks = Hooks(build_plugin_manager())
    hooks.destination_created(destination=Destination("x", DestinationPolicy.of(), hooks))
    assert seen == ["x"]


def test_a_failing_plugin_is_contained_with_the_safest_answer() -> None:
    class Broken:
        @hookimpl
        def qpid_flow_producer_credit(self) -> int:
            raise RuntimeError("bug")

        @hookimpl
        def qpid_flow_consumer_select(self) -> Consumer:
            raise RuntimeError("bug")

        @hookimpl
        def qpid_flow_message_enqueued(self) -> None:
            raise RuntimeError("bug")

    pm = build_plugin_manager()
    pm.register(Broken(), name="broken")
    hooks = Hooks(pm)
    dest = Destination("q", DestinationPolicy.of(), hooks)
    assert hooks.producer_credit(producer=Producer("q"), destination=dest) == 0
    consumer = Consumer("q", lambda c, m: None)
    assert isinstance(hooks.consumer_select(destination=dest, message=Message(b"x", "q"), consumers=[consumer]), Hold)
    dest.enqueue(Message(b"x", "q"))  # the notification raised; the destination carries on
    assert dest.depth == 1


def test_a_plugin_refusing_its_settings_stops_the_start_and_a_bug_does_not() -> None:
    """configure: a ConfigError reaches the caller (qpid-flow refuses to start with its one
    line); any other exception is contained like in every hook."""
    from qpid_flow.config import ConfigError, RouterConfig

    class Refusing:
        @hookimpl
        def qpid_flow_configure(self) -> None:
            raise ConfigError("plugins.refusing.limit", -1, "must be >= 0")

    class Buggy:
        @hookimpl
        def qpid_flow_configure(self) -> None:
            raise RuntimeError("bug")

    pm = build_plugin_manager()
    pm.register(Refusing(), name="refusing")
    with pytest.raises(ConfigError, match=r"plugins.refusing.limit = -1: must be >= 0"):
        Hooks(pm).configure(config=RouterConfig(), manager=pm)
    pm = build_plugin_manager()
    pm.register(Buggy(), name="buggy")
    Hooks(pm).configure(config=RouterConfig(), manager=pm)


def test_passthrough_keeps_a_window_topped_up_in_batches() -> None:
    hooks = Hooks(build_plugin_manager())
    producer = Producer("q")
    assert hooks.producer_credit(producer=producer, destination=None) == 100
    producer.credit, producer.unsettled = 60, 10  # 30 missing: less than half a window
    assert hooks.producer_credit(producer=producer, destination=None) == 0
    producer.credit, producer.unsettled = 20, 10  # 70 missing
    assert hooks.producer_credit(producer=producer, destination=None) == 70


def test_the_direct_callers_answer_exactly_as_pluggy_does() -> None:
    """Hooks bypasses pluggy's machinery (manager._direct): same answers, same order."""

    class Quiet:
        @hookimpl
        def qpid_flow_depth_changed(self, destination: Destination) -> None:
            return None

        def __init__(self) -> None:
            self.enqueued: list[Message] = []

        @hookimpl
        def qpid_flow_message_enqueued(self, message: Message) -> None:
            self.enqueued.append(message)  # the only implementation once the event log is off

        @hookimpl
        def qpid_flow_destination_stats(self, destination: Destination) -> dict[str, int]:
            return {"quiet": 1}

        @hookimpl(tryfirst=True)
        def qpid_flow_transfer_arrived(self, message: Message) -> Reject | None:
            return Reject("odd") if message.size % 2 else None

    class Loud:
        @hookimpl
        def qpid_flow_destination_stats(self, destination: Destination) -> dict[str, int]:
            return {"loud": 2}

    for plugins in ([Quiet()], [Quiet(), Loud()]):
        quiet = plugins[0]
        assert isinstance(quiet, Quiet)
        pm = build_plugin_manager()
        pm.unregister(name="events")
        for plugin in plugins:
            pm.register(plugin)
        hooks = Hooks(pm)
        dest = Destination("q", DestinationPolicy.of(), hooks)
        producer = Producer("q")
        message = Message(b"1", "q")
        # A notification answers nothing: the same implementations see the same arguments.
        quiet.enqueued.clear()
        hooks.message_enqueued(destination=dest, message=message)
        pm.hook.qpid_flow_message_enqueued(destination=dest, message=message)
        assert quiet.enqueued == [message, message]
        for data in (b"1", b"12"):
            message = Message(data, "q")
            assert hooks.transfer_arrived(
                producer=producer, message=message, destination=dest
            ) == pm.hook.qpid_flow_transfer_arrived(producer=producer, message=message, destination=dest)
        # Notifications answer nothing; the one whose answers are read collects them as pluggy does.
        assert hooks.depth_changed(destination=dest) is None  # type: ignore[func-returns-value]
        assert hooks.destination_stats(destination=dest) == pm.hook.qpid_flow_destination_stats(destination=dest)


def test_one_plugin_alone_still_adds_its_statistics() -> None:
    """With a single implementation of destination_stats (here flow control's, the groups
    plugin disabled) its figures still reach the destination's record."""
    hooks = Hooks(build_plugin_manager(disabled=["groups", "events"]))
    dest = Destination("q", DestinationPolicy.of(), hooks)
    assert "flowStoppedCount" in dest.stats()


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("qf_no_such_module", "cannot be imported: ModuleNotFoundError: No module named 'qf_no_such_module'"),
        ("qf_env_broken", "cannot be imported: ZeroDivisionError: division by zero"),
        ("qf_env_plugin:no_such_object", "module qf_env_plugin has no no_such_object"),
    ],
)
def test_a_plugin_in_the_environment_that_cannot_be_loaded_is_one_configuration_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, rule: str
) -> None:
    """QPID_FLOW_PLUGINS=my_polcy (a typo) ended in a 31-line traceback, exit 1."""
    from qpid_flow import cli
    from qpid_flow.config import ConfigError

    (tmp_path / "qf_env_broken.py").write_text("1 / 0\n")
    (tmp_path / "qf_env_plugin.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("QPID_FLOW_PLUGINS", spec)
    with pytest.raises(ConfigError) as refused:
        build_plugin_manager()
    assert str(refused.value) == f"QPID_FLOW_PLUGINS = {spec!r}: {rule}"
    assert cli.main(["serve", "--listen", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err == f"qpid-flow: configuration error: QPID_FLOW_PLUGINS = {spec!r}: {rule}\n"


MISSPELT = {
    "hook": "from qpid_flow import hookimpl\n\n@hookimpl\ndef qpid_flow_transfer_arived(message):\n    return None\n",
    "argument": "from qpid_flow import hookimpl\n\n@hookimpl\ndef qpid_flow_transfer_arrived(msg):\n    return None\n",
}


@pytest.mark.parametrize("misspelt", ["hook", "argument"])
def test_a_plugin_with_a_misspelt_hook_or_argument_is_one_configuration_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], misspelt: str
) -> None:
    """pluggy's PluginValidationError ended the start in a 25-line traceback (exit 1), and
    make_hooks took the misspelt hook, never to call it."""
    from qpid_flow import cli
    from qpid_flow.config import ConfigError
    from qpid_flow.testing import make_hooks

    module_name = f"qf_misspelt_{misspelt}"
    (tmp_path / f"{module_name}.py").write_text(MISSPELT[misspelt])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("QPID_FLOW_PLUGINS", module_name)
    with pytest.raises(ConfigError, match=rf"^QPID_FLOW_PLUGINS = '{module_name}': .*qpid_flow_transfer_ar"):
        build_plugin_manager()
    assert cli.main(["serve", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qpid-flow: configuration error: QPID_FLOW_PLUGINS = '{module_name}': ")
    assert err.count("\n") == 1, err
    monkeypatch.delenv("QPID_FLOW_PLUGINS")
    with pytest.raises(ConfigError, match=r"^make_hooks = "):
        make_hooks(importlib.import_module(module_name))


def test_a_plugin_installed_through_an_entry_point_may_be_disabled_by_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The names a plugin may be disabled by are those on this machine; any other is a
    ConfigError listing them (a typo disabled nothing)."""
    from qpid_flow.config import ConfigError
    from qpid_flow.plugin import manager

    class InstalledEntryPoint:
        name = "rabbitmq_depth"

    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [InstalledEntryPoint()])
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "my_policy")
    assert manager.known_plugin_names() == ["events", "flow", "groups", "my_policy", "passthrough", "rabbitmq_depth"]
    manager.check_names_to_disable(["rabbitmq_depth", "my_policy"], "disable_plugins", None)
    with pytest.raises(ConfigError, match=r"^disable_plugins = \['rabbitmq-depth'\]: 'rabbitmq-depth' names no plugin"):
        manager.check_names_to_disable(["rabbitmq-depth"], "disable_plugins", ["rabbitmq-depth"])
