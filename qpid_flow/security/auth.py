"""Standalone sign-in: PLAIN against the users file, EXTERNAL, ANONYMOUS (no Proton here).

The gate (:mod:`qpid_flow.amqp.gate`) asks :class:`Authenticator` what to offer each client and
whether its sasl-init names someone:

- PLAIN (offered once ``users_file`` is set): the password is checked against the file's
  salted scrypt hash. A slow hash is slow on purpose (tens of milliseconds), so it runs on a
  worker thread (``hashlib.scrypt`` lets go of the GIL) and the answer comes back through
  ``call_soon``: the reactor keeps moving messages while a client signs in. A name and
  password that passed once are remembered (as a keyed digest, never the password) until the
  file changes, so a thousand clients of one service user cost one hash, not a thousand.
- EXTERNAL (offered to a client whose TLS certificate was verified): the identity is the
  certificate's common name; an authorization identity, if sent, must be that name.
- ANONYMOUS (offered while no users file is configured, or with ``allow_anonymous = true``).

The users file is read again when its modification time changes: ``qpid-flow user add``
takes effect at the next sign-in, without a restart. A file that no longer reads keeps the
users last read, with a warning.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog

from qpid_flow.config import ConfigError
from qpid_flow.security.access import ANONYMOUS_USER
from qpid_flow.security.sasl import TRY_LATER

if TYPE_CHECKING:
    from qpid_flow.security.sasl import SaslInit

__all__ = ["Authenticator", "PasswordCheck", "claimed_user", "parse_plain"]

log = structlog.get_logger(__name__)


class PasswordCheck(Protocol):
    """What the authenticator needs of a users file (:class:`qpid_flow.security.users.UsersFile`)."""

    def verify(self, name: str, password: str) -> bool: ...


def parse_plain(response: bytes | None) -> tuple[str, str, str] | None:
    """PLAIN's initial response (RFC 4616) as (authzid, authcid, password); None if malformed."""
    if not response:
        return None
    parts = response.split(b"\0")
    if len(parts) != 3 or not parts[1]:
        return None
    try:
        authzid, authcid, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        return None
    return authzid, authcid, password


# AMQP 0-9-1 field-table value types as RabbitMQ reads them: fixed sizes, and those with
# a 4-byte length before their bytes.
_FIXED_FIELD_SIZES = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"f": 4}
_FIXED_FIELD_SIZES.update({b"l": 8, b"L": 8, b"d": 8, b"T": 8, b"D": 5, b"V": 0})
_SIZED_FIELDS = (b"S", b"x", b"A", b"F")


def parse_amqplain_login(response: bytes | None) -> str | None:
    """The LOGIN of RabbitMQ's AMQPLAIN initial response (an AMQP 0-9-1 field table's
    entries: short-string name, type, value), read as RabbitMQ reads it: every entry of
    every type, the first LOGIN, which must be a long string. None if it has none or the
    table is malformed: then qpid-flow cannot tell who signs in, and refuses (an entry of
    a type it skipped used to make it take a user RabbitMQ signed in for ``anonymous``)."""
    data = response or b""
    at = 0
    login: str | None = None
    try:
        while at < len(data):
            size = data[at]
            name = data[at + 1 : at + 1 + size]
            kind = data[at + 1 + size : at + 2 + size]
            at += 2 + size
            if kind in _SIZED_FIELDS:
                length = int.from_bytes(data[at : at + 4], "big")
                value = data[at + 4 : at + 4 + length]
                if len(data[at : at + 4]) != 4 or len(value) != length:
                    return None
                at += 4 + length
            elif kind in _FIXED_FIELD_SIZES:
                value = data[at : at + _FIXED_FIELD_SIZES[kind]]
                if len(value) != _FIXED_FIELD_SIZES[kind]:
                    return None
                at += len(value)
            else:
                return None
            if name == b"LOGIN" and login is None:
                if kind != b"S":
                    return None
                login = value.decode("utf-8")
    except (IndexError, UnicodeDecodeError):
        return None
    return login or None


def claimed_user(init: SaslInit | None, anonymous: str = ANONYMOUS_USER) -> str | None:
    """Who a client says it is in a sasl-init relayed to a broker (PLAIN's authcid,
    AMQPLAIN's LOGIN): the broker checks the password; qpid-flow's ACLs then apply to that
    name. ``anonymous`` (the user the broker signs such clients in as) for a mechanism
    without a user name (ANONYMOUS); None when the client sent credentials qpid-flow cannot
    read: it must not guess the identity the ACLs apply to (the gate refuses the client)."""
    if init is not None and init.mechanism == "PLAIN":
        credentials = parse_plain(init.initial_response)
        return None if credentials is None else credentials[1]
    if init is not None and init.mechanism == "AMQPLAIN":
        return parse_amqplain_login(init.initial_response)
    return anonymous


# Password checks (scrypt, about 50 ms each on a worker thread) waiting or running at once:
# from one client host, and in all. Beyond, a sign-in is refused at once: a flood of wrong
# passwords (600 in 0.1 s) queued 15 s of hashing, and every user not signed in before
# waited behind it until the SASL deadline dropped them. A pool of connections opening
# together from one host stays well under the first.
PENDING_PER_HOST = 16
PENDING_IN_ALL = 128


class Authenticator:
    """The sign-in rules of standalone mode (see the module doc)."""

    def __init__(
        self,
        users_file: str | None,
        allow_anonymous: bool,
        load_users: Callable[[str], PasswordCheck],
        call_soon: Callable[[Callable[[], None]], None],
        workers: int = 2,
    ) -> None:
        self._path = users_file
        self._allow_anonymous = allow_anonymous
        self._load_users = load_users
        self._call_soon = call_soon
        self._users: PasswordCheck | None = None
        self._version: int | None = None
        self._passed: set[bytes] = set()
        self._key = secrets.token_bytes(32)  # keys the remembered digests to this process
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._workers = workers
        # Password checks under way, by client host (counted on the reactor thread only).
        self._pending: dict[str, int] = {}
        if users_file is not None:
            self._reload(first=True)

    def mechanisms(self, certificate_name: str | None) -> tuple[str, ...]:
        offered = []
        if certificate_name is not None:
            offered.append("EXTERNAL")
        if self._path is not None:
            offered.append("PLAIN")
        if self._allow_anonymous:
            offered.append("ANONYMOUS")
        return tuple(offered)

    def skipping_sasl(self, certificate_name: str | None) -> str | None:
        if certificate_name is not None:
            return certificate_name  # TLS already said who it is
        return ANONYMOUS_USER if self._allow_anonymous else None

    def sign_in(
        self, init: SaslInit, certificate_name: str | None, done: Callable[[str | None], None], peer: str = ""
    ) -> None:
        """``peer``: the client's host, for the limits on password checks under way."""
        mechanism = init.mechanism
        if mechanism == "ANONYMOUS" and self._allow_anonymous:
            done(ANONYMOUS_USER)
        elif mechanism == "EXTERNAL" and certificate_name is not None:
            claimed = (init.initial_response or b"").decode("utf-8", "replace")
            done(certificate_name if claimed in ("", certificate_name) else None)
        elif mechanism == "PLAIN" and self._path is not None:
            self._plain(init.initial_response, done, peer)
        else:
            done(None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _plain(self, response: bytes | None, done: Callable[[str | None], None], peer: str = "") -> None:
        credentials = parse_plain(response)
        if credentials is None:
            done(None)
            return
        authzid, name, password = credentials
        if authzid not in ("", name):
            done(None)  # acting as someone else is not something a users file can grant
            return
        self._reload()
        users = self._users
        if users is None:
            done(None)
            return
        digest = hmac.digest(self._key, name.encode() + b"\0" + password.encode(), hashlib.sha256)
        if digest in self._passed:
            done(name)
            return
        version = self._version
        pending = self._pending
        if pending.get(peer, 0) >= PENDING_PER_HOST or sum(pending.values()) >= PENDING_IN_ALL:
            log.warning("sign_in_throttled", remote=peer or None, pending=pending.get(peer, 0))
            done(TRY_LATER)  # not a wrong password: sys-temp, and the client tries again
            return
        pending[peer] = pending.get(peer, 0) + 1

        def check() -> None:
            passed = users.verify(name, password)

            def answer() -> None:
                left = pending.get(peer, 1) - 1
                if left:
                    pending[peer] = left
                else:
                    pending.pop(peer, None)
                if passed and version == self._version:
                    self._passed.add(digest)
                done(name if passed else None)

            self._call_soon(answer)

        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="qpid-flow-auth")
        self._pool.submit(check)

    def _reload(self, first: bool = False) -> None:
        assert self._path is not None
        try:
            version = os.stat(self._path).st_mtime_ns
        except OSError as exc:
            if first:
                raise ConfigError("users_file", self._path, f"cannot be read: {exc.strerror}") from exc
            log.warning("users_file_unreadable", path=self._path, error=exc.strerror)
            return
        if version == self._version:
            return
        try:
            users = self._load_users(self._path)
        except ConfigError as exc:
            if first:
                raise
            log.warning("users_file_invalid", path=self._path, error=str(exc))
            return
        self._users, self._version = users, version
        self._passed.clear()
        if not first:
            log.info("users_file_reloaded", path=self._path)
