"""The users file: scrypt hashes, verification, the file format and atomic saves."""

from __future__ import annotations

import base64
import os
import stat
import time
from pathlib import Path

import pytest

from qpid_flow.config import ConfigError
from qpid_flow.security import users as users_module
from qpid_flow.security.users import UsersFile, check_name


@pytest.fixture
def cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cheaper scrypt for tests that hash many times; the format carries N, so files stay valid."""
    monkeypatch.setattr(users_module, "_N", 2**10)


def test_the_hash_is_scrypt_with_its_parameters_and_never_the_password(tmp_path: Path) -> None:
    users = UsersFile()
    users.add("alice", "s3cret-passw0rd")
    path = tmp_path / "users"
    users.save(path)
    text = path.read_text()
    assert "s3cret-passw0rd" not in text
    assert base64.b64encode(b"s3cret-passw0rd").decode() not in text
    (line,) = [line for line in text.splitlines() if not line.startswith("#")]
    name, _, encoded = line.partition(":")
    scheme, n, r, p, salt, digest = encoded.split("$")
    assert (name, scheme, n, r, p) == ("alice", "scrypt", "16384", "8", "1")
    assert len(base64.b64decode(salt)) == 16
    assert len(base64.b64decode(digest)) == 32


def test_two_users_with_one_password_get_different_salts(cheap: None) -> None:
    users = UsersFile()
    users.add("a", "same")
    users.add("b", "same")
    first, second = (line.split(":")[1] for line in users.dumps().splitlines())
    assert first.split("$")[4] != second.split("$")[4]
    assert first.split("$")[5] != second.split("$")[5]


def test_verify_right_wrong_and_unknown(cheap: None) -> None:
    users = UsersFile()
    users.add("alice", "wonderland")
    assert users.verify("alice", "wonderland")
    assert not users.verify("alice", "Wonderland")
    assert not users.verify("alice", "")
    assert not users.verify("bob", "wonderland")
    assert not users.verify("", "")


def test_unicode_passwords_and_names(cheap: None) -> None:
    users = UsersFile()
    users.add("zoë", "pässwörd ☃")
    assert users.verify("zoë", "pässwörd ☃")
    assert not users.verify("zoë", "passwörd ☃")


def test_an_unknown_name_costs_about_as_much_as_a_wrong_password() -> None:
    users = UsersFile()
    users.add("alice", "wonderland")

    def best_of(name: str) -> float:
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            users.verify(name, "guess")
            timings.append(time.perf_counter() - start)
        return min(timings)

    known, unknown = best_of("alice"), best_of("mallory")
    # Both run scrypt with the same cost; an early "no such user" would be ~1000x faster.
    assert unknown > known / 4


def test_round_trip_keeps_users_order_and_comments(tmp_path: Path, cheap: None) -> None:
    path = tmp_path / "users"
    path.write_text("# operators\n\n")
    users = UsersFile.load(path)
    users.add("alice", "a-pass")
    users.add("bob", "b-pass")
    users.save(path)
    with path.open("a") as handle:
        handle.write("# end\n")

    again = UsersFile.load(path)
    assert again.names() == ["alice", "bob"]
    assert again.verify("alice", "a-pass") and again.verify("bob", "b-pass")
    assert not again.verify("alice", "b-pass")
    assert again.dumps() == path.read_text()
    assert path.read_text().startswith("# operators\n\nalice:scrypt$")


def test_add_changes_the_password_of_an_existing_user_in_place(cheap: None) -> None:
    users = UsersFile()
    users.add("alice", "old")
    users.add("bob", "b")
    users.add("alice", "new")
    assert users.names() == ["alice", "bob"]
    assert users.verify("alice", "new") and not users.verify("alice", "old")


def test_remove(cheap: None, tmp_path: Path) -> None:
    users = UsersFile()
    users.add("alice", "a")
    users.add("bob", "b")
    assert users.remove("alice") is True
    assert users.remove("alice") is False
    assert users.names() == ["bob"]
    assert not users.verify("alice", "a")
    users.save(tmp_path / "users")
    assert UsersFile.load(tmp_path / "users").names() == ["bob"]


def test_an_empty_file_saves_a_header_only(tmp_path: Path) -> None:
    path = tmp_path / "users"
    UsersFile().save(path)
    assert UsersFile.load(path).names() == []
    assert path.read_text().startswith("#")


def test_save_is_atomic_and_owner_only(tmp_path: Path, cheap: None) -> None:
    path = tmp_path / "users"
    path.write_text("")
    path.chmod(0o644)
    users = UsersFile()
    users.add("alice", "a")
    users.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users"]  # no temporary file left


def test_a_failed_save_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, cheap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "users"
    original = UsersFile()
    original.add("alice", "a")
    original.save(path)
    before = path.read_text()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(users_module.os, "replace", broken_replace)
    changed = UsersFile.load(path)
    changed.add("bob", "b")
    with pytest.raises(OSError, match="disk on fire"):
        changed.save(path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users"]


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("alice\n", "line 1 must be NAME:scrypt$N$r$p$SALT$HASH"),
        ("# ok\nalice:plain-password\n", "line 2 (user 'alice'): the hash must be scrypt$N$r$p$SALT$HASH"),
        ("a:scrypt$x$8$1$AAAAAAAAAAA=$" + "A" * 44 + "\n", "line 1 (user 'a'): scrypt N, r and p must be integers"),
        ("a:scrypt$1000$8$1$AAAAAAAAAAA=$" + "A" * 44 + "\n", "line 1 (user 'a'): scrypt N must be a power of 2"),
        ("a:scrypt$1073741824$8$1$AAAAAAAAAAA=$" + "A" * 44 + "\n", "scrypt N must be a power of 2 from 2 to"),
        ("a:scrypt$1048576$32$1$AAAAAAAAAAA=$" + "A" * 44 + "\n", "asks for more than 256 MiB"),
        ("a:scrypt$16384$8$1$not*base64$" + "A" * 44 + "\n", "line 1 (user 'a'): the salt and the hash must be base64"),
        ("a:scrypt$16384$8$1$AAAA$" + "A" * 44 + "\n", "the salt must be at least 8 bytes"),
        ("a:scrypt$16384$8$1$AAAAAAAAAAA=$AAAA\n", "the hash must be 16 to 64 bytes"),
        ("\n\n:scrypt$16384$8$1$AAAAAAAAAAA=$" + "A" * 44 + "\n", "line 3: the user name must not be empty"),
        ("a b:scrypt$16384$8$1$AAAAAAAAAAA=$" + "A" * 44 + "\n", "line 1: the user name must not contain whitespace"),
    ],
)
def test_a_malformed_line_is_a_config_error_naming_the_line(tmp_path: Path, text: str, rule: str) -> None:
    path = tmp_path / "users"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        UsersFile.load(path)
    assert caught.value.key == "users_file"
    assert caught.value.value == str(path)
    assert rule in caught.value.rule
    assert str(caught.value).startswith(f"users_file = {str(path)!r}: ")


def test_a_user_listed_twice_is_refused(tmp_path: Path, cheap: None) -> None:
    users = UsersFile()
    users.add("alice", "a")
    line = users.dumps().strip()
    path = tmp_path / "users"
    path.write_text(f"{line}\n{line}\n")
    with pytest.raises(ConfigError, match="line 2: user 'alice' is listed twice"):
        UsersFile.load(path)


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_bytes(b"# fine\n\xff\xfe:x\n")
    with pytest.raises(ConfigError, match="line 2 is not UTF-8"):
        UsersFile.load(path)


def test_a_missing_or_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        UsersFile.load(tmp_path / "absent")
    if os.geteuid() != 0:  # root reads anything
        path = tmp_path / "locked"
        path.write_text("")
        path.chmod(0)
        with pytest.raises(ConfigError, match="cannot be read"):
            UsersFile.load(path)


def test_windows_line_endings_and_surrounding_spaces_are_accepted(tmp_path: Path, cheap: None) -> None:
    users = UsersFile()
    users.add("alice", "a")
    line = users.dumps().strip()
    path = tmp_path / "users"
    path.write_bytes(f"# users\r\n  {line}  \r\n".encode())
    assert UsersFile.load(path).verify("alice", "a")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "must not be empty"),
        ("a:b", "must not contain ':'"),
        ("a b", "whitespace"),
        ("a\tb", "whitespace"),
        ("a\x00b", "control"),
        ("a\x7fb", "control"),
        ("a\u200bb", "control"),  # zero-width space: format character
        ("x" * 256, "at most 255 bytes"),
    ],
)
def test_bad_names_are_refused(name: str, problem: str) -> None:
    found = check_name(name)
    assert found is not None and problem in found
    with pytest.raises(ValueError, match="user name"):
        UsersFile().add(name, "pw")


@pytest.mark.parametrize("name", ["alice", "alice@example.com", "CN=svc,O=acme", "zoë", "x" * 255])
def test_good_names(name: str) -> None:
    assert check_name(name) is None


def test_an_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="password must not be empty"):
        UsersFile().add("alice", "")
