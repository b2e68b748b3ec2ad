"""The ``[plugins.rabbitmq_depth]`` table: how often to read depths, and from where."""

from __future__ import annotations

import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pika
from qpid_flow.brokers import mask_passwords
from qpid_flow.config import ConfigError, parse_duration

__all__ = ["PLUGIN_NAME", "Settings", "check_settings", "default_amqp091_url", "parse_settings"]

PLUGIN_NAME = "rabbitmq_depth"
DEFAULT_INTERVAL = "2s"
DEFAULT_VHOST = "/"
# Below this the worker would spend its time declaring (~20 ms per queue) for nothing.
MIN_INTERVAL = 0.1
# Fail fast on a dead broker: the worker retries on its own schedule anyway.
SOCKET_TIMEOUT = 5.0
STACK_TIMEOUT = 10.0

_URL_RE = re.compile(r"^amqps?://[^\s/?#]+(/[^\s]*)?$")


def _key(name: str) -> str:
    return f"plugins.{PLUGIN_NAME}.{name}"


@dataclass(frozen=True)
class Settings:
    interval: float
    amqp091_url: str
    vhost: str
    # The TLS context of an amqps:// URL: the plugin passes qpid-flow's own broker context
    # (broker_tls_ca, broker_tls_cert/key, broker_tls_verify_hostname), so that it trusts
    # exactly what qpid-flow's broker connections trust. None: pika's default (the system's CAs).
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    @property
    def uses_tls(self) -> bool:
        return urllib.parse.urlsplit(self.amqp091_url).scheme == "amqps"

    def connection_parameters(self) -> pika.URLParameters:
        """pika's parameters: the URL (its query may tune pika), our vhost, timeouts and TLS."""
        params = pika.URLParameters(self.amqp091_url)
        params.virtual_host = self.vhost
        given = urllib.parse.parse_qs(urllib.parse.urlsplit(self.amqp091_url).query)
        if self.uses_tls and self.ssl_context is not None and "ssl_options" not in given:
            # The URL's host name is the one the certificate must carry (and the SNI sent).
            params.ssl_options = pika.SSLOptions(self.ssl_context, server_hostname=params.host)
        if "connection_attempts" not in given:
            params.connection_attempts = 1  # the worker's back-off is the retry
        if "socket_timeout" not in given:
            params.socket_timeout = SOCKET_TIMEOUT
        if "stack_timeout" not in given:
            params.stack_timeout = STACK_TIMEOUT
        return params

    @property
    def display_url(self) -> str:
        """The URL without its password, for logs."""
        parts = urllib.parse.urlsplit(self.amqp091_url)
        user, _, host = parts.netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}@{host}" if user else host
        return urllib.parse.urlunsplit((parts.scheme, netloc, "", "", ""))


def default_amqp091_url(broker: str) -> str:
    """The broker's AMQP 0-9-1 URL: same scheme, host, user and password.

    RabbitMQ serves AMQP 0-9-1 and 1.0 on the same listener, so the port is the broker
    URL's own, or the protocol default (5672, 5671 with TLS) when it has none. The path
    and query of the AMQP 1.0 URL mean nothing to pika and are dropped.
    """
    parts = urllib.parse.urlsplit(broker)
    shown = mask_passwords(broker)  # a refusal is printed: never with the password
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(_key("amqp091_url"), shown, "cannot derive it from broker; set it") from exc
    if parts.hostname is None:
        raise ConfigError(_key("amqp091_url"), shown, "cannot derive it from broker (no host); set it")
    netloc = parts.netloc
    if port is None:
        netloc += ":5671" if parts.scheme == "amqps" else ":5672"
    return f"{parts.scheme}://{netloc}"


def parse_settings(table: Mapping[str, Any], broker: str) -> Settings:
    """Validate the plugin's table; ``broker`` is the router's AMQP 1.0 broker URL."""
    interval, url, vhost = _validated(table)
    if url is None:
        url = default_amqp091_url(broker)
    return Settings(interval=interval, amqp091_url=url, vhost=vhost)


def check_settings(table: Mapping[str, Any]) -> None:
    """Validate the plugin's table standalone, where nothing reads it: a bad value stops
    qpid-flow at start in either mode, not on the day a broker is configured."""
    _validated(table)


def _validated(table: Mapping[str, Any]) -> tuple[float, str | None, str]:
    """(interval, amqp091_url or None when not given, vhost); ConfigError naming the key."""
    known = ("interval", "amqp091_url", "vhost")
    for key, value in table.items():
        if key not in known:
            raise ConfigError(_key(key), value, "unknown key; known: " + ", ".join(known))

    interval = parse_duration(table.get("interval", DEFAULT_INTERVAL), _key("interval"))
    if interval < MIN_INTERVAL:
        raise ConfigError(_key("interval"), table.get("interval"), "must be at least 100ms")

    vhost = table.get("vhost", DEFAULT_VHOST)
    if not isinstance(vhost, str) or not vhost:
        raise ConfigError(_key("vhost"), vhost, "must be a non-empty string")

    url = table.get("amqp091_url")
    if url is not None:
        _check_url(url)
    return interval, url, vhost


def _check_url(url: Any) -> None:
    key = _key("amqp091_url")
    # A refusal is printed at start: the URL is shown with its password masked, as the
    # router's broker URLs are (qpid_flow.brokers), whatever characters the password holds.
    shown = mask_passwords(url) if isinstance(url, str) else url
    if not isinstance(url, str) or not _URL_RE.match(url):
        raise ConfigError(key, shown, "must be a URL such as amqp://user:password@host:5672")
    if urllib.parse.urlsplit(url).path not in ("", "/"):
        # pika would read the path as the vhost; one place to say it is less surprising.
        raise ConfigError(key, shown, f"must not name a vhost; set {_key('vhost')} instead")
    try:
        pika.URLParameters(url)  # port, query options (heartbeat=..., ...)
    except ValueError as exc:
        raise ConfigError(key, shown, f"pika refuses it: {mask_passwords(str(exc))}") from exc
