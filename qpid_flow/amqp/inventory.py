"""Who is connected and what their links are doing, as plain records (``qdstat -c`` / ``-l``).

Runs on the reactor thread, at request time: it walks the router's client connections and
their Proton sessions and links, and reads the counters the data path keeps anyway
(``Producer.transfers``, ``Consumer.delivered``), so nothing here costs anything per message.

A link's direction is the client's: ``in`` carries messages from the client to qpid-flow (a
producer, or a transaction coordinator), ``out`` from qpid-flow to the client (a consumer).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from proton import VERSION, Condition, Connection, Endpoint, Link, Terminus

from qpid_flow.amqp.endpoints import kept

if TYPE_CHECKING:
    from qpid_flow.amqp.router import Router
    from qpid_flow.core.model import Producer

__all__ = ["close_connection", "connection_records", "link_records"]


# The version of the Proton library the router runs on (qpid_flow_build_info).
PROTON_VERSION = ".".join(str(part) for part in VERSION)


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _state(endpoint: Any) -> str:
    """Proton's endpoint state as an operator says it."""
    state = endpoint.state
    if state & Endpoint.LOCAL_CLOSED or state & Endpoint.REMOTE_CLOSED:
        return "closed" if state & Endpoint.LOCAL_CLOSED and state & Endpoint.REMOTE_CLOSED else "closing"
    if state & Endpoint.REMOTE_ACTIVE and state & Endpoint.LOCAL_ACTIVE:
        return "open"
    return "opening"


def _count(first: Any) -> int:
    count = 0
    while first is not None:
        count += 1
        first = first.next(0)
    return count


def _connections(router: Router) -> list[Connection]:
    return sorted(router.connections, key=lambda conn: int(str(kept(conn, "qf_id") or "c0")[1:] or 0))


def endpoint_counts(router: Router) -> tuple[int, int, int]:
    """Sessions, incoming links and outgoing links over every client connection."""
    sessions = links_in = links_out = 0
    for conn in router.connections:
        session = conn.session_head(0)
        while session is not None:
            sessions += 1
            session = session.next(0)
        link = conn.link_head(0)
        while link is not None:
            if link.is_receiver:
                links_in += 1
            else:
                links_out += 1
            link = link.next(0)
    return sessions, links_in, links_out


def connection_records(router: Router) -> list[dict[str, Any]]:
    """One record per client connection, oldest first."""
    now = time.time()
    records = []
    for conn in _connections(router):
        opened = kept(conn, "qf_opened")
        pair = kept(conn, "qf_pair")
        record: dict[str, Any] = {
            "id": kept(conn, "qf_id"),
            "remote": kept(conn, "qf_remote"),
            "user": kept(conn, "qf_user") or "anonymous",
            "container": conn.remote_container,
            "hostname": conn.remote_hostname,
            "opened": _iso(opened),
            "uptimeSeconds": round(now - opened, 1) if opened is not None else None,
            "state": _state(conn),
            "sessions": _count(conn.session_head(0)),
            "links": _count(conn.link_head(0)),
            "broker": None,
            "upstream": None,
        }
        if pair is not None:  # in front of a broker: the client's own upstream connection
            record["broker"] = pair.broker.redacted
            record["upstream"] = _state(pair.upstream)
        records.append(record)
    return records


def _role(link: Link) -> str:
    if link.is_receiver:
        if link.remote_target.type == Terminus.COORDINATOR or kept(link, "qf_coordinator"):
            return "coordinator"
        return "producer"
    return "consumer"


def _address(link: Link) -> str | None:
    # The answered terminus when there is one (a dynamic node's name is qpid-flow's or the
    # broker's), else what the client asked for.
    if link.is_receiver:
        return link.target.address or link.remote_target.address
    return link.source.address or link.remote_source.address


def link_records(router: Router, blocked: Any = None, waiting: Collection[int] = ()) -> list[dict[str, Any]]:
    """One record per client link. ``blocked(address)`` says whether flow control holds the
    producers of a destination now (None: never); ``waiting``: the ids of the producers
    waiting for the answer to a transfer a policy holds (:meth:`Router.waiting_producers`).
    A link is ``blocked`` as the destination's ``producersBlocked`` counts it."""
    records = []
    for conn in _connections(router):
        link = conn.link_head(0)
        while link is not None:
            role = _role(link)
            address = _address(link)
            producer = kept(link, "qf_producer")
            consumer = kept(link, "qf_consumer")
            route = kept(link, "qf_route")
            if producer is not None:
                transfers = producer.transfers
            elif consumer is not None:
                transfers = consumer.delivered
            elif route is not None:
                transfers = route.delivered
            else:
                transfers = None  # a link qpid-flow only mirrors (a coordinator, a broker's topic)
            credit = link.credit
            records.append(
                {
                    "connection": kept(conn, "qf_id"),
                    "name": link.name,
                    "role": role,
                    "direction": "in" if link.is_receiver else "out",
                    "address": address,
                    "state": _state(link),
                    "credit": credit,
                    "unsettled": link.unsettled,
                    "deliveries": transfers,
                    "blocked": producer is not None and _held_back(producer, credit, address, blocked, waiting),
                }
            )
            link = link.next(0)
    return records


def _held_back(producer: Producer, credit: int, address: str | None, blocked: Any, waiting: Collection[int]) -> bool:
    """Waiting for the answer to a transfer a policy holds (unforwarded, or its settlement:
    an anonymous-relay link too), or left with no credit while flow control holds its
    destination's producers."""
    if producer.id in waiting:
        return True
    return bool(credit == 0 and address and blocked is not None and blocked(address))


def close_connection(router: Router, connection_id: str, description: str) -> dict[str, Any]:
    """Close a client connection with ``amqp:connection:forced``; KeyError if there is none."""
    for conn in router.connections:
        if kept(conn, "qf_id") == connection_id:
            if conn.state & Endpoint.LOCAL_ACTIVE:
                conn.condition = Condition("amqp:connection:forced", description)
                conn.close()
            return {"closed": connection_id, "user": kept(conn, "qf_user") or "anonymous"}
    raise KeyError(connection_id)
