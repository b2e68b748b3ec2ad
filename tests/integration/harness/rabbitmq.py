"""RabbitMQ 3.10 (Debian package) with its AMQP 1.0 plugin, isolated in a private temp folder.

Isolation (see /work/shared/BROKERS.md): every path RabbitMQ would read or write under /etc,
/var/lib or /var/log is redirected into the temp folder through RABBITMQ_* variables, HOME holds
the Erlang cookie shared by the server and rabbitmqctl, and all three ports (AMQP, epmd, Erlang
distribution) are free ports picked at start. A system RabbitMQ on 5672/4369 (e.g. started by the
package's postinst on a CI VM with systemd) is therefore never touched, and several brokers can
run at once (session broker + `fresh_rabbitmq`).

Process ownership: we start our own epmd and run `rabbitmq-server` in the foreground, each in its
own session (process group), so stopping is "kill these pids/groups" and nothing survives us.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import secrets
import shutil
import signal
import string
import subprocess
import tempfile
from pathlib import Path

from .broker import Broker, BrokerError, ExternalBroker
from .net import free_ports, wait_for_port, wait_until_closed

RABBIT_BIN = "/usr/lib/rabbitmq/bin"
INSTALL_HINT = "run `bash .ci/install-deps` (apt-get install rabbitmq-server) first"

_live: set[Broker] = set()


@atexit.register
def _stop_leftovers() -> None:
    """Safety net: a crashed pytest (or a forgotten stop) must not leave brokers running."""
    for b in list(_live):
        with contextlib.suppress(Exception):
            b.stop()


def _epmd_path() -> str:
    found = shutil.which("epmd") or next(iter(sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))), None)
    if not found:
        raise BrokerError(f"epmd (Erlang) not found; {INSTALL_HINT}")
    return found


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def _kill_group(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    """Signal a whole process group we created with start_new_session=True."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class RabbitMQBroker(Broker):
    """A private RabbitMQ node. `start()` blocks until AMQP 1.0 works; `stop()` is graceful.

    Timings on the 2-core dev machine: start 5-8 s (up to ~18 s when loaded; we wait up to
    `start_timeout`), graceful stop a few seconds, kill instant, restart like start.
    """

    def __init__(
        self,
        *,
        management: bool = False,
        start_timeout: float = 90.0,
        workdir: str | Path | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        if not os.path.exists(f"{RABBIT_BIN}/rabbitmq-server"):
            raise BrokerError(f"RabbitMQ is not installed ({RABBIT_BIN}/rabbitmq-server missing); {INSTALL_HINT}")
        self.management = management
        self.start_timeout = start_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="qpid-flow-rabbitmq-"))
        ports = free_ports(5 if management else 4)
        self.port, self.epmd_port, self.dist_port = ports[:3]
        self.management_port: int | None = ports[4] if management else None
        # (CA, certificate, key): a TLS listener on tls_port beside the plain one.
        self.tls = tls
        self.tls_port = ports[3]
        self.nodename = f"qpidflow{self.port}@localhost"
        self._server: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._prepared = False
        self.env = self._make_env()

    # -- files and environment -------------------------------------------------------------

    def _make_env(self) -> dict[str, str]:
        w = self.workdir
        # Drop inherited RABBITMQ_*/ERL_* settings and NOTIFY_SOCKET (which makes the start
        # script believe it runs under systemd): only what we set below may configure the node.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_")) and k != "NOTIFY_SOCKET"}
        env.update(
            HOME=str(w / "home"),  # .erlang.cookie, read by the server and by rabbitmqctl
            PATH=f"{RABBIT_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_CONFIG_FILE=str(w / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(w / "advanced.config"),  # absent on purpose
            RABBITMQ_CONF_ENV_FILE=str(w / "rabbitmq-env.conf"),  # not /etc/rabbitmq/...
            RABBITMQ_ENABLED_PLUGINS_FILE=str(w / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(w / "mnesia"),
            RABBITMQ_LOG_BASE=str(w / "log"),
            RABBITMQ_PID_FILE=str(w / "rabbitmq.pid"),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.epmd_port),
        )
        return env

    def _prepare(self) -> None:
        w = self.workdir
        for d in ("home", "mnesia", "log"):
            (w / d).mkdir(parents=True, exist_ok=True)
        cookie = w / "home" / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
            cookie.chmod(0o400)  # Erlang refuses a cookie readable by others
        conf = [
            f"listeners.tcp.default = 127.0.0.1:{self.port}",
            "log.console = false",
            "log.file.level = info",
        ]
        if self.tls is not None:
            ca, cert, key = self.tls
            conf += [
                f"listeners.ssl.default = 127.0.0.1:{self.tls_port}",
                f"ssl_options.cacertfile = {ca}",
                f"ssl_options.certfile = {cert}",
                f"ssl_options.keyfile = {key}",
                "ssl_options.verify = verify_none",
                "ssl_options.fail_if_no_peer_cert = false",
            ]
        plugins = ["rabbitmq_amqp1_0"]
        if self.management_port:
            conf += ["management.tcp.ip = 127.0.0.1", f"management.tcp.port = {self.management_port}"]
            plugins.append("rabbitmq_management")
        (w / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        (w / "rabbitmq-env.conf").write_text("")
        # Same content `rabbitmq-plugins enable --offline` writes, without its ~5 s of Erlang
        # start-up; dependencies of these plugins are resolved by the node at boot.
        (w / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        self._prepared = True

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    @property
    def pid(self) -> int | None:
        """pid of the Erlang VM (beam.smp), from RABBITMQ_PID_FILE, once the node is up."""
        try:
            return int((self.workdir / "rabbitmq.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def _start_epmd(self) -> None:
        if self._epmd is not None and self._epmd.poll() is None:
            return
        # Our own epmd on our own port: the one erl would spawn (`epmd -daemon`) detaches and
        # outlives the broker, and would be shared with any other Erlang node on the machine.
        log = open(self.workdir / "epmd.log", "ab")  # noqa: SIM115 - owned by the child
        self._epmd = subprocess.Popen(
            [_epmd_path(), "-address", "127.0.0.1", "-port", str(self.epmd_port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        if not wait_for_port("127.0.0.1", self.epmd_port, 10, alive=lambda: self._epmd.poll() is None):  # type: ignore[union-attr]
            raise BrokerError(f"epmd did not listen on {self.epmd_port}\n{_tail(self.workdir / 'epmd.log', 20)}")

    def start(self) -> None:
        """Start the node (no-op if running) and block until AMQP 1.0 answers."""
        if self.running:
            return
        if not self._prepared:
            self._prepare()
        _live.add(self)
        self._start_epmd()
        (self.workdir / "rabbitmq.pid").unlink(missing_ok=True)
        log = open(self.workdir / "server.out", "ab")  # noqa: SIM115 - owned by the child
        # Foreground (not -detached): the Popen is the start script, which traps SIGTERM and
        # stops the VM cleanly; its session holds beam.smp and erl_child_setup, so killpg
        # reaches everything.
        self._server = subprocess.Popen(
            [f"{RABBIT_BIN}/rabbitmq-server"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
        )
        log.close()
        try:
            self.wait_ready(self.start_timeout, alive=lambda: self.running)
        except BaseException:
            self._halt_server()
            raise

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `rabbitmqctl ARGS` against this node (e.g. ctl("list_queues", "name", "messages"))."""
        return subprocess.run(
            [f"{RABBIT_BIN}/rabbitmqctl", "-n", self.nodename, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _halt_server(self, graceful_timeout: float = 0) -> None:
        proc = self._server
        if proc is None:
            return
        if graceful_timeout and proc.poll() is None:
            # SIGTERM to the foreground start script = `kill -TERM beam` = init:stop(): the same
            # graceful shutdown as `rabbitmqctl shutdown` without starting a second Erlang VM.
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(graceful_timeout)
        _kill_group(proc)  # stragglers (or everything, if graceful timed out)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        self._server = None

    def stop(self) -> None:
        """Graceful stop, then SIGKILL whatever is left, epmd included; removes the temp dir."""
        self._halt_server(graceful_timeout=30)
        if self._epmd is not None:
            self._epmd.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._epmd.wait(5)
            _kill_group(self._epmd)
            self._epmd = None
        _live.discard(self)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the broker (beam.smp and its helpers) to simulate a crash; data dir, ports and
        epmd are kept so `restart()` brings the same node back on the same port."""
        if self._server is None:
            raise BrokerError("kill(): broker is not running")
        beam = self.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # Kill the VM first and let the start script reap it (and exit by itself): killing
            # the script too at the same instant would orphan beam.smp as a zombie under pid 1.
            if beam is not None and os.getpgid(beam) == self._server.pid:
                os.kill(beam, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._server.wait(10)
        _kill_group(self._server)  # still booting (no pid file yet) or helpers left over
        self._server.wait(10)
        self._server = None
        wait_until_closed(self.host, self.port, 10)

    def restart(self) -> None:
        """Start again after kill() (or stop of the server only) on the same port and data."""
        if self.running:
            raise BrokerError("restart(): broker is still running; kill() it first")
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(
            t
            for t in (
                _tail(self.workdir / "server.out", lines),
                _tail(self.workdir / "log" / f"{self.nodename}.log", lines),
            )
            if t
        )


def docker_engine_available() -> bool:
    """True if the docker SDK is importable and a Docker engine answers ping()."""
    try:
        import docker

        return bool(docker.from_env(timeout=5).ping())
    except Exception:
        return False


def make_broker(*, controllable: bool = False, management: bool = False) -> Broker:
    """Pick the broker implementation from the environment.

    - QPID_FLOW_TEST_BROKER_URL=amqp://...: use that existing broker (compose `tests` service),
      unless `controllable` is required (kill/restart tests), which then get a private broker.
    - QPID_FLOW_TEST_BROKER=docker and a reachable engine: rabbitmq:3.10-management via the SDK.
    - otherwise: the local Debian rabbitmq-server (fails with an install hint if missing).
    """
    url = os.environ.get("QPID_FLOW_TEST_BROKER_URL")
    if url and not controllable:
        return ExternalBroker(url)
    if os.environ.get("QPID_FLOW_TEST_BROKER") == "docker" and docker_engine_available():
        from .rabbitmq_docker import DockerRabbitMQBroker

        return DockerRabbitMQBroker(management=management)
    return RabbitMQBroker(management=management)


__all__ = ["Broker", "BrokerError", "RabbitMQBroker", "make_broker"]
