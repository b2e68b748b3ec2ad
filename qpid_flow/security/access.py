"""Who may do what: the ``[[acl]]`` entries and the connection limits (no Proton here).

The router asks :class:`AccessPolicy` at every attach (and, for an anonymous-relay
producer, at every transfer's ``to``) and :class:`ConnectionLimits` at every connection
open; the answers are plain values so that both are unit-tested alone.

ACL semantics (docs/security.md): entries are read in order; the first entry whose
``user`` matches (the name, or ``"*"``) and one of whose patterns for the direction matches
the address decides, allowing or denying by its ``action``. Once any entry exists, what no
entry decides is denied. With no entries at all, everything is allowed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

from qpid_flow.config import AclEntry, matches_any

__all__ = ["ANONYMOUS_USER", "AccessPolicy", "ConnectionLimits", "Direction"]

# The identity of a client that signed in with ANONYMOUS (or skipped SASL where allowed).
ANONYMOUS_USER = "anonymous"

Direction = Literal["send", "receive"]


class AccessPolicy:
    """The ``[[acl]]`` entries of the configuration, asked per attach."""

    def __init__(self, entries: Sequence[AclEntry]) -> None:
        self._entries = tuple(entries)
        # The addresses a name may be written as (the broker's dialect: in front of
        # RabbitMQ, queue ``orders`` is also ``/queue/orders``), any of which a pattern
        # may name: ``deny /queue/orders`` guards ``orders`` however a client writes it.
        self.address_forms: Callable[[str], tuple[str, ...]] = _the_name_alone

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def allows(self, user: str, direction: Direction, address: str) -> bool:
        """May ``user`` attach to (or, for ``send``, address a transfer to) ``address``?"""
        if not self._entries:
            return True
        forms = self.address_forms(address)
        for entry in self._entries:
            if entry.user != "*" and entry.user != user:
                continue
            patterns = entry.send if direction == "send" else entry.receive
            if any(matches_any(pattern, forms) for pattern in patterns):
                return entry.allow
        return False


def _the_name_alone(name: str) -> tuple[str, ...]:
    return (name,)


class ConnectionLimits:
    """Connections open now, in total and per user, against ``max_connections`` and
    ``max_connections_per_user`` (0: no limit)."""

    def __init__(self, total: int, per_user: int) -> None:
        self._total_limit = total
        self._per_user_limit = per_user
        self._open: Counter[str] = Counter()
        self._total = 0

    def admit(self, user: str) -> str | None:
        """Count a connection of ``user`` in; or, over a limit, the refusal's description."""
        if self._total_limit and self._total >= self._total_limit:
            return f"connection limit reached (max_connections = {self._total_limit})"
        if self._per_user_limit and self._open[user] >= self._per_user_limit:
            return f"connection limit of user {user!r} reached (max_connections_per_user = {self._per_user_limit})"
        self._open[user] += 1
        self._total += 1
        return None

    def release(self, user: str) -> None:
        """An admitted connection of ``user`` ended."""
        self._total -= 1
        self._open[user] -= 1
        if self._open[user] <= 0:
            del self._open[user]

    def open_connections(self, user: str | None = None) -> int:
        return self._total if user is None else self._open[user]
