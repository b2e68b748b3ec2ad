"""In front of a broker: every client connection, session and link mirrored upstream.

qpid-flow is transparent here except for credit and settlement, like a Qpid Dispatch link
route with policies in the middle. Each client connection comes with an upstream
connection of its own, opened with the client's identity (:mod:`qpid_flow.amqp.gate` did the
SASL part); this handler opens it with the client's container id, hostname, properties and
capabilities, and mirrors each session and link one to one with the complete attach. The
client sees the broker's answers (open, begin, attach, outcomes, detach, end and close
conditions) as the broker gave them, and whatever the broker does to one client reaches
that client only.

What the policies still decide, exactly as standalone:
- a producer link's credit (never more than the broker gave the upstream link) and when a
  transfer's outcome is settled back to it (flow control holds the broker's outcome while
  the destination is stopped); transfers pass the ``qpid_flow_transfer_arrived`` hook;
- anonymous-relay producers (null target): qpid-flow relays, with one upstream sender per
  ``to`` address on the client's own upstream session;
- a destination a plugin dispatches (``shared_groups``) is read by one upstream receiver
  of qpid-flow's own (:class:`~qpid_flow.amqp.upstream.GroupReader`) that pins groups; a
  consumer's right to read it is checked first with a zero-credit attach on its own
  upstream connection.

Depth is counted per destination as the broker dialect names it (``X``, ``/queue/X`` and
``/amq/queue/X`` are one queue on RabbitMQ); exchange and topic addresses keep none.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from cproton import (
    PN_RELEASED,
    pn_connection_remote_desired_capabilities,
    pn_connection_remote_offered_capabilities,
    pn_link_credit,
)
from proton import Array, Condition, Endpoint, Handler, Link, Session, SymbolList, Terminus, Transport

from qpid_flow import codec
from qpid_flow.amqp.endpoints import (
    DeliveryEvent,
    LeanDelivery,
    keep_link,
    kept,
    new_delivery,
    send_transfer,
    take_transfer,
)
from qpid_flow.amqp.guard import contain_errors
from qpid_flow.amqp.outcomes import TRANSACTIONAL_STATE, is_terminal, relay_state, remote_settlement
from qpid_flow.amqp.reactor import Unwritten
from qpid_flow.amqp.router import (
    ANONYMOUS_RELAY,
    Router,
    _answer_filters,
    _connection_ids,
    peer_capabilities,
    selector_in_force,
    user_of,
)
from qpid_flow.config import is_pattern
from qpid_flow.core.dialect import PLAIN, Dialect, Node, dialect_for
from qpid_flow.core.jms_selector import Selector, SelectorError
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Consumer, Message, Outcome, Producer, Settlement
from qpid_flow.plugin.manager import CREDIT_AFTER_FAILURE

if TYPE_CHECKING:
    from proton import Connection, Event, Session

    from qpid_flow.amqp.upstream import GroupReader
    from qpid_flow.brokers import BrokerAddress
    from qpid_flow.config import RouterConfig
    from qpid_flow.core.backend import OutcomeCallback
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.registry import Destinations
    from qpid_flow.plugin.manager import Hooks

__all__ = ["BrokerRouter"]

_FORCED = "amqp:connection:forced"

log = structlog.get_logger(__name__)

_ACCEPTED = Settlement.accepted()
_RELEASED = Settlement.released()
_PROBE = "probe"  # an upstream receiver that only checks a grouped consumer's right to read


class _Pair:
    """A client connection and its upstream mirror."""

    __slots__ = ("broker", "client", "closing", "id", "lingering", "peer", "upstream")

    def __init__(self, client: Connection, upstream: Connection, broker: BrokerAddress, peer: tuple[str, int]):
        self.id = f"c{next(_connection_ids)}"
        self.client = client
        self.upstream = upstream
        self.broker = broker
        self.peer = peer
        # Relay senders still sending what the client sent before it left (see
        # BrokerRouter._producer_route_gone); the upstream connection closes after them,
        # with ``closing`` (the client's close condition, in a tuple once it is due).
        self.lingering: set[_UpstreamSender] = set()
        self.closing: tuple[Condition | None] | None = None


# The largest transaction control message (declare, discharge) relayed: they are tiny.
CONTROL_MESSAGE_LIMIT = 64 * 1024
_NODE_CACHE_SIZE = 4096
# How long an upstream connection stays open after its client left, for the transfers the
# client sent that wait for their anonymous-relay sender's credit.
_LINGER = 5.0
_SENDING = Endpoint.LOCAL_ACTIVE | Endpoint.LOCAL_UNINIT  # opened or opening, not closed
# Upstream senders an anonymous-relay producer keeps open, one per address it sends to; past
# it the least recently used idle one is detached (and attached again if it is used again).
_RELAYS_PER_PRODUCER = 64


class _UpstreamSender:
    """An upstream sender that carries a producer's transfers, and what waits for it."""

    __slots__ = ("address", "destination", "in_flight", "lingering_for", "link", "pending")

    def __init__(self, link: Link, address: str) -> None:
        self.link = link
        self.address = address
        self.lingering_for: _Pair | None = None  # its client left: it sends what waits, then detaches
        self.pending: deque[tuple[Message, OutcomeCallback]] = deque()
        # Sent and waiting for the broker's outcome, by C delivery (see endpoints.py).
        self.in_flight: dict[Any, tuple[Message, OutcomeCallback, LeanDelivery]] = {}


class _ProducerRoute:
    """A client's producer link: one upstream sender, or (anonymous relay) one per ``to``."""

    __slots__ = ("client", "relays", "upstream")

    def __init__(self, client: Link, upstream: _UpstreamSender | None) -> None:
        self.client = client
        self.upstream = upstream
        self.relays: dict[str, _UpstreamSender] = {}

    def senders(self) -> list[_UpstreamSender]:
        return [self.upstream] if self.upstream is not None else list(self.relays.values())


class _ConsumerRoute:
    """A client's consumer link and its upstream receiver: credit and outcomes pass through."""

    __slots__ = (
        "awaiting_broker",
        "client",
        "consumer",
        "delivered",
        "destination",
        "draining",
        "pending",
        "sent",
        "subscribed",
        "unwritten",
        "upstream",
    )

    def __init__(self, client: Link, upstream: Link, destination: Destination | None) -> None:
        self.client = client
        self.upstream = upstream
        # Counted out of its depth when the client accepts or rejects (None: not a queue).
        self.destination = destination
        # Until the broker answers the attach (BrokerRouter._awaiting_broker counts it).
        self.awaiting_broker = destination is not None
        # What the client's socket has yet to take (reactor.Unwritten; None: not paced).
        self.unwritten: Unwritten | None = kept(client.connection, "qf_unwritten")
        # The link as plugins see it, once the broker accepted it (None: not a queue).
        self.consumer: Consumer | None = None
        # An address that is no queue (a topic): the destination it counts in as a
        # subscriber, once the broker accepted it.
        self.subscribed: Destination | None = None
        # From the broker, waiting for the client's credit (RabbitMQ sends beyond credit).
        self.pending: deque[tuple[bytes, LeanDelivery]] = deque()
        # Sent to the client, unsettled: client C delivery -> (client wrapper, upstream
        # delivery, size, the message as plugins saw it or None when none listens)
        self.sent: dict[Any, tuple[LeanDelivery, LeanDelivery, Message | None]] = {}
        self.draining = False
        self.delivered = 0  # messages sent to the client in all (qpid-flow stat links)

    # What its destination reads of it (``MirroredConsumer``) when the broker's depth comes in.

    @property
    def held(self) -> int:
        return len(self.pending) + len(self.sent)

    @property
    def broker_credit(self) -> int:
        return int(pn_link_credit(self.upstream._impl))


_OPEN = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE  # an endpoint open at both ends


class _LeftUnsettled:
    """A consumer route gone with ``count`` messages unsettled upstream: the broker holds
    them (not ready) until ``session`` ends (``LeftUnsettled``)."""

    __slots__ = ("count", "session")

    def __init__(self, session: Session, count: int) -> None:
        self.session: Session | None = session
        self.count = count

    @property
    def held(self) -> int:
        if self.count and not self._lasts():
            self.session = None  # let Proton's objects go
            self.count = 0
        return self.count

    def _lasts(self) -> bool:
        session = self.session
        if session is None or session.state != _OPEN:
            return False
        connection = session.connection
        transport = connection.transport
        return connection.state == _OPEN and transport is not None and not transport.closed


class _Backend:
    """The router's backend in broker mode: producers go out on their own upstream links;
    grouped destinations are fed by qpid-flow's own reader (``group_reader``)."""

    def __init__(self, router: BrokerRouter, group_reader: GroupReader) -> None:
        self._router = router
        self.group_reader = group_reader

    def writable(self, address: str | None) -> bool:
        return True

    def producer_attached(self, destination: Destination) -> None:
        pass

    def forward(self, destination: Destination, message: Message, done: OutcomeCallback) -> None:
        self._router.forward(destination, message, done)

    def consumer_attached(self, destination: Destination) -> None:
        durability = self._router.reader_durability.get(destination.address, Terminus.NONDURABLE)
        self.group_reader.consumer_attached(destination, durability)

    def consumer_detached(self, destination: Destination) -> None:
        self.group_reader.consumer_detached(destination)

    def demand_changed(self, destination: Destination) -> None:
        self.group_reader.demand_changed(destination)

    def in_flight(self) -> int:
        return self._router.in_flight()

    def shutdown(self) -> None:
        self.group_reader.shutdown()


@contain_errors
class BrokerRouter(Router):
    """The Proton handler of both connections of every client pair (see the module doc)."""

    judges_messages = False  # the broker judges what it is sent

    def __init__(
        self,
        config: RouterConfig,
        hooks: Hooks,
        destinations: Destinations,
        group_reader: GroupReader,
        memory: MemoryMeter | None = None,
    ) -> None:
        super().__init__(config, hooks, destinations, None, memory)  # type: ignore[arg-type]
        self.backend = _Backend(self, group_reader)
        self._group_reader = group_reader
        self._dialect_setting = config.broker_dialect
        # Known at once when configured; with "auto", from the first open of the broker's
        # (a client's upstream connection, or qpid-flow's own reader: see _node).
        self.dialect: Dialect | None = None
        self._producer_routes: dict[int, _ProducerRoute] = {}  # by producer id
        self._relay_tags = itertools.count(1)
        # Address -> its node in the broker's dialect: asked for every message relayed.
        self._nodes: dict[str, Node] = {}
        if config.broker_dialect != "auto":
            self._dialect_found(dialect_for(config.broker_dialect))
        self.pairs: set[_Pair] = set()
        # Destination address -> consumer attaches of it the broker has yet to answer.
        self._awaiting_broker: dict[str, int] = {}
        # Of those, the addresses whose destination such an attach made: it goes if the
        # broker refuses every one of them (qpid-flow keeps nothing for what it refused).
        self._made_for_attach: set[str] = set()
        # Grouped destination -> the terminus durability its consumers' sources ask for
        # (the broker accepted it for them): what qpid-flow's reader asks for too.
        self.reader_durability: dict[str, int] = {}
        # Whether plugins want to hear of mirrored consumers' messages (the event log does):
        # if none does, no Message is built for them.
        self._observed = any(
            hooks.listens(name) for name in ("message_enqueued", "message_delivered", "message_settled")
        )
        # Asks whether a broker accepts connections now (the gate's probe; None: assume so).
        self.probe: Callable[[BrokerAddress, Callable[[bool], None]], None] | None = None

    # --- pairs and connections --------------------------------------------------------------

    def pair_opened(
        self, client: Connection, upstream: Connection, broker: BrokerAddress, peer: tuple[str, int], user: str
    ) -> None:
        """The gate authenticated a client at the broker: mirror its connection from now on."""
        pair = _Pair(client, upstream, broker, peer)
        client.qf_user = user
        client.qf_pair = pair
        client.qf_id = pair.id
        client.qf_remote = f"{peer[0]}:{peer[1]}"
        upstream.qf_pair = pair
        upstream.qf_upstream = True
        self.pairs.add(pair)

    def on_connection_remote_open(self, event: Event) -> None:
        conn = event.connection
        pair: _Pair | None = kept(conn, "qf_pair")
        if pair is None:
            return
        if conn == pair.client:
            # Capabilities that are not symbols are refused here: they failed qpid-flow's
            # handler writing the upstream open (amqp:internal-error).
            if self.refuse_bad_capabilities(conn):
                return  # the upstream connection closes with it (on_connection_local_close)
            if not self.admit_connection(conn):
                self.pairs.discard(pair)
                _close(pair.upstream, None)
                return
            # The client's open goes to the broker as the client gave it.
            upstream = pair.upstream
            upstream.container = conn.remote_container
            upstream.hostname = conn.remote_hostname
            upstream.properties = _relayable(conn.remote_properties)
            upstream.offered_capabilities = _symbols(_offered(conn))
            desired = [c for c in _desired(conn) if c != ANONYMOUS_RELAY]
            upstream.desired_capabilities = SymbolList(desired) if desired else None
            # Each side asks for the keep-alive the other asked for, so a silent client is
            # dropped when the broker would drop it, and the broker hears from us as often.
            upstream.transport.idle_timeout = _asking_for(conn.transport.remote_idle_timeout)
            upstream.open()
            return
        if pair not in self.pairs:
            # The client left (or was refused) while the broker was answering: its upstream
            # connection is closing already. Registering the client now would keep it, its
            # transport and buffers in ``connections`` for good, since its own events are
            # over (found by the listener fuzzer: 31-37 KiB each, a quarter of its clients).
            return
        # The broker's open goes back to the client, plus the relay qpid-flow offers itself.
        client = pair.client
        if self.dialect is None:
            properties = conn.remote_properties or {}
            self._dialect_found(dialect_for(self._dialect_setting, _text(properties.get("product"))))
        client.container = conn.remote_container
        client.properties = _relayable(conn.remote_properties)
        offered = _offered(conn)
        if ANONYMOUS_RELAY not in offered:
            offered.append(ANONYMOUS_RELAY)
        client.offered_capabilities = SymbolList(offered)
        client.desired_capabilities = _symbols(_desired(conn))
        client.transport.idle_timeout = _asking_for(conn.transport.remote_idle_timeout)
        client.open()
        self.connections.add(client)
        client.qf_opened = time.time()
        log.info(
            "connection_opened",
            connection=pair.id,
            remote=f"{pair.peer[0]}:{pair.peer[1]}",
            container=client.remote_container,
            user=user_of(client),
            broker=pair.broker.redacted,
        )

    def on_connection_local_close(self, event: Event) -> None:
        """qpid-flow closed one side itself (shutdown, a contained error): the other follows."""
        conn = event.connection
        pair: _Pair | None = kept(conn, "qf_pair")
        if pair is None:
            return
        if conn == pair.client:
            self._client_gone(pair)
            self._close_upstream(pair, None, event.container)
        elif not pair.client.state & Endpoint.LOCAL_CLOSED:
            self._close_client(pair, conn.condition, "closed_by_qpid_flow")

    def on_connection_remote_close(self, event: Event) -> None:
        conn = event.connection
        pair: _Pair | None = kept(conn, "qf_pair")
        if pair is None:
            return
        condition = conn.remote_condition
        if conn == pair.upstream:
            self._close_client(pair, condition, "closed_by_broker")
            _close(conn, None)
        else:
            self._client_gone(pair)
            _close(conn, None)  # first: closing the upstream side then finds it closed
            self._close_upstream(pair, condition, event.container)

    def on_transport_closed(self, event: Event) -> None:
        conn = event.connection
        pair: _Pair | None = kept(conn, "qf_pair") if conn is not None else None
        if pair is None:
            return
        if conn == pair.upstream:
            if not pair.client.state & Endpoint.LOCAL_CLOSED:
                if _silent(event.transport):
                    # The broker stopped answering (hung, or a path to it half dead): as
                    # lost, not as a connection it dropped (a TCP connect still succeeds).
                    self._close_client(pair, Condition(_FORCED, "the broker stopped answering"), "broker_idle_timeout")
                else:
                    self._upstream_dropped(pair)
        else:
            self._client_gone(pair)
            self._close_upstream(pair, None, event.container)
        _forget_endpoints(conn)

    def _close_client(self, pair: _Pair, condition: Condition | None, reason: str) -> None:
        client = pair.client
        if client.state & Endpoint.LOCAL_CLOSED:
            return
        log.info(
            "connection_closed_upstream",
            connection=pair.id,
            reason=reason,
            condition=condition.name if condition else None,
            description=condition.description if condition else None,
        )
        self._client_gone(pair)
        if client.state & Endpoint.LOCAL_UNINIT:
            client.open()  # a close needs an open before it, even for a refusal
        client.condition = condition
        client.close()

    def _upstream_dropped(self, pair: _Pair) -> None:
        """The broker connection ended without a close. Either the broker dropped that one
        connection (RabbitMQ does, for a message it cannot take): the client's connection
        is dropped the same way, as it would have been directly; or the broker is gone: the
        client is told with amqp:connection:forced. Either way its own reconnect takes
        over. Which of the two, a connect to the broker tells."""
        self._client_gone(pair)
        if self.probe is None:
            self._drop_client(pair, True)
            return
        self.probe(pair.broker, lambda reachable: self._drop_client(pair, reachable))

    def _drop_client(self, pair: _Pair, broker_reachable: bool) -> None:
        client = pair.client
        if client.state & Endpoint.LOCAL_CLOSED:
            return
        # A TCP connect alone says yes to a proxy (HAProxy) whose broker is gone; the
        # reader's own connection, lost too by then, says no.
        if not broker_reachable or self._group_reader.broker_lost:
            self._close_client(pair, Condition(_FORCED, "the broker connection was lost"), "broker_lost")
            self.broker_lost()
            return
        log.info("connection_dropped_upstream", connection=pair.id, broker=pair.broker.redacted)
        transport = client.transport
        if transport is not None:
            transport.close_tail()
            transport.close_head()

    def broker_lost(self) -> None:
        """The broker is gone: the depths qpid-flow counted in it are not known any more
        (:meth:`Destination.broker_lost`). Told by a client's pair whose broker connection
        dropped and whose broker a connect does not reach, and by the reader's probe
        connection when it was lost and could not be made again (a broker stopped cleanly
        closes every connection with a close frame; with no client connected there is no
        pair to tell)."""
        lowered = []
        for destination in self.destinations:
            depth = destination.depth
            destination.broker_lost()
            if destination.depth < depth:
                lowered.append(destination.address)
        if lowered:
            log.warning("depth_reset_broker_lost", destinations=lowered)

    def _refuse_link(self, link: Link, condition: str, description: str) -> None:
        """As standalone; but on a session the broker has not begun yet, the refusal waits
        for it: Proton sends no attach on a session not begun, and the client heard nothing
        of an attach the ACL refused (or the link limit) before the broker's begin came."""
        session = link.session
        if session.state & Endpoint.LOCAL_UNINIT:
            waiting = kept(session, "qf_refusals")
            if waiting is None:
                waiting = session.qf_refusals = []
            waiting.append((link, condition, description))
            return
        super()._refuse_link(link, condition, description)

    def _pair_alive(self, conn: Connection) -> bool:
        """Whether the client of ``conn``'s pair is still served. A broker's answer (open,
        begin, attach) may arrive after the client left: then nothing may be registered for
        it (a producer, a consumer), since no event of the client would remove it again."""
        pair: _Pair | None = kept(conn, "qf_pair")
        return pair is not None and pair in self.pairs

    def _client_gone(self, pair: _Pair) -> None:
        if pair in self.pairs:
            self.pairs.discard(pair)
            client = pair.client
            if client not in self.connections and kept(client, "qf_admitted"):
                # Counted in at its open, gone before the broker's open made it one of
                # ``connections``: _connection_gone would skip it, and its place under
                # max_connections would never be given back.
                client.qf_admitted = False
                self.limits.release(user_of(client))
            self._connection_gone(client)

    # --- sessions -------------------------------------------------------------------------

    def on_session_remote_open(self, event: Event) -> None:
        session = event.session
        pair: _Pair | None = kept(session.connection, "qf_pair")
        if pair is None:
            return
        peer: Session | None = kept(session, "qf_peer")
        if peer is None:
            if session.connection == pair.client:
                if self.ignores_frames_of(session.connection, "begin") or self.refuse_session_over_limit(session):
                    return
                peer = pair.upstream.session()
                peer.incoming_capacity = session.incoming_capacity
                peer.qf_peer = session
                session.qf_peer = peer
                peer.open()
            return
        if not self._pair_alive(session.connection):
            return  # the client left meanwhile: no relay links for it (see _pair_alive)
        if peer.state & Endpoint.LOCAL_UNINIT:
            peer.open()  # the broker began the client's session
            # Links qpid-flow answers itself waited for it: Proton sends no attach on a
            # session not begun, and does not try again later.
            for link in kept(peer, "qf_waiting") or ():
                self._open_relay(link)
            peer.qf_waiting = None
            for link, condition, description in kept(peer, "qf_refusals") or ():
                super()._refuse_link(link, condition, description)
            peer.qf_refusals = None
        self._end_if_done(session)  # the client ended it before the broker's begin came

    def on_session_remote_close(self, event: Event) -> None:
        """As links: the other side is told, and this side answered when it answers."""
        session = event.session
        self._uncount_session(session, by_client=True)
        peer: Session | None = kept(session, "qf_peer")
        self._links_of_session_gone(session)
        if peer is None or peer.state & Endpoint.LOCAL_CLOSED:
            if session.state & Endpoint.LOCAL_ACTIVE:
                session.close()
            return
        self._links_of_session_gone(peer)
        if peer.state & Endpoint.LOCAL_UNINIT:
            peer.open()
        peer.condition = session.remote_condition
        if self._lingering_on(peer):
            # Relay transfers still wait to go on its senders: sent to the broker directly
            # they would have reached it before the end, so they go first (as a client's
            # close waits for them: _close_upstream), for at most _LINGER seconds.
            peer.qf_end_pending = True
            event.container.schedule(_LINGER, _SessionLingerTimeout(self, peer))
        elif peer.state & Endpoint.REMOTE_UNINIT:
            # The broker has not answered its begin: ended now, Proton would free the
            # channel, and the broker's answer to an unknown channel ends the connection
            # (a client's begin and end in one write lost it). Ended once the answer comes.
            peer.qf_end_pending = True
        else:
            peer.close()
        pair: _Pair | None = kept(session.connection, "qf_pair")
        if pair is not None and session.connection == pair.upstream and session.remote_condition is not None:
            log.info(
                "session_ended_by_broker",
                connection=pair.id,
                condition=session.remote_condition.name,
                description=session.remote_condition.description,
            )

    @staticmethod
    def _lingering_on(session: Session) -> list[_UpstreamSender]:
        """The senders of a client that left that still send what waited on ``session``."""
        pair: _Pair | None = kept(session.connection, "qf_pair")
        return [sender for sender in pair.lingering if sender.link.session == session] if pair is not None else []

    def _end_if_done(self, session: Session) -> None:
        """End an upstream session the client ended once the broker has begun it and no
        sender lingers on it."""
        if (
            kept(session, "qf_end_pending")
            and not session.state & Endpoint.REMOTE_UNINIT
            and not self._lingering_on(session)
        ):
            session.qf_end_pending = False
            if not session.state & Endpoint.LOCAL_CLOSED:
                session.close()

    def _links_of_session_gone(self, session: Session) -> None:
        link = session.connection.link_head(0)
        while link is not None:
            if link.session == session:
                self._link_gone(link)
            link = link.next(0)

    # --- links: attach ----------------------------------------------------------------------

    def on_link_remote_open(self, event: Event) -> None:
        link = event.link
        if kept(link.connection, "qf_upstream"):
            link.qf_upstream = True  # before any flow or transfer of the broker's on it
            self._broker_answered(link)
        elif not link.state & Endpoint.LOCAL_UNINIT or link.session.state & Endpoint.LOCAL_CLOSED:
            return  # answered already, or on a session qpid-flow refused (its end answers it)
        elif self.ignores_frames_of(link.connection, "attach") or self.refuse_link_over_limit(link):
            return
        elif link.is_receiver:
            self._attach_producer(link)
        else:
            self._attach_consumer(link)

    def _mirror(self, link: Link, kind: str | None = None) -> Link:
        """Attach upstream what the client attached, in full: the broker answers it."""
        session: Session = kept(link.session, "qf_peer")
        upstream = session.receiver(link.name) if link.is_sender else session.sender(link.name)
        _copy_terminus(upstream.source, link.remote_source, link.is_receiver)
        upstream.target.copy(link.remote_target)
        upstream.snd_settle_mode = link.remote_snd_settle_mode
        upstream.rcv_settle_mode = link.remote_rcv_settle_mode
        if link.remote_max_message_size:
            upstream.max_message_size = link.remote_max_message_size
        properties = _relayable(link.remote_properties)
        if properties:
            upstream.properties = properties
        upstream.qf_peer = link
        upstream.qf_kind = kind
        upstream.qf_upstream = True
        link.qf_peer = upstream
        keep_link(upstream)
        keep_link(link)
        upstream.open()
        return upstream

    def _attach_producer(self, link: Link) -> None:
        target = link.remote_target
        if target.address and self.refuse_unauthorized_link(link, "send", target.address):
            return
        if target.type == Terminus.COORDINATOR or target.address or target.dynamic:
            # Transactions and dynamic targets (a node the broker makes and names, as a
            # JMS temporary queue is) are the broker's to answer, as named targets are.
            self._mirror(link)
            return
        # Anonymous relay: qpid-flow answers itself and relays per ``to``.
        if not link.session.state & Endpoint.LOCAL_ACTIVE:
            waiting = kept(link.session, "qf_waiting")
            if waiting is None:
                waiting = link.session.qf_waiting = []
            waiting.append(link)
            return
        self._open_relay(link)

    def _open_relay(self, link: Link) -> None:
        self._open_producer(link)
        producer = self._start_producer(link, None, grant=False)
        self._producer_routes[producer.id] = _ProducerRoute(link, None)
        self._grant(producer, link)

    def _attach_consumer(self, link: Link) -> None:
        source = link.remote_source
        if source.address and not source.dynamic and self.refuse_unauthorized_link(link, "receive", source.address):
            return
        destination = None
        made = False
        if source.address and not source.dynamic:
            node = self._node(source.address)
            if node.is_queue:
                made = self.destinations.find(node.name) is None
                destination = self.destinations.get(node.name)
        grouped = destination is not None and destination.dispatched_by_plugin
        if grouped and (refusal := self._outside_the_readers_vhost(link)) is not None:
            log.warning("grouped_consumer_refused", connection=kept(link.connection, "qf_id"), reason=refusal)
            self._refuse_link(link, "amqp:not-allowed", refusal)
            return
        upstream = self._mirror(link, _PROBE if grouped else None)
        if not grouped:
            link.qf_route = upstream.qf_route = _ConsumerRoute(link, upstream, destination)
            if destination is not None:
                self._awaiting_broker[destination.address] = self._awaiting_broker.get(destination.address, 0) + 1
                if made:
                    self._made_for_attach.add(destination.address)

    def _outside_the_readers_vhost(self, link: Link) -> str | None:
        """Why a grouped destination's consumer on ``link`` cannot be served, if it
        cannot: its connection is in another vhost than qpid-flow's reader. The reader
        reads the queue of the broker URL's vhost; a consumer whose own attach the broker
        allowed in its vhost would otherwise get the messages of a vhost it may have no
        right to read. (Destinations are known by name alone: one name in two vhosts is
        one destination here.)"""
        wanted = _vhost_selected_by(link.connection.remote_hostname)
        served = {broker.vhost or _DEFAULT_VHOST for broker in self.config.broker_addresses}
        if served == {wanted}:
            return None
        return (
            f"{link.remote_source.address!r} has shared_groups, served only in the vhost of qpid-flow's broker URL "
            f"({', '.join(sorted(served))}); this connection's vhost is {wanted!r}"
        )

    def _broker_answered(self, upstream: Link) -> None:
        """The broker's attach: the client gets it as it came; then traffic may start."""
        client: Link | None = kept(upstream, "qf_peer")
        if client is None or not client.state & Endpoint.LOCAL_UNINIT or not self._pair_alive(upstream.connection):
            return
        _copy_terminus(client.source, upstream.remote_source, client.is_receiver)
        client.target.copy(upstream.remote_target)
        client.snd_settle_mode = upstream.remote_snd_settle_mode
        client.rcv_settle_mode = upstream.remote_rcv_settle_mode
        limit = upstream.remote_max_message_size
        if client.is_receiver and self.config.max_message_size:
            limit = min(limit, self.config.max_message_size) if limit else self.config.max_message_size
        if limit:
            client.max_message_size = limit
        if upstream.remote_properties:
            client.properties = _relayable(upstream.remote_properties)
        answered = upstream.remote_target if upstream.is_sender else upstream.remote_source
        if answered.type == Terminus.UNSPECIFIED:
            client.open()
            return  # the broker's detach, with its reason, follows
        grouped = kept(upstream, "qf_kind") == _PROBE
        if grouped:
            # qpid-flow's own dispatch serves it, not the broker: the answer lists the
            # selector and the distribution mode qpid-flow applies, whatever the broker
            # echoed for its probe.
            filters = self._grouped_filters(client, upstream)
            if filters is None:
                return
            selector, applied = filters
            _answer_filters(client, applied)
            browser = client.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
            client.source.distribution_mode = Terminus.DIST_MODE_COPY if browser else Terminus.DIST_MODE_UNSPECIFIED
            if browser:
                client.snd_settle_mode = Link.SND_SETTLED  # copies, pre-settled, as standalone
        client.open()
        if client.is_receiver:
            target = upstream.remote_target
            if target.type == Terminus.COORDINATOR:
                client.flow(max(pn_link_credit(upstream._impl), 0))
                return
            # A dynamic target is named in the broker's answer.
            address = target.address if client.remote_target.dynamic else client.remote_target.address
            if not address:  # a broker that took a dynamic target must name the node
                self._end_pair(client, upstream, Condition("amqp:internal-error", "the broker named no node"))
                return
            destination = None
            if not self._node(address).by_subject:
                destination = self.destination_for(address)
                if destination is None:  # auto_create = false and no policy names it
                    self._end_pair(client, upstream, Condition("amqp:not-found", f"no destination {address!r}"))
                    return
                destination.at_broker = True
            # else (RabbitMQ's /queue) each message goes where its subject says: a link of
            # many destinations, held back per transfer as an anonymous-relay link is.
            producer = self._start_producer(client, destination, grant=False)
            sender = _UpstreamSender(upstream, address)
            upstream.qf_sender = sender
            self._producer_routes[producer.id] = _ProducerRoute(client, sender)
            self._grant(producer, client)  # none until the broker gives the upstream link some
        elif grouped:
            destination = self.destination_for(client.remote_source.address)
            if destination is not None:
                # The reader asks for the node as this consumer did, and the broker took:
                # RabbitMQ declares the queue a source names with the source's durability,
                # and refuses a non-durable ask for a durable queue.
                self.reader_durability[destination.address] = client.remote_source.durability
                destination.at_broker = True
                consumer = self._start_consumer(client, destination, selector, browser)
                # Credit the client gave while the broker was answering the probe.
                destination.credit_changed(consumer, pn_link_credit(client._impl))
                self.backend.demand_changed(destination)
        else:
            route: _ConsumerRoute | None = kept(client, "qf_route")
            if route is None:
                return  # the client went away while the broker was answering
            self._broker_has_answered(route)
            if route.destination is not None:
                route.consumer = Consumer(
                    route.destination.address,
                    _not_dispatched,
                    client.snd_settle_mode == Link.SND_SETTLED,
                    name=client.name,
                    connection_id=client.connection.qf_id,
                )
                route.destination.mirrored.add(route)
                route.destination.at_broker = True
            elif (address := client.remote_source.address) and not client.remote_source.dynamic:
                # A topic or exchange: no depth, but its consumers count (statistics).
                subscribed = self.destination_for(address)
                if subscribed is not None:
                    subscribed.subscribers += 1
                    route.subscribed = subscribed
            self._consumer_credit(route)

    def _grouped_filters(self, client: Link, upstream: Link) -> tuple[Selector | None, dict[Any, Any]] | None:
        """A grouped destination's consumer: the selector its source asks for, which
        qpid-flow's dispatch applies, and the filters in force; None when the selector is
        bad (the link is refused with amqp:invalid-field, whatever the broker said)."""
        try:
            return selector_in_force(client.remote_source)
        except SelectorError as exc:
            self._end_pair(client, upstream, Condition("amqp:invalid-field", f"bad selector: {exc}"))
            return None

    def _end_pair(self, client: Link, upstream: Link, condition: Condition) -> None:
        """Refuse a link the broker accepted: the client gets ``condition``, the broker a detach."""
        client.condition = condition
        client.close()
        upstream.close()
        log.info("link_refused", link=client.name, condition=condition.name, description=condition.description)

    # --- links: detach ----------------------------------------------------------------------

    def on_link_remote_close(self, event: Event) -> None:
        self._link_ended(event.link, closed=True)

    def on_link_remote_detach(self, event: Event) -> None:
        self._link_ended(event.link, closed=False)

    def _link_ended(self, link: Link, closed: bool) -> None:
        """One side detached or closed a link: the other side is told, and this side is
        answered when the other answers, with its mode (detach or close) and condition, as
        the client would have been answered directly."""
        peer: Link | None = kept(link, "qf_peer")
        from_broker = bool(kept(link.connection, "qf_upstream"))
        if from_broker and peer is None:
            self._relay_sender_ended(link, closed)
        self._link_gone(link)
        if peer is None or peer.state & Endpoint.LOCAL_CLOSED:
            # Nothing mirrored (a relay link), or this is the answer to our own end.
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.close() if closed else link.detach()
            return
        self._link_gone(peer)
        if peer.state & Endpoint.LOCAL_UNINIT:
            peer.open()
        peer.condition = link.remote_condition
        peer.close() if closed else peer.detach()
        if from_broker and link.remote_condition is not None:
            log.info(
                "link_closed_by_broker",
                connection=kept(link.connection, "qf_pair").id,
                link=link.name,
                condition=link.remote_condition.name,
                description=link.remote_condition.description,
            )

    def _link_gone(self, link: Link) -> None:
        """Forget a link of either side (idempotent)."""
        producer = kept(link, "qf_producer")
        if producer is not None:
            route = self._producer_routes.pop(producer.id, None)
            if route is not None:
                self._producer_route_gone(route)
        route = kept(link, "qf_route")
        if route is not None:
            link.qf_route = None
            self._consumer_route_gone(route)
        super()._link_gone(link)

    def _producer_route_gone(self, route: _ProducerRoute) -> None:
        """The client's producer link went: its transfers get no answer now; detach upstream.

        An anonymous-relay producer's transfers may still wait for their upstream sender's
        attach and credit: sent to the broker directly they would have reached it before
        the client's detach or close, so they still go (nobody to answer), and the sender
        detaches after them (:meth:`_linger_done`)."""
        pair: _Pair | None = kept(route.client.connection, "qf_pair")
        for sender in route.senders():
            # Nothing more goes on a link whose session the broker ended: what waits for it
            # is dropped now (it was counted until the client's connection closed).
            can_send = sender.link.state & _SENDING and not sender.link.session.state & Endpoint.REMOTE_CLOSED
            if route.upstream is None and sender.pending and pair is not None and can_send:
                self._fail_sender(sender, None, keep_pending=True)
                for message, _done in sender.pending:
                    message.origin = None  # its client link is gone
                sender.lingering_for = pair
                pair.lingering.add(sender)
                continue
            self._fail_sender(sender, None, broker_kept=not _ended_by_broker(sender.link))
            if sender.link.state & Endpoint.LOCAL_ACTIVE and route.upstream is None:
                sender.link.detach()

    def _linger_done(self, sender: _UpstreamSender) -> None:
        """A sender of a client that left has sent what waited (or cannot): detach it, and
        close the upstream connection once the client's close is due and none is left."""
        pair, sender.lingering_for = sender.lingering_for, None
        if sender.pending:
            self._fail_sender(sender, None)
        if sender.link.state & Endpoint.LOCAL_ACTIVE:
            sender.link.detach()
        if pair is None:
            return
        pair.lingering.discard(sender)
        self._end_if_done(sender.link.session)
        if not pair.lingering and pair.closing is not None:
            _close(pair.upstream, pair.closing[0])

    def _close_upstream(self, pair: _Pair, condition: Condition | None, container: Any) -> None:
        """The client left: its upstream connection closes too, once its lingering senders
        are done (at most ``_LINGER`` seconds)."""
        if not pair.lingering:
            _close(pair.upstream, condition)
            return
        if pair.closing is None:  # the first reason given stands (the client's close, say)
            pair.closing = (condition,)
            container.schedule(_LINGER, _LingerTimeout(self, pair))

    def _fail_sender(
        self,
        sender: _UpstreamSender,
        settlement: Settlement | None,
        keep_pending: bool = False,
        broker_kept: bool = True,
    ) -> None:
        """Outcomes for everything an upstream sender still carries (None: nobody to tell);
        ``keep_pending``: only for what it sent, what waits to be sent stays;
        ``broker_kept``: False when the broker ended the link, its session or its
        connection, which drops what it had not confirmed (RabbitMQ does)."""
        sent = [(message, done) for message, done, _ in sender.in_flight.values()]
        sender.in_flight.clear()
        unsent: list[tuple[Message, OutcomeCallback]] = []
        if not keep_pending:
            unsent = list(sender.pending)
            sender.pending.clear()
        failed = settlement or Settlement.released()
        # With nobody to tell (the client's link went), what was sent is the broker's: a
        # detach does not take back transfers it received, so they stay in the depth as if
        # accepted. (Released, they left it while the broker kept them: an undercount by a
        # window at every client that went with transfers in flight.) Unless the broker
        # ended the link: what it had not confirmed is gone, and counted as kept it would
        # stay in the depth for good; an undercount heals (the depth stops at 0).
        for message, done in sent:
            if settlement is None:
                message.origin = None  # its client link is gone
            done(message, _ACCEPTED if settlement is None and broker_kept else failed)
        for message, done in unsent:
            if settlement is None:
                message.origin = None
            done(message, failed)

    def _relay_sender_ended(self, link: Link, closed: bool) -> None:
        """The broker ended an upstream sender of an anonymous-relay producer."""
        sender: _UpstreamSender | None = kept(link, "qf_sender")
        if sender is None:
            return
        for route in self._producer_routes.values():
            if route.relays.get(sender.address) is sender:
                del route.relays[sender.address]
        condition = link.remote_condition
        self._fail_sender(
            sender,
            Settlement(
                Outcome.REJECTED,
                condition.name if condition else "amqp:not-found",
                condition.description if condition else f"the broker detached the link to {sender.address!r}",
            ),
        )
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close() if closed else link.detach()
        if sender.lingering_for is not None:
            self._linger_done(sender)

    def policy_applied(self, destinations: list[Destination]) -> None:
        """A policy change reached ``destinations``: consumers move to the reader when
        message groups are turned on, off it when they are turned off."""
        for destination in destinations:
            if destination.dispatched_by_plugin:
                self._reroute_to_reader(destination)
            else:
                self._reroute_to_broker(destination)

    def _reroute_to_reader(self, destination: Destination) -> None:
        """A destination that now hands its messages out itself (groups turned on) cannot
        leave consumers reading the broker's queue directly around it: two of them would
        hold one group's messages at once. Those are detached with
        ``amqp:link:detach-forced``; attaching again (clients do), they are served by
        qpid-flow's reader, one group to one consumer."""
        routes = [route for route in list(destination.mirrored) if isinstance(route, _ConsumerRoute)]
        if not routes:
            return
        for route in routes:
            self._link_gone(route.client)
            self._link_gone(route.upstream)
            if route.upstream.state & Endpoint.LOCAL_ACTIVE:
                route.upstream.close()  # the broker gets its unsettled messages back
            self._force_reattach(route.client, f"{destination.address!r} now has message groups (shared_groups)")
        log.info("consumers_rerouted", address=destination.address, consumers=len(routes))

    def _reroute_to_broker(self, destination: Destination) -> None:
        """The other way (groups turned off): the reader's consumers are detached alike, and
        come back reading the broker's queue directly; the reader, with no consumer left,
        gives the broker back what it fetched. (Those messages waited in qpid-flow for the
        reader's consumers, while new ones, reading the broker, got none of them.)"""
        address = destination.address
        links = [link for consumer, link in self._consumers.values() if consumer.address == address]
        if not links:
            # No consumer left, but the reader may still hold what it fetched (it waits for
            # the next consumer while the reader lingers): released now, in order, for the
            # consumers that read the broker's queue from now on.
            self.backend.consumer_detached(destination)
            return
        for link in links:
            self._link_gone(link)
            self._force_reattach(link, f"{address!r} no longer has message groups (shared_groups)")
        log.info("consumers_rerouted", address=address, consumers=len(links))

    @staticmethod
    def _force_reattach(link: Link, why: str) -> None:
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = Condition("amqp:link:detach-forced", f"{why}: attach again")
            link.close()

    def _broker_has_answered(self, route: _ConsumerRoute, accepted: bool = True) -> bool:
        """The broker answered ``route``'s attach (or the route went first); whether it was
        the last attach of its destination waiting, and one of them made the destination."""
        if not route.awaiting_broker or route.destination is None:
            return False
        route.awaiting_broker = False
        address = route.destination.address
        if accepted:
            self._made_for_attach.discard(address)  # the broker has the queue
        left = self._awaiting_broker.get(address, 1) - 1
        if left > 0:
            self._awaiting_broker[address] = left
            return False
        self._awaiting_broker.pop(address, None)
        if address in self._made_for_attach:
            self._made_for_attach.discard(address)
            return True
        return False

    def _consumer_route_gone(self, route: _ConsumerRoute) -> None:
        if route.awaiting_broker:
            # Gone before the broker accepted it (refused: no such queue, not allowed; or
            # the client left first). A destination made for such attaches, that nothing
            # else uses, goes when the last of them does: qpid-flow keeps no state for what
            # the broker refused (its statistics listed queues the broker does not have, and
            # the depth plugin asked the broker for each every 2 s until forgotten as idle).
            destination = route.destination
            if (
                self._broker_has_answered(route, accepted=False)
                and destination is not None
                and destination.unused
                and destination.address not in self.destinations.policies
                and self.destinations.find(destination.address) is destination
            ):
                self.destinations.delete(destination)
        if route.subscribed is not None:
            route.subscribed.subscribers -= 1
            route.subscribed = None
        if route.consumer is not None and route.destination is not None:
            route.destination.mirrored.discard(route)
            route.consumer = None
            if route.sent:
                route.destination.consumer_left_unsettled(_LeftUnsettled(route.upstream.session, len(route.sent)))
        # Unsettled upstream: the broker gets them back when the link's session ends.
        # Counted released, and told to plugins (the event log's settle, consumer null)
        # as a queue tells them.
        unframed = 0
        for delivery, _upstream, message in route.sent.values():
            unframed += max(delivery.pending, 0)  # never framed now (see reactor.Unwritten.stuck)
            self._counted_out(route, message, _RELEASED)
        if unframed and route.unwritten is not None:
            unwritten = route.unwritten
            unwritten.stuck += unframed
            unwritten.bytes = unwritten.bytes - unframed if unwritten.bytes > unframed else 0
        route.sent.clear()
        self._release_pending(route)

    @staticmethod
    def _release_pending(route: _ConsumerRoute) -> None:
        while route.pending:
            _data, delivery = route.pending.popleft()
            if not delivery.settled:
                delivery.settle_as(PN_RELEASED)

    # --- producers ------------------------------------------------------------------------

    def acl_name(self, address: str) -> str:
        node = self._node(address)
        return node.name if node.is_queue else address  # /queue/x and x are one queue

    def address_forms(self, name: str) -> tuple[str, ...]:
        return self.dialect.address_forms(name) if self.dialect is not None else (name,)

    def destination_for(self, address: str) -> Destination | None:
        return self.destinations.get(self._node(address).name)

    def relay_address(self, producer: Producer, data: bytes) -> str | None:
        """A relay's ``to``; or a named link's target that names no single queue
        (RabbitMQ's ``/queue``: see routed_address)."""
        route = self._producer_routes.get(producer.id)
        if route is not None and route.upstream is not None:
            return route.upstream.address
        return codec.to_address(data)

    def routed_address(self, address: str, data: bytes) -> str:
        """Where the broker routes a message to ``address`` by its subject (RabbitMQ's
        ``/queue``: the default exchange, routing key = subject), the subject's queue, when
        qpid-flow knows the broker has it (the broker took a link to it, a producer's, a
        consumer's or qpid-flow's reader's: RabbitMQ keeps a queue when its links go; a
        policy naming it does not say so): its depth and flow
        control then see the message, as they see one sent to ``/queue/SUBJECT``.
        Otherwise the address itself, uncounted: the broker drops a message it cannot
        route, and counted it would stay in a depth for good. The subject is a routing
        key, taken as written: ``/queue/X`` or ``a%2Fb`` name no queue there."""
        if not self._node(address).by_subject:
            return address
        subject = codec.properties_field(data, "subject")
        if isinstance(subject, str) and subject and "/" not in subject and "%2F" not in subject:
            queue = self.destinations.find(subject)
            # (Not a queue that stores nothing, as RabbitMQ's direct reply-to: no depth.)
            if queue is not None and queue.at_broker and self._node(subject).keeps_depth:
                return subject
        return address

    def _dialect_found(self, dialect: Dialect) -> Dialect:
        """The broker's dialect is known now. Addresses looked up before are forgotten
        (they were taken as given), and the configuration's policies named in an address
        form of the broker's (``/queue/orders``) move to the queue it stands for
        (``orders``), as a runtime policy change is named (``policy_name_mapped``): under
        the address form a policy matched no destination and made one of its own, which no
        producer ever reached. Patterns stay as written: from now on they match each
        address form of a name (``/queue/>`` every queue, and no topic)."""
        self.dialect = dialect
        self._nodes.clear()
        log.info("broker_dialect", dialect=dialect.name)
        registry = self.destinations
        self.access.address_forms = dialect.address_forms
        for name in list(registry.policies):
            node = dialect.node(name)
            if is_pattern(name) or not node.is_queue or node.name == name:
                continue
            policy = registry.policies.pop(name)
            stale = registry.find(name)
            if stale is not None:
                registry.delete(stale)  # made at start for the address form: nothing ever reached it
            if node.name in registry.policies:
                log.warning("policy_name_shadowed", given=name, name=node.name)  # the queue's own policy wins
                continue
            log.info("policy_name_mapped", given=name, name=node.name)
            registry.set_policy(node.name, policy)
            if not is_pattern(node.name):
                registry.get(node.name)  # a named destination exists once configured
        # Before the first client is routed: no consumer has a route a change could move.
        registry.use_dialect(dialect)
        return dialect

    def _node(self, address: str) -> Node:
        dialect = self.dialect
        if dialect is None and self._group_reader.dialect is not None:
            # No client has reached the broker yet, but qpid-flow's reader has: an
            # operator's /queue/X must name X before the first client connects.
            dialect = self._dialect_found(self._group_reader.dialect)
        node = self._nodes.get(address)
        if node is None:
            node = dialect.node(address) if dialect is not None else Node(address, True)
            if len(self._nodes) >= _NODE_CACHE_SIZE:
                self._nodes.clear()  # one-off addresses must not pile up
            self._nodes[address] = node
        return node

    def forward(self, destination: Destination, message: Message, done: OutcomeCallback) -> None:
        """Send an admitted transfer on its producer's upstream link (see _Backend)."""
        route = self._producer_routes.get(message.producer_id)  # type: ignore[arg-type]
        if route is None:
            # Its upstream is gone (the broker connection ended; the client's is about to
            # be closed or dropped): no outcome, as the broker's loss would give none
            # directly, so that the client resends it. Released would be taken as final.
            message.origin = None
            done(message, Settlement.released())
            return
        sender = route.upstream
        if sender is None:
            address = codec.to_address(message.data) or destination.address
            # Taken out and put back last: the relays are kept in order of last use.
            sender = route.relays.pop(address, None)
            if sender is None:
                self._trim_relays(route)
                sender = self._relay_sender(route.client, address)
            route.relays[address] = sender
        node = self._node(sender.address)
        # A message routed by its subject counts in the subject's queue (relay_address).
        counted = (node.is_queue and node.keeps_depth) or (node.by_subject and destination.address != sender.address)
        if counted:
            # It counts in the destination's depth from now on: it is on its way to the broker.
            destination.count_in(message)
        destination.in_flight += 1
        self.memory.add(message.size)

        def outcome(message: Message, settlement: Settlement) -> None:
            destination.in_flight -= 1
            self.memory.sub(message.size)
            if counted and settlement.outcome is not Outcome.ACCEPTED:
                destination.count_out(message)  # the broker did not take it
            done(message, settlement)

        sender.pending.append((message, outcome))
        self._pump(sender)

    def _join_transaction(self, link: Link, delivery: LeanDelivery, message: Message) -> bool:
        """The broker runs transactions (the client's coordinator link is mirrored to it):
        a transactional transfer goes upstream with the txn-id it names, for the broker to
        judge, on the same upstream connection as that coordinator."""
        state = delivery.proton().remote.data or []
        txn_id = state[0] if state else None
        if not isinstance(txn_id, (bytes, memoryview)):  # binary, as Proton hands it over
            return False
        message.relayed_txn = bytes(txn_id)
        return True

    def _trim_relays(self, route: _ProducerRoute) -> None:
        """Before another upstream sender of an anonymous-relay producer: at the cap, the
        least recently used one with nothing waiting or unanswered is detached (a reply-to
        server sending to one-off addresses held a link per address for its own life)."""
        if len(route.relays) < _RELAYS_PER_PRODUCER:
            return
        for address, sender in route.relays.items():
            if not sender.pending and not sender.in_flight:
                del route.relays[address]
                if sender.link.state & Endpoint.LOCAL_ACTIVE:
                    sender.link.detach()
                return

    def _relay_sender(self, client: Link, address: str) -> _UpstreamSender:
        session: Session = kept(client.session, "qf_peer")
        link = session.sender(f"{client.name}->{address}#{next(self._relay_tags)}")
        link.target.address = address
        link.snd_settle_mode = client.remote_snd_settle_mode
        keep_link(link)
        sender = _UpstreamSender(link, address)
        link.qf_sender = sender
        link.qf_upstream = True
        link.open()
        return sender

    def _pump(self, sender: _UpstreamSender) -> None:
        link = sender.link
        pending = sender.pending
        while pending and pn_link_credit(link._impl) > 0:
            message, done = pending.popleft()
            delivery = new_delivery(link, next(self._tags))
            send_transfer(link, message.data)
            if message.relayed_txn is not None:
                # Set before the transport writes the transfer: its state goes on that frame.
                full = delivery.proton()
                full.local.data = [message.relayed_txn]
                full.update(TRANSACTIONAL_STATE)
            if message.origin is None:
                delivery.settle()  # pre-settled by its producer: so it goes on
                done(message, _ACCEPTED)
            else:
                sender.in_flight[delivery._impl] = (message, done, delivery)
        if sender.lingering_for is not None and not pending:
            self._linger_done(sender)

    def _grant(self, producer: Any, link: Link, ask: bool = True) -> None:
        """As standalone, but never more than the broker gave the upstream link."""
        route = self._producer_routes.get(producer.id)
        if route is None or route.upstream is None:
            super()._grant(producer, link, ask)
            return
        if not self.accepting:
            return
        sender = route.upstream
        held = pn_link_credit(link._impl)
        room = pn_link_credit(sender.link._impl) - len(sender.pending) - held
        if room <= 0:
            return
        producer.credit = held
        if not ask and held * 2 > producer.last_grant:
            return
        destination = self.destinations.find(producer.address) if producer.address else None
        credit = self.hooks.producer_credit(producer=producer, destination=destination)
        if credit is CREDIT_AFTER_FAILURE:
            self._ask_credit_again_later(producer, link)  # as standalone
            return
        if credit:
            credit = min(credit, room)
            link.flow(credit)
            producer.credit += credit
            producer.last_grant = producer.credit

    def in_flight(self) -> int:
        return sum(
            len(sender.in_flight) + len(sender.pending)
            for route in self._producer_routes.values()
            for sender in route.senders()
        )

    # --- data path ------------------------------------------------------------------------

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if kept(link, "qf_upstream"):
            sender: _UpstreamSender | None = kept(link, "qf_sender")
            if sender is not None:
                self._pump(sender)
                client: Link | None = kept(link, "qf_peer")
                producer = kept(client, "qf_producer") if client is not None else None
                if producer is not None and client is not None:
                    self._grant(producer, client)
                return
            peer: Link | None = kept(link, "qf_peer")
            if peer is None:
                return
            if link.is_sender and peer.remote_target.type == Terminus.COORDINATOR:
                room = pn_link_credit(link._impl) - pn_link_credit(peer._impl)
                if room > 0:
                    peer.flow(room)
                return
            route: _ConsumerRoute | None = kept(link, "qf_route")
            if route is not None:
                self._upstream_credit_changed(route)
            return
        route = kept(link, "qf_route")
        if route is not None:
            self._consumer_credit(route)
            return
        super().on_link_flow(event)

    def _consumer_credit(self, route: _ConsumerRoute | None) -> None:
        """The client's credit changed: the broker gets what the client gave, less what
        waits here already; a drain goes upstream too."""
        if route is None:
            return
        self._send_pending(route)
        client = route.client
        upstream = route.upstream
        change = upstream_credit_change(
            pn_link_credit(client._impl), len(route.pending), pn_link_credit(upstream._impl)
        )
        if client.drain_mode and not route.draining:
            route.draining = True
            upstream.drain(change)
        elif change:
            upstream.flow(change)  # down too: a client may take back credit (AMQP 2.6.7)
        self._upstream_credit_changed(route)

    def _upstream_credit_changed(self, route: _ConsumerRoute) -> None:
        """A drain is answered once the broker has used or given back all its credit."""
        if route.draining and not route.pending and pn_link_credit(route.upstream._impl) <= 0:
            route.draining = False
            route.upstream.drain_mode = False
            if route.client.drain_mode:
                route.client.drained()

    def on_delivery(self, event: DeliveryEvent) -> None:
        link = event.link
        # The link's own mark, not its connection's: reaching the connection from a link
        # builds two Proton wrappers, and this runs for every delivery event.
        if kept(link, "qf_upstream"):
            if link.is_sender:
                self._broker_outcome(link, event)
            else:
                self._from_broker(link, event.delivery)
            return
        route: _ConsumerRoute | None = kept(link, "qf_route")
        if route is not None:
            self._client_outcome(route, event)
            return
        if link.is_receiver and kept(link, "qf_producer") is None:
            peer: Link | None = kept(link, "qf_peer")
            if peer is not None:
                if link.remote_target.type == Terminus.COORDINATOR:
                    self._relay_coordinator(link, peer, event.delivery)
                else:
                    self._transfer_before_answer(link, peer, event.delivery)
                return
        super().on_delivery(event)

    def _broker_outcome(self, link: Link, event: DeliveryEvent) -> None:
        sender: _UpstreamSender | None = kept(link, "qf_sender")
        if sender is None:
            # A coordinator link: the broker's states (declared, discharged) go back as they came.
            sent = kept(link, "qf_coordinator")
            if sent is not None and event.impl in sent:
                upstream, client_delivery = sent[event.impl]
                relay_state(upstream, client_delivery)
                if upstream.settled:
                    del sent[event.impl]
            return
        found = sender.in_flight.get(event.impl)
        if found is None:
            return
        message, done, delivery = found
        settlement = remote_settlement(delivery)
        if settlement is None:
            return
        del sender.in_flight[event.impl]
        delivery.settle()
        done(message, settlement)

    def _from_broker(self, link: Link, delivery: LeanDelivery) -> None:
        if delivery.aborted:
            delivery.settle()
            # It used the broker's credit and not the client's: the broker is given it back.
            self._consumer_credit(kept(link, "qf_route"))
            return
        if not delivery.readable or delivery.partial:
            return
        data = take_transfer(link, delivery.pending)
        route: _ConsumerRoute | None = kept(link, "qf_route")
        if route is None:
            delivery.settle_as(PN_RELEASED)
            return
        route.pending.append((data, delivery))
        self._send_pending(route)
        self._upstream_credit_changed(route)

    def _send_pending(self, route: _ConsumerRoute) -> None:
        client = route.client
        pending = route.pending
        observed = self._observed
        while pending and pn_link_credit(client._impl) > 0:
            data, upstream = pending.popleft()
            route.delivered += 1
            if route.destination is not None:
                route.destination.delivered_total += 1
            delivery = new_delivery(client, next(self._tags))
            send_transfer(client, data)
            if route.unwritten is not None:
                route.unwritten.bytes += len(data)
            message = self._observe_delivery(route, data) if observed else None
            if upstream.settled:
                delivery.settle()  # the broker sent it settled: at-most-once, end to end
                upstream.settle()
                self._counted_out(route, message, _ACCEPTED)
            else:
                route.sent[delivery._impl] = (delivery, upstream, message)

    def _observe_delivery(self, route: _ConsumerRoute, data: bytes) -> Message | None:
        """Tell plugins (the event log) what a mirrored consumer got, as a queue would."""
        destination = route.destination
        consumer = route.consumer
        if destination is None or consumer is None:
            return None
        message = Message(data, destination.address)
        # As the broker's header tells: 1 the first time, more once it delivered it before.
        try:
            message.delivery_count = 1 + codec.earlier_deliveries(data)
        except codec.MalformedMessage:
            message.delivery_count = 1
        self.hooks.message_enqueued(destination=destination, message=message)
        self.hooks.message_delivered(destination=destination, message=message, consumer=consumer)
        return message

    def _client_outcome(self, route: _ConsumerRoute, event: DeliveryEvent) -> None:
        entry = route.sent.get(event.impl)
        if entry is None:
            self.not_sent_here(event)  # a late outcome, or the client's transfer on its receiving link
            return
        delivery, upstream, message = entry
        # An outcome the client left unsettled, which the broker settles at once: settled
        # upstream with it, and answered settled, as the broker answers it directly.
        settle_now = (
            not delivery.settled
            and is_terminal(delivery.remote_state)
            and not (self.dialect or PLAIN).takes_unsettled_outcomes
        )
        settlement = relay_state(delivery, upstream, settle=True if settle_now else None)
        if delivery.settled or settle_now:
            del route.sent[event.impl]
            without_outcome = not delivery.remote_state
            if settle_now:
                relay_state(delivery, delivery, settle=True)  # its own outcome back, settled
            else:
                delivery.settle()
            if settlement is not None:
                if without_outcome and not (self.dialect or PLAIN).settling_without_outcome_removes:
                    # Relayed as it came; the broker applies its own default outcome, which
                    # keeps the message (RabbitMQ's: released).
                    settlement = _RELEASED
                self._counted_out(route, message, settlement)

    def _counted_out(self, route: _ConsumerRoute, message: Message | None, settlement: Settlement) -> None:
        """A mirrored consumer settled a message: it leaves the queue's depth (accepted,
        rejected) or goes back to the broker (released, modified)."""
        destination = route.destination
        if destination is None:
            return
        destination.count_settled(settlement.outcome)
        destination.settled_at_broker(message, route.consumer, settlement)

    def _transfer_before_answer(self, link: Link, upstream: Link, delivery: LeanDelivery) -> None:
        """A producer sent before the broker answered its attach: qpid-flow had given it no
        credit, so the transfer is beyond it, and the link ends as any producer's does
        (``Router._transfer_beyond_credit``). Relayed as they came, such transfers went to
        the broker past flow control, the operator's stop, the size limit and the plugins,
        and the client never got their outcome."""
        delivery.settle()
        if link.state & Endpoint.LOCAL_CLOSED:
            return
        log.warning("transfer_beyond_credit", connection=link.connection.qf_id, link=link.name)
        condition = Condition("amqp:link:transfer-limit-exceeded", "a transfer was sent with no link credit")
        self._end_both(link, upstream, condition, null_target=True)

    def _end_both(self, link: Link, upstream: Link, condition: Condition, null_target: bool = False) -> None:
        """End a client's link (with ``condition``) and its mirror upstream, before the
        broker's answer was relayed: the client's link is answered first if it was not
        (``null_target``: with no target, as no node was attached for it, AMQP 1.0 2.6.3)."""
        self._link_gone(link)
        self._link_gone(upstream)
        if upstream.state & Endpoint.LOCAL_ACTIVE:
            upstream.close()
        if link.state & Endpoint.LOCAL_UNINIT:
            if null_target:
                link.source.copy(link.remote_source)
                link.target.type = Terminus.UNSPECIFIED
            link.open()
        link.condition = condition
        link.close()

    def _relay_coordinator(self, link: Link, upstream: Link, delivery: LeanDelivery) -> None:
        """A transaction coordinator's transfer (declare, discharge) goes to the broker as is."""
        if delivery.aborted:
            delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            if delivery.pending > CONTROL_MESSAGE_LIMIT and not link.state & Endpoint.LOCAL_CLOSED:
                # A control message is a few dozen bytes: one that grows without end would
                # be held here whole (a client streamed 1 GB into qpid-flow's memory).
                delivery.settle()
                limit = f"a transaction control message is at most {CONTROL_MESSAGE_LIMIT} bytes"
                self._end_both(link, upstream, Condition("amqp:link:message-size-exceeded", limit))
            return
        data = take_transfer(link, delivery.pending)
        sent = new_delivery(upstream, next(self._tags))
        send_transfer(upstream, data)
        states = kept(upstream, "qf_coordinator")
        if states is None:
            states = upstream.qf_coordinator = {}
        states[sent._impl] = (sent, delivery)

    # --- shutdown -------------------------------------------------------------------------

    def close_connections(self, description: str) -> None:
        for pair in list(self.pairs):
            _close(pair.upstream, None)
        super().close_connections(description)


_KEPT = ("qf_peer", "qf_route", "qf_sender", "qf_producer", "qf_consumer", "qf_kind", "qf_coordinator", "qf_waiting")


def _forget_endpoints(conn: Connection) -> None:
    """Drop what qpid-flow kept on a connection whose transport has ended (it has no more
    events), and on its sessions and links.

    The two ends of a pair refer to each other through Proton's records (a link's peer,
    the pair of a connection): cycles through C objects that Python's collector cannot
    see, which would keep every closed pair in memory."""
    link = conn.link_head(0)
    while link is not None:
        for name in _KEPT:
            if kept(link, name) is not None:
                setattr(link, name, None)
        link = link.next(0)
    session = conn.session_head(0)
    while session is not None:
        for name in ("qf_peer", "qf_waiting", "qf_refusals"):
            if kept(session, name) is not None:
                setattr(session, name, None)
        session = session.next(0)
    conn.qf_pair = None


def _not_dispatched(_consumer: Consumer, _message: Message) -> None:
    """A mirrored consumer's messages come from the broker, never from a destination."""
    raise AssertionError("a mirrored consumer was handed a message by its destination")


def _close(endpoint: Any, condition: Condition | None) -> None:
    if endpoint.state & Endpoint.LOCAL_CLOSED:
        return
    if endpoint.state & Endpoint.LOCAL_UNINIT:
        endpoint.open()
    if condition is not None:
        endpoint.condition = condition
    endpoint.close()


def _silent(transport: Transport | None) -> bool:
    """Whether Proton ended ``transport`` because its peer sent nothing for its idle
    timeout (its own "local-idle-timeout expired" error)."""
    condition = transport.condition if transport is not None else None
    return condition is not None and condition.description == "local-idle-timeout expired"


def _asking_for(idle_timeout: float) -> float:
    """The local idle timeout that makes Proton's open frame say ``idle_timeout``: Proton
    advertises half of its own (and drops a peer silent for the whole of it), so copying
    the other side's value as it is would halve it at every hop."""
    return 2 * idle_timeout


def _relayable(properties: Any) -> Any:
    """Connection or link properties as they can be encoded again for the other side: the
    entries that hold an array are left out (logged), the others go. Proton decodes a
    malformed array (one that lies about its count) into an object whose encoding crashes
    the process (found by fuzzing), and telling a well-formed one from it is not possible
    from Python; a client's other properties (product, version) must not go with it."""
    if not _holds_array(properties):
        return properties
    if not isinstance(properties, dict):
        return None  # not a map at all (properties are fields): nothing to keep
    kept_entries = {}
    for key, value in properties.items():
        if _holds_array(key) or _holds_array(value):
            log.info("properties_array_dropped", key=str(key))
        else:
            kept_entries[key] = value
    return kept_entries or None


def _holds_array(value: Any) -> bool:
    if isinstance(value, Array):
        return True
    if isinstance(value, dict):
        return any(_holds_array(k) or _holds_array(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_array(v) for v in value)
    described = getattr(value, "value", None)
    return described is not None and described is not value and _holds_array(described)


def _offered(conn: Connection) -> list[str]:
    """The capabilities ``conn``'s peer offered in its open; none when they are not symbols
    (a client's are refused then, see ``refuse_bad_capabilities``; a broker's are dropped)."""
    return list(peer_capabilities(pn_connection_remote_offered_capabilities(conn._impl)) or ())


def _desired(conn: Connection) -> list[str]:
    """As :func:`_offered`, for the desired capabilities."""
    return list(peer_capabilities(pn_connection_remote_desired_capabilities(conn._impl)) or ())


def _symbols(symbols: list[str]) -> SymbolList | None:
    return SymbolList(symbols) if symbols else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


_DEFAULT_VHOST = "/"


def _vhost_selected_by(hostname: str | None) -> str:
    """The vhost an open's hostname selects at RabbitMQ: ``vhost:NAME``, else the default."""
    if hostname and hostname.startswith("vhost:"):
        return hostname[len("vhost:") :] or _DEFAULT_VHOST
    return _DEFAULT_VHOST


def _copy_terminus(local: Terminus, remote: Terminus, producer: bool) -> None:
    """``remote`` into ``local``. A producer's source has no address: Proton then takes it
    for no source at all (its outcomes and capabilities are kept, its type is not) and
    would send none on. Producer links are given one, as clients send it (and as RabbitMQ
    answers it)."""
    local.copy(remote)
    if producer and local.type == Terminus.UNSPECIFIED:
        local.type = Terminus.SOURCE


def upstream_credit_change(client_credit: int, pending: int, upstream_credit: int) -> int:
    """What to add to a consumer's upstream link's credit (negative: to take away), so that
    the broker has what the client gave, less what waits here for the client already: no
    more (a client that lowers its credit lowers the broker's, or the broker would send
    qpid-flow messages that other consumers could have had), and never below 0. RabbitMQ
    sends beyond the credit it was given, so the upstream credit can be negative; adding to
    it only what the client's credit came to then (less than what the broker had sent
    over) sent the broker a negative link-credit, which goes out as an unsigned number near
    2^32: the broker pushed qpid-flow its whole queue. Raising it to 0 tells the broker to
    stop."""
    return max(client_credit - pending, 0) - upstream_credit


def _ended_by_broker(link: Link) -> bool:
    """Whether the broker ended ``link``, its session or its connection, or the connection
    to it is lost (rather than qpid-flow ending the link, for a client that left). What
    the broker had not confirmed may then never have reached it: a broker that stopped
    answering (hung) left the transfers qpid-flow had sent in buffers that died with the
    connection, and counted as kept they stayed in the depth for good (15 messages with
    the broker's queue empty, after two hangs)."""
    remote_closed = Endpoint.REMOTE_CLOSED
    connection = link.connection
    transport = connection.transport
    return bool(
        link.state & remote_closed
        or link.session.state & remote_closed
        or connection.state & remote_closed
        or transport is None
        or transport.closed
    )


class _SessionLingerTimeout(Handler):
    """The lingering senders on a session the client ended had ``_LINGER`` seconds: the
    upstream session ends now, whatever still waits (dropped)."""

    def __init__(self, router: BrokerRouter, session: Session) -> None:
        super().__init__()
        self._router = router
        self._session = session

    def on_timer_task(self, _event: Any) -> None:
        for sender in self._router._lingering_on(self._session):
            self._router._linger_done(sender)
        self._router._end_if_done(self._session)


class _LingerTimeout(Handler):
    """The lingering senders of a client that left had ``_LINGER`` seconds: the upstream
    connection closes now, whatever still waits (dropped, as on the broker's loss)."""

    def __init__(self, router: BrokerRouter, pair: _Pair) -> None:
        super().__init__()
        self._router = router
        self._pair = pair

    def on_timer_task(self, _event: Any) -> None:
        for sender in list(self._pair.lingering):
            self._router._linger_done(sender)
        if self._pair.closing is not None:
            _close(self._pair.upstream, self._pair.closing[0])
