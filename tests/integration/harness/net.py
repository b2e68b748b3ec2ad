"""Small socket helpers shared by the broker and router fixtures."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

from qpid_flow import testing


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that were free a moment ago (a broker needs three:
    AMQP, epmd, Erlang distribution). Another process may still take a port before our
    server binds it; the window is milliseconds and the kernel hands out ephemeral ports
    round-robin, so in practice it does not happen."""
    return testing.free_ports(count, host)


def free_port(host: str = "127.0.0.1") -> int:
    """Return one TCP port that was free a moment ago (see `free_ports`)."""
    return free_ports(1, host)[0]


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connect to host:port succeeds right now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def wait_for_port(
    host: str,
    port: int,
    timeout: float,
    *,
    alive: Callable[[], bool] | None = None,
    interval: float = 0.1,
) -> bool:
    """Poll until host:port accepts a TCP connection; return False on timeout.

    `alive` lets the caller stop waiting early when the process that should listen has died
    (returns False then too): waiting the full timeout for a crashed process wastes minutes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_accepts(host, port):
            return True
        if alive is not None and not alive():
            return False
        time.sleep(interval)
    return False


def wait_until_closed(host: str, port: int, timeout: float, interval: float = 0.1) -> bool:
    """Poll until host:port refuses connections; return False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not port_accepts(host, port):
            return True
        time.sleep(interval)
    return False
