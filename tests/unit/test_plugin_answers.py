"""Answers the router cannot use are refused like an exception, naming the plugin: a
consumer selection that is neither a ``Hold`` nor one of the ``consumers`` offered (the
message waits), and statistics that are not a mapping (the record goes without them).

Before, a string or a consumer not offered (one that has since detached) made the
dispatch raise inside the unrelated producer's transfer, and a list of statistics made
every statistics record, the admin endpoint and the metrics fail. No Proton here.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any

import pytest
import structlog

from qpid_flow import hookimpl
from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import Destination
from qpid_flow.core.model import Admit, Consumer, Hold, Message, Producer, Reject, Settlement
from qpid_flow.plugin.manager import PLUGIN_ERRORS, Hooks, build_plugin_manager
from qpid_flow.testing import make_consumer

# How the facade calls hooks: compiled for the plugins registered (the default), through
# pluggy (QPID_FLOW_TRACE_HOOKS), and compiled but with a wrapper among the implementations.
CALLING = ["compiled", "through-pluggy", "with-a-wrapper"]

SELECT = "qpid_flow_consumer_select"
STATS = "qpid_flow_destination_stats"


class Wrapper:
    """A plugin wrapping the hooks at hand (new-style pluggy wrapper): it passes answers on."""

    @hookimpl(wrapper=True)
    def qpid_flow_consumer_select(self) -> Generator[None, Any, Any]:
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


def plugin_errors(logs: Iterable[Mapping[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    return [(e["hook"], e.get("plugin"), e.get("answer")) for e in logs if e["event"] == "plugin_error"]


# --- consumer selection ----------------------------------------------------------------------


class Selects:
    """Answers ``consumer_select`` with what it is given (None: no opinion)."""

    def __init__(self, answer: object = None) -> None:
        self.answer = answer

    @hookimpl
    def qpid_flow_consumer_select(self, consumers: list[Consumer]) -> object:
        return self.answer


# Each a fresh one per test: "gone" is a consumer attached once, detached since (never offered).
WRONG_SELECTIONS = [
    pytest.param(lambda: "consumer-1", id="str"),
    pytest.param(lambda: make_consumer(credit=5, name="gone"), id="consumer-not-offered"),
    pytest.param(lambda: 1, id="int"),
    pytest.param(lambda: True, id="bool"),
]


@pytest.mark.parametrize("calling", CALLING)
@pytest.mark.parametrize("wrong", WRONG_SELECTIONS)
def test_a_selection_that_is_no_consumer_offered_holds_the_message_naming_plugin_and_answer(
    calling: str, wrong: Callable[[], object]
) -> None:
    answer = wrong()
    hooks = hooks_with(Selects(answer), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    offered = [make_consumer(credit=1, name="a"), make_consumer(credit=1, name="b")]
    before = PLUGIN_ERRORS[SELECT]
    with structlog.testing.capture_logs() as logs:
        choice = hooks.consumer_select(destination=destination, message=Message(b"x", "q"), consumers=offered)
    assert isinstance(choice, Hold), "the message waits, as when the plugin raises"
    assert plugin_errors(logs) == [(SELECT, "selects", repr(answer))]
    assert PLUGIN_ERRORS[SELECT] == before + 1


@pytest.mark.parametrize("calling", CALLING)
def test_a_selection_among_the_consumers_offered_or_a_hold_passes_as_it_is(calling: str) -> None:
    offered = [make_consumer(credit=1, name="a"), make_consumer(credit=1, name="b")]
    hold = Hold("my reason")
    for answer in (offered[1], hold):
        hooks = hooks_with(Selects(answer), calling=calling)
        destination = Destination("q", DestinationPolicy.of(), hooks)
        with structlog.testing.capture_logs() as logs:
            choice = hooks.consumer_select(destination=destination, message=Message(b"x", "q"), consumers=offered)
        assert choice is answer
        assert plugin_errors(logs) == []


@pytest.mark.parametrize("calling", CALLING)
@pytest.mark.parametrize("wrong", WRONG_SELECTIONS)
def test_a_wrong_selection_leaves_the_message_waiting_and_the_transfer_unharmed(
    calling: str, wrong: Callable[[], object]
) -> None:
    """The dispatch a producer's transfer triggers: it used to raise (AttributeError,
    KeyError) into the producer's connection, or hand the message to a detached consumer."""
    answer = wrong()
    hooks = hooks_with(Selects(answer), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    consumer = make_consumer(credit=5, name="attached")
    destination.add_consumer(consumer)
    with structlog.testing.capture_logs() as logs:
        destination.enqueue(Message(b"x", "q"))  # dispatches: no exception
    assert len(destination.queue) == 1, "the message waits"
    assert not consumer.held
    assert not getattr(answer, "held", None), "nothing went to a consumer that was not offered"
    assert consumer.credit == 5
    assert (SELECT, "selects", repr(answer)) in plugin_errors(logs)


class FailsFirst:
    """Raises on its first ``failures`` selections, then has no opinion."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    @hookimpl
    def qpid_flow_consumer_select(self, consumers: list[Consumer]) -> object:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("selection failed")
        return None


def test_after_a_failed_selection_the_message_is_handed_out_again_after_a_growing_pause() -> None:
    """Nothing else need hand the message out again (the consumer keeps its credit, no
    settlement comes): it waited for good. Asked again after 1 s, then 2 s, 4 s."""
    plugin = FailsFirst(3)
    destination = Destination("q", DestinationPolicy.of(), hooks_with(plugin))
    consumer = make_consumer(credit=5)
    destination.add_consumer(consumer)
    destination.enqueue(Message(b"x", "q"))
    assert len(destination.queue) == 1 and destination.select_retry is not None
    start = destination.select_retry - 1.0  # the first failure's time
    for pause_over, failures_left in ((1.0, 1), (1.0 + 2.0, 0)):
        destination.dispatch_again(start + pause_over - 0.01)  # not yet: nothing asked
        assert plugin.failures == failures_left + 1
        destination.dispatch_again(start + pause_over)
        assert plugin.failures == failures_left
    assert len(destination.queue) == 1, "failed a third time"
    assert destination.select_retry == pytest.approx(start + 3.0 + 4.0)
    destination.dispatch_again(start + 7.0)
    assert len(destination.queue) == 0 and [m.data for m in consumer.held.values()] == [b"x"]
    assert destination.select_retry is None


class Pops:
    """Takes the first consumer offered with ``pop(0)``: the list was the queue's own."""

    @hookimpl
    def qpid_flow_consumer_select(self, consumers: Any) -> object:
        return consumers.pop(0) if isinstance(consumers, list) else consumers[0]


def test_the_consumers_offered_are_the_plugins_own_to_read() -> None:
    """A plugin changing the list offered changed the queue's own: the consumer left its
    dispatch pass and was then refused as "not one of the consumers offered"."""
    destination = Destination("q", DestinationPolicy.of(), hooks_with(Pops()))
    consumer = make_consumer(credit=5)
    destination.add_consumer(consumer)
    for body in (b"1", b"2", b"3"):
        destination.enqueue(Message(body, "q"))
    assert [m.data for m in consumer.held.values()] == [b"1", b"2", b"3"]


def test_with_no_opinion_the_consumers_take_turns() -> None:
    hooks = hooks_with(Selects(None))
    destination = Destination("q", DestinationPolicy.of(), hooks)
    consumers = [make_consumer(credit=1, name="a"), make_consumer(credit=1, name="b")]
    for consumer in consumers:
        destination.add_consumer(consumer)
    with structlog.testing.capture_logs() as logs:
        destination.enqueue(Message(b"x", "q"))
        destination.enqueue(Message(b"y", "q"))
    assert [len(c.held) for c in consumers] == [1, 1]
    assert plugin_errors(logs) == []


def test_a_wrapper_replacing_the_selection_with_a_wrong_one_is_named() -> None:
    class Replaces:
        @hookimpl(wrapper=True)
        def qpid_flow_consumer_select(self) -> Generator[None, Any, Any]:
            yield
            return "not a consumer"

    hooks = hooks_with(Replaces())
    destination = Destination("q", DestinationPolicy.of(), hooks)
    offered = [make_consumer(credit=1)]
    with structlog.testing.capture_logs() as logs:
        choice = hooks.consumer_select(destination=destination, message=Message(b"x", "q"), consumers=offered)
    assert isinstance(choice, Hold)
    assert plugin_errors(logs) == [(SELECT, "replaces", repr("not a consumer"))]


# --- statistics ------------------------------------------------------------------------------


class ListStats:
    @hookimpl
    def qpid_flow_destination_stats(self) -> object:
        return ["not", "a", "dict"]


class GoodStats:
    @hookimpl
    def qpid_flow_destination_stats(self) -> dict[str, Any]:
        return {"goodField": 7}


@pytest.mark.parametrize("calling", CALLING)
def test_statistics_that_are_no_mapping_are_left_out_naming_plugin_and_answer(calling: str) -> None:
    hooks = hooks_with(GoodStats(), ListStats(), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    before = PLUGIN_ERRORS[STATS]
    with structlog.testing.capture_logs() as logs:
        record = destination.stats()  # raised ValueError: every GET /v1/destinations and /metrics failed
    assert record["name"] == "q"
    assert record["goodField"] == 7, "the other plugins' fields are kept"
    assert "flowStoppedCount" in record, "the built-ins' fields are kept"
    assert plugin_errors(logs) == [(STATS, "liststats", repr(["not", "a", "dict"]))]
    assert PLUGIN_ERRORS[STATS] == before + 1


class ClashingStats:
    """Gives fields qpid-flow, and the built-in flow control, already give."""

    @hookimpl
    def qpid_flow_destination_stats(self) -> dict[str, Any]:
        return {"depth": -1, "flowStopped": True, "clashingOwn": 3}


@pytest.mark.parametrize("calling", CALLING)
def test_a_plugins_field_never_replaces_one_already_in_the_record(calling: str) -> None:
    """A plugin's "depth" replaced qpid-flow's in every statistics reader and the metric.
    Between plugins, the built-ins (registered first, called last) have the last word."""
    hooks = hooks_with(ClashingStats(), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    destination.enqueue(Message(b"x", "q"))
    with structlog.testing.capture_logs() as logs:
        record = destination.stats()
    assert (record["depth"], record["flowStopped"], record["clashingOwn"]) == (1, False, 3)
    taken = [e["answer"] for e in logs if e["event"] == "plugin_error"]
    assert taken == [repr({"depth": -1})]


def test_a_wrapper_replacing_the_statistics_with_wrong_ones_is_named() -> None:
    class Replaces:
        @hookimpl(wrapper=True)
        def qpid_flow_destination_stats(self) -> Generator[None, Any, Any]:
            answers = yield
            return [*answers, ("not", "a", "dict")]

    hooks = hooks_with(GoodStats(), Replaces())
    destination = Destination("q", DestinationPolicy.of(), hooks)
    with structlog.testing.capture_logs() as logs:
        record = destination.stats()
    assert record["goodField"] == 7
    assert plugin_errors(logs) == [(STATS, "replaces", repr(("not", "a", "dict")))]


class SetStats:
    @hookimpl
    def qpid_flow_destination_stats(self) -> object:
        return {"prioritySeen": {1, 2}}  # a set: no JSON for it


@pytest.mark.parametrize("calling", CALLING)
def test_statistics_json_cannot_carry_are_left_out_naming_plugin_and_answer(calling: str) -> None:
    """A set among the fields passed, and every read of the destinations then failed in
    the admin endpoint (the connection dropped, no plugin named)."""
    import json

    hooks = hooks_with(GoodStats(), SetStats(), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    with structlog.testing.capture_logs() as logs:
        record = destination.stats()
    assert "prioritySeen" not in record and record["goodField"] == 7
    json.dumps(record)  # what the admin endpoint sends
    assert plugin_errors(logs) == [(STATS, "setstats", repr({"prioritySeen": {1, 2}}))]


# --- credit and decisions --------------------------------------------------------------------

CREDIT = "qpid_flow_producer_credit"


class Grants:
    def __init__(self, answer: int) -> None:
        self.answer = answer

    @hookimpl
    def qpid_flow_producer_credit(self) -> int:
        return self.answer


@pytest.mark.parametrize("calling", CALLING)
@pytest.mark.parametrize(("held", "answer"), [(0, 3_000_000_000), (2, 2**31 - 2)])
def test_credit_past_2_to_the_31_with_what_the_link_holds_is_refused(calling: str, held: int, answer: int) -> None:
    """Proton raised OverflowError on the first (the client's whole connection closed with
    amqp:internal-error), and the second wrapped round to a negative credit on the wire."""
    from qpid_flow.testing import make_producer

    hooks = hooks_with(Grants(answer), calling=calling)
    producer = make_producer("q")
    producer.credit = held
    with structlog.testing.capture_logs() as logs:
        granted = hooks.producer_credit(producer=producer, destination=None)
    assert not isinstance(granted, int) or isinstance(granted, bool) or granted + held <= 2**31 - 1
    assert plugin_errors(logs) == [(CREDIT, "grants", repr(answer))]


def test_credit_up_to_2_to_the_31_with_what_the_link_holds_passes() -> None:
    from qpid_flow.testing import make_producer

    hooks = hooks_with(Grants(2**31 - 3))
    producer = make_producer("q")
    producer.credit = 2
    with structlog.testing.capture_logs() as logs:
        assert hooks.producer_credit(producer=producer, destination=None) == 2**31 - 3
    assert plugin_errors(logs) == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: Reject(5),  # type: ignore[arg-type]  # what an untyped plugin may do
        lambda: Reject("full", condition=None),  # type: ignore[arg-type]
        lambda: Hold(b"why"),  # type: ignore[arg-type]
    ],
)
def test_a_decision_made_with_anything_but_text_raises_in_the_plugin(make: Callable[[], object]) -> None:
    """Reject(5) passed the router's check and failed in Proton on the wire, closing the
    client's whole connection; raised where it is made, it is the plugin's error."""
    with pytest.raises(TypeError, match="must be a str"):
        make()


class Flags:
    """Answers the yes-or-no questions with ``answer``."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    @hookimpl
    def qpid_flow_settlement_delay(self) -> object:
        return self.answer

    @hookimpl
    def qpid_flow_producers_held(self) -> object:
        return self.answer


@pytest.mark.parametrize("calling", CALLING)
@pytest.mark.parametrize("wrong", [Admit(), Hold(), "yes", 1], ids=["Admit", "Hold", "str", "int"])
def test_a_yes_or_no_answer_that_is_no_bool_is_refused_naming_plugin_and_answer(calling: str, wrong: object) -> None:
    """Taken by its truth, Admit() or "yes" kept a producer waiting for its settlement for
    good, with nothing logged."""
    hooks = hooks_with(Flags(wrong), calling=calling)
    destination = Destination("q", DestinationPolicy.of(), hooks)
    producer, message = Producer("q"), Message(b"x", "q")
    with structlog.testing.capture_logs() as logs:
        delay = hooks.settlement_delay(
            producer=producer, message=message, destination=destination, settlement=Settlement.accepted()
        )
        held = hooks.producers_held(destination=destination)
    assert not delay and not held, "settled now, not held"
    assert plugin_errors(logs) == [
        ("qpid_flow_settlement_delay", "flags", repr(wrong)),
        ("qpid_flow_producers_held", "flags", repr(wrong)),
    ]


@pytest.mark.parametrize("answer", [True, False])
def test_a_yes_or_no_answer_passes_as_it_is(answer: bool) -> None:
    hooks = hooks_with(Flags(answer))
    destination = Destination("q", DestinationPolicy.of(), hooks)
    delay = hooks.settlement_delay(
        producer=Producer("q"), message=Message(b"x", "q"), destination=destination, settlement=Settlement.accepted()
    )
    assert delay is answer and hooks.producers_held(destination=destination) is answer
