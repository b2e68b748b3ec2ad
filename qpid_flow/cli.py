"""The ``qpid-flow`` command line: ``serve`` runs the router; ``user`` edits a users file;
the other commands are clients of a running router's admin endpoint (``serve --admin
HOST:PORT``).

The client commands use ``urllib.request`` only, so a plain installation can administer
a router without extra dependencies. They send the admin token from
``QPID_FLOW_ADMIN_TOKEN`` or from ``admin_token`` in ``--config FILE``: never from the
command line, where other users could read it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import getpass
import http.client
import json
import math
import os
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from qpid_flow import __version__
from qpid_flow.config import ConfigError, load_config, token_problem
from qpid_flow.security.users import UsersFile, check_name

__all__ = ["DEFAULT_ADMIN", "build_parser", "main"]

DEFAULT_ADMIN = "127.0.0.1:8673"

# Exit codes of the client commands.
_EXIT_UNREACHABLE = 1  # no admin endpoint, no answer, or an answer that is not ours
_EXIT_REFUSED = 2  # the router answered 400 / 404: bad value or no such name; 401 / 403: not allowed

# The environment variable the client (and the router) read the admin token from.
_TOKEN_VARIABLE = "QPID_FLOW_ADMIN_TOKEN"


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the router",
        description="Run qpid-flow: standalone (in-memory destinations) unless --broker is given.",
    )
    serve.add_argument("--config", metavar="PATH", help="TOML configuration file (qpid-flow.toml)")
    serve.add_argument(
        "--listen",
        metavar="[amqps://]HOST:PORT[,...]",
        help="where clients connect (default 127.0.0.1:5673); amqps:// listeners speak TLS (--tls-cert, --tls-key)",
    )
    serve.add_argument("--tls-cert", metavar="FILE", help="the listener's certificate chain (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="the listener's private key (PEM)")
    serve.add_argument("--tls-ca", metavar="FILE", help="CA certificates that sign client certificates (PEM)")
    serve.add_argument(
        "--tls-require-client-cert",
        action="store_true",
        default=None,
        help="refuse TLS clients without a certificate signed by --tls-ca",
    )
    serve.add_argument("--users-file", metavar="FILE", help="users who may sign in with PLAIN (qpid-flow user add)")
    serve.add_argument(
        "--broker",
        metavar="URL[,URL...]",
        help=(
            "the broker to sit in front of, e.g. amqp://guest:guest@127.0.0.1:5672; several are tried in "
            "order (default: standalone). Clients authenticate at the broker with their own credentials; "
            "these serve qpid-flow's own links only. Keep a password off the command line: put it in the "
            "configuration file or in QPID_FLOW_BROKER / QPID_FLOW_BROKER_PASSWORD"
        ),
    )
    serve.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help=(
            "serve the HTTP admin endpoint here, e.g. 127.0.0.1:8673 (default: none); "
            "changes need admin_token (or QPID_FLOW_ADMIN_TOKEN), see docs/security.md"
        ),
    )
    serve.add_argument(
        "--events",
        metavar="PATH",
        help="write the event log to PATH (a file for jsonl, a folder for parquet); see docs/events.md (default: none)",
    )
    serve.add_argument(
        "--events-format",
        choices=["jsonl", "parquet"],
        help="the event log's format: JSON lines, or columnar segments for Spark (default: jsonl)",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["auto", "json", "console"])
    serve.add_argument(
        "--disable-plugin",
        action="append",
        default=None,
        metavar="NAME",
        help="do not load this plugin (repeatable)",
    )
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    overrides = {
        "listen": args.listen,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_ca": args.tls_ca,
        "tls_require_client_cert": args.tls_require_client_cert,
        "users_file": args.users_file,
        "broker": args.broker,
        "admin": args.admin,
        "events": args.events,
        "events_format": args.events_format,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "disable_plugins": args.disable_plugin,
    }
    try:
        config = load_config(args.config, overrides, os.environ)
    except ConfigError as exc:
        print(f"qpid-flow: configuration error: {exc}", file=sys.stderr)
        return 2
    from qpid_flow.amqp.server import ListenError, Server
    from qpid_flow.logs import configure_logging

    configure_logging(config.log_level, config.log_format)
    try:
        server = Server(config)
    except ConfigError as exc:  # a plugin refused its settings
        print(f"qpid-flow: configuration error: {exc}", file=sys.stderr)
        return 2
    from qpid_flow.admin.http import AdminListenError

    try:
        server.run()
    except AdminListenError as exc:
        print(f"qpid-flow: cannot listen on admin = {exc.listen}: {exc}", file=sys.stderr)
        return 1
    except ListenError as exc:
        print(f"qpid-flow: cannot listen on {config.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


# --- Client commands: talk to a running router's admin endpoint -----------------------------


class _ClientError(Exception):
    """Ends a client command with one line on stderr and an exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _admin_address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. {DEFAULT_ADMIN})")
    return text


def _non_empty(text: str) -> str:
    # An empty name made the path the collection's ("PUT is not allowed on /v1/destinations/",
    # exit 1 as if the router had failed).
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _size(text: str) -> int | str:
    # A bare number is a byte count; anything else ("10 MB") goes as written and the
    # router checks it with the same rules as the configuration file.
    return int(text) if text.strip().isdigit() else text


def _duration(text: str) -> float | int | str:
    try:
        number = float(text)
    except ValueError:
        return text  # "30s", "500ms": the router parses it
    return int(number) if number.is_integer() else number


class _Admin:
    """A tiny JSON client for the admin endpoint."""

    def __init__(self, address: str, timeout: float, token: str | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self.token = token
        # No proxies: the endpoint is on loopback or a trusted network, and an
        # http_proxy in the environment must not capture requests to it.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body, allow_nan=False).encode("utf-8")
        request = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method)
        request.add_header("Accept", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise self._no_answer() from exc
            raise self._unreachable() from exc
        except TimeoutError as exc:
            raise self._no_answer() from exc
        except ConnectionError as exc:
            raise self._unreachable() from exc
        except http.client.HTTPException as exc:
            raise self._not_ours(exc) from exc
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._not_ours(exc) from exc

    def _http_error(self, exc: urllib.error.HTTPError) -> _ClientError:
        try:
            message = str(json.loads(exc.read())["error"])
        except Exception:  # not our JSON: fall back to the status line
            message = f"HTTP {exc.code} {exc.reason}"
        if exc.code in (400, 404):
            return _ClientError(_EXIT_REFUSED, message)
        if exc.code == 401 and self.token:
            return _ClientError(
                _EXIT_REFUSED,
                f"the admin endpoint at {self.address} refused the admin token (401): "
                f"check {_TOKEN_VARIABLE} or admin_token in --config",
            )
        if exc.code == 401:
            return _ClientError(
                _EXIT_REFUSED,
                f"the admin endpoint at {self.address} needs the admin token (401): "
                f"set {_TOKEN_VARIABLE}, or pass --config FILE with admin_token",
            )
        if exc.code == 403:
            return _ClientError(
                _EXIT_REFUSED, f"the admin endpoint at {self.address} refused the request (403): {message}"
            )
        return _ClientError(_EXIT_UNREACHABLE, f"the admin endpoint at {self.address} answered {exc.code}: {message}")

    def _unreachable(self) -> _ClientError:
        return _ClientError(
            _EXIT_UNREACHABLE,
            f"cannot reach the admin endpoint at {self.address} (is 'qpid-flow serve --admin {self.address}' running?)",
        )

    def _no_answer(self) -> _ClientError:
        return _ClientError(
            _EXIT_UNREACHABLE, f"no answer from the admin endpoint at {self.address} within {self.timeout:g} s"
        )

    def _not_ours(self, exc: Exception) -> _ClientError:
        return _ClientError(_EXIT_UNREACHABLE, f"{self.address} did not answer like a qpid-flow admin endpoint ({exc})")


def _client(args: argparse.Namespace) -> _Admin:
    """The endpoint and token: command line, then environment, then ``--config``, then default."""
    settings = _client_config(args.config) if args.config else {}
    address = args.admin or os.environ.get("QPID_FLOW_ADMIN") or settings.get("admin") or DEFAULT_ADMIN
    token = os.environ.get(_TOKEN_VARIABLE) or settings.get("admin_token")
    problem = token_problem(token) if token else None
    if problem is not None:  # it could not go in a header (a 35-line traceback that showed it)
        source = _TOKEN_VARIABLE if os.environ.get(_TOKEN_VARIABLE) else "admin_token"
        raise _ClientError(_EXIT_REFUSED, f"configuration error: {source}: {problem}")
    try:
        address = _admin_address(address)
    except argparse.ArgumentTypeError as exc:
        source = "--admin" if args.admin else "QPID_FLOW_ADMIN" if os.environ.get("QPID_FLOW_ADMIN") else "admin"
        raise _ClientError(_EXIT_REFUSED, f"configuration error: {source}: {exc}") from None
    return _Admin(address, args.timeout, token)


def _client_config(path: str) -> dict[str, str]:
    """``admin`` and ``admin_token`` from a router's configuration file; the rest is the
    router's business (and may name files that exist only where it runs)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise _ClientError(_EXIT_REFUSED, f"configuration error: --config = {path!r}: file not found") from None
    except OSError as exc:
        raise _ClientError(_EXIT_REFUSED, f"configuration error: --config = {path!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _ClientError(_EXIT_REFUSED, f"configuration error: --config = {path!r}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise _ClientError(
            _EXIT_REFUSED, f"configuration error: --config = {path!r}: not valid TOML: TOML files are UTF-8"
        ) from None
    found: dict[str, str] = {}
    token = data.get("admin_token")
    if token is not None:
        if not isinstance(token, str) or not token:
            raise _ClientError(_EXIT_REFUSED, "configuration error: admin_token: must be a non-empty string")
        found["admin_token"] = token
    admin = data.get("admin")
    if admin is not None:
        try:
            found["admin"] = _admin_address(admin if isinstance(admin, str) else repr(admin))
        except argparse.ArgumentTypeError as exc:
            raise _ClientError(_EXIT_REFUSED, f"configuration error: admin: {exc}") from None
    return found


def _path_name(name: str) -> str:
    # Addresses may contain "/" (e.g. /queue/orders): quote it so the name stays one segment.
    return quote(name, safe="")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "Y" if value else "N"
    if isinstance(value, list | dict):
        return str(len(value))
    text = str(value)
    # Names come from clients (addresses, container ids, link names): an escape sequence
    # or a line break in one cleared the operator's screen or forged a row of the table.
    return text if text.isprintable() else repr(text)[1:-1]


def _pair(record: dict[str, Any], first: str, second: str) -> str:
    if record.get(first) is None and record.get(second) is None:
        return "-"
    return f"{_cell(record.get(first))}/{_cell(record.get(second))}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """qpid-stat style: the first ``left`` (text) columns left-aligned, the numbers right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  " + "  ".join(parts).rstrip()

    rule = "  " + "=" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


# header -> how to read it from a stat record (the router's camelCase statistic names, as in qpid's QMF).
_STAT_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("name", lambda r: _cell(r.get("name"))),
    ("depth", lambda r: _cell(r.get("depth"))),
    ("bytes", lambda r: _cell(r.get("bytes"))),
    ("flowStopped", lambda r: _cell(r.get("flowStopped"))),
    ("flowStoppedCount", lambda r: _cell(r.get("flowStoppedCount"))),
    ("stop/resume-count", lambda r: _pair(r, "flowStopCount", "flowResumeCount")),
    ("stop/resume-size", lambda r: _pair(r, "flowStopSize", "flowResumeSize")),
    ("max-count", lambda r: _cell(r.get("maxCount"))),
    ("max-size", lambda r: _cell(r.get("maxSize"))),
    ("producers", lambda r: _cell(r.get("producers"))),
    ("blocked", lambda r: _cell(r.get("producersBlocked"))),
    ("consumers", lambda r: _cell(r.get("consumers"))),
    ("groups", lambda r: _cell(r.get("groups"))),
]


# qdstat -c: who is connected.
_CONNECTION_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("id", lambda r: _cell(r.get("id"))),
    ("remote", lambda r: _cell(r.get("remote"))),
    ("user", lambda r: _cell(r.get("user"))),
    ("container", lambda r: _cell(r.get("container"))),
    ("opened", lambda r: _cell(r.get("opened"))),
    ("state", lambda r: _cell(r.get("state"))),
    ("broker", lambda r: _cell(r.get("broker"))),
    ("upstream", lambda r: _cell(r.get("upstream"))),
    ("sessions", lambda r: _cell(r.get("sessions"))),
    ("links", lambda r: _cell(r.get("links"))),
]

# qdstat -l: every client link, with what flow control does to it.
_LINK_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("connection", lambda r: _cell(r.get("connection"))),
    ("role", lambda r: _cell(r.get("role"))),
    ("dir", lambda r: _cell(r.get("direction"))),
    ("address", lambda r: _cell(r.get("address"))),
    ("state", lambda r: _cell(r.get("state"))),
    ("credit", lambda r: _cell(r.get("credit"))),
    ("unsettled", lambda r: _cell(r.get("unsettled"))),
    ("deliveries", lambda r: _cell(r.get("deliveries"))),
    ("blocked", lambda r: _cell(r.get("blocked"))),
]


def _stat(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.what == "connections":
        records = client.request("GET", "/v1/connections")["connections"]
        columns, left, key = _CONNECTION_COLUMNS, 8, "id"
    elif args.what == "links":
        records = client.request("GET", "/v1/links")["links"]
        columns, left, key = _LINK_COLUMNS, 5, None
    else:
        records = client.request("GET", "/v1/destinations")["destinations"]
        records = sorted(records, key=lambda r: str(r.get("name", "")))
        columns, left, key = _STAT_COLUMNS, 1, "name"
    if args.json:
        _print_json({str(r.get(key)): r for r in records} if key else records)
    else:
        rows = [[read(r) for _, read in columns] for r in records]
        print(_table([h for h, _ in columns], rows, left))
    return 0


def _close_connection(args: argparse.Namespace) -> int:
    closed = _client(args).request("DELETE", f"/v1/connections/{_path_name(args.id)}")
    print(f"closed connection {closed['closed']} (user {closed['user']})")
    return 0


# flag, TOML key, argparse type, metavar, help. Mirrors qpid-config add queue.
_DESTINATION_FLAGS: list[tuple[str, str, Callable[[str], Any], str, str]] = [
    ("--max-count", "max_count", int, "N", "most messages the destination holds (0: unlimited)"),
    ("--max-size", "max_size", _size, "SIZE", "most bytes it holds, e.g. '10 MB' (0: unlimited)"),
    ("--flow-stop-count", "flow_stop_count", int, "N", "hold producers back above this many messages"),
    ("--flow-resume-count", "flow_resume_count", int, "N", "let them go again below this many messages"),
    ("--flow-stop-size", "flow_stop_size", _size, "SIZE", "hold producers back above this many bytes"),
    ("--flow-resume-size", "flow_resume_size", _size, "SIZE", "let them go again below this many bytes"),
    ("--reject-after", "reject_after", _duration, "DURATION", "reject a transfer held back longer, e.g. '30s'"),
    ("--group-header", "group_header", str, "KEY", "application property naming a message's group"),
    ("--group-lease", "group_lease", _duration, "DURATION", "how long an idle group stays pinned to its consumer"),
]
_DESTINATION_KEYS = [key for _, key, *_ in _DESTINATION_FLAGS] + ["limit_policy", "shared_groups"]


def _setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` for ``--set``: the value as TOML reads it (``5``, ``true``, ``"10 MB"``),
    else as text, so ``--set group_header=JMSXGroupID`` needs no quotes."""
    import tomllib

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        value: Any = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    if isinstance(value, datetime.date | datetime.time):
        return key.strip(), raw  # a TOML date or time (reject_after=00:00:30): as written
    return key.strip(), _json_ready(value, f"{key.strip()}")


def _json_ready(value: Any, key: str) -> Any:
    """A value TOML read, as JSON carries it: dates and times (in an array or a table) as
    text; a number JSON cannot carry (inf, nan) refused, naming the key."""
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{key} must be a finite number, not {value}")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return [_json_ready(item, key) for item in value]
    if isinstance(value, dict):
        return {name: _json_ready(item, f"{key}.{name}") for name, item in value.items()}
    return value


def _config_add_destination(args: argparse.Namespace) -> int:
    # Only the flags given are sent: the router fills in the rest from its defaults.
    settings = {key: getattr(args, key) for key in _DESTINATION_KEYS if getattr(args, key) is not None}
    settings.update(dict(args.set or ()))
    _print_json(_client(args).request("PUT", f"/v1/destinations/{_path_name(args.name)}", settings))
    return 0


def _config_del_destination(args: argparse.Namespace) -> int:
    _print_json(_client(args).request("DELETE", f"/v1/destinations/{_path_name(args.name)}"))
    return 0


def _config_list(args: argparse.Namespace) -> int:
    answer = _client(args).request("GET", "/v1/policies")
    if args.json:
        _print_json(answer)
        return 0
    rows = [
        [
            _cell(p.get("name")),
            _cell(" ".join(f"{key}={value}" for key, value in sorted((p.get("policy") or {}).items()))),
            _cell(len(p.get("destinations") or [])),
        ]
        for p in answer.get("policies", [])
    ]
    print(_table(["name", "settings", "destinations"], rows, left=2))
    return 0


def _producers(args: argparse.Namespace) -> int:
    _print_json(_client(args).request("POST", f"/v1/producers/{args.action}", {"pattern": args.pattern}))
    return 0


def _groups(args: argparse.Namespace) -> int:
    answer = _client(args).request("GET", f"/v1/groups/{_path_name(args.destination)}")
    if args.json:
        _print_json(answer)
        return 0
    rows = [
        [_cell(g.get("group")), _cell(g.get("owner")), _cell(g.get("held")), _cell(g.get("waiting"))]
        for g in answer.get("groups", [])
    ]
    print(_table(["group", "owner", "held", "waiting"], rows, left=2))
    return 0


def _client_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin",
        metavar="HOST:PORT",
        type=_admin_address,
        help=f"the router's admin endpoint (default $QPID_FLOW_ADMIN, else admin in --config, else {DEFAULT_ADMIN})",
    )
    common.add_argument(
        "--config",
        metavar="PATH",
        help=f"the router's configuration file: its admin and admin_token (${_TOKEN_VARIABLE} wins over the file)",
    )
    common.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=25.0,
        # Past the endpoint's own deadlines (10 s to start a request, 10 more to finish
        # it): at 10, the CLI said "no answer" for a change the router then made.
        help="give up after this long (25)",
    )
    return common


def _client_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = _client_options()

    stat = sub.add_parser(
        "stat",
        parents=[common],
        help="destination, connection and link statistics",
        description="Show every destination (qpid-stat -q), connection (qdstat -c) or link (qdstat -l).",
    )
    stat.add_argument(
        "what",
        nargs="?",
        choices=["destinations", "connections", "links"],
        default="destinations",
        help="what to show (default: destinations)",
    )
    stat.add_argument(
        "--json", action="store_true", help="JSON: destinations and connections keyed by name and id, links a list"
    )
    stat.set_defaults(func=_stat)

    connection = sub.add_parser("connection", help="act on a client connection")
    connection_sub = connection.add_subparsers(dest="action", required=True)
    close = connection_sub.add_parser(
        "close",
        parents=[common],
        help="close a client connection",
        description="Close the client connection ID (from 'qpid-flow stat connections') with amqp:connection:forced.",
    )
    close.add_argument("id", type=_non_empty, help="the connection's id, e.g. c12")
    close.set_defaults(func=_close_connection)

    config = sub.add_parser("config", help="add or remove destination policies", description="Change policies.")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    add = config_sub.add_parser("add", help="add or replace a policy").add_subparsers(dest="object", required=True)
    destination = add.add_parser(
        "destination",
        parents=[common],
        help="add or replace a destination policy",
        description="Add or replace the policy of a destination name or pattern (like qpid-config add queue). "
        "Only the options given are set; the rest fall back to the router-wide defaults.",
    )
    destination.add_argument(
        "name", type=_non_empty, metavar="NAME", help="destination name or pattern (e.g. orders, PRICES.>)"
    )
    for flag, key, kind, metavar, text in _DESTINATION_FLAGS:
        destination.add_argument(flag, dest=key, type=kind, metavar=metavar, help=text)
    destination.add_argument(
        "--limit-policy", dest="limit_policy", choices=["flow", "reject", "ring"], help="what a full destination does"
    )
    destination.add_argument(
        "--shared-groups",
        dest="shared_groups",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="group ownership is shared by every consumer of the destination",
    )
    destination.add_argument(
        "--set",
        action="append",
        type=_setting,
        metavar="KEY=VALUE",
        help="any destination key, a plugin's own included (repeatable), e.g. --set priority_levels=4",
    )
    destination.set_defaults(func=_config_add_destination)
    delete = config_sub.add_parser("del", help="remove a policy").add_subparsers(dest="object", required=True)
    remove = delete.add_parser("destination", parents=[common], help="remove a destination policy")
    remove.add_argument("name", type=_non_empty, metavar="NAME", help="destination name or pattern, as added")
    remove.set_defaults(func=_config_del_destination)
    listing = config_sub.add_parser(
        "list",
        parents=[common],
        help="list the policies set, patterns included",
        description="List every policy set (configured or added since), with the destinations it rules now.",
    )
    listing.add_argument("--json", action="store_true", help="the endpoint's JSON answer")
    listing.set_defaults(func=_config_list)

    producers = sub.add_parser("producers", help="stop or start producers by address pattern")
    producers_sub = producers.add_subparsers(dest="action", required=True)
    for action, text in (("stop", "hold back producers to matching addresses"), ("start", "let them go again")):
        command = producers_sub.add_parser(action, parents=[common], help=text, description=text.capitalize() + ".")
        command.add_argument(
            "pattern", type=_non_empty, metavar="PATTERN", help="address or pattern (e.g. orders, PRICES.>)"
        )
        command.set_defaults(func=_producers)

    groups = sub.add_parser(
        "groups", parents=[common], help="message groups of a destination", description="Show who owns each group."
    )
    groups.add_argument("destination", type=_non_empty, metavar="DEST", help="destination name")
    groups.add_argument("--json", action="store_true", help="the endpoint's JSON answer")
    groups.set_defaults(func=_groups)


# --- qpid-flow user: the users file (SASL PLAIN, standalone) --------------------------------


def _load_users(path: str, *, missing_ok: bool = False) -> UsersFile:
    if missing_ok and not os.path.lexists(path):
        return UsersFile()
    try:
        return UsersFile.load(path)
    except ConfigError as exc:
        raise _ClientError(_EXIT_REFUSED, str(exc)) from None


def _save_users(users: UsersFile, path: str) -> None:
    try:
        users.save(path)
    except OSError as exc:
        raise _ClientError(_EXIT_UNREACHABLE, f"cannot write {path}: {exc.strerror or exc}") from None


def _read_password(name: str) -> str:
    """From the terminal (asked twice, not echoed), or the first line of standard input."""
    stdin = sys.stdin
    if stdin is None:
        raise _ClientError(_EXIT_REFUSED, "no standard input to read the password from")
    if stdin.isatty():
        try:
            password = getpass.getpass(f"Password for {name}: ")
            again = getpass.getpass("Again: ")
        except EOFError:
            raise _ClientError(_EXIT_REFUSED, "no password given; nothing changed") from None
        if password != again:
            raise _ClientError(_EXIT_REFUSED, "the passwords do not match; nothing changed")
    else:
        # One line, so that `printf '%s\n' "$PASSWORD" | qpid-flow user add ...` works;
        # only the line end is taken off (spaces may be part of a password).
        password = stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise _ClientError(_EXIT_REFUSED, "empty password; nothing changed")
    return password


def _user_add(args: argparse.Namespace) -> int:
    problem = check_name(args.name)
    if problem is not None:
        raise _ClientError(_EXIT_REFUSED, f"user name {args.name!r} {problem}")
    users = _load_users(args.file, missing_ok=True)
    existed = args.name in users
    users.add(args.name, _read_password(args.name))
    _save_users(users, args.file)
    print(f"{'changed the password of' if existed else 'added'} user {args.name!r} in {args.file}")
    return 0


def _user_remove(args: argparse.Namespace) -> int:
    users = _load_users(args.file)
    if not users.remove(args.name):
        raise _ClientError(_EXIT_REFUSED, f"no user {args.name!r} in {args.file}")
    _save_users(users, args.file)
    print(f"removed user {args.name!r} from {args.file}")
    return 0


def _user_list(args: argparse.Namespace) -> int:
    for name in _load_users(args.file).names():
        print(name)
    return 0


def _user_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    user = sub.add_parser(
        "user",
        help="add, remove or list users of a users file (SASL PLAIN, standalone)",
        description="Edit a users file (users_file, --users-file): one NAME:scrypt-hash line per user. "
        "Changes are written atomically (mode 0600).",
    )
    user_sub = user.add_subparsers(dest="user_command", required=True)
    add = user_sub.add_parser(
        "add",
        help="add a user, or change its password",
        description="Add NAME to FILE (created if absent), or change its password. The password is read "
        "from standard input: asked twice on a terminal, else the first line.",
    )
    add.add_argument("file", metavar="FILE", help="the users file")
    add.add_argument("name", metavar="NAME", help="the user name (no ':', whitespace or control characters)")
    add.set_defaults(func=_user_add)
    remove = user_sub.add_parser("remove", help="remove a user", description="Remove NAME from FILE.")
    remove.add_argument("file", metavar="FILE", help="the users file")
    remove.add_argument("name", metavar="NAME", help="the user name")
    remove.set_defaults(func=_user_remove)
    listing = user_sub.add_parser("list", help="list the users", description="Print the user names, one a line.")
    listing.add_argument("file", metavar="FILE", help="the users file")
    listing.set_defaults(func=_user_list)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qpid-flow", description="AMQP 1.0 flow-control and message-group router")
    parser.add_argument("--version", action="version", version=f"qpid-flow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _client_parsers(sub)
    _user_parser(sub)
    _report_parser(sub)
    return parser


def _report_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The analytics module imports PySpark only when a report runs: serving never loads it.
    from qpid_flow.analytics import report

    parser = sub.add_parser(
        "report",
        help="analyse event logs on Spark: flow control, latency, group audit, advice",
        description="Read qpid-flow event logs (--events) and write tables (Parquet, CSV), plots and "
        "index.html to --out. Needs the analytics extra: pip install 'qpid-flow[analytics]'.",
    )
    report.add_arguments(parser)
    parser.set_defaults(func=report.run_command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except _ClientError as exc:
        print(f"qpid-flow: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130  # Ctrl-C: as a shell reports it, without a traceback
    except BrokenPipeError:
        # The reader went (`qpid-flow stat --json | head`): nothing more to say to it.
        # Python's own flush of stdout at exit would raise it again: point stdout elsewhere.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
