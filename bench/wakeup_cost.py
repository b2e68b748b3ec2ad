"""What waking up costs on this machine: the same Python work back to back and after a sleep.

    .venv/bin/python bench/wakeup_cost.py

Not a test and not about qpid-flow: it characterises the machine the other benchmarks run
on. Below saturation qpid-flow sleeps in ``epoll`` between messages, so each turn of its
loop starts with the process just woken. Where waking is expensive (cold caches after the
core idled, a virtual CPU descheduled by its host) the CPU per message at moderate rates
is several times that at saturation, whatever qpid-flow does within the turn. Prints, for
each sleep, the wall time of the work itself and the CPU the process used per iteration
(work + sleep + wake-up), and the round trip of a one-byte ping-pong between two
processes over a socket pair.
"""

from __future__ import annotations

import os
import resource
import socket
import time

ITERATIONS = 2_000
PING_PONGS = 20_000
SLEEPS_S = (0.0, 0.0002, 0.001, 0.005)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _work() -> dict[int, str]:
    """A few hundred dict and str operations: about one relayed message's Python work."""
    return {i: str(i) for i in range(300)}


def work_after_sleep(sleep_s: float) -> tuple[float, float]:
    """Mean wall time of the work and mean CPU per iteration, in microseconds."""
    work_s = 0.0
    cpu0 = _cpu_seconds()
    for _ in range(ITERATIONS):
        if sleep_s:
            time.sleep(sleep_s)
        t0 = time.perf_counter()
        _work()
        work_s += time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    return 1e6 * work_s / ITERATIONS, 1e6 * cpu / ITERATIONS


def ping_pong() -> float:
    """Mean round trip of one byte to a child process and back, in microseconds."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        for _ in range(PING_PONGS):
            child.recv(1)
            child.send(b"y")
        os._exit(0)
    t0 = time.perf_counter()
    for _ in range(PING_PONGS):
        parent.send(b"x")
        parent.recv(1)
    elapsed = time.perf_counter() - t0
    os.waitpid(pid, 0)
    return 1e6 * elapsed / PING_PONGS


def main() -> None:
    print(f"{os.cpu_count()} cores; {ITERATIONS:,} iterations of the same work per line")
    print(f"{'sleep before':>13}  {'work wall us':>12}  {'CPU us/iteration':>16}")
    for sleep_s in SLEEPS_S:
        wall_us, cpu_us = work_after_sleep(sleep_s)
        print(f"{sleep_s * 1000:>10.1f} ms  {wall_us:>12.1f}  {cpu_us:>16.1f}")
    print(f"ping-pong between two processes over a socket pair: {ping_pong():.1f} us round trip")


if __name__ == "__main__":
    main()
