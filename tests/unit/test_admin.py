"""The admin endpoint over real HTTP on 127.0.0.1, with a fake router behind it."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote

import pytest

from qpid_flow.admin import http as admin_module
from qpid_flow.admin.http import MAX_CONNECTIONS, AdminServer
from qpid_flow.admin.metrics import Snapshot
from qpid_flow.amqp.bridge import NotStarted, ReactorBridge
from qpid_flow.config import ConfigError
from qpid_flow.plugin.declarations import AdminRequest, AdminRoute, required_string

T = TypeVar("T")

ORDERS = {
    "name": "orders",
    "policy": "orders",  # configured: its own series from the first scrape
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
CONNECTION = {"id": "c1", "remote": "127.0.0.1:5000", "user": "alice", "container": "app"}
TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}


class FakeOperations:
    """Records every call; refuses to run unless called through run_in_reactor."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.in_reactor = threading.local()
        self.records: list[dict[str, Any]] = [dict(ORDERS), dict(SLASHED)]
        self.policy_names: set[str] = {"orders", "/queue/orders"}
        self.fail_with: Exception | None = None
        self.flow_disabled = False
        self.ready = (True, "listening")

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

    def stat_of(self, name: str) -> dict[str, Any] | None:
        self._enter("stat_of")
        return next((dict(r) for r in self.records if r["name"] == name), None)

    def add_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        self._enter("add_destination", name, settings)
        if settings.get("max_count", 0) < 0:
            raise ConfigError(
                f'destinations."{name}".max_count', settings["max_count"], "must be a non-negative integer"
            )
        self.policy_names.add(name)
        return {"name": name, **settings}

    def remove_destination(self, name: str) -> dict[str, Any]:
        self._enter("remove_destination", name)
        if name not in self.policy_names:
            raise KeyError(name)
        self.policy_names.discard(name)
        return {"name": name, "removed": True}

    def policies(self) -> list[dict[str, Any]]:
        self._enter("policies")
        return [
            {"name": name, "policy": {"max_count": 1000}, "destinations": [name] if ">" not in name else []}
            for name in sorted(self.policy_names)
        ]

    def producers(self, action: str, pattern: str) -> dict[str, Any]:
        self._enter("producers", action, pattern)
        if self.flow_disabled:
            raise KeyError("flow control is disabled (plugin 'flow')")
        return {"action": action, "pattern": pattern, "producers": 2}

    def connections(self) -> list[dict[str, Any]]:
        self._enter("connections")
        return [dict(CONNECTION)]

    def links(self) -> list[dict[str, Any]]:
        self._enter("links")
        return [{"connection": "c1", "address": "orders", "direction": "in"}, {"connection": "c2", "address": "x"}]

    def close_connection(self, connection_id: str) -> dict[str, Any]:
        self._enter("close_connection", connection_id)
        if connection_id != "c1":
            raise KeyError(connection_id)
        return {"closed": "c1", "user": "alice"}

    def readiness(self) -> tuple[bool, str]:
        self._enter("readiness")
        return self.ready

    def snapshot(self) -> Snapshot:
        self._enter("snapshot")
        return Snapshot(
            version="0.0",
            proton="0.40.0",
            python="3.11",
            ready=self.ready[0],
            connections=1,
            sessions=1,
            links_in=1,
            links_out=0,
            upstream={},
            messages_in=5,
            messages_out=4,
            memory_bytes=10,
            memory_limit=0,
            memory_waiting=0,
            memory_over=False,
            destinations=[dict(r) for r in self.records],
        )

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


def plugin_routes(ops: FakeOperations) -> list[AdminRoute]:
    """The routes a plugin adds as the flow-control and groups plugins do, answered by the fake."""

    def producers(action: str) -> Callable[[AdminRequest], Any]:
        return lambda request: ops.producers(action, required_string(request.body, "pattern"))

    body = '{"pattern": "..."}'
    return [
        AdminRoute("POST", "/v1/producers/stop", producers("stop"), body),
        AdminRoute("POST", "/v1/producers/start", producers("start"), body),
        AdminRoute(
            "GET", "/v1/groups/{name}", lambda request: ops.groups(request.params["name"]), not_found="destination"
        ),
    ]


@pytest.fixture
def ops() -> FakeOperations:
    return FakeOperations()


@pytest.fixture
def server(ops: FakeOperations) -> Iterator[AdminServer]:
    admin = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor, token=TOKEN, routes=plugin_routes(ops))
    admin.start()
    yield admin
    admin.stop()


def call(
    server: AdminServer,
    method: str,
    path: str,
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One request, with the token and a JSON Content-Type unless ``headers`` says otherwise;
    returns (status, decoded JSON body) for success and error statuses alike."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}",
        data=data,
        method=method,
        headers=JSON_AUTH if headers is None else headers,
    )
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


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"max_count"',
        b'{"reject_after": NaN}',  # Python reads these; JSON has no such values
        b'{"group_lease": Infinity}',
        b"[" * 100_000,  # deeper than Python's stack
    ],
)
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


@pytest.mark.parametrize("path", ["/v1", "/v2/destinations", "/v1/queues", "/v1/producers/pause", "/v1/groups/"])
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
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=b"{}", method=method, headers=JSON_AUTH
    )
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
        raise NotStarted

    server._run_in_reactor = stuck
    status, body = call(server, "GET", "/v1/health")
    assert status == 503
    assert "reactor" in body["error"]


def test_a_timeout_error_a_request_raised_itself_is_a_500_not_the_reactors(
    ops: FakeOperations, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin route that raised TimeoutError itself was answered 503 "its result is
    unknown" (the bridge took it for its own wait running out), with no traceback logged."""
    monkeypatch.setattr(admin_module, "log", type("Quiet", (), {"__getattr__": lambda s, n: lambda *a, **k: None})())
    bridge = ReactorBridge()
    try:
        ops.fail_with = TimeoutError("the plugin's own")
        runner = threading.Thread(target=lambda: _serve_calls(bridge), daemon=True)
        runner.start()
        in_reactor = lambda callback: bridge.call(lambda: ops.run_in_reactor(callback))  # noqa: E731
        admin = AdminServer("127.0.0.1:0", ops, in_reactor, token=TOKEN, routes=plugin_routes(ops))
        admin.start()
        try:
            status, body = call(admin, "GET", "/v1/destinations")
        finally:
            admin.stop()
        assert (status, body) == (500, {"error": "TimeoutError: the plugin's own"})
    finally:
        bridge.close()


def _serve_calls(bridge: ReactorBridge) -> None:
    """Play the reactor for ``bridge``: run each call it is handed, for a few seconds."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        while not bridge.injector.queue.empty():
            event = bridge.injector.queue.get()
            event.dispatch(event.handler)
        time.sleep(0.01)


def test_keep_alive_survives_refused_requests_with_bodies(server: AdminServer) -> None:
    # The refused request's body must be read, or it would be parsed as the next request.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("POST", "/v1/health", body=b'{"pattern": "x"}', headers=JSON_AUTH)
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
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Authorization", f"Bearer {TOKEN}")
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
    finally:
        connection.close()
    assert ops.calls == []


def test_start_raises_oserror_when_the_port_is_taken(server: AdminServer, ops: FakeOperations) -> None:
    second = AdminServer(f"127.0.0.1:{server.port}", ops, ops.run_in_reactor, routes=plugin_routes(ops))
    with pytest.raises(OSError):
        second.start()


def test_stop_closes_the_port(ops: FakeOperations) -> None:
    admin = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor, routes=plugin_routes(ops))
    admin.start()
    port = admin.port
    assert call(admin, "GET", "/v1/health")[0] == 200
    admin.stop()
    admin.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


# --- Who may ask: the token, loopback, and nothing a web page can send -----------------------


def raw(
    server: AdminServer, method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, http.client.HTTPMessage, Any]:
    """One request with exactly these headers (Host included, if given) -> (status, headers, JSON)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.headers, json.loads(response.read())
    finally:
        connection.close()


@pytest.fixture
def tokenless(ops: FakeOperations) -> Iterator[AdminServer]:
    admin = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor, routes=plugin_routes(ops))
    admin.start()
    yield admin
    admin.stop()


CHANGES = [
    ("PUT", "/v1/destinations/orders", {"max_count": 5}),
    ("DELETE", "/v1/destinations/orders", None),
    ("POST", "/v1/producers/stop", {"pattern": "orders"}),
    ("POST", "/v1/producers/start", {"pattern": "orders"}),
]


@pytest.mark.parametrize(("method", "path", "body"), CHANGES)
def test_without_a_configured_token_changes_are_403_saying_how_to_set_one(
    tokenless: AdminServer, ops: FakeOperations, method: str, path: str, body: Any
) -> None:
    for headers in ({"Content-Type": "application/json"}, JSON_AUTH):
        status, answer = call(tokenless, method, path, body, headers=headers)
        assert status == 403
        assert "admin_token" in answer["error"] and "QPID_FLOW_ADMIN_TOKEN" in answer["error"]
    assert ops.calls == []


@pytest.mark.parametrize(("method", "path", "body"), CHANGES)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer", f"bearer {TOKEN}x"])
def test_a_change_without_the_right_token_is_401_with_www_authenticate(
    server: AdminServer, ops: FakeOperations, method: str, path: str, body: Any, authorization: str | None
) -> None:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    data = None if body is None else json.dumps(body).encode()
    status, answer_headers, answer = raw(server, method, path, headers, data)
    assert status == 401
    assert answer_headers["WWW-Authenticate"].startswith("Bearer")
    assert "token" in answer["error"]
    assert ops.calls == []


@pytest.mark.parametrize(("method", "path", "body"), CHANGES)
def test_a_change_with_the_token_is_done(
    server: AdminServer, ops: FakeOperations, method: str, path: str, body: Any
) -> None:
    assert call(server, method, path, body)[0] == 200
    assert len(ops.calls) == 1


def test_the_bearer_scheme_is_case_insensitive(server: AdminServer, ops: FakeOperations) -> None:
    headers = {"Authorization": f"bearer {TOKEN}", "Content-Type": "application/json"}
    assert call(server, "POST", "/v1/producers/stop", {"pattern": "x"}, headers=headers)[0] == 200


@pytest.mark.parametrize("fixture", ["server", "tokenless"])
def test_reads_on_loopback_need_no_token(request: pytest.FixtureRequest, fixture: str) -> None:
    admin: AdminServer = request.getfixturevalue(fixture)
    for path in ("/v1/health", "/v1/destinations", "/v1/destinations/orders", "/v1/groups/orders"):
        assert call(admin, "GET", path, headers={})[0] == 200
    assert call(admin, "GET", "/v1/health", headers={"Host": "localhost"})[0] == 200
    assert call(admin, "GET", "/v1/health", headers={"Host": f"[::1]:{admin.port}"})[0] == 200


def test_a_read_with_a_wrong_token_is_401_even_on_loopback(server: AdminServer) -> None:
    assert call(server, "GET", "/v1/health", headers={"Authorization": "Bearer wrong"})[0] == 401


def test_a_token_sent_to_a_loopback_endpoint_without_one_is_ignored_for_reads(tokenless: AdminServer) -> None:
    assert call(tokenless, "GET", "/v1/health", headers=AUTH)[0] == 200


def test_a_tokenless_read_naming_another_host_is_refused_dns_rebinding(
    server: AdminServer, ops: FakeOperations
) -> None:
    # A page on http://evil.example:PORT whose name now resolves to 127.0.0.1 reads same-origin.
    evil = {"Host": f"evil.example:{server.port}", "Origin": f"http://evil.example:{server.port}"}
    status, _, answer = raw(server, "GET", "/v1/destinations", evil)
    assert status == 403
    assert "loopback" in answer["error"]
    assert raw(server, "GET", "/v1/destinations", {"Host": "evil.example"})[0] == 403
    assert ops.calls == []
    # A client with the token may use any name for the endpoint (e.g. through a tunnel).
    assert raw(server, "GET", "/v1/destinations", {"Host": "admin.internal", **AUTH})[0] == 200


def test_beyond_loopback_reads_need_the_token_too(server: AdminServer, tokenless: AdminServer) -> None:
    server.loopback = tokenless.loopback = False  # as if bound to 0.0.0.0
    status, headers, _ = raw(server, "GET", "/v1/destinations", {})
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert call(server, "GET", "/v1/destinations", headers=AUTH)[0] == 200
    status, answer = call(tokenless, "GET", "/v1/health", headers={})
    assert status == 403
    assert "admin_token" in answer["error"]


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [("127.0.0.1:0", True), ("127.0.0.2:8673", True), ("localhost:0", True), ("[::1]:0", True),
     ("0.0.0.0:8673", False), ("[::]:8673", False), ("10.0.0.5:8673", False), ("admin.example:8673", False)],
)  # fmt: skip
def test_which_listen_addresses_are_loopback(ops: FakeOperations, listen: str, loopback: bool) -> None:
    assert AdminServer(listen, ops, ops.run_in_reactor, token=TOKEN, routes=plugin_routes(ops)).loopback is loopback


def test_a_cross_site_text_plain_post_is_refused(
    server: AdminServer, tokenless: AdminServer, ops: FakeOperations
) -> None:
    # What a page on evil.example can send without a preflight: a "simple" POST.
    headers = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
    for admin in (server, tokenless):
        status, answer = call(admin, "POST", "/v1/producers/stop", raw=b'{"pattern": "orders"}', headers=headers)
        assert status == 403
        assert "evil.example" in answer["error"]
    # Not even with the token (a page cannot have it, but the origin alone is enough).
    status, _ = call(server, "POST", "/v1/producers/stop", {"pattern": "orders"}, headers={**JSON_AUTH, **headers})
    assert status == 403
    assert ops.calls == []


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1", "https://127.0.0.1:{port}",
                                    "http://localhost:{port}", "http://127.0.0.1:{port}.evil.example"])  # fmt: skip
def test_any_foreign_origin_is_refused_even_for_reads(server: AdminServer, ops: FakeOperations, origin: str) -> None:
    origin = origin.format(port=server.port)
    assert call(server, "GET", "/v1/destinations", headers={"Origin": origin})[0] == 403
    assert call(server, "GET", "/v1/destinations", headers={"Origin": origin, **AUTH})[0] == 403
    assert ops.calls == []


def test_the_endpoints_own_origin_is_accepted(server: AdminServer, ops: FakeOperations) -> None:
    own = {"Origin": f"http://127.0.0.1:{server.port}"}
    assert call(server, "GET", "/v1/destinations", headers=own)[0] == 200
    assert call(server, "POST", "/v1/producers/stop", {"pattern": "x"}, headers={**JSON_AUTH, **own})[0] == 200


@pytest.mark.parametrize("site", ["cross-site", "same-site", "Cross-Site"])
def test_sec_fetch_site_from_another_site_is_refused(server: AdminServer, ops: FakeOperations, site: str) -> None:
    assert call(server, "GET", "/v1/destinations", headers={"Sec-Fetch-Site": site})[0] == 403
    status, _ = call(server, "PUT", "/v1/destinations/x", {}, headers={**JSON_AUTH, "Sec-Fetch-Site": site})
    assert status == 403
    assert ops.calls == []


@pytest.mark.parametrize("site", ["same-origin", "none"])
def test_sec_fetch_site_of_the_endpoint_itself_is_accepted(server: AdminServer, site: str) -> None:
    assert call(server, "GET", "/v1/health", headers={"Sec-Fetch-Site": site})[0] == 200


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/producers/stop"), ("PUT", "/v1/destinations/orders")])
def test_a_body_that_is_not_declared_json_is_415(
    server: AdminServer, ops: FakeOperations, content_type: str | None, method: str, path: str
) -> None:
    headers = dict(AUTH)
    if content_type is not None:
        headers["Content-Type"] = content_type
    status, _, answer = raw(server, method, path, headers, b'{"pattern": "orders"}')
    assert status == 415
    assert "application/json" in answer["error"]
    assert ops.calls == []


def test_json_with_a_charset_is_json(server: AdminServer, ops: FakeOperations) -> None:
    headers = {**AUTH, "Content-Type": "application/json; charset=utf-8"}
    assert call(server, "POST", "/v1/producers/stop", {"pattern": "x"}, headers=headers)[0] == 200


def test_options_preflight_is_405_without_cors_headers(server: AdminServer, ops: FakeOperations) -> None:
    preflight = {
        "Origin": "http://evil.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    for path in ("/v1/producers/stop", "/v1/destinations/orders", "/nowhere"):
        status, headers, answer = raw(server, "OPTIONS", path, preflight)
        assert status == 405
        assert "OPTIONS" in answer["error"]
        assert not [name for name in headers if name.lower().startswith("access-control-")]
    assert raw(server, "OPTIONS", "/v1/producers/stop", {})[1]["Allow"] == "POST"
    assert ops.calls == []


def test_no_answer_carries_cors_headers_and_none_may_be_sniffed(server: AdminServer) -> None:
    for method, path, headers in [
        ("GET", "/v1/destinations", {}),
        ("GET", "/v1/destinations", {"Origin": "http://evil.example"}),
        ("POST", "/v1/producers/stop", {"Content-Type": "text/plain"}),
        ("GET", "/v1/nothing", {}),
    ]:
        _, answer_headers, _ = raw(server, method, path, headers)
        assert not [name for name in answer_headers if name.lower().startswith("access-control-")]
        assert answer_headers["X-Content-Type-Options"] == "nosniff"
        assert answer_headers["Cache-Control"] == "no-store"


def test_a_request_refused_before_its_body_was_read_closes_the_connection(server: AdminServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request(
            "POST", "/v1/producers/stop", body=b'{"pattern": "x"}', headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 401
        assert response.headers["Connection"] == "close"
        response.read()
    finally:
        connection.close()


def test_a_refused_request_without_a_body_keeps_the_connection(server: AdminServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("DELETE", "/v1/destinations/orders")
        first = connection.getresponse()
        assert first.status == 401
        first.read()
        connection.request("GET", "/v1/health")
        assert connection.getresponse().status == 200
    finally:
        connection.close()


def test_refusals_are_logged_without_the_token(server: AdminServer, monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def info(self, event: str, **fields: Any) -> None:
            logged.append((event, fields))

        def debug(self, event: str, **fields: Any) -> None:
            pass

    monkeypatch.setattr(admin_module, "log", Log())
    call(server, "DELETE", "/v1/destinations/orders", headers={"Authorization": "Bearer not-the-token"})
    ((event, fields),) = logged
    assert event == "admin_refused"
    assert (fields["method"], fields["status"]) == ("DELETE", 401)
    assert "not-the-token" not in repr(fields) and TOKEN not in repr(fields)


# --- probes, metrics, connections, links, the dashboard's files ---------------------------


def test_healthz_and_readyz_need_no_token_even_beyond_loopback(server: AdminServer, ops: FakeOperations) -> None:
    server.loopback = False  # as if bound to 0.0.0.0: an orchestrator's probe has no token
    assert raw(server, "GET", "/healthz", {})[::2] == (200, {"status": "ok"})
    assert raw(server, "GET", "/readyz", {})[::2] == (200, {"status": "ready", "reason": "listening"})
    ops.ready = (False, "the broker is not reachable")
    assert raw(server, "GET", "/readyz", {})[::2] == (
        503,
        {"status": "not ready", "reason": "the broker is not reachable"},
    )
    # a wrong token is still wrong
    assert raw(server, "GET", "/healthz", {"Authorization": "Bearer nope"})[0] == 401


def test_healthz_is_503_when_the_reactor_does_not_answer(ops: FakeOperations) -> None:
    def stuck(_callback: Callable[[], T]) -> T:
        raise TimeoutError

    admin = AdminServer("127.0.0.1:0", ops, stuck, token=TOKEN, routes=plugin_routes(ops))
    admin.start()
    try:
        status, answer = call(admin, "GET", "/healthz")
        assert (status, answer["status"]) == (503, "unavailable")
    finally:
        admin.stop()


def _metrics(server: AdminServer, headers: dict[str, str]) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        return response.status, response.headers["Content-Type"], response.read().decode()
    finally:
        connection.close()


def test_metrics_are_prometheus_text_and_follow_the_read_rules(server: AdminServer) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    status, content_type, text = _metrics(server, AUTH)
    assert status == 200 and content_type.startswith("text/plain; version=")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("qpid_flow_destination_depth_messages", (("destination", "orders"),))] == 950
    assert samples[("qpid_flow_destination_flow_stopped", (("destination", "orders"),))] == 1
    assert samples[("qpid_flow_destination_flow_stops_total", (("destination", "orders"),))] == 3
    assert samples[("qpid_flow_messages_in_total", ())] == 5
    server.loopback = False
    assert _metrics(server, {})[0] == 401


def test_connections_links_and_closing_one(server: AdminServer, ops: FakeOperations) -> None:
    assert call(server, "GET", "/v1/connections") == (200, {"connections": [CONNECTION]})
    assert call(server, "GET", "/v1/connections/c1") == (200, CONNECTION)
    assert call(server, "GET", "/v1/connections/c9") == (404, {"error": "no connection 'c9'"})
    status, body = call(server, "GET", "/v1/links?connection=c1")
    assert (status, [link["connection"] for link in body["links"]]) == (200, ["c1"])
    assert len(call(server, "GET", "/v1/links")[1]["links"]) == 2
    assert call(server, "DELETE", "/v1/connections/c1") == (200, {"closed": "c1", "user": "alice"})
    assert call(server, "DELETE", "/v1/connections/c9") == (404, {"error": "no connection 'c9'"})
    assert call(server, "DELETE", "/v1/connections/c1", headers={})[0] == 401  # a change needs the token


@pytest.mark.parametrize("path", ["/dashboard/nope.js", "/dashboard/../admin.py", "/dashboard/x.py", "/dashboard/"])
def test_only_the_dashboards_own_files_are_served(server: AdminServer, path: str) -> None:
    status, _, answer = raw(server, "GET", path, {})
    assert status == 404 and "no such file" in answer["error"]


def test_the_dashboard_needs_no_token_and_runs_only_its_own_files(server: AdminServer) -> None:
    server.loopback = False
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        page = response.read().decode()
    finally:
        connection.close()
    assert response.status == 200, page
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert "<script" in page and "http://" not in page and "https://" not in page  # nothing fetched from elsewhere


def test_connections_past_the_cap_get_a_503_and_the_endpoint_recovers(server: AdminServer) -> None:
    """Clients that open connections and never send a request hold a thread and a
    descriptor each: past MAX_CONNECTIONS a new one is answered 503 at once, and once they
    go, requests are served again."""
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        assert wait_for(lambda: call_status(server) == 503)
    finally:
        for sock in idle:
            sock.close()
    assert wait_for(lambda: call_status(server) == 200)


def call_status(server: AdminServer) -> int:
    try:
        return call(server, "GET", "/v1/destinations")[0]
    except (OSError, AssertionError):
        return 0


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
