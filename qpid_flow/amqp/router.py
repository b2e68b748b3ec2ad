"""The Proton handler for client connections: the data path, top to bottom.

Each event is translated into a call on a destination, the backend or a hook, and the
answer is applied to Proton (credit with ``link.flow``, outcomes with
``delivery.update`` + ``settle``). Decisions live in the policies; state lives in the
destinations; this module only connects them to the wire.

A bare :class:`proton.Handler` (not ``MessagingHandler``): qpid-flow owns credit and
settlement on every link, and the messaging layer's conveniences cost time per message.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog
from cproton import (
    ffi,
    pn_connection_remote_desired_capabilities,
    pn_connection_remote_offered_capabilities,
    pn_link_credit,
    pn_link_current,
)
from proton import (
    UNDESCRIBED,
    Array,
    Condition,
    Data,
    Endpoint,
    Handler,
    Link,
    ProtonException,
    SymbolList,
    Terminus,
    symbol,
)

from qpid_flow import __version__, codec
from qpid_flow.amqp.coordinator import Coordinator
from qpid_flow.amqp.endpoints import (
    DeliveryEvent,
    LeanDelivery,
    delivery_tags,
    keep_link,
    kept,
    new_delivery,
    send_transfer,
    take_transfer,
    take_transfer_part,
)
from qpid_flow.amqp.guard import contain_errors
from qpid_flow.amqp.messages import with_message_annotations
from qpid_flow.amqp.outcomes import TRANSACTIONAL_STATE, apply_settlement, apply_transactional, remote_settlement
from qpid_flow.amqp.timers import Call
from qpid_flow.config import is_pattern
from qpid_flow.core.credit import window_need
from qpid_flow.core.jms_selector import (
    SELECTOR_FILTER_CODE,
    SELECTOR_FILTER_NAME,
    Selector,
    SelectorError,
    parse_selector,
)
from qpid_flow.core.memory import MemoryMeter
from qpid_flow.core.model import Admit, Consumer, Hold, Message, Outcome, Producer, Reject, Settlement
from qpid_flow.core.transactions import UNKNOWN_ID, Transaction, settlement_from_outcome
from qpid_flow.plugin.manager import CREDIT_AFTER_FAILURE
from qpid_flow.security.access import ANONYMOUS_USER, AccessPolicy, ConnectionLimits, Direction

if TYPE_CHECKING:
    from proton import Connection, Event, Session

    from qpid_flow.config import RouterConfig
    from qpid_flow.core.backend import Backend
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.registry import Destinations
    from qpid_flow.plugin.manager import Hooks

__all__ = ["Router"]

log = structlog.get_logger(__name__)

_EXPIRED_WHILE_HELD = Settlement(
    Outcome.ACCEPTED, "qpid-flow:expired", "its time to live ran out while flow control held it"
)

ANONYMOUS_RELAY = "ANONYMOUS-RELAY"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
UNAUTHORIZED = "amqp:unauthorized-access"
FRAMING_ERROR = "amqp:connection:framing-error"
ILLEGAL_STATE = "amqp:illegal-state"
INVALID_FIELD = "amqp:invalid-field"
# How a client's connection is closed at shutdown, and any that opens after it began: as
# RabbitMQ, Artemis and qpidd close theirs (a client reconnects, to this or another).
FORCED = "amqp:connection:forced"
SHUTTING_DOWN = "qpid-flow is shutting down"
_NULL = ffi.NULL
_connection_ids = itertools.count(1)
# What a transfer gets when others to its address are held (whatever a policy answered,
# short of a rejection): it joins the end of that line.
_BEHIND_HELD = Hold("behind the transfers held for this address")
# After the credit policy failed for a link: the pause before it is asked again, in
# seconds, doubled at each failure in a row up to the longest.
CREDIT_RETRY_FIRST = 1.0
CREDIT_RETRY_LONGEST = 30.0


class _CreditRetry:
    """A producer link whose credit policy failed (kept on the link): the pause before the
    policy is asked again, and whether that is scheduled already."""

    __slots__ = ("delay", "pending")

    def __init__(self, delay: float, pending: bool) -> None:
        self.delay = delay
        self.pending = pending


@contain_errors
class Router(Handler):
    """Handles every client connection accepted by the listener."""

    # Whether qpid-flow judges a message's encoding (standalone: it is the broker); in
    # front of a broker, the broker does.
    judges_messages = True

    def __init__(
        self,
        config: RouterConfig,
        hooks: Hooks,
        destinations: Destinations,
        backend: Backend,
        memory: MemoryMeter | None = None,
    ) -> None:
        super().__init__()
        self.memory = memory or MemoryMeter()
        self.config = config
        self.hooks = hooks
        self.destinations = destinations
        self.backend = backend
        self.accepting = True  # False once shutdown began: no new credit
        self._max_message_size = config.max_message_size
        self._producers: dict[int, tuple[Producer, Link]] = {}
        # Per producer link (by id), the message arriving in several transfers, under
        # memory_limit (a link carries one at a time): see _part_arrived.
        self._arriving: dict[int, _Arriving] = {}
        self._consumers: dict[int, tuple[Consumer, Link]] = {}
        # Per consumer, its unsettled deliveries by C delivery (what a delivery event
        # carries): the wrapper, kept so the C delivery lives as long as the entry, and
        # the message.
        self._sent: dict[int, dict[Any, tuple[LeanDelivery, Message]]] = {}
        # Transfers a policy holds unforwarded (Hold), per address, in arrival order.
        self._held: dict[str, list[Message]] = {}
        # Transfers whose outcome is known but whose producer must wait for it
        # (qpid_flow_settlement_delay), per address, in order.
        self._delayed: dict[str, list[tuple[Message, Settlement]]] = {}
        self._tags = delivery_tags()
        self.connections: set[Connection] = set()
        self.container_id = "qpid-flow"  # the server's set it to its own (host and pid)
        self.access = AccessPolicy(config.acl)
        self.limits = ConnectionLimits(config.max_connections, config.max_connections_per_user)
        self.coordinator = Coordinator(self)
        # Temporary destinations made for a dynamic target: address -> the producer link
        # that made it, whose detach deletes it (the node lives as long as its link).
        self._dynamic_targets: dict[str, int] = {}
        # Temporary queues made for a dynamic source: address -> the consumer that made it,
        # whose detach deletes it, and whose connection alone may consume from it (JMS: a
        # temporary queue is its connection's; ActiveMQ refuses a "remote temporary
        # destination").
        self._dynamic_sources: dict[str, Consumer] = {}

    # --- connections ----------------------------------------------------------------------

    def client_opened(self, conn: Connection, user: str, peer: tuple[str, int]) -> None:
        """The gate signed a client in (SASL done): its AMQP open comes next."""
        conn.qf_user = user
        conn.qf_remote = f"{peer[0]}:{peer[1]}"

    def on_connection_remote_open(self, event: Event) -> None:
        conn = event.connection
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.qf_id = f"c{next(_connection_ids)}"
            # What a broker says of itself: clients and test suites (qpid-interop-test) log it.
            conn.container = self.container_id
            conn.properties = {symbol("product"): "qpid-flow", symbol("version"): __version__}
            conn.offered_capabilities = SymbolList([ANONYMOUS_RELAY])
            if self.refuse_bad_capabilities(conn) or self._container_id_taken(conn):
                return
            conn.open()
            if not self.admit_connection(conn):
                return
            self.connections.add(conn)
            conn.qf_opened = time.time()
            log.info(
                "connection_opened",
                connection=conn.qf_id,
                remote=str(conn.url or ""),
                container=conn.remote_container,
                user=user_of(conn),
            )

    def _container_id_taken(self, conn: Connection) -> bool:
        """A connection asking to be the sole one of its container id (JMS's client id:
        qpid-jms asks ``sole-connection-for-container``), while another connection of that
        id is open, or one that asked so is: refused as ActiveMQ, Artemis and Broker-J
        refuse it (the open says it failed, then a close with ``amqp:invalid-field``, info
        ``invalid-field: container-id``), which qpid-jms reports as InvalidClientIDException.
        True if refused."""
        container = conn.remote_container
        if not container:
            return False
        asks = _asks_sole_connection(conn)
        for other in self.connections:
            if other.remote_container != container or other.state & Endpoint.LOCAL_CLOSED:
                continue
            if asks or _asks_sole_connection(other):
                break
        else:
            return False
        conn.properties = {**(conn.properties or {}), symbol("amqp:connection-establishment-failed"): True}
        conn.open()
        conn.condition = Condition(
            "amqp:invalid-field",
            f"container id {container!r} is in use by another connection (sole-connection-for-container)",
            {symbol("invalid-field"): symbol("container-id")},
        )
        conn.close()
        log.warning("connection_refused", remote=str(conn.url or ""), container=container, reason="container id in use")
        return True

    def refuse_bad_capabilities(self, conn: Connection) -> bool:
        """Refuse a client's open whose offered or desired capabilities are not what AMQP
        types them (a symbol, or an array of symbols): closed with ``amqp:invalid-field``
        naming the field, as a refused open (a ulong there failed qpid-flow's handler,
        which closed the connection with amqp:internal-error). True if refused."""
        field = _bad_capabilities(conn)
        if field is None:
            return False
        conn.properties = {**(conn.properties or {}), symbol("amqp:connection-establishment-failed"): True}
        self.close_for_error(
            conn,
            Condition(
                INVALID_FIELD,
                f"{field} must be a symbol or an array of symbols",
                {symbol("invalid-field"): symbol(field)},
            ),
        )
        return True

    def close_for_error(self, conn: Connection, condition: Condition) -> None:
        """Close a client's connection for the client's own error (a frame out of place or
        of the wrong role, a field AMQP does not allow, a limit it kept going past), logged
        once as ``connection_error``, and read nothing more from it, as Proton does for the
        errors it finds itself: what the client keeps sending (a flood of begins or of
        transfers) is not taken into memory while it has not heard. Its open is answered
        first if it was not: a close needs an open before it."""
        if conn.state & Endpoint.LOCAL_CLOSED:
            return
        log.warning(
            "connection_error",
            connection=kept(conn, "qf_id"),
            remote=kept(conn, "qf_remote"),
            condition=condition.name,
            description=condition.description,
        )
        self._connection_gone(conn)
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.container = self.container_id
            conn.open()
        conn.condition = condition
        conn.close()
        transport = conn.transport
        if transport is not None:
            conn.qf_hung_up = True  # the end of input below is no error of the client's (on_transport_error)
            # Ending the input makes Proton close with the transport's condition, unless the
            # close frame is out: it is made now (pending). Proton holds a close back until
            # the peer's open has come, though: to a client that sent none, the close goes
            # with this condition ("(connection aborted)" added to its description).
            transport.condition = condition
            transport.pending()
            transport.close_tail()

    def ignores_frames_of(self, conn: Connection, frame: str) -> bool:
        """Whether a client's begin or attach (``frame``) goes unanswered: qpid-flow closed its
        connection (what the client sent before it heard is dropped); or the client sent it
        before its open, which AMQP requires first (1.0 2.4.1), and its connection is closed
        now with ``amqp:connection:framing-error``. (Such a begin was answered as if the open
        had come, and the attach after it failed qpid-flow's handler.)"""
        state = conn.state
        if state & Endpoint.LOCAL_CLOSED:
            return True
        if state & Endpoint.REMOTE_UNINIT:
            description = f"{frame} before open: the open must be the first frame (AMQP 1.0 2.4.1)"
            self.close_for_error(conn, Condition(FRAMING_ERROR, description))
            return True
        return False

    def admit_connection(self, conn: Connection) -> bool:
        """Count a client connection in; over a limit, or once shutdown began (a client
        still in its handshake then), close it (after its open) and say no."""
        user = user_of(conn)
        refusal, condition = (self.limits.admit(user), RESOURCE_LIMIT) if self.accepting else (SHUTTING_DOWN, FORCED)
        if refusal is None:
            conn.qf_admitted = True
            return True
        log.warning("connection_refused", remote=str(conn.url or ""), user=user, reason=refusal)
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.open()
        conn.condition = Condition(condition, refusal)
        conn.close()
        return False

    def on_session_remote_open(self, event: Event) -> None:
        session = event.session
        if self.ignores_frames_of(session.connection, "begin"):
            return
        if session.state & Endpoint.LOCAL_UNINIT and not self.refuse_session_over_limit(session):
            session.open()

    # max_sessions_per_connection and max_links_per_connection are counted per connection
    # (``qf_sessions``, ``qf_links``), a session or link counted in carrying ``qf_counted``
    # until either side ends it: a begin or attach costs the same however many came before.
    # (Each walked every session or link of its connection, refused ones included: 10,000
    # begins took 172 s to answer, and every other client waited as long.) A refused one
    # stays in memory until the client ends it, so refused ones the client has not ended are
    # counted too (``qf_sessions_refused``, ``qf_links_refused``, each carrying
    # ``qf_refused``): more of them than the limit itself, and the connection is closed with
    # amqp:resource-limit-exceeded.

    def refuse_session_over_limit(self, session: Session) -> bool:
        """Count a client's session in, or end it past max_sessions_per_connection (or close
        the connection, see above); True if it was ended."""
        limit = self.config.max_sessions_per_connection
        counted = _count_in(session.connection, session, "sessions", limit)
        if counted:
            return False
        description = f"session limit reached (max_sessions_per_connection = {limit})"
        if counted is None:
            self.close_for_error(session.connection, _too_many_refused("sessions", "ended", limit))
            return True
        log.warning("session_refused", connection=kept(session.connection, "qf_id"), reason=description)
        session.open()
        session.condition = Condition(RESOURCE_LIMIT, description)
        session.close()
        return True

    def refuse_link_over_limit(self, link: Link) -> bool:
        """Count a client's link in, or detach it past max_links_per_connection (or close the
        connection, see above); True if it was refused."""
        limit = self.config.max_links_per_connection
        counted = _count_in(link.connection, link, "links", limit)
        if counted:
            return False
        if counted is None:
            self.close_for_error(link.connection, _too_many_refused("links", "detached", limit))
            return True
        self._refuse_link(link, RESOURCE_LIMIT, f"link limit reached (max_links_per_connection = {limit})")
        return True

    @staticmethod
    def _uncount_session(session: Session, by_client: bool) -> None:
        """A session ended, by the client or by qpid-flow: its place under
        max_sessions_per_connection is free; a refused one counts no more once the client
        ended it."""
        _count_out(session.connection, session, "sessions", by_client)

    @staticmethod
    def _uncount_link(link: Link, by_client: bool) -> None:
        """A link ended (as :meth:`_uncount_session`, for max_links_per_connection)."""
        _count_out(link.connection, link, "links", by_client)

    def on_session_local_close(self, event: Event) -> None:
        self._uncount_session(event.session, by_client=False)

    def on_link_local_close(self, event: Event) -> None:
        self._uncount_link(event.link, by_client=False)

    def on_link_local_detach(self, event: Event) -> None:
        self._uncount_link(event.link, by_client=False)

    def acl_name(self, address: str) -> str:
        """The name ``[[acl]]`` patterns are matched against for ``address``."""
        return address

    def destination_name(self, address: str) -> str:
        """The destination name ``address`` stands for, as policies, ACLs and statistics
        name it: the address itself standalone; in front of a broker, as the broker reads
        it (RabbitMQ's ``/queue/X`` is ``X``). A pattern stays as written: it matches
        every address form of a name (:meth:`address_forms`)."""
        return address if is_pattern(address) else self.acl_name(address)

    def address_forms(self, name: str) -> tuple[str, ...]:
        """Every address that names destination ``name``, ``name`` first: standalone, the
        name alone; in front of RabbitMQ, queue ``X`` is also ``/queue/X`` and ``/amq/queue/X``."""
        return (name,)

    def refuse_unauthorized_link(self, link: Link, direction: Direction, address: str) -> bool:
        """Refuse an attach the ACL does not allow; True if it was refused."""
        user = user_of(link.connection)
        if self.access.allows(user, direction, self.acl_name(address)):
            return False
        self._refuse_link(link, UNAUTHORIZED, _not_allowed(user, direction, address))
        return True

    def on_session_remote_close(self, event: Event) -> None:
        session = event.session
        self._uncount_session(session, by_client=True)
        link = session.connection.link_head(0)
        while link is not None:
            if link.session == session:
                self._link_gone(link)
            link = link.next(0)
        if session.state & Endpoint.LOCAL_ACTIVE:
            session.close()

    def on_connection_remote_close(self, event: Event) -> None:
        conn = event.connection
        self._connection_gone(conn)
        if conn.state & Endpoint.LOCAL_ACTIVE:
            conn.close()

    def on_transport_error(self, event: Event) -> None:
        condition = event.transport.condition
        conn = event.connection
        if conn is not None and kept(conn, "qf_hung_up"):
            return  # qpid-flow closed it for the client's error and stopped reading: logged then
        log.warning(
            "connection_error",
            connection=getattr(conn, "qf_id", None) if conn else None,
            condition=condition.name if condition else None,
            description=condition.description if condition else None,
        )

    def on_transport_closed(self, event: Event) -> None:
        conn = event.connection
        if conn is not None:
            self._connection_gone(conn)

    def _connection_gone(self, conn: Connection) -> None:
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        if kept(conn, "qf_admitted"):
            conn.qf_admitted = False
            self.limits.release(user_of(conn))
        # Coordinator links last: the rollback of a transaction left open gives messages
        # back and dispatches them, and a consumer of this connection, not gone yet, still
        # had credit: it was sent them again, then released them a second time (delivery
        # count 2 and delivered 5 for 3 messages, as the links happened to be attached).
        coordinators = []
        link = conn.link_head(0)
        while link is not None:
            if kept(link, "qf_coordinator"):
                coordinators.append(link)
            else:
                self._link_gone(link)
            link = link.next(0)
        for link in coordinators:
            self._link_gone(link)
        log.info("connection_closed", connection=getattr(conn, "qf_id", None))

    # --- links --------------------------------------------------------------------------

    def on_link_remote_open(self, event: Event) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT or link.session.state & Endpoint.LOCAL_CLOSED:
            return  # answered already, or on a session qpid-flow refused (its end answers it)
        if self.ignores_frames_of(link.connection, "attach") or self.refuse_link_over_limit(link):
            return
        if link.is_receiver:
            self._attach_producer(link)
        else:
            self._attach_consumer(link)

    def on_link_remote_close(self, event: Event) -> None:
        self._link_gone(event.link)
        if event.link.state & Endpoint.LOCAL_ACTIVE:
            event.link.close()

    def on_link_remote_detach(self, event: Event) -> None:
        self._link_gone(event.link)
        if event.link.state & Endpoint.LOCAL_ACTIVE:
            event.link.detach()

    def _refuse_link(self, link: Link, condition: str, description: str) -> None:
        """Answer an attach with the terminus qpid-flow did not make left null, then detach
        with ``condition`` (AMQP 1.0 2.6.3): a client tells a refusal from a link that
        opened by that null. qpid-jms does; echoing the terminus made its createConsumer and
        createProducer succeed on an unknown queue, a bad selector or a refused ACL."""
        if link.is_sender:  # the client's consumer: the source is qpid-flow's
            link.source.type = Terminus.UNSPECIFIED  # encoded as null
            link.target.copy(link.remote_target)
        else:  # the client's producer: the target is qpid-flow's
            link.source.copy(link.remote_source)
            link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = Condition(condition, description)
        link.close()
        log.info("link_refused", link=link.name, condition=condition, description=description)

    def _attach_producer(self, link: Link) -> None:
        if link.remote_target.type == Terminus.COORDINATOR:
            self.coordinator.attach(link)
            return
        if link.remote_target.dynamic:
            self._attach_dynamic_target(link)
            return
        address = link.remote_target.address or None
        destination = None
        if address is not None:
            if self.refuse_unauthorized_link(link, "send", address):
                return
            destination = self.destination_for(address)
            if destination is None:
                self._refuse_link(link, "amqp:not-found", f"no destination {address!r}")
                return
        self._open_producer(link)
        self._start_producer(link, destination)

    def _attach_dynamic_target(self, link: Link) -> None:
        """A dynamic target: a temporary queue named in the attach answer, for consumers
        to attach to by that name; deleted when this link goes (AMQP's default lifetime
        for a dynamic node, delete-on-close)."""
        destination = self.destinations.create_temporary()
        self._open_producer(link, destination.address)
        producer = self._start_producer(link, destination)
        self._dynamic_targets[destination.address] = producer.id
        log.debug("temporary_destination", address=destination.address, link=link.name)

    def _open_producer(self, link: Link, dynamic_address: str | None = None) -> None:
        """Answer a producer's attach as qpid-flow itself: its termini (a dynamic target
        with the address made for it; durable none, expiring with the link), its settle
        mode, settlement on the first outcome, the router's message size limit."""
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if dynamic_address is not None:
            link.target.address = dynamic_address
        # Nothing of the link outlives it here (as for a consumer's source, _answer_source).
        link.target.durability = Terminus.NONDURABLE
        link.target.expiry_policy = Terminus.EXPIRE_WITH_LINK
        link.target.timeout = 0
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        if self.config.max_message_size:
            link.max_message_size = self.config.max_message_size
        link.open()

    def destination_for(self, address: str) -> Destination | None:
        """The destination an address names (created if allowed); None if there is none."""
        return self.destinations.get(address)

    def relay_address(self, producer: Producer, data: bytes) -> str | None:
        """Where a transfer of a link that names no single destination goes: its ``to``."""
        return codec.to_address(data)

    def routed_address(self, address: str, data: bytes) -> str:
        """The destination a transfer to ``address`` counts in: the address itself, but
        where the broker routes it elsewhere (see BrokerRouter)."""
        return address

    def _start_producer(self, link: Link, destination: Destination | None, grant: bool = True) -> Producer:
        """Count an opened producer link in, and give it its first credit (unless the
        caller has more to set up first)."""
        producer = Producer(
            destination.address if destination is not None else None,
            name=link.name,
            connection_id=link.connection.qf_id,
        )
        link.qf_producer = producer
        keep_link(link)
        self._producers[producer.id] = (producer, link)
        if destination is not None:
            destination.producers.add(producer)
            self.backend.producer_attached(destination)
        self.hooks.producer_attached(producer=producer, destination=destination)
        log.debug("producer_attached", link=producer.id, address=producer.address, connection=producer.connection_id)
        if grant:
            self._grant(producer, link)
        return producer

    def _attach_consumer(self, link: Link) -> None:
        source = link.remote_source
        if source.dynamic:
            self._attach_temporary(link)
            return
        address = source.address
        if not address:
            self._refuse_link(link, "amqp:invalid-field", "a consumer link needs a source address")
            return
        if self.refuse_unauthorized_link(link, "receive", address):
            return
        destination = self.destination_for(address)
        if destination is None:
            self._refuse_link(link, "amqp:not-found", f"no destination {address!r}")
            return
        maker = self._dynamic_sources.get(destination.address)
        if maker is not None and maker.connection_id != link.connection.qf_id:
            self._refuse_link(link, "amqp:resource-locked", f"{address!r} is a temporary queue of another connection")
            return
        filters = self._filters_in_force(link)
        if filters is None:
            return
        selector, applied = filters
        browser = source.distribution_mode == Terminus.DIST_MODE_COPY
        _answer_source(link, applied)
        link.target.copy(link.remote_target)
        presettled = browser or link.remote_snd_settle_mode == Link.SND_SETTLED
        link.snd_settle_mode = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
        link.open()
        self._start_consumer(link, destination, selector, browser)

    def _filters_in_force(self, link: Link) -> tuple[Selector | None, dict[Any, Any]] | None:
        """The selector a consumer's source asks for and the filters qpid-flow applies (only
        a selector), or None when the selector is bad (the attach is refused)."""
        try:
            return selector_in_force(link.remote_source)
        except SelectorError as exc:
            self._refuse_link(link, "amqp:invalid-field", f"bad selector: {exc}")
            return None

    def _attach_temporary(self, link: Link) -> None:
        """A dynamic source: a temporary queue of its own, named in the attach answer and
        deleted when the link goes (the lifetime AMQP gives a dynamic node by default).
        A selector on it is applied, as on any queue."""
        filters = self._filters_in_force(link)
        if filters is None:
            return
        selector, applied = filters
        destination = self.destinations.create_temporary()
        _answer_source(link, applied)
        link.source.address = destination.address
        link.target.copy(link.remote_target)
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        link.snd_settle_mode = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
        link.open()
        self._dynamic_sources[destination.address] = self._start_consumer(link, destination, selector)
        log.debug("temporary_destination", address=destination.address, link=link.name)

    def _start_consumer(
        self, link: Link, destination: Destination, selector: Selector | None = None, browser: bool = False
    ) -> Consumer:
        """Make an opened consumer link one of ``destination``'s consumers (or browsers)."""
        presettled = link.snd_settle_mode == Link.SND_SETTLED
        consumer = Consumer(
            destination.address,
            self._deliver,
            presettled,
            name=link.name,
            connection_id=link.connection.qf_id,
            selector=selector,
            browser=browser,
            max_size=link.remote_max_message_size or 0,
        )
        link.qf_consumer = consumer
        keep_link(link)
        self._consumers[consumer.id] = (consumer, link)
        self._sent[consumer.id] = {}
        destination.add_consumer(consumer)
        self.backend.consumer_attached(destination)
        log.debug("consumer_attached", link=consumer.id, address=destination.address, connection=consumer.connection_id)
        return consumer

    def _link_gone(self, link: Link) -> None:
        """Forget a link (idempotent): release what a consumer held, drop a producer,
        roll back what a coordinator link left open."""
        self._uncount_link(link, by_client=True)  # its place under max_links_per_connection is free
        if kept(link, "qf_coordinator"):
            link.qf_coordinator = False
            self.coordinator.controller_gone(link)
            return
        producer = kept(link, "qf_producer")
        if self._arriving:
            self._forget_arriving(producer)
        if producer is not None and self._producers.pop(producer.id, None) is not None:
            destination = self.destinations.find(producer.address) if producer.address else None
            if destination is not None:
                destination.producers.discard(producer)
            self._drop_held(producer)
            self.hooks.producer_detached(producer=producer, destination=destination)
            log.debug("producer_detached", link=producer.id, address=producer.address)
            if destination is not None and self._dynamic_targets.get(destination.address) == producer.id:
                self._delete_dynamic_target(destination)
            return
        consumer = kept(link, "qf_consumer")
        if consumer is not None and self._consumers.pop(consumer.id, None) is not None:
            del self._sent[consumer.id]  # the destination gets its messages back below
            destination = self.destinations.find(consumer.address)
            made_it = self._dynamic_sources.get(consumer.address) is consumer
            if made_it and destination is None:  # deleted meanwhile (an operator)
                del self._dynamic_sources[consumer.address]
            if destination is not None:
                destination.remove_consumer(consumer)
                self.backend.consumer_detached(destination)
                if made_it:
                    # The link that made it went: so does the node (AMQP 1.0 3.5.10: a
                    # dynamic node lives as long as the link that caused its creation), and
                    # whoever else is attached to it (its producers: a responder's reply
                    # link, whose replies have no reader any more) is told.
                    address = destination.address
                    del self._dynamic_sources[address]
                    self._detach_deleted(
                        [link for producer, link in self._producers.values() if producer.address == address]
                        + [link for other, link in self._consumers.values() if other.address == address],
                        f"{address!r} was deleted with the link that made it",
                    )
                    self.destinations.delete(destination)
                    self._destination_gone(destination.address)
            log.debug("consumer_detached", link=consumer.id, address=consumer.address)

    def _delete_dynamic_target(self, destination: Destination) -> None:
        """The link that made a dynamic target went: the node goes, and the links attached
        to it (its consumers, and other producers naming it) are detached with
        amqp:resource-deleted."""
        address = destination.address
        del self._dynamic_targets[address]
        # Its consumers, and any other producer attached to it by name: their node is gone.
        self._detach_deleted(
            [link for consumer, link in self._consumers.values() if consumer.address == address]
            + [link for producer, link in self._producers.values() if producer.address == address],
            f"{address!r} was deleted with the link that made it",
        )
        self.destinations.delete(destination)
        self._destination_gone(destination.address)

    def _detach_deleted(self, links: list[Link], description: str) -> None:
        """``links`` lead to a node being deleted: each goes, closed with amqp:resource-deleted."""
        for link in links:
            self._link_gone(link)
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.condition = Condition("amqp:resource-deleted", description)
                link.close()

    def on_link_flow(self, event: Event) -> None:
        link = event.link
        consumer = kept(link, "qf_consumer")
        if consumer is None:
            return
        destination = self.destinations.find(consumer.address)
        if destination is not None:
            destination.credit_changed(consumer, pn_link_credit(link._impl))
            self.backend.demand_changed(destination)
        if link.drain_mode and link.credit > 0:
            # Nothing more to send now: give the unused credit back, as drain asks.
            link.drained()
            consumer.credit = 0

    # --- producer side ------------------------------------------------------------------

    def on_delivery(self, event: DeliveryEvent) -> None:
        link = event.link
        if link.is_receiver:
            delivery = event.delivery
            if delivery.aborted:
                if self._arriving:
                    self._forget_arriving(kept(link, "qf_producer"))
                delivery.settle()
                # It used a credit and goes no further (in front of a broker the broker never
                # saw it, so its link's credit is untouched): the producer may have it back.
                producer = kept(link, "qf_producer")
                if producer is not None:
                    self._grant(producer, link, ask=False)
                return
            if not delivery.readable:
                return
            if self._max_message_size and delivery.pending > self._max_message_size:
                self._message_too_large(link, delivery)
                return
            if delivery.partial:
                if self.memory.limit:
                    self._part_arrived(link, delivery)
                return
            if self._arriving and self._refused_while_arriving(link, delivery):
                return
            data = take_transfer(link, delivery.pending)
            self._on_transfer(link, delivery, data)
        else:
            consumer = kept(link, "qf_consumer")
            if consumer is None:
                self.not_sent_here(event)
                return
            sent = self._sent.get(consumer.id)
            if not sent:
                self.not_sent_here(event)
                return
            entry = sent.get(event.impl)
            if entry is None:
                self.not_sent_here(event)
                return
            delivery, message = entry
            state = delivery.remote_state
            if state == TRANSACTIONAL_STATE:
                self._transactional_outcome(link, consumer, event.impl, delivery, message)
                return
            settlement = remote_settlement(delivery, state)
            if settlement is None:
                return  # not terminal yet (e.g. received)
            del sent[event.impl]
            delivery.settle()
            destination = self.destinations.find(consumer.address)
            if destination is not None:
                if settlement.annotations:  # fetched grouped messages too: qpid-flow redelivers them
                    _annotate(destination, message, settlement)
                destination.settle(consumer, message, settlement)
                self.backend.demand_changed(destination)

    def not_sent_here(self, event: DeliveryEvent) -> None:
        """A delivery event on a link qpid-flow sends on, for no delivery it holds there.
        Either an outcome for one of its own it has forgotten (its consumer went): dropped.
        Or a transfer the client sent on its own receiving link, which AMQP does not allow
        (only a link's sender sends transfers, 1.0 2.7.5): they were kept, unsettled and
        without limit (100,000 of 1 KB: 150 MiB), and Proton makes the first the link's
        current delivery, which qpid-flow's next transfer on it would have been written
        into. The connection is closed with ``amqp:illegal-state`` (see
        :meth:`close_for_error`).

        Told apart by the link's current delivery: Proton makes a new delivery current when
        the link has none, and qpid-flow advances past each one it sends in the same call
        (``send_transfer``), so on a link it sends on only the peer's transfer leaves one.
        The client's delivery is left unsettled: settling it would make Proton send its
        bytes back to the client as a transfer of qpid-flow's; it goes with the connection.
        Checked only here, off the path of the outcomes qpid-flow waits for."""
        if pn_link_current(event.link_impl) == _NULL:
            return  # an outcome for a delivery qpid-flow forgot
        link = event.link
        description = (
            f"a transfer on link {link.name!r}, where the client is the receiver: only a link's sender "
            "sends transfers (AMQP 1.0 2.7.5)"
        )
        self.close_for_error(link.connection, Condition(ILLEGAL_STATE, description))

    def _transactional_outcome(
        self, link: Link, consumer: Consumer, impl: Any, delivery: LeanDelivery, message: Message
    ) -> None:
        """A consumer settled (or gave an outcome to) a delivery inside a transaction: the
        outcome is staged there; the message stays out to this consumer until the commit."""
        state = delivery.proton().remote.data or []
        txn = self.coordinator.transactions.find(state[0] if state else None, link.connection.qf_id)
        if txn is None:
            self._link_gone(link)
            link.condition = Condition(UNKNOWN_ID, f"a disposition names no open transaction: {state[:1]!r}")
            link.close()
            return
        settlement = settlement_from_outcome(state[1] if len(state) > 1 else None)
        if delivery.settled:
            del self._sent[consumer.id][impl]
            delivery.settle()
            txn.stage_outcome(consumer, message, settlement or Settlement.accepted(), None)
        elif settlement is not None:
            txn.stage_outcome(consumer, message, settlement, impl)

    def forget_sent(self, consumer: Consumer, impl: Any) -> None:
        """Settle and forget a consumer's delivery (by C delivery) a transaction settled."""
        entry = self._sent.get(consumer.id, {}).pop(impl, None)
        if entry is not None:
            entry[0].settle()

    def _part_arrived(self, link: Link, delivery: LeanDelivery) -> None:
        """A transfer of a message that is not complete yet. Its bytes wait in Proton's
        buffer until the last one comes: they count against memory_limit as those of a
        held transfer do (a client streaming large messages on many links held hundreds of
        MB, counted nowhere). One that would take the waiting bytes past the limit is
        refused: what it sent, and sends from then on, is read and dropped, and it is
        rejected once complete (_refused_while_arriving)."""
        producer: Producer | None = kept(link, "qf_producer")
        if producer is None:
            return
        arriving = self._arriving.get(producer.id)
        if arriving is None:
            arriving = self._arriving[producer.id] = _Arriving()
        if arriving.refused:
            arriving.dropped += len(take_transfer_part(link, delivery.pending))
            if self._max_message_size and arriving.dropped > self._max_message_size:
                self._message_too_large(link, delivery)
            return
        memory = self.memory
        grown = delivery.pending - arriving.held
        if memory.waiting + grown <= memory.limit:
            memory.hold_arriving(grown)
            arriving.held += grown
            return
        memory.release_arriving(arriving.held)
        arriving.held = 0
        arriving.refused = True
        first = take_transfer_part(link, delivery.pending)
        arriving.dropped = len(first)
        arriving.to = self._relay_to(producer, first)

    def _relay_to(self, producer: Producer, first: bytes) -> str | None:
        """An anonymous relay's 'to', from a message's first bytes (the properties come
        before the body), read before they are dropped, for its refusal; None for a
        named link's, or if they do not hold it whole."""
        if producer.address is not None:
            return None
        try:
            return self.relay_address(producer, first)
        except codec.MalformedMessage:
            return None

    def _refused_while_arriving(self, link: Link, delivery: LeanDelivery) -> bool:
        """The last transfer of a message that arrived in several: its arriving bytes
        leave the count (the message is counted where it goes), or, refused on the way
        or now that it is whole (its last transfer took it past the limit), it is
        rejected. True if it was."""
        producer: Producer | None = kept(link, "qf_producer")
        arriving = self._arriving.pop(producer.id, None) if producer is not None else None
        if arriving is None or producer is None:
            return False
        memory = self.memory
        if not arriving.refused:
            memory.release_arriving(arriving.held)
            if not memory.limit or memory.waiting + delivery.pending <= memory.limit:
                return False
            data = take_transfer(link, delivery.pending)
            size, arriving.to = len(data), self._relay_to(producer, data)
        else:
            size = arriving.dropped + len(take_transfer(link, delivery.pending))  # the rest, dropped too
        address = producer.address if producer.address is not None else arriving.to
        if producer.address is None and address and self._relay_denied(link, delivery, producer, address, b"", size):
            return True  # the ACL's answer first, as for any relay transfer: not counted there
        destination = self.destinations.find(self.destination_name(address)) if address else None
        message = Message(b"", destination.address if destination is not None else address or "", producer.id)
        message.size = size  # what it was (the event log's size), though its bytes are gone
        if delivery.remote_state == TRANSACTIONAL_STATE and not self._join_transaction(link, delivery, message):
            self._refuse_transfer(link, delivery, message, UNKNOWN_ID, "the transfer names no open transaction")
            return True
        too_much = f"the message arriving would pass memory_limit ({self.memory.limit} bytes)"
        if destination is None:  # a relay's 'to' that names none (or could not be read)
            self._refuse_transfer(link, delivery, message, RESOURCE_LIMIT, too_much)
            return True
        # As any refusal of a policy's: counted in the destination's refused, and a
        # transaction it belongs to is rolled back at its discharge (all or nothing).
        producer.transfers += 1
        if not delivery.settled:
            message.origin = delivery
            producer.unsettled += 1
        self._apply_decision(Reject(too_much, RESOURCE_LIMIT), destination, message)
        return True

    def _forget_arriving(self, producer: Producer | None) -> None:
        """The message a producer link was sending is aborted, or the link went."""
        arriving = self._arriving.pop(producer.id, None) if producer is not None else None
        if arriving is not None:
            self.memory.release_arriving(arriving.held)

    def _message_too_large(self, link: Link, delivery: LeanDelivery) -> None:
        """A transfer grew past max_message_size: end the link as AMQP 1.0 says (2.7.3)."""
        limit = self._max_message_size
        log.warning("message_too_large", connection=link.connection.qf_id, link=link.name, limit=limit)
        self._link_gone(link)
        delivery.settle()
        link.condition = Condition(
            "amqp:link:message-size-exceeded", f"message larger than max_message_size ({limit} bytes)"
        )
        link.close()

    def _transfer_beyond_credit(self, link: Link, delivery: LeanDelivery) -> None:
        """A producer sent without credit: it is the credit that holds producers back (flow
        control, the memory limit), so the link ends as AMQP 1.0 says (2.6.7, 2.8.15), and
        the transfer, and any sent after it before the detach, is dropped unsettled."""
        delivery.settle()
        if link.state & Endpoint.LOCAL_CLOSED:
            return  # ended already: the rest of what it sent before it heard
        log.warning("transfer_beyond_credit", connection=link.connection.qf_id, link=link.name)
        self._link_gone(link)
        link.condition = Condition("amqp:link:transfer-limit-exceeded", "a transfer was sent with no link credit left")
        link.close()

    def _on_transfer(self, link: Link, delivery: LeanDelivery, data: bytes) -> None:
        if not self.accepting and link.connection.state & Endpoint.LOCAL_CLOSED:
            # Sent before the client heard the shutdown's close: no outcome can reach it
            # any more, so the message is not taken (the client sends it again elsewhere).
            delivery.settle()
            return
        producer: Producer | None = kept(link, "qf_producer")
        if producer is None:  # every other link qpid-flow receives on is a coordinator
            self.coordinator.on_control(link, delivery, data)
            return
        credit = pn_link_credit(link._impl)
        if credit < 0:
            self._transfer_beyond_credit(link, delivery)
            return
        if producer.id not in self._producers and link.state & Endpoint.LOCAL_CLOSED:
            # qpid-flow ended its link (a message too large) and it sent more before it
            # heard: dropped, as what a link sends past its credit is.
            delivery.settle()
            return
        producer.credit = credit
        producer.transfers += 1
        presettled = delivery.settled
        address = producer.address
        routed_from = None
        if address is None:
            try:
                address = self.relay_address(producer, data)
                routed = self.routed_address(address, data) if address else None
            except codec.MalformedMessage as exc:
                self._refuse_transfer(link, delivery, Message(data, "", producer.id), "amqp:decode-error", str(exc))
                return
            if not address:
                refused = Message(data, "", producer.id)
                self._refuse_transfer(
                    link, delivery, refused, "amqp:invalid-field", "an anonymous-relay transfer needs a 'to' address"
                )
                return
            if self._relay_denied(link, delivery, producer, address, data):
                return
            if routed is not None and routed != address:
                routed_from, address = address, routed
        destination = self.destination_for(address)
        if destination is None:
            refused = Message(data, address, producer.id)
            self._refuse_transfer(link, delivery, refused, "amqp:not-found", f"no destination {address!r}")
            return
        message = Message(data, destination.address, producer.id)
        if routed_from is not None:
            message.routed_from = routed_from
        if delivery.remote_state == TRANSACTIONAL_STATE and not self._join_transaction(link, delivery, message):
            self._refuse_transfer(link, delivery, message, UNKNOWN_ID, "the transfer names no open transaction")
            return
        if not presettled:
            message.origin = delivery
            producer.unsettled += 1
        if self.judges_messages:
            # Standalone, qpid-flow is the broker: what no client could decode is refused
            # before any policy counts it (queued as sent, it made every consumer it was
            # offered to fail). A transaction it belongs to fails, as for any rejection.
            try:
                message.expires, message.properties_at, hop_only = codec.check_sections(data, message.arrived)
            except codec.MalformedMessage as exc:
                refusal = Reject(f"the message cannot be decoded: {exc}", "amqp:decode-error")
                self._apply_decision(refusal, destination, message)
                return
            if hop_only is not None:
                # Delivery annotations are for the receiving peer alone (AMQP 1.0 3.2.2): the
                # broker's, not its consumers' (Artemis and ActiveMQ drop them on arrival).
                data, message.properties_at = codec.without_section(data, hop_only, message.properties_at)
                message.data, message.size = data, len(data)
                if not data:  # nothing left for a consumer: as an empty transfer
                    refusal = Reject("the message holds delivery annotations only", "amqp:decode-error")
                    self._apply_decision(refusal, destination, message)
                    return
        decision = self.hooks.transfer_arrived(producer=producer, message=message, destination=destination)
        if self._held and destination.address in self._held and not isinstance(decision, Reject):
            # Transfers held for this address go first, in arrival order: one that arrives
            # between a resume and the turn that lets them go waits behind them.
            decision = _BEHIND_HELD
        self._apply_decision(decision, destination, message)

    def _relay_denied(
        self, link: Link, delivery: LeanDelivery, producer: Producer, address: str, data: bytes, size: int = -1
    ) -> bool:
        """Refuse an anonymous relay's transfer to an address the ACL does not let its user
        send to (``size``, if given, is the message's where its bytes are gone); True if it
        was. Decided by the address as the producer wrote it: what it may send to is not
        decided by where the broker routes the message."""
        user = user_of(link.connection)
        if self.access.allows(user, "send", self.acl_name(address)):
            return False
        refused = Message(data, address, producer.id)
        if size >= 0:
            refused.size = size
        self._refuse_transfer(link, delivery, refused, UNAUTHORIZED, _not_allowed(user, "send", address))
        return True

    def _join_transaction(self, link: Link, delivery: LeanDelivery, message: Message) -> bool:
        """A transactional transfer: stage ``message`` in the open transaction it names
        (committed or rolled back by qpid-flow's coordinator). False if none is open."""
        txn = self._transaction_of(link, delivery)
        if txn is None:
            return False
        message.txn = txn
        txn.undecided += 1
        return True

    def _transaction_of(self, link: Link, delivery: LeanDelivery) -> Transaction | None:
        state = delivery.proton().remote.data or []
        return self.coordinator.transactions.find(state[0] if state else None, link.connection.qf_id)

    def _apply_decision(self, decision: Any, destination: Destination, message: Message) -> None:
        txn: Transaction | None = message.txn
        if decision is None or isinstance(decision, Admit):
            if txn is None:
                self.backend.forward(destination, message, self._producer_outcome)
                return
            # In a transaction: staged, not enqueued, until the commit.
            txn.stage_transfer(destination, message)
            self.memory.add(message.size)
            txn.undecided -= 1
            self._producer_outcome(message, Settlement.accepted())
            self.coordinator.try_commit(txn)
        elif isinstance(decision, Reject):
            self._producer_outcome(message, Settlement(Outcome.REJECTED, decision.condition, decision.description))
            if txn is not None:
                # All or nothing: a commit would keep the transfers admitted and lose this
                # one. The transaction is rolled back at its discharge instead (ActiveMQ: "for
                # transacted sessions, rollback the transaction with a Queue full indication").
                if txn.failure is None:
                    txn.failure = f"a transfer to {destination.address!r} was rejected: {decision.description}"
                txn.undecided -= 1
                self.coordinator.try_commit(txn)
        elif isinstance(decision, Hold):
            if self.memory.holds_too_much(message.size):
                # Held transfers (sent on credit given before, which cannot be taken back)
                # stop at memory_limit too, whoever holds them: past it they are refused.
                # (50 producers of 1 MiB messages on the full window of a first grant held
                # 6 GB under a 50 MB limit.)
                self._apply_decision(Reject(self.memory.held_past_limit(), RESOURCE_LIMIT), destination, message)
                return
            self._held.setdefault(destination.address, []).append(message)
            self.memory.hold(message.size)
        else:
            # The hook caller lets nothing else through; whatever this is, the transfer gets
            # an outcome rather than vanishing unsettled.
            log.error("plugin_error", hook="qpid_flow_transfer_arrived", answer=repr(decision))
            failed = Reject("a qpid-flow policy gave no valid answer for this transfer", "amqp:internal-error")
            self._apply_decision(failed, destination, message)

    def _refuse_transfer(
        self, link: Link, delivery: LeanDelivery, message: Message, condition: str, description: str
    ) -> None:
        """The router itself refuses a transfer (no such destination, not allowed, not
        decodable, no 'to', no such transaction): rejected, told to plugins as any outcome
        (``message.address`` is the address named, or "" if it names none)."""
        log.info("transfer_refused", condition=condition, description=description)
        producer: Producer = kept(link, "qf_producer")
        settlement = Settlement(Outcome.REJECTED, condition, description)
        if message.txn is None and delivery.remote_state == TRANSACTIONAL_STATE:
            self._join_transaction(link, delivery, message)  # refused before it joined
        txn = message.txn
        if txn is not None:
            # All or nothing: the transaction it joined is rolled back at its discharge.
            txn.failure = txn.failure or f"a transfer was rejected: {description}"
            txn.undecided -= 1
            apply_transactional(delivery, txn.id, settlement)
            self.coordinator.try_commit(txn)
        elif not delivery.settled:
            apply_settlement(delivery, settlement)
        else:
            delivery.settle()
        self.hooks.transfer_settled(producer=producer, message=message, settlement=settlement)
        # The transfer spent credit like any other: top it up as a settlement does, or a
        # window of refused transfers would leave the link with none for good.
        self._grant(producer, link, ask=False)

    def _producer_outcome(self, message: Message, settlement: Settlement) -> None:
        """The backend (or a policy) decided the fate of a producer's transfer."""
        if settlement.outcome is Outcome.REJECTED:
            refused_on = self.destinations.find(message.address)
            if refused_on is not None:
                refused_on.refused += 1
        entry = self._producers.get(message.producer_id)  # type: ignore[arg-type]
        if entry is not None and message.origin is not None:
            destination = self.destinations.find(message.address)
            if destination is not None and self.hooks.settlement_delay(
                producer=entry[0], message=message, destination=destination, settlement=settlement
            ):
                self._delayed.setdefault(message.address, []).append((message, settlement))
                return
        self._settle_producer(message, settlement)

    def _settle_producer(self, message: Message, settlement: Settlement) -> None:
        delivery = message.origin
        message.origin = None
        if delivery is not None:
            if message.txn is not None:
                apply_transactional(delivery, message.txn.id, settlement)
            elif message.relayed_txn is not None:
                apply_transactional(delivery, message.relayed_txn, settlement)
            else:
                apply_settlement(delivery, settlement)
        entry = self._producers.get(message.producer_id)  # type: ignore[arg-type]
        if entry is None:
            return  # the producer left meanwhile
        producer, link = entry
        if delivery is not None:
            producer.unsettled -= 1
        self.hooks.transfer_settled(producer=producer, message=message, settlement=settlement)
        self._grant(producer, link, ask=False)

    def _grant(self, producer: Producer, link: Link, ask: bool = True) -> None:
        """Ask the credit policy how much to add to a producer link, and add it.

        After a settlement (``ask=False``) the policy is asked only once the link has used
        half of its last grant: asking per message would cost a hook call per message for
        an answer that is nearly always "nothing yet".
        """
        if not self.accepting or not self.backend.writable(producer.address):
            return
        producer.credit = pn_link_credit(link._impl)
        if not ask and producer.credit * 2 > producer.last_grant:
            return
        destination = self.destinations.find(producer.address) if producer.address else None
        credit = self.hooks.producer_credit(producer=producer, destination=destination)
        if credit is CREDIT_AFTER_FAILURE:
            self._ask_credit_again_later(producer, link)
            return
        if credit is None:  # no plugin has an opinion: a plain window
            credit = window_need(self.config.producer_window, producer)
        if credit:
            link.flow(credit)
            producer.credit += credit
            producer.last_grant = producer.credit
        if kept(link, "qf_credit_retry"):
            link.qf_credit_retry = None  # the policy answered again: a next failure waits the least

    def _ask_credit_again_later(self, producer: Producer, link: Link) -> None:
        """The credit policy failed for this link (a plugin raised, or answered no credit
        count), so it got none this time. A link with no credit sends nothing, and nothing
        else would ask again: ask again after a pause, doubled while the policy keeps failing
        (each failure is logged)."""
        retry: _CreditRetry | None = kept(link, "qf_credit_retry")
        if retry is not None and retry.pending:
            return
        reactor = kept(link.connection, "_reactor")  # the container that runs the connection (event.container)
        if reactor is None:
            return  # not run by a reactor (a test's bare engine): nothing to ask again with
        delay = min(retry.delay * 2, CREDIT_RETRY_LONGEST) if retry is not None else CREDIT_RETRY_FIRST
        link.qf_credit_retry = _CreditRetry(delay, pending=True)
        reactor.schedule(delay, Call(functools.partial(self._ask_credit_again, producer.id)))

    def _ask_credit_again(self, producer_id: int) -> None:
        """The pause after a failed credit policy is over: ask it again, if the link is still there."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return  # the link went meanwhile
        producer, link = entry
        retry: _CreditRetry | None = kept(link, "qf_credit_retry")
        if retry is not None:
            retry.pending = False
        self._grant(producer, link)

    def grant_all(self, address: str | None = None) -> None:
        """Re-ask the credit policy for every producer (of ``address``, if given)."""
        for producer, link in list(self._producers.values()):
            if address is None or producer.address in (None, address):
                self._grant(producer, link)

    def waits_on(self, address: str) -> bool:
        """Whether transfers are held for ``address`` or settlements wait on it: its
        destination must not be forgotten meanwhile, or they would wait for good."""
        return address in self._held or address in self._delayed

    def recheck_held(self, address: str) -> None:
        """Ask the policies again about every transfer held or delayed for ``address``.
        If its destination is gone, nothing is left to ask: see :meth:`_destination_gone`."""
        destination = self.destinations.find(address)
        if destination is None:
            self._destination_gone(address)
            return
        self._recheck_delayed(destination)
        held = self._held.pop(address, None)
        if not held:
            return
        for index, message in enumerate(held):
            producer_entry = self._producers.get(message.producer_id)  # type: ignore[arg-type]
            if producer_entry is None:
                self.memory.unhold(message.size)
                continue
            decision = self.hooks.transfer_arrived(producer=producer_entry[0], message=message, destination=destination)
            if isinstance(decision, Hold):
                # Keep this one and everything after it, in order.
                self._held[address] = held[index:] + self._held.get(address, [])
                return
            self.memory.unhold(message.size)
            if not isinstance(decision, Reject) and self._expired_while_held(destination, message):
                continue
            self._apply_decision(decision, destination, message)

    def _expired_while_held(self, destination: Destination, message: Message) -> bool:
        """A transfer that expired while a policy held it goes no further: accepted, as a
        broker takes it and then drops it, and counted expired. Standalone it was let in,
        counted in the depth until the next sweep, and a window of them turned flow control
        ON again behind live producers, once a second. In front of a broker, one that goes
        on carries the time to live it has left (it went with all of it, and reached a
        consumer after it had expired)."""
        if self.judges_messages:
            if message.expires is None or message.txn is not None or message.expires > time.time():
                return False  # a transaction's transfer is staged and counted in it: its commit decides
            destination.expired += 1
            self._producer_outcome(message, _EXPIRED_WHILE_HELD)
            return True
        if message.relayed_txn is not None:
            return False  # a transactional transfer is the broker's to judge
        try:
            aged = codec.aged(message.data, message.arrived, time.time())
        except codec.MalformedMessage:
            return False  # the broker's to refuse
        if aged is None:
            destination.expired += 1
            log.debug("held_transfer_expired", address=destination.address)
            # Accepted, as the producer hears it; the condition, which an accepted outcome
            # does not carry on the wire, tells plugins (the event log) why it went no further.
            self._producer_outcome(message, _EXPIRED_WHILE_HELD)
            return True
        if aged is not message.data:
            message.data, message.size = aged, len(aged)
        return False

    def _destination_gone(self, address: str) -> None:
        """A destination was deleted with transfers held for it or settlements waiting on
        it (a temporary queue whose last consumer left): the delayed settlements are given
        (their messages were taken), the held transfers released (never taken: their
        producers may send them again)."""
        self._give_delayed(self._delayed.pop(address, ()))
        for message in self._held.pop(address, ()):
            self.memory.unhold(message.size)
            self._undecided_for_good(message, f"{address!r} was deleted before flow control admitted a transfer to it")
            if message.producer_id in self._producers:
                self._settle_producer(message, Settlement.released())

    def _give_delayed(self, entries: Iterable[tuple[Message, Settlement]]) -> None:
        """Settlements a policy was delaying go to their producers now, in order."""
        for message, settlement in entries:
            if message.producer_id in self._producers:
                self._settle_producer(message, settlement)

    def _undecided_for_good(self, message: Message, why: str) -> None:
        """A held transfer will never be admitted: the transaction it belongs to (if any)
        stops waiting for it, and can no longer commit (``why``)."""
        txn = message.txn
        if txn is None:
            return
        message.txn = None
        txn.undecided -= 1
        txn.failure = why
        self.coordinator.try_commit(txn)

    def _recheck_delayed(self, destination: Destination) -> None:
        address = destination.address
        delayed = self._delayed.pop(address, None)
        if not delayed:
            return
        still: list[tuple[Message, Settlement]] = []
        for message, settlement in delayed:
            entry = self._producers.get(message.producer_id)  # type: ignore[arg-type]
            if entry is None:
                continue
            if still or self.hooks.settlement_delay(
                producer=entry[0], message=message, destination=destination, settlement=settlement
            ):
                still.append((message, settlement))  # later ones stay behind an earlier one
            else:
                self._settle_producer(message, settlement)
        if still:
            self._delayed[address] = still + self._delayed.get(address, [])

    def delayed_producers(self, address: str) -> int:
        return len({message.producer_id for message, _ in self._delayed.get(address, ())})

    def waiting_producers(self, address: str | None = None) -> set[int]:
        """The producers with a transfer to ``address`` (None: to any) held unforwarded or a
        settlement delayed: each waits for an answer."""
        delayed = self._delayed.values() if address is None else [self._delayed.get(address, [])]
        held = self._held.values() if address is None else [self._held.get(address, [])]
        waiting = {message.producer_id for entries in delayed for message, _ in entries}
        waiting.update(message.producer_id for messages in held for message in messages)
        waiting.discard(None)
        return waiting  # type: ignore[return-value]

    def drop_held_in(self, txn: Transaction) -> None:
        """A transaction was rolled back: its transfers a policy still holds are dropped,
        released to their producers."""
        for address, messages in list(self._held.items()):
            dropped = [m for m in messages if m.txn is txn]
            if not dropped:
                continue
            remaining = [m for m in messages if m.txn is not txn]
            if remaining:
                self._held[address] = remaining
            else:
                del self._held[address]
            for message in dropped:
                self.memory.unhold(message.size)
                message.txn = None
                self._settle_producer(message, Settlement.released())
        txn.undecided = 0

    def held_count(self, address: str) -> int:
        return len(self._held.get(address, ()))

    def held_messages(self, address: str) -> list[Message]:
        return list(self._held.get(address, ()))

    def _drop_held(self, producer: Producer) -> None:
        """A producer left: its held transfers were never accepted, so they are dropped;
        its delayed settlements have no one to go to."""
        for address, messages in list(self._held.items()):
            kept = [m for m in messages if m.producer_id != producer.id]
            self.memory.unhold(
                sum(m.size for m in messages) - sum(m.size for m in kept), messages=len(messages) - len(kept)
            )
            for message in messages:
                if message.producer_id == producer.id:
                    self._undecided_for_good(message, "a producer left before flow control admitted its transfer")
            if kept:
                self._held[address] = kept
            else:
                del self._held[address]
        for address, entries in list(self._delayed.items()):
            remaining = [(m, s) for m, s in entries if m.producer_id != producer.id]
            if remaining:
                self._delayed[address] = remaining
            else:
                del self._delayed[address]

    # --- consumer side ------------------------------------------------------------------

    def _deliver(self, consumer: Consumer, message: Message) -> None:
        link = self._consumers[consumer.id][1]
        consumer.delivered += 1
        delivery = new_delivery(link, next(self._tags))
        send_transfer(link, message.waiting_wire() if consumer.browser else message.wire())
        if consumer.presettled:
            delivery.settle()
        else:
            self._sent[consumer.id][delivery._impl] = (delivery, message)

    def upstream_link_failed(self, address: str, is_sender: bool, condition: Condition | None) -> None:
        """The broker closed the upstream link of ``address``: close the local links that
        depend on it with the broker's error, as if they were attached to the broker."""
        entries: list[tuple[Producer | Consumer, Link]] = [
            *(self._producers.values() if is_sender else self._consumers.values())
        ]
        for endpoint, link in entries:
            if endpoint.address != address:
                continue
            self._link_gone(link)
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.condition = condition or Condition("amqp:internal-error", "the broker closed the link")
                link.close()

    def reader_lost_for(self, address: str, consumer_ids: set[int]) -> None:
        """qpid-flow's own broker connection, which fed grouped destination ``address``,
        was lost while the consumers ``consumer_ids`` held messages of it unsettled. Those
        deliveries are void (their outcomes can reach the broker no more, and the broker
        delivers the messages again): each such consumer's link is detached, so that no
        client goes on processing a group that qpid-flow now gives to another."""
        for consumer_id in consumer_ids:
            entry = self._consumers.get(consumer_id)
            if entry is None:
                continue
            _consumer, link = entry
            self._link_gone(link)
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.condition = Condition(
                    "amqp:link:detach-forced",
                    f"qpid-flow's connection to the broker was lost; the broker delivers the messages of "
                    f"{address!r} this link held unsettled again",
                )
                link.close()
        log.warning("consumers_detached_reader_lost", address=address, consumers=len(consumer_ids))

    # --- shutdown -----------------------------------------------------------------------

    def release_consumers(self) -> None:
        """Release everything consumers hold, back to their destinations."""
        for consumer, _link in list(self._consumers.values()):
            destination = self.destinations.find(consumer.address)
            if destination is not None:
                destination.release_held(consumer)
                consumer.credit = 0

    def give_delayed_outcomes(self) -> None:
        """Shutdown: every settlement a policy was delaying goes to its producer before the
        close. Their messages were taken (enqueued, or accepted by the broker): a producer
        left without its outcome would send them again, and they would be there twice."""
        delayed, self._delayed = self._delayed, {}
        for entries in delayed.values():
            self._give_delayed(entries)

    def close_connections(self, description: str) -> None:
        for conn in list(self.connections):
            if conn.state & Endpoint.LOCAL_ACTIVE:
                conn.condition = Condition(FORCED, description)
                conn.close()


def _annotate(destination: Destination, message: Message, settlement: Settlement) -> None:
    """A ``modified`` outcome's message-annotations go into the message for its next
    delivery (AMQP 1.0 3.4.5), as a broker that keeps it does (Artemis does; in front of a
    broker, the broker's own queue decides). A message qpid-flow cannot read is kept as is."""
    if settlement.outcome is not Outcome.MODIFIED or settlement.undeliverable_here:
        return  # undeliverable-here: it leaves, nothing to redeliver
    try:
        data = with_message_annotations(message.data, settlement.annotations)
    except (codec.MalformedMessage, ProtonException):
        return
    destination.replace_data(message, data)


def user_of(conn: Connection) -> str:
    """The identity the gate signed ``conn`` in with."""
    return kept(conn, "qf_user") or ANONYMOUS_USER


def _not_allowed(user: str, direction: Direction, address: str) -> str:
    verb = "send to" if direction == "send" else "receive from"
    return f"user {user!r} may not {verb} {address!r}"


def _count_in(conn: Connection, endpoint: Any, kind: str, limit: int) -> bool | None:
    """Count ``endpoint`` (a session or link: ``kind``) in on ``conn`` under ``limit`` (0: no
    limit): True if it is in; False if refused (counted among the refused, which the client
    has not ended yet); None if that makes more refused than the limit itself."""
    if not limit:
        return True
    counted = kept(conn, f"qf_{kind}") or 0
    if counted < limit:
        setattr(conn, f"qf_{kind}", counted + 1)
        endpoint.qf_counted = True
        return True
    refused = (kept(conn, f"qf_{kind}_refused") or 0) + 1
    if refused > limit:
        return None
    setattr(conn, f"qf_{kind}_refused", refused)
    endpoint.qf_refused = True
    return False


def _count_out(conn: Connection, endpoint: Any, kind: str, by_client: bool) -> None:
    """``endpoint`` ended: out of ``conn``'s count (:func:`_count_in`); a refused one only
    once the client ended it."""
    if kept(endpoint, "qf_counted"):
        endpoint.qf_counted = False
        setattr(conn, f"qf_{kind}", kept(conn, f"qf_{kind}") - 1)
    elif by_client and kept(endpoint, "qf_refused"):
        endpoint.qf_refused = False
        setattr(conn, f"qf_{kind}_refused", kept(conn, f"qf_{kind}_refused") - 1)


def _too_many_refused(kind: str, ended: str, limit: int) -> Condition:
    setting = f"max_{kind}_per_connection"
    return Condition(RESOURCE_LIMIT, f"more than {limit} {kind} refused and not {ended} ({setting} = {limit})")


def selector_in_force(source: Terminus) -> tuple[Selector | None, dict[Any, Any]]:
    """The selector ``source`` asks for (parsed; SelectorError if it is bad) and the filters
    qpid-flow applies from its filter set: only a selector."""
    selector = None
    applied: dict[Any, Any] = {}
    for key, value in _filters(source).items():
        if _is_selector(value):
            selector = parse_selector(str(value.value))
            applied[key] = value
    return selector, applied


_SOLE_CONNECTION = symbol("sole-connection-for-container")


def _asks_sole_connection(conn: Connection) -> bool:
    desired = peer_capabilities(pn_connection_remote_desired_capabilities(conn._impl))
    return desired is not None and _SOLE_CONNECTION in desired


def peer_capabilities(field: Any) -> list[symbol] | None:
    """The symbols of a peer's capabilities field (the C data Proton's
    ``pn_connection_remote_*_capabilities`` give): [] when there is none; None when it is
    not what AMQP types it, a symbol or an array of symbols (a list of symbols is taken
    too). Read from the data itself: Proton's ``remote_desired_capabilities`` raises on
    anything else (a ulong: TypeError)."""
    data = Data(field)
    data.rewind()
    try:
        if data.next() is None:
            return []
        value = data.get_object()
    except Exception:  # a value Proton cannot turn into Python
        return None
    finally:
        data.rewind()
    if isinstance(value, symbol):
        return [value]
    if isinstance(value, Array):
        elements = value.elements if value.type == Data.SYMBOL and value.descriptor is UNDESCRIBED else None
        return list(elements) if elements is not None else None
    if isinstance(value, list) and all(isinstance(element, symbol) for element in value):
        return value
    return None


def _bad_capabilities(conn: Connection) -> str | None:
    """The capabilities field of ``conn``'s open that is not a symbol or an array of
    symbols (see :func:`peer_capabilities`), if one is not."""
    if peer_capabilities(pn_connection_remote_offered_capabilities(conn._impl)) is None:
        return "offered-capabilities"
    if peer_capabilities(pn_connection_remote_desired_capabilities(conn._impl)) is None:
        return "desired-capabilities"
    return None


def _answer_source(link: Link, applied: dict[Any, Any]) -> None:
    """The source in a standalone consumer's attach answer: the client's, listing only the
    filters in force (AMQP 1.0 3.5.8): one not applied is left out, so the client can tell.

    Its durability and expiry are what qpid-flow gives, not what the client asked: nothing
    of a link outlives it (no unsettled state kept, the terminus gone at detach), so a
    client asking a durable subscription learns from the answer that it has none."""
    link.source.copy(link.remote_source)
    link.source.durability = Terminus.NONDURABLE
    link.source.expiry_policy = Terminus.EXPIRE_WITH_LINK
    link.source.timeout = 0
    _answer_filters(link, applied)


def _answer_filters(link: Link, applied: dict[Any, Any]) -> None:
    """``link``'s answered source lists exactly the filters in force, ``applied``."""
    if applied != _filters(link.source):
        link.source.filter.clear()
        if applied:
            link.source.filter.put_object(applied)


def _filters(source: Terminus) -> dict[Any, Any]:
    """The filter set of a source, as a dict (empty when there is none or it is not a map)."""
    data = source.filter
    data.rewind()
    if not data.next():
        return {}
    try:
        value = data.get_object()
    except Exception:  # a filter set Proton cannot turn into Python: none applied
        return {}
    return value if isinstance(value, dict) else {}


def _is_selector(value: Any) -> bool:
    descriptor = getattr(value, "descriptor", None)
    return descriptor in (SELECTOR_FILTER_NAME, SELECTOR_FILTER_CODE) and isinstance(getattr(value, "value", None), str)


class _Arriving:
    """A message a producer link is sending in several transfers, under memory_limit."""

    __slots__ = ("dropped", "held", "refused", "to")

    def __init__(self) -> None:
        self.held = 0  # its bytes counted against memory_limit so far
        self.refused = False  # it would have passed the limit: read and dropped, then rejected
        self.dropped = 0  # the bytes read and dropped since (max_message_size still applies)
        self.to: str | None = None  # an anonymous relay's: the 'to' its first bytes named
