"""Give Proton back the links and sessions both sides have ended.

Proton keeps every link and session of a connection (its C state, about 2 KB a link with
qpid-flow's attributes) until the application frees it or the connection goes. A client
that keeps one connection for days and opens a consumer per request (JMS listener
containers do) would make qpid-flow grow by that much for every link it ever opened.

The container calls :func:`handled` after the handlers have seen each event. An endpoint
is freed once both sides have ended it (closed, or detached both ways): every frame about
it has been exchanged, and qpid-flow's handlers have forgotten it (``_link_gone``), and
no delivery of it is unsettled here (freeing would settle them, which the peer would be
told). A link that ends with unsettled deliveries stays until its session or its
connection ends: an ended session is freed with its links once qpid-flow's end frame has
been written (:func:`flush`), so that the settlements freeing makes are not sent (the
session's channel is gone by then). Deliveries qpid-flow still holds stay valid (each
holds its link).

Before freeing, qpid-flow's attributes on the endpoint are dropped: they hold wrappers of
other endpoints (a client link and its upstream link name each other), whose references
would keep both alive for good once Proton no longer frees them with their connection.
"""

from __future__ import annotations

from typing import Any

from cproton import (
    PN_LINK_LOCAL_CLOSE,
    PN_LINK_LOCAL_DETACH,
    PN_LINK_REMOTE_CLOSE,
    PN_LINK_REMOTE_DETACH,
    PN_SESSION_LOCAL_CLOSE,
    PN_SESSION_REMOTE_CLOSE,
    pn_event_link,
    pn_event_session,
)
from proton import Endpoint, Link, Session

__all__ = ["flush", "handled"]

_LINK_END_EVENTS = (PN_LINK_LOCAL_CLOSE, PN_LINK_REMOTE_CLOSE, PN_LINK_LOCAL_DETACH, PN_LINK_REMOTE_DETACH)
_SESSION_END_EVENTS = (PN_SESSION_LOCAL_CLOSE, PN_SESSION_REMOTE_CLOSE)

_CLOSED_BOTH = Endpoint.LOCAL_CLOSED | Endpoint.REMOTE_CLOSED
_FREED = "qf_freed"
_ENDING = "qf_ending"  # ended both ways, to be freed at the next flush
# Detached without closing, by each side (Proton's state bits do not show a detach).
_DETACHED_HERE = "qf_detached_here"
_DETACHED_THERE = "qf_detached_there"
_DETACHED = {PN_LINK_LOCAL_DETACH: _DETACHED_HERE, PN_LINK_REMOTE_DETACH: _DETACHED_THERE}
# Sessions waiting for flush(): one reactor thread runs them all.
_ending: list[Session] = []


def _attrs(wrapper: Any) -> Any:
    return wrapper.__dict__["_attrs"]


def _forget(wrapper: Any) -> None:
    """Drop what qpid-flow kept on ``wrapper`` (its ``qf_`` attributes; Proton's own, such
    as ``condition``, stay) and mark it freed."""
    attrs = _attrs(wrapper)
    for name in [name for name in attrs if name.startswith("qf_")]:
        del attrs[name]
    attrs[_FREED] = True


def _freed(wrapper: Any) -> bool:
    return _FREED in _attrs(wrapper)


def handled(raw: Any, kind: int) -> None:
    """The handlers have seen the engine event ``raw`` of type ``kind``: free what it ended."""
    if kind in _LINK_END_EVENTS:
        _link_ended(pn_event_link(raw), kind)
    elif kind in _SESSION_END_EVENTS:
        _session_ended(pn_event_session(raw))


def _link_ended(link_impl: Any, kind: int) -> None:
    link = Link.wrap(link_impl)
    attrs = _attrs(link)
    if _FREED in attrs:
        return
    flag = _DETACHED.get(kind)
    if flag is not None:
        attrs[flag] = True
    # Either way on each side: RabbitMQ answers a close with a bare detach, and qpid-flow
    # answers a client with the broker's mode.
    ended_here = link.state & Endpoint.LOCAL_CLOSED or _DETACHED_HERE in attrs
    ended_there = link.state & Endpoint.REMOTE_CLOSED or _DETACHED_THERE in attrs
    # Not while deliveries are unsettled here: freeing would settle them, which tells the
    # peer (RabbitMQ keeps a detached consumer's unsettled messages from everyone until its
    # connection closes, and takes a bare settlement as an error). Such a link stays until
    # its session or connection ends.
    if ended_here and ended_there and link.unsettled == 0:
        _forget(link)
        link.free()


def _session_ended(session_impl: Any) -> None:
    """A session ended both ways is freed, with its links, at the next :func:`flush`."""
    session = Session.wrap(session_impl)
    attrs = _attrs(session)
    if _FREED in attrs or attrs.get(_ENDING) or session.state & _CLOSED_BOTH != _CLOSED_BOTH:
        return
    attrs[_ENDING] = True
    _ending.append(session)


def flush() -> None:
    """Free the sessions ended both ways since the last call. Called once the turn's output
    has been written (the container, after writing; a test rig, before its next dispatch):
    freeing a session settles its links' unsettled deliveries, and before qpid-flow's own
    end frame is out Proton would write a bare settlement for each of them first."""
    ending = _ending[:]
    _ending.clear()
    for session in ending:
        if _freed(session):
            continue
        link = session.connection.link_head(0)
        while link is not None:
            if link.session == session and not _freed(link):
                _forget(link)
            link = link.next(0)
        _forget(session)
        session.free()
