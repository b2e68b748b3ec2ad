"""ReactorBridge (amqp/bridge.py): other threads hand work to the reactor thread.

First without a reactor (the test plays it: it reads the injector's pipe and hands the bridge
its event), then with a real Proton Container running in a thread (no socket: the injector
is a pipe).
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from proton import Handler
from proton.reactor import Container

from qpid_flow.amqp.bridge import ReactorBridge, StillRunning


@pytest.fixture
def bridge() -> Iterator[ReactorBridge]:
    bridge = ReactorBridge()
    yield bridge
    for fd in bridge.injector.pipe:
        os.close(fd)


def pipe_bytes(bridge: ReactorBridge) -> bytes:
    """What the injector wrote to wake the reactor (read without blocking)."""
    fd = bridge.injector.fileno()
    data = b""
    while select.select([fd], [], [], 0)[0]:
        data += os.read(fd, 512)
    return data


def handle_events(bridge: ReactorBridge) -> int:
    """Play the reactor: take each injected event and dispatch it to its handler."""
    count = 0
    while not bridge.injector.queue.empty():
        event = bridge.injector.queue.get()
        event.dispatch(event.handler)
        count += 1
    return count


def test_call_soon_queues_one_event_for_the_bridge_per_call_and_runs_nothing(bridge: ReactorBridge) -> None:
    ran: list[int] = []
    bridge.call_soon(lambda: ran.append(1))
    bridge.call_soon(lambda: ran.append(2))
    assert ran == []
    assert pipe_bytes(bridge) == b"!!", "one wake-up of the reactor per call"
    events = list(bridge.injector.queue.queue)
    assert len(events) == 2
    assert all(event.handler is bridge and event.type.method == "on_qf_call" for event in events)


def test_the_bridges_event_runs_every_queued_callback_in_order(bridge: ReactorBridge) -> None:
    """The first event runs all the calls queued so far (the second finds none left), in the
    order they were handed over; one handed over by a callback runs in the same turn."""
    ran: list[str] = []

    def second() -> None:
        ran.append("second")
        bridge.call_soon(lambda: ran.append("from second"))

    bridge.call_soon(lambda: ran.append("first"))
    bridge.call_soon(second)
    bridge.call_soon(lambda: ran.append("third"))
    event = bridge.injector.queue.get()
    event.dispatch(event.handler)
    assert ran == ["first", "second", "third", "from second"]
    assert handle_events(bridge) == 3
    assert ran == ["first", "second", "third", "from second"]


def test_a_failing_callback_is_logged_and_the_next_ones_still_run(bridge: ReactorBridge) -> None:
    ran: list[str] = []

    def fails() -> None:
        raise RuntimeError("plugin bug")

    bridge.call_soon(fails)
    bridge.call_soon(lambda: ran.append("after"))
    with structlog.testing.capture_logs() as logs:
        handle_events(bridge)
    assert ran == ["after"]
    (entry,) = [e for e in logs if e["event"] == "reactor_call_failed"]
    assert entry["log_level"] == "error"


def test_call_waits_for_the_result_computed_on_the_reactor_thread(bridge: ReactorBridge) -> None:
    """A worker thread calls; the test's thread plays the reactor (waits for the pipe, handles
    the event): the worker gets the result, computed on the test's thread."""
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(bridge.call(threading.get_ident)))
    worker.start()
    readable, _, _ = select.select([bridge.injector.fileno()], [], [], 30)
    assert readable, "the call never reached the reactor"
    handle_events(bridge)
    worker.join(30)
    assert not worker.is_alive()
    assert results == [threading.get_ident()]


def test_a_call_nobody_answers_in_time_raises_and_its_callback_never_runs(bridge: ReactorBridge) -> None:
    """The admin endpoint answers such a change 503 ("did not answer in time") and the CLI
    says it failed: it ran later anyway, a policy the operator was told was not set
    changing flow control behind their back."""
    ran: list[str] = []
    with pytest.raises(TimeoutError):
        bridge.call(lambda: ran.append("late"), timeout=0)
    assert ran == []
    handle_events(bridge)
    assert ran == []
    worker_result: list[int] = []
    worker = threading.Thread(target=lambda: worker_result.append(bridge.call(lambda: 7)))
    worker.start()
    select.select([bridge.injector.fileno()], [], [], 30)
    while worker.is_alive():
        handle_events(bridge)
        worker.join(0.01)
    assert worker_result == [7]


def test_with_a_real_reactor_call_runs_on_its_thread_and_close_lets_it_end() -> None:
    """A Container in a thread with the injector as its only selectable: ``call`` runs on the
    container's thread and returns its value or raises its exception; after ``close`` the
    container has nothing left and its run ends."""
    bridge = ReactorBridge()
    container = Container(Handler())
    container.selectable(bridge.injector)
    reactor = threading.Thread(target=container.run, name="reactor", daemon=True)
    reactor.start()
    try:
        assert bridge.call(lambda: threading.current_thread().name, timeout=30) == "reactor"
        with pytest.raises(ZeroDivisionError):
            bridge.call(lambda: 1 // 0, timeout=30)
    finally:
        bridge.close()
        reactor.join(30)
    assert not reactor.is_alive()
    for fd in bridge.injector.pipe:
        os.close(fd)


def test_a_call_the_reactor_started_in_time_but_is_stuck_in_is_not_waited_for_for_good(bridge: ReactorBridge) -> None:
    """Waited for without a bound once it had started: a reactor stuck in it held the
    admin thread (and one of the endpoint's connections) for good."""
    started, release = threading.Event(), threading.Event()
    outcome: list[BaseException | str] = []

    def stuck() -> str:
        started.set()
        release.wait(30)
        return "done"

    def wait() -> None:
        try:
            outcome.append(bridge.call(stuck, timeout=0.2))
        except TimeoutError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=wait)
    worker.start()
    reactor = threading.Thread(target=lambda: handle_events(bridge))
    select.select([bridge.injector.fileno()], [], [], 30)
    reactor.start()  # the reactor takes the call at once, and is stuck in it
    assert started.wait(30)
    worker.join(5)
    release.set()
    reactor.join(30)
    assert not worker.is_alive(), "the caller still waited"
    assert len(outcome) == 1 and isinstance(outcome[0], StillRunning)
