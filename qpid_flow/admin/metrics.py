"""Prometheus metrics, read at scrape time (``GET /metrics`` on the admin endpoint).

Nothing here runs per message: the data path keeps the counters it keeps anyway
(``Destination.enqueued_total``, ``delivered_total``, ...), and a scrape asks the reactor
thread for one :class:`Snapshot` of them (plain values, no Proton object), from which
:class:`RouterCollector` builds the metric families with ``prometheus_client``.

Cardinality: destinations come and go with client-chosen names (reply queues, one-off
names). Up to ``max_destinations`` (``metrics_max_destinations``) destinations keep their
own ``destination`` label (decided when each is first seen, :class:`_Labels`) and the rest
are summed under ``destination="_other"``; ``qpid_flow_metrics_destinations_aggregated``
says how many were.

``METRICS`` is the reference: name, type, help and labels of every family, from which
docs/operations.md's table is generated (and checked by a test).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from qpid_flow.core.registry import TEMPORARY_PREFIX
from qpid_flow.plugin import hookspecs

__all__ = [
    "METRICS",
    "OTHER",
    "DeletionHandover",
    "MetricSpec",
    "RouterCollector",
    "Snapshot",
    "add_counters",
    "counter_values",
    "registry_for",
]

# The label value destinations past the cardinality limit share.
OTHER = "_other"


@dataclass(frozen=True)
class MetricSpec:
    name: str  # without the _total a counter gets on exposition
    kind: str  # "counter", "gauge" or "info"
    help: str
    labels: tuple[str, ...] = ()
    # For per-destination families: the key of the destination's stat record it reads, and
    # how it aggregates under "_other" ("sum" or "max").
    key: str | None = None
    combine: str = "sum"


_D = ("destination",)

# Per destination: read from the destination's stat record (Destination.stats plus what
# plugins add: the flow-control plugin's thresholds and state, the groups plugin's groups).
DESTINATION_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "qpid_flow_destination_depth_messages",
        "gauge",
        "Messages admitted and not yet dequeued (waiting and unsettled).",
        _D,
        "depth",
    ),
    MetricSpec("qpid_flow_destination_depth_bytes", "gauge", "Bytes of the messages in depth.", _D, "bytes"),
    MetricSpec(
        "qpid_flow_destination_max_messages",
        "gauge",
        "The destination's max_count (0: unbounded).",
        _D,
        "maxCount",
        "max",
    ),
    MetricSpec(
        "qpid_flow_destination_max_bytes",
        "gauge",
        "The destination's max_size in bytes (0: unbounded).",
        _D,
        "maxSize",
        "max",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_stop_messages",
        "gauge",
        "Depth in messages at which producer flow stops (0: none).",
        _D,
        "flowStopCount",
        "max",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_resume_messages",
        "gauge",
        "Depth in messages at which stopped flow resumes (0: none).",
        _D,
        "flowResumeCount",
        "max",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_stop_bytes",
        "gauge",
        "Depth in bytes at which producer flow stops (0: none).",
        _D,
        "flowStopSize",
        "max",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_resume_bytes",
        "gauge",
        "Depth in bytes at which stopped flow resumes (0: none).",
        _D,
        "flowResumeSize",
        "max",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_stopped",
        "gauge",
        "1 while producer flow is stopped (flowStopped), else 0; under _other, how many are.",
        _D,
        "flowStopped",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_stops",
        "counter",
        "Times producer flow stopped (flowStoppedCount).",
        _D,
        "flowStoppedCount",
    ),
    MetricSpec(
        "qpid_flow_destination_flow_stopped_seconds",
        "counter",
        "Seconds spent with producer flow stopped.",
        _D,
        "flowStoppedSeconds",
    ),
    MetricSpec("qpid_flow_destination_producers", "gauge", "Producer links attached.", _D, "producers"),
    MetricSpec(
        "qpid_flow_destination_producers_blocked",
        "gauge",
        "Producers held by flow control (no credit, a transfer held unforwarded, or an outcome held back; "
        "anonymous-relay links included).",
        _D,
        "producersBlocked",
    ),
    MetricSpec("qpid_flow_destination_consumers", "gauge", "Consumer links attached.", _D, "consumers"),
    MetricSpec(
        "qpid_flow_destination_groups",
        "gauge",
        "Message groups owned or waiting (shared-groups destinations).",
        _D,
        "groups",
    ),
    MetricSpec(
        "qpid_flow_destination_messages_enqueued", "counter", "Messages admitted to the destination.", _D, "enqueued"
    ),
    MetricSpec(
        "qpid_flow_destination_messages_delivered",
        "counter",
        "Messages handed to consumers (redeliveries included).",
        _D,
        "delivered",
    ),
    MetricSpec(
        "qpid_flow_destination_messages_acknowledged",
        "counter",
        "Deliveries settled accepted (pre-settled ones included).",
        _D,
        "acknowledged",
    ),
    MetricSpec("qpid_flow_destination_messages_rejected", "counter", "Deliveries settled rejected.", _D, "rejected"),
    MetricSpec(
        "qpid_flow_destination_messages_released",
        "counter",
        "Deliveries released or modified (the message goes back, unless undeliverable-here).",
        _D,
        "released",
    ),
    MetricSpec(
        "qpid_flow_destination_messages_expired",
        "counter",
        "Messages dropped because their time to live ran out.",
        _D,
        "expired",
    ),
    MetricSpec(
        "qpid_flow_destination_messages_refused",
        "counter",
        "Producers' transfers rejected: by a policy, a full destination, a message that cannot be decoded, "
        "or the broker.",
        _D,
        "refused",
    ),
    MetricSpec(
        "qpid_flow_destination_messages_ring_dropped",
        "counter",
        "Messages dropped to make room on a ring destination.",
        _D,
        "ringDropped",
    ),
)
# The per-destination counters: what _other keeps of the destinations gone from it.
_COUNTER_KEYS = tuple(spec.key for spec in DESTINATION_METRICS if spec.kind == "counter" and spec.key is not None)


_HOOKS = frozenset(hookspecs.hook_names())


def counter_values(record: dict[str, Any]) -> dict[str, float]:
    """The per-destination counters of a stat record (``Destination.stats``)."""
    return {key: _number(record[key]) for key in _COUNTER_KEYS if key in record}


def add_counters(into: dict[str, float], counters: dict[str, float]) -> None:
    for key, value in counters.items():
        into[key] = into.get(key, 0.0) + value


ROUTER_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "qpid_flow_build", "info", "qpid-flow's version, Proton's and Python's.", ("version", "proton", "python")
    ),
    MetricSpec("qpid_flow_up", "gauge", "1: the router answered this scrape."),
    MetricSpec(
        "qpid_flow_ready",
        "gauge",
        "1 when ready (listening and, in front of a broker, the broker reachable), as /readyz.",
    ),
    MetricSpec("qpid_flow_connections", "gauge", "Client connections open."),
    MetricSpec("qpid_flow_sessions", "gauge", "Client sessions."),
    MetricSpec(
        "qpid_flow_links",
        "gauge",
        "Client links, by the client's direction (in: to qpid-flow; out: to the client).",
        ("direction",),
    ),
    MetricSpec(
        "qpid_flow_upstream_connections",
        "gauge",
        "Connections to the broker, by state (the clients' own and qpid-flow's: the one that tells the broker is"
        " reachable, and one per grouped destination with consumers).",
        ("state",),
    ),
    MetricSpec("qpid_flow_messages_in", "counter", "Messages admitted to destinations, router-wide."),
    MetricSpec("qpid_flow_messages_out", "counter", "Messages handed to consumers, router-wide."),
    MetricSpec(
        "qpid_flow_memory_bytes",
        "gauge",
        "Bytes of messages qpid-flow holds (each its encoded size plus 512), counted against memory_limit "
        "(transfers held unforwarded are not: admitting one moves its bytes).",
    ),
    MetricSpec(
        "qpid_flow_memory_waiting_bytes",
        "gauge",
        "Bytes of transfers held unforwarded and of messages still arriving in several transfers; "
        "past memory_limit they are refused.",
    ),
    MetricSpec("qpid_flow_memory_limit_bytes", "gauge", "memory_limit (0: none)."),
    MetricSpec(
        "qpid_flow_memory_over_limit", "gauge", "1 while the bytes counted are at memory_limit (every producer held)."
    ),
    MetricSpec(
        "qpid_flow_plugin_errors",
        "counter",
        "Exceptions raised and wrong answers given by plugins, by hook.",
        ("hook",),
    ),
    MetricSpec("qpid_flow_destinations", "gauge", "Destinations that exist now."),
    MetricSpec(
        "qpid_flow_metrics_destinations_aggregated",
        "gauge",
        'Destinations reported under destination="_other" (metrics_max_destinations).',
    ),
)

METRICS: tuple[MetricSpec, ...] = ROUTER_METRICS + DESTINATION_METRICS


@dataclass
class Snapshot:
    """What one scrape reads, taken on the reactor thread in one go."""

    version: str
    proton: str
    python: str
    ready: bool
    connections: int
    sessions: int
    links_in: int
    links_out: int
    upstream: dict[str, int]  # state -> connections
    messages_in: int
    messages_out: int
    memory_bytes: int
    memory_waiting: int
    memory_limit: int
    memory_over: bool
    destinations: list[dict[str, Any]]  # stat records (Destination.stats)
    plugin_errors: dict[str, int] = field(default_factory=dict)
    # Destinations deleted since the last snapshot: the final counters of those the last
    # snapshot listed, by name, and the sum of the counters of those it never listed.
    # Through a DeletionHandover: since the last snapshot the collector split.
    deleted: dict[str, dict[str, float]] = field(default_factory=dict)
    deleted_unlisted: dict[str, float] = field(default_factory=dict)
    # The DeletionHandover's number for it (0: none); the collector passes the last it
    # split to the next snapshot it takes.
    generation: int = 0


class DeletionHandover:
    """Deleted destinations' final counters on their way to the collector, until it has
    split the snapshot that carried them. Touched only on the reactor thread.

    A scrape that gives up waiting for a snapshot the reactor has started (``ReactorBridge.call``'s
    second timeout, the reactor thread stuck in it) leaves it read by nobody: the deletions
    :meth:`Operations.snapshot` handed over went with it, and ``_other`` lost them for
    good. Each snapshot passes here with the generation of the last one the collector
    split (``acknowledged``): what that one carried is dropped; what it did not (the
    deletions of snapshots nobody read, and the new ones) goes out again with this one.

    By name only the destinations the collector knows (those of the last snapshot it
    split: it reads a name it never saw as a labelled one's end and would drop its counts);
    the others are summed, as never seen, so nothing grows by name while no scrape gets
    through.
    """

    def __init__(self) -> None:
        self.generation = 0  # of the last snapshot passed on
        self._passed: set[str] = set()  # the names of the last snapshot passed on
        self._known: set[str] = set()  # the names of the last snapshot the collector split
        self._deleted: dict[str, dict[str, float]] = {}
        self._deleted_unlisted: dict[str, float] = {}

    def pass_on(self, snapshot: Snapshot, acknowledged: int) -> Snapshot:
        """``snapshot`` with every deletion the collector has not split yet, and a new generation."""
        if acknowledged >= self.generation:
            # The collector split the last snapshot passed on, and all it carried. (Calls
            # run in turn: any later one was taken after that snapshot was split, with it.)
            self._deleted, self._deleted_unlisted = {}, {}
            self._known = self._passed
        for name, final in snapshot.deleted.items():
            if name in self._known:
                add_counters(self._deleted.setdefault(name, {}), final)
            else:
                add_counters(self._deleted_unlisted, final)
        add_counters(self._deleted_unlisted, snapshot.deleted_unlisted)
        self._passed = {str(record.get("name")) for record in snapshot.destinations}
        self.generation += 1
        # Copies: the collector reads them on another thread while more deletions come.
        return dataclasses.replace(
            snapshot,
            deleted={name: dict(final) for name, final in self._deleted.items()},
            deleted_unlisted=dict(self._deleted_unlisted),
            generation=self.generation,
        )


def _number(value: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return 0.0


def _configured(record: dict[str, Any]) -> bool:
    """A destination with a policy of its own exact name (not one of a pattern's)."""
    return record.get("policy") == record.get("name")


class _Labels:
    """Which destinations keep their own ``destination`` label, and what ``_other`` has
    counted.

    A configured destination (a policy of its exact name) may take a free place when first
    seen; any other once a second scrape still finds it, so that names clients make and
    drop (one-off addresses) never get series of their own, which Prometheus keeps for
    hours after their last sample; temporary queues (one per reply link) never do. The
    deepest candidates take the free places, and a destination keeps its place, or its
    sum in ``_other``, while it exists: moving one between its own series and ``_other``
    would carry its lifetime counters along, and a counter series that goes down reads as
    a reset to Prometheus (``increase()`` then counts the whole value again: a false
    alert). For the same reason ``_other``'s counters keep what destinations gone from it
    had counted, and what one taken out of it had counted until then.
    """

    def __init__(self, max_destinations: int) -> None:
        self.max_destinations = max_destinations
        self._named: set[str] = set()
        self._aggregated: dict[str, dict[str, float]] = {}  # name -> its counters, last seen
        self._second_look: set[str] = set()  # summed when first seen at the last scrape: candidates now
        self.retired: dict[str, float] = {}  # counters of destinations gone from _other

    def split(
        self,
        records: list[dict[str, Any]],
        deleted: dict[str, dict[str, float]] | None = None,
        deleted_unlisted: dict[str, float] | None = None,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The destinations reported by name, and the rest (summed under ``_other``).

        ``deleted``: the final counters of destinations deleted since the last scrape
        (by name, those it listed); ``deleted_unlisted``: the summed counters of those
        deleted before any scrape saw them. What either counted since it was last seen
        stays in ``_other`` (the last values seen alone lost it: a reply queue made and
        deleted between two scrapes never counted at all)."""
        if self.max_destinations <= 0:
            return records, []
        add_counters(self.retired, deleted_unlisted or {})
        for name, final in (deleted or {}).items():
            if name in self._aggregated:
                del self._aggregated[name]
                add_counters(self.retired, final)
            # One with a label of its own: its series ends with it (not moved into _other).
            self._named.discard(name)
            self._second_look.discard(name)
        present = {str(r.get("name")) for r in records}
        self._named &= present
        for name in set(self._aggregated) - present:
            add_counters(self.retired, self._aggregated.pop(name))
        first_seen = [
            r for r in records if str(r.get("name")) not in self._named and str(r.get("name")) not in self._aggregated
        ]
        candidates = [r for r in first_seen if _configured(r)]
        candidates += [r for r in records if str(r.get("name")) in self._second_look]
        candidates.sort(key=lambda r: (-_number(r.get("depth")), str(r.get("name"))))
        free = max(0, self.max_destinations - len(self._named))
        for record in candidates[:free]:
            name = str(record.get("name"))
            if self._aggregated.pop(name, None) is not None:
                # Out of _other: what it counted so far stays there.
                add_counters(self.retired, counter_values(record))
            self._named.add(name)
        self._second_look = {
            str(r.get("name"))
            for r in first_seen
            if not _configured(r) and not str(r.get("name")).startswith(TEMPORARY_PREFIX)
        } - self._named
        shown = [r for r in records if str(r.get("name")) in self._named]
        rest = [r for r in records if str(r.get("name")) not in self._named]
        for record in rest:
            name = str(record.get("name"))
            counted = counter_values(record)
            for key, before in self._aggregated.get(name, {}).items():
                if counted.get(key, 0.0) < before:
                    # Lower than last time: a destination deleted and made again under the
                    # name between scrapes (one forgotten when idle, say) counts from 0.
                    self.retired[key] = self.retired.get(key, 0.0) + before
            self._aggregated[name] = counted
        return shown, rest


class RouterCollector(Collector):
    """Builds every family from one snapshot per scrape (``take_snapshot``, given the
    generation of the last snapshot split: see :class:`DeletionHandover`)."""

    def __init__(self, take_snapshot: Callable[[int], Snapshot], max_destinations: int = 500) -> None:
        self._take_snapshot = take_snapshot
        self._labels = _Labels(max_destinations)
        self._lock = threading.Lock()
        self._acknowledged = 0  # the generation of the last snapshot split

    @property
    def max_destinations(self) -> int:
        return self._labels.max_destinations

    def describe(self) -> list[Metric]:
        # Without this, prometheus_client would call collect() at registration.
        return []

    def collect(self) -> Iterator[Metric]:
        # Scrapes come on threads of their own (two Prometheus servers, say): each splits
        # the snapshot it took before the next takes one, or labels and _other's counts
        # would move back and forth.
        with self._lock:
            snapshot = self._take_snapshot(self._acknowledged)
            shown, rest = self._labels.split(snapshot.destinations, snapshot.deleted, snapshot.deleted_unlisted)
            self._acknowledged = snapshot.generation
            retired = dict(self._labels.retired)
        yield from self._router(snapshot, len(rest))
        yield from self._destinations(shown, rest, retired)

    def _router(self, s: Snapshot, aggregated: int) -> Iterator[Metric]:
        specs = {spec.name: spec for spec in ROUTER_METRICS}

        def gauge(name: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, specs[name].help, value=value)

        def counter(name: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, specs[name].help, value=value)

        build = InfoMetricFamily("qpid_flow_build", specs["qpid_flow_build"].help)
        build.add_metric([], {"version": s.version, "proton": s.proton, "python": s.python})
        yield build
        yield gauge("qpid_flow_up", 1)
        yield gauge("qpid_flow_ready", 1 if s.ready else 0)
        yield gauge("qpid_flow_connections", s.connections)
        yield gauge("qpid_flow_sessions", s.sessions)
        links = GaugeMetricFamily("qpid_flow_links", specs["qpid_flow_links"].help, labels=["direction"])
        links.add_metric(["in"], s.links_in)
        links.add_metric(["out"], s.links_out)
        yield links
        upstream = GaugeMetricFamily(
            "qpid_flow_upstream_connections", specs["qpid_flow_upstream_connections"].help, labels=["state"]
        )
        for state in ("open", "opening", "closing", "closed"):
            upstream.add_metric([state], s.upstream.get(state, 0))
        yield upstream
        yield counter("qpid_flow_messages_in", s.messages_in)
        yield counter("qpid_flow_messages_out", s.messages_out)
        yield gauge("qpid_flow_memory_bytes", s.memory_bytes)
        yield gauge("qpid_flow_memory_waiting_bytes", s.memory_waiting)
        yield gauge("qpid_flow_memory_limit_bytes", s.memory_limit)
        yield gauge("qpid_flow_memory_over_limit", 1 if s.memory_over else 0)
        errors = CounterMetricFamily("qpid_flow_plugin_errors", specs["qpid_flow_plugin_errors"].help, labels=["hook"])
        # Every hook from the first scrape, at 0 until it fails: a series that first shows
        # up at 1 is no increase to Prometheus, and increase() > 0 (the alert, the panel)
        # missed each hook's first error.
        for hook in sorted(_HOOKS | s.plugin_errors.keys()):
            errors.add_metric([hook], s.plugin_errors.get(hook, 0))
        yield errors
        yield gauge("qpid_flow_destinations", len(s.destinations))
        yield gauge("qpid_flow_metrics_destinations_aggregated", aggregated)

    def _destinations(
        self, shown: list[dict[str, Any]], rest: list[dict[str, Any]], retired: dict[str, float]
    ) -> Iterator[Metric]:
        for spec in DESTINATION_METRICS:
            assert spec.key is not None
            key = spec.key
            family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = family_type(spec.name, spec.help, labels=list(spec.labels))
            for record in shown:
                if key in record:
                    family.add_metric([str(record["name"])], _number(record[key]))
            present = [_number(r[key]) for r in rest if key in r]
            if spec.kind == "counter" and key in retired:
                family.add_metric([OTHER], sum(present) + retired[key])
            elif present:
                family.add_metric([OTHER], sum(present) if spec.combine == "sum" else max(present))
            yield family


def registry_for(collector: RouterCollector) -> CollectorRegistry:
    """qpid-flow's metrics and the process' own (``process_*``: CPU, resident memory, open
    descriptors, read from /proc at scrape time)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


def exposed_name(spec: MetricSpec) -> str:
    """The name a scrape shows: counters get ``_total``, info metrics ``_info``."""
    return spec.name + {"counter": "_total", "info": "_info"}.get(spec.kind, "")


def reference_table() -> str:
    """The metrics reference of docs/operations.md, as a Markdown table (a unit test keeps
    the document equal to it: ``python -m qpid_flow.admin.metrics`` prints it)."""
    lines = ["| metric | type | labels | what it says |", "|---|---|---|---|"]
    for spec in METRICS:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
        kind = "gauge" if spec.kind == "info" else spec.kind
        source = f" (`{spec.key}` in `qpid-flow stat --json`)" if spec.key else ""
        lines.append(f"| `{exposed_name(spec)}` | {kind} | {labels} | {spec.help}{source} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_table())
