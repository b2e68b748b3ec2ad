"""Event logs with known answers: for the report's tests and its benchmark.

A :class:`LogWriter` simulation writes what a qpid-flow run would write (schema v1) for:

- a **grouped** destination: messages round robin over ``groups`` groups, dispatched to
  ``consumers`` consumers by shared-group rules (a group's messages go to its owner while
  it holds any; a free group goes to the next consumer), each consumer holding up to a
  window of unsettled messages, with occasional releases (redelivered first, with
  ``delivery_count`` 2);
- a **flow-controlled** destination: depth climbing past its stop threshold and draining
  below its resume threshold ``flow_cycles`` times, with two producers attached;

and can inject violations the audit must find: ``order`` (two messages of a group
delivered the wrong way round) and ``overlap`` (a group's next message delivered to a
second consumer while the first still holds one). :class:`Expected` lists each.

Plain Python (no Spark): the tests compare the report's tables with it.
"""

from __future__ import annotations

import gzip
import json
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

GROUPED = "orders"
FLOWED = "prices"


@dataclass
class Expected:
    events: int = 0
    order: set[tuple[str, str, int]] = field(default_factory=set)  # (address, group, seq)
    overlap: set[tuple[str, str, int]] = field(default_factory=set)  # (address, group, consumer)
    flow_stopped: dict[str, int] = field(default_factory=dict)  # address -> flowStoppedCount
    peak_depth: dict[str, int] = field(default_factory=dict)
    redeliveries: int = 0


class LogWriter:
    """Writes events of one run, numbered, to a file (gzip when the name ends in .gz)."""

    def __init__(self, out: TextIO, run: str, start: float, expected: Expected, rng: random.Random) -> None:
        self.out = out
        self.run = run
        self.ts = start
        self.n = 0
        self.expected = expected
        self.rng = rng
        self.seq = 0

    def emit(self, event: str, address: str, **fields: Any) -> None:
        self.n += 1
        self.ts += self.rng.random() * 0.002
        record = {"v": 1, "ts": round(self.ts, 6), "run": self.run, "n": self.n, "event": event, "address": address}
        record.update(fields)
        self.out.write(json.dumps(record, separators=(",", ":")))
        self.out.write("\n")
        self.expected.events += 1

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def _grouped_run(
    log: LogWriter,
    messages: int,
    groups: int,
    consumers: int,
    window: int,
    inject_order: int,
    inject_overlap: int,
    release_every: int,
) -> None:
    rng = log.rng
    expected = log.expected
    address = GROUPED
    log.emit(
        "destination",
        address,
        maxCount=0,
        maxSize=0,
        limitPolicy="flow",
        grouped=True,
        producerWindow=100,
        flowStopCount=0,
        flowResumeCount=0,
        flowStopSize=0,
        flowResumeSize=0,
    )
    log.emit("producer_attached", address, producer=1, window=100)
    consumer_ids = [1000 + i for i in range(consumers)]
    waiting: dict[str, deque[tuple[int, int]]] = {}  # group -> (seq, delivery_count)
    order: deque[str] = deque()  # groups in the order their next message was sent
    depth = 0
    for i in range(messages):
        group = f"g{i % groups}"
        seq = log.next_seq()
        depth += 1
        log.emit(
            "enqueue", address, seq=seq, id=f"m{seq}", size=120, group=group, producer=1, depth=depth, bytes=depth * 120
        )
        waiting.setdefault(group, deque()).append((seq, 1))
        order.append(group)
    # Which groups get an injected violation (distinct groups, each with >= 2 messages).
    candidates = [g for g, q in waiting.items() if len(q) >= 3]
    rng.shuffle(candidates)
    swap_groups = set(candidates[:inject_order])
    split_groups = set(candidates[inject_order : inject_order + inject_overlap])
    owner: dict[str, int] = {}
    held: dict[int, dict[int, str]] = {c: {} for c in consumer_ids}  # consumer -> seq -> group
    held_by_group: dict[str, int] = {}
    next_consumer = 0
    sent = 0
    released: set[int] = set()  # each message is released at most once

    def deliver(consumer: int, group: str, seq: int, count: int) -> None:
        log.emit("deliver", address, seq=seq, size=120, group=group, consumer=consumer, delivery_count=count)
        held[consumer][seq] = group
        held_by_group[group] = held_by_group.get(group, 0) + 1

    def settle(consumer: int, seq: int, outcome: str = "accepted") -> None:
        nonlocal depth
        group = held[consumer].pop(seq)
        held_by_group[group] -= 1
        if outcome != "released":
            depth -= 1
        log.emit(
            "settle",
            address,
            seq=seq,
            size=120,
            group=group,
            consumer=consumer,
            outcome=outcome,
            condition=None,
            depth=depth,
            bytes=depth * 120,
        )
        if held_by_group[group] == 0:
            log.emit("group_released", address, group=group, consumer=consumer, reason="settled")
            del owner[group]

    while order or any(held.values()):
        progressed = False
        # Deliver: the oldest waiting group whose owner (or, free, the next consumer) has room.
        for _ in range(min(len(order), 8)):
            group = order[0]
            queue = waiting[group]
            if not queue:
                order.popleft()
                continue
            consumer = owner.get(group)
            if consumer is None:
                consumer = consumer_ids[next_consumer % consumers]
                if len(held[consumer]) >= window:
                    break
                next_consumer += 1
                owner[group] = consumer
                log.emit("group_assigned", address, group=group, consumer=consumer)
            elif len(held[consumer]) >= window:
                break
            order.popleft()
            seq, count = queue.popleft()
            if group in swap_groups and count == 1 and len(queue) >= 1:
                # Injected: the next message of the group goes out first.
                later, later_count = queue.popleft()  # its turn in `order` finds it gone: skipped
                deliver(consumer, group, later, later_count)
                deliver(consumer, group, seq, count)
                expected.order.add((address, group, seq))
                swap_groups.discard(group)
            elif group in split_groups and count == 1 and queue:
                # Injected: a second consumer gets the group's next message while the
                # owner still holds this one.
                deliver(consumer, group, seq, count)
                other = consumer_ids[(consumer_ids.index(consumer) + 1) % consumers]
                later, later_count = queue.popleft()  # its turn in `order` finds it gone: skipped
                deliver(other, group, later, later_count)
                expected.overlap.add((address, group, other))
                split_groups.discard(group)
                settle(consumer, seq)
                settle(other, later)
            else:
                deliver(consumer, group, seq, count)
            sent += 1
            progressed = True
        # Settle: every consumer settles its oldest held message now and then.
        for consumer in consumer_ids:
            if held[consumer] and (rng.random() < 0.6 or not progressed):
                seq = next(iter(held[consumer]))
                group = held[consumer][seq]
                if release_every and seq % release_every == 0 and seq not in released and group not in split_groups:
                    released.add(seq)
                    settle(consumer, seq, "released")
                    # Released: back in front of its group, delivered again (count 2).
                    waiting[group].appendleft((seq, 2))
                    order.appendleft(group)
                    expected.redeliveries += 1
                else:
                    settle(consumer, seq)
                progressed = True
        if not progressed and order:
            # Every owner is full and no group is free: settle something to move on.
            for consumer in consumer_ids:
                if held[consumer]:
                    settle(consumer, next(iter(held[consumer])))
                    break
    expected.peak_depth[address] = messages


def _flow_run(log: LogWriter, cycles: int, stop: int, resume: int, maximum: int) -> None:
    address = FLOWED
    log.emit(
        "destination",
        address,
        maxCount=maximum,
        maxSize=0,
        limitPolicy="flow",
        grouped=False,
        producerWindow=100,
        flowStopCount=stop,
        flowResumeCount=resume,
        flowStopSize=0,
        flowResumeSize=0,
    )
    limits = {"flowStopCount": stop, "flowResumeCount": resume, "flowStopSize": 0, "flowResumeSize": 0}
    for producer in (11, 12):
        log.emit("producer_attached", address, producer=producer, window=100)
    depth = 0
    held: deque[int] = deque()
    for _ in range(cycles):
        while depth <= stop:
            seq = log.next_seq()
            depth += 1
            log.emit(
                "enqueue", address, seq=seq, id=None, size=50, group=None, producer=11, depth=depth, bytes=depth * 50
            )
            held.append(seq)
        log.emit("flow_stopped", address, depth=depth, bytes=depth * 50, producers=2, **limits)
        while depth >= resume:
            seq = held.popleft()
            log.emit("deliver", address, seq=seq, size=50, group=None, consumer=2000, delivery_count=1)
            depth -= 1
            log.emit(
                "settle",
                address,
                seq=seq,
                size=50,
                group=None,
                consumer=2000,
                outcome="accepted",
                condition=None,
                depth=depth,
                bytes=depth * 50,
            )
        log.emit("flow_resumed", address, depth=depth, bytes=depth * 50, producers=2, **limits)
    log.expected.flow_stopped[address] = log.expected.flow_stopped.get(address, 0) + cycles
    log.expected.peak_depth[address] = stop + 1


def generate(
    folder: Path,
    *,
    runs: int = 1,
    messages: int = 2000,
    groups: int = 50,
    consumers: int = 3,
    window: int = 5,
    inject_order: int = 0,
    inject_overlap: int = 0,
    release_every: int = 97,
    flow_cycles: int = 3,
    stop: int = 80,
    resume: int = 60,
    maximum: int = 100,
    gzip_files: bool = False,
    seed: int = 1,
) -> Expected:
    """Write ``runs`` run logs into ``folder`` (one file each) and return what a correct
    report finds in them. Injected violations are spread over the runs' grouped traffic."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = Expected()
    rng = random.Random(seed)
    for index in range(runs):
        name = f"events-{index}.jsonl" + (".gz" if gzip_files else "")
        path = folder / name
        with gzip.open(path, "wt", encoding="utf-8") if gzip_files else path.open("w", encoding="utf-8") as out:
            log = LogWriter(out, f"run{index:04d}", 1_780_000_000.0 + index * 3600, expected, rng)
            _flow_run(log, flow_cycles, stop, resume, maximum)
            _grouped_run(
                log,
                messages,
                groups,
                consumers,
                window,
                inject_order // runs + (1 if index < inject_order % runs else 0),
                inject_overlap // runs + (1 if index < inject_overlap % runs else 0),
                release_every,
            )
    return expected
