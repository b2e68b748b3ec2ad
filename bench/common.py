"""Shared helpers of the benchmark suite (bench/run.py): processes, CPU and memory
accounting, statistics, table printing. Not a test.

Every process a benchmark starts goes through :class:`Processes`, which starts it in its
own session (process group) and kills the whole group on exit, error or signal, so a
failed or interrupted run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.harness.net import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
PYTHON = sys.executable


class BenchError(RuntimeError):
    """A benchmark run failed (a client exited non-zero, a process did not start...)."""


# --- /proc accounting --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its running children, in seconds (threads
    included), from /proc/PID/stat: qpid-flow's CPU counts its event-log writer's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / CLK_TCK
    for child in _children(pid):
        with contextlib.suppress(OSError):  # ended between listing and reading
            total += cpu_seconds(child)
    return total


def _children(pid: int) -> list[int]:
    children: list[int] = []
    with contextlib.suppress(OSError):  # gone meanwhile
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                children += [int(child) for child in (task / "children").read_text().split()]
    return children


def runqueue_wait_seconds(pid: int) -> float:
    """Time the threads of a process spent runnable but waiting for a CPU, in seconds.

    The second field of /proc/PID/task/TID/schedstat (nanoseconds). On a machine with
    fewer cores than busy processes this is the queueing behind a latency tail."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended between listing and reading
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def rss_bytes(pid: int) -> int:
    """Resident set size now, from /proc/PID/statm."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def peak_rss_bytes(pid: int) -> int:
    """High-water mark of the resident set (VmHWM), from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class CpuMeter:
    """CPU seconds a set of processes used between start() and stop(), and the seconds
    they waited for a CPU while runnable (``waited``)."""

    def __init__(self, **pids: int | None) -> None:
        self.pids = {name: pid for name, pid in pids.items() if pid}
        self.start_values: dict[str, float] = {}
        self.start_waits: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.waited: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self.start_values = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.start_waits = {name: runqueue_wait_seconds(pid) for name, pid in self.pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                self.used[name] = cpu_seconds(pid) - self.start_values[name]
                self.waited[name] = runqueue_wait_seconds(pid) - self.start_waits[name]
        return self.used


# --- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Spread:
    """Median and min-max of a metric over rounds."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        kept = [v for v in values if v is not None and not math.isnan(v)]
        if not kept:
            return None
        return cls(statistics.median(kept), min(kept), max(kept), len(kept))

    def fmt(self, digits: int = 0, unit: str = "") -> str:
        return f"{self.median:,.{digits}f}{unit} ({self.low:,.{digits}f}-{self.high:,.{digits}f})"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def spread_fmt(values: Iterable[float | None], digits: int = 0, unit: str = "") -> str:
    s = Spread.of(values)
    return "n/a" if s is None else s.fmt(digits, unit)


def summarise(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """{key: {median, min, max, n}} over the runs that have the key."""
    out: dict[str, Any] = {}
    for key in keys:
        s = Spread.of(r.get(key) for r in runs if "error" not in r)
        if s is not None:
            out[key] = s.as_dict()
    return out


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    s = Spread.of(r.get(key) for r in runs if "error" not in r)
    return None if s is None else s.median


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: Callable[[str], None] = print) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out("  ".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(headers, widths, strict=True))))
    for row in rows:
        out("  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "NOT MEASURED"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "NOT met"


# --- processes -------------------------------------------------------------------------------


@dataclass
class Proc:
    """A process started by :class:`Processes`: its Popen, log file and name."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path | None
    argv: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"{self.name} did not finish within {timeout:.0f} s\n{self.tail()}") from exc

    def tail(self, lines: int = 20) -> str:
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- {self.log.name} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


class Processes:
    """Starts processes in their own session and stops every one of them on close()."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.live: list[Proc] = []
        self._count = 0

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        stdout_to_log: bool = True,
        capture: bool = False,
        env: dict[str, str] | None = None,
    ) -> Proc:
        self._count += 1
        log = self.workdir / f"{self._count:04d}-{name}.log"
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})}
        with open(log, "wb") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if capture else (out if stdout_to_log else subprocess.DEVNULL),
                stderr=out,
                env=full_env,
                cwd=self.workdir,
                start_new_session=True,
            )
        proc = Proc(name, popen, log, list(argv))
        self.live.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.live):
            proc.stop(timeout=10)
        self.live.clear()


def wait_for_log(proc: Proc, marker: str, timeout: float) -> None:
    """Wait until ``marker`` appears in the process's log (it prints it once listening)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise BenchError(f"{proc.name} exited with code {proc.popen.returncode}\n{proc.tail()}")
        if proc.log is not None and marker in proc.log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise BenchError(f"{proc.name} did not start within {timeout:.0f} s\n{proc.tail()}")


@dataclass
class Server:
    """An intermediary under test (qpid-flow or the minimal relay) listening on ``port``."""

    proc: Proc
    port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"


def start_qpid_flow(
    procs: Processes,
    *,
    broker_url: str | None = None,
    config: str | None = None,
    events: Path | None = None,
    events_format: str = "jsonl",
    profile: Path | None = None,
    name: str = "qpid-flow",
) -> Server:
    """``python -m qpid_flow serve --listen 127.0.0.1:PORT ...`` on a free port, started
    and ready (its ``listening`` event is in its log). ``profile``: run under cProfile."""
    port = free_port()
    argv = [PYTHON]
    if profile is not None:
        argv += ["-m", "cProfile", "-o", str(profile)]
    argv += ["-m", "qpid_flow", "serve", "--listen", f"127.0.0.1:{port}", "--log-format", "json"]
    if broker_url:
        argv += ["--broker", broker_url]
    if config is not None:
        path = procs.workdir / f"qpid-flow-{port}.toml"
        path.write_text(config)
        argv += ["--config", str(path)]
    if events is not None:
        argv += ["--events", str(events), "--events-format", events_format]
    proc = procs.start(name, argv)
    wait_for_log(proc, '"event": "listening"', 30)
    if broker_url:
        wait_for_log(proc, '"event": "upstream_connected"', 30)
    return Server(proc, port)


def start_minimal_relay(procs: Processes, container: str = "proton") -> Server:
    """bench/minimal_relay.py on a free port; ``container``: ``proton`` (stock reactor) or
    ``qpid-flow`` (qpid-flow's RelayContainer)."""
    port = free_port()
    argv = [PYTHON, str(BENCH / "minimal_relay.py"), "--listen", f"127.0.0.1:{port}", "--container", container]
    proc = procs.start("minimal-relay", argv)
    wait_for_log(proc, "listening", 30)
    return Server(proc, port)


def start_minimal_forwarder(procs: Processes, broker_url: str) -> Server:
    """bench/minimal_forwarder.py (the floor of broker mode) on a free port, in front of ``broker_url``."""
    port = free_port()
    argv = [PYTHON, str(BENCH / "minimal_forwarder.py"), "--listen", f"127.0.0.1:{port}", "--broker", broker_url]
    proc = procs.start("minimal-forwarder", argv)
    wait_for_log(proc, "listening", 30)
    return Server(proc, port)


def run_pyclient(procs: Processes, name: str, args: Sequence[str]) -> Proc:
    """Start bench/pyclients.py (a Python Proton client in its own process)."""
    return procs.start(name, [PYTHON, str(BENCH / "pyclients.py"), *args], capture=True)


def client_result(proc: Proc, timeout: float) -> dict[str, Any]:
    """Wait for a bench/pyclients.py process and parse the JSON line it printed."""
    try:
        out, _ = proc.popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{proc.name} did not finish within {timeout:.0f} s\n{proc.tail()}") from exc
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"{proc.name} exited with code {proc.popen.returncode} and no result\n{proc.tail()}")
    result = json.loads(lines[-1])
    if result.get("error"):
        raise BenchError(f"{proc.name}: {result['error']}\n{proc.tail()}")
    return result


def install_signal_handlers() -> None:
    """SIGTERM / SIGHUP raise KeyboardInterrupt, so every finally: block stops what it started."""

    def raise_interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_interrupt)
