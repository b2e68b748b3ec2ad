"""A faulty plugin costs its own answer only: every other plugin is still called, the
built-ins included; a wrong answer is refused like an exception; a link whose credit
policy failed is asked again; a plugin loaded wrong stops the start.

Faults of the kind plugin authors make (an exception in a notification, ``False`` for
"no opinion", a credit of ``window / 2``), each where the review found it hurt: flow
control losing its control object, group pinning or the depth it follows; a transfer left
with no outcome; a link left with no credit for good.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from proton import Delivery, Endpoint

from qpid_flow import hookimpl
from qpid_flow.config import ConfigError, DestinationPolicy, RouterConfig
from qpid_flow.core.destination import Destination
from qpid_flow.core.model import Admit, Message, Producer, Reject
from qpid_flow.plugin.manager import (
    CREDIT_AFTER_FAILURE,
    PLUGIN_ERRORS,
    Hooks,
    build_plugin_manager,
    disabled_plugins,
    loaded_plugins,
)
from qpid_flow.testing import make_hooks, make_message, make_producer
from tests.unit.test_router import ACCEPTED_SETTLED, Client, Rig, fill_until_stopped, order, outcome

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"

# How the facade calls hooks: compiled for the plugins registered (the default), through
# pluggy (QPID_FLOW_TRACE_HOOKS), and compiled but with a wrapper among the implementations
# (which only pluggy can call).
CALLING = ["compiled", "through-pluggy", "with-a-wrapper"]


class Wrapper:
    """A plugin wrapping the hooks it names (new-style pluggy wrapper): it passes answers on."""

    @hookimpl(wrapper=True)
    def qpid_flow_message_enqueued(self) -> Generator[None, Any, Any]:
        return (yield)

    @hookimpl(wrapper=True)
    def qpid_flow_transfer_arrived(self) -> Generator[None, Any, Any]:
        return (yield)

    @hookimpl(wrapper=True)
    def qpid_flow_producer_credit(self) -> Generator[None, Any, Any]:
        return (yield)

    @hookimpl(wrapper=True)
    def qpid_flow_destination_stats(self) -> Generator[None, Any, Any]:
        return (yield)


def hooks_with(*plugins: object, calling: str = "compiled") -> Hooks:
    """The built-ins and ``plugins`` (named by class, registered last: asked first)."""
    pm = build_plugin_manager(installed=False)
    if calling == "with-a-wrapper":
        pm.register(Wrapper(), name="wrapper")
    for plugin in plugins:
        pm.register(plugin, name=type(plugin).__name__.lower())
    return Hooks(pm, through_pluggy=calling == "through-pluggy")


def plugin_errors(logs: Iterable[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    return [(entry["hook"], entry.get("plugin")) for entry in logs if entry["event"] == "plugin_error"]


# --- 1. an exception costs one plugin's answer, never the others' --------------------------------


class Raising:
    """A third-party plugin with a bug in the notifications it implements."""

    @hookimpl
    def qpid_flow_message_enqueued(self) -> None:
        raise RuntimeError("bug in my bookkeeping")

    @hookimpl
    def qpid_flow_destination_stats(self) -> dict[str, Any]:
        raise RuntimeError("bug in my statistics")


class Listening:
    def __init__(self) -> None:
        self.enqueued: list[str] = []

    @hookimpl
    def qpid_flow_message_enqueued(self, message: Message) -> None:
        self.enqueued.append(message.address)

    @hookimpl
    def qpid_flow_destination_stats(self) -> dict[str, Any]:
        return {"listening": 1}


@pytest.mark.parametrize("calling", CALLING)
def test_a_notification_reaches_every_other_plugin_whichever_raises(calling: str) -> None:
    """The raising plugin is asked first; the one after it and the built-ins still hear
    the event, and the error names the plugin."""
    listening = Listening()
    hooks = hooks_with(listening, Raising(), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    with structlog.testing.capture_logs() as logs:
        hooks.message_enqueued(destination=destination, message=Message(b"x", "q"))
        stats = hooks.destination_stats(destination=destination)
    assert listening.enqueued == ["q"]
    fields = {key for record in stats for key in record}
    assert {"listening", "flowStoppedCount"} <= fields, "the others' statistics were lost"
    assert plugin_errors(logs) == [
        ("qpid_flow_message_enqueued", "raising"),
        ("qpid_flow_destination_stats", "raising"),
    ]


@pytest.mark.parametrize("calling", CALLING)
def test_a_question_a_plugin_raises_on_gets_the_safest_answer_naming_the_plugin(calling: str) -> None:
    class Failing:
        @hookimpl
        def qpid_flow_transfer_arrived(self) -> None:
            raise RuntimeError("policy bug")

    hooks = hooks_with(Failing(), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    with structlog.testing.capture_logs() as logs:
        answer = hooks.transfer_arrived(producer=Producer("q"), message=Message(b"x", "q"), destination=destination)
    assert isinstance(answer, Reject)
    assert answer.condition == "amqp:internal-error"
    assert plugin_errors(logs) == [("qpid_flow_transfer_arrived", "failing")]


class BadStarted:
    @hookimpl
    def qpid_flow_started(self) -> None:
        raise RuntimeError("could not start my metrics thread")


class BadDepth:
    @hookimpl
    def qpid_flow_depth_changed(self) -> None:
        raise RuntimeError("metrics backend bug")


class BadCreated:
    @hookimpl
    def qpid_flow_destination_created(self) -> None:
        raise RuntimeError("bug in my bookkeeping")


class BadConfigure:
    @hookimpl
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        config.plugin_settings("bad")["my_setting"]  # KeyError: a table without the key


STOP_AT_5 = {"destinations": {"orders": {"flow_stop_count": 5, "flow_resume_count": 2}}}


def drain(rig: Rig, address: str = "orders") -> None:
    consumer = rig.connect("consumer")
    receiver = consumer.attach_receiver(address, credit=100)
    consumer.accept(*consumer.take(receiver))


def test_a_plugin_raising_in_started_still_leaves_flow_control_its_control() -> None:
    """Flow control resumes producers through the control object qpid_flow_started hands
    over: without it a producer stopped once would never get credit again."""
    with structlog.testing.capture_logs() as logs:
        rig = Rig(STOP_AT_5, plugins=[BadStarted()])
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    assert len(fill_until_stopped(producer, sender)) == 6
    drain(rig)
    assert rig.destination("orders").stats()["flowStopped"] is False
    assert sender.credit > 0, "flow control resumed the destination but could not wake its producer"
    assert plugin_errors(logs) == [("qpid_flow_started", "test-plugin-1")]


def test_a_plugin_raising_in_depth_changed_still_lets_flow_control_stop_the_producers() -> None:
    rig = Rig(STOP_AT_5, plugins=[BadDepth()])
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    with structlog.testing.capture_logs():
        sent = fill_until_stopped(producer, sender, most=50)
    assert len(sent) == 6, "flow control never heard the depth"
    assert rig.destination("orders").stats()["flowStopped"] is True


def test_a_plugin_raising_in_destination_created_still_lets_groups_pin_a_group() -> None:
    rig = Rig({"destinations": {"orders": {"shared_groups": True}}}, plugins=[BadCreated()])
    first = rig.connect("first")
    second = rig.connect("second")
    one = first.attach_receiver("orders", credit=3, name="one")
    two = second.attach_receiver("orders", credit=3, name="two")
    producer = rig.connect("producer")
    sender = producer.attach_sender("orders")
    producer.send(sender, order(1, "A"), order(2, "A"), order(3, "A"))
    assert sorted([len(first.take(one)), len(second.take(two))]) == [0, 3], "group A went to both consumers"


def test_a_plugin_raising_in_configure_leaves_the_others_configured() -> None:
    """One plugin's KeyError in qpid_flow_configure: flow control still reads
    producer_window (the reported case: the event log was left off)."""
    with structlog.testing.capture_logs() as logs:
        rig = Rig({"producer_window": 7}, plugins=[BadConfigure()])
    client = rig.connect()
    sender = client.attach_sender("orders")
    assert sender.credit == 7
    assert plugin_errors(logs) == [("qpid_flow_configure", "test-plugin-1")]


def test_the_first_refusal_stops_the_start_and_no_plugin_after_it_sets_up() -> None:
    """Every plugin was configured even after one refused: the event log's writer made its
    folders and files for a start that never came."""

    class Refusing:
        def __init__(self, key: str) -> None:
            self.key = key

        @hookimpl
        def qpid_flow_configure(self) -> None:
            raise ConfigError(self.key, -1, "must be >= 0")

    class Configured:
        def __init__(self) -> None:
            self.config: RouterConfig | None = None

        @hookimpl
        def qpid_flow_configure(self, config: RouterConfig) -> None:
            self.config = config

    configured = Configured()
    pm = build_plugin_manager(installed=False)
    pm.register(configured, name="configured")
    pm.register(Refusing("plugins.second.limit"), name="second")
    pm.register(Refusing("plugins.first.limit"), name="first")  # asked first
    with pytest.raises(ConfigError, match=r"^plugins\.first\.limit = -1"):
        Hooks(pm).configure(config=RouterConfig(), manager=pm)
    assert configured.config is None


def test_a_start_another_plugin_refuses_leaves_no_event_log_behind(tmp_path: Path) -> None:
    class Refusing:
        @hookimpl
        def qpid_flow_configure(self) -> None:
            raise ConfigError("plugins.refusing.limit", -1, "must be >= 0")

    pm = build_plugin_manager(installed=False)
    pm.register(Refusing(), name="refusing")
    log = tmp_path / "sub" / "events.jsonl"
    with pytest.raises(ConfigError):
        Hooks(pm).configure(config=RouterConfig(events=str(log)), manager=pm)
    assert not (tmp_path / "sub").exists()


def test_a_plugin_registered_after_the_start_raising_in_started_is_contained() -> None:
    """qpid_flow_started is historic: pluggy calls a late plugin's as it registers it.
    Its exception is logged; the plugin is registered whole (its other hooks too)."""

    class Late(BadStarted):
        @hookimpl
        def qpid_flow_message_enqueued(self) -> None:
            pass

    pm = build_plugin_manager(installed=False)
    Hooks(pm).started(control=object())  # type: ignore[arg-type]
    late = Late()
    with structlog.testing.capture_logs() as logs:
        pm.register(late, name="late")
    assert plugin_errors(logs) == [("qpid_flow_started", "late")]
    assert any(impl.plugin is late for impl in pm.hook.qpid_flow_message_enqueued.get_hookimpls())


# --- 5. an answer of the wrong type is refused like an exception ---------------------------------


class AnswersFalse:
    @hookimpl
    def qpid_flow_transfer_arrived(self) -> bool:
        return False  # "not rejecting": an easy slip for None


class OddCredit:
    def __init__(self, credit: object) -> None:
        self.credit = credit

    @hookimpl
    def qpid_flow_producer_credit(self) -> object:
        return self.credit


@pytest.mark.parametrize("calling", CALLING)
def test_a_transfer_answer_that_is_no_decision_rejects_the_transfer_naming_plugin_and_answer(calling: str) -> None:
    hooks = hooks_with(AnswersFalse(), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    before = PLUGIN_ERRORS["qpid_flow_transfer_arrived"]
    with structlog.testing.capture_logs() as logs:
        answer = hooks.transfer_arrived(producer=Producer("q"), message=Message(b"x", "q"), destination=destination)
    assert isinstance(answer, Reject)
    assert answer.condition == "amqp:internal-error"
    (error,) = [entry for entry in logs if entry["event"] == "plugin_error"]
    assert (error["hook"], error["plugin"], error["answer"]) == ("qpid_flow_transfer_arrived", "answersfalse", "False")
    assert PLUGIN_ERRORS["qpid_flow_transfer_arrived"] == before + 1


@pytest.mark.parametrize("calling", CALLING)
@pytest.mark.parametrize("credit", [2.5, -1, True, "10"], ids=["float", "negative", "bool", "str"])
def test_a_credit_that_is_no_count_is_no_credit_and_marked_failed(calling: str, credit: object) -> None:
    hooks = hooks_with(OddCredit(credit), calling=calling)
    with structlog.testing.capture_logs() as logs:
        answer = hooks.producer_credit(producer=Producer("q"), destination=None)
    assert answer is CREDIT_AFTER_FAILURE
    assert answer == 0
    assert [(e["plugin"], e["answer"]) for e in logs if e["event"] == "plugin_error"] == [("oddcredit", repr(credit))]


@pytest.mark.parametrize("calling", CALLING)
def test_valid_answers_pass_as_they_are(calling: str) -> None:
    hooks = hooks_with(OddCredit(3), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    with structlog.testing.capture_logs() as logs:
        assert hooks.producer_credit(producer=Producer("q"), destination=None) == 3
        answer = hooks.transfer_arrived(producer=Producer("q"), message=Message(b"x", "q"), destination=destination)
    assert isinstance(answer, Admit)
    assert plugin_errors(logs) == []


def test_a_transfer_a_policy_answers_false_is_rejected_not_lost() -> None:
    rig = Rig(plugins=[AnswersFalse()])
    client = rig.connect()
    sender = client.attach_sender("orders")
    with structlog.testing.capture_logs():
        (delivery,) = client.send(sender, order(1))
    assert outcome(delivery) == (Delivery.REJECTED, True)
    assert delivery.remote.condition.name == "amqp:internal-error"


def test_a_fractional_credit_leaves_the_client_connected() -> None:
    rig = Rig(plugins=[OddCredit(2.5)])
    client = rig.connect()
    with structlog.testing.capture_logs():
        sender = client.attach_sender("orders")
    assert client.connection.state == Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
    assert client.commands("close") == []
    assert sender.credit == 0


# --- 4. a link whose credit policy failed is asked again -----------------------------------------


class Reactor:
    """What the router uses of the container running a connection: its timers, which the
    test fires."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def schedule(self, delay: float, handler: Any) -> None:
        self.timers.append((delay, handler))

    def fire(self, rig: Rig) -> list[float]:
        """Run the timers set so far (as if their delays had passed); their delays."""
        due, self.timers = self.timers, []
        for _, handler in due:
            handler.on_timer_task(None)
        rig.pump()
        return [delay for delay, _ in due]


class FlakyCredit:
    """A credit policy failing the first ``failures`` times it is asked, then without opinion."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0

    @hookimpl
    def qpid_flow_producer_credit(self) -> None:
        self.asked += 1
        if self.asked <= self.failures:
            raise ConnectionError("transient: my quota cache was not loaded yet")


def connect_with_reactor(rig: Rig) -> tuple[Client, Reactor]:
    client = rig.connect()
    reactor = Reactor()
    client.facing.connection._reactor = reactor  # as the container sets it on the connections it runs
    return client, reactor


def test_a_link_the_credit_policy_failed_for_is_asked_again_after_a_pause() -> None:
    flaky = FlakyCredit(failures=1)
    rig = Rig(plugins=[flaky])
    client, reactor = connect_with_reactor(rig)
    with structlog.testing.capture_logs() as logs:
        sender = client.attach_sender("orders")
    assert sender.credit == 0
    assert plugin_errors(logs) == [("qpid_flow_producer_credit", "test-plugin-1")]
    assert reactor.fire(rig) == [1.0]
    assert sender.credit == 100
    assert [outcome(d) for d in client.send(sender, order(1))] == [ACCEPTED_SETTLED]


def test_the_pause_doubles_while_the_policy_keeps_failing_and_starts_over_once_it_answers() -> None:
    flaky = FlakyCredit(failures=7)
    rig = Rig(plugins=[flaky])
    client, reactor = connect_with_reactor(rig)
    with structlog.testing.capture_logs():
        sender = client.attach_sender("orders")
        delays = [reactor.fire(rig) for _ in range(7)]
    assert delays == [[1.0], [2.0], [4.0], [8.0], [16.0], [30.0], [30.0]]
    assert sender.credit == 100
    assert reactor.timers == []
    flaky.failures = flaky.asked + 1  # fails once more: the pause starts over
    with structlog.testing.capture_logs():
        rig.router.grant_all("orders")
    assert reactor.fire(rig) == [1.0]


def test_one_pause_at_a_time_and_none_for_a_link_gone_meanwhile() -> None:
    rig = Rig(plugins=[FlakyCredit(failures=2)])
    client, reactor = connect_with_reactor(rig)
    with structlog.testing.capture_logs():
        sender = client.attach_sender("orders")
        rig.router.grant_all("orders")  # fails again while a pause is set: no second one
    assert [delay for delay, _ in reactor.timers] == [1.0]
    client.detach(sender)
    assert reactor.fire(rig) == [1.0]
    assert reactor.timers == []


# --- 2. a plugin module is loaded as the docs show; one with no hook stops the start -------------


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A factory: ``plugin_module(name, source)`` makes an importable module of ``source``."""

    def make(name: str, source: str) -> types.ModuleType:
        module = types.ModuleType(name)
        exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), module.__dict__)
        monkeypatch.setitem(sys.modules, name, module)
        return module

    yield make


def docs_example() -> str:
    """The example plugin docs/plugins.md opens with (``# my_policy.py``)."""
    text = DOC.read_text()
    start = text.index("```python\n# my_policy.py\n") + len("```python\n")
    return text[start : text.index("```", start)]


def refused_answer(hooks: Hooks) -> object:
    destination = Destination("small.orders", DestinationPolicy.of(), hooks)
    message = Message(b"x" * 1_000_001, "small.orders")
    return hooks.transfer_arrived(producer=Producer("small.orders"), message=message, destination=destination)


def test_the_docs_example_plugin_loaded_by_the_environment_answers(
    plugin_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_module("my_policy", docs_example())
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "my_policy")
    answer = refused_answer(Hooks(build_plugin_manager()))
    assert answer == Reject("small.orders takes messages up to 1 MB")


def test_an_object_named_module_colon_attribute_is_loaded(plugin_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin_module("my_policies", docs_example().replace("plugin = Plugin()", "strict = Plugin()"))
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "my_policies:strict")
    pm = build_plugin_manager()
    assert "my_policies:strict" in loaded_plugins(pm)
    assert refused_answer(Hooks(pm)) == Reject("small.orders takes messages up to 1 MB")


def test_a_module_of_hook_functions_is_still_loaded_itself(plugin_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    source = """
        from qpid_flow import hookimpl
        from qpid_flow.core.model import Reject

        plugin = "not a plugin: a module attribute that happens to have the name"

        @hookimpl
        def qpid_flow_transfer_arrived(message):
            return Reject("no") if message.size > 1_000_000 else None
    """
    plugin_module("functions_policy", source)
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "functions_policy")
    assert refused_answer(Hooks(build_plugin_manager())) == Reject("no")


def test_a_plugin_implementing_no_hook_stops_the_start_with_one_line(
    plugin_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_module("hookless", "class Plugin:\n    def qpid_flow_transfer_arrived(self):\n        pass\n")
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "hookless")
    with pytest.raises(ConfigError) as refused:
        build_plugin_manager()
    line = str(refused.value)
    assert line.startswith("QPID_FLOW_PLUGINS = 'hookless': implements no qpid_flow hook")
    assert "\n" not in line


def test_make_hooks_loads_a_module_as_the_environment_does(plugin_module: Any) -> None:
    module = plugin_module("my_policy", docs_example())
    hooks = make_hooks(module)
    destination = Destination("small.orders", DestinationPolicy.of(), hooks)
    answer = hooks.transfer_arrived(
        producer=make_producer("small.orders"), message=make_message("x" * 1_000_001), destination=destination
    )
    assert answer == Reject("small.orders takes messages up to 1 MB")


# --- 3. the plugins loaded, apart from the names disabled ----------------------------------------


def test_the_plugins_loaded_leave_out_the_disabled_names_even_unknown_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPID_FLOW_DISABLE_PLUGINS", "no_such_plugin")
    pm = build_plugin_manager(["groups"], installed=False)
    assert loaded_plugins(pm) == ["events", "flow", "passthrough"]
    assert disabled_plugins(pm) == ["groups", "no_such_plugin"]


def test_in_front_of_a_broker_a_link_the_credit_policy_failed_for_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As standalone: a producer to a named queue is granted against the credit the broker
    gave its upstream link, and after a failed answer it was asked again only when the
    broker gave more, which RabbitMQ does not do for an idle link."""
    from tests.unit import test_linkroute
    from tests.unit.test_linkroute import begin, open_pair, producer

    flaky = FlakyCredit(failures=1)
    builtin = test_linkroute._builtin_hooks

    def with_flaky(config: RouterConfig, plugins: list[Any] | None = None) -> Any:
        pm = builtin(config, plugins).pm
        pm.register(flaky, name="flaky")
        return Hooks(pm)

    monkeypatch.setattr(test_linkroute, "_builtin_hooks", with_flaky)
    rig = test_linkroute.Rig()
    pair = open_pair(rig)
    reactor = Reactor()
    pair.facing.connection._reactor = reactor  # as the container sets it on the connections it runs
    session, _ = begin(rig, pair)
    with structlog.testing.capture_logs():
        sender, at_broker = producer(rig, pair, session)
        at_broker.flow(10)
        rig.pump()
    assert (flaky.asked, sender.credit) == (1, 0)
    assert [delay for delay, _ in reactor.timers] == [1.0]
    due, reactor.timers = reactor.timers, []
    for _, handler in due:
        handler.on_timer_task(None)
    rig.pump()
    assert sender.credit == 10
