"""The plugin tested with what qpid-flow ships for plugin authors (``qpid_flow.testing``, a
pytest plugin): real destinations and a manual control object instead of fakes, and a real
qpid-flow process with the plugin loaded."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

import pytest
from qpid_flow.config import RouterConfig
from qpid_flow.testing import ManualControl, RouterProcess, RouterStartError, make_destination, make_hooks
from test_rabbitmq_depth import BROKER, FakeBroker

from qpid_flow_rabbitmq_depth import PikaDepthReader, RabbitMQDepth

if TYPE_CHECKING:
    from collections.abc import Callable

    from qpid_flow.plugin.control import RouterControl


def test_readings_set_the_depth_of_real_destinations() -> None:
    broker = FakeBroker({"orders": 37})
    plugin = RabbitMQDepth(lambda _settings: PikaDepthReader(broker.connect), threaded=False)
    hooks = make_hooks(plugin, config=RouterConfig(broker=BROKER))
    orders = make_destination("/queue/orders", hooks=hooks, max_count=1000)
    control = ManualControl([orders], hooks=hooks)
    plugin.qpid_flow_started(control=cast("RouterControl", control))
    plugin.qpid_flow_destination_created(destination=orders)
    assert plugin.worker is not None
    assert plugin.worker.poll_once()
    # A backlog found in the broker (no consumer holds anything) is the depth at once.
    assert orders.depth == 37
    assert orders.stats()["depth"] == 37


def _listening(router: RouterProcess) -> dict[str, object]:
    for line in router.log_text().splitlines():
        if '"event": "listening"' in line:
            record: dict[str, object] = json.loads(line)
            return record
    raise AssertionError(router.log_tail())


def test_a_standalone_router_loads_it_and_it_stays_idle(qpid_flow_router: Callable[..., RouterProcess]) -> None:
    router = qpid_flow_router(config_text='[plugins.rabbitmq_depth]\ninterval = "1s"\n')
    plugins = _listening(router)["plugins"]
    assert isinstance(plugins, list) and "rabbitmq_depth" in plugins
    assert "rabbitmq_depth_started" not in router.log_text()  # standalone: no broker to read


def test_a_bad_setting_refuses_the_start_naming_the_key(qpid_flow_router: Callable[..., RouterProcess]) -> None:
    with pytest.raises(RouterStartError) as caught:
        qpid_flow_router(
            broker_url="amqp://127.0.0.1:1",
            config_text='[plugins.rabbitmq_depth]\ninterval = "often"\n',
            start_timeout=20,
        )
    assert "plugins.rabbitmq_depth.interval" in str(caught.value)


def test_a_bad_setting_refuses_a_standalone_start_too(qpid_flow_router: Callable[..., RouterProcess]) -> None:
    """Standalone, the plugin reads nothing, but its table is still checked: a mistake is
    found now, not on the day a broker is configured."""
    with pytest.raises(RouterStartError) as caught:
        qpid_flow_router(config_text='[plugins.rabbitmq_depth]\nvhost = ""\n', start_timeout=20)
    assert "plugins.rabbitmq_depth.vhost" in str(caught.value)
