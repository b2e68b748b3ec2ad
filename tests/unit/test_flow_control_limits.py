"""Flow control against its limits: the resume threshold for held transfers, staged
transactions under ``reject``, the router-wide memory limit, and default thresholds."""

from __future__ import annotations

import functools
import operator
from typing import Any

from qpid_flow.config import DestinationPolicy
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Hold, Message, Producer, Reject
from qpid_flow.core.registry import Destinations
from qpid_flow.core.transactions import Transaction
from qpid_flow.plugin.manager import Hooks
from qpid_flow.policies.flow_control.thresholds import flow_limits
from tests.unit.test_flow_plugin import SEED, FakeControl, attach, existing, fill
from tests.unit.test_flow_plugin import setup as flow_rig


def arrive(hooks: Hooks, producer: Producer, registry: Destinations, address: str, size: int = 10) -> Any:
    message = Message(b"x" * size, address, producer.id)
    return hooks.transfer_arrived(producer=producer, message=message, destination=existing(registry, address))


def consume(registry: Destinations, address: str, count: int, memory: MemoryMeter | None = None) -> None:
    """A consumer takes ``count`` messages (the router gives their bytes back to the meter)."""
    destination = existing(registry, address)
    for _ in range(count):
        message = next(iter(destination.queue))
        destination.queue.remove_where(functools.partial(operator.is_, message))
        destination.count_out(message)
        if memory is not None:
            memory.sub(message.size)


# --- 1. held transfers wait for flow to resume, not for the depth to fall to the stop --------


def test_seed_000_a_held_transfer_waits_until_fewer_than_500_remain() -> None:
    """Seed 000 (stop 900 / resume 500): "it remains 'ON' until the total number of enqueued
    messages is less than 500". A held transfer re-asked while ON (another producer
    attaching, a wake) went in as soon as the depth fell back to 900: the depth stayed
    pinned at 901 and flow never had to go below the resume threshold."""
    hooks, registry, _, flow = flow_rig(SEED)
    producer = attach(registry, "orders")
    fill(registry, "orders", 900)
    assert not isinstance(arrive(hooks, producer, registry, "orders"), Hold), "the 901st is admitted"
    fill(registry, "orders", 1)  # 901: ON
    orders = existing(registry, "orders")
    assert flow.qpid_flow_destination_stats(orders)["flowStopped"] is True
    for depth in (900, 600, 500):
        consume(registry, "orders", orders.depth - depth)
        assert orders.depth == depth
        decision = arrive(hooks, producer, registry, "orders")
        assert isinstance(decision, Hold), f"depth {depth}, flow still ON: the held transfer must wait, got {decision}"
    consume(registry, "orders", 1)  # 499: OFF
    assert flow.qpid_flow_destination_stats(orders)["flowStopped"] is False
    assert not isinstance(arrive(hooks, producer, registry, "orders"), Hold)


def test_held_transfers_wait_for_the_byte_resume_threshold() -> None:
    """The reviewer's case: flow_stop_size 1000 / flow_resume_size 500, 100-byte messages.
    While ON nothing more is admitted until the bytes fall below 500."""
    hooks, registry, _, _ = flow_rig({"destinations": {"q": {"flow_stop_size": 1000, "flow_resume_size": 500}}})
    producer = attach(registry, "q")
    fill(registry, "q", 10, size=100)  # 1,000 bytes: still OFF
    assert not isinstance(arrive(hooks, producer, registry, "q", size=100), Hold)  # the crossing one
    fill(registry, "q", 1, size=100)  # 1,100: ON
    admitted = []
    for _step in range(6):  # a consumer takes one per step: 1,000 ... 500 bytes, still ON
        consume(registry, "q", 1)
        decision = arrive(hooks, producer, registry, "q", size=100)
        admitted.append(not isinstance(decision, Hold))
    assert admitted == [False] * 6, f"admitted while flow was ON (bytes >= 500): {admitted}"
    consume(registry, "q", 1)  # 400 bytes: OFF
    assert not isinstance(arrive(hooks, producer, registry, "q", size=100), Hold)


# --- 3. staged transactional transfers count for reject and reject_after --------------------


def test_reject_counts_what_open_transactions_staged() -> None:
    """max_count 100, flow_stop_count 10, limit_policy reject: a transaction of 30 gets
    what a plain producer gets, 11 admitted (the 11th crosses the stop) and 19 rejected
    (all 30 were admitted, and the commit put the depth at 30)."""
    hooks, registry, _, _ = flow_rig(
        {"destinations": {"rej": {"max_count": 100, "flow_stop_count": 10, "limit_policy": "reject"}}}
    )
    rej = existing(registry, "rej")
    producer = attach(registry, "rej")
    txn = Transaction(b"txn-1", "connection-1", None)
    outcomes = []
    for _ in range(30):
        message = Message(b"x" * 10, "rej", producer.id)
        message.txn = txn
        decision = hooks.transfer_arrived(producer=producer, message=message, destination=rej)
        if isinstance(decision, Reject):
            outcomes.append("rejected")
        else:
            txn.stage_transfer(rej, message)  # as the router does with an admitted one
            outcomes.append("staged")
    assert (outcomes.count("staged"), outcomes.count("rejected")) == (11, 19), outcomes
    decision = arrive(hooks, producer, registry, "rej")  # a plain transfer, beside the transaction
    assert isinstance(decision, Reject) and "in open transactions" in decision.description


def test_reject_after_holds_a_transfer_past_the_stop_with_the_staged_ones() -> None:
    hooks, registry, _, _ = flow_rig(
        {"destinations": {"slow": {"reject_after": "2s", "flow_stop_count": 2, "flow_resume_count": 1}}}
    )
    slow = existing(registry, "slow")
    producer = attach(registry, "slow")
    txn = Transaction(b"txn-2", "connection-1", None)
    for _ in range(3):  # 3 staged: one past the stop of 2 (the crossing one)
        message = Message(b"x", "slow", producer.id)
        txn.stage_transfer(slow, message)
    decision = arrive(hooks, producer, registry, "slow")
    assert isinstance(decision, Hold), f"past the stop with 3 staged: must wait, got {decision}"


# --- 2. the router-wide memory limit ---------------------------------------------------------


class Router:
    """What the router does with the plugin's answers, enough for the memory limit: held
    transfers are kept in order with their bytes held (not in use), and asked again in order."""

    def __init__(self, hooks: Hooks, registry: Destinations, control: FakeControl) -> None:
        self.hooks, self.registry, self.memory = hooks, registry, control.memory
        self.held: list[tuple[Producer, Message]] = []
        self.admitted = 0
        control.held_transfers = lambda address: len(self.held)  # type: ignore[method-assign]

    def transfer(self, producer: Producer, size: int) -> None:
        assert producer.address is not None
        message = Message(b"x" * size, producer.address, producer.id)
        destination = existing(self.registry, message.address)
        decision = self.hooks.transfer_arrived(producer=producer, message=message, destination=destination)
        if isinstance(decision, Hold) or self.held:
            self.held.append((producer, message))
            self.memory.hold(size)
        else:
            destination.enqueue(message)
            self.admitted += 1

    def recheck(self) -> None:
        held, self.held = self.held, []
        for index, (producer, message) in enumerate(held):
            destination = existing(self.registry, message.address)
            decision = self.hooks.transfer_arrived(producer=producer, message=message, destination=destination)
            if isinstance(decision, Hold):
                self.held = held[index:] + self.held
                return
            self.memory.unhold(message.size)
            destination.enqueue(message)
            self.admitted += 1


def test_the_memory_limit_is_not_passed_by_a_credit_window() -> None:
    """memory_limit 10240, 1,000-byte messages: a window of 100 sent on a first grant
    (no size known yet) admits 11 (the 11th reaches the limit), the rest wait unforwarded;
    later grants are sized by the room left, and none while it is reached. (All 100 were
    admitted, 100,000 bytes against a limit of 10,240.)"""
    hooks, registry, control, _ = flow_rig({}, limit=10240)
    router = Router(hooks, registry, control)
    producer = attach(registry, "a")
    assert hooks.producer_credit(producer=producer, destination=existing(registry, "a")) == 100  # nothing seen yet
    for _ in range(100):
        router.transfer(producer, 1000)
    assert router.admitted == 11, f"admitted {router.admitted} x 1,000 bytes under a memory_limit of 10,240"
    assert len(router.held) == 89
    assert existing(registry, "a").bytes == 11000
    other = attach(registry, "b")
    assert hooks.producer_credit(producer=other, destination=existing(registry, "b")) == 0


def test_memory_credit_is_sized_by_the_room_left_and_shared() -> None:
    """5,240 bytes of room with 1,000-byte messages: 6 fit (the 6th reaches the limit),
    shared by the two producer links, on any destination."""
    hooks, registry, control, _ = flow_rig({}, limit=10240)
    fill(registry, "a", 5, size=1000)  # 5,000 bytes held, 1,000-byte messages seen
    first, second = attach(registry, "a"), attach(registry, "b")
    for producer in (first, second):
        hooks.producer_attached(producer=producer, destination=existing(registry, producer.address or ""))
    first.credit = hooks.producer_credit(producer=first, destination=existing(registry, "a")) or 0
    assert first.credit == 3
    assert hooks.producer_credit(producer=second, destination=existing(registry, "b")) == 3
    assert control.memory.held == 5000


def test_a_producer_that_never_sends_keeps_no_other_from_the_memory_room() -> None:
    """A link given a full window before any size was known, that never sends: its credit
    was taken from the room, and every other producer got 0 for good, memory empty (a
    review: 100 of 300 messages, then stuck with qpid_flow_memory_bytes 0)."""
    hooks, registry, control, _ = flow_rig({}, limit=50 * 1024)
    idle, busy = attach(registry, "idle"), attach(registry, "work")
    for producer in (idle, busy):
        hooks.producer_attached(producer=producer, destination=existing(registry, producer.address or ""))
    idle.credit = hooks.producer_credit(producer=idle, destination=existing(registry, "idle")) or 0
    assert idle.credit == 100  # nothing seen yet: a full window
    fill(registry, "work", 1, size=1000)
    consume(registry, "work", 1, control.memory)  # memory empty again, 1,000-byte messages seen
    assert hooks.producer_credit(producer=busy, destination=existing(registry, "work")) == 26  # 52 fit, shared by 2


def test_held_transfers_go_in_order_as_memory_frees_even_when_they_alone_are_over_the_limit() -> None:
    """89 held transfers are 89,000 bytes, far over the 10,240 limit by themselves: they
    must not wait for each other. As a consumer frees memory they go in, in order, up to
    the limit again, and each fall below it wakes them."""
    hooks, registry, control, _ = flow_rig({}, limit=10240)
    router = Router(hooks, registry, control)
    producer = attach(registry, "a")
    for _ in range(100):
        router.transfer(producer, 1000)
    first_held = router.held[0][1]
    control.timers.clear()
    consume(registry, "a", 3, control.memory)  # 8,000 bytes queued: room for 3
    assert control.timers, "memory freed below the limit: held transfers are woken"
    router.recheck()
    assert router.admitted == 14 and existing(registry, "a").bytes == 11000
    assert first_held in existing(registry, "a").queue, "in arrival order"
    consume(registry, "a", 11, control.memory)  # drained
    router.recheck()
    assert router.admitted == 25 and len(router.held) == 75


def test_bytes_of_held_transfers_do_not_count_against_the_memory_limit() -> None:
    """Held unforwarded, a transfer's bytes are held but not in use: admitting it moves
    them (unhold, then added where it goes). Counted in use, held transfers that alone
    passed the limit waited for each other for good."""
    meter = MemoryMeter(limit=100)
    heard: list[int] = []
    meter.when_below(lambda: heard.append(meter.in_use))
    meter.add(90)
    meter.hold(500)
    assert (meter.held, meter.in_use, meter.over) == (590, 90, False)
    meter.add(20)
    assert meter.over
    meter.unhold(500)  # dropped: nothing frees what is in use
    assert (meter.held, heard) == (110, [])
    meter.sub(20)
    assert heard == [90]


# --- 4. and 5. default thresholds ------------------------------------------------------------


def test_a_resume_without_a_stop_leaves_the_router_defaults() -> None:
    """docs/configuration.md: "A resume without a stop is ignored with a warning" and a
    dimension with neither threshold gets the router defaults (80 / 70 % of the max). It
    came out as stop 0, no flow control by count: producers filled to the max and were
    rejected."""
    limits, warnings = flow_limits(DestinationPolicy.of(max_count=1000, flow_resume_count=500))
    assert (limits.stop_count, limits.resume_count) == (800, 700), limits
    assert warnings and "flow_resume_count = 500 has no effect" in warnings[0]
    limits, _ = flow_limits(DestinationPolicy.of(max_size=10000, flow_resume_size=5000), 90, 75)
    assert (limits.stop_size, limits.resume_size) == (9000, 7500), "seed 000's 90 / 75 of 10,000 bytes"


def test_a_derived_stop_is_below_the_maximum() -> None:
    """80 % of max_count 2 rounds to 2, and a 100 % default is the max: flow never turned ON
    and the transfer after the max was rejected, though the limit policy is flow. An
    explicit stop at the max is refused; a derived one is capped at max - 1."""
    limits, _ = flow_limits(DestinationPolicy.of(max_count=2))
    assert (limits.stop_count, limits.resume_count) == (1, 1), limits
    limits, _ = flow_limits(DestinationPolicy.of(max_count=10, max_size=1000), 100, 100)
    assert (limits.stop_count, limits.resume_count, limits.stop_size, limits.resume_size) == (9, 9, 999, 999)
    limits, _ = flow_limits(DestinationPolicy.of(max_count=1000), 80, 70)
    assert (limits.stop_count, limits.resume_count) == (800, 700), "seed numbers unchanged"


def test_with_a_100_percent_default_producers_are_held_before_the_max() -> None:
    hooks, registry, _, flow = flow_rig({"default_flow_stop_threshold": 100, "destinations": {"q": {"max_count": 10}}})
    q = existing(registry, "q")
    producer = attach(registry, "q")
    assert hooks.producer_credit(producer=producer, destination=q) == 10, "9 under the stop, the 10th crosses it"
    fill(registry, "q", 10)
    assert flow.qpid_flow_destination_stats(q)["flowStopped"] is True
    assert hooks.producer_credit(producer=producer, destination=q) == 0
    assert isinstance(arrive(hooks, producer, registry, "q"), Hold), "held, not rejected by the max"


def test_the_producers_sharing_the_memory_room_are_counted_out_whatever_became_of_their_destination() -> None:
    """A producer whose destination was deleted before it left (a dynamic target's node,
    gone with the link that made it) was not counted out: each such producer shrank every
    share for good (a review: a lone producer's credit went 51, 26, ... 5)."""
    hooks, registry, control, _ = flow_rig({}, limit=50 * 1024)
    fill(registry, "work", 1, size=1000)
    consume(registry, "work", 1, control.memory)  # memory empty, 1,000-byte messages seen
    for _ in range(10):
        gone = attach(registry, "reply")
        hooks.producer_attached(producer=gone, destination=existing(registry, "reply"))
        hooks.producer_detached(producer=gone, destination=None)  # its node deleted first
    lone = attach(registry, "work")
    hooks.producer_attached(producer=lone, destination=existing(registry, "work"))
    assert hooks.producer_credit(producer=lone, destination=existing(registry, "work")) == 52  # all of 51,200 bytes


def test_anonymous_relay_links_share_the_memory_room_too() -> None:
    """5,240 bytes of room with 1,000-byte messages (6 fit): a named link and a relay link
    get 3 each. Left out of the sharing, each of 20 relay links got the whole room, and 20
    times memory_limit went in."""
    hooks, registry, _control, _ = flow_rig({}, limit=10240)
    fill(registry, "a", 5, size=1000)
    named, relay = attach(registry, "a"), attach(registry, None)
    for producer in (named, relay):
        hooks.producer_attached(producer=producer, destination=registry.find(producer.address or ""))
    assert hooks.producer_credit(producer=relay, destination=None) == 3
    assert hooks.producer_credit(producer=named, destination=existing(registry, "a")) == 3


def test_a_reject_after_transfer_refused_for_memory_leaves_no_clock_behind() -> None:
    """Past memory_limit's bound on held transfers, a reject_after transfer is refused at
    once. Its clock was set first, and the router's refusal left it there for good (+11 MiB
    per 100,000 refused)."""
    hooks, registry, control, flow = flow_rig(
        {"destinations": {"r": {"reject_after": "5s", "flow_stop_count": 1, "flow_resume_count": 1}}}, limit=2000
    )
    producer = attach(registry, "r")
    destination = existing(registry, "r")
    fill(registry, "r", 2, size=10)  # past the stop: full
    hooks.depth_changed(destination=destination)
    control.memory.hold(1500)  # what other held transfers take already
    answer = hooks.transfer_arrived(producer=producer, message=Message(b"x" * 1000, "r"), destination=destination)
    assert isinstance(answer, Reject) and "memory_limit" in answer.description
    assert flow._entry(destination).deadlines == {}
