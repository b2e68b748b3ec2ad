"""Standalone sign-in rules, alone (qpid_flow.security.auth): mechanisms offered, PLAIN on a worker
thread with its answer handed back, EXTERNAL, ANONYMOUS, the users file read again on change."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from qpid_flow.config import ConfigError
from qpid_flow.security.auth import Authenticator, claimed_user, parse_amqplain_login, parse_plain
from qpid_flow.security.sasl import SaslInit


class Users:
    """A users file stand-in: 'name:password' lines, counting verifications and threads."""

    def __init__(self, path: str) -> None:
        text = Path(path).read_text()
        if "broken" in text:
            raise ConfigError("users_file", path, "line 1: not NAME:HASH")
        self.passwords = dict(line.split(":", 1) for line in text.split())
        self.checks = 0
        self.threads: set[str] = set()

    def verify(self, name: str, password: str) -> bool:
        self.checks += 1
        self.threads.add(threading.current_thread().name)
        return self.passwords.get(name) == password


class Reactor:
    """call_soon as the bridge does it: callbacks queued from any thread, run here."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.calls.put(callback)

    def run_one(self) -> None:
        self.calls.get(timeout=10)()


@pytest.fixture
def users_path(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    path.write_text("alice:wonderland\nbob:builder\n")
    return path


def sign_in(auth: Authenticator, reactor: Reactor, init: SaslInit, certificate: str | None = None) -> str | None:
    answers: list[str | None] = []
    auth.sign_in(init, certificate, answers.append)
    if not answers:
        reactor.run_one()  # the worker's answer, handed back
    assert len(answers) == 1
    return answers[0]


def plain(name: str, password: str, authzid: str = "") -> SaslInit:
    return SaslInit("PLAIN", f"{authzid}\0{name}\0{password}".encode(), None)


def test_mechanisms_offered() -> None:
    reactor = Reactor()
    assert Authenticator(None, True, Users, reactor.call_soon).mechanisms(None) == ("ANONYMOUS",)
    assert Authenticator(None, True, Users, reactor.call_soon).mechanisms("carol") == ("EXTERNAL", "ANONYMOUS")


def test_plain_checked_on_a_worker_thread_and_remembered(users_path: Path) -> None:
    reactor = Reactor()
    loaded: list[Users] = []

    def load(path: str) -> Users:
        loaded.append(Users(path))
        return loaded[-1]

    auth = Authenticator(str(users_path), False, load, reactor.call_soon)
    assert auth.mechanisms(None) == ("PLAIN",)
    assert sign_in(auth, reactor, plain("alice", "wonderland")) == "alice"
    assert loaded[0].threads and threading.current_thread().name not in loaded[0].threads
    assert sign_in(auth, reactor, plain("alice", "wonderland")) == "alice"
    assert loaded[0].checks == 1  # the second time costs no hash
    assert sign_in(auth, reactor, plain("alice", "wrong")) is None
    assert sign_in(auth, reactor, plain("mallory", "wonderland")) is None
    assert sign_in(auth, reactor, plain("alice", "wonderland", authzid="bob")) is None
    assert sign_in(auth, reactor, SaslInit("PLAIN", b"no separators", None)) is None
    assert sign_in(auth, reactor, SaslInit("ANONYMOUS", None, None)) is None  # not allowed here
    assert auth.skipping_sasl(None) is None
    auth.close()


def test_users_file_read_again_when_it_changes(users_path: Path) -> None:
    reactor = Reactor()
    auth = Authenticator(str(users_path), False, Users, reactor.call_soon)
    assert sign_in(auth, reactor, plain("bob", "builder")) == "bob"
    users_path.write_text("carol:new\n")
    os.utime(users_path, ns=(1, 1))  # a different modification time, whatever the clock
    assert sign_in(auth, reactor, plain("carol", "new")) == "carol"
    assert sign_in(auth, reactor, plain("bob", "builder")) is None  # removed: forgotten too
    users_path.write_text("broken")
    os.utime(users_path, ns=(2, 2))
    assert sign_in(auth, reactor, plain("carol", "new")) == "carol"  # kept the last good file
    auth.close()


def test_a_bad_users_file_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text("broken")
    with pytest.raises(ConfigError, match="users_file"):
        Authenticator(str(path), False, Users, Reactor().call_soon)


def test_external_and_anonymous() -> None:
    reactor = Reactor()
    auth = Authenticator(None, True, Users, reactor.call_soon)
    assert sign_in(auth, reactor, SaslInit("EXTERNAL", b"", None), "carol") == "carol"
    assert sign_in(auth, reactor, SaslInit("EXTERNAL", b"carol", None), "carol") == "carol"
    assert sign_in(auth, reactor, SaslInit("EXTERNAL", b"admin", None), "carol") is None
    assert sign_in(auth, reactor, SaslInit("EXTERNAL", b"", None), None) is None  # no certificate
    assert sign_in(auth, reactor, SaslInit("ANONYMOUS", b"me@example", None)) == "anonymous"
    assert auth.skipping_sasl(None) == "anonymous"
    assert auth.skipping_sasl("carol") == "carol"


def test_plain_parsing_and_the_identity_relayed_to_a_broker() -> None:
    assert parse_plain(b"\0guest\0guest") == ("", "guest", "guest")
    assert parse_plain(b"admin\0guest\0pw") == ("admin", "guest", "pw")
    assert parse_plain(b"\0\0pw") is None
    assert parse_plain(b"\xff\0a\0b") is None
    assert parse_plain(None) is None
    assert claimed_user(plain("guest", "guest")) == "guest"
    assert claimed_user(SaslInit("ANONYMOUS", None, None)) == "anonymous"
    assert claimed_user(None) == "anonymous"
    # In front of RabbitMQ: the user the broker signs anonymous clients in as.
    assert claimed_user(SaslInit("ANONYMOUS", None, None), "guest") == "guest"
    assert claimed_user(plain("alice", "pw"), "guest") == "alice"


def amqplain(**entries: str) -> bytes:
    """RabbitMQ's AMQPLAIN response: field-table entries, each a short-string name, ``S``
    and a long string."""
    out = b""
    for name, value in entries.items():
        data = value.encode()
        out += bytes([len(name)]) + name.encode() + b"S" + len(data).to_bytes(4, "big") + data
    return out


def test_amqplain_relays_its_login_as_the_identity() -> None:
    assert parse_amqplain_login(amqplain(LOGIN="alice", PASSWORD="pw")) == "alice"
    assert parse_amqplain_login(amqplain(PASSWORD="pw", LOGIN="bob")) == "bob"
    assert claimed_user(SaslInit("AMQPLAIN", amqplain(LOGIN="alice", PASSWORD="pw"), None)) == "alice"
    for bad in (None, b"", b"\x05LOG", amqplain(PASSWORD="pw"), b"\x05LOGINX", b"\x05LOGINS\x00\x00\x00\x09ab"):
        assert parse_amqplain_login(bad) is None
        # Unreadable credentials are no one: the gate refuses them (not "anonymous").
        assert claimed_user(SaslInit("AMQPLAIN", bad, None)) is None
    assert claimed_user(SaslInit("PLAIN", b"no separators", None)) is None


def test_amqplain_is_read_as_rabbitmq_reads_it_whatever_its_other_entries() -> None:
    """An entry of a type other than a long string made the LOGIN unreadable, and the client
    was taken for ``anonymous`` while RabbitMQ signed the real user in: the ACLs of that
    user no longer applied (X:t=1 before LOGIN was enough)."""
    flag = b"\x01Xt\x01"  # X: a boolean
    number = b"\x01NI\x00\x00\x00\x07"  # N: a signed 32-bit integer
    table = b"\x01TF\x00\x00\x00\x00"  # T: an empty table
    for before in (flag, number, table, flag + number + table):
        assert parse_amqplain_login(before + amqplain(LOGIN="alice", PASSWORD="pw")) == "alice"
    # RabbitMQ takes the first LOGIN, and only as a long string.
    assert parse_amqplain_login(amqplain(LOGIN="alice") + amqplain(LOGIN="mallory")) == "alice"
    assert parse_amqplain_login(b"\x05LOGINI\x00\x00\x00\x01" + amqplain(PASSWORD="pw")) is None
    # A type RabbitMQ does not know, or a truncated value: unreadable.
    assert parse_amqplain_login(b"\x01Xq\x01" + amqplain(LOGIN="alice")) is None
    assert parse_amqplain_login(b"\x01NI\x00\x00" + amqplain(LOGIN="alice")) is None


def test_password_checks_under_way_are_bounded_per_client_host(users_path: Path) -> None:
    """600 wrong passwords from one host queued 15 s of hashing, and users signing in from
    elsewhere waited behind them until the SASL deadline. A host has at most
    PENDING_PER_HOST checks under way; beyond, answered at once to try later (SASL
    sys-temp: the password may be right, so not auth, which qpid-jms takes as final);
    other hosts are not held."""
    from qpid_flow.security.auth import PENDING_PER_HOST
    from qpid_flow.security.sasl import TRY_LATER

    reactor = Reactor()
    auth = Authenticator(str(users_path), False, Users, reactor.call_soon)
    answers: list[str | None] = []
    for _ in range(PENDING_PER_HOST + 20):
        auth.sign_in(plain("alice", "wrong"), None, answers.append, peer="10.0.0.66")
    assert answers == [TRY_LATER] * 20  # at once, without a hash
    auth.sign_in(plain("bob", "builder"), None, answers.append, peer="10.0.0.7")
    for _ in range(PENDING_PER_HOST + 1):
        reactor.run_one()
    assert answers[20:].count(None) == PENDING_PER_HOST and "bob" in answers
    # The host's checks done, it may try again.
    assert sign_in(auth, reactor, plain("alice", "wonderland")) == "alice"
    auth.close()
