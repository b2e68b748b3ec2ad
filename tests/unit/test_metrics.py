"""The Prometheus collector alone: names, types, and destinations past the cardinality limit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from qpid_flow.admin.http import AdminServer
from qpid_flow.admin.metrics import (
    METRICS,
    OTHER,
    DeletionHandover,
    RouterCollector,
    Snapshot,
    reference_table,
    registry_for,
)
from qpid_flow.admin.operations import Operations
from qpid_flow.config import build_config
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Message
from qpid_flow.core.registry import Destinations
from qpid_flow.plugin.manager import Hooks, build_plugin_manager

T = TypeVar("T")


def _snapshot(destinations: list[dict[str, Any]]) -> Snapshot:
    return Snapshot(
        version="1.2.3",
        proton="0.40.0",
        python="3.11.7",
        ready=True,
        connections=2,
        sessions=3,
        links_in=4,
        links_out=5,
        upstream={"open": 2},
        messages_in=100,
        messages_out=90,
        memory_bytes=1000,
        memory_limit=5000,
        memory_waiting=0,
        memory_over=False,
        destinations=destinations,
        plugin_errors={"qpid_flow_producer_credit": 2},
    )


def _record(name: str, depth: int, **extra: Any) -> dict[str, Any]:
    """A configured destination's record (its policy: its own name), unless ``policy`` says otherwise."""
    return {
        "name": name,
        "policy": name,
        "depth": depth,
        "bytes": depth * 10,
        "maxCount": 1000,
        "flowStopped": depth > 900,
        **extra,
    }


def _samples(destinations: list[dict[str, Any]], limit: int = 500) -> dict[tuple[str, tuple[Any, ...]], float]:
    registry = registry_for(RouterCollector(lambda _acknowledged: _snapshot(destinations), limit))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _enqueued_by_destination(registry: Any) -> dict[str, float]:
    """qpid_flow_destination_messages_enqueued_total of a scrape, by destination label."""
    return {
        sample.labels["destination"]: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name == "qpid_flow_destination_messages_enqueued_total"
    }


def test_router_metrics() -> None:
    samples = _samples([])
    assert samples[("qpid_flow_build_info", (("proton", "0.40.0"), ("python", "3.11.7"), ("version", "1.2.3")))] == 1
    assert samples[("qpid_flow_links", (("direction", "out"),))] == 5
    assert samples[("qpid_flow_upstream_connections", (("state", "open"),))] == 2
    assert samples[("qpid_flow_upstream_connections", (("state", "closed"),))] == 0
    assert samples[("qpid_flow_messages_out_total", ())] == 90
    assert samples[("qpid_flow_memory_limit_bytes", ())] == 5000
    assert samples[("qpid_flow_plugin_errors_total", (("hook", "qpid_flow_producer_credit"),))] == 2
    assert ("process_resident_memory_bytes", ()) in samples


def test_a_key_a_destination_does_not_have_is_left_out() -> None:
    samples = _samples([_record("plain", 3)])
    assert samples[("qpid_flow_destination_depth_messages", (("destination", "plain"),))] == 3
    assert ("qpid_flow_destination_groups", (("destination", "plain"),)) not in samples


def test_destinations_past_the_limit_are_summed_under_other() -> None:
    records = [_record(f"q{n}", depth) for n, depth in enumerate([5, 950, 1, 7, 920])]
    samples = _samples(records, limit=2)
    depth = {
        labels[0][1]: value
        for (name, labels), value in samples.items()
        if name == "qpid_flow_destination_depth_messages"
    }
    # the two deepest keep their names; the other three are summed
    assert depth == {"q1": 950, "q4": 920, OTHER: 13}
    assert samples[("qpid_flow_destination_max_messages", (("destination", OTHER),))] == 1000  # max, not sum
    assert samples[("qpid_flow_metrics_destinations_aggregated", ())] == 3
    assert samples[("qpid_flow_destinations", ())] == 5


def test_names_follow_prometheus_conventions() -> None:
    for spec in METRICS:
        assert spec.name.startswith("qpid_flow_"), spec.name
        assert not spec.name.endswith("_total"), f"{spec.name}: the library adds _total to counters"
        assert spec.kind in ("counter", "gauge", "info")
        if spec.labels == ("destination",):
            assert spec.key is not None
    names = [(spec.name, spec.kind) for spec in METRICS]
    assert len(names) == len(set(names))


def test_the_operations_guide_lists_every_metric_as_the_code_defines_it() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    start, end = "<!-- metrics-reference:start -->\n", "\n<!-- metrics-reference:end -->"
    documented = guide[guide.index(start) + len(start) : guide.index(end)]
    assert documented == reference_table(), "regenerate it: python -m qpid_flow.admin.metrics"


def test_a_destination_keeps_its_label_and_other_s_counters_never_go_down() -> None:
    """With room for one name: B, deepest when first seen, keeps its own series; A, named
    _other then, stays there when it gets deeper, and when A goes _other keeps what it had
    counted. (Labels went to the deepest at each scrape: A's 100 enqueued moved out of
    _other and B's 3 in, and _other's counter went from 100 to 3, a reset to Prometheus.)"""
    from qpid_flow.admin.metrics import RouterCollector

    records: list[dict[str, Any]] = []
    collector = RouterCollector(lambda _acknowledged: _snapshot(records), 1)
    registry = registry_for(collector)

    def enqueued() -> dict[str, float]:
        return _enqueued_by_destination(registry)

    records[:] = [{**_record("B", 5), "enqueued": 3}, {**_record("A", 1), "enqueued": 100}]
    assert enqueued() == {"B": 3, OTHER: 100}
    records[:] = [{**_record("B", 0), "enqueued": 3}, {**_record("A", 900), "enqueued": 120}]
    assert enqueued() == {"B": 3, OTHER: 120}
    records[:] = [{**_record("B", 0), "enqueued": 3}]
    assert enqueued() == {"B": 3, OTHER: 120}


def test_other_s_counters_keep_a_destination_made_again_under_its_name() -> None:
    """A destination summed under _other is deleted and made again between two scrapes
    (an auto-created name forgotten when idle, then used again): its counters start from
    0, and _other keeps what the first one counted. (_other went from 1000 to 1.)"""
    from qpid_flow.admin.metrics import RouterCollector

    records: list[dict[str, Any]] = []
    registry = registry_for(RouterCollector(lambda _acknowledged: _snapshot(records), 1))

    def other_enqueued() -> float:
        return _enqueued_by_destination(registry)[OTHER]

    records[:] = [{**_record("B", 5), "enqueued": 3}, {**_record("A", 1), "enqueued": 1000}]
    assert other_enqueued() == 1000
    records[:] = [{**_record("B", 5), "enqueued": 3}, {**_record("A", 1), "enqueued": 1}]
    assert other_enqueued() == 1001


def test_a_deleted_destination_s_final_counts_go_to_other_only_if_it_was_summed_there() -> None:
    """Deleted between two scrapes: A (summed under _other) adds what it counted since it
    was last seen; B (its own label) ends its own series and adds nothing to _other; C,
    never scraped, adds all it counted."""
    snapshots: list[Snapshot] = []
    registry = registry_for(RouterCollector(lambda _acknowledged: snapshots.pop(0), 1))

    def enqueued() -> dict[str, float]:
        return _enqueued_by_destination(registry)

    snapshots.append(_snapshot([{**_record("B", 5), "enqueued": 30}, {**_record("A", 1), "enqueued": 100}]))
    assert enqueued() == {"B": 30, OTHER: 100}
    gone = _snapshot([])
    gone.deleted = {"A": {"enqueued": 140.0}, "B": {"enqueued": 35.0}}
    gone.deleted_unlisted = {"enqueued": 7.0}
    snapshots.append(gone)
    assert enqueued() == {OTHER: 147}


def test_every_hook_has_a_plugin_errors_series_from_the_first_scrape() -> None:
    """At 0 until its first error: a series that first appears at 1 is no increase to
    Prometheus, and the documented alert (increase(...[5m]) > 0) missed each hook's first
    plugin error."""
    samples = _samples([])
    errors = {
        labels[0][1]: value for (name, labels), value in samples.items() if name == "qpid_flow_plugin_errors_total"
    }
    assert errors["qpid_flow_producer_credit"] == 2  # the snapshot's one error
    assert errors["qpid_flow_message_enqueued"] == 0
    assert errors["qpid_flow_transfer_arrived"] == 0
    assert len(errors) >= 20


def test_a_scrape_that_times_out_loses_no_deleted_destination_s_counts() -> None:
    """A scrape gives up waiting for its snapshot (ReactorBridge.call's timeout, the
    reactor thread busy: a 503), and the snapshot is taken later anyway, read by nobody.
    The deleted destinations' final counts it took went with it: _other lost them for good
    (enqueued 5, not 11, while the router-wide total said 11). "summed", scraped once, is
    deleted before that scrape; "unseen", listed only by the unread snapshot, after it.
    The next scrape has both, and no later scrape counts them again."""
    destinations = Destinations(
        build_config({"destinations": {"keeper": {"max_count": 100}}}), Hooks(build_plugin_manager())
    )
    destinations.create_configured()
    router = SimpleNamespace(connections=[], backend=None)
    operations = Operations(destinations, cast(Any, SimpleNamespace(memory=MemoryMeter())), cast(Any, router))
    timing_out = False

    def run_in_reactor(callback: Callable[[], T]) -> T:
        result = callback()  # the reactor thread takes the snapshot, whether anyone waits or not
        if timing_out:
            raise TimeoutError
        return result

    admin = AdminServer("127.0.0.1:0", operations, run_in_reactor, metrics_max_destinations=1)

    def enqueued() -> tuple[float, float]:
        """_other's enqueued, and the router-wide messages in."""
        samples = {
            (sample.name, sample.labels.get("destination")): sample.value
            for family in text_string_to_metric_families(admin.metrics().body.decode())
            for sample in family.samples
        }
        other = samples.get(("qpid_flow_destination_messages_enqueued_total", OTHER), 0.0)
        return other, samples[("qpid_flow_messages_in_total", None)]

    def count_in(name: str, messages: int) -> None:
        destination = destinations.get(name)
        assert destination is not None
        for _ in range(messages):
            destination.count_in(Message(b"m", name))

    def delete(name: str) -> None:
        destination = destinations.find(name)
        assert destination is not None
        destinations.delete(destination)

    def scrape_timing_out() -> None:
        nonlocal timing_out
        timing_out = True
        with pytest.raises(TimeoutError):
            admin.metrics()
        timing_out = False

    assert enqueued() == (0, 0)  # keeper has the one label
    count_in("summed", 5)
    assert enqueued() == (5, 5)
    count_in("summed", 3)
    delete("summed")
    count_in("unseen", 2)
    scrape_timing_out()
    count_in("unseen", 1)
    delete("unseen")
    assert enqueued() == (11, 11)
    assert enqueued() == (11, 11)
    scrape_timing_out()  # after one that was read: nothing of it to send again
    assert enqueued() == (11, 11)


def test_deletions_nobody_read_stay_one_per_name_the_collector_knows() -> None:
    """While every scrape times out, names come and go: those the collector never saw are
    summed (nothing grows per name); one it knows keeps its name, counted once."""
    handover = DeletionHandover()
    acknowledged = handover.pass_on(_snapshot([_record("A", 1)]), 0).generation  # the collector split it
    gone = _snapshot([_record("n0", 1)])
    gone.deleted = {"A": {"enqueued": 4.0}}
    handover.pass_on(gone, acknowledged)
    for i in range(1, 100):
        unread = _snapshot([_record(f"n{i}", 1)])
        unread.deleted = {f"n{i - 1}": {"enqueued": 1.0}}  # listed by the last snapshot, unread
        handover.pass_on(unread, acknowledged)
    last = handover.pass_on(_snapshot([]), acknowledged)
    assert last.deleted == {"A": {"enqueued": 4.0}}
    assert last.deleted_unlisted == {"enqueued": 99.0}
    assert handover.pass_on(_snapshot([]), last.generation).deleted == {}


def test_names_clients_make_get_series_only_once_a_second_scrape_finds_them() -> None:
    """Reply queues and one-off addresses made series of their own in every scrape that
    caught them (8,439 series over 20 scrapes of request/response traffic, each scrape
    under the limit): Prometheus keeps each for hours. Now a temporary queue is summed
    under _other for good, and an auto-created name until a second scrape finds it, when
    _other keeps what it had counted."""
    records: list[dict[str, Any]] = []
    registry = registry_for(RouterCollector(lambda _acknowledged: _snapshot(records), 500))
    reply = "qpid-flow.temporary.0a1b"
    records[:] = [
        {**_record("orders", 1), "enqueued": 1},
        {**_record("one-off", 1, policy="*"), "enqueued": 2},
        {**_record(reply, 1, policy="*"), "enqueued": 4},
    ]
    assert _enqueued_by_destination(registry) == {"orders": 1, OTHER: 6}
    records[:] = [
        {**_record("orders", 1), "enqueued": 1},
        {**_record("one-off", 1, policy="*"), "enqueued": 3},
        {**_record(reply, 1, policy="*"), "enqueued": 5},
    ]
    assert _enqueued_by_destination(registry) == {"orders": 1, "one-off": 3, OTHER: 8}
    records[:] = [{**_record("orders", 1), "enqueued": 1}, {**_record("one-off", 1, policy="*"), "enqueued": 9}]
    assert _enqueued_by_destination(registry) == {"orders": 1, "one-off": 9, OTHER: 8}


def test_a_name_gone_before_a_second_scrape_never_gets_a_series() -> None:
    records: list[dict[str, Any]] = []
    registry = registry_for(RouterCollector(lambda _acknowledged: _snapshot(records), 500))
    for n in range(5):
        records[:] = [{**_record(f"reply-{n}", 0, policy="*"), "enqueued": 1}]
        seen = _enqueued_by_destination(registry)
        assert set(seen) == {OTHER}
    assert seen[OTHER] == 5
