"""The epoll selector under the reactor: readiness, interest changes, deadlines, many sockets."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from qpid_flow.amqp.epoll import EpollSelector


class FakeSelectable:
    """What the selector reads of a Proton selectable."""

    def __init__(self, sock: socket.socket | None, reading: bool = False, writing: bool = False) -> None:
        self.sock = sock
        self.reading = reading
        self.writing = writing
        self._deadline = 0.0

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    @property
    def deadline(self) -> float | None:
        return self._deadline or None


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for a, b in made:
        a.close()
        b.close()


def pair(pairs: list[tuple[socket.socket, socket.socket]]) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    pairs.append((a, b))
    return a, b


def test_a_socket_is_reported_readable_only_while_its_selectable_reads(pairs: Any) -> None:
    selector = EpollSelector()
    mine, other = pair(pairs)
    selectable = FakeSelectable(mine, reading=True)
    selector.add(selectable)
    assert selector.select(0) == ([], [], [])
    other.send(b"x")
    assert selector.select(0) == ([selectable], [], [])
    selectable.reading = False
    selector.update(selectable)
    assert selector.select(0) == ([], [], []), "no interest: not reported, not even as hung up"
    selectable.writing = True
    selector.update(selectable)
    assert selector.select(0) == ([], [selectable], [])
    selector.remove(selectable)
    assert selector.select(0) == ([], [], []) and selector.selectables == 0


def test_a_deadline_bounds_the_wait_and_expires_its_selectable() -> None:
    selector = EpollSelector()
    timer = FakeSelectable(None)  # no socket, like Proton's timer selectable
    timer._deadline = time.time() + 0.05
    selector.add(timer)
    started = time.monotonic()
    readable, writable, expired = selector.select(3.0)
    assert time.monotonic() - started < 1.0, "woke at the deadline, not after the timeout"
    if not expired:  # woke a hair early: the next wait expires it
        readable, writable, expired = selector.select(3.0)
    assert (readable, writable, expired) == ([], [], [timer])


def test_a_reused_descriptor_belongs_to_its_new_selectable(pairs: Any) -> None:
    selector = EpollSelector()
    first, first_peer = socket.socketpair()
    old = FakeSelectable(first, reading=True)
    selector.add(old)
    mine, other = pair(pairs)
    fd = first.fileno()
    first.close()  # closed without being removed: the kernel drops it from epoll
    first_peer.close()
    os.dup2(mine.fileno(), fd)  # the same number, now another socket
    reused = socket.socket(fileno=fd)
    try:
        new = FakeSelectable(reused, reading=True)
        selector.add(new)
        selector.remove(old)  # must not unregister the new owner of the descriptor
        other.send(b"x")
        assert selector.select(0) == ([new], [], [])
    finally:
        reused.close()


def test_descriptors_past_1024_are_watched(pairs: Any) -> None:
    selector = EpollSelector()
    selectables = []
    for _ in range(600):
        mine, other = pair(pairs)
        selectables.append((FakeSelectable(mine, reading=True), other))
    high = [(s, other) for s, other in selectables if s.fileno() >= 1024]
    assert high, "the test needs descriptors numbered 1,024 or more"
    for selectable, _ in selectables:
        selector.add(selectable)
    for _, other in high:
        other.send(b"x")
    readable, _, _ = selector.select(0)
    assert {id(s) for s in readable} == {id(s) for s, _ in high}
