"""Configuration: the ``qpid-flow.toml`` file plus command-line overrides.

Router-wide keys live at the top level; each ``[destinations."NAME-OR-PATTERN"]`` table
holds one destination policy; ``[plugins.NAME]`` tables belong to plugins. Every key is
checked at start: an unknown key or a bad value stops the router with one line that
names the key, the value and the rule (:class:`ConfigError`).
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pluggy

    from qpid_flow.brokers import BrokerAddress
    from qpid_flow.plugin.declarations import DestinationSetting

__all__ = [
    "ENVIRONMENT_KEYS",
    "AclEntry",
    "ConfigError",
    "DestinationPolicy",
    "RouterConfig",
    "load_config",
    "parse_duration",
    "parse_size",
]


class ConfigError(ValueError):
    """A configuration value breaks a rule. ``str()`` is the one line to show."""

    def __init__(self, key: str, value: Any, rule: str) -> None:
        super().__init__(f"{key} = {value!r}: {rule}")
        self.key = key
        self.value = value
        self.rule = rule


# --- Value parsers -----------------------------------------------------------------------

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1024, "kib": 1024,
    "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1024**3, "gib": 1024**3,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")  # no unit: seconds
# AMQP sizes are ulong (max-message-size), and Proton keeps durations (idle time-out,
# timers) in 32-bit milliseconds: larger values would fail later, on every connection.
MAX_SIZE = 2**63 - 1  # a signed 64-bit integer: the event log's int64 columns, Prometheus
MAX_DURATION = (2**32 - 1) // 1000  # 4,294,967 s, about 49 days


def parse_size(value: Any, key: str = "size") -> int:
    """Bytes from an integer or a string such as ``"10 MB"`` / ``"512 KB"`` (binary units)."""
    if isinstance(value, bool):
        raise ConfigError(key, value, "must be a byte count or a size such as '10 MB'")
    size: int | None = None
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, value, "must not be negative")
        size = value
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            # Decimal, not float: a long number is not infinity, and 0.5 KB is exact.
            size = int(Decimal(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    if size is None:
        raise ConfigError(key, value, "must be a byte count or a size such as '10 MB' or '512 KB'")
    if size > MAX_SIZE:
        raise ConfigError(key, value, f"must be at most {MAX_SIZE} bytes (2^63 - 1)")
    return size


def parse_duration(value: Any, key: str = "duration") -> float:
    """Seconds from a number or a string such as ``"30s"``, ``"500ms"``, ``"2m"``."""
    if isinstance(value, bool):
        raise ConfigError(key, value, "must be a duration such as '30s' or '500ms'")
    seconds: float | None = None
    if isinstance(value, int | float):
        if value < 0:
            raise ConfigError(key, value, "must not be negative")
        seconds = float(value)  # nan and inf are refused below (not finite, not <= the cap)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds is None:
        raise ConfigError(key, value, "must be a duration such as '30s', '500ms' or '2m'")
    if not seconds <= MAX_DURATION:  # also false for nan
        raise ConfigError(key, value, f"must be at most {MAX_DURATION} s (about 49 days)")
    return seconds


def _positive_duration(value: Any, key: str) -> float:
    """A duration that means nothing at 0: ``sasl_timeout = 0`` dropped every client as it
    connected, ``reconnect_max_delay = 0`` retried the broker in a loop with no pause.
    (Durations where 0 has a meaning, "never" or "do not wait", take :func:`parse_duration`.)"""
    seconds = parse_duration(value, key)
    if not seconds:
        raise ConfigError(key, value, "must be a duration above 0, such as '10s' or '500ms'")
    return seconds


# The largest count taken: what a signed 64-bit integer holds, as for sizes (MAX_SIZE).
LARGEST = MAX_SIZE


def parse_non_negative_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(key, value, "must be a non-negative integer")
    if value > LARGEST:
        raise ConfigError(key, value, f"must be at most {LARGEST} (a signed 64-bit integer)")
    return value


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "must be a positive integer")
    if value > LARGEST:
        raise ConfigError(key, value, f"must be at most {LARGEST} (a signed 64-bit integer)")
    return value


# AMQP link credit is a uint, and Proton's link.flow() takes a C int: past 2^31 - 1 every
# link the value becomes credit for fails (OverflowError), long after the start.
MAX_CREDIT = 2**31 - 1


def _link_credit(value: Any, key: str) -> int:
    """A positive integer that becomes link credit (``producer_window``, ``consumer_lookahead``)."""
    credit = _positive_int(value, key)
    if credit > MAX_CREDIT:
        raise ConfigError(key, value, f"must be at most {MAX_CREDIT} (link credit, a signed 32-bit integer)")
    return credit


def _niceness(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
        raise ConfigError(key, value, "must be a niceness from 0 (as the router) to 19 (lowest priority)")
    return value


def _percent(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ConfigError(key, value, "must be a percentage from 0 to 100")
    return value


def parse_boolean(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):  # qpid.* declare arguments use 1 for true
        return bool(value)
    raise ConfigError(key, value, "must be true or false")


def parse_string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "must be a non-empty string")
    return value


def _host_port(value: Any, key: str) -> str:
    if not isinstance(value, str) or not re.match(r"^[^\s:]*:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$", value):
        raise ConfigError(key, value, "must be HOST:PORT, e.g. 127.0.0.1:5673")
    port = int(value.rsplit(":", 1)[1])
    if port > 65535:
        raise ConfigError(key, value, "port must be at most 65535")
    return value


def _broker_url(value: Any, key: str) -> str:
    """One broker URL or several (a comma-separated string or a TOML array), tried in order:
    kept as one normalised comma-joined string, which is what the rest of the router reads."""
    from qpid_flow.brokers import parse_broker_list  # not at the top: brokers imports this module

    addresses = parse_broker_list(value, key)
    return ",".join(address.url for address in addresses)


def _listen_list(value: Any, key: str) -> str:
    """One listener or several (a comma-separated string or a TOML array): ``HOST:PORT`` or
    ``amqp://HOST:PORT`` for plain AMQP, ``amqps://HOST:PORT`` for TLS. Kept as one
    comma-joined string, plain entries as ``HOST:PORT``."""
    entries = value.split(",") if isinstance(value, str) else value
    if not isinstance(entries, list) or not entries:
        raise ConfigError(key, value, "must be HOST:PORT, amqps://HOST:PORT, or a list of them")
    normalised = []
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, str):
            raise ConfigError(key, value, f"entry {number}: must be a string such as 127.0.0.1:5673")
        entry = entry.strip()
        scheme, sep, rest = entry.partition("://")
        if not sep:
            scheme, rest = "amqp", entry
        if scheme not in ("amqp", "amqps"):
            raise ConfigError(key, value, f"entry {number}: scheme must be amqp:// or amqps://")
        _host_port(rest, key if len(entries) == 1 else f"{key} (entry {number})")
        normalised.append(rest if scheme == "amqp" else f"amqps://{rest}")
    if len(set(normalised)) != len(normalised):
        raise ConfigError(key, value, "lists the same address twice")
    return ",".join(normalised)


def _existing_file(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "must be the path of a file")
    if not Path(value).is_file():
        raise ConfigError(key, value, "no such file")
    return value


def _secret(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "***", "must be a non-empty string")  # never echo a secret
    return value


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be an admin token (sent as ``Authorization: Bearer``), or None.
    A trailing newline (a secret made from a file) or a non-ASCII character was taken at
    start, and then no client could ever present it: HTTP clients refuse to send either,
    and the endpoint strips what surrounds the token it is sent."""
    if not token:
        return "must be a non-empty string"
    if token != token.strip():
        return "must not start or end with whitespace (a trailing newline from a file?)"
    if not all(" " <= character <= "~" for character in token):
        return "must be printable ASCII (no line breaks or other control characters)"
    return None


def _admin_token(value: Any, key: str) -> str:
    problem = token_problem(value) if isinstance(value, str) else "must be a non-empty string"
    if problem is not None:
        raise ConfigError(key, "***", problem)  # never echo a secret
    return str(value)


def _one_of(*choices: str) -> Callable[[Any, str], str]:
    def check(value: Any, key: str) -> str:
        if value not in choices:
            raise ConfigError(key, value, "must be one of " + ", ".join(choices))
        return str(value)

    return check


def _events_format(value: Any, key: str) -> str:
    chosen = _one_of("jsonl", "parquet")(value, key)
    # The columnar log's writer process imports pyarrow; the router only checks it is there.
    if chosen == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError(key, value, "needs pyarrow: pip install 'qpid-flow[analytics]'")
    return chosen


def _string_list(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(key, value, "must be a list of strings")
    return list(value)


def _plugins_to_disable(value: Any, key: str) -> list[str]:
    """Names of plugins not to load, each the name of a plugin on this machine."""
    from qpid_flow.plugin import manager  # not at the top: the manager reads this module

    names = _string_list(value, key)
    manager.check_names_to_disable(names, key, value)
    return names


# --- Access control -----------------------------------------------------------------------


@dataclass(frozen=True)
class AclEntry:
    """One ``[[acl]]`` entry: what ``user`` (a name, or ``"*"`` for anyone) may or may not
    do. The first entry whose user and pattern match an attach decides it."""

    user: str
    send: tuple[str, ...] = ()
    receive: tuple[str, ...] = ()
    allow: bool = True


def _acl(value: Any, key: str) -> tuple[AclEntry, ...]:
    if not isinstance(value, list):
        raise ConfigError(key, value, "must be [[acl]] tables")
    entries = []
    for number, table in enumerate(value, 1):
        where = f"{key}[{number}]"
        if not isinstance(table, dict):
            raise ConfigError(where, table, "must be a table with user, send, receive")
        unknown = set(table) - {"user", "send", "receive", "action"}
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(f"{where}.{name}", table[name], "unknown key; known: user, send, receive, action")
        if "user" not in table:
            raise ConfigError(f"{where}.user", None, 'is required: a user name or "*"')
        user = parse_string(table["user"], f"{where}.user")
        patterns: dict[str, tuple[str, ...]] = {}
        for direction in ("send", "receive"):
            listed = _string_list(table.get(direction, []), f"{where}.{direction}")
            for pattern in listed:
                check_pattern(pattern, f"{where}.{direction}")
            patterns[direction] = tuple(listed)
        action = _one_of("allow", "deny")(table.get("action", "allow"), f"{where}.action")
        entries.append(AclEntry(user, patterns["send"], patterns["receive"], action == "allow"))
    return tuple(entries)


# --- Destination policies ----------------------------------------------------------------


@dataclass(frozen=True)
class DestinationPolicy:
    """The settings of one ``[destinations."..."]`` table (None: not set there).

    The capacity keys are the core's; every other key is declared by a plugin
    (``qpid_flow_destination_settings``) and read with :meth:`setting`.
    """

    pattern: str = ">"
    max_count: int | None = None
    max_size: int | None = None
    limit_policy: str | None = None  # at capacity: "flow" (default: producers wait), "reject", "ring"
    settings: Mapping[str, Any] = field(default_factory=dict)  # plugins' keys, as parsed

    @classmethod
    def of(cls, pattern: str = ">", **values: Any) -> DestinationPolicy:
        """A policy from already-parsed values by key, the core's and plugins' alike (tests,
        plugins building one): ``DestinationPolicy.of(max_count=1000, shared_groups=True)``."""
        core = {name: values.pop(name) for name in _CORE_FIELDS if name in values}
        return cls(pattern=pattern, **core, settings=values)

    @property
    def when_full(self) -> str:
        """What happens at capacity: ``limit_policy``, "flow" (producers wait) by default."""
        return self.limit_policy or "flow"

    def setting(self, key: str, default: Any = None) -> Any:
        """A plugin-declared setting's value in force (``default`` while no table sets it)."""
        value = self.settings.get(key)
        return default if value is None else value

    def values(self) -> dict[str, Any]:
        """Every setting this table sets, core and plugins', by its key."""
        core = {name: getattr(self, name) for name in _CORE_FIELDS if getattr(self, name) is not None}
        return {**core, **{k: v for k, v in self.settings.items() if v is not None}}

    def merged_over(self, base: DestinationPolicy) -> DestinationPolicy:
        """This policy's explicit values, falling back to ``base`` for the rest."""
        core = {name: getattr(self, name) for name in _CORE_FIELDS if getattr(self, name) is not None}
        own = {key: value for key, value in self.settings.items() if value is not None}
        return replace(base, pattern=self.pattern, **core, settings={**base.settings, **own})


_CORE_FIELDS = ("max_count", "max_size", "limit_policy")

# The core's keys: key in the file -> (field name, parser). ``qpid.*`` are qpidd's
# queue-declare aliases. Plugins add theirs (qpid_flow.plugin.declarations.DestinationSetting).
_DESTINATION_KEYS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "max_count": ("max_count", parse_non_negative_int),
    "max_size": ("max_size", parse_size),
    "limit_policy": ("limit_policy", _one_of("flow", "reject", "ring")),
    "qpid.max_count": ("max_count", parse_non_negative_int),
    "qpid.max_size": ("max_size", parse_size),
}


def declared_settings(declarations: Iterable[DestinationSetting]) -> dict[str, DestinationSetting]:
    """Every plugin-declared key and alias -> its declaration. A key declared twice, or
    one of the core's, is a plugin bug: refused at start (ConfigError)."""
    found: dict[str, DestinationSetting] = {}
    for setting in declarations:
        for name in (setting.key, *setting.aliases):
            if name in _DESTINATION_KEYS or name in found:
                raise ConfigError("destination setting", name, "declared twice (by the core or another plugin)")
            found[name] = setting
    return found


def parse_destination(
    pattern: str, table: Any, declared: Mapping[str, DestinationSetting] | None = None
) -> DestinationPolicy:
    """One ``[destinations."PATTERN"]`` table: the core's keys and those ``declared`` by
    plugins (:func:`declared_settings`); any other key is refused."""
    where = f'destinations."{pattern}"'
    declared = declared or {}
    if not isinstance(table, dict):
        raise ConfigError(where, table, "must be a table of settings")
    check_pattern(pattern, where)
    values: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # setting -> the key that gave it (a name or an alias)
    for key, raw in _qpid_aliases_flattened(table, where).items():
        if key in _DESTINATION_KEYS:
            name, parse = _DESTINATION_KEYS[key]
            _once(given_as, name, key, where, raw)
            values[name] = parse(raw, f"{where}.{key}")
        elif key in declared:
            setting = declared[key]
            _once(given_as, setting.key, key, where, raw)
            settings[setting.key] = setting.parse(raw, f"{where}.{key}")
        else:
            known = [*_DESTINATION_KEYS, *declared]
            raise ConfigError(f"{where}.{key}", raw, "unknown key; known: " + ", ".join(known))
    return DestinationPolicy(pattern=pattern, **values, settings=settings)


def _qpid_aliases_flattened(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``table`` with a ``qpid`` sub-table read as the ``qpid.``-prefixed keys it holds.

    In TOML, ``qpid.max_count = 1000`` unquoted is a dotted key: a ``qpid`` table holding
    ``max_count``, not the key ``"qpid.max_count"``. Both spellings of qpidd's aliases are
    accepted, as the docs write them unquoted; a key inside ``qpid`` that is no alias is
    then refused as ``qpid.KEY``, by the caller like any unknown key."""
    nested = table.get("qpid")
    if not isinstance(nested, dict):
        return dict(table)  # no qpid table (a value under "qpid" is refused as an unknown key)
    flat: dict[str, Any] = {}
    for key, raw in table.items():
        if key != "qpid":
            flat[key] = raw
            continue
        for inner, value in raw.items():
            dotted = f"qpid.{inner}"
            if dotted in table:
                # "qpid.max_count" = 1 and qpid.max_count = 2 are two TOML keys, one setting.
                raise ConfigError(f"{where}.{dotted}", value, f'given twice ("{dotted}" and in the qpid table)')
            flat[dotted] = value
    return flat


def _once(given_as: dict[str, str], setting: str, key: str, where: str, raw: Any) -> None:
    """Refuse a setting given twice in one table under two names (``max_count`` and its
    qpidd alias ``qpid.max_count``): which one wins would be the file's order."""
    earlier = given_as.setdefault(setting, key)
    if earlier != key:
        raise ConfigError(f"{where}.{key}", raw, f"sets {setting} as {earlier} already does: give one of them")


# Pattern segments are separated by "." (ActiveMQ's separator) or "/" (the separator of
# broker address forms such as RabbitMQ's ``/exchange/amq.topic/a.b``), so that
# ``/topic/>`` can name every topic address. A separator must match the same separator.
_SEPARATORS = re.compile(r"([./])")


def _segments(name: str) -> list[str]:
    """``name`` split at its separators, the separators kept (at the odd indices)."""
    return _SEPARATORS.split(name)


def check_pattern(pattern: str, where: str) -> None:
    """A ConfigError naming ``where`` unless ``pattern`` is a name or an ActiveMQ pattern."""
    if not pattern or any(s == "" for s in pattern.split(".")):
        raise ConfigError(where, pattern, "a destination name or pattern needs non-empty '.'-separated segments")
    if ">" in _segments(pattern)[:-1]:
        raise ConfigError(where, pattern, "'>' may only be the last segment")


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    parts = []
    for segment in _segments(pattern):
        # A segment may be empty ("orders." is "orders" and ""), as ActiveMQ splits names.
        if segment == "*":
            parts.append(r"[^./]*")
        elif segment == ">":
            parts.append(r".*")
        else:
            parts.append(re.escape(segment))
    return re.compile("".join(parts), re.DOTALL)


def pattern_matches(pattern: str, address: str) -> bool:
    """ActiveMQ wildcards: ``*`` matches one segment, a final ``>`` the rest (one or more).
    Segments are separated by ``.`` or ``/``."""
    return _compiled(pattern).fullmatch(address) is not None


def matches_any(pattern: str, forms: Iterable[str]) -> bool:
    """Does ``pattern`` name (exactly or as a pattern) any of ``forms``: the addresses one
    destination may be written as (see :meth:`qpid_flow.core.dialect.Dialect.address_forms`)."""
    return any(pattern == form or pattern_matches(pattern, form) for form in forms)


def is_pattern(name: str) -> bool:
    """True for a wildcard pattern (``orders.*``, ``PRICES.>``, ``/topic/>``), False for a plain name."""
    return any(segment in ("*", ">") for segment in _segments(name))


def _specificity(pattern: str) -> tuple[int, int, int, tuple[bool, ...]]:
    """How specific a pattern is, the larger the more: more literal segments, then no
    ``>``, then more segments, then the leftmost literal (``a.*`` over ``*.b`` for
    ``a.b``). The last key settles every tie between two patterns matching one address,
    so the file's order (or the order policies were set at runtime) never decides."""
    segments = _segments(pattern)[::2]
    is_literal = tuple(s not in ("*", ">") for s in segments)
    return (sum(is_literal), 0 if ">" in segments else 1, len(segments), is_literal)


# --- The router configuration --------------------------------------------------------------


STANDALONE_PRODUCER_WINDOW = 100
BROKER_PRODUCER_WINDOW = 1000


@dataclass(frozen=True)
class RouterConfig:
    """Router-wide settings, destination policies and plugin settings."""

    listen: str = "127.0.0.1:5673"  # comma-joined listeners; amqps:// ones speak TLS
    broker: str | None = None  # comma-separated broker URLs, tried in order
    broker_dialect: str = "auto"  # how the broker names queues (qpid_flow.core.dialect): auto, rabbitmq, plain
    admin: str | None = None
    # Credit a producer link keeps (messages in flight per producer); 0: by mode, see
    # __post_init__ and docs/configuration.md.
    producer_window: int = 0
    consumer_lookahead: int = 200
    default_max_count: int = 0
    default_max_size: int = 100 * 1024 * 1024
    max_message_size: int = 100 * 1024 * 1024
    auto_create: bool = True
    reconnect_max_delay: float = 5.0
    shutdown_timeout: float = 5.0
    default_message_group: str = "qpid.no-group"
    events: str | None = None
    events_format: str = "jsonl"
    events_max_bytes: int = 100 * 1024 * 1024
    events_backups: int = 5
    events_writer_nice: int = 10
    default_flow_stop_threshold: int = 80
    default_flow_resume_threshold: int = 70
    memory_limit: int = 0
    log_level: str = "info"
    log_format: str = "auto"
    disable_plugins: list[str] = field(default_factory=list)
    # Security (docs/security.md): TLS on the listener and to the broker, who may connect,
    # what each user may do, and how much one client may take.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_require_client_cert: bool = False
    broker_tls_ca: str | None = None
    broker_tls_cert: str | None = None
    broker_tls_key: str | None = None
    broker_tls_verify_hostname: bool = True
    broker_user: str | None = None
    broker_password: str | None = None
    # Who a client that signs in with ANONYMOUS (or skips SASL) is at the broker, for the
    # ACLs and per-user limits: RabbitMQ signs it in as its amqp1_0.default_user.
    broker_anonymous_user: str = "guest"
    users_file: str | None = None
    allow_anonymous: bool | None = None  # None: only while no users_file is configured
    acl: tuple[AclEntry, ...] = ()
    max_connections: int = 0  # 0: no limit
    max_connections_per_user: int = 0
    max_sessions_per_connection: int = 0
    max_links_per_connection: int = 0
    idle_timeout: float = 60.0
    destination_idle_timeout: float = 60.0  # forget auto-created destinations unused this long; 0: never
    sasl_timeout: float = 10.0
    admin_token: str | None = None
    metrics_max_destinations: int = 500  # /metrics: destinations past this are summed as "_other"
    destinations: dict[str, DestinationPolicy] = field(default_factory=dict)
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The keys plugins declared for destination tables (qpid_flow_destination_settings),
    # by key and alias: how tables given at runtime (the admin API) are read.
    destination_settings: Mapping[str, DestinationSetting] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.producer_window:
            # In front of a broker every credit round trip crosses one more hop (client,
            # qpid-flow, broker and back): the same rate needs more in flight. Measured
            # with C clients and RabbitMQ: 100 -> 1,000 is +15 % messages a second, and
            # more than 1,000 adds nothing (BENCHMARKS.md).
            window = BROKER_PRODUCER_WINDOW if self.broker else STANDALONE_PRODUCER_WINDOW
            object.__setattr__(self, "producer_window", window)

    @property
    def standalone(self) -> bool:
        return self.broker is None

    @property
    def listeners(self) -> list[tuple[str, str, int]]:
        """Each listener as (scheme, host, port); scheme is ``amqp`` or ``amqps``."""
        found = []
        for entry in self.listen.split(","):
            scheme, sep, rest = entry.partition("://")
            if not sep:
                scheme, rest = "amqp", entry
            host, port = rest.rsplit(":", 1)
            found.append((scheme, host.strip("[]"), int(port)))
        return found

    @property
    def anonymous_allowed(self) -> bool:
        """ANONYMOUS is offered: by default only while no users file is configured."""
        return self.allow_anonymous if self.allow_anonymous is not None else self.users_file is None

    @property
    def broker_addresses(self) -> list[BrokerAddress]:
        """The brokers to connect to, in failover order; none when standalone."""
        from qpid_flow.brokers import parse_broker_list  # not at the top: brokers imports this module

        if self.broker is None:
            return []
        addresses = parse_broker_list(self.broker)
        if self.broker_user is None:
            return addresses
        # broker_user / broker_password (file or environment) stand in for credentials an
        # entry does not carry itself: they keep the password off the command line.
        return [
            address
            if address.user is not None
            else replace(address, user=self.broker_user, password=self.broker_password)
            for address in addresses
        ]

    def plugin_settings(self, name: str) -> dict[str, Any]:
        """The ``[plugins.NAME]`` table, empty when absent."""
        return self.plugins.get(name, {})

    def base_policy(self) -> DestinationPolicy:
        """What a destination gets from the router-wide defaults alone."""
        return DestinationPolicy(pattern="", max_count=self.default_max_count, max_size=self.default_max_size)

    def parse_destination(self, pattern: str, table: Any) -> DestinationPolicy:
        """A destination table given at runtime, read with the keys plugins declared."""
        return parse_destination(pattern, table, self.destination_settings)

    def policy_for(self, address: str) -> DestinationPolicy:
        """The policy in force for ``address``: exact name first, then the most specific pattern."""
        return resolve_policy(self.destinations, address, self.base_policy())


def resolve_policy(
    policies: Mapping[str, DestinationPolicy],
    address: str,
    base: DestinationPolicy,
    forms: Iterable[str] = (),
    core: Callable[[str], str] = str,
) -> DestinationPolicy:
    """The policy of ``policies`` that applies to ``address``, over ``base``. A pattern
    may also match one of ``forms``, the other addresses the destination may be written
    as (RabbitMQ's ``/queue/X`` for queue ``X``): ``/queue/>`` names every queue. Among
    patterns, the most specific ``core`` (the pattern without its address form's prefix:
    ``/queue/orders.*`` ranks as ``orders.*``) wins; equal ones by the pattern itself."""
    exact = policies.get(address)
    if exact is not None:
        return exact.merged_over(base)
    names = (address, *forms)
    matching = [p for p in policies if is_pattern(p) and matches_any(p, names)]
    if not matching:
        return base
    return policies[max(matching, key=lambda p: (_specificity(core(p)), p))].merged_over(base)


_ROUTER_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "listen": _listen_list,
    "broker": _broker_url,
    "broker_dialect": _one_of("auto", "rabbitmq", "plain"),
    "admin": _host_port,
    "producer_window": _link_credit,
    "consumer_lookahead": _link_credit,
    "default_max_count": parse_non_negative_int,
    "default_max_size": parse_size,
    "max_message_size": parse_size,
    "auto_create": parse_boolean,
    "reconnect_max_delay": _positive_duration,
    "shutdown_timeout": parse_duration,
    "default_message_group": parse_string,
    "events": parse_string,
    "events_format": _events_format,
    "events_max_bytes": parse_size,
    "events_backups": parse_non_negative_int,
    "events_writer_nice": _niceness,
    "default_flow_stop_threshold": _percent,
    "default_flow_resume_threshold": _percent,
    "memory_limit": parse_size,
    "log_level": _one_of("debug", "info", "warning", "error"),
    "log_format": _one_of("auto", "json", "console"),
    "disable_plugins": _plugins_to_disable,
    "tls_cert": _existing_file,
    "tls_key": _existing_file,
    "tls_ca": _existing_file,
    "tls_require_client_cert": parse_boolean,
    "broker_tls_ca": _existing_file,
    "broker_tls_cert": _existing_file,
    "broker_tls_key": _existing_file,
    "broker_tls_verify_hostname": parse_boolean,
    "broker_user": parse_string,
    "broker_password": _secret,
    "broker_anonymous_user": parse_string,
    "users_file": _existing_file,
    "allow_anonymous": parse_boolean,
    "acl": _acl,
    "max_connections": parse_non_negative_int,
    "max_connections_per_user": parse_non_negative_int,
    "max_sessions_per_connection": parse_non_negative_int,
    "max_links_per_connection": parse_non_negative_int,
    "idle_timeout": parse_duration,
    "destination_idle_timeout": parse_duration,
    "sasl_timeout": _positive_duration,
    "admin_token": _admin_token,
    "metrics_max_destinations": _positive_int,
}

# Settings that may come from the environment, so that no secret has to be on a command
# line (where ``ps`` shows it to every user of the machine). The command line wins over
# the environment, the environment over the file.
ENVIRONMENT_KEYS = {
    "QPID_FLOW_ADMIN_TOKEN": "admin_token",
    "QPID_FLOW_BROKER": "broker",
    "QPID_FLOW_BROKER_USER": "broker_user",
    "QPID_FLOW_BROKER_PASSWORD": "broker_password",
}


def build_config(
    data: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    plugins: pluggy.PluginManager | None = None,
) -> RouterConfig:
    """Validate a parsed TOML document (plus command-line overrides) into a RouterConfig.

    ``plugins`` declares the destination keys beyond the core's and checks each
    destination table (``qpid_flow_destination_settings``,
    ``qpid_flow_destination_policy_check``); None: the plugins qpid-flow would load with
    this configuration."""
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    # The file's values are checked even where the command line or the environment
    # overrides them: listen = "nohostport" behind --listen started, and stopped the
    # first start without the flag.
    values = {**_read_keys(data), **_read_keys(given)}
    tables: dict[str, Any] = values.pop("destinations", {})
    plugin_tables: dict[str, dict[str, Any]] = values.pop("plugins", {})
    from qpid_flow.plugin import manager  # not at the top: the manager reads this module

    checked_tables = plugins is None
    if plugins is None:
        # The file's and the command line's names are checked as they are read (disable_plugins).
        from_environment = manager.disabled_in_environment()
        manager.check_names_to_disable(from_environment, manager.DISABLE_ENVIRONMENT, ",".join(from_environment))
        plugins = manager.build_plugin_manager(values.get("disable_plugins", ()))
    declared = declared_settings(s for group in plugins.hook.qpid_flow_destination_settings() for s in group)
    if checked_tables:
        # The plugins qpid-flow loads (the server builds the same set from this configuration).
        # A manager given by the caller (qpid_flow.testing.make_hooks) names its plugins as it
        # likes ("myplugin-0"), not as the tables a plugin reads: not checked against them.
        loaded = manager.loaded_plugins(plugins)
        _check_plugin_tables(plugin_tables, loaded, manager.disabled_plugins(plugins))
        _check_tables_of_plugins_without_settings(plugin_tables, loaded, [*_DESTINATION_KEYS, *declared])
    destinations = {pattern: parse_destination(pattern, table, declared) for pattern, table in tables.items()}
    config = RouterConfig(destinations=destinations, plugins=plugin_tables, destination_settings=declared, **values)
    if config.default_flow_resume_threshold > config.default_flow_stop_threshold:
        raise ConfigError(
            "default_flow_resume_threshold",
            config.default_flow_resume_threshold,
            f"must not be above default_flow_stop_threshold ({config.default_flow_stop_threshold})",
        )
    check = manager.refusable(plugins.hook.qpid_flow_destination_policy_check)  # a plugin's bug is only logged
    for pattern in destinations:
        check(config=config, policy=config.policy_for(pattern), where=f'destinations."{pattern}"')
    _check_security(config)
    return config


def _read_keys(source: Mapping[str, Any]) -> dict[str, Any]:
    """Each top-level key of ``source`` (the file, or the overrides) checked and parsed;
    ``destinations`` and ``plugins`` checked to be tables, their contents read later."""
    values: dict[str, Any] = {}
    for key, raw in source.items():
        if key == "destinations":
            if not isinstance(raw, dict):
                raise ConfigError(key, raw, 'must be tables: [destinations."NAME"]')
            values[key] = raw
        elif key == "plugins":
            if not isinstance(raw, dict) or not all(isinstance(t, dict) for t in raw.values()):
                raise ConfigError(key, _Elided(raw), "must be tables: [plugins.NAME]")
            values[key] = {name: dict(table) for name, table in raw.items()}
        elif key in _ROUTER_KEYS:
            values[key] = _ROUTER_KEYS[key](raw, key)
        else:
            raise ConfigError(key, raw, "unknown key; known: " + ", ".join([*_ROUTER_KEYS, "destinations", "plugins"]))
    return values


class _Elided:
    """A plugin's table as a refusal shows it: its keys, not its values. What they hold is
    the plugin's business and may be a password (a URL with credentials, a token)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __repr__(self) -> str:
        if not isinstance(self.table, dict):
            return type(self.table).__name__
        return "{" + ", ".join(f"{key} = ..." for key in self.table) + "}"


class _Unshown:
    """One value of a plugin's table, as a refusal shows it: not at all (see _Elided)."""

    def __repr__(self) -> str:
        return "..."


_UNSHOWN = _Unshown()


def _check_plugin_tables(tables: Mapping[str, Any], loaded: list[str], disabled: list[str]) -> None:
    """Refuse a ``[plugins.NAME]`` table that no loaded plugin has (checked once the plugins
    are loaded, before any is configured: a plugin may leave as it is configured). Its
    settings would never be read: ``[plugins.rabbitmq-depth]`` (the package's name, not the
    plugin's ``rabbitmq_depth``) started silently with none of them applied. A disabled
    plugin's table is let be: switching a plugin off (``--disable-plugin``) must not mean
    editing the file that configures it for when it is on."""
    for name, table in tables.items():
        if name not in loaded and name not in disabled:
            known = ", ".join(loaded) or "none"
            raise ConfigError(f"plugins.{name}", _Elided(table), f"names no loaded plugin; loaded: {known}")


def _check_tables_of_plugins_without_settings(
    tables: Mapping[str, Any], loaded: list[str], destination_keys: list[str]
) -> None:
    """Refuse any key in the table of a loaded plugin that reads none (qpid-flow's own,
    :data:`~qpid_flow.plugin.manager.PLUGINS_WITHOUT_SETTINGS`), as a plugin with settings
    refuses a key it does not know (``[plugins.rabbitmq_depth]``). Router keys put there
    (``[plugins.flow] default_flow_stop_threshold = 50``) were ignored: the router ran with
    80. The value is not shown, as for any plugin table (:class:`_Elided`): a misplaced
    ``broker_password`` is still a password."""
    from qpid_flow.plugin.manager import PLUGINS_WITHOUT_SETTINGS

    for name, table in tables.items():
        if name not in loaded or name not in PLUGINS_WITHOUT_SETTINGS:
            continue
        for key in table:
            rule = f"unknown key: the {name} plugin has no settings{_where_it_belongs(key, destination_keys)}"
            raise ConfigError(f"plugins.{name}.{key}", _UNSHOWN, rule)


def _where_it_belongs(key: str, destination_keys: list[str]) -> str:
    """Where ``key`` goes when it is the router's or a destination's ("" when neither)."""
    if key in _ROUTER_KEYS:
        return f"; {key} is a router key: put it at the top of the file, before any [table]"
    if key in destination_keys:
        return f'; {key} is a destination key: put it in a [destinations."NAME"] table'
    return ""


def _check_security(config: RouterConfig) -> None:
    """Rules between security keys, each refusal naming the key that has to change."""
    tls_listeners = [entry for entry in config.listen.split(",") if entry.startswith("amqps://")]
    if tls_listeners and (config.tls_cert is None or config.tls_key is None):
        missing = "tls_cert" if config.tls_cert is None else "tls_key"
        raise ConfigError(missing, None, f"is required by the TLS listener {tls_listeners[0]}")
    if (config.tls_cert is None) != (config.tls_key is None):
        missing = "tls_cert" if config.tls_cert is None else "tls_key"
        raise ConfigError(missing, None, "tls_cert and tls_key go together")
    if config.tls_require_client_cert and config.tls_ca is None:
        raise ConfigError("tls_require_client_cert", True, "needs tls_ca, the CA that signs client certificates")
    if (config.broker_tls_cert is None) != (config.broker_tls_key is None):
        missing = "broker_tls_cert" if config.broker_tls_cert is None else "broker_tls_key"
        raise ConfigError(missing, None, "broker_tls_cert and broker_tls_key go together")
    if config.broker_password is not None and config.broker_user is None:
        # As a broker URL with a password and no user is refused: it was dropped silently,
        # and qpid-flow signed in at the broker anonymously (or not at all).
        raise ConfigError(
            "broker_password", "***", "has no broker_user: set broker_user (or QPID_FLOW_BROKER_USER) too"
        )
    if config.broker is not None and config.users_file is not None:
        raise ConfigError(
            "users_file",
            config.users_file,
            "applies standalone only; in front of a broker clients sign in at the broker",
        )
    stale = [entry.user for entry in config.acl if entry.user == "anonymous" != config.broker_anonymous_user]
    if config.broker is not None and stale:
        # Named so while ACLs took ANONYMOUS clients for "anonymous" in front of a broker
        # too: such a rule would now match no one, and let those clients through silently.
        raise ConfigError(
            "acl",
            "anonymous",
            f"in front of a broker an ANONYMOUS or no-SASL client is the user the broker signs it in as "
            f"(broker_anonymous_user = {config.broker_anonymous_user!r}): name that user",
        )
    if config.broker is None and not config.anonymous_allowed and config.users_file is None and config.tls_ca is None:
        raise ConfigError(
            "allow_anonymous", False, "leaves no way to sign in: set users_file, or tls_ca for client certificates"
        )
    if config.admin is not None and config.admin_token is None and not is_loopback(config.admin.rsplit(":", 1)[0]):
        raise ConfigError(
            "admin", config.admin, "an admin endpoint beyond loopback needs admin_token (or QPID_FLOW_ADMIN_TOKEN)"
        )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (brackets around IPv6 allowed)."""
    import ipaddress  # only here: reading a configuration needs it once

    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_config(
    path: str | Path | None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> RouterConfig:
    """Read ``path`` (TOML; None for none), then the environment (:data:`ENVIRONMENT_KEYS`),
    then command-line ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError as exc:
            raise ConfigError("--config", str(path), "file not found") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", str(path), f"not valid TOML: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError("--config", str(path), "not valid TOML: TOML files are UTF-8") from exc
        except OSError as exc:  # a directory, no permission, ...
            raise ConfigError("--config", str(path), f"cannot be read: {exc.strerror or exc}") from exc
    merged: dict[str, Any] = {}
    for variable, key in ENVIRONMENT_KEYS.items():
        if environ and environ.get(variable):
            merged[key] = environ[variable]
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value
    return build_config(data, merged)
