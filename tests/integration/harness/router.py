"""Run qpid-flow (`python -m qpid_flow serve ...`) as a real child process for a test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from .net import free_port

PROJECT_ROOT = Path(__file__).resolve().parents[3]

# The admin token every qpid-flow of the test session runs with, and that `qpid-flow` client
# subprocesses send: tests/integration/conftest.py sets it for the whole session, and child
# processes inherit it. Changes through the admin endpoint need it.
ADMIN_TOKEN_VARIABLE = "QPID_FLOW_ADMIN_TOKEN"


def admin_request(admin: str, path: str) -> urllib.request.Request:
    """A request to `http://ADMIN/PATH` with the session's admin token, for `urlopen`."""
    request = urllib.request.Request(f"http://{admin}{path}")
    token = os.environ.get(ADMIN_TOKEN_VARIABLE)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


class StartRouter(Protocol):
    """Type of the `qpid_flow_process` fixture (a factory), for annotations in tests."""

    def __call__(
        self,
        broker_url: str | None = None,
        config_text: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> RouterProcess: ...


class RouterStartError(AssertionError):
    """qpid-flow exited or did not listen in time (message includes the log tail)."""


class RouterProcess:
    """One qpid-flow process listening on 127.0.0.1:port; output goes to `log_path`."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, log_path: Path, argv: list[str]) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path
        self.argv = argv

    @property
    def url(self) -> str:
        return f"amqp://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def resident_bytes(self) -> int:
        """The process's resident memory now (Linux /proc), for tests that watch it grow."""
        pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")

    def peak_resident_bytes(self) -> int:
        """The most resident memory the process has had (Linux /proc VmHWM): unlike the
        resident memory now, not blurred by what the allocator keeps after a free."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/PID/status")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Send `sig` and wait up to `timeout` s; SIGKILL if it is still alive. Returns the
        exit code (negative = killed by that signal, as in subprocess)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reap_group()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (crash simulation)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)
        self._reap_group()

    def _reap_group(self) -> None:
        # Anything qpid-flow may have spawned shares its session; leave nothing behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<RouterProcess pid={self.pid} {self.url} rc={self.returncode}>"


def _wait_for_listening(log_path: Path, timeout: float, alive: Callable[[], bool]) -> bool:
    """Wait for qpid-flow's own "listening" event (probing the port with a bare TCP
    connect would put a framing error in the log under test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        if '"event": "listening"' in log_path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


def start_router(
    workdir: Path,
    broker_url: str | None = None,
    config_text: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    start_timeout: float = 30.0,
    python: str = sys.executable,
    port: int | None = None,
) -> RouterProcess:
    """Start `python -m qpid_flow serve --listen 127.0.0.1:PORT [--broker URL] [--config F]
    EXTRA...` on a free port (or `port`, for clients that hard-code one), and return once it
    listens."""
    port = port or free_port()
    # One folder per router (several may run in one test), named by port so logs never mix.
    workdir = workdir / f"qpid-flow-{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "qpid_flow", "serve", "--listen", f"127.0.0.1:{port}"]
    if broker_url:
        argv += ["--broker", broker_url]
    if config_text is not None:
        config_path = workdir / "qpid-flow.toml"
        config_path.write_text(config_text)
        argv += ["--config", str(config_path)]
    argv += list(extra_args)
    log_path = workdir / "qpid-flow.log"
    # The project root on PYTHONPATH makes `-m qpid_flow` work from a plain checkout too (the
    # child runs in its own folder); with the editable install it changes nothing.
    pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath}
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    router = RouterProcess(proc, "127.0.0.1", port, log_path, argv)
    t0 = time.monotonic()
    if not _wait_for_listening(log_path, start_timeout, alive=lambda: proc.poll() is None):
        rc = proc.poll()
        router.stop(timeout=5)
        why = f"exited with code {rc}" if rc is not None else f"did not listen within {start_timeout:.0f}s"
        raise RouterStartError(
            f"qpid-flow {why} after {time.monotonic() - t0:.1f}s\n--- {log_path} (tail) ---\n{router.log_tail()}"
        )
    return router
