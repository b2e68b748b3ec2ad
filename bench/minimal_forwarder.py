"""A minimal AMQP 1.0 forwarder in front of a broker, written for the benchmark. Not part of qpid-flow.

    python bench/minimal_forwarder.py --broker amqp://guest:guest@127.0.0.1:5672 [--listen 127.0.0.1:5675]

The floor of broker mode: what one Python process pays to take each message through
Proton twice (client to broker, broker to client), with nothing else. It runs on
qpid-flow's own reactor (``qpid_flow.amqp.reactor.RelayContainer``) and its lean delivery helpers
(``qpid_flow.amqp.endpoints``), the fastest way this project knows to drive Proton from
Python, so the gap between it and qpid-flow is qpid-flow's own work.

- Each client connection gets its own connection to the broker (as qpid-flow does), and
  each client link a twin on it, with the same address and settle modes.
- A producer gets the credit the broker gives its twin; each transfer is forwarded as it
  completes, and settled with the broker's outcome once the broker settles it.
- A consumer's credit is passed on to its twin; each message the broker sends is
  forwarded as it completes, and the client's outcome settles it at the broker.
- No policies, no hooks, no bookkeeping, no logging per message; errors end the run.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
from typing import Any

from proton import Endpoint, Handler, Link
from proton.reactor import Container

from qpid_flow.amqp.endpoints import LeanDelivery, keep_link, new_delivery, send_transfer, take_transfer
from qpid_flow.amqp.reactor import RelayContainer

LOCAL_UNINIT = Endpoint.LOCAL_UNINIT
LOCAL_ACTIVE = Endpoint.LOCAL_ACTIVE


class Twins:
    """The pairs of links and of deliveries: each side's C pointer -> the other side."""

    def __init__(self) -> None:
        self.link: dict[Any, Link] = {}  # link impl -> its twin
        self.delivery: dict[Any, LeanDelivery] = {}  # delivery impl -> its twin, until settled
        self.tags = itertools.count(1)

    def pair(self, a: Link, b: Link) -> None:
        keep_link(a)
        keep_link(b)
        self.link[a._impl] = b
        self.link[b._impl] = a

    def forward(self, event: Any) -> None:
        """A complete transfer arrived on one side: send it on the twin link."""
        delivery = event.delivery
        if delivery.partial or not delivery.readable:
            return
        link = event.link
        data = take_transfer(link, delivery.pending)
        twin = self.link[event.link_impl]
        copy = new_delivery(twin, str(next(self.tags)))
        send_transfer(twin, data)
        if delivery.settled:  # pre-settled: nothing will come back
            copy.settle()
        else:
            self.delivery[copy._impl] = delivery

    def settle(self, event: Any) -> None:
        """The peer of a forwarded copy gave its outcome: give it to the original."""
        state = event.delivery.remote_state
        if not state:
            return
        original = self.delivery.pop(event.impl, None)
        event.delivery.settle()
        if original is not None:
            original.settle_as(state)

    def sync_credit(self, receiver: Link) -> None:
        """A receiving link gets the credit its twin (a sender) has."""
        sender = self.link.get(receiver._impl)
        if sender is not None and sender.credit > receiver.credit:
            receiver.flow(sender.credit - receiver.credit)


class UpstreamSide(Handler):
    """The broker connection of one client connection."""

    def __init__(self, twins: Twins) -> None:
        super().__init__()
        self.twins = twins

    def on_delivery(self, event: Any) -> None:
        if event.link.is_receiver:
            self.twins.forward(event)  # a message for the client's consumer
        else:
            self.twins.settle(event)  # the broker's outcome for a client's transfer

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender:  # the broker's credit for a client's producer
            twin = self.twins.link.get(link._impl)
            if twin is not None:
                self.twins.sync_credit(twin)


class ClientSide(Handler):
    """Accepted client connections: the default handler of the container."""

    def __init__(self, broker: str) -> None:
        super().__init__()
        self.broker = broker
        self.twins = Twins()
        self.upstream_of: dict[Any, Any] = {}  # client connection impl -> broker connection

    def on_connection_remote_open(self, event: Any) -> None:
        connection = event.connection
        if connection.state & LOCAL_UNINIT:
            connection.open()
            upstream = event.container.connect(self.broker, handler=UpstreamSide(self.twins), reconnect=False)
            self.upstream_of[connection._impl] = upstream

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & LOCAL_UNINIT:
            event.session.open()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & LOCAL_UNINIT:
            return
        upstream = self.upstream_of[event.connection._impl]
        session = getattr(upstream, "forwarder_session", None)
        if session is None:
            session = upstream.forwarder_session = upstream.session()
            session.open()
        name = link.name
        twin = session.sender(name) if link.is_receiver else session.receiver(name)
        twin.source.copy(link.remote_source)
        twin.target.copy(link.remote_target)
        twin.snd_settle_mode = link.remote_snd_settle_mode
        twin.rcv_settle_mode = link.remote_rcv_settle_mode
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        self.twins.pair(link, twin)
        twin.open()
        link.open()

    def on_delivery(self, event: Any) -> None:
        if event.link.is_receiver:
            self.twins.forward(event)  # a client's transfer for the broker
        else:
            self.twins.settle(event)  # a consumer's outcome for the broker's message

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender:  # a consumer's credit: its twin asks the broker for as much
            twin = self.twins.link.get(link._impl)
            if twin is not None:
                self.twins.sync_credit(twin)

    def on_link_remote_close(self, event: Any) -> None:
        if event.link.state & LOCAL_ACTIVE:
            event.link.close()
        twin = self.twins.link.get(event.link._impl)
        if twin is not None and twin.state & LOCAL_ACTIVE:
            twin.close()

    def on_connection_remote_close(self, event: Any) -> None:
        if event.connection.state & LOCAL_ACTIVE:
            event.connection.close()
        upstream = self.upstream_of.pop(event.connection._impl, None)
        if upstream is not None:
            upstream.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:5675")
    parser.add_argument("--broker", required=True, help="amqp://[user:password@]host:port")
    args = parser.parse_args()
    container: Container = RelayContainer()
    container.handler = ClientSide(args.broker)  # as qpid-flow's server sets it: the short path calls it
    container.listen(args.listen)

    def stop(_signum: int, _frame: Any) -> None:
        container.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"listening on {args.listen}", file=sys.stderr, flush=True)
    container.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
