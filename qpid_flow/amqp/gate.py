"""The listener: accept a client, do TLS and SASL with it, then hand its socket to Proton.

Proton's SASL server cannot be used: it never hands a PLAIN password to the application,
and it crashes (SIGSEGV) on a sasl-init without a mechanism. So every listener of
qpid-flow runs the handshake itself, on the raw socket, before any byte reaches a Proton
transport, with an explicit mechanism list (:class:`~qpid_flow.security.sasl.ServerHandshake`):

- on an ``amqps://`` listener, TLS first (:class:`~qpid_flow.security.tls.TlsChannel`);
- standalone, qpid-flow signs the client in itself (:class:`SignIn`: PLAIN against the
  users file, EXTERNAL from a verified client certificate, ANONYMOUS where allowed);
- in front of a broker, the client's sasl-init is replayed to the broker on a new socket,
  trying each broker address in order (:class:`~qpid_flow.security.sasl.ClientHandshake`, TLS first
  for ``amqps://`` brokers), and the broker's sasl-outcome goes back unchanged: the broker
  authenticates the client exactly as if it had connected directly.

On success the sockets get Proton transports with SASL off (the next bytes are the AMQP
header) and the connection (or, in front of a broker, the pair) goes to the router with the
client's identity. A client that skips SASL is let in only where ANONYMOUS would be (in
front of a broker: the upstream connection skips it too). A handshake that does not finish
within ``deadline`` seconds is dropped.
"""

from __future__ import annotations

import errno
import functools
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from proton import Endpoint, Handler, Transport, Url
from proton._io import IO

from qpid_flow.amqp.reactor import RelayContainer
from qpid_flow.amqp.streams import Stream, bind_transport, new_selectable
from qpid_flow.amqp.timers import Call
from qpid_flow.security.access import ANONYMOUS_USER
from qpid_flow.security.auth import claimed_user
from qpid_flow.security.sasl import (
    OUTCOME_AUTH,
    OUTCOME_OK,
    OUTCOME_SYS_TEMP,
    SASL_HEADER,
    TRY_LATER,
    ClientHandshake,
    MechanismsReader,
    ServerHandshake,
)
from qpid_flow.security.tls import TlsChannel

if TYPE_CHECKING:
    from proton import Connection
    from proton.reactor import Container

    from qpid_flow.brokers import BrokerAddress
    from qpid_flow.security.sasl import SaslInit

__all__ = ["BROKER_MECHANISMS", "ClientOpened", "Gate", "PairOpened", "SignIn"]

log = structlog.get_logger(__name__)

# Standalone: the router gets each signed-in client's connection, identity and (host, port).
ClientOpened = Callable[["Connection", str, tuple[str, int]], None]
# In front of a broker: the client's connection, the upstream one, the broker address that
# answered, the client's (host, port) and identity.
PairOpened = Callable[["Connection", "Connection", "BrokerAddress", tuple[str, int], str], None]

# Offered to clients in front of a broker until the broker's own list is known.
BROKER_MECHANISMS = ("PLAIN", "ANONYMOUS")
# What a broker may offer that qpid-flow replays unchanged (one sasl-init, whose identity
# it can read for its ACLs): clients are offered these, in the broker's order.
REPLAYABLE_MECHANISMS = frozenset({"PLAIN", "ANONYMOUS", "AMQPLAIN"})
_BACKLOG = 1024  # Proton's listener uses 10: a burst of connecting clients would be refused
# accept() failures that say the process is out of something, not that the client left.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_PAUSE = 0.25  # seconds without accepting after one of those
# What a client may send before it has been offered mechanisms: its header, and a
# pipelined sasl-init (a client that pipelines guesses one) at most.
_EARLY_LIMIT = 65536


class SignIn(Protocol):
    """Standalone authentication (:class:`qpid_flow.security.auth.Authenticator`)."""

    def mechanisms(self, certificate_name: str | None) -> tuple[str, ...]:
        """What to offer a client, given the name in its verified certificate (if any)."""
        ...

    def skipping_sasl(self, certificate_name: str | None) -> str | None:
        """The identity of a client that skips SASL, or None to refuse it."""
        ...

    def sign_in(
        self, init: SaslInit, certificate_name: str | None, done: Callable[[str | None], None], peer: str = ""
    ) -> None:
        """Check a sasl-init from host ``peer``; call ``done`` with the identity, None
        (refused) or ``TRY_LATER`` (not checked now: too many checks under way), later,
        maybe from a thread's result handed back to the reactor."""
        ...


class Gate:
    """One listening address: standalone (``sign_in`` and ``on_client``) or in front of a
    broker list (``brokers`` and ``on_pair``)."""

    def __init__(
        self,
        container: Container,
        host: str,
        port: int,
        handler: Any,
        *,
        tls: ssl.SSLContext | None = None,
        sign_in: SignIn | None = None,
        on_client: ClientOpened | None = None,
        brokers: list[BrokerAddress] | None = None,
        broker_tls: ssl.SSLContext | None = None,
        on_pair: PairOpened | None = None,
        deadline: float = 10.0,
        idle_timeout: float | None = None,
        anonymous_user: str = ANONYMOUS_USER,
    ) -> None:
        if (sign_in is None) == (not brokers):
            raise ValueError("a gate signs clients in itself or relays them to brokers, not both")
        self._container = container
        self._handler = handler  # the Proton handler of every connection
        self._tls = tls
        self._sign_in = sign_in
        self._on_client = on_client
        self._brokers = brokers or []
        self._broker_tls = broker_tls
        self._on_pair = on_pair
        # In front of a broker: who a client signed in with ANONYMOUS, or without SASL, is
        # to the ACLs and limits: the user the broker signs it in as (RabbitMQ: guest).
        self._anonymous_user = anonymous_user
        # Signed-in clients whose AMQP open has not come yet: (deadline, connection, remote).
        self._awaiting_open: list[tuple[float, Connection, str]] = []
        self._sweeping = False
        self._deadline = deadline
        self._idle_timeout = idle_timeout
        sock = IO.listen(host, port)
        sock.listen(_BACKLOG)
        self.port = sock.getsockname()[1]
        self.scheme = "amqps" if tls is not None else "amqp"
        self._listener = new_selectable(container, self, sock)
        self._listener.reading = True
        self._listener.update()
        self.handshakes: set[_Handshake] = set()
        self._probes: dict[BrokerAddress, list[Callable[[bool], None]]] = {}
        # In front of a broker, clients are offered the broker's mechanisms in its order, so
        # that a client chooses as it would there (Proton's client, given RabbitMQ's
        # "ANONYMOUS AMQPLAIN PLAIN", signs in ANONYMOUS even with a user in its URL).
        # Learnt now, and again from every broker handshake.
        self.broker_mechanisms: tuple[str, ...] = BROKER_MECHANISMS
        # Whether a broker has said what it offers: until one has, each client's
        # handshake asks the broker first (a broker down at start left the guess above).
        self.broker_mechanisms_known = False
        if self._brokers:
            offered = read_broker_mechanisms(self._brokers, self._broker_tls)
            if offered:
                self.broker_offered(offered)

    def broker_offered(self, offered: Sequence[str]) -> None:
        """A broker's sasl-mechanisms: offer clients what of it can be replayed, in its order."""
        self.broker_mechanisms_known = True
        replayable = tuple(name for name in offered if name in REPLAYABLE_MECHANISMS)
        if replayable and replayable != self.broker_mechanisms:
            log.info("broker_mechanisms", offered=list(offered), relayed=list(replayable))
            self.broker_mechanisms = replayable

    def probe(self, broker: BrokerAddress, on_result: Callable[[bool], None], timeout: float = 2.0) -> None:
        """Find out whether ``broker`` accepts connections now; ``on_result(True or False)``.

        A broker connection that ends without a close looks the same on the socket whether
        the broker dropped that one connection or the broker is gone; the router tells its
        clients apart by asking. Probes of one broker under way at once are shared."""
        waiting = self._probes.get(broker)
        if waiting is not None:
            waiting.append(on_result)
            return
        self._probes[broker] = [on_result]
        _Probe(self, broker, timeout)

    def _probed(self, broker: BrokerAddress, reachable: bool) -> None:
        for on_result in self._probes.pop(broker, []):
            on_result(reachable)

    def expect_open(self, connection: Connection, remote: str) -> None:
        """A client signed in: its AMQP open must come within the SASL deadline too. Until
        it opens it counts against no connection limit, and its keep-alive frames would
        keep it past the idle timeout: it could be held for good, in any number.

        Checked by one sweep every ``OPEN_SWEEP`` seconds, which lets go of a connection
        once it opened or went: a timer per connection held each for the whole deadline
        (4 KiB a connection under the fuzzer's churn)."""
        self._awaiting_open.append((time.monotonic() + self._deadline, connection, remote))
        if not self._sweeping:
            self._sweeping = True
            self._container.schedule(OPEN_SWEEP, Call(self.sweep_awaiting_open))

    def sweep_awaiting_open(self) -> None:
        now = time.monotonic()
        waiting = []
        for deadline, connection, remote in self._awaiting_open:
            transport = connection.transport
            if not connection.state & Endpoint.REMOTE_UNINIT or transport is None or transport.closed:
                continue  # opened, or gone (or going: its close event is on its way)
            if now < deadline:
                waiting.append((deadline, connection, remote))
                continue
            log.info("open_timeout", remote=remote, deadline=self._deadline)
            transport.close_tail()
            transport.close_head()
        self._awaiting_open = waiting
        self._sweeping = bool(waiting)
        if waiting:
            self._container.schedule(OPEN_SWEEP, Call(self.sweep_awaiting_open))

    def close(self) -> None:
        """Stop accepting clients (handshakes under way finish or time out)."""
        if not self._listener.is_terminal:
            self._listener.terminate()
            self._listener.update()

    def on_selectable_readable(self, _event: Any) -> None:
        try:
            sock, peer = IO.accept(self._listener)
        except OSError as exc:
            if exc.errno in _OUT_OF_RESOURCES:
                self._pause_accepting(exc)
            return  # otherwise the client went away before we took it
        self.handshakes.add(_Handshake(self, sock, peer))

    def _pause_accepting(self, error: OSError) -> None:
        """No descriptor (or memory) left for a new socket: the waiting client stays in the
        backlog and the listener stays readable, so accepting again at once would spin the
        reactor at full CPU. Stop watching the listener a moment, then try again."""
        if not self._listener.reading:
            return
        log.warning("accept_paused", port=self.port, error=error.strerror, seconds=_ACCEPT_PAUSE)
        self._listener.reading = False
        self._listener.update()
        self._container.schedule(_ACCEPT_PAUSE, _ResumeAccepting(self._listener))


# How often the signed-in clients that have not opened yet are checked (Gate.expect_open).
OPEN_SWEEP = 0.5


# How long a broker of the list may take to say anything (its SASL header and mechanisms,
# or its TLS answer) before a client's handshake tries the next one; only while another
# remains. A broker that is up answers in milliseconds.
SILENT_BROKER = 2.0


class _Handshake:
    """One client's TLS and SASL exchange with qpid-flow and, through it, with the broker."""

    def __init__(self, gate: Gate, sock: socket.socket, peer: Any) -> None:
        self.gate = gate
        self.peer = (str(peer[0]), int(peer[1]))
        container = gate._container
        tls = TlsChannel(gate._tls, server_side=True) if gate._tls is not None else None
        self.client = Stream(container, self, sock, tls)
        self.client.watch(reading=True)
        self.server: ServerHandshake | None = None
        self.certificate_name: str | None = None
        self.user = gate._anonymous_user
        self.upstream: Stream | None = None
        self.upstream_sasl: ClientHandshake | None = None
        # Set while the broker's mechanisms are being learnt before the client is offered
        # any (see _start_sasl); what the client sends meanwhile waits in _early.
        self._learning: MechanismsReader | None = None
        self._early = b""
        self._connected = False
        self._answered = False  # the current broker has sent something
        self._broker_index = -1
        self._closing = False
        self._finished = False
        # A timer rather than a selectable deadline: Proton's I/O handler would update the
        # (absent) transport of an expired selectable.
        self._timer = container.schedule(gate._deadline, self)
        if tls is None:
            self._start_sasl()

    # --- events of either socket --------------------------------------------------------

    def on_selectable_readable(self, event: Any) -> None:
        self._contained(self._readable, event.selectable)

    def on_selectable_writable(self, event: Any) -> None:
        self._contained(self._writable, event.selectable)

    def _contained(self, handle: Callable[[Any], None], subject: Any) -> None:
        """Run a socket event (``subject``: its selectable) or a sign-in answer (``subject``:
        the user) of this handshake. Events may still arrive for a socket the handshake
        already let go (closed, or handed to Proton): they are ignored. Whatever goes wrong
        ends this client's handshake only, never the process."""
        if self._finished or (
            handle in (self._readable, self._writable)
            and subject is not self.client.selectable
            and not self._is_upstream(subject)
        ):
            return  # timed out or gone meanwhile, or a socket let go
        try:
            handle(subject)
        except Exception:
            log.exception("handshake_failed", remote=self._remote)
            self._close_all()

    def _is_upstream(self, selectable: Any) -> bool:
        return self.upstream is not None and selectable is self.upstream.selectable

    def _readable(self, selectable: Any) -> None:
        if selectable is self.client.selectable:
            self._client_readable()
        else:
            self._upstream_readable()

    def _writable(self, selectable: Any) -> None:
        if selectable is self.client.selectable:
            if self.client.flush() and self._closing:
                self._close_all()
        elif not self._connected:
            self._upstream_connected()
        else:
            assert self.upstream is not None
            self.upstream.flush()

    def on_timer_task(self, _event: Any) -> None:
        if not self._finished:
            log.info("handshake_timeout", remote=self._remote, deadline=self.gate._deadline)
            self._close_all()

    def broker_silent(self, index: int) -> None:
        """Broker ``index`` of the list has said nothing for ``SILENT_BROKER`` seconds: the
        next one is tried."""
        if self._finished or self._broker_index != index or self._answered or self.upstream is None:
            return
        log.warning("broker_silent", broker=self._broker.redacted, seconds=SILENT_BROKER)
        self._contained(lambda _subject: self._connect_next(), None)

    @property
    def _remote(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"

    # --- the client -----------------------------------------------------------------------

    def _start_sasl(self) -> None:
        """TLS (if any) is up: offer mechanisms, now that a client certificate is known."""
        tls = self.client.tls
        if tls is not None:
            self.certificate_name = tls.peer_name()
        if self.gate._sign_in is None:
            if not self.gate.broker_mechanisms_known:
                # Offering a guess, a client would choose as it never would at the broker
                # (Proton's client, offered PLAIN first, signs in as the user in its URL
                # where RabbitMQ's list has it sign in ANONYMOUS): ask the broker first.
                self._learning = MechanismsReader()
                self._connect_next()
                return
            mechanisms: tuple[str, ...] = self.gate.broker_mechanisms
        else:
            mechanisms = self.gate._sign_in.mechanisms(self.certificate_name)
        self._offer(mechanisms)

    def _offer(self, mechanisms: tuple[str, ...]) -> None:
        if not mechanisms:
            log.info("handshake_refused", remote=self._remote, reason="no mechanism this client could use")
            self._close_all()
            return
        self.server = ServerHandshake(mechanisms)
        early, self._early = self._early, b""
        if early:
            self._client_sent(early)

    def _client_readable(self) -> None:
        data = self.client.receive()
        if self.server is None and self._learning is None and not self._finished and self.client.tls is not None:
            if self.client.tls.handshake_done:
                self._start_sasl()
            elif self.client.tls_error is not None:
                log.info("tls_refused", remote=self._remote, reason=self.client.tls_error)
                self._close_after_flush()
                return
        if data is None:
            return
        if not data:
            self._close_all()  # the client gave up
            return
        if self.server is None and self._learning is not None:
            self._early += data  # answered once the broker's mechanisms are known
            if len(self._early) > _EARLY_LIMIT:
                log.info("handshake_refused", remote=self._remote, reason="too much sent before the mechanisms")
                self._close_all()
            return
        self._client_sent(data)

    def _client_sent(self, data: bytes) -> None:
        server = self.server
        if server is None:
            return
        busy = server.init is not None or server.no_sasl or server.error is not None
        server.receive(data)
        if busy:
            return  # pipelined bytes (kept for Proton), or after a refusal
        self.client.send(server.data_to_send())
        if server.error is not None:
            log.info("handshake_refused", remote=self._remote, reason=server.error)
            self._close_after_flush()
        elif server.no_sasl:
            self._without_sasl()
        elif server.init is not None:
            self._signing_in(server.init)

    def _without_sasl(self) -> None:
        sign_in = self.gate._sign_in
        if sign_in is None:
            self._connect_next()  # the upstream connection skips SASL too
            return
        user = sign_in.skipping_sasl(self.certificate_name)
        if user is None:
            # AMQP's answer to a protocol layer it will not speak: the header it wants, then close.
            log.info("handshake_refused", remote=self._remote, reason="the client skipped SASL")
            self.client.send(SASL_HEADER)
            self._close_after_flush()
            return
        self.user = user
        self._hand_over_client()

    def _signing_in(self, init: SaslInit) -> None:
        sign_in = self.gate._sign_in
        if sign_in is None:
            claimed = claimed_user(init, self.gate._anonymous_user)
            if claimed is None:
                # Credentials qpid-flow cannot read: the broker might sign someone in whom
                # the ACLs would not know. Refused as the broker refuses bad credentials.
                self._signed_in_as(None)
                return
            self.user = claimed
            self._connect_next()
            return
        self.client.watch(reading=False)  # nothing more is read until the outcome is out
        sign_in.sign_in(
            init, self.certificate_name, lambda user: self._contained(self._signed_in_as, user), peer=self.peer[0]
        )

    def _signed_in_as(self, user: str | None) -> None:
        if self.server is None:
            return
        if user is None or user == TRY_LATER:
            if user is None:
                log.info("authentication_failed", remote=self._remote, mechanism=self.server.mechanisms)
            self.server.send_outcome(OUTCOME_AUTH if user is None else OUTCOME_SYS_TEMP)
            self.client.send(self.server.data_to_send())
            self._close_after_flush()
            return
        self.user = user
        self.server.send_outcome(OUTCOME_OK)
        self.client.send(self.server.data_to_send())
        self._hand_over_client()

    def _hand_over_client(self) -> None:
        if not self._take_over(self.client):
            return
        assert self.server is not None and self.gate._on_client is not None
        connection = bind_transport(
            self.gate._container,
            self.gate._handler,
            self.client,
            Transport.SERVER,
            self.server.leftover(),
            Url(host=self.peer[0], port=self.peer[1]),
            self.gate._idle_timeout,
        )
        self.gate._on_client(connection, self.user, self.peer)
        self.gate.expect_open(connection, self._remote)

    def _take_over(self, *streams: Stream) -> bool:
        """The handshake is over: its bytes out, its timer off; False if a socket failed."""
        if not all(stream.send_now() for stream in streams):
            self._close_all()
            return False
        self._finished = True
        self._timer.cancel()
        self.gate.handshakes.discard(self)
        return True

    def _close_after_flush(self) -> None:
        self._closing = True
        self.client.watch(reading=False)
        if self.client.flush():
            self._close_all()

    # --- the broker -----------------------------------------------------------------------

    def _connect_next(self) -> None:
        """Try the next broker address; drop the client when none is left."""
        self._drop_upstream()
        brokers = self.gate._brokers
        self._broker_index += 1
        while self._broker_index < len(brokers):
            broker = brokers[self._broker_index]
            try:
                address = socket.getaddrinfo(broker.host, broker.port, socket.AF_UNSPEC, socket.SOCK_STREAM)[0]
                sock = IO.connect(address)
            except OSError as exc:
                log.warning("broker_unreachable", broker=broker.redacted, error=str(exc))
                self._broker_index += 1
                continue
            tls = None
            if broker.scheme == "amqps":
                assert self.gate._broker_tls is not None
                tls = TlsChannel(self.gate._broker_tls, server_side=False, server_hostname=broker.host)
            self.upstream = Stream(self.gate._container, self, sock, tls)
            self.upstream.watch(reading=False, writing=True)  # writable: connected
            self._answered = False
            if self._broker_index + 1 < len(brokers):
                # Another broker remains: one that takes the connection and says nothing
                # (hung, overloaded, a black hole) must not cost the client its handshake.
                silent = functools.partial(self.broker_silent, self._broker_index)
                self.gate._container.schedule(SILENT_BROKER, Call(silent))
            return
        # No outcome: a SASL failure reads as "authentication failed" to clients, and some
        # (qpid-jms) do not retry that; a dropped connection is what they retry, as they
        # would a broker that refuses connections.
        log.warning("broker_unavailable", remote=self._remote, brokers=len(brokers))
        self._close_all()

    @property
    def _broker(self) -> BrokerAddress:
        return self.gate._brokers[self._broker_index]

    def _upstream_connected(self) -> None:
        assert self.upstream is not None
        failure = self.upstream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failure:
            log.warning("broker_unreachable", broker=self._broker.redacted, error=errno.errorcode.get(failure, failure))
            self._connect_next()
            return
        self._connected = True
        if self._learning is not None:
            self.upstream.watch(reading=True)
            self.upstream.send(self._learning.data_to_send())  # the SASL header alone
            self.upstream.flush()
            return
        assert self.server is not None
        self.upstream_sasl = ClientHandshake(None if self.server.no_sasl else self.server.init)
        if self.upstream_sasl.done and self.upstream.tls is None:
            self._finish()
            return
        self.upstream.watch(reading=True)
        self.upstream.send(self.upstream_sasl.data_to_send())
        self.upstream.flush()

    def _upstream_readable(self) -> None:
        if self._learning is not None:
            self._learn_mechanisms()
            return
        upstream, sasl = self.upstream, self.upstream_sasl
        assert upstream is not None and sasl is not None
        data = upstream.receive()
        if upstream.tls is not None and upstream.tls_error is not None:
            log.warning("broker_tls_failed", broker=self._broker.redacted, reason=upstream.tls_error)
            self._connect_next()
            return
        if sasl.done and upstream.tls is not None and upstream.tls.handshake_done:
            self._finish()  # no SASL: TLS up is all the broker connection needed
            return
        if data is None:
            return
        if not data:
            log.warning("broker_closed_handshake", broker=self._broker.redacted)
            self._connect_next()
            return
        self._answered = True
        sasl.receive(data)
        if sasl.offered:
            self.gate.broker_offered(sasl.offered)
        upstream.send(sasl.data_to_send())
        if sasl.error is not None:
            log.warning("broker_handshake_failed", remote=self._remote, reason=sasl.error)
            assert self.server is not None
            self.server.send_outcome(OUTCOME_SYS_TEMP)
            self.client.send(self.server.data_to_send())
            self._close_after_flush()
        elif sasl.done:
            self._finish()

    def _learn_mechanisms(self) -> None:
        """Read the broker's header and sasl-mechanisms, then offer the client those
        (Gate.broker_offered: the ones qpid-flow can replay, in the broker's order). This
        connection ends there: the client's own sign-in starts a new one, from the first
        broker of the list, as every handshake does."""
        upstream, reader = self.upstream, self._learning
        assert upstream is not None and reader is not None
        data = upstream.receive()
        if upstream.tls is not None and upstream.tls_error is not None:
            log.warning("broker_tls_failed", broker=self._broker.redacted, reason=upstream.tls_error)
            self._connect_next()
            return
        if data is None:
            return
        if not data:
            log.warning("broker_closed_handshake", broker=self._broker.redacted)
            self._connect_next()
            return
        self._answered = True
        reader.receive(data)
        if reader.offered is None and reader.error is None:
            return
        if reader.offered is not None:
            self.gate.broker_offered(reader.offered)
        else:  # not a SASL answer: the client is offered the usual guess, and its sign-in tells
            log.warning("broker_handshake_failed", remote=self._remote, reason=reader.error)
        self._learning = None
        self._drop_upstream()
        self._broker_index = -1
        self._offer(self.gate.broker_mechanisms)

    def _finish(self) -> None:
        """The broker answered: pass its outcome on; on success, hand both sockets over."""
        sasl, server, upstream = self.upstream_sasl, self.server, self.upstream
        assert sasl is not None and server is not None and upstream is not None
        if not server.no_sasl:
            outcome = sasl.outcome if sasl.outcome is not None else OUTCOME_SYS_TEMP
            server.send_outcome(outcome, sasl.additional_data)
            self.client.send(server.data_to_send())
            if outcome != OUTCOME_OK:
                log.info("authentication_failed", remote=self._remote, outcome=outcome, user=self.user)
                self._close_after_flush()
                return
        if not self._take_over(self.client, upstream):
            return
        gate, broker = self.gate, self._broker
        self.upstream = None
        client = bind_transport(
            gate._container,
            gate._handler,
            self.client,
            Transport.SERVER,
            server.leftover(),
            Url(host=self.peer[0], port=self.peer[1]),
        )
        upstream_connection = bind_transport(
            gate._container,
            gate._handler,
            upstream,
            Transport.CLIENT,
            sasl.leftover(),
            Url(host=broker.host, port=broker.port),
        )
        assert gate._on_pair is not None
        gate._on_pair(client, upstream_connection, broker, self.peer, self.user)
        if isinstance(gate._container, RelayContainer):
            # The broker's frames for this client wait in the broker while it reads slowly.
            client.qf_unwritten = gate._container.pace(client, upstream_connection)

    # --- ending ---------------------------------------------------------------------------

    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        self.upstream = None
        self.upstream_sasl = None
        self._connected = False

    def _close_all(self) -> None:
        self._finished = True
        self._timer.cancel()
        self.gate.handshakes.discard(self)
        self._drop_upstream()
        self.client.close()


class _Probe:
    """One TCP connect to a broker, to learn whether it is there; closed at once."""

    def __init__(self, gate: Gate, broker: BrokerAddress, timeout: float) -> None:
        self._gate = gate
        self._broker = broker
        self._done = False
        container = gate._container
        self._timer = container.schedule(timeout, self)
        try:
            address = socket.getaddrinfo(broker.host, broker.port, socket.AF_UNSPEC, socket.SOCK_STREAM)[0]
            sock = IO.connect(address)
        except OSError:
            self._selectable = None
            self._finish(False)
            return
        self._selectable = new_selectable(container, self, sock)
        self._selectable.writing = True
        self._selectable.update()

    def on_selectable_writable(self, _event: Any) -> None:
        assert self._selectable is not None
        self._finish(not self._selectable.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))

    def on_timer_task(self, _event: Any) -> None:
        self._finish(False)

    def _finish(self, reachable: bool) -> None:
        if self._done:
            return
        self._done = True
        self._timer.cancel()
        if self._selectable is not None:
            self._selectable.terminate()
            self._selectable.update()  # closes the socket
        self._gate._probed(self._broker, reachable)


def read_broker_mechanisms(
    brokers: Sequence[BrokerAddress], tls: ssl.SSLContext | None, timeout: float = 2.0
) -> tuple[str, ...] | None:
    """The SASL mechanisms the first broker that answers offers (a header, and its
    sasl-mechanisms frame read back), or None if none answers within ``timeout`` each.
    Blocking: run once, at start."""
    for broker in brokers:
        reader = MechanismsReader()
        try:
            with socket.create_connection((broker.host, broker.port), timeout=timeout) as raw:
                sock = raw
                if broker.scheme == "amqps":
                    if tls is None:
                        continue
                    sock = tls.wrap_socket(raw, server_hostname=broker.host)
                reader.read_from(sock)
        except OSError as exc:
            log.info("broker_mechanisms_unknown", broker=broker.redacted, error=str(exc))
            continue
        if reader.offered is not None:
            return reader.offered
    return None


class _ResumeAccepting(Handler):
    """Watch a paused listener again (see :meth:`Gate._pause_accepting`)."""

    def __init__(self, listener: Any) -> None:
        super().__init__()
        self._listener = listener

    def on_timer_task(self, _event: Any) -> None:
        self._listener.reading = True
        self._listener.update()
