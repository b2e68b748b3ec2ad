"""What a plugin declares, and that qpid-flow's own policies use nothing more: destination
settings, policy checks, admin routes, and a plugin leaving when it has nothing to do."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, cast

import pytest

from qpid_flow import hookimpl
from qpid_flow.admin.http import AdminServer
from qpid_flow.config import ConfigError, DestinationPolicy, build_config, parse_non_negative_int
from qpid_flow.core.registry import Destinations
from qpid_flow.plugin.declarations import AdminRequest, AdminRoute, DestinationSetting
from qpid_flow.plugin.manager import BUILTIN_PLUGINS, Hooks, build_plugin_manager


class Priority:
    """A third-party plugin with a destination key of its own and a rule about it."""

    @hookimpl
    def qpid_flow_destination_settings(self) -> list[DestinationSetting]:
        return [DestinationSetting("priority_levels", parse_non_negative_int, ("x-priority",))]

    @hookimpl
    def qpid_flow_destination_policy_check(self, policy: DestinationPolicy, where: str) -> None:
        levels = policy.setting("priority_levels")
        if levels is not None and levels > 10:
            raise ConfigError(f"{where}.priority_levels", levels, "must be at most 10")


def _manager(*extra: object) -> Any:
    pm = build_plugin_manager()
    for index, plugin in enumerate(extra):
        pm.register(plugin, name=f"extra{index}")
    return pm


def test_a_plugins_destination_key_is_read_like_a_built_in_one() -> None:
    config = build_config(
        {"destinations": {"jobs": {"priority_levels": 4, "max_count": 9}}}, plugins=_manager(Priority())
    )
    policy = config.policy_for("jobs")
    assert (policy.setting("priority_levels"), policy.max_count) == (4, 9)
    # An alias is stored under the key.
    config = build_config({"destinations": {"jobs": {"x-priority": 3}}}, plugins=_manager(Priority()))
    assert config.policy_for("jobs").setting("priority_levels") == 3


def test_a_key_no_plugin_declares_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"destinations": {"jobs": {"priority_levels": 4}}}, plugins=_manager())
    assert caught.value.key == 'destinations."jobs".priority_levels'
    assert "unknown key" in caught.value.rule


def test_the_built_in_keys_belong_to_their_plugins() -> None:
    # Without the groups plugin, its keys are unknown like any undeclared key.
    with pytest.raises(ConfigError, match="unknown key"):
        build_config({"disable_plugins": ["groups"], "destinations": {"q": {"shared_groups": True}}})
    with pytest.raises(ConfigError, match="unknown key"):
        build_config({"disable_plugins": ["flow"], "destinations": {"q": {"flow_stop_count": 5}}})
    config = build_config({"destinations": {"q": {"qpid.shared_msg_group": True, "qpid.flow_stop_count": 5}}})
    assert config.policy_for("q").setting("shared_groups") is True
    assert config.policy_for("q").setting("flow_stop_count") == 5


def test_a_key_declared_twice_is_refused_at_start() -> None:
    class Clash:
        @hookimpl
        def qpid_flow_destination_settings(self) -> list[DestinationSetting]:
            return [DestinationSetting("group_header", str)]

    with pytest.raises(ConfigError, match="declared twice"):
        build_config({}, plugins=_manager(Clash()))


def test_a_plugins_policy_check_refuses_at_start_and_at_runtime() -> None:
    pm = _manager(Priority())
    with pytest.raises(ConfigError) as caught:
        build_config({"destinations": {"jobs": {"priority_levels": 11}}}, plugins=pm)
    assert str(caught.value) == 'destinations."jobs".priority_levels = 11: must be at most 10'
    config = build_config({}, plugins=pm)
    registry = Destinations(config, Hooks(pm))
    with pytest.raises(ConfigError, match="must be at most 10"):
        registry.set_policy("jobs", registry.parse_policy("jobs", {"priority_levels": 12}))
    assert "jobs" not in registry.policies
    registry.set_policy("jobs", registry.parse_policy("jobs", {"priority_levels": 2}))
    jobs = registry.get("jobs")
    assert jobs is not None
    assert jobs.policy.setting("priority_levels") == 2


def test_asked_before_names_the_plugins_that_answer_first() -> None:
    class Chooser:
        @hookimpl
        def qpid_flow_consumer_select(self) -> None:
            return None

    pm = build_plugin_manager()
    groups = pm.get_plugin("groups")
    hooks = Hooks(pm)
    assert hooks.asked_before("qpid_flow_consumer_select", groups) == []
    pm.register(Chooser(), name="chooser")
    assert Hooks(pm).asked_before("qpid_flow_consumer_select", groups) == ["chooser"]


def test_the_event_log_leaves_when_no_log_is_configured() -> None:
    pm = build_plugin_manager()
    assert pm.get_plugin("events") is not None
    Hooks(pm).configure(config=build_config({}, plugins=pm), manager=pm)
    assert pm.get_plugin("events") is None
    assert set(BUILTIN_PLUGINS) - {"events"} <= {name for name, _ in pm.list_name_plugin()}


def test_the_built_in_policies_declare_their_admin_routes() -> None:
    routes = Hooks(build_plugin_manager()).admin_routes()
    assert sorted((r.method, r.path) for r in routes) == [
        ("GET", "/v1/groups/{name}"),
        ("POST", "/v1/producers/start"),
        ("POST", "/v1/producers/stop"),
    ]


class _Reactor:
    def __call__(self, callback: Any) -> Any:
        return callback()


def _none(_request: AdminRequest) -> None:
    return None


def _admin(routes: list[AdminRoute]) -> AdminServer:
    """An admin endpoint with these plugin routes (not started: routes are checked at once)."""
    return AdminServer("127.0.0.1:0", operations=cast(Any, None), run_in_reactor=_Reactor(), routes=routes)


def _get(admin: AdminServer, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin.port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_plugin_route_answers_with_its_path_values_and_its_not_found() -> None:
    seen: list[AdminRequest] = []

    def jobs(request: AdminRequest) -> dict[str, Any]:
        seen.append(request)
        if request.params["name"] != "a/b":
            raise KeyError(request.params["name"])
        return {"job": request.params["name"], "verbose": request.query.get("verbose")}

    route = AdminRoute("GET", "/v1/jobs/{name}", jobs, not_found="job")
    admin = _admin([route])
    admin.start()
    try:
        assert _get(admin, "/v1/jobs/a%2Fb?verbose=1") == (200, {"job": "a/b", "verbose": ["1"]})
        assert _get(admin, "/v1/jobs/nope") == (404, {"error": "no job 'nope'"})
        assert _get(admin, "/v1/jobs/")[0] == 404
    finally:
        admin.stop()
    assert [r.params["name"] for r in seen] == ["a/b", "nope"]


@pytest.mark.parametrize(
    "route",
    [
        AdminRoute("GET", "/v1/destinations/{name}", _none),  # a built-in resource
        AdminRoute("POST", "/v1/policies", _none),  # another (GET is built in: never reached)
        AdminRoute("GET", "/metrics", _none),  # outside /v1
        AdminRoute("GET", "/v1/{anything}", _none),  # would answer every resource
        AdminRoute("PATCH", "/v1/jobs", _none),  # a method the endpoint does not route
    ],
)
def test_a_route_that_would_shadow_or_never_be_reached_is_refused(route: AdminRoute) -> None:
    with pytest.raises(ConfigError) as caught:
        _admin([route])
    assert caught.value.key == "admin route" and caught.value.value == f"{route.method} {route.path}"


@pytest.mark.parametrize(
    ("first", "second", "refused"),
    [
        ("/v1/jobs", "/v1/jobs", True),
        ("/v1/groups/{name}", "/v1/groups/{name}/stats", True),  # a last {name} takes the rest
        ("/v1/jobs/{id}/stop", "/v1/jobs/{id}/start", False),
        ("/v1/jobs/{id}/stop", "/v1/jobs/all/{action}", True),  # /v1/jobs/all/stop
        ("/v1/jobs", "/v1/tasks", False),
    ],
)
def test_two_routes_some_path_matches_are_refused(first: str, second: str, refused: bool) -> None:
    routes = [AdminRoute("GET", first, _none), AdminRoute("GET", second, _none)]
    if refused:
        with pytest.raises(ConfigError, match="some paths match"):
            _admin(routes)
    else:
        _admin(routes)
    # Another method on the same path is another route.
    _admin([routes[0], AdminRoute("POST", second, _none)])


def test_a_plugin_that_breaks_a_rule_refuses_the_start_with_one_line(tmp_path: Any) -> None:
    import subprocess
    import sys

    plugin = tmp_path / "clashing_plugin.py"
    plugin.write_text(
        "from qpid_flow import hookimpl\n"
        "from qpid_flow.plugin.declarations import DestinationSetting\n"
        "@hookimpl\n"
        "def qpid_flow_destination_settings():\n"
        "    return [DestinationSetting('max_count', int)]\n"
    )
    env = {**__import__("os").environ, "QPID_FLOW_PLUGINS": "clashing_plugin", "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "qpid_flow", "serve", "--listen", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    why = "destination setting = 'max_count': declared twice (by the core or another plugin)"
    assert result.stderr.strip().splitlines() == [f"qpid-flow: configuration error: {why}"]
