"""The destination registry's lifecycle: temporary destinations, forgetting unused ones."""

from __future__ import annotations

import gc
import tracemalloc

from qpid_flow import hookimpl
from qpid_flow.config import build_config
from qpid_flow.core.destination import Destination
from qpid_flow.core.model import Message, Producer
from qpid_flow.core.registry import TEMPORARY_PREFIX, Destinations
from qpid_flow.plugin.manager import Hooks, build_plugin_manager


def registry(**settings: object) -> Destinations:
    config = build_config({"destinations": {"configured": {"max_count": 10}}, **settings})
    destinations = Destinations(config, Hooks(build_plugin_manager()))
    destinations.create_configured()
    return destinations


def test_temporary_destinations_exist_whatever_auto_create_says_and_go_when_deleted() -> None:
    destinations = registry(auto_create=False)
    assert destinations.get("anything") is None
    temporary = destinations.create_temporary()
    assert temporary.address.startswith(TEMPORARY_PREFIX) and temporary.temporary
    assert destinations.get(temporary.address) is temporary  # producers find it
    temporary.enqueue(Message(b"reply", temporary.address))
    assert destinations.delete(temporary) == 1
    assert destinations.find(temporary.address) is None
    assert temporary.depth == 0


def test_unused_auto_created_destinations_are_forgotten_after_the_timeout() -> None:
    destinations = registry()
    idle, busy, waiting = (destinations.get(name) for name in ("idle", "busy", "waiting"))
    assert idle is not None and busy is not None and waiting is not None
    busy.producers.add(Producer("busy"))
    waiting.enqueue(Message(b"m", "waiting"))
    assert destinations.forget_idle(now=100.0, idle_timeout=60) == 0  # idle from now on
    assert destinations.forget_idle(now=159.0, idle_timeout=60) == 0
    assert destinations.forget_idle(now=160.0, idle_timeout=60) == 1
    assert [d.address for d in destinations] == ["configured", "busy", "waiting"]
    # Used again before the timeout: the clock starts over.
    again = destinations.get("idle")
    assert again is not None and again is not idle
    destinations.forget_idle(now=200.0, idle_timeout=60)
    again.producers.add(Producer("idle"))
    destinations.forget_idle(now=250.0, idle_timeout=60)
    again.producers.clear()
    assert destinations.forget_idle(now=300.0, idle_timeout=60) == 0
    assert destinations.forget_idle(now=360.0, idle_timeout=60) == 1


def test_a_destination_the_router_still_has_work_for_is_not_forgotten() -> None:
    """Transfers held for an address, or settlements waiting on it, keep its destination
    (the router says which: ``busy``), however long it has been otherwise unused."""
    destinations = registry()
    held_for, free = destinations.get("held-for"), destinations.get("free")
    assert held_for is not None and free is not None
    waiting_on = {"held-for"}
    destinations.forget_idle(now=0.0, idle_timeout=1, busy=waiting_on.__contains__)
    assert destinations.forget_idle(now=5.0, idle_timeout=1, busy=waiting_on.__contains__) == 1
    assert [d.address for d in destinations] == ["configured", "held-for"]
    waiting_on.clear()  # the transfer was settled: the clock starts now
    assert destinations.forget_idle(now=6.0, idle_timeout=1, busy=waiting_on.__contains__) == 0
    assert destinations.forget_idle(now=7.0, idle_timeout=1, busy=waiting_on.__contains__) == 1


def test_memory_stays_flat_under_a_stream_of_one_off_names() -> None:
    """Issue 16: 100,000 reply addresses used once each must not stay for the life of the process."""
    destinations = registry()

    def use_names(start: int) -> None:
        for n in range(start, start + 100_000):
            destination = destinations.get(f"reply.{n}")
            assert destination is not None
            destination.enqueue(Message(b"x", destination.address))
            destination.purge()

    use_names(0)
    destinations.forget_idle(now=0.0, idle_timeout=1)
    destinations.forget_idle(now=2.0, idle_timeout=1)
    gc.collect()
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    use_names(100_000)
    destinations.forget_idle(now=10.0, idle_timeout=1)
    destinations.forget_idle(now=12.0, idle_timeout=1)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    assert len(destinations) == 1  # only the configured one is left
    assert grown < 1_000_000, f"{grown} bytes kept after forgetting 100,000 destinations"


def test_a_pattern_set_or_removed_changes_only_the_destinations_whose_policy_in_force_changes() -> None:
    """A policy of its own rules X.a: putting or removing X.> leaves it as it was, and
    it is not reported changed (the logs, the event log and plugins were told it was)."""
    told: list[str] = []

    class Listener:
        @hookimpl
        def qpid_flow_destination_policy_changed(self, destination: Destination) -> None:
            told.append(destination.address)

    pm = build_plugin_manager()
    pm.register(Listener())
    destinations = Destinations(build_config({}), Hooks(pm))
    exact = destinations.parse_policy("X.a", {"flow_stop_count": 100})
    destinations.set_policy("X.a", exact)
    a, b = destinations.get("X.a"), destinations.get("X.b")
    assert a is not None and b is not None
    told.clear()
    changed = destinations.set_policy("X.>", destinations.parse_policy("X.>", {"flow_stop_count": 10}))
    assert [d.address for d in changed] == told == ["X.b"]
    assert (a.policy.setting("flow_stop_count"), b.policy.setting("flow_stop_count")) == (100, 10)
    told.clear()
    assert [d.address for d in destinations.remove_policy("X.>")] == told == ["X.b"]
