"""Static checks of compose.yaml and the Dockerfile (no Docker engine needed)."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = compose["services"]
    assert isinstance(svcs, dict)
    return svcs


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Normalise the short (list) and long (mapping) depends_on syntaxes."""
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return {name: {"condition": "service_started"} for name in deps}
    return dict(deps)


def command_args(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    return cmd.split() if isinstance(cmd, str) else list(cmd)


def arg_after(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing in {args}"
    return args[args.index(flag) + 1]


def test_expected_services_and_profiles(services: dict[str, dict[str, Any]]) -> None:
    assert {"rabbitmq", "qpid-flow", "tests", "artemis", "qpid-flow-artemis"} <= set(services)
    # The default `docker compose up` runs the RabbitMQ pair only.
    assert "profiles" not in services["rabbitmq"]
    assert "profiles" not in services["qpid-flow"]
    assert services["artemis"]["profiles"] == ["artemis"]
    assert services["qpid-flow-artemis"]["profiles"] == ["artemis"]
    assert services["rabbitmq"]["image"].startswith("rabbitmq:3.10")
    assert services["artemis"]["image"].startswith("apache/activemq-artemis")


def test_depends_on_refers_to_defined_services(services: dict[str, dict[str, Any]]) -> None:
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in services.items():
        for dep, spec in depends_on(svc).items():
            assert dep in services, f"{name} depends on undefined service {dep}"
            assert dep != name
            assert spec.get("condition", "service_started") in conditions
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s missing healthcheck"
            # A service outside every profile cannot depend on one that is only in a profile.
            mine, theirs = set(svc.get("profiles", [])), set(services[dep].get("profiles", []))
            assert not theirs or (mine and mine <= theirs), f"{name} -> {dep}: profiles {mine} vs {theirs}"


def test_qpid_flow_services_point_at_their_broker(services: dict[str, dict[str, Any]]) -> None:
    for name, broker in (("qpid-flow", "rabbitmq"), ("qpid-flow-artemis", "artemis")):
        args = command_args(services[name])
        assert args[:2] == ["qpid-flow", "serve"]
        url = urllib.parse.urlsplit(arg_after(args, "--broker"))
        assert url.scheme == "amqp" and url.hostname == broker and url.port == 5672
        assert arg_after(args, "--listen") == "0.0.0.0:5673"
        assert broker in depends_on(services[name])
    published = [str(p) for p in services["qpid-flow"]["ports"]]
    assert any(p.endswith(":5673") for p in published)
    assert any(p.endswith(":8673") for p in published)


def test_rabbitmq_enables_amqp1_0(compose: dict[str, Any], services: dict[str, Any]) -> None:
    mounts = services["rabbitmq"]["configs"]
    [mount] = [m for m in mounts if m["target"] == "/etc/rabbitmq/enabled_plugins"]
    content = compose["configs"][mount["source"]]["content"]
    assert re.fullmatch(r"\s*\[[a-z0-9_,\s]+\]\.\s*", content), content  # an Erlang term list
    assert "rabbitmq_amqp1_0" in content


def test_tests_service_uses_the_compose_broker(services: dict[str, dict[str, Any]]) -> None:
    tests = services["tests"]
    url = urllib.parse.urlsplit(tests["environment"]["QPID_FLOW_TEST_BROKER_URL"])
    assert url.hostname in services
    assert url.hostname in depends_on(tests)
    assert "pytest" in command_args(tests)


def test_build_targets_exist_in_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", DOCKERFILE.read_text(), re.M | re.I))
    built = [s for s in services.values() if "build" in s]
    assert built
    for svc in built:
        build = svc["build"]
        target = build.get("target") if isinstance(build, dict) else None
        assert target is None or target in stages, f"unknown Dockerfile target {target}"
    assert "python:3.11-slim" in DOCKERFILE.read_text()


@pytest.mark.parametrize("name", ["qpid-flow", "qpid-flow-artemis"])
def test_the_admin_port_is_served_with_a_token_and_published_on_loopback_only(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    """qpid-flow-artemis published 8675 on every interface with no --admin behind it."""
    service = services[name]
    assert arg_after(command_args(service), "--admin") == "0.0.0.0:8673"
    assert service["environment"]["QPID_FLOW_ADMIN_TOKEN"]  # needed beyond the container's loopback
    admin = [str(p) for p in service["ports"] if str(p).endswith(":8673")]
    assert len(admin) == 1 and admin[0].startswith("127.0.0.1:"), admin


def test_the_test_image_installs_the_plugins_install_deps_installs() -> None:
    """The tests service ran without the rabbitmq-depth plugin: plugins/ was copied into the
    build, never built nor installed."""
    install_deps = (ROOT / ".ci" / "install-deps").read_text()
    plugins = re.search(r"^PLUGINS=\(([^)]*)\)", install_deps, re.M)
    assert plugins is not None
    paths = plugins.group(1).split()
    assert paths
    text = DOCKERFILE.read_text()
    build = text.split("FROM ")[1]
    test_stage = text.split(" AS test")[1]
    for path in paths:
        project = re.search(r'^name = "([^"]+)"', (ROOT / path / "pyproject.toml").read_text(), re.M)
        assert project is not None
        assert re.search(rf"pip wheel .*\./{re.escape(path)}\b", build), f"{path} is not built"
        assert re.search(rf"pip install .*\b{re.escape(project.group(1))}\b", test_stage), f"{path} is not installed"


def test_the_test_image_has_what_the_integration_tests_use() -> None:
    """`docker compose run --rm tests` failed tests the CI passes: the image had no ss
    (iproute2), no Node.js with rhea, and neither docs/ (the plugin example, the hook
    reference) nor bench/ (the minimal relay) the tests read."""
    install_deps = (ROOT / ".ci" / "install-deps").read_text()
    test_stage = DOCKERFILE.read_text().split(" AS test")[1]
    apt = re.search(r"apt-get install(?:[^\n\\]|\\\n)*", test_stage)
    assert apt is not None
    for package in ("iproute2", "nodejs", "npm"):
        assert package in install_deps, f"{package}: not what install-deps installs either"
        assert re.search(rf"\b{package}\b", apt.group(0)), f"{package} is not installed in the test image"
    rhea = re.search(r"^RHEA_DIR=(\S+)", install_deps, re.M)
    assert rhea is not None
    assert re.search(rf"npm install --prefix {re.escape(rhea.group(1))}\b", test_stage), "rhea is not installed"
    for folder in ("docs", "bench", "tests"):
        assert re.search(rf"^COPY {folder} \./{folder}$", test_stage, re.M), f"{folder}/ is not in the image"
    assert "**/node_modules" in (ROOT / ".dockerignore").read_text().split(), "a host's node_modules would be copied"
