"""TLS, sans-IO: the standard library's ``ssl.SSLObject`` over memory buffers.

qpid-flow runs SASL itself, on the bytes between the client and Proton (:mod:`qpid_flow.amqp.gate`),
and AMQP puts SASL inside TLS: so TLS has to end before those bytes, in qpid-flow too, not in
Proton's transport. :class:`TlsChannel` is one end of one TLS connection: network bytes go
in with :meth:`TlsChannel.receive` and come out with :meth:`TlsChannel.data_to_send`; clear
bytes come out with :meth:`TlsChannel.read` and go in with :meth:`TlsChannel.write`. It never
touches a socket, so every step is testable in memory and the caller decides how to wait.

The contexts are built once at start from the configuration; a file that cannot be read, is
not PEM, or holds an encrypted key, and a key that does not fit its certificate, stop the
router with one line naming the key of the file at fault (never a pass-phrase prompt).
"""

from __future__ import annotations

import contextlib
import ssl
from typing import TYPE_CHECKING, Any

from qpid_flow.config import ConfigError

if TYPE_CHECKING:
    from qpid_flow.config import RouterConfig

__all__ = ["TlsChannel", "broker_context", "listener_context"]

_CHUNK = 65536


class TlsChannel:
    """One end of one TLS connection, fed and drained by its caller."""

    def __init__(self, context: ssl.SSLContext, server_side: bool, server_hostname: str | None = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side, server_hostname)
        self.handshake_done = False
        self.error: str | None = None  # set once the peer broke TLS (or its certificate failed)
        self.closed = False  # the peer ended TLS (close_notify)
        if not server_side:
            self._advance()  # the client speaks first

    def receive(self, data: bytes) -> None:
        """Network bytes from the peer (any split; empty when the socket ended)."""
        if not data:
            self._incoming.write_eof()
        else:
            self._incoming.write(data)
        if not self.handshake_done:
            self._advance()

    def read(self) -> bytes:
        """The clear bytes decrypted so far (empty when none)."""
        if not self.handshake_done or self.error is not None:
            return b""
        parts = []
        while True:
            try:
                part = self._tls.read(_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            except ssl.SSLError as exc:
                self.error = _describe(exc)
                break
            if not part:
                self.closed = True
                break
            parts.append(part)
        return b"".join(parts)

    def write(self, data: bytes) -> None:
        """Clear bytes for the peer (after the handshake); they wait in :meth:`data_to_send`."""
        view = memoryview(data)
        while view and self.error is None:
            try:
                written = self._tls.write(view)
            except ssl.SSLError as exc:
                self.error = _describe(exc)
                return
            view = view[written:]

    def data_to_send(self) -> bytes:
        """Network bytes for the peer: handshake records, encrypted data, close_notify."""
        return self._outgoing.read()

    def close(self) -> None:
        """Start TLS's own ending (close_notify); its bytes wait in :meth:`data_to_send`."""
        if self.handshake_done and self.error is None:
            # SSLWantReadError: the peer's close_notify has not come yet; ours is out anyway.
            with contextlib.suppress(ssl.SSLError):
                self._tls.unwrap()

    def peer_name(self) -> str | None:
        """The common name of the peer's certificate, if it sent one and it was verified."""
        if not self.handshake_done:
            return None
        certificate = self._tls.getpeercert()
        if not certificate:
            return None
        subject: Any = certificate.get("subject", ())
        for rdn in subject:
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return None

    def _advance(self) -> None:
        try:
            self._tls.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except ssl.SSLError as exc:
            self.error = _describe(exc)
            return
        except ValueError as exc:  # e.g. a malformed server_hostname
            self.error = str(exc)
            return
        self.handshake_done = True


def _describe(exc: ssl.SSLError) -> str:
    return str(exc.reason) if exc.reason else str(exc)


def listener_context(config: RouterConfig) -> ssl.SSLContext | None:
    """The context of the ``amqps://`` listeners (None when there are none)."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config.tls_cert, config.tls_key, "tls_cert", "tls_key")
    if config.tls_ca is not None:
        _load_ca(context, config.tls_ca, "tls_ca")
        context.verify_mode = ssl.CERT_REQUIRED if config.tls_require_client_cert else ssl.CERT_OPTIONAL
    return context


def broker_context(config: RouterConfig) -> ssl.SSLContext:
    """The context of ``amqps://`` broker connections: the system's CAs unless
    ``broker_tls_ca`` names others (instead of them: a broker pinned to a private CA must
    not be impersonated with a certificate any public CA signed); a client certificate if
    one is configured."""
    if config.broker_tls_ca is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
        _load_ca(context, config.broker_tls_ca, "broker_tls_ca")
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.broker_tls_cert is not None and config.broker_tls_key is not None:
        _load_chain(context, config.broker_tls_cert, config.broker_tls_key, "broker_tls_cert", "broker_tls_key")
    if not config.broker_tls_verify_hostname:
        context.check_hostname = False
    return context


class _PassPhraseNeeded(Exception):
    """Raised by :func:`_no_pass_phrase`: the key is encrypted."""


def _no_pass_phrase() -> str:
    # Given as load_cert_chain's password, so that OpenSSL never falls back to its own
    # "Enter PEM pass phrase:" prompt on the terminal (which stalled the start).
    raise _PassPhraseNeeded


def _load_chain(context: ssl.SSLContext, cert: str, key: str, cert_key: str, key_key: str) -> None:
    """The certificate (chain) and its key; a refusal names the key whose file is at fault.

    ``load_cert_chain`` alone cannot tell which of the two files it failed on, so the
    certificate is read and parsed first, then the key file is read, then both are loaded."""
    cert_text = _read(cert, cert_key)
    try:
        # A throwaway context: parses every certificate in the file, trusts nothing here.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=cert_text.decode("ascii", errors="ignore"))
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(cert_key, cert, "is not a PEM certificate" + _detail(exc)) from exc
    _read(key, key_key)
    try:
        context.load_cert_chain(cert, key, password=_no_pass_phrase)
    except _PassPhraseNeeded:
        raise ConfigError(key_key, key, "is encrypted (a pass phrase is needed): give it unencrypted") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(key_key, key, f"does not match {cert_key} = {cert!r}") from exc
        raise ConfigError(key_key, key, "is not a PEM private key" + _detail(exc)) from exc
    except OSError as exc:  # changed between the reads above and this one
        raise ConfigError(key_key, key, f"cannot be loaded with {cert_key} = {cert!r}: {exc.strerror or exc}") from exc


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ConfigError(key, path, f"cannot be read: {exc.strerror or exc}") from exc


def _detail(exc: Exception) -> str:
    """OpenSSL's reason in parentheses, unless it only says that PEM parsing failed."""
    text = _describe(exc) if isinstance(exc, ssl.SSLError) else str(exc)
    generic = ("no start line", "PEM lib")
    return "" if any(word in text for word in generic) else f" ({text})"


def _load_ca(context: ssl.SSLContext, path: str, key: str) -> None:
    try:
        context.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(key, path, f"is not a PEM file of CA certificates: {exc}") from exc
