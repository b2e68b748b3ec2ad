"""The built-in flow-control plugin's answers, without a network."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any, cast

import pytest

from qpid_flow.config import ConfigError, build_config, is_pattern
from qpid_flow.core.dialect import RABBITMQ
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Hold, Message, Outcome, Producer, Reject, Settlement
from qpid_flow.core.registry import Destinations
from qpid_flow.plugin.declarations import AdminRequest
from qpid_flow.plugin.manager import Hooks, build_plugin_manager
from qpid_flow.policies.flow_control.plugin import Plugin as FlowPlugin

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination
    from qpid_flow.plugin.control import RouterControl


class FakeControl:
    registry: Destinations
    hooks: Hooks

    def __init__(self, limit: int = 0) -> None:
        self.memory = MemoryMeter(limit)
        self.woken: list[str | None] = []
        self.timers: list[tuple[float, Any]] = []

    def schedule(self, delay: float, callback: Any) -> None:
        self.timers.append((delay, callback))

    def destination(self, address: str) -> Any:
        return self.registry.find(address)

    def destination_name(self, address: str) -> str:
        # As in front of RabbitMQ: /queue/X names queue X; a pattern stays as written.
        return address if is_pattern(address) else address.removeprefix("/queue/")

    def address_forms(self, name: str) -> tuple[str, ...]:
        return RABBITMQ.address_forms(name)

    def destinations(self) -> Any:
        return iter(self.registry)

    def wake(self, address: str | None = None) -> None:
        self.woken.append(address)

    def held_transfers(self, address: str) -> int:
        return 0

    def delayed_producers(self, address: str) -> int:
        return 0

    def waiting_producers(self, address: str) -> set[int]:
        return set()


def setup(toml: dict[str, Any], limit: int = 0) -> tuple[Hooks, Destinations, FakeControl, FlowPlugin]:
    config = build_config({"producer_window": 100, "default_max_size": 0, **toml})
    pm = build_plugin_manager()
    hooks = Hooks(pm)
    hooks.configure(config=config, manager=pm)
    control = FakeControl(limit)
    registry = Destinations(config, hooks, control.memory)
    control.registry = registry
    control.hooks = hooks
    hooks.started(control=cast("RouterControl", control))
    flow = pm.get_plugin("flow")
    assert isinstance(flow, FlowPlugin)
    return hooks, registry, control, flow


SEED = {"destinations": {"orders": {"max_count": 1000, "flow_stop_count": 900, "flow_resume_count": 500}}}


def attach(registry: Destinations, address: str | None) -> Producer:
    producer = Producer(address)
    if address is not None:
        registry.get(address).producers.add(producer)  # type: ignore[union-attr]
    return producer


def existing(registry: Destinations, name: str) -> Destination:
    destination = registry.get(name)
    assert destination is not None
    return destination


def fill(registry: Destinations, address: str, count: int, size: int = 10) -> None:
    destination = registry.get(address)
    assert destination is not None
    for _ in range(count):
        destination.enqueue(Message(b"x" * size, address))


def test_credit_never_exceeds_the_headroom_across_producers() -> None:
    hooks, registry, _, _ = setup(SEED)
    fill(registry, "orders", 850)
    orders = existing(registry, "orders")
    a, b = attach(registry, "orders"), attach(registry, "orders")
    a.credit = hooks.producer_credit(producer=a, destination=orders) or 0
    b.credit = hooks.producer_credit(producer=b, destination=orders) or 0
    assert a.credit + b.credit == 51  # 850 + 51 = 901: the crossing one is the last


def test_no_credit_while_stopped_and_credit_again_below_resume() -> None:
    hooks, registry, control, _ = setup(SEED)
    fill(registry, "orders", 901)
    orders = existing(registry, "orders")
    assert orders is not None
    producer = attach(registry, "orders")
    assert hooks.producer_credit(producer=producer, destination=orders) == 0
    consumerless = list(orders.queue)
    for message in consumerless[:401]:  # depth 500: still ON
        orders.queue.remove_where(functools.partial(operator.is_, message))
        orders.count_out(message)
    assert hooks.producer_credit(producer=producer, destination=orders) == 0
    message = consumerless[401]
    orders.queue.remove_where(lambda m: m is message)
    orders.count_out(message)  # 499: OFF
    assert control.timers, "resuming schedules a wake-up"
    assert hooks.producer_credit(producer=producer, destination=orders) == 100


def test_anonymous_relay_settlement_waits_while_stopped() -> None:
    hooks, registry, _, _ = setup(SEED)
    fill(registry, "orders", 901)
    orders = existing(registry, "orders")
    anonymous = attach(registry, None)
    accepted = Settlement.accepted()
    message = Message(b"x", "orders")
    assert hooks.settlement_delay(producer=anonymous, message=message, destination=orders, settlement=accepted)
    named = attach(registry, "orders")
    assert not hooks.settlement_delay(producer=named, message=message, destination=orders, settlement=accepted)
    rejected = Settlement(Outcome.REJECTED)
    assert not hooks.settlement_delay(producer=anonymous, message=message, destination=orders, settlement=rejected)


def test_reject_policy_rejects_while_on_and_reject_after_holds_first() -> None:
    hooks, registry, _, _ = setup(
        {
            "destinations": {
                "fast": {"limit_policy": "reject", "flow_stop_count": 2, "flow_resume_count": 1},
                "slow": {"reject_after": "2s", "flow_stop_count": 2, "flow_resume_count": 1},
            }
        }
    )
    for name in ("fast", "slow"):
        fill(registry, name, 3)
    producer = attach(registry, "fast")
    decision = hooks.transfer_arrived(
        producer=producer, message=Message(b"x", "fast"), destination=existing(registry, "fast")
    )
    assert isinstance(decision, Reject) and decision.condition == "amqp:resource-limit-exceeded"
    assert "'fast' is full" in decision.description
    decision = hooks.transfer_arrived(
        producer=producer, message=Message(b"x", "slow"), destination=existing(registry, "slow")
    )
    assert isinstance(decision, Hold)
    # Credit keeps flowing for both: the producer must be able to send to be answered.
    assert hooks.producer_credit(producer=producer, destination=existing(registry, "fast")) == 100


def test_memory_limit_stops_every_producer() -> None:
    hooks, registry, control, _ = setup({}, limit=100)
    producer = attach(registry, "any")
    control.memory.add(100)  # reached: SEMANTICS "when reached, all producer credit stops"
    assert hooks.producer_credit(producer=producer, destination=registry.get("any")) == 0
    assert hooks.producer_credit(producer=attach(registry, None), destination=None) == 0
    control.memory.sub(1)
    assert hooks.producer_credit(producer=producer, destination=registry.get("any")) == 100


def test_operator_stop_and_start_by_pattern() -> None:
    hooks, registry, _, flow = setup({})
    producer = attach(registry, "orders.eu")
    flow.stop_producers("orders.*")
    assert hooks.producer_credit(producer=producer, destination=registry.get("orders.eu")) == 0
    assert registry.get("orders.eu").stats()["producersStopped"] is True  # type: ignore[union-attr]
    assert flow.start_producers("orders.*")
    assert hooks.producer_credit(producer=producer, destination=registry.get("orders.eu")) == 100


def test_statistics_carry_the_flow_fields() -> None:
    _, registry, _, _ = setup(SEED)
    fill(registry, "orders", 901)
    record = registry.get("orders").stats()  # type: ignore[union-attr]
    assert record["flowStopped"] is True and record["flowStoppedCount"] == 1
    assert (record["flowStopCount"], record["flowResumeCount"], record["depth"]) == (900, 500, 901)


def test_with_a_size_threshold_and_no_size_seen_yet_the_first_grant_is_a_full_window() -> None:
    """Issue 16: a client that sends only in its first on_sendable (qpid-interop-test's
    shims) must not get one credit; the size estimate fits a window below the stop size."""
    hooks, registry, _, _ = setup({"destinations": {"big": {"flow_stop_size": "8 KB", "flow_resume_size": "6 KB"}}})
    destination = registry.get("big")
    assert destination is not None
    producer = attach(registry, "big")
    assert hooks.producer_credit(producer=producer, destination=destination) == 100
    producer.credit = 100
    fill(registry, "big", 1, size=4000)  # one message seen: later grants go by its size
    other = attach(registry, "big")
    # (8192 - 4000) // 4000 + 1 = 2 fit; the first producer's 100 outstanding take them all.
    assert hooks.producer_credit(producer=other, destination=destination) == 0


def test_a_producer_leaving_wakes_those_that_went_short() -> None:
    hooks, registry, control, _ = setup({"destinations": {"q": {"flow_stop_count": 1, "flow_resume_count": 1}}})
    destination = existing(registry, "q")
    first, second, third = attach(registry, "q"), attach(registry, "q"), attach(registry, "q")
    first.credit = hooks.producer_credit(producer=first, destination=destination) or 0
    second.credit = hooks.producer_credit(producer=second, destination=destination) or 0
    # Room for 2 (the one that crosses the threshold, too), shared: the third goes short.
    assert (first.credit, second.credit) == (1, 1)
    assert hooks.producer_credit(producer=third, destination=destination) == 0
    destination.producers.discard(first)
    hooks.producer_detached(producer=first, destination=destination)
    assert control.timers, "the producer that went short is asked again"


def test_purge_and_policy_removal_resume_producers() -> None:
    _, registry, control, _ = setup(SEED)
    fill(registry, "orders", 901)
    orders = existing(registry, "orders")
    assert orders is not None and orders.stats()["flowStopped"] is True
    assert orders.purge() == 901
    assert (orders.depth, orders.stats()["flowStopped"]) == (0, False)
    fill(registry, "orders", 901)
    assert orders.stats()["flowStopped"] is True
    registry.remove_policy("orders")  # no thresholds any more: flow control is off
    assert orders.stats()["flowStopped"] is False
    for _delay, callback in control.timers:
        callback()
    assert "orders" in control.woken, "producers are woken"


def test_groups_can_be_switched_on_at_runtime_keeping_the_waiting_messages() -> None:
    from qpid_flow.config import DestinationPolicy
    from qpid_flow.policies.groups.grouped_queue import GroupedQueue

    _, registry, _, _ = setup({})
    fill(registry, "carts", 3)
    carts = registry.get("carts")
    assert carts is not None
    registry.set_policy("carts", DestinationPolicy.of(pattern="carts", shared_groups=True, group_header="JMSXGroupID"))
    assert isinstance(carts.queue, GroupedQueue) and len(carts.queue) == 3
    assert carts.stats()["groupHeader"] == "JMSXGroupID"


def test_the_producers_route_checks_the_pattern_as_the_configuration_does() -> None:
    """POST /v1/producers/stop {"pattern": "a.>.b"}: refused (400 naming ``pattern``), as
    the same pattern in a configuration file is; nothing is stopped."""
    flow = FlowPlugin()
    stop = next(route for route in flow.qpid_flow_admin_routes() if route.path == "/v1/producers/stop")
    with pytest.raises(ConfigError) as caught:
        stop.handler(AdminRequest(params={}, body={"pattern": "a.>.b"}))
    assert caught.value.key == "pattern" and "last segment" in str(caught.value)
    assert flow.stopped_patterns == []
    stop.handler(AdminRequest(params={}, body={"pattern": "orders.>"}))
    assert flow.stopped_patterns == ["orders.>"]


def test_producers_of_one_destination_share_its_headroom() -> None:
    """Two producers, stop 10 (headroom 11): whichever asks first gets its share (6), not
    all of it, and the other is left the rest; the total never passes the headroom."""
    hooks, registry, _, _ = setup({"destinations": {"fair": {"flow_stop_count": 10, "flow_resume_count": 5}}})
    fair = existing(registry, "fair")
    a, b = attach(registry, "fair"), attach(registry, "fair")
    a.credit = hooks.producer_credit(producer=a, destination=fair) or 0
    b.credit = hooks.producer_credit(producer=b, destination=fair) or 0
    assert (a.credit, b.credit) == (6, 5)
    # a used its credit (6 in the depth); asked again first, it still leaves b's share alone.
    fill(registry, "fair", 6)
    a.credit = 0
    assert hooks.producer_credit(producer=a, destination=fair) == 0  # 11 - 6 = 5 left, all b's
    b.credit = 0  # b sent its 5 too: depth 11, flow ON
    fill(registry, "fair", 5)
    assert hooks.producer_credit(producer=b, destination=fair) == 0


def test_a_named_link_sending_past_the_byte_threshold_is_held() -> None:
    """Credit is sized by the largest message seen: messages larger than any before (or a
    stop size lowered at runtime) can reach past the byte threshold on it. The transfer
    that crosses flow_stop_size is admitted, none after it (they were admitted until the
    maximum rejected them, though the destination's limit policy is flow)."""
    hooks, registry, _, flow = setup(
        {"destinations": {"q": {"max_size": 100000, "flow_stop_size": 10000, "flow_resume_size": 5000}}}
    )
    queue = existing(registry, "q")
    named = attach(registry, "q")
    fill(registry, "q", 10, size=100)
    assert (hooks.producer_credit(producer=named, destination=queue) or 0) > 40  # sized by 100-byte messages

    def decision() -> Any:
        return hooks.transfer_arrived(producer=named, message=Message(b"x" * 2000, "q"), destination=queue)

    admitted = 0
    while admitted < 40 and not isinstance(decision(), Hold):
        fill(registry, "q", 1, size=2000)
        admitted += 1
    assert admitted == 5  # 1,000 + 4 x 2,000 = 9,000 bytes; the 5th crosses 10,000
    assert queue.bytes == 11000 and flow.qpid_flow_destination_stats(queue)["flowStopped"] is True


def test_a_lone_producer_gets_the_whole_headroom() -> None:
    hooks, registry, _, _ = setup({"destinations": {"solo": {"flow_stop_count": 10, "flow_resume_count": 5}}})
    solo = existing(registry, "solo")
    producer = attach(registry, "solo")
    assert hooks.producer_credit(producer=producer, destination=solo) == 11


def test_a_named_link_sending_past_the_bound_on_old_credit_is_held() -> None:
    """Credit granted before a tightening (or an operator stop) cannot be taken back: what
    a named link sends past stop + 1 is held; an anonymous-relay transfer is not (its
    settlement waits instead), and nothing is held while there is room (the pass-through policy admits)."""
    hooks, registry, _, flow = setup({"destinations": {"q": {"flow_stop_count": 10, "flow_resume_count": 5}}})
    queue = existing(registry, "q")
    named, anonymous = attach(registry, "q"), attach(registry, None)

    def decision(producer: Producer) -> Any:
        return hooks.transfer_arrived(producer=producer, message=Message(b"m", "q"), destination=queue)

    fill(registry, "q", 10)
    assert not isinstance(decision(named), Hold)  # the 11th crosses the threshold: the last one admitted
    fill(registry, "q", 1)
    assert isinstance(decision(named), Hold)
    assert not isinstance(decision(anonymous), Hold)
    queue.purge()
    assert not isinstance(decision(named), Hold)
    flow.stop_producers("q")
    assert isinstance(decision(named), Hold)


def test_an_operator_stop_holds_the_producers_of_a_ring_destination_too() -> None:
    """seed 004's "stop all producers", on the README's own ``PRICES.>`` ring example: what a
    named link sends on credit it already had waits, and an anonymous-relay transfer's
    settlement is held, as on a flow destination. (Ring destinations were let through:
    ``producersStopped: true`` while messages kept arriving and older ones were dropped.)"""
    hooks, registry, _, flow = setup({"destinations": {"PRICES.>": {"max_count": 10, "limit_policy": "ring"}}})
    named, anonymous = attach(registry, "PRICES.IBM"), attach(registry, None)
    ring = registry.get("PRICES.IBM")
    assert ring is not None
    flow.stop_producers("PRICES.>")
    arrived = hooks.transfer_arrived(producer=named, message=Message(b"m", "PRICES.IBM"), destination=ring)
    assert isinstance(arrived, Hold)
    delayed = hooks.settlement_delay(
        producer=anonymous, message=Message(b"m", "PRICES.IBM"), destination=ring, settlement=Settlement.accepted()
    )
    assert delayed is True
    assert flow.start_producers("PRICES.>")
    arrived = hooks.transfer_arrived(producer=named, message=Message(b"m", "PRICES.IBM"), destination=ring)
    assert not isinstance(arrived, Hold)
    assert not hooks.settlement_delay(
        producer=anonymous, message=Message(b"m", "PRICES.IBM"), destination=ring, settlement=Settlement.accepted()
    )


def test_a_stop_of_the_address_a_producer_wrote_refuses_on_a_reject_destination() -> None:
    """RabbitMQ routes a message sent to /queue to the queue its subject names: a stop of
    /queue stops those producers as a stop of the queue would. On a reject destination the
    transfer is refused, as there (its settlement was held instead, with no outcome until
    an operator started /queue again)."""
    hooks, registry, _, flow = setup({"destinations": {"q": {"limit_policy": "reject"}}})
    relay = attach(registry, None)
    queue = registry.get("q")
    assert queue is not None
    flow.stop_producers("/queue")
    message = Message(b"m", "q")
    message.routed_from = "/queue"
    arrived = hooks.transfer_arrived(producer=relay, message=message, destination=queue)
    assert isinstance(arrived, Reject)
    assert arrived.description == "producers of '/queue' are stopped by an operator"
    assert not isinstance(hooks.transfer_arrived(producer=relay, message=Message(b"m", "q"), destination=queue), Reject)
    flow.start_producers("/queue")
    assert not isinstance(hooks.transfer_arrived(producer=relay, message=message, destination=queue), Reject)


def test_a_start_that_undoes_no_stop_is_refused_naming_the_stops_in_force() -> None:
    """``producers start PRICES.IBM`` after ``producers stop 'PRICES.>'`` starts nothing (the
    pattern still holds it): a KeyError (404 at the admin endpoint, exit 2 from the CLI)
    naming the stops in force, not a 200 the operator reads as done."""
    flow = FlowPlugin()
    routes = {route.path: route for route in flow.qpid_flow_admin_routes()}
    routes["/v1/producers/stop"].handler(AdminRequest(params={}, body={"pattern": "PRICES.>"}))
    with pytest.raises(KeyError) as caught:
        routes["/v1/producers/start"].handler(AdminRequest(params={}, body={"pattern": "PRICES.IBM"}))
    assert "PRICES.>" in str(caught.value)
    assert flow.stopped_patterns == ["PRICES.>"]
    answer = routes["/v1/producers/start"].handler(AdminRequest(params={}, body={"pattern": "PRICES.>"}))
    assert answer["stopped"] == []


def test_before_any_message_is_seen_every_producer_link_gets_a_full_window() -> None:
    """An application opens three senders to a new address and sends on the third first:
    it has credit. (The first message's size was guessed to fit one window below the
    default 80 MB stop size, which capped all the links together at one window: the
    third got none, and with nobody else sending the depth never changed to ask again.)"""
    hooks, registry, _, _ = setup({"default_max_size": "100 MB"})
    fresh = existing(registry, "fresh")
    grants = []
    for _ in range(3):
        producer = attach(registry, "fresh")
        producer.credit = hooks.producer_credit(producer=producer, destination=fresh) or 0
        grants.append(producer.credit)
    assert grants == [100, 100, 100]


def test_an_operator_stop_given_as_a_rabbitmq_address_stops_the_destination() -> None:
    """In front of RabbitMQ, ``producers stop /queue/rs`` names queue ``rs``. (The pattern
    was matched against destination names as given: it matched none, the stop answered
    200 with no destination, and producers to /queue/rs kept sending.)"""
    hooks, registry, control, flow = setup({})
    flow.qpid_flow_started(control=cast("RouterControl", control))
    producer = attach(registry, "rs")
    stop = next(route for route in flow.qpid_flow_admin_routes() if route.path == "/v1/producers/stop")
    stop.handler(AdminRequest(params={}, body={"pattern": "/queue/rs"}))
    assert flow.stopped_patterns == ["rs"]
    assert hooks.producer_credit(producer=producer, destination=registry.get("rs")) == 0


@pytest.mark.parametrize(
    ("pattern", "held", "free"),
    [
        # A pattern in the queue form names queues only (it was mapped to ">" and "*",
        # which held topic and exchange producers too).
        ("/queue/>", ["rs", "a.b"], ["/topic/a.b", "/exchange/amq.topic/a.b"]),
        ("/queue/*", ["rs"], ["a.b", "/topic/k"]),
        ("/amq/queue/a.*", ["a.b"], ["rs", "/topic/a.b"]),
        # "/" separates segments as "." does: every topic, or every exchange, address.
        ("/topic/>", ["/topic/a.b", "/topic/k"], ["rs", "/exchange/amq.topic/a.b"]),
        ("/exchange/>", ["/exchange/amq.topic/a.b"], ["rs", "/topic/k"]),
        (">", ["rs", "/topic/k", "/exchange/amq.topic/a.b"], []),
    ],
)
def test_an_operator_stop_pattern_names_the_address_forms_it_is_written_in(
    pattern: str, held: list[str], free: list[str]
) -> None:
    hooks, registry, control, flow = setup({})
    flow.qpid_flow_started(control=cast("RouterControl", control))
    producers = {address: attach(registry, address) for address in held + free}
    stop = next(route for route in flow.qpid_flow_admin_routes() if route.path == "/v1/producers/stop")
    answer = stop.handler(AdminRequest(params={}, body={"pattern": pattern}))
    assert answer["pattern"] == pattern
    assert sorted(answer["destinations"]) == sorted(held)
    for address, producer in producers.items():
        credit = hooks.producer_credit(producer=producer, destination=registry.get(address))
        assert (credit == 0) == (address in held), address
