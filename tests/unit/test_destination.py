"""Destinations without a network: dispatch, settlement, release order and accounting."""

from __future__ import annotations

from typing import Any

import pytest

from qpid_flow.config import DestinationPolicy
from qpid_flow.core.destination import BROKER_EXCESS_SETTLE, Destination
from qpid_flow.core.model import Consumer, Message, Outcome, Settlement
from qpid_flow.plugin.manager import Hooks, build_plugin_manager


class Wire:
    """Stands in for the router: records what each consumer was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, Message]] = []

    def deliver(self, consumer: Consumer, message: Message) -> None:
        self.sent.append((consumer.id, message))


@pytest.fixture
def hooks() -> Hooks:
    return Hooks(build_plugin_manager())


def make(hooks: Hooks, **policy: Any) -> Destination:
    return Destination("q", DestinationPolicy.of(pattern="q", **policy), hooks)


def msg(n: int) -> Message:
    return Message(f"m{n}".encode(), "q")


def test_messages_wait_until_a_consumer_has_credit(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    for n in range(3):
        dest.enqueue(msg(n))
    assert wire.sent == []
    dest.credit_changed(consumer, 2)
    assert [m.data for _, m in wire.sent] == [b"m0", b"m1"]
    assert consumer.credit == 0
    assert (dest.depth, len(dest.queue)) == (3, 1)


def test_competing_consumers_take_turns(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    a, b = Consumer("q", wire.deliver), Consumer("q", wire.deliver)
    for c in (a, b):
        dest.add_consumer(c)
        dest.credit_changed(c, 10)
    for n in range(6):
        dest.enqueue(msg(n))
    owners = [cid for cid, _ in wire.sent]
    assert owners.count(a.id) == owners.count(b.id) == 3


def test_accept_and_reject_remove_release_puts_back_in_original_order(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    for n in range(4):
        dest.enqueue(msg(n))
    dest.credit_changed(consumer, 3)
    m0, m1, m2 = (m for _, m in wire.sent)
    dest.settle(consumer, m0, Settlement.accepted())
    dest.settle(consumer, m2, Settlement.released())
    dest.settle(consumer, m1, Settlement(Outcome.REJECTED, "amqp:internal-error"))
    assert [m.data for m in dest.queue] == [b"m2", b"m3"]
    assert (dest.depth, dest.dequeued_total) == (2, 2)


def test_detach_releases_everything_held_in_order(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    first, second = Consumer("q", wire.deliver), Consumer("q", wire.deliver)
    dest.add_consumer(first)
    for n in range(5):
        dest.enqueue(msg(n))
    dest.credit_changed(first, 3)
    dest.remove_consumer(first)
    assert [m.data for m in dest.queue] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    dest.add_consumer(second)
    dest.credit_changed(second, 5)
    assert [m.data for cid, m in wire.sent if cid == second.id] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert dest.depth == 5


def test_presettled_consumer_counts_messages_as_accepted_on_send(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver, presettled=True)
    dest.add_consumer(consumer)
    dest.enqueue(msg(0))
    dest.credit_changed(consumer, 1)
    assert dest.depth == 0 and not consumer.held


def test_settling_twice_or_after_detach_changes_nothing(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    dest.enqueue(msg(0))
    dest.credit_changed(consumer, 1)
    sent = wire.sent[0][1]
    dest.settle(consumer, sent, Settlement.accepted())
    dest.settle(consumer, sent, Settlement.accepted())
    assert dest.depth == 0 and dest.dequeued_total == 1


def test_room_follows_max_count_and_max_size(hooks: Hooks) -> None:
    dest = make(hooks, max_count=2, max_size=10)
    assert dest.has_room_for(Message(b"12345", "q"))
    dest.enqueue(Message(b"12345", "q"))
    assert not dest.has_room_for(Message(b"123456", "q"))  # 11 bytes > 10
    dest.enqueue(Message(b"123", "q"))
    assert not dest.has_room_for(Message(b"1", "q"))  # a third message > max_count 2
    assert "max_count 2" in dest.limit_description()


def test_on_dequeue_carries_the_consumer_outcome(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    outcomes: list[Outcome] = []
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    message = Message(b"x", "q", on_dequeue=lambda s: outcomes.append(s.outcome))
    dest.enqueue(message)
    dest.credit_changed(consumer, 1)
    dest.settle(consumer, message, Settlement.released())
    dest.credit_changed(consumer, 1)
    dest.settle(consumer, message, Settlement.accepted())
    assert outcomes == [Outcome.ACCEPTED]


def test_forget_drops_waiting_and_held_messages_without_outcome(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    for n in range(4):
        m = msg(n)
        m.upstream_epoch = 1 if n % 2 else 0
        dest.enqueue(m)
    dest.credit_changed(consumer, 2)
    assert dest.forget(lambda m: m.upstream_epoch == 1) == 2
    # The broker still has them: they still count, but qpid-flow no longer holds them.
    assert dest.depth == 4
    assert len(dest.queue) + len(consumer.held) == 2


def test_no_opinion_from_any_plugin_means_consumers_take_turns() -> None:
    """Issue 16: with the built-in pass-through policy disabled (docs/plugins.md allows it),
    None from qpid_flow_consumer_select is "no opinion", as in every question hook: the
    consumers take turns rather than every message waiting forever."""
    hooks = Hooks(build_plugin_manager(disabled=["passthrough"]))
    destination = make(hooks)
    wire = Wire()
    first, second = Consumer("q", wire.deliver), Consumer("q", wire.deliver)
    for consumer in (first, second):
        destination.add_consumer(consumer)
        destination.credit_changed(consumer, 10)
    for n in range(4):
        destination.enqueue(msg(n))
    assert [len(c.held) for c in (first, second)] == [2, 2]


def test_an_expired_message_is_never_delivered_and_leaves_counted(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    stale, fresh, later = msg(1), msg(2), msg(3)
    stale.expires, later.expires = 1.0, 4e9  # long gone; far in the future
    for message in (stale, fresh, later):
        dest.enqueue(message)
    dest.credit_changed(consumer, 2)
    assert [m for _, m in wire.sent] == [fresh, later]
    assert consumer.credit == 0  # the expired one took no credit
    assert (dest.expired, dest.depth) == (1, 2)


def test_waiting_messages_expire_without_a_consumer(hooks: Hooks) -> None:
    dest = make(hooks)
    for n, expires in enumerate([10.0, None, 30.0]):
        message = msg(n)
        message.expires = expires
        dest.enqueue(message)
    assert dest.expire(now=20.0) == 1
    assert (dest.depth, dest.expired, dest.stats()["expired"]) == (2, 1, 1)


def test_only_failed_deliveries_count_towards_delivery_count(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    message = msg(1)
    dest.enqueue(message)
    dest.credit_changed(consumer, 10)
    dest.settle(consumer, message, Settlement.released())
    assert message.failed_attempts == 0  # released: not an attempt that failed
    dest.settle(consumer, message, Settlement(Outcome.MODIFIED, delivery_failed=True))
    assert message.failed_attempts == 1
    dest.remove_consumer(consumer)  # held, never settled: counts too
    assert message.failed_attempts == 2
    assert message.delivery_count == 3  # three times handed out


def test_selectors_route_messages_and_browsers_only_look(hooks: Hooks) -> None:
    from proton import Message as ProtonMessage

    from qpid_flow.core.jms_selector import parse_selector

    dest, wire = make(hooks), Wire()
    blue = Consumer("q", wire.deliver, selector=parse_selector("colour = 'blue'"))
    anyone = Consumer("q", wire.deliver)
    browser = Consumer("q", wire.deliver, presettled=True, browser=True)
    for consumer in (blue, browser):
        dest.add_consumer(consumer)
        dest.credit_changed(consumer, 10)
    for colour in ("red", "blue", "red"):
        dest.enqueue(Message(ProtonMessage(properties={"colour": colour}).encode(), "q"))
    assert [c for c, _ in wire.sent].count(blue.id) == 1  # the red ones wait for someone else
    assert [c for c, _ in wire.sent].count(browser.id) == 3  # the browser saw all three
    dest.add_consumer(anyone)
    dest.credit_changed(anyone, 10)
    assert [c for c, _ in wire.sent].count(anyone.id) == 2
    assert dest.depth == 3  # delivered, none settled: browsing took nothing away


def test_selectors_see_the_redelivery_the_client_will_read_in_the_header(hooks: Hooks) -> None:
    """JMSRedelivered and JMSXDeliveryCount as the header sent says: a released message is
    not redelivered (its header count stays 0), a failed delivery is. They counted every
    hand-out, and a first delivery had neither (JMSRedelivered = FALSE matched nothing)."""
    from proton import Message as ProtonMessage

    from qpid_flow.core.jms_selector import parse_selector

    dest, wire = make(hooks), Wire()
    first = Consumer("q", wire.deliver)
    dest.add_consumer(first)
    message = Message(ProtonMessage(body="once").encode(), "q")
    dest.enqueue(message)
    assert parse_selector("JMSRedelivered = FALSE AND JMSXDeliveryCount = 1").matches(message.selector_fields())
    dest.credit_changed(first, 1)
    dest.settle(first, message, Settlement.released())
    assert parse_selector("JMSRedelivered = FALSE AND JMSXDeliveryCount = 1").matches(message.selector_fields())
    dest.credit_changed(first, 1)
    dest.settle(first, message, Settlement(Outcome.MODIFIED, delivery_failed=True))
    assert parse_selector("JMSRedelivered = TRUE AND JMSXDeliveryCount = 2").matches(message.selector_fields())
    again = ProtonMessage()
    again.decode(message.wire())
    assert again.delivery_count == 1  # what the client reads: one failed attempt


def test_a_message_larger_than_a_consumers_max_message_size_goes_to_another(hooks: Hooks) -> None:
    """AMQP 1.0 2.7.3: a sender must not send a message larger than the receiver's
    max-message-size (the client's library would end the link). It waits for a consumer
    that takes it, and the messages behind it go on."""
    dest, wire = make(hooks), Wire()
    small = Consumer("q", wire.deliver, max_size=100)
    dest.add_consumer(small)
    dest.credit_changed(small, 10)
    dest.enqueue(Message(b"x" * 500, "q"))
    dest.enqueue(Message(b"y" * 100, "q"))  # exactly the limit: fits
    assert [(c, m.size) for c, m in wire.sent] == [(small.id, 100)]
    assert len(dest.queue) == 1
    anyone = Consumer("q", wire.deliver)
    dest.add_consumer(anyone)
    dest.credit_changed(anyone, 10)
    assert [(c, m.size) for c, m in wire.sent][1:] == [(anyone.id, 500)]


class CountingConsumer(Consumer):
    """A consumer that counts how often it is asked whether it takes a message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = 0

    def takes(self, message: Message) -> bool:
        self.asked += 1
        return super().takes(message)


def coloured(colour: str) -> Message:
    from proton import Message as ProtonMessage

    return Message(ProtonMessage(properties={"colour": colour}).encode(), "q")


def test_a_selector_consumer_finds_its_message_behind_any_number_it_does_not_want(hooks: Hooks) -> None:
    """3,000 blue messages nobody takes, then red ones: the red consumer gets them. (The
    dispatcher looked 1,000 messages deep and stopped: the red ones waited for ever.)"""
    from qpid_flow.core.jms_selector import parse_selector

    dest, wire = make(hooks), Wire()
    red = Consumer("q", wire.deliver, selector=parse_selector("colour = 'red'"))
    dest.add_consumer(red)
    dest.credit_changed(red, 10)
    for _ in range(3000):
        dest.enqueue(coloured("blue"))
    dest.enqueue(coloured("red"))
    assert [c for c, _ in wire.sent] == [red.id]
    dest.enqueue(coloured("red"))
    assert [c for c, _ in wire.sent] == [red.id, red.id]
    assert len(dest.queue) == 3000


def test_a_message_a_consumer_refused_is_not_looked_at_again_for_it(hooks: Hooks) -> None:
    """Whether a consumer takes a message never changes (its selector, its size limit): a
    backlog it refused once is skipped by every later dispatch, not scanned again."""
    from qpid_flow.core.jms_selector import parse_selector

    dest, wire = make(hooks), Wire()
    red = CountingConsumer("q", wire.deliver, selector=parse_selector("colour = 'red'"))
    dest.add_consumer(red)
    dest.credit_changed(red, 10)
    for _ in range(2000):
        dest.enqueue(coloured("blue"))
    assert red.asked == 2000  # each once, as it arrived
    dest.credit_changed(red, 20)
    dest.enqueue(coloured("red"))
    assert red.asked <= 2002 and [c for c, _ in wire.sent] == [red.id]


def test_a_released_message_goes_back_to_a_selector_consumer_that_had_moved_past_it(hooks: Hooks) -> None:
    from qpid_flow.core.jms_selector import parse_selector

    dest, wire = make(hooks), Wire()
    red = Consumer("q", wire.deliver, selector=parse_selector("colour = 'red'"))
    dest.add_consumer(red)
    dest.credit_changed(red, 1)
    for colour in ("blue", "red", "blue", "blue"):
        dest.enqueue(coloured(colour))
    ((_, first),) = wire.sent
    dest.credit_changed(red, 1)
    dest.enqueue(coloured("blue"))  # the consumer's cursor moves past the red one's place
    dest.settle(red, first, Settlement.released())
    assert [m for _, m in wire.sent] == [first, first]


def test_a_browser_sees_only_the_messages_its_max_message_size_allows(hooks: Hooks) -> None:
    dest, wire = make(hooks), Wire()
    browser = Consumer("q", wire.deliver, presettled=True, browser=True, max_size=100)
    dest.add_consumer(browser)
    dest.credit_changed(browser, 10)
    dest.enqueue(Message(b"x" * 500, "q"))
    dest.enqueue(Message(b"y" * 50, "q"))
    assert [m.size for _, m in wire.sent] == [50]
    assert len(dest.queue) == 2  # browsing takes nothing away


def test_a_redelivery_is_measured_with_the_header_it_will_carry(hooks: Hooks) -> None:
    """A failed delivery comes back with a header saying so: a message that fitted the
    first time may not any more."""
    from proton import Message as ProtonMessage

    dest, wire = make(hooks), Wire()
    first = Consumer("q", wire.deliver)
    dest.add_consumer(first)
    message = Message(ProtonMessage(body="b" * 50).encode(), "q")
    dest.enqueue(message)
    dest.credit_changed(first, 1)
    dest.settle(first, message, Settlement(Outcome.MODIFIED, delivery_failed=True))
    redelivered = message.next_wire_size()
    assert redelivered > message.size
    tight = Consumer("q", wire.deliver, max_size=message.size)
    dest.remove_consumer(first)
    dest.add_consumer(tight)
    dest.credit_changed(tight, 1)
    assert [c for c, _ in wire.sent] == [first.id]  # not sent: it no longer fits
    roomy = Consumer("q", wire.deliver, max_size=redelivered)
    dest.add_consumer(roomy)
    dest.credit_changed(roomy, 1)
    assert [c for c, _ in wire.sent] == [first.id, roomy.id]
    assert len(message.wire()) == redelivered


class Mirror:
    """A consumer mirrored to the broker, as its destination sees it."""

    def __init__(self, held: int = 0, broker_credit: int = 0) -> None:
        self.held = held
        self.broker_credit = broker_credit


def counted_in(hooks: Hooks, count: int) -> Destination:
    """A destination in front of a broker that saw ``count`` messages pass to it."""
    dest = make(hooks)
    for n in range(count):
        dest.count_in(msg(n))
    return dest


def test_the_broker_backlog_raises_the_depth_to_what_the_broker_holds_ready(hooks: Hooks) -> None:
    dest = counted_in(hooks, 10)
    dest.set_broker_backlog(50_000)  # left in the queue by an earlier run
    assert dest.depth == 50_000


def test_the_broker_backlog_lowers_the_depth_once_readings_find_messages_consumed_elsewhere_for_a_while(
    hooks: Hooks,
) -> None:
    dest = counted_in(hooks, 900)
    dest.set_broker_backlog(120, now=10.0)
    assert dest.depth == 900  # one reading may have caught messages on their way
    dest.set_broker_backlog(110, now=10.1)
    assert dest.depth == 900
    dest.set_broker_backlog(100, now=10.0 + BROKER_EXCESS_SETTLE)
    assert dest.depth == 100


def test_readings_that_caught_bursts_on_their_way_lower_nothing(hooks: Hooks) -> None:
    # RabbitMQ sent 604 messages to a consumer that gave it 20 credit; at the reading, 200
    # had reached qpid-flow and none was ready. By the next one, all had arrived.
    dest = counted_in(hooks, 604)
    burst = Mirror(held=200, broker_credit=0)
    dest.mirrored.add(burst)
    dest.set_broker_backlog(0, now=10.0)
    assert dest.depth == 604
    burst.held = 604
    dest.set_broker_backlog(0, now=10.5)
    assert dest.depth == 604
    burst.held = 300  # another burst under way at the next reading
    dest.set_broker_backlog(0, now=11.0 + BROKER_EXCESS_SETTLE)
    assert dest.depth == 604  # the excess must last, not be seen twice at all


def test_messages_out_to_mirrored_consumers_still_count_though_the_broker_no_longer_calls_them_ready(
    hooks: Hooks,
) -> None:
    # RabbitMQ counts a message handed to a consumer as unacknowledged, not ready, and it
    # sends beyond the credit it was given: 604 of 901 can sit in qpid-flow waiting for the
    # client's credit or its settlement while the broker reports 0 ready.
    dest = counted_in(hooks, 901)
    for _ in range(297):
        dest.count_out(msg(0))
    dest.mirrored.add(Mirror(held=604))
    dest.set_broker_backlog(0)
    assert dest.depth == 604
    dest.set_broker_backlog(10, now=10.0)  # ten more arrived in the broker from elsewhere
    assert dest.depth == 604  # or the reading is from before ten of those held arrived
    dest.set_broker_backlog(10, now=10.0 + BROKER_EXCESS_SETTLE)
    assert dest.depth == 614


def test_credit_a_mirrored_consumer_gave_the_broker_bounds_the_depth_from_above(hooks: Hooks) -> None:
    # What the broker sent on that credit may not have arrived yet: it is in neither count.
    dest = counted_in(hooks, 100)
    dest.mirrored.add(Mirror(held=20, broker_credit=30))
    dest.set_broker_backlog(60)
    assert dest.depth == 100  # within [60 + 20, 60 + 20 + 30]: qpid-flow's own count stands
    dest.set_broker_backlog(0, now=10.0)
    dest.set_broker_backlog(0, now=10.0 + BROKER_EXCESS_SETTLE)
    assert dest.depth == 50  # at most 0 ready + 20 held + 30 on their way


def test_messages_forwarded_and_not_yet_confirmed_are_not_counted_twice(hooks: Hooks) -> None:
    # RabbitMQ queues a message before its disposition reaches qpid-flow: the reading may
    # count the 50 still in flight among the ready ones already.
    dest = counted_in(hooks, 100)
    dest.in_flight = 50
    dest.set_broker_backlog(100)
    assert dest.depth == 100
    dest.set_broker_backlog(50)  # none of them queued yet: still within the bounds
    assert dest.depth == 100
    dest.set_broker_backlog(30, now=10.0)  # 20 consumed by a client of RabbitMQ itself
    dest.set_broker_backlog(30, now=10.0 + BROKER_EXCESS_SETTLE)
    assert dest.depth == 80


def test_a_browser_counts_as_a_consumer_and_keeps_its_destination_in_use(hooks: Hooks) -> None:
    """docs: consumers counts consumer links; a browser is one. An empty destination with
    only a browser on it is in use: forgetting it left the browser on a destination no
    producer reached any more."""
    dest, wire = make(hooks), Wire()
    browser = Consumer("q", wire.deliver, presettled=True, browser=True)
    dest.add_consumer(browser)
    assert dest.stats()["consumers"] == 1
    assert not dest.unused
    dest.remove_consumer(browser)
    assert dest.unused


def test_a_ring_refuses_a_message_larger_than_max_size_and_keeps_its_messages(hooks: Hooks) -> None:
    """qpidd's ring refuses a message larger than its maximum before dropping anything. (A
    2 KB message to a 1,000-byte ring emptied it, oldest first, and was refused anyway.)"""
    from proton import Message as Encoded

    from qpid_flow.core.standalone import StandaloneBackend

    dest = make(hooks, limit_policy="ring", max_size=1000)
    for n in range(5):
        StandaloneBackend().forward(dest, Message(Encoded(body=n).encode(), "q"), lambda message, settlement: None)
    outcomes: list[Settlement] = []
    big = Message(Encoded(body="x" * 2000).encode(), "q")
    StandaloneBackend().forward(dest, big, lambda message, settlement: outcomes.append(settlement))
    assert outcomes[0].outcome is Outcome.REJECTED
    assert (len(dest.queue), dest.ring_dropped) == (5, 0)


@pytest.mark.parametrize("limit_policy", ["ring", "reject"])
def test_a_full_destination_takes_its_expired_messages_out_before_dropping_or_refusing(
    hooks: Hooks, limit_policy: str
) -> None:
    """An expired message is dequeued (SEMANTICS 7): it holds no room. A ring of 3 holding
    A and X (expired before it arrived) and B dropped A, a live message, for C (counted
    ringDropped) and kept X until the next sweep; a full reject destination refused C."""
    import time

    from proton import Message as Encoded

    from qpid_flow.core.standalone import StandaloneBackend

    dest = make(hooks, limit_policy=limit_policy, max_count=3)
    outcomes: dict[str, Outcome] = {}
    for body, expiry in (("A", None), ("X", time.time() - 60), ("B", None), ("C", None)):
        encoded = Encoded(body=body, expiry_time=expiry).encode() if expiry else Encoded(body=body).encode()

        def done(message: Message, settlement: Settlement, body: str = body) -> None:
            outcomes[body] = settlement.outcome

        StandaloneBackend().forward(dest, Message(encoded, "q"), done)
    assert outcomes == dict.fromkeys("AXBC", Outcome.ACCEPTED)
    assert (dest.expired, dest.ring_dropped, dest.depth) == (1, 0, 3)


def test_a_message_arriving_with_a_browser_attached_is_shown_without_a_scan(hooks: Hooks) -> None:
    """An idle QueueBrowser with credit on a deep queue: each new message is shown to it on
    its own, and the waiting ones are not walked again. (Every message that arrived copied
    and walked the whole queue for every browser: 2,000 sends behind 50,000 waiting took
    4.9 s instead of 0.1 s, on the reactor thread every client shares.)"""
    from qpid_flow.core.queues import FifoQueue

    class CountingScans(FifoQueue):
        scans = 0

        def __iter__(self) -> Any:
            CountingScans.scans += 1
            return super().__iter__()

    dest, wire = make(hooks), Wire()
    dest.replace_queue(CountingScans(dest.queue_select))
    for n in range(50):
        dest.enqueue(msg(n))
    browser = Consumer("q", wire.deliver, presettled=True, browser=True)
    dest.add_consumer(browser)
    dest.credit_changed(browser, 1000)
    scans = CountingScans.scans
    for n in range(50, 550):
        dest.enqueue(msg(n))
    assert [m.data for _, m in wire.sent] == [f"m{n}".encode() for n in range(550)]
    assert CountingScans.scans == scans


def test_a_browser_sees_a_message_that_went_back_before_it_had_seen_it(hooks: Hooks) -> None:
    """m1 is out to a consumer when a browser attaches; the consumer releases it and m2
    arrives: the browser sees m1, then m2. (Showing only each new message to a browser,
    m1, back at its older place, was never shown.)"""
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    dest.credit_changed(consumer, 1)
    m1 = msg(1)
    dest.enqueue(m1)
    browser = Consumer("q", wire.deliver, presettled=True, browser=True)
    dest.add_consumer(browser)
    dest.credit_changed(browser, 10)
    dest.settle(consumer, m1, Settlement.released())
    dest.enqueue(msg(2))
    seen = [m.data for c, m in wire.sent if c == browser.id]
    assert seen == [b"m1", b"m2"]


def test_a_message_fetched_from_the_broker_leaves_with_the_backlog_s_average_size(hooks: Hooks) -> None:
    """What qpid-flow's reader fetched is in the broker's encoding, not the one counted in
    at the producer: subtracting its own size let the bytes drift (above zero with the
    queue empty). The backlog's average size leaves instead, and the rest with the last."""
    dest, wire = make(hooks), Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    dest.depth, dest.bytes = 2, 1000  # two messages counted in as they passed on their way in
    for n in range(2):
        fetched = msg(n)  # 2 bytes, as the broker re-encoded them
        fetched.upstream_epoch = 1
        dest.enqueue(fetched, counted=False)
    dest.credit_changed(consumer, 2)
    left = []
    for _, message in list(wire.sent):
        dest.settle(consumer, message, Settlement.accepted())
        left.append((dest.depth, dest.bytes))
    assert left == [(1, 500), (0, 0)]


def test_annotations_merged_into_a_fetched_message_leave_the_bytes_as_they_were(hooks: Hooks) -> None:
    """A message fetched from the broker was never counted in (its bytes leave as the
    backlog's average). A modified outcome's annotations grew it, and that growth was
    counted in bytes: with the queue empty the bytes stayed up, and a destination over
    flow_stop_size stayed stopped for good."""
    destination = make(hooks)
    fetched = msg(1)
    fetched.upstream_epoch = 1
    destination.enqueue(fetched, counted=False)
    assert (destination.depth, destination.bytes) == (0, 0)
    destination.replace_data(fetched, fetched.data + b"\x00" * 200)
    assert destination.bytes == 0
    own = msg(2)
    destination.enqueue(own)
    before = destination.bytes
    destination.replace_data(own, own.data + b"\x00" * 50)
    assert destination.bytes == before + 50  # a message counted in: its bytes follow


def test_a_messages_own_record_comes_before_the_depth_change_it_causes() -> None:
    """The event log numbers events in the order the hooks run: flow_stopped (from
    depth_changed) came before the enqueue that passed the threshold, and flow_resumed
    before the settle that brought the depth back, so a replay saw flow stop at 5 of a
    "> 5" rule."""
    from qpid_flow import hookimpl
    from qpid_flow.testing import make_destination, make_hooks

    order: list[str] = []

    class Recorder:
        @hookimpl
        def qpid_flow_message_enqueued(self, destination: Destination) -> None:
            order.append(f"enqueue {destination.depth}")

        @hookimpl
        def qpid_flow_message_settled(self, destination: Destination) -> None:
            order.append(f"settle {destination.depth}")

        @hookimpl
        def qpid_flow_depth_changed(self, destination: Destination) -> None:
            order.append(f"depth {destination.depth}")

    dest = make_destination("q", hooks=make_hooks(Recorder()))
    wire = Wire()
    consumer = Consumer("q", wire.deliver)
    dest.add_consumer(consumer)
    dest.enqueue(msg(1))
    dest.credit_changed(consumer, 1)
    dest.settle(consumer, wire.sent[0][1], Settlement.accepted())
    assert order == ["enqueue 1", "depth 1", "settle 0", "depth 0"]
    # In front of a broker: a consumer mirrored to the broker's queue settles (linkroute).
    order.clear()
    dest.count_in(msg(2))
    dest.settled_at_broker(msg(2), None, Settlement.accepted())
    dest.settled_at_broker(msg(3), None, Settlement(Outcome.RELEASED))  # it goes back: no depth change
    assert order == ["depth 1", "settle 0", "depth 0", "settle 0"]
