"""What a plugin declares at start: its keys in ``[destinations."..."]`` tables
(``qpid_flow_destination_settings``) and its routes on the admin endpoint
(``qpid_flow_admin_routes``). qpid-flow's own policies declare theirs the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AdminRequest", "AdminRoute", "DestinationSetting", "required_string"]

# Fields are documented with ``:ivar`` in each class's docstring: the hook reference
# (qpid_flow.plugin.reference) renders them into docs/plugins.md and refuses a field left out.


@dataclass(frozen=True)
class DestinationSetting:
    """One key a plugin adds to destination policies (``[destinations."..."]`` tables and
    the policies set at runtime).

    The parsed value is ``policy.setting(key)`` (None while no table in force sets it). A
    value given under an alias is stored under ``key``.

    :ivar key: the key's name in destination tables.
    :ivar parse: ``parse(raw, name) -> value``: the value to keep for a raw value from the
        file or the admin API, ``name`` being the key's full name for the error (e.g.
        ``destinations."orders".my_key``); raises :class:`~qpid_flow.config.ConfigError`
        naming that key and the rule it breaks. :mod:`qpid_flow.config` has parsers for the
        usual kinds (``parse_boolean``, ``parse_duration``, ``parse_size``,
        ``parse_string``, ``parse_non_negative_int``).
    :ivar aliases: other names for the key, e.g. qpidd's queue-declare names
        (``qpid.flow_stop_count``).
    :ivar help: one line describing the key, for a configuration reference.
    """

    key: str
    parse: Callable[[Any, str], Any]
    aliases: tuple[str, ...] = ()
    help: str = ""


@dataclass(frozen=True)
class AdminRequest:
    """A request to a plugin's admin route, as its handler sees it.

    :ivar params: the route's ``{name}`` segments, by name, URL-unquoted.
    :ivar body: the JSON object sent, for a route that declares ``body``; None otherwise.
    :ivar query: the query string's parameters, each with the list of its values.
    """

    params: Mapping[str, str]
    body: Mapping[str, Any] | None
    query: Mapping[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class AdminRoute:
    """One method on one path of the admin endpoint, answered by a plugin.

    ``path`` starts with ``/v1/``; a segment written ``{name}`` matches any one segment,
    and a last segment ``{name}`` the rest of the path (a destination's name may hold
    "/"); values arrive URL-unquoted in ``request.params``. The handler runs on the
    reactor thread (so it may read and change router state) and returns the JSON body of
    a 200 answer. It raises :class:`KeyError` for "no such thing" (404: the key's text is
    the error, or "no {not_found} {value!r}" when it is just the name) and
    :class:`~qpid_flow.config.ConfigError` for a bad request (400 naming the key). Changes
    (every method but GET) need the admin token, as every built-in route does.

    :ivar method: ``GET``, ``PUT``, ``POST`` or ``DELETE``.
    :ivar path: the path, under ``/v1/`` and outside the built-in resources.
    :ivar handler: ``handler(request) -> body``, given an :class:`AdminRequest`.
    :ivar body: the body a POST or PUT must carry, described for the 400 when it is
        missing or not a JSON object (e.g. ``'{"pattern": "..."}'``); None: the route reads
        no body.
    :ivar not_found: what a plain ``KeyError(name)`` says was not found.
    """

    method: str
    path: str
    handler: Callable[[AdminRequest], Any]
    body: str | None = None
    not_found: str = "resource"


def required_string(body: Mapping[str, Any] | None, key: str) -> str:
    """``body[key]`` when it is a non-empty string, else a ConfigError (400) naming ``key``."""
    from qpid_flow.config import ConfigError

    value = None if body is None else body.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "must be a non-empty string")
    return value
