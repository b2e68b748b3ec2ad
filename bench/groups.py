"""Benchmark: shared message-group dispatch, in process (no network). Not a test.

    .venv/bin/python bench/groups.py [--messages N] [--rounds R] [--json out.json]

Other options: ``--credit K`` (credit each consumer is given per turn, default 50),
``--consumers C`` (default 4), ``--header JMSXGroupID`` (read the group from that
application property instead of ``properties.group-id``), ``--groups 10,1000,100000``.

What it measures, on a real :class:`~qpid_flow.core.destination.Destination` with the
built-in plugins (``Hooks(build_plugin_manager())``) and a
:class:`~qpid_flow.policies.groups.grouped_queue.GroupedQueue` installed with ``replace_queue``:

1. Dispatch throughput with 10, 1,000 and 100,000 active groups. The messages are real
   encoded AMQP messages (``proton.Message(body=..., group_id=...).encode()``, encoded once
   per group and the bytes reused), so the group id is read from the bytes. N messages are
   enqueued round-robin over the G groups (all G groups are active), then 4 consumers
   drain the destination in a timed loop: each in turn gets credit
   (``credit_changed(consumer, K)``), then each settles (accepted) what it received,
   until everything is consumed. Settling frees groups and dispatches to consumers that
   still have credit, as in the router. The figure is messages/s of that loop (dispatch
   + delivery + settlement, the hooks included); the fill (enqueue, which is where the
   group id is read from the bytes) is timed and printed separately. Each round runs
   every group count once, the order rotating from round to round; the median and
   min-max over the rounds are printed, and rate(100,000 groups) / rate(10 groups).
2. Memory after the groups drain, with 100,000 groups (N messages, untimed, tracemalloc
   on): RSS (``/proc/self/statm``) and tracemalloc-traced bytes before filling, at the
   peak (all N messages waiting) and after draining + ``gc.collect()``, and how many
   groups are left in the table (must be 0; the script exits 1 otherwise). RSS after
   draining is also shown after glibc's ``malloc_trim(0)`` when available: freed memory
   stays in the allocator's free lists, so RSS alone overstates what is still in use. The
   emptied group table's own size is printed too: a CPython dict keeps the hash table of
   its high-water mark after its keys are deleted (about 38 bytes per peak group).
3. A correctness pass (untimed, 1,000 groups): every message delivered exactly once,
   each group's messages in queue order.

Defaults: N = 200,000 messages, 3 rounds, credit 50. On a 2-core machine the whole run
takes about a minute and a half (well under 3 minutes), so the defaults are not reduced.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proton import Message as ProtonMessage  # noqa: E402

from qpid_flow.config import DestinationPolicy  # noqa: E402
from qpid_flow.core.destination import Destination  # noqa: E402
from qpid_flow.core.model import Consumer, Message, Settlement  # noqa: E402
from qpid_flow.plugin.manager import Hooks, build_plugin_manager  # noqa: E402
from qpid_flow.policies.groups.grouped_queue import GroupedQueue  # noqa: E402

ADDRESS = "bench-groups"
BODY = "x" * 64
ACCEPTED = Settlement.accepted()
PAGE = os.sysconf("SC_PAGE_SIZE")


def encoded_messages(groups: int, header: str | None) -> list[bytes]:
    """One encoded AMQP message per group (reused for every message of that group)."""
    out = []
    for g in range(groups):
        group = f"group-{g:06d}"
        if header is None:
            message = ProtonMessage(body=BODY, group_id=group)
        else:
            message = ProtonMessage(body=BODY, properties={header: group})
        out.append(bytes(message.encode()))
    return out


class Bench:
    """A destination with a GroupedQueue and consumers recording what they receive."""

    def __init__(self, consumers: int, header: str | None, log: list[Message] | None = None) -> None:
        # As the router runs without --events: the event-log plugin is not loaded.
        hooks = Hooks(build_plugin_manager(disabled=["events"]))
        self.destination = Destination(ADDRESS, DestinationPolicy.of(pattern=ADDRESS), hooks)
        self.queue = GroupedQueue(header, hooks.consumer_select)
        self.destination.replace_queue(self.queue)
        self.received: dict[int, list[Message]] = {}
        self.consumers: list[Consumer] = []
        for _ in range(consumers):
            consumer = Consumer(ADDRESS, self._deliver if log is None else self._logging_deliver(log))
            self.received[consumer.id] = []
            self.consumers.append(consumer)

    def _deliver(self, consumer: Consumer, message: Message) -> None:
        self.received[consumer.id].append(message)

    def _logging_deliver(self, log: list[Message]) -> Callable[[Consumer, Message], None]:
        def deliver(consumer: Consumer, message: Message) -> None:
            self.received[consumer.id].append(message)
            log.append(message)

        return deliver

    def fill(self, payloads: list[bytes], messages: int) -> None:
        """``messages`` messages round-robin over the groups (no consumer attached yet)."""
        destination = self.destination
        groups = len(payloads)
        for i in range(messages):
            destination.enqueue(Message(payloads[i % groups], ADDRESS))
        for consumer in self.consumers:
            destination.add_consumer(consumer)

    def drain(self, credit: int) -> int:
        """Credit and settle until nothing is waiting or held. Returns how many were consumed."""
        destination = self.destination
        received = self.received
        consumers = self.consumers
        settle = destination.settle
        consumed = 0
        while True:
            for consumer in consumers:
                destination.credit_changed(consumer, credit)
            progress = 0
            for consumer in consumers:
                got = received[consumer.id]
                if not got:
                    continue
                received[consumer.id] = []
                for message in got:
                    settle(consumer, message, ACCEPTED)
                progress += len(got)
            consumed += progress
            if not progress:
                if len(destination.queue) or any(received.values()):
                    raise RuntimeError(f"stuck with {len(destination.queue)} messages waiting")
                return consumed


def run_timed(payloads: list[bytes], messages: int, consumers: int, credit: int, header: str | None) -> dict[str, Any]:
    bench = Bench(consumers, header)
    gc.collect()
    t0 = time.perf_counter()
    bench.fill(payloads, messages)
    t1 = time.perf_counter()
    consumed = bench.drain(credit)
    t2 = time.perf_counter()
    queue = bench.queue
    if consumed != messages or bench.destination.depth or queue.group_count or len(queue):
        raise RuntimeError(
            f"consumed {consumed} of {messages}; depth {bench.destination.depth}, "
            f"{queue.group_count} groups left, {len(queue)} waiting"
        )
    return {"fill_rate": messages / (t1 - t0), "rate": messages / (t2 - t1), "seconds": t2 - t1}


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def malloc_trim() -> bool:
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def run_memory(payloads: list[bytes], messages: int, consumers: int, credit: int, header: str | None) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    bench = Bench(consumers, header)
    gc.collect()
    before = (rss_bytes(), tracemalloc.get_traced_memory()[0])
    bench.fill(payloads, messages)
    gc.collect()
    peak = (rss_bytes(), tracemalloc.get_traced_memory()[0])
    bench.drain(credit)
    gc.collect()
    after = (rss_bytes(), tracemalloc.get_traced_memory()[0])
    traced_max = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    trimmed = rss_bytes() if malloc_trim() else None
    queue = bench.queue
    return {
        "groups": len(payloads),
        "messages": messages,
        "rss_before": before[0],
        "rss_peak": peak[0],
        "rss_after": after[0],
        "rss_after_malloc_trim": trimmed,
        "traced_before": before[1],
        "traced_peak": peak[1],
        "traced_after": after[1],
        "traced_max": traced_max,
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "groups_left": queue.group_count,
        # CPython dicts do not shrink when keys are deleted: the empty group table keeps
        # the hash table sized for its high-water mark (most of "traced after - before").
        "group_table_bytes": sys.getsizeof(queue._groups),
        "heads_left": len(queue._heads),
        "owners_left": sum(len(owned) for owned in queue._owned.values()),  # groups still owned
        "waiting_left": len(queue),
    }


def check_order(messages: int, consumers: int, credit: int, header: str | None) -> str | None:
    """Every message delivered once, each group's in queue order. None if all is well."""
    payloads = encoded_messages(1000, header)
    log: list[Message] = []
    bench = Bench(consumers, header, log)
    bench.fill(payloads, messages)
    bench.drain(credit)
    if len(log) != messages or len({m.sequence for m in log}) != messages:
        return f"{len(log)} deliveries of {messages} messages"
    last: dict[Any, int] = {}
    for message in log:
        group = message.group_id(header)
        if last.get(group, 0) > message.sequence:
            return f"group {group} out of order at message {message.sequence}"
        last[group] = message.sequence
    return None


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:8.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--credit", type=int, default=50)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--groups", default="10,1000,100000", help="comma-separated group counts")
    parser.add_argument("--header", default=None, help="group from this application property (e.g. JMSXGroupID)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    group_counts = [int(g) for g in args.groups.split(",")]
    started = time.perf_counter()

    print(f"cores: {os.cpu_count()}  python: {platform.python_implementation()} {sys.version.split()[0]}")
    print(
        f"messages: {args.messages}  rounds: {args.rounds}  consumers: {args.consumers}  "
        f"credit: {args.credit}  group from: {args.header or 'properties.group-id'}\n",
        flush=True,
    )

    payloads = {g: encoded_messages(g, args.header) for g in group_counts}
    runs: dict[int, list[dict[str, Any]]] = {g: [] for g in group_counts}
    for round_number in range(args.rounds):
        shift = round_number % len(group_counts)
        for groups in group_counts[shift:] + group_counts[:shift]:  # alternate, rotating the order
            run = run_timed(payloads[groups], args.messages, args.consumers, args.credit, args.header)
            runs[groups].append(run)
            print(
                f"round {round_number + 1} groups {groups:>7}: dispatch {run['rate']:>9.0f} msg/s "
                f"({run['seconds']:.2f} s), fill {run['fill_rate']:>9.0f} msg/s",
                flush=True,
            )

    summary: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "messages": args.messages,
        "rounds": args.rounds,
        "consumers": args.consumers,
        "credit": args.credit,
        "header": args.header,
        "throughput": {},
    }
    print(f"\n{'groups':>7}  {'dispatch msg/s median (min-max)':>34}  {'fill msg/s median':>17}")
    medians: dict[int, float] = {}
    for groups, group_runs in runs.items():
        rates = [r["rate"] for r in group_runs]
        fills = [r["fill_rate"] for r in group_runs]
        medians[groups] = statistics.median(rates)
        print(
            f"{groups:>7}  {medians[groups]:>14.0f} ({min(rates):.0f}-{max(rates):.0f})"
            f"{'':>2}{statistics.median(fills):>17.0f}"
        )
        summary["throughput"][str(groups)] = {
            "median": medians[groups],
            "min": min(rates),
            "max": max(rates),
            "fill_median": statistics.median(fills),
            "runs": group_runs,
        }
    low, high = min(group_counts), max(group_counts)
    ratio = medians[high] / medians[low]
    summary["ratio"] = {"of": f"rate({high} groups) / rate({low} groups)", "value": ratio}
    print(f"rate({high:,} groups) / rate({low:,} groups) = {ratio:.2f}", flush=True)

    memory = run_memory(payloads[high], args.messages, args.consumers, args.credit, args.header)
    summary["memory"] = memory
    print(f"\nmemory, {high:,} groups, {args.messages:,} messages (tracemalloc on, untimed):")
    print(f"  {'':16}{'RSS':>12}  {'traced':>12}")
    for label, key in (("before filling", "before"), ("peak (filled)", "peak"), ("after draining", "after")):
        print(f"  {label:16}{mib(memory['rss_' + key]):>12}  {mib(memory['traced_' + key]):>12}")
    print(f"  RSS after draining + malloc_trim(0): {mib(memory['rss_after_malloc_trim']).strip()}")
    print(f"  traced after - before: {memory['traced_after'] - memory['traced_before']:+,} bytes")
    print(f"  of which the emptied group table (dict keeps its peak size): {memory['group_table_bytes']:,} bytes")
    print(f"  max RSS of the process (getrusage): {mib(memory['max_rss']).strip()}")
    print(
        f"  groups left in the table: {memory['groups_left']} (heads {memory['heads_left']}, "
        f"owners {memory['owners_left']}, waiting {memory['waiting_left']})"
    )

    problem = check_order(min(args.messages, 50_000), args.consumers, args.credit, args.header)
    summary["order_check"] = problem or "ok"
    print(f"\norder check (1,000 groups): {problem or 'ok: every message once, each group in order'}")
    summary["seconds"] = time.perf_counter() - started
    print(f"total time: {summary['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    leftovers = memory["groups_left"] or memory["heads_left"] or memory["owners_left"] or memory["waiting_left"]
    return 1 if leftovers or problem else 0


if __name__ == "__main__":
    raise SystemExit(main())
