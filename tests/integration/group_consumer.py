"""A consumer process for the message-group tests: it records what it held, and when.

    python group_consumer.py URL ADDRESS PREFETCH DELAY_MS OUT [--stuck]

Receives with a fixed credit window of PREFETCH, "processes" each message for DELAY_MS,
then accepts it (with --stuck it never settles anything). For every message it appends
one line to OUT as it happens: ``R <group> <seq> <t>`` when received, ``S <group> <seq>
<t>`` when settled, with ``t`` from the system-wide monotonic clock, so lines of several
processes compare. Stops after 5 s without a message. Run as its own process so a test
can kill it (SIGKILL) mid-stream.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from proton.handlers import MessagingHandler
from proton.reactor import Container


class GroupConsumer(MessagingHandler):
    def __init__(self, url: str, address: str, prefetch: int, delay: float, out: Any, stuck: bool) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.prefetch, self.delay = url, address, prefetch, delay
        self.out, self.stuck = out, stuck
        self.last = time.monotonic()

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False)
        receiver = event.container.create_receiver(self.conn, self.address)
        receiver.flow(self.prefetch)
        event.container.schedule(0.5, self)

    def on_message(self, event: Any) -> None:
        message = event.message
        group, seq = message.group_id, message.properties["seq"]
        self.out.write(f"R {group} {seq} {time.monotonic():.6f}\n")
        self.out.flush()
        self.last = time.monotonic()
        if self.stuck:
            return
        if self.delay:
            time.sleep(self.delay)
        self.out.write(f"S {group} {seq} {time.monotonic():.6f}\n")
        self.out.flush()
        self.accept(event.delivery)
        event.receiver.flow(1)

    def on_timer_task(self, event: Any) -> None:
        if time.monotonic() - self.last > 5.0:
            self.conn.close()
            return
        event.container.schedule(0.5, self)

    def on_connection_closed(self, event: Any) -> None:
        event.container.stop()


def main() -> None:
    url, address, prefetch, delay_ms, out_path = sys.argv[1:6]
    with open(out_path, "a", buffering=1) as out:
        handler = GroupConsumer(url, address, int(prefetch), float(delay_ms) / 1000, out, "--stuck" in sys.argv)
        Container(handler).run()


if __name__ == "__main__":
    main()
