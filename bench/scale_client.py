"""Many connections from one Python process, one producer link each. Not a test.

    python bench/scale_client.py URL ADDRESS CONNECTIONS PER_CONNECTION [--in-flight 8] [--timeout 180]

Opens CONNECTIONS connections to URL from one Proton container, each with one sender to
ADDRESS, keeping at most ``--in-flight`` connections opening at a time (Proton's listener
has a backlog of 10: a burst of a thousand SYNs overflows it and the kernel's retries, a
second or more each, would be what is measured). Once every link is attached (the
peer's attach arrived; credit is the peer's business) it prints ``connected`` on a line
of its own, then every link sends PER_CONNECTION messages of 100 bytes, at-least-once, as
its credit allows; when all are accepted it prints one JSON line: ``connect_s`` (first
connect to the last link attached), ``connect_rate``, ``messages``, ``send_s``, ``rate``
and ``error``, and closes everything.

Python Proton waits on select(): a process cannot hold a socket numbered 1024 or above,
which bounds CONNECTIONS to about 1,000 per process (and qpid-flow's listener likewise).
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

from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402

from tests.integration.clients import make_message  # noqa: E402


class ScaleClient(MessagingHandler):
    def __init__(self, url: str, address: str, connections: int, per_connection: int, in_flight: int, timeout: float):
        super().__init__(auto_settle=True)
        self.url = url
        self.address = address
        self.connections = connections
        self.per_connection = per_connection
        self.in_flight = in_flight
        self.timeout = timeout
        self.opened = 0  # connections started
        self.ready = 0  # links with credit
        self.pending = 0  # connections started, link without credit yet
        self.links: list[Any] = []
        self.conns: list[Any] = []
        self.accepted = 0
        self.sending = False
        self.error: str | None = None
        self.t_start = self.t_connected = self.t_done = 0.0
        self.payload = make_message("scale", 0, size=100)
        self.container: Any = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        event.container.schedule(self.timeout, self)
        self.t_start = time.perf_counter()
        self.open_more()

    def open_more(self) -> None:
        while self.opened < self.connections and self.pending < self.in_flight:
            conn = self.container.connect(self.url, reconnect=False)
            sender = self.container.create_sender(conn, self.address, name=f"scale-{self.opened}")
            sender.bench_ready = False
            self.conns.append(conn)
            self.links.append(sender)
            self.opened += 1
            self.pending += 1

    def on_link_opened(self, event: Any) -> None:
        sender = event.link
        if sender.bench_ready:
            return
        sender.bench_ready = True
        sender.bench_sent = 0
        self.ready += 1
        self.pending -= 1
        if self.ready < self.connections:
            self.open_more()
            return
        self.t_connected = time.perf_counter()
        print("connected", flush=True)
        time.sleep(0.3)  # let the parent sample qpid-flow's memory with every link idle
        self.sending = True
        for link in self.links:
            self.send(link)

    def on_sendable(self, event: Any) -> None:
        if self.sending:
            self.send(event.sender)

    def send(self, sender: Any) -> None:
        while sender.credit > 0 and sender.bench_sent < self.per_connection:
            sender.send(self.payload)
            sender.bench_sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.connections * self.per_connection:
            self.t_done = time.perf_counter()
            self.finish()

    def on_rejected(self, event: Any) -> None:
        self.error = f"transfer rejected: {event.delivery.remote.condition}"
        self.finish()

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        if self.error is None and not self.t_done:
            self.error = f"transport error: {cond.name if cond else '?'}: {cond.description if cond else ''}"
            self.finish()

    def on_timer_task(self, event: Any) -> None:
        if not self.t_done:
            self.error = self.error or f"timed out: {self.ready} links ready, {self.accepted} accepted"
            self.finish()

    def finish(self) -> None:
        for conn in self.conns:
            conn.close()
        self.container.stop()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"connections": self.connections, "error": self.error}
        messages = self.connections * self.per_connection
        out["messages"] = messages
        if self.t_connected:
            out["connect_s"] = self.t_connected - self.t_start
            out["connect_rate"] = self.connections / out["connect_s"]
        if self.t_done:
            out["send_s"] = self.t_done - self.t_connected - 0.3
            out["rate"] = messages / out["send_s"]
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("address")
    parser.add_argument("connections", type=int)
    parser.add_argument("per_connection", type=int)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    client = ScaleClient(args.url, args.address, args.connections, args.per_connection, args.in_flight, args.timeout)
    try:
        Container(client).run()
    except Exception as exc:
        client.error = client.error or f"{type(exc).__name__}: {exc}"
    result = client.result()
    print(json.dumps(result), flush=True)
    return 1 if result["error"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
