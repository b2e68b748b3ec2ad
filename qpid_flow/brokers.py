"""The ``broker`` setting: one broker URL or several, tried in order (failover).

Every entry is checked when the configuration is read, not when it is first used: a typo in
the second URL would otherwise show only at the first failover, hours into a run, as a
traceback. Each refusal is one :class:`~qpid_flow.config.ConfigError` line naming the entry
and the rule it breaks, with passwords masked (the line goes to a terminal or a log).

The URL grammar is the one Proton's ``Container.connect`` reads (and RabbitMQ's URI spec):
``amqp[s]://[user[:password]@]host[:port][/vhost]``, credentials and vhost percent-encoded.
In a comma-separated string a raw comma always separates two URLs; a comma inside a password
is written ``%2C`` (in a TOML array too, so that the joined form splits back the same way).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import partial
from urllib.parse import quote, unquote

from qpid_flow.config import ConfigError

__all__ = ["BrokerAddress", "mask_passwords", "parse_broker_list"]

_DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
_EXAMPLE = "amqp://user:password@host:5672"
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST_RE = re.compile(r"[A-Za-z0-9._-]+")  # a DNS name or an IPv4 address; IPv6 goes in brackets
# Where a text of one or more URLs is cut into one URL each for masking passwords: at a comma
# that a scheme follows. Any other comma may be inside a password (a raw one, not %2C), and so
# may any other character: a password runs from the userinfo's ':' to the URL's last '@'.
_URL_START_RE = re.compile(r",(?=\s*[A-Za-z][A-Za-z0-9+.-]*://)")
_LEADING_SCHEME_RE = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")

# Everything but RFC 3986's unreserved characters: a user name or password may hold ":", "@",
# "/" or "," and must still come back unchanged through Proton's parser and our comma split.
_quote = partial(quote, safe="")


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """One broker of the list, decoded."""

    scheme: str  # "amqp" or "amqps"
    host: str  # lower case (host names are); an IPv6 address without brackets
    port: int
    user: str | None = None  # percent-decoded
    password: str | None = None  # percent-decoded
    vhost: str | None = None  # the URL path without its leading "/", percent-decoded

    @property
    def url(self) -> str:
        """The URL to hand to Proton's ``Container.connect``, credentials included.

        Proton reads scheme, credentials, host and port from it and ignores the path: a vhost
        has to be passed on its own (``virtual_host=``; RabbitMQ expects ``vhost:NAME``)."""
        return self._format(None if self.password is None else _quote(self.password))

    @property
    def redacted(self) -> str:
        """The URL with the password replaced by ``***``: for logs and statistics."""
        return self._format(None if self.password is None else "***")

    def _format(self, password: str | None) -> str:
        userinfo = ""
        if self.user is not None or password is not None:
            userinfo = _quote(self.user or "") + ("" if password is None else ":" + password) + "@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = "" if self.vhost is None else "/" + _quote(self.vhost)
        return f"{self.scheme}://{userinfo}{host}:{self.port}{path}"


def parse_broker_list(value: object, key: str = "broker") -> list[BrokerAddress]:
    """The brokers named by ``value``, in order: a comma-separated string or a list of URLs.

    Raises :class:`~qpid_flow.config.ConfigError` (under ``key``) for the first entry that is
    wrong: empty, not an ``amqp``/``amqps`` URL, a bad host or port, spaces inside, or the same
    broker (host, port and vhost) as an earlier entry."""
    shown = _masked(value)
    if isinstance(value, str):
        _refuse_comma_in_password(value, key, shown)
        entries = value.split(",")
    elif isinstance(value, list | tuple):
        entries = list(value)
        for number, entry in enumerate(entries, 1):
            if not isinstance(entry, str):
                raise ConfigError(key, shown, f"entry {number} {entry!r} must be a string")
            if "," in entry:
                raise ConfigError(
                    key,
                    shown,
                    f"entry {number} {_mask(entry)!r} must not contain a comma: one URL per list item"
                    " (write a comma in a password as %2C)",
                )
    else:
        raise ConfigError(key, shown, f"must be a URL such as {_EXAMPLE}, or a list of them")
    if not any(entry.strip() for entry in entries):
        raise ConfigError(key, shown, f"must name at least one broker URL, such as {_EXAMPLE}")

    addresses: list[BrokerAddress] = []
    first_seen: dict[tuple[str, int, str | None], int] = {}
    for number, raw in enumerate(entries, 1):
        entry = raw.strip()
        try:
            address = _parse_entry(entry)
        except _Refused as refused:
            raise ConfigError(key, shown, f"entry {number} {_mask(entry)!r} {refused.rule}") from None
        # amqp and amqps on one host and port cannot both be right: the scheme is not part of it.
        broker = (address.host, address.port, address.vhost)
        if broker in first_seen:
            raise ConfigError(
                key, shown, f"entry {number} {_mask(entry)!r} names the same broker as entry {first_seen[broker]}"
            )
        first_seen[broker] = number
        addresses.append(address)
    return addresses


class _Refused(Exception):
    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


def _parse_entry(entry: str) -> BrokerAddress:
    if not entry:
        raise _Refused("is empty")
    if any(c.isspace() for c in entry):
        raise _Refused("must not contain spaces (write a space in a password as %20)")
    match = _SCHEME_RE.match(entry)
    if match is None:
        raise _Refused(f"must be a URL such as {_EXAMPLE}")
    scheme = match.group(1).lower()
    if scheme not in _DEFAULT_PORTS:
        raise _Refused(f"has an unknown scheme {scheme!r}: a broker URL starts with amqp:// or amqps://")
    if "?" in entry or "#" in entry:
        # Proton would cut the URL there, silently: most likely a password needing encoding.
        raise _Refused("must not have a query (?) or fragment (#); write them in a password as %3F and %23")

    authority, slash, path = entry[match.end() :].partition("/")
    if "@" in path:
        # A '/' in the password cut the URL short: what follows the user would read as
        # host and port, and a refusal naming them would show part of the password.
        raise _Refused("has '@' after a '/': write a '/' in a user name or password as %2F")
    userinfo, at, hostport = authority.rpartition("@")
    host, port = _host_port(hostport, _DEFAULT_PORTS[scheme])
    user = password = None
    if at:
        user_text, colon, password_text = userinfo.partition(":")
        user = _decode(user_text) or None
        if colon:
            password = _decode(password_text) or None
        if password is not None and user is None:
            raise _Refused("has a password but no user name")
    vhost = None
    if slash and path:  # "amqp://host/" means no vhost, like "amqp://host"
        if "/" in path:
            raise _Refused("has a vhost with '/' in it: the path is one vhost, write '/' in its name as %2F")
        vhost = _decode(path)
    return BrokerAddress(scheme, host, port, user, password, vhost)


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        try:
            host = str(ipaddress.IPv6Address(host)) if bracket else ""
        except ValueError:
            host = ""
        if not host:
            raise _Refused("must have an IPv6 address between its brackets, as in amqp://[::1]:5672")
        if rest and not rest.startswith(":"):
            raise _Refused(f"must be a URL such as {_EXAMPLE}")
        port_text = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise _Refused("must put an IPv6 address in brackets, as in amqp://[::1]:5672")
        host, colon, port_text_ = text.partition(":")
        port_text = port_text_ if colon else None
        if not host:
            raise _Refused(f"must name a host, as in {_EXAMPLE}")
        if not _HOST_RE.fullmatch(host):
            raise _Refused(f"has {host!r} where a host name or address belongs")
        host = host.lower()
    if port_text is None:
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _Refused(f"has port {port_text!r}: a port must be a number from 1 to 65535")
    return host, int(port_text)


def _decode(text: str) -> str:
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise _Refused("has percent-encoding that is not UTF-8") from None


def mask_passwords(text: str) -> str:
    """``text`` (one URL or several, comma-separated, well-formed or not) with each URL's
    password replaced by ``***``: everything from the ':' after the user name to the URL's
    last '@'. A raw comma, space, '/', '#' or '@' in a password is masked with the rest of
    it (a refusal of such a URL is the very line that would show it); masking too much is
    harmless. For configuration errors and logs."""
    return ",".join(_mask_one(url) for url in _URL_START_RE.split(text))


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``url`` (one URL, maybe malformed) starts and ends, or None."""
    scheme = _LEADING_SCHEME_RE.match(url)
    start = scheme.end() if scheme else 0  # no scheme ("user:pw@host"): the user starts the text
    at = url.rfind("@")
    colon = url.find(":", start, at) if at > start else -1
    return None if colon < 0 else (colon + 1, at)


def _mask_one(url: str) -> str:
    span = _password_span(url)
    return url if span is None else url[: span[0]] + "***" + url[span[1] :]


def _refuse_comma_in_password(value: str, key: str, shown: object) -> None:
    """Refuse a comma-separated string whose comma sits inside a password: split there, the
    first half would be refused for a "port" that is the start of the password, or, when
    that part is digits, read as a valid URL while the rest is refused in clear."""
    number = 1  # of the entry, as the split on every comma counts them
    for url in _URL_START_RE.split(value):
        span = _password_span(url)
        if span is not None and "," in url[span[0] : span[1]]:
            raise ConfigError(
                key,
                shown,
                f"entry {number} {_mask_one(url.strip())!r} has a comma in its password, and a comma separates"
                " two URLs: write a comma in a password as %2C",
            )
        number += url.count(",") + 1


def _mask(text: str) -> str:
    return mask_passwords(text)


def _masked(value: object) -> object:
    """``value`` as a refusal may show it: every password that can be recognised masked."""
    if isinstance(value, str):
        return _mask(value)
    if isinstance(value, list | tuple):
        return [_mask(v) if isinstance(v, str) else v for v in value]
    return value
