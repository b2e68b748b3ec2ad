"""Python Proton benchmark clients, one per process (so that a producer and a consumer
do not share a GIL). Not a test.

    python bench/pyclients.py produce URL ADDRESS COUNT [--size 100] [--groups G] [--rate R]
    python bench/pyclients.py consume URL ADDRESS COUNT [--prefetch 100] [--latency]

They are the integration tests' clients (tests/integration/clients.py: ``Producer`` and
``Consumer``, at-least-once, ``make_message`` messages), with timing added. Each prints one
JSON line on stdout when done: ``count``, ``first`` and ``last`` (``time.time()`` of the
first transfer sent / received and of the last settlement / message received), and
``error`` (null when all went well).

- ``--groups G``: the producer sets ``group_id`` round robin over G groups.
- ``--rate R``: the producer paces itself at R msg/s (a timer every millisecond sends what
  is due) and stamps each message, just before sending it, with the application property
  ``sent_at`` = ``time.time()``.
- ``--latency``: the consumer computes ``time.time()`` at reception minus ``sent_at`` for
  every message, and prints the list (``latencies_ms``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proton import Handler  # noqa: E402

from tests.integration.clients import Consumer, Producer, make_message  # noqa: E402

TICK = 0.001


class TimedProducer(Producer):
    """Producer that records when it sent its first transfer and got its last outcome."""

    def __init__(self, *args: Any, rate: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rate = rate
        self.first = 0.0
        self.last = 0.0

    def on_sendable(self, event: Any) -> None:
        if self.rate:
            return  # the pacing timer sends
        if not self.first:
            self.first = time.time()
        super().on_sendable(event)

    def open_links(self, event: Any) -> None:
        super().open_links(event)
        if self.rate:
            event.container.schedule(TICK, _Tick(self))

    def tick(self, container: Any) -> None:
        if self.done.is_set() or self.sent >= len(self.messages):
            return
        now = time.time()
        if not self.first:
            self.first = now
        due = int((now - self.first) * self.rate) + 1 - self.sent
        sender = self.sender
        while due > 0 and sender.credit > 0 and self.sent < len(self.messages):
            message = self.messages[self.sent]
            message.properties["sent_at"] = time.time()
            delivery = sender.send(message)
            delivery.index = self.sent
            self.sent += 1
            due -= 1
        container.schedule(TICK, _Tick(self))

    def _record(self, event: Any, outcome: str) -> None:
        self.last = time.time()
        super()._record(event, outcome)


class TimedConsumer(Consumer):
    """Consumer that records its first and last reception and, if asked, the latency."""

    def __init__(self, *args: Any, latency: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latency = latency
        self.latencies: list[float] = []
        self.first = 0.0
        self.last = 0.0

    def on_message(self, event: Any) -> None:
        now = time.time()
        if not self.first:
            self.first = now
        self.last = now
        if self.latency:
            sent_at = (event.message.properties or {}).get("sent_at")
            if sent_at is not None:
                self.latencies.append(1000.0 * (now - sent_at))
        super().on_message(event)


class _Tick(Handler):
    def __init__(self, producer: TimedProducer) -> None:
        super().__init__()
        self.producer = producer

    def on_timer_task(self, event: Any) -> None:
        self.producer.tick(event.container)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("url")
    parser.add_argument("address")
    parser.add_argument("count", type=int)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--groups", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    client: TimedProducer | TimedConsumer
    if args.role == "produce":
        messages = [
            make_message("p", i, size=args.size, group=f"group-{i % args.groups:06d}" if args.groups else None)
            for i in range(args.count)
        ]
        client = TimedProducer(args.url, args.address, messages, timeout=args.timeout, rate=args.rate)
    else:
        client = TimedConsumer(
            args.url, args.address, count=args.count, prefetch=args.prefetch, timeout=args.timeout, latency=args.latency
        )
    client.run()
    result: dict[str, Any] = {"role": args.role, "first": client.first, "last": client.last, "error": client.error}
    if isinstance(client, TimedProducer):
        outcomes = list(client.outcomes.values())
        result["count"] = outcomes.count("accepted")
        result["sent"] = client.sent
        if result["count"] != args.count and not client.error:
            result["error"] = f"{result['count']} of {args.count} accepted ({len(outcomes)} outcomes)"
    else:
        result["count"] = client.finished
        if args.latency:
            result["latencies_ms"] = [round(x, 4) for x in client.latencies]
        if result["count"] != args.count and not client.error:
            result["error"] = f"{result['count']} of {args.count} received"
    print(json.dumps(result), flush=True)
    return 1 if result["error"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
