"""The client commands against a real admin endpoint (fake router) on 127.0.0.1."""

from __future__ import annotations

import io
import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from qpid_flow import cli
from qpid_flow.admin import http as admin_module
from qpid_flow.admin.http import AdminServer
from qpid_flow.config import ConfigError, build_config
from qpid_flow.security.users import UsersFile
from tests.unit.test_admin import ORDERS, SLASHED, TOKEN, FakeOperations, plugin_routes


@pytest.fixture
def ops() -> FakeOperations:
    return FakeOperations()


class QuietLog:
    """structlog's default configuration prints to stdout, which capsys would mix into the output."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@pytest.fixture
def admin(ops: FakeOperations, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv("QPID_FLOW_ADMIN", raising=False)
    monkeypatch.setenv("QPID_FLOW_ADMIN_TOKEN", TOKEN)
    monkeypatch.setattr(admin_module, "log", QuietLog())
    server = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor, token=TOKEN, routes=plugin_routes(ops))
    server.start()
    yield f"127.0.0.1:{server.port}"
    server.stop()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_stat_table(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stat", "--admin", admin)
    assert (code, err) == (0, "")
    header, rule, *rows = out.splitlines()
    assert header.split() == [
        "name",
        "depth",
        "bytes",
        "flowStopped",
        "flowStoppedCount",
        "stop/resume-count",
        "stop/resume-size",
        "max-count",
        "max-size",
        "producers",
        "blocked",
        "consumers",
        "groups",
    ]
    assert set(rule.strip()) == {"="}
    # sorted by name; Y/N for flowStopped; "-" for what the record does not carry
    assert [r.split() for r in rows] == [
        ["/queue/orders", "0", "0", "N", "-", "-", "-", "-", "-", "-", "-", "-", "-"],
        ["orders", "950", "12345", "Y", "3", "900/500", "-", "1000", "104857600", "4", "2", "1", "7"],
    ]
    # aligned: every row as wide as the header
    assert len({len(line) for line in (header, *rows)}) == 1


def test_stat_json_is_keyed_by_name(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stat", "--json", "--admin", admin)
    assert code == 0
    assert json.loads(out) == {"orders": ORDERS, "/queue/orders": SLASHED}
    assert list(json.loads(out)) == ["/queue/orders", "orders"]  # sorted keys


def test_admin_address_from_the_environment(
    admin: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPID_FLOW_ADMIN", admin)
    code, out, _ = run(capsys, "stat", "--json")
    assert code == 0
    assert "orders" in json.loads(out)


def test_config_add_sends_exactly_the_flags_given(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys,
        "config",
        "add",
        "destination",
        "/queue/orders",
        "--max-count",
        "1000",
        "--max-size",
        "10 MB",
        "--flow-stop-count",
        "900",
        "--flow-resume-count",
        "500",
        "--flow-stop-size",
        "8192",
        "--flow-resume-size",
        "6 KB",
        "--limit-policy",
        "flow",
        "--reject-after",
        "30s",
        "--group-header",
        "JMSXGroupID",
        "--shared-groups",
        "--group-lease",
        "2.5",
        "--admin",
        admin,
    )
    assert (code, err) == (0, "")
    expected = {
        "max_count": 1000,
        "max_size": "10 MB",
        "flow_stop_count": 900,
        "flow_resume_count": 500,
        "flow_stop_size": 8192,
        "flow_resume_size": "6 KB",
        "limit_policy": "flow",
        "reject_after": "30s",
        "group_header": "JMSXGroupID",
        "shared_groups": True,
        "group_lease": 2.5,
    }
    assert ops.calls == [("add_destination", "/queue/orders", expected)]
    assert json.loads(out) == {"name": "/queue/orders", **expected}


def test_config_add_sends_nothing_it_was_not_given(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(capsys, "config", "add", "destination", "PRICES.>", "--no-shared-groups", "--admin", admin)
    assert code == 0
    assert ops.calls == [("add_destination", "PRICES.>", {"shared_groups": False})]


def test_config_add_sends_any_key_with_set_as_toml_reads_it(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--set", "priority_levels=4", "--set", "x-tier=gold", "--set", "audit=true", "--set", 'limit="10 MB"']
    code, _, err = run(capsys, "config", "add", "destination", "jobs", *args, "--admin", admin)
    assert (code, err) == (0, "")
    expected = {"priority_levels": 4, "x-tier": "gold", "audit": True, "limit": "10 MB"}
    assert ops.calls == [("add_destination", "jobs", expected)]


def test_config_add_with_a_bad_value_exits_2_with_the_routers_error(
    admin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "config", "add", "destination", "orders", "--max-count", "-3", "--admin", admin)
    assert (code, out) == (2, "")
    assert err == 'qpid-flow: destinations."orders".max_count = -3: must be a non-negative integer\n'


def test_config_del(admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "del", "destination", "/queue/orders", "--admin", admin)
    assert code == 0
    assert ops.calls == [("remove_destination", "/queue/orders")]
    assert json.loads(out) == {"name": "/queue/orders", "removed": True}


def test_config_del_of_an_unknown_policy_exits_2(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "config", "del", "destination", "nope", "--admin", admin)
    assert (code, out, err) == (2, "", "qpid-flow: no destination policy 'nope'\n")


@pytest.mark.parametrize("action", ["stop", "start"])
def test_producers(admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str], action: str) -> None:
    code, out, _ = run(capsys, "producers", action, "PRICES.>", "--admin", admin)
    assert code == 0
    assert ops.calls == [("producers", action, "PRICES.>")]
    assert json.loads(out)["action"] == action


def test_groups_table(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "groups", "orders", "--admin", admin)
    assert code == 0
    header, rule, *rows = out.splitlines()
    assert header.split() == ["group", "owner", "held", "waiting"]
    assert set(rule.strip()) == {"="}
    assert [r.split() for r in rows] == [["g1", "c1/l2", "3", "10"], ["g2", "-", "0", "1"]]


def test_groups_json(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "groups", "orders", "--json", "--admin", admin)
    assert code == 0
    assert json.loads(out) == {
        "groups": [
            {"group": "g1", "owner": "c1/l2", "held": 3, "waiting": 10},
            {"group": "g2", "owner": None, "held": 0, "waiting": 1},
        ]
    }


def test_groups_of_an_unknown_destination_exits_2(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "groups", "nope", "--admin", admin)
    assert (code, err) == (2, "qpid-flow: no destination 'nope'\n")


def test_unreachable_endpoint_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{closed_port()}"
    code, out, err = run(capsys, "stat", "--admin", address, "--timeout", "2")
    assert (code, out) == (1, "")
    assert err == (
        f"qpid-flow: cannot reach the admin endpoint at {address} (is 'qpid-flow serve --admin {address}' running?)\n"
    )


def test_server_error_exits_1(admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str]) -> None:
    ops.fail_with = RuntimeError("boom")
    code, _, err = run(capsys, "stat", "--admin", admin)
    assert code == 1
    assert err == f"qpid-flow: the admin endpoint at {admin} answered 500: RuntimeError: boom\n"


def test_a_bad_admin_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["stat", "--admin", "localhost"])
    assert caught.value.code == 2
    assert "HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1", "soon"])
def test_a_timeout_must_be_a_positive_finite_number(capsys: pytest.CaptureFixture[str], timeout: str) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["stat", "--timeout", timeout])
    assert caught.value.code == 2
    assert "is not a positive number of seconds" in capsys.readouterr().err


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "qpid-flow.toml"
    config.write_bytes(b'admin = "127.0.0.1:8673" # caf\xe9\n')
    code, _, err = run(capsys, "stat", "--config", str(config))
    assert code == 2
    assert err.strip().splitlines() == [
        f"qpid-flow: configuration error: --config = {str(config)!r}: not valid TOML: TOML files are UTF-8"
    ]


def test_serve_admin_overrides_the_config_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def fake_load_config(path: Any, overrides: dict[str, Any], environ: Any = None) -> Any:
        seen.update(overrides)
        raise ConfigError("test", 0, "stop here")

    monkeypatch.setattr(cli, "load_config", fake_load_config)
    code, _, _ = run(capsys, "serve", "--admin", "127.0.0.1:9000")
    assert code == 2
    assert seen["admin"] == "127.0.0.1:9000"


# --- The admin token -------------------------------------------------------------------------


def test_a_change_without_a_token_exits_2_saying_where_to_put_it(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QPID_FLOW_ADMIN_TOKEN")
    code, out, err = run(capsys, "producers", "stop", "orders", "--admin", admin)
    assert (code, out) == (2, "")
    assert err == (
        f"qpid-flow: the admin endpoint at {admin} needs the admin token (401): "
        "set QPID_FLOW_ADMIN_TOKEN, or pass --config FILE with admin_token\n"
    )
    assert ops.calls == []


def test_a_wrong_token_exits_2(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPID_FLOW_ADMIN_TOKEN", "not-it")
    code, _, err = run(capsys, "config", "del", "destination", "orders", "--admin", admin)
    assert code == 2
    assert err == (
        f"qpid-flow: the admin endpoint at {admin} refused the admin token (401): "
        "check QPID_FLOW_ADMIN_TOKEN or admin_token in --config\n"
    )
    assert ops.calls == []


def test_a_router_without_a_token_refuses_changes_with_its_reason(
    ops: FakeOperations, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_module, "log", QuietLog())
    server = AdminServer("127.0.0.1:0", ops, ops.run_in_reactor, routes=plugin_routes(ops))
    server.start()
    try:
        address = f"127.0.0.1:{server.port}"
        code, _, err = run(capsys, "producers", "stop", "orders", "--admin", address)
        assert code == 2
        assert err.startswith(f"qpid-flow: the admin endpoint at {address} refused the request (403): changes need")
        assert "admin_token" in err and err.count("\n") == 1
        # Reads on loopback need no token, and the one in the environment does no harm.
        assert run(capsys, "stat", "--json", "--admin", address)[0] == 0
    finally:
        server.stop()


def test_reads_on_loopback_need_no_token(
    admin: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QPID_FLOW_ADMIN_TOKEN")
    code, out, _ = run(capsys, "stat", "--json", "--admin", admin)
    assert code == 0
    assert "orders" in json.loads(out)


def test_config_file_gives_the_token_and_the_address(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("QPID_FLOW_ADMIN_TOKEN")
    config = tmp_path / "qpid-flow.toml"
    config.write_text(f'admin = "{admin}"\nadmin_token = "{TOKEN}"\nusers_file = "/only/on/the/router"\n')
    code, _, err = run(capsys, "producers", "stop", "orders", "--config", str(config))
    assert (code, err) == (0, "")
    assert ops.calls == [("producers", "stop", "orders")]


def test_the_environment_token_wins_over_the_config_file(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "qpid-flow.toml"
    config.write_text('admin_token = "stale"\n')
    code, _, _ = run(capsys, "producers", "stop", "orders", "--config", str(config), "--admin", admin)
    assert code == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "file not found"),
        ("admin_token = [", "not valid TOML"),
        ("admin_token = 7", "admin_token: must be a non-empty string"),
        ('admin = "nowhere"', "admin: 'nowhere' is not HOST:PORT"),
    ],
)
def test_a_bad_config_file_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | None, message: str
) -> None:
    config = tmp_path / "qpid-flow.toml"
    if text is not None:
        config.write_text(text)
    code, out, err = run(capsys, "stat", "--config", str(config))
    assert (code, out) == (2, "")
    assert err.startswith("qpid-flow: configuration error: ") and message in err and err.count("\n") == 1


# --- qpid-flow user ----------------------------------------------------------------------------


@pytest.fixture
def cheap_scrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    from qpid_flow.security import users

    monkeypatch.setattr(users, "_N", 2**10)


def with_stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))


def test_user_add_list_remove_with_the_password_on_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cheap_scrypt: None
) -> None:
    path = tmp_path / "users"
    with_stdin(monkeypatch, "alice's pass word \nignored second line\n")
    assert run(capsys, "user", "add", str(path), "alice") == (0, f"added user 'alice' in {path}\n", "")
    with_stdin(monkeypatch, "b\r\n")
    assert run(capsys, "user", "add", str(path), "bob")[0] == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "pass word" not in path.read_text()
    users = UsersFile.load(path)
    assert users.verify("alice", "alice's pass word ")  # only the line end is taken off
    assert users.verify("bob", "b")

    assert run(capsys, "user", "list", str(path)) == (0, "alice\nbob\n", "")

    with_stdin(monkeypatch, "new\n")
    code, out, _ = run(capsys, "user", "add", str(path), "alice")
    assert (code, out) == (0, f"changed the password of user 'alice' in {path}\n")
    assert UsersFile.load(path).verify("alice", "new")

    assert run(capsys, "user", "remove", str(path), "alice") == (0, f"removed user 'alice' from {path}\n", "")
    assert run(capsys, "user", "list", str(path)) == (0, "bob\n", "")


def test_user_add_on_a_terminal_asks_twice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cheap_scrypt: None
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal(""))
    answers = iter(["s3cret", "s3cret", "one", "two"])
    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr(cli.getpass, "getpass", fake_getpass)
    path = tmp_path / "users"
    assert run(capsys, "user", "add", str(path), "alice")[0] == 0
    assert prompts == ["Password for alice: ", "Again: "]
    assert UsersFile.load(path).verify("alice", "s3cret")

    code, out, err = run(capsys, "user", "add", str(path), "alice")
    assert (code, out, err) == (2, "", "qpid-flow: the passwords do not match; nothing changed\n")
    assert UsersFile.load(path).verify("alice", "s3cret")


@pytest.mark.parametrize("stdin", ["", "\n"])
def test_user_add_refuses_an_empty_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stdin: str
) -> None:
    with_stdin(monkeypatch, stdin)
    path = tmp_path / "users"
    assert run(capsys, "user", "add", str(path), "alice") == (2, "", "qpid-flow: empty password; nothing changed\n")
    assert not path.exists()


@pytest.mark.parametrize("name", ["a:b", "a b", "", "tab\there"])
def test_user_add_refuses_a_bad_name_before_asking(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    with_stdin(monkeypatch, "pw\n")
    code, out, err = run(capsys, "user", "add", str(tmp_path / "users"), name)
    assert (code, out) == (2, "")
    assert err.startswith(f"qpid-flow: user name {name!r} must ")
    assert not (tmp_path / "users").exists()


def test_user_commands_on_a_malformed_file_name_the_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "users"
    path.write_text("# users\nalice:plain\n")
    before = path.read_text()
    with_stdin(monkeypatch, "pw\n")
    for argv in (["add", str(path), "bob"], ["remove", str(path), "alice"], ["list", str(path)]):
        code, out, err = run(capsys, "user", *argv)
        assert (code, out) == (2, "")
        assert err.startswith(f"qpid-flow: users_file = {str(path)!r}: line 2 (user 'alice'): ")
    assert path.read_text() == before


def test_user_remove_or_list_of_what_is_not_there_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cheap_scrypt: None
) -> None:
    missing = tmp_path / "missing"
    assert run(capsys, "user", "list", str(missing)) == (
        2,
        "",
        f"qpid-flow: users_file = {str(missing)!r}: no such file\n",
    )
    assert run(capsys, "user", "remove", str(missing), "alice")[0] == 2
    path = tmp_path / "users"
    users = UsersFile()
    users.add("bob", "b")
    users.save(path)
    assert run(capsys, "user", "remove", str(path), "alice") == (2, "", f"qpid-flow: no user 'alice' in {path}\n")


def test_user_add_that_cannot_write_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cheap_scrypt: None
) -> None:
    with_stdin(monkeypatch, "pw\n")
    path = tmp_path / "no-such-dir" / "users"
    code, out, err = run(capsys, "user", "add", str(path), "alice")
    assert (code, out) == (1, "")
    assert err.startswith(f"qpid-flow: cannot write {path}: ")


# --- qpid-flow serve: a refused configuration never starts ------------------------------------


class NeverStarted:
    """Stands in for the router: a test fails, rather than hangs, when serve gets this far."""

    def __init__(self, config: Any) -> None:
        raise AssertionError("serve started a router with a configuration it should have refused")


@pytest.mark.parametrize(
    ("file_text", "argv", "line"),
    [
        # A typo disabled nothing: flow control stayed on, silently.
        ("", ["--disable-plugin", "flw"], "disable_plugins = ['flw']: 'flw' names no plugin; known: events, flow"),
        # The file's value hidden behind the flag stopped the first start without it.
        ('listen = "nohostport"\n', [], "listen = 'nohostport': must be HOST:PORT, e.g. 127.0.0.1:5673"),
    ],
)
def test_serve_refuses_in_one_line_what_it_once_started_with(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    file_text: str,
    argv: list[str],
    line: str,
) -> None:
    monkeypatch.setattr("qpid_flow.amqp.server.Server", NeverStarted)
    monkeypatch.setattr("qpid_flow.logs.configure_logging", lambda *args: None)
    config = tmp_path / "qpid-flow.toml"
    config.write_text(file_text)
    code, out, err = run(capsys, "serve", "--config", str(config), "--listen", "127.0.0.1:0", *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"qpid-flow: configuration error: {line}") and err.count("\n") == 1


# --- what an operator's terminal and shell meet (a review of the CLI) -----------------------


@pytest.mark.parametrize("token", ["0123456789abcdef\n", "tök€n", " leading", "tab\tinside"])
def test_an_admin_token_no_header_can_carry_is_one_line_that_never_shows_it(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    """A secret made from a file ends in a newline: a 35-line traceback that printed the
    token; and the router took it at start, though no client could ever present it."""
    monkeypatch.setenv("QPID_FLOW_ADMIN_TOKEN", token)
    code, out, err = run(capsys, "producers", "stop", "orders", "--admin", admin)
    assert (code, out) == (2, "")
    assert err.startswith("qpid-flow: configuration error: QPID_FLOW_ADMIN_TOKEN: must ")
    assert err.count("\n") == 1 and token.strip() not in err
    assert ops.calls == []
    with pytest.raises(ConfigError, match=r"^admin_token = '\*\*\*': must (be printable ASCII|not start or end)"):
        build_config({"admin_token": token})
    # A token with a space inside is sent whole (the endpoint splits at the first only).
    assert build_config({"admin_token": "correct horse battery staple"}).admin_token


def test_names_clients_chose_reach_the_table_escaped() -> None:
    """An address with an escape sequence cleared the operator's screen; one with a line
    break forged a row of `qpid-flow stat`."""
    assert cli._cell("evil\x1b[2J\x1b]0;pwned\x07X") == "evil\\x1b[2J\\x1b]0;pwned\\x07X"
    assert cli._cell("line1\n  fake  999  row") == "line1\\n  fake  999  row"
    assert cli._cell("prix.€ /queue/orders") == "prix.€ /queue/orders"


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "add", "destination", ""],
        ["config", "del", "destination", ""],
        ["connection", "close", ""],
        ["groups", ""],
        ["producers", "stop", ""],
        ["stat", "--admin", "http://127.0.0.1:8673"],
    ],
)
def test_an_empty_name_or_an_admin_url_is_a_usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """An empty name went out as the collection's path ("PUT is not allowed", exit 1 as if
    the router had failed); a URL for --admin was tried as a host name."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_an_admin_address_from_the_environment_is_checked_as_the_flag_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPID_FLOW_ADMIN", "nonsense")
    code, out, err = run(capsys, "stat")
    assert (code, out) == (2, "")
    assert err == "qpid-flow: configuration error: QPID_FLOW_ADMIN: 'nonsense' is not HOST:PORT (e.g. 127.0.0.1:8673)\n"


def test_set_sends_a_toml_time_as_text_and_refuses_a_number_json_cannot_carry(
    admin: str, ops: FakeOperations, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--set reject_after=00:00:30` (a TOML time) ended in a TypeError traceback; `inf`
    in an error about a request body the operator never wrote."""
    code, _, err = run(
        capsys, "config", "add", "destination", "jobs", "--set", "reject_after=00:00:30", "--admin", admin
    )
    assert (code, err) == (0, "")
    assert ops.calls == [("add_destination", "jobs", {"reject_after": "00:00:30"})]
    with pytest.raises(SystemExit) as exited:
        cli.main(["config", "add", "destination", "jobs", "--set", "max_count=inf", "--admin", admin])
    assert exited.value.code == 2
    assert "max_count must be a finite number" in capsys.readouterr().err
    # Arrays and tables go as TOML reads them, for a plugin's keys that take them.
    assert cli._setting('tags=["a", "b"]') == ("tags", ["a", "b"])
    assert cli._setting("limits={soft=1, at=07:30:00}") == ("limits", {"soft": 1, "at": "07:30:00"})


@pytest.mark.parametrize(("raised", "code"), [(KeyboardInterrupt, 130), (BrokenPipeError, 1)])
def test_ctrl_c_or_a_reader_gone_ends_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, raised: type[BaseException], code: int
) -> None:
    def interrupted(_args: Any) -> int:
        raise raised

    monkeypatch.setattr(cli, "_stat", interrupted)
    assert cli.main(["stat"]) == code
    assert capsys.readouterr().err == ""


def test_config_list_shows_every_policy_patterns_included(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`config add destination 'PRICES.>'` left nothing to show it by: `stat` shows a
    pattern only on the destinations it rules, and `config del` needs its exact name."""
    code, _, err = run(capsys, "config", "add", "destination", "PRICES.>", "--max-count", "7", "--admin", admin)
    assert (code, err) == (0, "")
    code, out, err = run(capsys, "config", "list", "--admin", admin)
    assert (code, err) == (0, "")
    header, _rule, *rows = out.splitlines()
    assert header.split() == ["name", "settings", "destinations"]
    assert [row.split()[0] for row in rows] == ["/queue/orders", "PRICES.>", "orders"]
    assert rows[1].split() == ["PRICES.>", "max_count=1000", "0"]
    code, out, _ = run(capsys, "config", "list", "--json", "--admin", admin)
    assert [p["name"] for p in json.loads(out)["policies"]] == ["/queue/orders", "PRICES.>", "orders"]


def test_the_policies_listed_are_the_registrys_with_the_destinations_each_rules() -> None:
    from qpid_flow.admin.operations import Operations
    from qpid_flow.core.registry import Destinations
    from qpid_flow.plugin.manager import Hooks, build_plugin_manager

    config = build_config({"destinations": {"orders": {"max_count": 10}, "PRICES.>": {"max_count": 5}}})
    destinations = Destinations(config, Hooks(build_plugin_manager()))
    destinations.create_configured()
    destinations.get("PRICES.eu")
    destinations.get("other")
    operations = Operations(destinations, cast(Any, None))
    operations.add_destination("idle.*", {"max_count": 3})
    assert [(p["name"], p["policy"]["max_count"], p["destinations"]) for p in operations.policies()] == [
        ("PRICES.>", 5, ["PRICES.eu"]),
        ("idle.*", 3, []),
        ("orders", 10, ["orders"]),
    ]
