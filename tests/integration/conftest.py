"""Fixtures for integration tests: real RabbitMQ, real qpid-flow processes, real C clients.

Environment knobs:
- QPID_FLOW_TEST_BROKER_URL=amqp://user:pass@host:port  use that broker for `rabbitmq` (compose
  `tests` service). `fresh_rabbitmq` still starts a private broker, because kill/restart tests
  need one they control; the compose test image installs rabbitmq-server for that.
- QPID_FLOW_TEST_BROKER=docker  with a reachable Docker engine, brokers are rabbitmq:3.10
  containers instead of the local Debian rabbitmq-server.
Set here: QPID_FLOW_ADMIN_TOKEN, a fresh admin token for every qpid-flow the tests start and
every `qpid-flow` client command they run (both inherit the environment).
A missing rabbitmq-server or Proton C toolchain is an error (with the install hint), never a skip.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import pytest

from .harness.broker import Broker, BrokerError
from .harness.cexamples import ProtonCExamples, build_examples
from .harness.rabbitmq import make_broker
from .harness.router import ADMIN_TOKEN_VARIABLE, RouterProcess, StartRouter, start_router

_ROUTERS = pytest.StashKey[list[RouterProcess]]()
_BROKERS = pytest.StashKey[list[Broker]]()


@pytest.fixture(scope="package", autouse=True)
def admin_token() -> Iterator[str]:
    """The admin token of this package's tests, in the environment while they run: routers
    started here read it (admin_token), and the CLI subprocesses send it. Package scope, so
    that unit tests run in the same session never see it."""
    token = secrets.token_urlsafe(24)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ADMIN_TOKEN_VARIABLE, token)
        yield token


def _start_broker(*, controllable: bool) -> Broker:
    try:
        broker = make_broker(controllable=controllable)
        broker.start()
    except BrokerError as e:
        pytest.fail(f"RabbitMQ test broker unavailable: {e}", pytrace=False)
    return broker


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[Broker]:
    """The session's RabbitMQ (AMQP 1.0 on `.url`). Shared: do not kill it; use unique queue
    names (harness.blocking_clients.unique_address)."""
    broker = _start_broker(controllable=False)
    yield broker
    broker.stop()


@pytest.fixture
def fresh_rabbitmq(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A private RabbitMQ for this test only, on its own ports: it may kill() and restart() it
    (same port, same data) without disturbing other tests. Costs one broker start (~4-8 s)."""
    broker = _start_broker(controllable=True)
    request.node.stash.setdefault(_BROKERS, []).append(broker)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def proton_c_examples(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ProtonCExamples:
    """Proton C `send` / `receive` built once (cached across runs in pytest's cache dir when
    the cache plugin is on). Usage: `[str(x.send), host, str(port), address, str(count)]`; see
    ProtonCExamples for the full argv contract."""
    cache = getattr(request.config, "cache", None)
    base = cache.mkdir("proton-c-examples") if cache is not None else tmp_path_factory.mktemp("proton-c")
    try:
        return build_examples(Path(base))
    except (FileNotFoundError, RuntimeError) as e:
        pytest.fail(f"Proton C examples unavailable: {e}", pytrace=False)


@pytest.fixture
def qpid_flow_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StartRouter]:
    """Factory: `start(broker_url=None, config_text=None, extra_args=()) -> RouterProcess`.

    Runs `python -m qpid_flow serve --listen 127.0.0.1:<free port> [--broker URL]
    [--config <tmp>/qpid-flow.toml] EXTRA...`, logs to <tmp_path>/qpid-flow-<port>/qpid-flow.log,
    and returns once the port accepts TCP (30 s; fails with the log tail if it exits first).
    Every process still running at teardown is stopped (SIGTERM, then SIGKILL); when the test
    fails, the log tails are added to the failure report.
    """
    routers = request.node.stash.setdefault(_ROUTERS, [])

    def start(
        broker_url: str | None = None,
        config_text: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> RouterProcess:
        router = start_router(tmp_path, broker_url, config_text, extra_args)
        routers.append(router)
        return router

    yield start
    for router in routers:
        router.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, attach qpid-flow and broker log tails to the report, where they are read."""
    report: pytest.TestReport = yield
    if report.failed and call.when in ("setup", "call"):
        for router in item.stash.get(_ROUTERS, []):
            report.sections.append(
                (f"qpid-flow log {router.log_path} (tail, rc={router.returncode})", router.log_tail())
            )
        for broker in item.stash.get(_BROKERS, []):
            report.sections.append((f"broker log {broker.url}", broker.log_tail(40)))
    return report
