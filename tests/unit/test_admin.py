"""The admin endpoint over real HTTP on 127.0.0.1, with a fake router behind it."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote

import pytest

from qpid_flow import admin as admin_module
from qpid_flow.admin import AdminServer
from qpid_flow.config import ConfigError

T = TypeVar("T")

ORDERS = {
    "name": "orders",
    "depth": 950,
    "bytes": 12345,
    "flowStopped": True,
    "flowStoppedCount": 3,
    "flowStopCount": 900,
    "flowResumeCount": 500,
    "maxCount": 1000,
    "maxSize": 104857600,
    "producers": 4,
    "producersBlocked": 2,
    "consumers": 1,
    "groups": 7,
}
SLASHED = {"name": "/queue/orders", "depth": 0, "bytes": 0, "flowStopped": False}


class FakeOperations:
    """Records every call; refuses to run unless called through run_in_reactor."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.in_reactor = threading.local()
        self.records: list[dict[str, Any]] = [dict(ORDERS), dict(SLASHED)]
        self.policies: set[str] = {"orders", "/queue/orders"}
        self.fail_with: Exception | None = None
        self.flow_disabled = False

    def _enter(self, *call: Any) -> None:
        assert getattr(self.in_reactor, "active", False), f"{call[0]} ran outside run_in_reactor"
        self.calls.append(call)
        if self.fail_with is not None:
            raise self.fail_with

    def run_in_reactor(self, callback: Callable[[], T]) -> T:
        self.in_reactor.active = True
        try:
            return callback()
        finally:
            self.in_reactor.active = False

    def stat(self) -> list[dict[str, Any]]:
        self._enter("stat")
        return [dict(r) for r in self.records]

    def add_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        self._enter("add_destination", name, settings)
        if settings.get("max_count", 0) < 0:
            raise ConfigError(
                f'destinations."{name}".max_count', settings["max_count"], "must be a non-negative integer"
            )
        self.policies.add(name)
        return {"name": name, **settings}

    def remove_destination(self, name: str) -> dict[str, Any]:
        self._enter("remove_destination", name)
        if name not in self.policies:
            raise KeyError(name)
        self.policies.discard(name)
        return {"name": name, "removed": True}

    def producers(self, action: str, pattern: str) -> dict[str, Any]:
        self._enter("producers", action, pattern)
        if self.flow_disabled:
            raise KeyError("flow control is disabled (plugin 'flow')")
        return {"action": action, "pattern": pattern, "producers": 2}

    def groups(self, name: str) -> dict[str, Any]:
        self._enter("groups", name)
        if name != "orders":
            raise KeyError(name)
        return {
            "groups": [
                {"group": "g1", "owner": "c1/l2", "held": 3, "waiting": 10},
                {"group": "g2", "owner": None, "held": 0, "waiting": 1},
            ]
        }


@pytest.fixture
def ops() -> FakeOperations:
    return FakeOperations()


@pytest.fixture
def server(ops: FakeOperations) -> Iterator[AdminServer]:
    admin = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor)
    admin.start()
    yield admin
    admin.stop()


def call(server: AdminServer, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    """One request; returns (status, decoded JSON body) for success and error statuses alike."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["Content-Type"] == "application/json"
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        assert exc.headers["Content-Type"] == "application/json"
        return exc.code, json.loads(exc.read())


def test_health_goes_through_the_reactor(server: AdminServer) -> None:
    calls: list[int] = []

    def counting(callback: Callable[[], T]) -> T:
        calls.append(1)
        return callback()

    server._run_in_reactor = counting
    assert call(server, "GET", "/v1/health") == (200, {"status": "ok"})
    assert calls == [1]


def test_list_destinations(server: AdminServer, ops: FakeOperations) -> None:
    assert call(server, "GET", "/v1/destinations") == (200, {"destinations": [ORDERS, SLASHED]})
    assert ops.calls == [("stat",)]


def test_one_destination_by_quoted_name(server: AdminServer) -> None:
    assert call(server, "GET", "/v1/destinations/orders") == (200, ORDERS)
    assert call(server, "GET", "/v1/destinations/" + quote("/queue/orders", safe="")) == (200, SLASHED)


def test_unknown_destination_is_404(server: AdminServer) -> None:
    status, body = call(server, "GET", "/v1/destinations/nope")
    assert status == 404
    assert "nope" in body["error"]


def test_put_adds_a_policy_with_the_settings_sent(server: AdminServer, ops: FakeOperations) -> None:
    settings = {"max_count": 1000, "max_size": "10 MB", "limit_policy": "flow", "shared_groups": True}
    path = "/v1/destinations/" + quote("PRICES.>", safe="")
    assert call(server, "PUT", path, settings) == (200, {"name": "PRICES.>", **settings})
    assert ops.calls == [("add_destination", "PRICES.>", settings)]


def test_put_with_an_empty_body_sends_no_settings(server: AdminServer, ops: FakeOperations) -> None:
    assert call(server, "PUT", "/v1/destinations/x", raw=b"") == (200, {"name": "x"})
    assert ops.calls == [("add_destination", "x", {})]


def test_put_with_a_bad_value_is_400_naming_the_key(server: AdminServer) -> None:
    status, body = call(server, "PUT", "/v1/destinations/orders", {"max_count": -3})
    assert status == 400
    assert body == {
        "error": 'destinations."orders".max_count = -3: must be a non-negative integer',
        "key": 'destinations."orders".max_count',
    }


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"[1, 2]", b'"max_count"'])
def test_put_with_a_body_that_is_not_a_json_object_is_400(server: AdminServer, ops: FakeOperations, raw: bytes) -> None:
    status, body = call(server, "PUT", "/v1/destinations/orders", raw=raw)
    assert status == 400
    assert "JSON" in body["error"]
    assert ops.calls == []


def test_delete_removes_a_policy(server: AdminServer, ops: FakeOperations) -> None:
    path = "/v1/destinations/" + quote("/queue/orders", safe="")
    assert call(server, "DELETE", path) == (200, {"name": "/queue/orders", "removed": True})
    assert ops.calls == [("remove_destination", "/queue/orders")]


def test_delete_of_an_unknown_policy_is_404(server: AdminServer) -> None:
    assert call(server, "DELETE", "/v1/destinations/nope") == (404, {"error": "no destination policy 'nope'"})


@pytest.mark.parametrize("action", ["stop", "start"])
def test_producers_stop_and_start(server: AdminServer, ops: FakeOperations, action: str) -> None:
    status, body = call(server, "POST", f"/v1/producers/{action}", {"pattern": "PRICES.>"})
    assert (status, body) == (200, {"action": action, "pattern": "PRICES.>", "producers": 2})
    assert ops.calls == [("producers", action, "PRICES.>")]


def test_producers_without_flow_control_is_404_with_the_routers_reason(
    server: AdminServer, ops: FakeOperations
) -> None:
    ops.flow_disabled = True
    status, body = call(server, "POST", "/v1/producers/stop", {"pattern": "orders"})
    assert (status, body) == (404, {"error": "flow control is disabled (plugin 'flow')"})


@pytest.mark.parametrize("body", [{}, {"pattern": ""}, {"pattern": 7}])
def test_producers_need_a_pattern(server: AdminServer, ops: FakeOperations, body: dict[str, Any]) -> None:
    status, answer = call(server, "POST", "/v1/producers/stop", body)
    assert status == 400
    assert answer["key"] == "pattern"
    assert ops.calls == []


def test_groups(server: AdminServer, ops: FakeOperations) -> None:
    status, body = call(server, "GET", "/v1/groups/orders")
    assert status == 200
    assert [g["group"] for g in body["groups"]] == ["g1", "g2"]
    assert ops.calls == [("groups", "orders")]


def test_groups_of_an_unknown_destination_is_404(server: AdminServer) -> None:
    assert call(server, "GET", "/v1/groups/nope") == (404, {"error": "no destination 'nope'"})


@pytest.mark.parametrize("path", ["/", "/v1", "/v2/destinations", "/v1/queues", "/v1/producers/pause", "/v1/groups/"])
def test_unknown_routes_are_404(server: AdminServer, ops: FakeOperations, path: str) -> None:
    status, body = call(server, "GET" if "producers" not in path else "POST", path)
    assert status == 404
    assert "no such route" in body["error"]
    assert ops.calls == []


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/destinations", "GET"),
        ("POST", "/v1/health", "GET"),
        ("GET", "/v1/producers/stop", "POST"),
        ("PATCH", "/v1/destinations/orders", "GET, PUT, DELETE"),
        ("PUT", "/v1/groups/orders", "GET"),
    ],
)
def test_wrong_method_is_405(server: AdminServer, ops: FakeOperations, method: str, path: str, allow: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=b"{}", method=method)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 405
    assert caught.value.headers["Allow"] == allow
    assert method in json.loads(caught.value.read())["error"]
    assert ops.calls == []


def test_an_unexpected_exception_is_500_and_logged(
    server: AdminServer, ops: FakeOperations, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def exception(self, event: str, **fields: Any) -> None:
            logged.append((event, fields))

        def debug(self, event: str, **fields: Any) -> None:
            pass

    monkeypatch.setattr(admin_module, "log", Log())
    ops.fail_with = RuntimeError("boom")
    assert call(server, "GET", "/v1/destinations") == (500, {"error": "RuntimeError: boom"})
    assert [event for event, _ in logged] == ["admin_error"]


def test_a_reactor_that_does_not_answer_is_503(server: AdminServer) -> None:
    def stuck(callback: Callable[[], T]) -> T:
        raise TimeoutError

    server._run_in_reactor = stuck
    status, body = call(server, "GET", "/v1/health")
    assert status == 503
    assert "reactor" in body["error"]


def test_keep_alive_survives_refused_requests_with_bodies(server: AdminServer) -> None:
    # The refused request's body must be read, or it would be parsed as the next request.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("POST", "/v1/health", body=b'{"pattern": "x"}')
        first = connection.getresponse()
        assert first.status == 405
        first.read()
        connection.request("GET", "/v1/health")
        second = connection.getresponse()
        assert (second.status, json.loads(second.read())) == (200, {"status": "ok"})
    finally:
        connection.close()


def test_an_oversized_body_is_refused(server: AdminServer, ops: FakeOperations) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.putrequest("PUT", "/v1/destinations/orders")
        connection.putheader("Content-Length", str(admin_module._MAX_BODY + 1))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
    finally:
        connection.close()
    assert ops.calls == []


def test_start_raises_oserror_when_the_port_is_taken(server: AdminServer, ops: FakeOperations) -> None:
    second = AdminServer(f"127.0.0.1:{server.port}", ops, ops.run_in_reactor)
    with pytest.raises(OSError):
        second.start()


def test_stop_closes_the_port(ops: FakeOperations) -> None:
    admin = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor)
    admin.start()
    port = admin.port
    assert call(admin, "GET", "/v1/health")[0] == 200
    admin.stop()
    admin.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
