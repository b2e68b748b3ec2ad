"""rabbitmq:3.10-management in Docker, driven through the docker SDK (QPID_FLOW_TEST_BROKER=docker).

Same interface as the local RabbitMQBroker. Only used when a Docker engine is reachable, which is
not the case on the project's dev machine, so this path is exercised by users with Docker.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
from typing import Any

from .broker import Broker, BrokerError
from .net import free_ports, wait_until_closed

IMAGE = "rabbitmq:3.10-management"
PLUGINS = b"[rabbitmq_management,rabbitmq_prometheus,rabbitmq_amqp1_0].\n"


def _enabled_plugins_tar() -> bytes:
    """A tar holding /etc/rabbitmq/enabled_plugins, for put_archive before the first start."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("enabled_plugins")
        info.size = len(PLUGINS)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(PLUGINS))
    return buf.getvalue()


class DockerRabbitMQBroker(Broker):
    """One container per broker; host ports are free ports bound on 127.0.0.1.

    kill() is `docker kill` (SIGKILL) and restart() starts the same container again: the host
    port mapping, hostname (hence node name) and Mnesia data survive, as with a real crash.
    """

    def __init__(self, *, management: bool = False, start_timeout: float = 120.0) -> None:
        import docker

        self.client = docker.from_env()
        self.start_timeout = start_timeout
        self.port, mport = free_ports(2)
        self.management_port: int | None = mport if management else None
        self.container: Any = None

    def start(self) -> None:
        if self.container is None:
            import docker.errors

            try:
                self.client.images.get(IMAGE)
            except docker.errors.ImageNotFound:
                self.client.images.pull(IMAGE)
            ports: dict[str, Any] = {"5672/tcp": ("127.0.0.1", self.port)}
            if self.management_port:
                ports["15672/tcp"] = ("127.0.0.1", self.management_port)
            self.container = self.client.containers.create(
                IMAGE, detach=True, ports=ports, labels={"org.qpid-flow.test": "broker"}
            )
            self.container.put_archive("/etc/rabbitmq", _enabled_plugins_tar())
            from .rabbitmq import _live  # atexit safety net shared with the local broker

            _live.add(self)
        self.container.start()
        try:
            self.wait_ready(self.start_timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.container is None:
            return
        with contextlib.suppress(Exception):
            self.container.stop(timeout=30)
        with contextlib.suppress(Exception):
            self.container.remove(force=True, v=True)
        self.container = None
        from .rabbitmq import _live

        _live.discard(self)

    def kill(self) -> None:
        if self.container is None:
            raise BrokerError("kill(): broker is not running")
        self.container.kill()  # SIGKILL
        self.container.wait(timeout=30)
        wait_until_closed(self.host, self.port, 10)

    def restart(self) -> None:
        if self.container is None:
            raise BrokerError("restart(): no container (stopped, not killed)")
        self.start()

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`rabbitmqctl ARGS` inside the container, answered as the local broker's ctl()."""
        if self.container is None:
            raise BrokerError("ctl(): broker is not running")
        result = self.container.exec_run(["rabbitmqctl", *args], demux=True)
        stdout, stderr = result.output
        return subprocess.CompletedProcess(
            ["rabbitmqctl", *args],
            result.exit_code,
            (stdout or b"").decode(errors="replace"),
            (stderr or b"").decode(errors="replace"),
        )

    def log_tail(self, lines: int = 60) -> str:
        if self.container is None:
            return ""
        try:
            return "--- docker logs ---\n" + self.container.logs(tail=lines).decode(errors="replace")
        except Exception as e:
            return f"(docker logs failed: {e!r})"
