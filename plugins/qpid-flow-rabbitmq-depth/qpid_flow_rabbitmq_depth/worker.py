"""The worker thread: reads every known queue's depth on a schedule, off the reactor.

Hooks run on the reactor thread and must never block, so all broker I/O happens here;
results go back through ``deliver(address, ready)``, which the plugin points at
``control.call_from_thread``. The thread-safe parts are ``add``, ``discard`` and
``stop``; everything else runs on the worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import structlog

from qpid_flow_rabbitmq_depth.addresses import destination_queue
from qpid_flow_rabbitmq_depth.reader import BrokerUnavailable, DepthReader

__all__ = ["DepthWorker"]

log = structlog.get_logger(__name__)

# Longest wait between retries while the broker is down.
MAX_BACKOFF = 30.0
# Longest the worker sleeps without servicing its connection (pika's blocking connection
# answers heartbeats only when called; RabbitMQ's default heartbeat is 60 s).
KEEPALIVE = 5.0
# A new address is read this long after it was added, not at once: it is added when a
# client's link attaches, and RabbitMQ 3.10 may declare the queue for that very attach.
# A passive declare racing that declaration ended the client's session with
# internal_error (noproc) now and then: a client must not see that through qpid-flow.
FRESH_DELAY = 1.0


class DepthWorker:
    """Polls depths for the addresses it is given; run :meth:`run` on its own thread."""

    def __init__(
        self,
        reader: DepthReader,
        deliver: Callable[[str, int], None],
        interval: float,
        *,
        broker: str = "",
        max_backoff: float = MAX_BACKOFF,
        keepalive: float = KEEPALIVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._deliver = deliver
        self._interval = interval
        self._broker = broker  # for logs only (no password)
        self._max_backoff = max(max_backoff, interval)
        self._keepalive = keepalive
        self._clock = clock
        self._lock = threading.Lock()
        self._queues: dict[str, str] = {}  # address -> queue name
        # Added since the last read: read each at the time given (FRESH_DELAY after it came),
        # without waiting for the next full poll.
        self._fresh: dict[str, float] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failures = 0
        self._down_since: float | None = None

    # --- any thread -------------------------------------------------------------------------

    def add(self, address: str, *, read_at_once: bool = False) -> bool:
        """Watch destination ``address`` (:func:`destination_queue`); False (and ignored)
        when it names no single queue.

        It is first read FRESH_DELAY after it came, unless ``read_at_once``: an address
        known before any client can attach (one named in the configuration) has no attach
        declaring its queue to race, and is read from the first poll."""
        name = destination_queue(address)
        if name is None:
            return False
        with self._lock:
            if address not in self._queues:
                self._queues[address] = name
                if not read_at_once:
                    self._fresh[address] = self._clock() + FRESH_DELAY
        self._wake.set()
        return True

    def discard(self, address: str) -> None:
        """Stop watching ``address`` (its destination is gone)."""
        with self._lock:
            self._queues.pop(address, None)
            self._fresh.pop(address, None)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def addresses(self) -> list[str]:
        with self._lock:
            return list(self._queues)

    @property
    def down(self) -> bool:
        return self._down_since is not None

    # --- worker thread ----------------------------------------------------------------------

    def run(self) -> None:
        """Poll at once (a backlog present at start counts immediately), then every
        ``interval``; new addresses are read FRESH_DELAY after they are added. Returns on stop."""
        next_full = self._clock()
        try:
            while not self._stop.is_set():
                try:
                    next_full = self._step(next_full)
                except Exception:  # never let the thread die: the router would not notice
                    log.exception("rabbitmq_depth_worker_error")
                    self._failures += 1
                    self._reader.close()  # start over with a fresh connection
                    next_full = self._clock() + self._backoff()
                due = min([next_full, *self._fresh_due()])
                timeout = min(max(due - self._clock(), 0.0), self._keepalive)
                self._wake.wait(timeout)
                self._wake.clear()
        finally:
            self._reader.close()

    def _step(self, next_full: float) -> float:
        """One turn of the loop; returns when the next full poll is due."""
        now = self._clock()
        if now >= next_full:
            ok = self.poll_once()
            return self._clock() + (self._interval if ok else self._backoff())
        fresh = self._take_fresh()
        if fresh and not self.down and not self.poll_once(fresh):
            return self._clock() + self._backoff()
        self._reader.idle()
        return next_full

    def poll_once(self, addresses: Iterable[str] | None = None) -> bool:
        """Read the depth of each queue behind ``addresses`` (default: all) once and deliver
        it for every address that maps to it. False when the broker is unavailable."""
        with self._lock:
            if addresses is None:
                # Every queue, but those of addresses too new to read yet (FRESH_DELAY).
                now = self._clock()
                wanted = {a: name for a, name in self._queues.items() if self._fresh.get(a, now) <= now}
                self._fresh = {a: at for a, at in self._fresh.items() if at > now}
            else:
                wanted = {a: self._queues[a] for a in addresses if a in self._queues}
        by_queue: dict[str, list[str]] = {}
        for address, name in wanted.items():
            by_queue.setdefault(name, []).append(address)  # "q" and "/queue/q": read once
        for name, targets in by_queue.items():
            if self._stop.is_set():
                break
            try:
                ready = self._reader(name)
            except BrokerUnavailable as exc:
                self._failed(str(exc))
                return False
            if ready is None:
                continue
            for address in targets:
                self._deliver(address, ready)
        if by_queue:
            self._succeeded()
        return True

    def _take_fresh(self) -> list[str]:
        """The new addresses due to be read now (taken off the list)."""
        now = self._clock()
        with self._lock:
            due = [address for address, at in self._fresh.items() if at <= now]
            for address in due:
                del self._fresh[address]
        return due

    def _fresh_due(self) -> list[float]:
        with self._lock:
            return list(self._fresh.values())

    def _failed(self, error: str) -> None:
        self._failures += 1
        if self._down_since is None:  # once per outage, not once per retry
            self._down_since = self._clock()
            log.warning("rabbitmq_depth_unavailable", broker=self._broker, error=error, retry_in=self._backoff())

    def _succeeded(self) -> None:
        if self._down_since is not None:
            log.info(
                "rabbitmq_depth_recovered",
                broker=self._broker,
                down_for=round(self._clock() - self._down_since, 1),
                attempts=self._failures,
            )
        self._down_since = None
        self._failures = 0

    def _backoff(self) -> float:
        """interval, 2x, 4x ... up to max_backoff, by consecutive failures."""
        exponent = max(self._failures - 1, 0)
        return min(self._interval * 2 ** min(exponent, 16), self._max_backoff)
