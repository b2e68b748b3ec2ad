"""What grouped dispatch, ring drops, purges and expiry cost, counted in work done (selector
runs, heap pushes, groups looked at), not timed; and the memory of the heads heaps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proton import Message as ProtonMessage

from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import Destination
from qpid_flow.core.jms_selector import parse_selector
from qpid_flow.core.model import Consumer, Message, Settlement
from qpid_flow.plugin.manager import Hooks, build_plugin_manager
from qpid_flow.policies.groups.grouped_queue import GroupedQueue, _Heads

if TYPE_CHECKING:
    from collections.abc import Iterator


class _CountingSelector:
    """A selector that counts how often it is run."""

    def __init__(self, text: str) -> None:
        self._selector = parse_selector(text)
        self.runs = 0

    def matches(self, fields: Any) -> bool:
        self.runs += 1
        return bool(self._selector.matches(fields))


class _CountingHeads(_Heads):
    """The dispatch heap, counting the entries pushed into it."""

    __slots__ = ("pushes",)

    def __init__(self, heads: _Heads) -> None:
        super().__init__()
        self._ordered, self._heap = heads._ordered, heads._heap  # what the queue had
        self.pushes = 0

    def push(self, sequence: int, group: Any) -> None:
        self.pushes += 1
        super().push(sequence, group)


class _CountingGroups(dict[str, Any]):
    """The group table, counting the groups looked at by walks over it."""

    looked_at = 0

    def values(self) -> Any:
        def walk() -> Iterator[Any]:
            for group in super(_CountingGroups, self).values():
                _CountingGroups.looked_at += 1
                yield group

        return walk()


def _destination(**policy: Any) -> tuple[Destination, list[tuple[Consumer, Message]]]:
    """A grouped destination with the chooser the groups plugin installs (queue_select)."""
    destination = Destination("q", DestinationPolicy.of(pattern="q", **policy), Hooks(build_plugin_manager()))
    destination.replace_queue(GroupedQueue(None, destination.queue_select))
    return destination, []


def _message(group: str, colour: str = "blue") -> Message:
    return Message(bytes(ProtonMessage(body="x", group_id=group, properties={"c": colour}).encode()), "q")


def _queue(destination: Destination) -> GroupedQueue:
    queue = destination.queue
    assert isinstance(queue, GroupedQueue)
    return queue


# --- defect 1: a consumer with a selector and free groups it refuses ------------------------


def test_free_groups_a_selector_refused_are_not_checked_again_on_every_dispatch() -> None:
    """2,000 blue messages in distinct groups wait for a consumer of red ones; each red
    message that then comes and goes runs the selector on it alone (the blue heads were run
    through it on every dispatch: 2,000 selector runs and heap pushes per red message)."""
    destination, sent = _destination()
    selector = _CountingSelector("c = 'red'")
    red = Consumer("q", lambda c, m: sent.append((c, m)), selector=selector)
    destination.add_consumer(red)
    destination.credit_changed(red, 10**9)
    for i in range(2000):
        destination.enqueue(_message(f"b{i}"))
    heads = _CountingHeads(_queue(destination)._heads)
    _queue(destination)._heads = heads
    selector.runs = 0
    for i in range(100):
        message = _message(f"r{i}", "red")
        destination.enqueue(message)
        destination.settle(red, message, Settlement.accepted())
    assert len(sent) == 100 and len(destination.queue) == 2000
    assert selector.runs <= 100, f"{selector.runs} selector runs for 100 red messages"
    assert heads.pushes <= 100, f"{heads.pushes} heap pushes for 100 red messages"


def test_a_prefetch_one_consumer_with_a_selector_does_not_recheck_what_it_refused() -> None:
    """Credit going from none to some re-offers only the heads parked while the consumer
    had none, not all it refused before."""
    destination, sent = _destination()
    selector = _CountingSelector("c = 'red'")
    red = Consumer("q", lambda c, m: sent.append((c, m)), selector=selector)
    destination.add_consumer(red)
    destination.credit_changed(red, 1)
    for i in range(1000):
        destination.enqueue(_message(f"b{i}"))
    selector.runs = 0
    for i in range(100):
        destination.enqueue(_message(f"r{i}", "red"))
        message = sent[-1][1]
        destination.settle(red, message, Settlement.accepted())
        destination.credit_changed(red, 1)  # the client grants one more
    assert len(sent) == 100
    assert selector.runs <= 100, f"{selector.runs} selector runs for 100 red messages"


def test_free_groups_only_barred_consumers_could_take_wait_without_being_re_pushed() -> None:
    """A consumer barred after losing a group to its lease (the only one ready): the free
    groups wait for the bar to lift without going through the heap on every dispatch."""
    now = [0.0]
    destination = Destination("q", DestinationPolicy.of(pattern="q"), Hooks(build_plugin_manager()))
    queue = GroupedQueue(None, destination.queue_select, clock=lambda: now[0])
    destination.replace_queue(queue)
    sent: list[Message] = []
    stuck = Consumer("q", lambda c, m: sent.append(m))
    destination.add_consumer(stuck)
    destination.credit_changed(stuck, 10**9)
    queue.bar(stuck, until=10.0)
    for i in range(1000):
        destination.enqueue(_message(f"g{i}"))
    heads = _CountingHeads(queue._heads)
    queue._heads = heads
    for _ in range(100):
        now[0] += 0.05
        destination.dispatch()  # the lease sweep's, ten times a second
    assert sent == []
    assert heads.pushes == 0, f"{heads.pushes} heap pushes in 100 dispatches with every group barred"
    now[0] = 10.0
    destination.dispatch()  # the bar is over: the groups go
    assert len(sent) == 1000


def test_heads_refused_by_one_consumer_go_to_a_consumer_that_gets_credit_later() -> None:
    """What parks a head never loses it: a consumer that attaches, or gets credit again,
    is offered the heads parked meanwhile, oldest first."""
    destination, sent = _destination()
    red = Consumer("q", lambda c, m: sent.append((c, m)), selector=parse_selector("c = 'red'"))
    destination.add_consumer(red)
    destination.credit_changed(red, 100)
    blue = Consumer("q", lambda c, m: sent.append((c, m)), selector=parse_selector("c = 'blue'"))
    destination.add_consumer(blue)
    destination.credit_changed(blue, 1)
    first = [_message(f"b{i}") for i in range(3)]
    for message in first:
        destination.enqueue(message)
    assert [m for c, m in sent if c is blue] == first[:1]
    later = [_message(f"c{i}") for i in range(3)]
    for message in later:
        destination.enqueue(message)  # parked: red refuses them, blue has no credit
    destination.credit_changed(blue, 10)
    assert [m for c, m in sent if c is blue] == first + later
    anyone = Consumer("q", lambda c, m: sent.append((c, m)))
    destination.add_consumer(anyone)
    green = [_message(f"g{i}", "green") for i in range(2)]
    for message in green:
        destination.enqueue(message)
    destination.credit_changed(anyone, 5)
    assert [m for c, m in sent if c is anyone] == green


# --- defect 2: stale heads pile up when no dispatch pops them ------------------------------


def test_ring_drops_with_no_consumer_leave_no_stale_heads_behind() -> None:
    """One group, a ring of 10, no consumer: each drop offers the group's next head; the
    old entries must not pile up (they did: one per drop, 20,000 here)."""
    destination, _ = _destination(max_count=10, when_full="ring")
    queue = _queue(destination)
    for _ in range(20_000):
        message = _message("A")
        while not destination.has_room_for(message) and destination.drop_oldest():
            pass
        destination.enqueue(message)
    assert (len(queue), queue.group_count) == (10, 1)
    assert len(queue._heads) <= 200, f"{len(queue._heads)} heap entries for 1 group"


def test_expired_groups_are_not_kept_alive_by_the_heads_heap() -> None:
    """TTL'd messages of distinct groups expire with no consumer credit: their groups are
    forgotten, and so are their heap entries (they kept every forgotten group alive)."""
    destination, _ = _destination()
    queue = _queue(destination)
    destination.enqueue(_message("keep"))  # the table is never empty
    for round_ in range(5):
        for i in range(5000):
            message = _message(f"g{round_}-{i}")
            message.expires = 1.0
            destination.expiring = True
            destination.enqueue(message)
        assert destination.expire(now=2.0) == 5000
        assert queue.group_count == 1
        assert len(queue._heads) <= 200, f"round {round_}: {len(queue._heads)} heap entries for 1 group"


# --- defect 3: ring drops and purges scanned every group ------------------------------------


def test_a_ring_drop_does_not_look_at_every_group() -> None:
    """A ring of 5,000 messages in 5,000 groups: 1,000 more, each forcing a drop, look at
    each group about once in all (they looked at all 5,000 per drop)."""
    destination, _ = _destination(max_count=5000, when_full="ring")
    queue = _queue(destination)
    queue._groups = _CountingGroups()
    for i in range(5000):
        destination.enqueue(_message(f"g{i}"))
    _CountingGroups.looked_at = 0
    for i in range(1000):
        message = _message(f"h{i}")
        while not destination.has_room_for(message) and destination.drop_oldest():
            pass
        destination.enqueue(message)
    assert destination.ring_dropped == 1000
    assert len(queue) == 5000
    assert _CountingGroups.looked_at <= 2 * 5000, f"{_CountingGroups.looked_at} groups looked at for 1,000 drops"


def test_a_purge_looks_at_each_group_about_once() -> None:
    destination, _ = _destination()
    queue = _queue(destination)
    queue._groups = _CountingGroups()
    for i in range(3000):
        destination.enqueue(_message(f"g{i}"))
    _CountingGroups.looked_at = 0
    assert destination.purge() == 3000
    assert (len(queue), queue.group_count) == (0, 0)
    assert _CountingGroups.looked_at <= 2 * 3000, f"{_CountingGroups.looked_at} groups looked at to purge 3,000"


def test_ring_drops_take_the_oldest_waiting_message_whatever_went_out_and_came_back() -> None:
    """Drops go in queue order across groups, released messages included (back at their
    place), and what a drop leaves can still go to a consumer."""
    destination, sent = _destination()
    order = [("A", 1), ("B", 1), ("A", 2), ("C", 1), ("B", 2), ("A", 3), ("C", 2)]
    messages = {f"{g}{n}": _message(g) for g, n in order}
    for message in messages.values():
        destination.enqueue(message)
    consumer = Consumer("q", lambda c, m: sent.append((c, m)))
    destination.add_consumer(consumer)
    destination.credit_changed(consumer, 2)
    assert [m for _, m in sent] == [messages["A1"], messages["B1"]]
    destination.settle(consumer, messages["B1"], Settlement.released())  # B1 back at its place
    consumer.credit = 0
    destination.settle(consumer, messages["A1"], Settlement.accepted())
    label = {id(m): k for k, m in messages.items()}
    drops = []
    for _ in range(3):
        oldest = destination.queue.pop_oldest()
        assert oldest is not None
        drops.append(label[id(oldest)])
    assert drops == ["B1", "A2", "C1"]
    destination.credit_changed(consumer, 10)
    assert [label[id(m)] for _, m in sent[2:]] == ["B2", "A3", "C2"]
