"""The users file: who may sign in with SASL PLAIN when qpid-flow runs standalone.

One user per line, the name, a colon, and the password's scrypt hash in a
self-describing form (the parameters travel with the hash, so they can be raised later
without invalidating older lines)::

    # qpid-flow users (qpid-flow user add FILE NAME)
    alice:scrypt$16384$8$1$<salt, base64>$<hash, base64>

Blank lines and lines starting with ``#`` are comments; they are kept when the file is
rewritten. Passwords are never stored: :meth:`UsersFile.add` hashes them with
``hashlib.scrypt`` and a 16-byte random salt, :meth:`UsersFile.verify` recomputes the
hash and compares it in constant time. No Proton here: the gate calls ``verify``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from qpid_flow.config import ConfigError

__all__ = ["UsersFile", "check_name"]

# scrypt cost of new hashes: 16 MiB of memory and a few tens of milliseconds per check,
# which makes guessing from a stolen file slow without making sign-in slow.
_N = 2**14
_R = 8
_P = 1
_SALT_BYTES = 16
_HASH_BYTES = 32

# What a line may ask for: a file written by hand (or tampered with) must not make each
# sign-in allocate gigabytes or spin for minutes.
_MAX_N = 2**20
_MAX_R = 32
_MAX_P = 16
_MAX_MEMORY = 256 * 1024 * 1024  # 128 * N * r bytes

# SASL PLAIN carries the name as UTF-8; 255 bytes is the usual ceiling for an authcid.
_MAX_NAME_BYTES = 255

_SCHEME = "scrypt"
_HEADER = "# qpid-flow users: NAME:scrypt$N$r$p$SALT$HASH (qpid-flow user add FILE NAME)\n"


def check_name(name: str) -> str | None:
    """Why ``name`` cannot be a user name, or None if it can."""
    if not name:
        return "must not be empty"
    if len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
        return f"must be at most {_MAX_NAME_BYTES} bytes (UTF-8)"
    for char in name:
        if char == ":":
            return "must not contain ':'"
        # Category C: control, format, surrogate, private use and unassigned characters.
        if char.isspace() or unicodedata.category(char).startswith("C"):
            return f"must not contain whitespace or control characters (found {char!r})"
    return None


@dataclass(frozen=True)
class _Hash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def new(cls, password: str) -> _Hash:
        salt = secrets.token_bytes(_SALT_BYTES)
        return cls(_N, _R, _P, salt, _scrypt(password, salt, _N, _R, _P, _HASH_BYTES))

    @classmethod
    def parse(cls, text: str) -> _Hash:
        """The hash written as ``scrypt$N$r$p$SALT$HASH``; ValueError says what is wrong."""
        parts = text.split("$")
        if len(parts) != 6 or parts[0] != _SCHEME:
            raise ValueError(f"the hash must be {_SCHEME}$N$r$p$SALT$HASH")
        try:
            n, r, p = (int(part, 10) for part in parts[1:4])
        except ValueError:
            raise ValueError("scrypt N, r and p must be integers") from None
        if n < 2 or n > _MAX_N or n & (n - 1):
            raise ValueError(f"scrypt N must be a power of 2 from 2 to {_MAX_N}")
        if not 1 <= r <= _MAX_R or not 1 <= p <= _MAX_P:
            raise ValueError(f"scrypt r must be 1 to {_MAX_R} and p 1 to {_MAX_P}")
        if 128 * n * r > _MAX_MEMORY:
            raise ValueError(f"scrypt N * r asks for more than {_MAX_MEMORY // 2**20} MiB")
        try:
            salt = base64.b64decode(parts[4], validate=True)
            digest = base64.b64decode(parts[5], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the salt and the hash must be base64") from None
        if len(salt) < 8:
            raise ValueError("the salt must be at least 8 bytes")
        if not 16 <= len(digest) <= 64:
            raise ValueError("the hash must be 16 to 64 bytes")
        return cls(n, r, p, salt, digest)

    def format(self) -> str:
        salt = base64.b64encode(self.salt).decode("ascii")
        digest = base64.b64encode(self.digest).decode("ascii")
        return f"{_SCHEME}${self.n}${self.r}${self.p}${salt}${digest}"

    def matches(self, password: str) -> bool:
        computed = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(computed, self.digest)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    # maxmem: OpenSSL refuses anything above its 32 MiB default unless told; allow what
    # the parameters need (128 * r * (N + p + 2) bytes) plus room for the bookkeeping.
    maxmem = 128 * r * (n + p + 2) + 1024 * 1024
    # surrogatepass: any Python string can be hashed; SASL hands over valid UTF-8 anyway.
    secret = password.encode("utf-8", "surrogatepass")
    return hashlib.scrypt(secret, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=length)


class UsersFile:
    """The users of one file: load, verify, change, save.

    Not thread-safe: changes are for the ``qpid-flow user`` command; the router loads a
    file and only calls :meth:`verify` (which reads nothing shared but the loaded table).
    """

    def __init__(self) -> None:
        self._users: dict[str, _Hash] = {}
        # The file's lines in order: (name, None) for a user, (None, text) for a comment or
        # blank line, so that saving keeps what an operator wrote around the entries.
        self._lines: list[tuple[str | None, str | None]] = []
        # Checked against when the name is unknown, so that an unknown name costs as much
        # as a wrong password and the time taken does not tell which names exist.
        self._decoy = _Hash(_N, _R, _P, secrets.token_bytes(_SALT_BYTES), secrets.token_bytes(_HASH_BYTES))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> UsersFile:
        """Read ``path``; raises ConfigError("users_file", path, rule) naming the bad line."""
        shown = os.fspath(path)
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise ConfigError("users_file", shown, "no such file") from None
        except OSError as exc:
            raise ConfigError("users_file", shown, f"cannot be read: {exc.strerror or exc}") from None
        users = cls()
        for number, raw in enumerate(data.splitlines(), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError("users_file", shown, f"line {number} is not UTF-8") from None
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                users._lines.append((None, line))
                continue
            name, sep, encoded = stripped.partition(":")
            if not sep:
                raise ConfigError("users_file", shown, f"line {number} must be NAME:{_SCHEME}$N$r$p$SALT$HASH")
            problem = check_name(name)
            if problem is not None:
                raise ConfigError("users_file", shown, f"line {number}: the user name {problem}")
            if name in users._users:
                raise ConfigError("users_file", shown, f"line {number}: user {name!r} is listed twice")
            try:
                users._users[name] = _Hash.parse(encoded)
            except ValueError as exc:
                raise ConfigError("users_file", shown, f"line {number} (user {name!r}): {exc}") from None
            users._lines.append((name, None))
        return users

    def verify(self, name: str, password: str) -> bool:
        """True if ``name`` exists and ``password`` is its password. Takes about as long
        for an unknown name as for a wrong password."""
        entry = self._users.get(name)
        if entry is None:
            self._decoy.matches(password)
            return False
        return entry.matches(password)

    def names(self) -> list[str]:
        """The user names, in file order."""
        return list(self._users)

    def __contains__(self, name: object) -> bool:
        return name in self._users

    def __len__(self) -> int:
        return len(self._users)

    def add(self, name: str, password: str) -> None:
        """Add ``name`` with ``password`` (hashed), or change its password if it exists.
        Raises ValueError for a name that cannot be one or an empty password."""
        problem = check_name(name)
        if problem is not None:
            raise ValueError(f"user name {name!r} {problem}")
        if not password:
            raise ValueError("the password must not be empty")
        if name not in self._users:
            self._lines.append((name, None))
        self._users[name] = _Hash.new(password)

    def remove(self, name: str) -> bool:
        """Remove ``name``; False if there was no such user."""
        if self._users.pop(name, None) is None:
            return False
        self._lines = [line for line in self._lines if line[0] != name]
        return True

    def dumps(self) -> str:
        """The file's text: comments where they were, one ``NAME:HASH`` line per user."""
        if not self._lines:
            return _HEADER
        out = []
        for name, text in self._lines:
            out.append(f"{name}:{self._users[name].format()}" if name is not None else (text or ""))
        return "\n".join(out) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the file atomically (a temporary file in the same directory, then
        ``os.replace``), readable by its owner only (mode 0600)."""
        target = Path(path)
        directory = target.parent
        # mkstemp creates the file with mode 0600, so the hashes are never readable by
        # others, not even while being written.
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(self.dumps())
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        # Make the rename itself durable where the platform allows opening a directory.
        try:
            dir_fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            with contextlib.suppress(OSError):
                os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
