"""Shared message groups without a network: seed 001's cases, and memory that follows use."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from typing import TYPE_CHECKING, Any, cast

import pytest
import structlog
from proton import Message as ProtonMessage

from qpid_flow import hookimpl
from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import Destination
from qpid_flow.core.jms_selector import parse_selector
from qpid_flow.core.model import Consumer, Hold, Message, Settlement
from qpid_flow.plugin.manager import Hooks, build_plugin_manager
from qpid_flow.policies.groups.grouped_queue import DEFAULT_GROUP, GroupedQueue, _Heads, group_key

if TYPE_CHECKING:
    from qpid_flow.plugin.control import RouterControl


class Wire:
    def __init__(self) -> None:
        self.sent: list[tuple[Consumer, Message]] = []

    def deliver(self, consumer: Consumer, message: Message) -> None:
        self.sent.append((consumer, message))


def grouped(header: str | None = None) -> tuple[Destination, Wire]:
    hooks = Hooks(build_plugin_manager())
    destination = Destination("q", DestinationPolicy.of(pattern="q"), hooks)
    destination.replace_queue(GroupedQueue(header, hooks.consumer_select))
    return destination, Wire()


def msg(text: str, group: Any = None, header: str | None = None) -> Message:
    """A real encoded AMQP message: ``text`` in the body, the group in group-id or a header."""
    if header is None:
        encoded = ProtonMessage(body=text, group_id=group).encode()
    else:
        encoded = ProtonMessage(body=text, properties={header: group} if group is not None else {}).encode()
    return _labelled(text, encoded)


def _labelled(text: str, encoded: bytes) -> Message:
    message = Message(bytes(encoded), "q")
    _LABELS[message.sequence] = text
    return message


_LABELS: dict[int, str] = {}


def name(message: Message) -> str:
    return _LABELS[message.sequence]


def names(wire: Wire, consumer: Consumer) -> list[str]:
    return [name(m) for c, m in wire.sent if c is consumer]


def add(destination: Destination, wire: Wire, credit: int) -> Consumer:
    consumer = Consumer("q", wire.deliver)
    destination.add_consumer(consumer)
    destination.credit_changed(consumer, credit)
    return consumer


def test_a_held_group_does_not_block_the_group_behind_it() -> None:
    """Seed 001: A's head is being consumed; B behind it goes to another consumer."""
    dest, wire = grouped()
    for text, group in [("A-1", "A"), ("A-2", "A"), ("A-3", "A"), ("B-1", "B"), ("B-2", "B")]:
        dest.enqueue(msg(text, group))
    first = add(dest, wire, 1)
    assert names(wire, first) == ["A-1"]
    second = add(dest, wire, 10)
    assert names(wire, second) == ["B-1", "B-2"], "A is blocked for the second consumer, B is not"


def test_the_owner_takes_up_to_its_credit_and_the_next_set_may_go_elsewhere() -> None:
    dest, wire = grouped()
    for i in range(1, 6):
        dest.enqueue(msg(f"A-{i}", "A"))
    first = add(dest, wire, 2)
    second = add(dest, wire, 5)
    assert names(wire, first) == ["A-1", "A-2"]
    assert names(wire, second) == [], "nothing of A while the first consumer holds some"
    for _, message in list(wire.sent):
        dest.settle(first, message, Settlement.accepted())
    # The group is free: the next set goes to whoever can take it (the second has credit).
    assert names(wire, second) == ["A-3", "A-4", "A-5"]


def test_release_a1_accept_a2_is_seed_001s_caveat() -> None:
    dest, wire = grouped()
    for i in (1, 2, 3):
        dest.enqueue(msg(f"A-{i}", "A"))
    first = add(dest, wire, 2)
    a1, a2 = (m for _, m in wire.sent)
    second = add(dest, wire, 5)
    first.credit = 0
    dest.settle(first, a1, Settlement.released())
    assert names(wire, second) == [], "A-1 is back at the front but the group is still the first consumer's"
    dest.settle(first, a2, Settlement.accepted())
    # All the first consumer held is settled: the group is free, and A-1 (then A-3) go on.
    assert names(wire, second) == ["A-1", "A-3"]


def test_released_messages_go_back_to_the_front_of_their_group_in_order() -> None:
    dest, wire = grouped()
    for i in range(1, 5):
        dest.enqueue(msg(f"A-{i}", "A"))
    first = add(dest, wire, 3)
    dest.remove_consumer(first)  # detach releases A-1..A-3 and frees the group
    second = add(dest, wire, 10)
    assert names(wire, second) == ["A-1", "A-2", "A-3", "A-4"]


def test_messages_without_a_group_are_in_the_default_group() -> None:
    dest, wire = grouped()
    dest.enqueue(msg("n-1", None))
    dest.enqueue(msg("n-2", ""))
    first = add(dest, wire, 1)
    second = add(dest, wire, 1)
    assert names(wire, first) == ["n-1"]
    assert names(wire, second) == [], "both are in qpid.no-group, owned by the first consumer"
    assert [g["group"] for g in dest.queue.describe()] == [DEFAULT_GROUP]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("raw", "key"), [(None, DEFAULT_GROUP), ("", DEFAULT_GROUP), (7, "7"), (b"b", "b"), ("g", "g")]
)
def test_group_ids_become_strings(raw: Any, key: str) -> None:
    assert group_key(raw) == key


def test_group_header_reads_an_application_property() -> None:
    dest, wire = grouped(header="JMSXGroupID")
    dest.enqueue(msg("x-1", "X", header="JMSXGroupID"))
    dest.enqueue(msg("y-1", "Y", header="JMSXGroupID"))
    dest.enqueue(msg("x-2", "X", header="JMSXGroupID"))
    first = add(dest, wire, 1)
    second = add(dest, wire, 5)
    assert names(wire, first) == ["x-1"]
    assert names(wire, second) == ["y-1"]


def test_an_owner_without_credit_costs_nothing() -> None:
    dest, wire = grouped()
    owner = add(dest, wire, 1)
    dest.enqueue(msg("A-1", "A"))
    calls = 0
    queue = dest.queue
    original = queue._select  # type: ignore[attr-defined]

    def counting(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(**kwargs)

    queue._select = counting  # type: ignore[attr-defined]
    other = add(dest, wire, 1000)
    for i in range(2, 2000):
        dest.enqueue(msg(f"A-{i}", "A"))  # all behind A-1, owned by a consumer with no credit
    assert names(wire, other) == [] and calls == 0
    assert len(queue._heads) <= 1  # type: ignore[attr-defined]
    assert names(wire, owner) == ["A-1"]


def _pass_through(queue: GroupedQueue, groups: int) -> None:
    """``groups`` distinct groups, one message each, delivered and accepted one by one."""
    consumer = Consumer("q", lambda c, m: None)
    consumer.credit = 10**9
    ready = [consumer]
    out: list[Message] = []

    def send(c: Consumer, m: Message) -> None:
        c.credit -= 1
        out.append(m)

    for i in range(groups):
        message = Message(b"", "q")
        message._group_id = f"group-{i}"  # as read from the message
        queue.append(message)
        queue.dispatch(None, ready, send)  # type: ignore[arg-type]
        queue.released(consumer, out.pop())
    queue.consumer_gone(consumer)


def test_a_million_groups_passing_through_leave_no_state_behind() -> None:
    queue = GroupedQueue(None, lambda destination, message, consumers: consumers[0])
    _pass_through(queue, 1_000_000)
    assert (queue.group_count, len(queue), len(queue._heads), len(queue._owned)) == (0, 0, 0, 0)


def test_memory_returns_to_where_it_was_after_groups_drain() -> None:
    queue = GroupedQueue(None, lambda destination, message, consumers: consumers[0])
    _pass_through(queue, 1000)  # warm up allocator free lists
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _pass_through(queue, 100_000)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert after - before < 50_000, f"{after - before} bytes left behind by 100,000 groups"


def test_accepting_past_a_released_message_is_reported_as_out_of_order() -> None:
    events: list[tuple[str, str]] = []
    hooks = Hooks(build_plugin_manager())
    dest = Destination("q", DestinationPolicy.of(pattern="q"), hooks)
    dest.replace_queue(GroupedQueue(None, hooks.consumer_select, on_event=lambda e, g, c: events.append((e, g))))
    wire = Wire()
    for i in (1, 2):
        dest.enqueue(msg(f"A-{i}", "A"))
    consumer = add(dest, wire, 2)
    a1, a2 = (m for _, m in wire.sent)
    consumer.credit = 0
    dest.settle(consumer, a1, Settlement.released())
    dest.settle(consumer, a2, Settlement.accepted())
    assert ("out_of_order", "A") in events
    assert events[-1] == ("settled", "A"), "then the group is free"


def test_heads_come_out_smallest_first_however_they_were_offered() -> None:
    import random

    rng = random.Random(7)
    heads = _Heads()
    expected: list[tuple[int, str]] = []
    sequence = 0
    for _ in range(5000):
        if rng.random() < 0.6:
            # Mostly in order (a new head), sometimes an earlier one (a release, a re-offer).
            sequence += 1
            pushed = sequence if rng.random() < 0.8 else rng.randrange(sequence)
            heads.push(pushed, f"g{pushed}")
            expected.append((pushed, f"g{pushed}"))
        elif expected:
            expected.sort()
            assert heads.first() == expected[0]
            heads.pop()
            expected.pop(0)
        assert len(heads) == len(expected) and bool(heads) == bool(expected)
    rest = []
    while heads:
        rest.append(heads.first())
        heads.pop()
    assert rest == sorted(expected)


class _Listener:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @hookimpl
    def qpid_flow_group_assigned(self, group: str) -> None:
        self.seen.append(("assigned", group))

    @hookimpl
    def qpid_flow_group_released(self, group: str, reason: str) -> None:
        self.seen.append((reason, group))


@pytest.fixture
def info_logging() -> Any:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    yield
    structlog.reset_defaults()


def _grouped_by_plugin(*plugins: Any) -> Destination:
    pm = build_plugin_manager()
    pm.unregister(name="events")  # as the server does without an event log
    for plugin in plugins:
        pm.register(plugin)
    destination = Destination("q", DestinationPolicy.of(pattern="q", shared_groups=True), Hooks(pm))
    destination.hooks.destination_created(destination=destination)
    return destination


def test_group_ownership_reaches_a_plugin_that_listens(info_logging: Any) -> None:
    listener = _Listener()
    dest = _grouped_by_plugin(listener)
    wire = Wire()
    consumer = add(dest, wire, 10)
    dest.enqueue(msg("A-1", "A"))
    dest.settle(consumer, wire.sent[0][1], Settlement.accepted())
    assert listener.seen == [("assigned", "A"), ("settled", "A")]


def test_a_consumer_detaching_with_a_group_releases_it_as_detached_and_counts_the_releases(
    info_logging: Any,
) -> None:
    """docs/events.md: group_released says why (settled, detached, lease). A consumer that
    detaches holding three messages of A frees A as detached (it was logged settled, as
    if it had done its work), and the three releases count in the destination's released
    statistic, as the event log's settle records have them (they did not count)."""
    listener = _Listener()
    dest = _grouped_by_plugin(listener)
    wire = Wire()
    consumer = add(dest, wire, 10)
    for n in range(3):
        dest.enqueue(msg(f"A-{n}", "A"))
    dest.remove_consumer(consumer)
    assert listener.seen == [("assigned", "A"), ("detached", "A")]
    assert dest.stats()["released"] == 3


def test_group_ownership_is_not_reported_when_nothing_reads_it(info_logging: Any) -> None:
    dest = _grouped_by_plugin()
    assert isinstance(dest.queue, GroupedQueue)
    assert dest.queue._ownership_events is False
    wire = Wire()
    consumer = add(dest, wire, 10)
    dest.enqueue(msg("A-1", "A"))
    dest.settle(consumer, wire.sent[0][1], Settlement.accepted())
    assert dest.queue.group_count == 0, "the group is still freed and forgotten"


class _HoldEverything:
    @hookimpl
    def qpid_flow_consumer_select(self) -> Hold:
        return Hold("not yet")


def test_a_plugin_chooser_is_asked_even_with_one_consumer_ready(info_logging: Any) -> None:
    dest = _grouped_by_plugin(_HoldEverything())
    assert dest.queue._sole_consumer_takes_free_groups is False  # type: ignore[attr-defined]
    wire = Wire()
    consumer = add(dest, wire, 10)
    dest.enqueue(msg("A-1", "A"))
    assert wire.sent == [] and consumer.credit == 10, "the plugin held the free group back"


def test_with_only_the_builtin_chooser_a_lone_consumer_takes_free_groups(info_logging: Any) -> None:
    dest = _grouped_by_plugin()
    assert dest.queue._sole_consumer_takes_free_groups is True  # type: ignore[attr-defined]
    wire = Wire()
    add(dest, wire, 10)
    for group in ("A", "B", "C"):
        dest.enqueue(msg(f"{group}-1", group))
    assert names(wire, wire.sent[0][0]) == ["A-1", "B-1", "C-1"]


def test_grouping_switched_off_and_on_keeps_held_groups_with_their_holders(info_logging: Any) -> None:
    """A grouped queue notes on each message the group it went out in; a queue installed
    later (grouping off, then on again) must not be misled by an earlier queue's note."""
    dest = _grouped_by_plugin()
    wire = Wire()
    first = add(dest, wire, 1)
    dest.enqueue(msg("A-1", "A"))
    dest.enqueue(msg("A-2", "A"))
    held = wire.sent[0][1]
    assert names(wire, first) == ["A-1"]

    dest.policy = DestinationPolicy.of(pattern="q", shared_groups=False)
    dest.hooks.destination_policy_changed(destination=dest)
    dest.policy = DestinationPolicy.of(pattern="q", shared_groups=True)
    dest.hooks.destination_policy_changed(destination=dest)
    queue = dest.queue
    assert isinstance(queue, GroupedQueue)

    second = add(dest, wire, 10)
    assert names(wire, second) == [], "A is still out to the first consumer: A-2 waits"
    dest.settle(first, held, Settlement.accepted())
    assert names(wire, second) == ["A-2"], "A was freed in the queue now installed; the first has no credit"
    assert [(g["ownerId"], g["held"], g["waiting"]) for g in queue.describe()] == [(second.id, 1, 0)]
    dest.settle(second, wire.sent[-1][1], Settlement.accepted())
    assert queue.group_count == 0 and len(queue) == 0


def coloured(text: str, group: str, colour: str) -> Message:
    encoded = ProtonMessage(body=text, group_id=group, properties={"colour": colour}).encode()
    return _labelled(text, encoded)


@pytest.mark.parametrize("sole_consumer_shortcut", [False, True])
def test_selectors_hold_with_groups(sole_consumer_shortcut: bool) -> None:
    """A consumer with a selector gets only what it matches, and a group is still out to
    one consumer at a time: the owner's non-matching head waits until the owner settles the
    group, then goes to a consumer that matches it."""
    hooks = Hooks(build_plugin_manager())
    destination = Destination("q", DestinationPolicy.of(pattern="q"), hooks)
    destination.replace_queue(
        GroupedQueue(None, destination.queue_select, sole_consumer_takes_free_groups=sole_consumer_shortcut)
    )
    wire = Wire()
    red = Consumer("q", wire.deliver, selector=parse_selector("colour = 'red'"))
    destination.add_consumer(red)
    destination.credit_changed(red, 10)
    for text, group, colour in [("a1", "A", "red"), ("a2", "A", "blue"), ("b1", "B", "blue"), ("a3", "A", "red")]:
        destination.enqueue(coloured(text, group, colour))
    assert names(wire, red) == ["a1"]  # a2 is blue: group A's head waits for red to settle a1
    blue = Consumer("q", wire.deliver, selector=parse_selector("colour = 'blue'"))
    destination.add_consumer(blue)
    destination.credit_changed(blue, 10)
    assert names(wire, blue) == ["b1"]  # group A is red's while it holds a1
    held = next(m for c, m in wire.sent if name(m) == "a1")
    destination.settle(red, held, Settlement.accepted())
    assert names(wire, blue) == ["b1", "a2"]  # A is free: its blue head goes to blue, which now owns A
    assert names(wire, red) == ["a1"]  # a3 is red, but A is blue's until it settles a2
    destination.settle(blue, next(m for c, m in wire.sent if name(m) == "a2"), Settlement.accepted())
    assert names(wire, red) == ["a1", "a3"]


@pytest.mark.parametrize("sole_consumer_shortcut", [False, True])
def test_a_group_head_too_large_for_its_owner_waits_for_the_group_to_be_free(sole_consumer_shortcut: bool) -> None:
    """As with selectors: a consumer is never sent a message larger than its
    max-message-size, and a group is still out to one consumer at a time."""
    hooks = Hooks(build_plugin_manager())
    destination = Destination("q", DestinationPolicy.of(pattern="q"), hooks)
    destination.replace_queue(
        GroupedQueue(None, destination.queue_select, sole_consumer_takes_free_groups=sole_consumer_shortcut)
    )
    wire = Wire()
    for text, group in [("a1", "A"), ("A" * 2000, "A"), ("b1", "B")]:
        destination.enqueue(msg(text, group))
    small = Consumer("q", wire.deliver, max_size=500)
    destination.add_consumer(small)
    destination.credit_changed(small, 10)
    assert names(wire, small) == ["a1", "b1"]  # group A's large head waits: small owns A
    roomy = add(destination, wire, 10)
    assert names(wire, roomy) == []
    destination.settle(small, next(m for c, m in wire.sent if name(m) == "a1"), Settlement.accepted())
    assert names(wire, roomy) == ["A" * 2000]
    assert names(wire, small) == ["a1", "b1"]


def leased_destination(lease: float) -> tuple[Destination, Any, list[tuple[str, Any]]]:
    """A grouped destination with ``group_lease``, its groups plugin's clock in the test's
    hands (ManualControl), and what each consumer was sent: (consumer name, group)."""
    _, destination, control = grouped_with_clock({"shared_groups": True, "group_lease": lease})
    return destination, control, []


def grouped_with_clock(settings: dict[str, Any]) -> tuple[Any, Destination, Any]:
    """Destination 'q' with ``settings``, in its registry, with the groups plugin's clock in
    the test's hands (ManualControl): (registry, destination, control)."""
    from qpid_flow.config import build_config
    from qpid_flow.core.registry import Destinations
    from qpid_flow.testing import ManualControl

    config = build_config({"destinations": {"q": settings}})
    manager = build_plugin_manager()
    hooks = Hooks(manager)
    hooks.configure(config=config, manager=manager)
    control = ManualControl(hooks=hooks)
    plugin = manager.get_plugin("groups")
    assert plugin is not None
    plugin._clock = lambda: control.now
    registry = Destinations(config, hooks, control.memory)
    destination = registry.get("q")
    assert destination is not None
    control.add(destination)
    hooks.started(control=cast("RouterControl", control))
    return registry, destination, control


def test_a_group_lost_to_its_lease_goes_to_another_consumer_not_back_to_the_stuck_one() -> None:
    """The lease protects the others from a stuck consumer: the group it loses goes to a
    consumer that is working. (It went straight back to the stuck one, which then owned the
    fewest groups: taken away and given back every lease, protecting no one.)"""
    destination, control, sent = leased_destination(1.0)
    stuck = Consumer("q", lambda c, m: sent.append((c.name, m.group_id())), name="stuck")
    healthy = Consumer("q", lambda c, m: sent.append((c.name, m.group_id())), name="healthy")
    destination.add_consumer(stuck)
    destination.credit_changed(stuck, 10)
    destination.enqueue(msg("A-1", "A"))
    destination.add_consumer(healthy)
    destination.credit_changed(healthy, 10)
    control.advance(0.5)
    destination.enqueue(msg("B-1", "B"))
    assert sent == [("stuck", "A"), ("healthy", "B")]
    control.advance(0.65)  # A's lease is over, B's is not; neither consumer settled
    assert sent[2:] == [("healthy", "A")]


def test_a_sole_stuck_consumer_gets_its_group_back_one_lease_later() -> None:
    """With no other consumer the group waits a lease, then goes back: a slow consumer is
    not starved for good."""
    destination, control, sent = leased_destination(1.0)
    only = Consumer("q", lambda c, m: sent.append((c.name, m.group_id())), name="only")
    destination.add_consumer(only)
    destination.credit_changed(only, 10)
    destination.enqueue(msg("A-1", "A"))
    control.advance(1.15)
    assert sent == [("only", "A")]  # lost, and not given straight back
    control.advance(1.0)
    assert sent == [("only", "A"), ("only", "A")]


def test_a_group_header_changed_at_runtime_groups_the_waiting_messages_by_the_new_one() -> None:
    """Two messages of customer c1 (header NEW) arrive while OLD is the group header; then
    NEW becomes it: they are one group, out to one consumer at a time. (The group id read
    by the old header was remembered and given for any header: two groups, one message
    to each of two consumers at once.)"""
    from qpid_flow.config import build_config
    from qpid_flow.core.registry import Destinations
    from qpid_flow.testing import ManualControl, make_message

    config = build_config({"destinations": {"q": {"shared_groups": True, "group_header": "OLD"}}})
    manager = build_plugin_manager()
    hooks = Hooks(manager)
    hooks.configure(config=config, manager=manager)
    control = ManualControl(hooks=hooks)
    registry = Destinations(config, hooks, control.memory)
    destination = registry.get("q")
    assert destination is not None
    control.add(destination)
    hooks.started(control=cast("RouterControl", control))
    for name, old in (("m1", "x"), ("m2", "y")):
        destination.enqueue(make_message(name, "q", properties={"OLD": old, "NEW": "c1"}))
    registry.set_policy("q", registry.parse_policy("q", {"shared_groups": True, "group_header": "NEW"}))
    wire = Wire()
    a, b = Consumer("q", wire.deliver, name="A"), Consumer("q", wire.deliver, name="B")
    for consumer in (a, b):
        destination.add_consumer(consumer)
        consumer.credit = 10
    destination.dispatch()  # both ready at once: free groups would be spread over them
    assert [consumer.name for consumer, _ in wire.sent] == ["A", "A"]


def test_group_settings_without_shared_groups_are_a_warning() -> None:
    from qpid_flow.config import build_config
    from qpid_flow.core.registry import Destinations
    from qpid_flow.testing import ManualControl

    config = build_config({"destinations": {"q": {"group_lease": 5}}})
    manager = build_plugin_manager()
    hooks = Hooks(manager)
    hooks.configure(config=config, manager=manager)
    control = ManualControl(hooks=hooks)
    with structlog.testing.capture_logs() as logs:
        destination = Destinations(config, hooks, control.memory).get("q")
    assert destination is not None and not isinstance(destination.queue, GroupedQueue)
    warnings = [e for e in logs if e["event"] == "groups_config_warning"]
    assert [e["warning"] for e in warnings] == ["group_lease has no effect without shared_groups = true"]


def test_a_group_s_owner_is_named_by_connection_and_link() -> None:
    """As docs/configuration.md shows it (c3/orders-worker-1): the connection id is what
    `stat connections` and `connection close` take. It was the link name alone."""
    dest, wire = grouped()
    worker = Consumer("q", wire.deliver, name="orders-worker-1", connection_id="c3")
    dest.add_consumer(worker)
    dest.credit_changed(worker, 10)
    dest.enqueue(msg("A-1", "customer-17"))
    assert isinstance(dest.queue, GroupedQueue)
    (described,) = dest.queue.describe()
    assert described["owner"] == "c3/orders-worker-1"


def test_a_group_lease_added_at_runtime_is_enforced() -> None:
    """seed 004's stuck consumer: an operator adds ``group_lease`` to a grouped destination
    at runtime, and the stuck consumer's group goes to a working one a lease later. (The
    lease sweep only started when groups were first enabled: a lease added later showed in
    the policy and was never applied.)"""
    registry, destination, control = grouped_with_clock({"shared_groups": True})
    sent: list[tuple[str, str | None]] = []
    stuck = Consumer("q", lambda c, m: sent.append((c.name, m.group_id())), name="stuck")
    destination.add_consumer(stuck)
    destination.credit_changed(stuck, 10)
    destination.enqueue(msg("A-1", "A"))
    registry.set_policy("q", registry.parse_policy("q", {"shared_groups": True, "group_lease": 1.0}))
    healthy = Consumer("q", lambda c, m: sent.append((c.name, m.group_id())), name="healthy")
    destination.add_consumer(healthy)
    destination.credit_changed(healthy, 10)
    control.advance(1.15)
    assert sent == [("stuck", "A"), ("healthy", "A")]


def test_an_expired_group_head_lets_the_rest_of_its_group_go() -> None:
    """A group's head too large for the only consumer expires: the next message of the
    group goes to that consumer at once. (Expiry took the head out without a dispatch: the
    rest of the group waited for some unrelated event.)"""
    hooks = Hooks(build_plugin_manager())
    destination = Destination("q", DestinationPolicy.of(pattern="q"), hooks)
    destination.replace_queue(GroupedQueue(None, destination.queue_select))
    wire = Wire()
    head = msg("A" * 2000, "A")
    head.expires = 10.0
    destination.enqueue(head)
    destination.enqueue(msg("a2", "A"))
    small = Consumer("q", wire.deliver, max_size=500)
    destination.add_consumer(small)
    destination.credit_changed(small, 10)
    assert names(wire, small) == []
    assert destination.expire(now=11.0) == 1
    assert names(wire, small) == ["a2"]


def test_a_forgotten_grouped_destination_leaves_the_groups_plugin() -> None:
    """One-off names under a grouped pattern, each forgotten when idle: the plugin let go
    of none of them (5,000 an hour: +32 MB, and each swept for leases ten times a second
    for good: +7 % of a core, idle). Now it forgets them with the registry, and the lease
    sweep stops once no leased destination is left."""
    from qpid_flow.config import build_config
    from qpid_flow.core.registry import Destinations
    from qpid_flow.testing import ManualControl

    config = build_config({"destinations": {"carts.>": {"shared_groups": True, "group_lease": 30.0}}})
    manager = build_plugin_manager()
    hooks = Hooks(manager)
    hooks.configure(config=config, manager=manager)
    control = ManualControl(hooks=hooks)
    plugin = cast(Any, manager.get_plugin("groups"))
    plugin._clock = lambda: control.now
    registry = Destinations(config, hooks, control.memory)
    hooks.started(control=cast("RouterControl", control))
    for n in range(50):
        destination = registry.get(f"carts.{n}")
        assert destination is not None and isinstance(destination.queue, GroupedQueue)
    assert len(plugin._grouped) == 50 and control.timers
    assert registry.forget_idle(now=0.0, idle_timeout=60) == 0  # idle from now
    assert registry.forget_idle(now=60.0, idle_timeout=60) == 50
    assert plugin._grouped == {}
    control.advance(1.0)  # the sweep due runs once more, and schedules no other
    assert control.timers == []
