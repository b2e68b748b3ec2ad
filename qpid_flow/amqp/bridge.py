"""Run callables on the reactor thread from any other thread (admin server, plugins).

Proton objects and qpid-flow's state belong to the reactor thread. Other threads hand
work over through Proton's ``EventInjector`` (a pipe the reactor selects on) and may
wait for the answer.
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from proton import Handler
from proton.reactor import ApplicationEvent, EventInjector

__all__ = ["NotStarted", "ReactorBridge", "StillRunning"]

log = structlog.get_logger(__name__)

T = TypeVar("T")


class _CallEvent(ApplicationEvent):
    """An application event whose handler is the bridge (not the container's handler)."""

    def __init__(self, bridge: ReactorBridge) -> None:
        super().__init__("qf_call", subject=bridge)

    @property
    def handler(self) -> ReactorBridge:
        return self.subject


class NotStarted(TimeoutError):
    """The reactor did not start a call within its timeout: it never will."""


class StillRunning(TimeoutError):
    """The reactor started a call, and has not finished it in twice its timeout."""


class ReactorBridge(Handler):
    """Owns the injector; ``call_soon`` is the one thread-safe entry into the reactor."""

    def __init__(self) -> None:
        super().__init__()
        self.injector = EventInjector()
        self._calls: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()

    def call_soon(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` on the reactor thread as soon as it is free. Thread-safe."""
        self._calls.put(callback)
        self.injector.trigger(_CallEvent(self))

    def call(self, callback: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``callback`` on the reactor thread and wait for its result (or exception).

        Raises :class:`NotStarted` (a TimeoutError) if the reactor has not started it within ``timeout`` seconds,
        and then it never runs: a change the caller was told failed (the admin
        endpoint's 503) must not be made later behind its back. One the reactor started
        in time is waited for ``timeout`` seconds more; past that, :class:`StillRunning`
        (a TimeoutError): it runs on, and its result is unknown to the caller."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return  # its caller gave up waiting
            try:
                future.set_result(callback())
            except Exception as exc:
                future.set_exception(exc)

        self.call_soon(run)
        # A TimeoutError the callback raised itself is its own answer (done), not the wait's.
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():
                return future.result()
            if future.cancel():
                raise NotStarted from None
        try:
            return future.result(timeout)  # it started as the wait ran out
        except concurrent.futures.TimeoutError:
            if future.done():
                return future.result()
            raise StillRunning from None  # the reactor is stuck in it: no HTTP thread waits for good

    def on_qf_call(self, _event: Any) -> None:
        while True:
            try:
                callback = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                callback()
            except Exception:
                log.exception("reactor_call_failed")

    def close(self) -> None:
        self.injector.close()
