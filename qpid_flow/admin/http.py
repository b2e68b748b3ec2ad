"""The admin endpoint: a small HTTP/1.1 JSON API over the running router.

The HTTP server runs on its own daemon threads, but qpid-flow's state belongs to the
reactor thread, so every request hands its operation to ``run_in_reactor`` (in
production ``ReactorBridge.call``), which blocks the HTTP thread until the reactor has
run it and returns its result or re-raises its exception. Nothing here touches router
state directly.

Security (``docs/configuration.md``, Administration):

- every change (PUT, POST, DELETE, PATCH) needs ``Authorization: Bearer TOKEN`` with the
  configured ``admin_token``; with no token configured changes are refused (403), a
  missing or wrong token is 401 with ``WWW-Authenticate: Bearer``;
- reads (GET, HEAD) need the token too, unless the endpoint is bound to loopback;
- nothing a web page can send is obeyed: a request whose ``Origin`` is not the endpoint's
  own, or whose ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site``, is 403; a body
  must be ``application/json`` (415), so no "simple" cross-site form or ``text/plain``
  POST gets through; OPTIONS (a CORS preflight) is 405 and no answer carries CORS
  headers; on loopback, a tokenless request must name a loopback host (``Host``), which
  defeats DNS rebinding.

Routes (names are URL-path-quoted with ``safe=""``: ``/queue/orders`` is
``%2Fqueue%2Forders``)::

    GET    /                            the dashboard (static page; no token: it holds no data)
    GET    /dashboard/{file}            its script and style sheet
    GET    /healthz                     200 {"status": "ok"} while the reactor answers, else 503 (no token)
    GET    /readyz                      200 {"status": "ready"} or 503 {"status": "not ready", "reason"} (no token)
    GET    /metrics                     Prometheus text format (qpid_flow.admin.metrics)
    GET    /v1/health                   {"status": "ok"}
    GET    /v1/connections              {"connections": [record, ...]}   (qpid-flow stat connections)
    GET    /v1/connections/{id}         record
    DELETE /v1/connections/{id}         close it (amqp:connection:forced) -> {"closed": id, "user"}
    GET    /v1/links[?connection=ID]    {"links": [record, ...]}         (qpid-flow stat links)
    GET    /v1/destinations             {"destinations": [record, ...]}
    GET    /v1/destinations/{name}      record
    PUT    /v1/destinations/{name}      body: settings (TOML keys) -> the resulting policy
    DELETE /v1/destinations/{name}      -> what was removed
    GET    /v1/policies                 {"policies": [{"name", "policy", "destinations"}, ...]}  (qpid-flow config list)

Plugins add routes under /v1 (``qpid_flow_admin_routes``, :class:`AdminRoute`); qpid-flow's
own policies add theirs that way::

    POST   /v1/producers/stop           body: {"pattern": "..."}       (flow control)
    POST   /v1/producers/start          body: {"pattern": "..."}       (flow control)
    GET    /v1/groups/{name}            {"groups": [{"group", "owner", "held", "waiting"}, ...]}  (groups)
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import re
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from qpid_flow.admin.metrics import DeletionHandover, RouterCollector, Snapshot, registry_for
from qpid_flow.amqp.bridge import NotStarted, StillRunning
from qpid_flow.config import ConfigError, is_loopback
from qpid_flow.plugin.declarations import AdminRequest, AdminRoute

__all__ = ["AdminOperations", "AdminServer", "RunInReactor", "split_host_port"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

# A request body larger than this is refused (413): settings and patterns are tiny, and
# reading an unbounded body would let one client tie up memory.
_MAX_BODY = 1024 * 1024

# Idle keep-alive connections are closed after this many seconds, so a client that goes
# quiet does not pin a handler thread forever.
_IDLE_TIMEOUT = 60.0
MAX_CONNECTIONS = 64  # admin connections open at once (see _HTTPServer)
_BUSY_BODY = b'{"error": "too many admin connections open"}\n'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)

# serve_forever checks for stop() this often; stop() waits up to one interval.
_POLL_INTERVAL = 0.05

# Methods that only read; every other method changes something and always needs the token.
_READS = frozenset({"GET", "HEAD"})

# Reads that need no token anywhere: probes an orchestrator makes (they say only whether
# qpid-flow serves) and the dashboard's static files (its data comes from /v1, which does).
_PUBLIC = re.compile(r"^/(?:healthz|readyz|dashboard/[a-z0-9_-]+\.(?:html|js|css|svg))?$")
_STATIC_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
# The dashboard runs only its own files: no inline script or style, no other origin.
_DASHBOARD_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)

_WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="qpid-flow"'}
_SET_A_TOKEN = (
    "set admin_token in qpid-flow's configuration (or QPID_FLOW_ADMIN_TOKEN in its environment) "
    "and send it as 'Authorization: Bearer TOKEN'"
)


class AdminOperations(Protocol):
    """What the admin endpoint asks of the router. Every method runs on the reactor thread."""

    def stat(self) -> list[dict[str, Any]]:
        """One record per destination (``name``, ``depth``, ``bytes``, ``flowStopped``, ...)."""
        ...

    def stat_of(self, name: str) -> dict[str, Any] | None:
        """The record of the destination ``name`` names (as ``add_destination`` reads it), or None."""
        ...

    def add_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Add or replace the policy ``name`` (TOML keys); raises ConfigError on a bad value."""
        ...

    def remove_destination(self, name: str) -> dict[str, Any]:
        """Remove the policy ``name``; raises KeyError if there is none."""
        ...

    def policies(self) -> list[dict[str, Any]]:
        """Every policy set (configured or added at runtime), patterns included: ``name``,
        ``policy`` (its settings), ``destinations`` (those it is in force on now)."""
        ...

    def connections(self) -> list[dict[str, Any]]:
        """One record per client connection (``id``, ``remote``, ``user``, ``container``, ...)."""
        ...

    def links(self) -> list[dict[str, Any]]:
        """One record per client link (``connection``, ``address``, ``direction``, ``credit``, ...)."""
        ...

    def close_connection(self, connection_id: str) -> dict[str, Any]:
        """Close a client connection; raises KeyError if there is none."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """Whether qpid-flow is ready for clients, and why (not)."""
        ...

    def snapshot(self) -> Snapshot:
        """What a metrics scrape reads (qpid_flow.admin.metrics)."""
        ...


class RunInReactor(Protocol):
    """Run ``callback`` on the reactor thread and return its result (``ReactorBridge.call``).

    A callback protocol rather than ``Callable[[Callable[[], T]], T]``: each request has
    its own result type, so the callable itself must stay generic.
    """

    def __call__(self, callback: Callable[[], T], /) -> T: ...


def split_host_port(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` or ``"[v6]:PORT"`` -> ``(host, port)`` (brackets removed)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{listen!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


@dataclass(frozen=True)
class _Raw:
    """An answer that is not JSON (a static file, the metrics)."""

    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


class _Reply(Exception):
    """Ends a request early with this status and JSON body (bad input, not found, ...)."""

    def __init__(self, status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("error", status.phrase))
        self.status = status
        self.body = body
        self.headers = headers or {}


def _not_found(exc: KeyError, what: str, name: str) -> _Reply:
    # KeyError(name) is the usual way to say "no such name"; anything else it carries is
    # the router's own explanation and is passed on as is.
    detail = exc.args[0] if exc.args else name
    message = f"no {what} {name!r}" if detail == name else str(detail)
    return _Reply(HTTPStatus.NOT_FOUND, {"error": message})


def _json_bytes(body: Any) -> bytes:
    # Indented for people reading it with curl, without the padding of sort_keys or
    # trailing spaces; one newline at the end so shells print it cleanly.
    return (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the listen backlog (socketserver's 5 makes a burst of clients wait on SYN retries)

    def __init__(self, address: tuple[str, int], admin: AdminServer) -> None:
        # TCPServer creates its socket from the class attribute; an IPv6 literal needs AF_INET6.
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.admin = admin
        # A thread and a descriptor per connection: clients that open connections and never
        # finish a request (each read waits up to _IDLE_TIMEOUT) would take the process's
        # descriptors from its AMQP clients. Past MAX_CONNECTIONS, a new one gets a 503.
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread took it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr: a client hanging up mid-request is
        # nothing to report, and anything else goes to the log as one JSON record.
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            return
        log.warning("admin_http_error", client=client_address[0] if client_address else None, exc_info=error)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a reverse DNS lookup that can
        # stall start-up); the name is only used in CGI environments, so skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "qpid-flow-admin"
    timeout = _IDLE_TIMEOUT

    # --- plumbing -------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        # BaseHTTPRequestHandler writes every request to stderr; qpid-flow logs through structlog.
        log.debug("admin_http", client=self.client_address[0], message=format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The base class answers malformed requests and unknown methods with an HTML page;
        # keep the API JSON throughout. Like the base class, close the connection: the
        # request may not have been read completely.
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Error"
        self._send(code, {"error": message or phrase}, {"Connection": "close"})

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, _Raw):
            data, content_type, headers = body.body, body.content_type, {**body.headers, **(headers or {})}
        else:
            data, content_type = _json_bytes(body), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        # Answers are about live state (never cache them) and are what their type says
        # (never sniff them as anything else). No Access-Control-* header, ever.
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_body(self) -> bytes:
        # Always read the body before answering, even to refuse the request: on a
        # keep-alive connection unread bytes would be taken for the next request.
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.close_connection = True
            raise _Reply(HTTPStatus.LENGTH_REQUIRED, {"error": "send the body with a Content-Length"})
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise _Reply(HTTPStatus.BAD_REQUEST, {"error": f"bad Content-Length {raw!r}"})
        if length > _MAX_BODY:
            self.close_connection = True
            raise _Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"request body over {_MAX_BODY} bytes"})
        return self.rfile.read(length)

    def _announces_body(self) -> bool:
        length = self.headers.get("Content-Length")
        return self.headers.get("Transfer-Encoding") is not None or (length is not None and length.strip() != "0")

    def _dispatch(self) -> None:
        body_read = False
        try:
            if self.server.admin.stopping:
                raise _Reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "qpid-flow is shutting down"})
            self._check_request()
            body = self._read_body()
            body_read = True
            status, payload = self._route(self.command, self.path, body)
        except _Reply as reply:
            headers = reply.headers
            if not body_read and self._announces_body():
                # Refused before its body was read: the rest of the connection cannot be
                # trusted to start at a request boundary.
                self.close_connection = True
                headers = {**headers, "Connection": "close"}
            self._send(reply.status, reply.body, headers)
        except ConfigError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc), "key": exc.key})
        except StillRunning:
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"error": "qpid-flow's reactor started the request and has not finished it: its result is unknown"},
            )
        except NotStarted:
            # ReactorBridge.call gave up: the reactor is stuck or shutting down.
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"error": "qpid-flow's reactor did not answer in time (busy or shutting down)"},
            )
        except Exception as exc:
            log.exception("admin_error", method=self.command, path=self.path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
        else:
            self._send(status, payload)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _dispatch

    # --- who may ask ----------------------------------------------------------------------

    def _check_request(self) -> None:
        """Refuse what a web page could send, then anything without the token it needs, then
        a body that is not JSON. Runs before the body is read and before any route."""
        method = self.command
        try:
            if method == "OPTIONS":
                # A CORS preflight: answered with no Access-Control-* header, so the browser
                # never sends the real request.
                raise _Reply(
                    HTTPStatus.METHOD_NOT_ALLOWED,
                    {"error": "OPTIONS is not allowed: the admin endpoint takes no cross-origin requests"},
                    self._allow_header(),
                )
            self._check_same_origin()
            self._check_token(method)
            if self._announces_body() and self.headers.get_content_type() != "application/json":
                raise _Reply(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                    {"error": "the request body must be JSON, sent with 'Content-Type: application/json'"},
                )
        except _Reply as reply:
            log.info(
                "admin_refused",
                client=self.client_address[0],
                method=method,
                path=self.path,
                status=int(reply.status),
                reason=str(reply),
            )
            raise

    def _check_same_origin(self) -> None:
        site = (self.headers.get("Sec-Fetch-Site") or "").strip().lower()
        if site in ("cross-site", "same-site"):
            raise _Reply(
                HTTPStatus.FORBIDDEN, {"error": f"requests from web pages are refused (Sec-Fetch-Site: {site})"}
            )
        for origin in self.headers.get_all("Origin") or []:
            if not self._is_own_origin(origin):
                raise _Reply(
                    HTTPStatus.FORBIDDEN, {"error": f"requests from another origin are refused (Origin: {origin})"}
                )

    def _is_own_origin(self, origin: str) -> bool:
        # The endpoint's own origin is http:// plus the Host the request was sent to. A page
        # served from a rebound name (DNS rebinding) passes this, but then has no token,
        # and on loopback its Host is refused in _check_token.
        host = self.headers.get("Host")
        if host is None:
            return False
        try:
            theirs, ours = urlsplit(origin.strip()), urlsplit("//" + host.strip())
            return (
                theirs.scheme.lower() == "http"
                and theirs.hostname is not None
                and theirs.hostname == ours.hostname
                and (theirs.port or 80) == (ours.port or 80)
                and theirs.path in ("", "/")
            )
        except ValueError:  # a bad port or bracket
            return False

    def _bearer(self) -> str | None:
        """The token of ``Authorization: Bearer TOKEN``; "" for any other Authorization; None without one."""
        header = self.headers.get("Authorization")
        if header is None:
            return None
        scheme, _, token = header.strip().partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""

    def _check_token(self, method: str) -> None:
        admin = self.server.admin
        presented = self._bearer()
        if presented is None and method in _READS and _PUBLIC.match(self.path.split("?", 1)[0]):
            return
        if admin.token is not None and presented is not None:
            if not hmac.compare_digest(presented.encode("utf-8"), admin.token.encode("utf-8")):
                raise _Reply(HTTPStatus.UNAUTHORIZED, {"error": "wrong admin token"}, _WWW_AUTHENTICATE)
            return
        if method not in _READS:
            if admin.token is None:
                raise _Reply(HTTPStatus.FORBIDDEN, {"error": f"changes need a token: {_SET_A_TOKEN}"})
            raise _Reply(
                HTTPStatus.UNAUTHORIZED,
                {"error": "changes need the admin token: send 'Authorization: Bearer TOKEN'"},
                _WWW_AUTHENTICATE,
            )
        if not admin.loopback:
            if admin.token is None:
                raise _Reply(
                    HTTPStatus.FORBIDDEN, {"error": f"an endpoint beyond loopback needs a token: {_SET_A_TOKEN}"}
                )
            raise _Reply(
                HTTPStatus.UNAUTHORIZED,
                {"error": "this endpoint is not on loopback: reads need the admin token too"},
                _WWW_AUTHENTICATE,
            )
        # A tokenless read on loopback: only from a client that thinks it is talking to
        # loopback. A web page whose name was rebound to 127.0.0.1 sends its own name.
        host = self.headers.get("Host")
        if host is not None and not _names_loopback(host):
            raise _Reply(
                HTTPStatus.FORBIDDEN,
                {"error": f"Host {host!r} is not a loopback name: use 127.0.0.1, [::1] or localhost, or the token"},
            )

    def _allow_header(self) -> dict[str, str]:
        try:
            routes = self._routes(self.path, b"")
        except _Reply:
            return {}
        return {"Allow": ", ".join(routes)}

    # --- routes ---------------------------------------------------------------------------

    def _route(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        path = target.split("?", 1)[0].split("#", 1)[0]
        routes = self._routes(target, body)
        # HEAD is GET without the body (_send leaves it out).
        handler = routes.get("GET" if method == "HEAD" else method)
        if handler is None:
            allow = ", ".join(routes)
            raise _Reply(
                HTTPStatus.METHOD_NOT_ALLOWED,
                {"error": f"{method} is not allowed on {path}; allowed: {allow}"},
                {"Allow": allow},
            )
        return handler()

    def _routes(self, target: str, body: bytes) -> dict[str, Callable[[], tuple[int, Any]]]:
        """The methods ``target`` takes, each with what it does; 404 for no such route."""
        admin = self.server.admin
        path, _, query = target.split("#", 1)[0].partition("?")
        top = self._top_level(admin, path)
        if top is not None:
            return top
        parts = path.split("/")
        if len(parts) < 3 or parts[0] != "" or parts[1] != "v1":
            raise _Reply(HTTPStatus.NOT_FOUND, {"error": f"no such route: {path}"})
        resource, rest = parts[2], parts[3:]
        # Names are quoted with safe="" so they are one segment; an unquoted name with
        # "/" in it is accepted too, since no route has anything after the name.
        name = unquote("/".join(rest))

        routes: dict[str, Callable[[], tuple[int, Any]]]
        if resource == "health" and not rest:
            routes = {"GET": lambda: (200, self._health(admin))}
        elif resource == "policies" and not rest:
            routes = {"GET": lambda: (200, {"policies": admin.call(admin.operations.policies)})}
        elif resource == "destinations" and not name:
            routes = {"GET": lambda: (200, {"destinations": admin.call(admin.operations.stat)})}
        elif resource == "destinations":
            routes = {
                "GET": lambda: (200, self._one_destination(admin, name)),
                "PUT": lambda: (200, self._add_destination(admin, name, body)),
                "DELETE": lambda: (200, self._remove_destination(admin, name)),
            }
        elif resource == "connections" and not name:
            routes = {"GET": lambda: (200, {"connections": admin.call(admin.operations.connections)})}
        elif resource == "connections":
            routes = {
                "GET": lambda: (200, self._one_connection(admin, name)),
                "DELETE": lambda: (200, self._close_connection(admin, name)),
            }
        elif resource == "links" and not name:
            wanted = parse_qs(query).get("connection")
            routes = {"GET": lambda: (200, {"links": self._links(admin, wanted)})}
        else:
            routes = self._plugin_routes(admin, path, query, body)
            if not routes:
                raise _Reply(HTTPStatus.NOT_FOUND, {"error": f"no such route: {path}"})
        return routes

    @staticmethod
    def _plugin_routes(
        admin: AdminServer, path: str, query: str, body: bytes
    ) -> dict[str, Callable[[], tuple[int, Any]]]:
        """The methods plugins answer on ``path``, each running its handler on the reactor."""
        found: dict[str, Callable[[], tuple[int, Any]]] = {}
        for route in admin.routes:
            params = _match(route.path, path)
            if params is not None:
                found[route.method] = functools.partial(_call_plugin_route, admin, route, params, query, body)
        return found

    def _top_level(self, admin: AdminServer, path: str) -> dict[str, Callable[[], tuple[int, Any]]] | None:
        """Routes outside /v1: the dashboard, the probes, the metrics (None: not one of them)."""
        if path == "/":
            return {"GET": lambda: (200, _static("index.html"))}
        if path.startswith("/dashboard/"):
            name = path[len("/dashboard/") :]
            return {"GET": lambda: (200, _static(name))}
        if path == "/healthz":
            return {"GET": lambda: self._healthz(admin)}
        if path == "/readyz":
            return {"GET": lambda: self._readyz(admin)}
        if path == "/metrics":
            return {"GET": lambda: (200, admin.metrics())}
        return None

    @staticmethod
    def _healthz(admin: AdminServer) -> tuple[int, Any]:
        try:
            admin.call(lambda: None)
        except TimeoutError:
            return 503, {"status": "unavailable", "reason": "the router's reactor did not answer in time"}
        return 200, {"status": "ok"}

    @staticmethod
    def _readyz(admin: AdminServer) -> tuple[int, Any]:
        try:
            ready, reason = admin.call(admin.operations.readiness)
        except TimeoutError:
            return 503, {"status": "not ready", "reason": "the router's reactor did not answer in time"}
        if ready:
            return 200, {"status": "ready", "reason": reason}
        return 503, {"status": "not ready", "reason": reason}

    @staticmethod
    def _one_connection(admin: AdminServer, connection_id: str) -> dict[str, Any]:
        for record in admin.call(admin.operations.connections):
            if record.get("id") == connection_id:
                return record
        raise _Reply(HTTPStatus.NOT_FOUND, {"error": f"no connection {connection_id!r}"})

    @staticmethod
    def _close_connection(admin: AdminServer, connection_id: str) -> dict[str, Any]:
        try:
            return admin.call(lambda: admin.operations.close_connection(connection_id))
        except KeyError as exc:
            raise _not_found(exc, "connection", connection_id) from exc

    @staticmethod
    def _links(admin: AdminServer, connections: list[str] | None) -> list[dict[str, Any]]:
        records = admin.call(admin.operations.links)
        if connections:
            records = [r for r in records if r.get("connection") in connections]
        return records

    @staticmethod
    def _health(admin: AdminServer) -> dict[str, Any]:
        # Round-trip through the reactor: "ok" means the router is answering, not merely
        # that this thread is alive. A stuck reactor shows as 503.
        admin.call(lambda: None)
        return {"status": "ok"}

    @staticmethod
    def _one_destination(admin: AdminServer, name: str) -> dict[str, Any]:
        record = admin.call(lambda: admin.operations.stat_of(name))
        if record is not None:
            return record
        raise _Reply(HTTPStatus.NOT_FOUND, {"error": f"no destination {name!r}"})

    @staticmethod
    def _add_destination(admin: AdminServer, name: str, body: bytes) -> dict[str, Any]:
        settings = _json_object(body, "destination settings", empty_ok=True)
        return admin.call(lambda: admin.operations.add_destination(name, settings))

    @staticmethod
    def _remove_destination(admin: AdminServer, name: str) -> dict[str, Any]:
        try:
            return admin.call(lambda: admin.operations.remove_destination(name))
        except KeyError as exc:
            raise _not_found(exc, "destination policy", name) from exc


def _match(pattern: str, path: str) -> dict[str, str] | None:
    """The ``{name}`` values of ``path`` under a route's ``pattern``, or None if it does
    not match. A last ``{name}`` takes the rest of the path (a name may hold "/")."""
    wanted = pattern.split("/")
    parts = path.split("/")
    params: dict[str, str] = {}
    for index, segment in enumerate(wanted):
        is_param = segment.startswith("{") and segment.endswith("}")
        if is_param and index == len(wanted) - 1:
            value = "/".join(parts[index:])
            if not value:
                return None
            params[segment[1:-1]] = unquote(value)
            return params
        if index >= len(parts):
            return None
        if is_param:
            if not parts[index]:
                return None
            params[segment[1:-1]] = unquote(parts[index])
        elif segment != parts[index]:
            return None
    return params if len(parts) == len(wanted) else None


def _call_plugin_route(
    admin: AdminServer, route: AdminRoute, params: dict[str, str], query: str, body: bytes
) -> tuple[int, Any]:
    content = _json_object(body, route.body, empty_ok=False) if route.body is not None else None
    request = AdminRequest(params=params, body=content, query=parse_qs(query))
    try:
        return 200, admin.call(lambda: route.handler(request))
    except KeyError as exc:
        name = next(iter(params.values()), route.path)
        raise _not_found(exc, route.not_found, name) from exc


# The first path segment under /v1 of each built-in route: a plugin may not answer there.
_BUILTIN_RESOURCES = frozenset({"health", "destinations", "connections", "links", "policies"})
_ROUTE_METHODS = frozenset({"GET", "PUT", "POST", "DELETE"})


def _is_param(segment: str) -> bool:
    return segment.startswith("{") and segment.endswith("}")


def _overlap(first: str, second: str) -> bool:
    """Whether some path matches both route patterns (:func:`_match`: a ``{name}`` takes
    one segment, a last one the rest)."""
    a, b = first.split("/"), second.split("/")
    for index in range(min(len(a), len(b))):
        x, y = a[index], b[index]
        if not _is_param(x) and not _is_param(y) and x != y:
            return False
    if len(a) == len(b):
        return True
    shorter = a if len(a) < len(b) else b
    return _is_param(shorter[-1])  # its greedy last segment takes the longer one's rest


def _checked_routes(routes: Sequence[AdminRoute]) -> list[AdminRoute]:
    """Plugins' routes, refused at start (ConfigError: qpid-flow does not start, with one
    line) when one could never be reached or could answer another's requests: a method or
    path outside the rules, a built-in resource, a ``{name}`` as the resource, or two
    routes with one method that some path matches both."""
    checked: list[AdminRoute] = []
    for route in routes:
        where = f"{route.method} {route.path}"
        parts = route.path.split("/")
        if route.method not in _ROUTE_METHODS:
            raise ConfigError("admin route", where, "the method must be one of GET, PUT, POST, DELETE")
        if len(parts) < 3 or parts[:2] != ["", "v1"] or not parts[2] or _is_param(parts[2]):
            raise ConfigError("admin route", where, "must be under /v1/ and name its resource (/v1/NAME/...)")
        if parts[2] in _BUILTIN_RESOURCES:
            raise ConfigError("admin route", where, f"/v1/{parts[2]} is a built-in route")
        for other in checked:
            if other.method == route.method and _overlap(other.path, route.path):
                raise ConfigError("admin route", where, f"some paths match {other.method} {other.path} too")
        checked.append(route)
    return checked


def _static(name: str) -> _Raw:
    """A file of the dashboard (qpid_flow/admin/dashboard), by a plain name only."""
    match = re.fullmatch(r"[a-z0-9_-]+\.(html|js|css|svg)", name)
    resource = resources.files("qpid_flow.admin") / "dashboard" / name
    if match is None or not resource.is_file():
        raise _Reply(HTTPStatus.NOT_FOUND, {"error": f"no such file: /dashboard/{name}"})
    headers = {"Content-Security-Policy": _DASHBOARD_CSP, "X-Frame-Options": "DENY"}
    return _Raw(resource.read_bytes(), _STATIC_TYPES[match.group(1)], headers)


def _names_loopback(host: str) -> bool:
    """Whether a Host header (``name[:port]``) names this machine's loopback."""
    try:
        name = urlsplit("//" + host.strip()).hostname
    except ValueError:
        return False
    return name is not None and is_loopback(name)


def _not_json(constant: str) -> Any:
    """Python's json module reads NaN and Infinity, which JSON does not have (and which
    would then be written back into answers no strict parser reads)."""
    raise ValueError(f"{constant} is not a JSON value")


def _json_object(body: bytes, what: str, *, empty_ok: bool) -> dict[str, Any]:
    if not body.strip():
        if empty_ok:
            return {}
        raise _Reply(HTTPStatus.BAD_REQUEST, {"error": f"the request body must be a JSON object: {what}"})
    try:
        value = json.loads(body, parse_constant=_not_json)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Reply(HTTPStatus.BAD_REQUEST, {"error": f"the request body is not valid JSON: {exc}"}) from exc
    except (ValueError, RecursionError) as exc:  # NaN / Infinity, or nested past Python's stack
        raise _Reply(HTTPStatus.BAD_REQUEST, {"error": f"the request body is not valid JSON: {exc}"}) from exc
    if not isinstance(value, dict):
        raise _Reply(HTTPStatus.BAD_REQUEST, {"error": f"the request body must be a JSON object: {what}"})
    return value


class AdminListenError(OSError):
    """The admin endpoint's address cannot be bound (``admin`` names it, not ``listen``)."""

    def __init__(self, listen: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.listen = listen


class AdminServer:
    """The HTTP JSON admin endpoint on a daemon thread; operations run on the reactor.

    ``token`` is the admin token (``admin_token``): required for every change, and for
    reads too unless ``listen`` is a loopback address. None: changes are refused.
    """

    def __init__(
        self,
        listen: str,
        operations: AdminOperations,
        run_in_reactor: RunInReactor,
        *,
        token: str | None = None,
        metrics_max_destinations: int = 500,
        routes: Sequence[AdminRoute] = (),
    ) -> None:
        self.listen = listen
        self.operations = operations
        self.routes = _checked_routes(routes)
        # /metrics: one snapshot per scrape, taken on the reactor thread. A scrape whose
        # snapshot was taken but never read (its wait ran out as the reactor finished it):
        # the deleted destinations' counts it took go out again with the next one, until
        # the collector has split them.
        handover = DeletionHandover()  # on the reactor thread only

        def take_snapshot(acknowledged: int) -> Snapshot:
            return self.call(lambda: handover.pass_on(operations.snapshot(), acknowledged))

        collector = RouterCollector(take_snapshot, metrics_max_destinations)
        self._metrics_registry = registry_for(collector)
        self._run_in_reactor = run_in_reactor
        self.token = token or None  # an empty token would let an empty Authorization in
        try:
            self.loopback = is_loopback(split_host_port(listen)[0])
        except ValueError:  # start() reports the bad address
            self.loopback = False
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.stopping = False

    def metrics(self) -> _Raw:
        """The Prometheus text exposition of qpid-flow's metrics."""
        return _Raw(generate_latest(self._metrics_registry), CONTENT_TYPE_LATEST)

    def call(self, callback: Callable[[], T]) -> T:
        """Run ``callback`` on the reactor thread (from an HTTP thread) and return its result."""
        return self._run_in_reactor(callback)

    @property
    def port(self) -> int:
        """The port actually bound (useful with ``HOST:0``)."""
        if self._httpd is None:
            raise RuntimeError("the admin server is not started")
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Bind and serve on a daemon thread. Raises OSError if the address cannot be bound."""
        if self._httpd is not None:
            return
        host, port = split_host_port(self.listen)
        try:
            self._httpd = _HTTPServer((host, port), self)
        except OSError as exc:
            raise AdminListenError(self.listen, exc) from exc
        self.stopping = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL},
            name="qpid-flow-admin",
            daemon=True,
        )
        self._thread.start()
        # At debug: the router's own "listening" event reports the admin address.
        log.debug("admin_listening", listen=f"{host}:{self.port}" if ":" not in host else f"[{host}]:{self.port}")

    def stop(self) -> None:
        """Stop accepting requests and close the listening socket. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        # Requests still in flight on kept-alive connections answer 503 from now on.
        self.stopping = True
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
