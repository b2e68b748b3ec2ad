"""A minimal standalone AMQP 1.0 relay, written for the benchmark. Not part of qpid-flow.

    python bench/minimal_relay.py [--listen 127.0.0.1:5674] [--window 100] [--container proton|qpid-flow]

The floor any Python intermediary on the Proton reactor pays per message: the same Proton
Python API as qpid-flow's data path (a bare ``proton.Handler``, its own credit and
settlement, raw bytes, never decoded), and nothing else: an in-memory deque per address,
no policies, no plugins, no limits, no logging per message.

``--container qpid-flow`` runs the same handler on qpid-flow's own reactor
(``qpid_flow.amqp.reactor.RelayContainer``: fewer Python objects per Proton event, transport
updates batched), so that qpid-flow can be compared with a relay on the same reactor.

- A producer link gets ``--window`` credit, topped up as transfers arrive. A transfer is
  accepted (and settled) once its bytes are on the address's deque; pre-settled ones are
  just queued.
- A consumer link is served from the deque while it has credit; it settles with its
  outcome: accepted and rejected messages leave, released and modified ones go back to the
  front of the deque. Consumers of one address take turns. A consumer that detaches
  puts back what it held, at the front, in order.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
from collections import deque
from typing import Any

from proton import Delivery, Endpoint, Handler, Link
from proton.reactor import Container

LOCAL_UNINIT = Endpoint.LOCAL_UNINIT
LOCAL_ACTIVE = Endpoint.LOCAL_ACTIVE
ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED


class Address:
    __slots__ = ("consumers", "messages", "turn")

    def __init__(self) -> None:
        self.messages: deque[bytes] = deque()
        self.consumers: list[Link] = []
        self.turn = 0


class MinimalRelay(Handler):
    def __init__(self, window: int, lean: bool = False) -> None:
        """``lean``: delivery events carry qpid-flow's ``LeanDelivery`` (on RelayContainer),
        which settles with ``settle_as`` rather than Proton's ``update``."""
        super().__init__()
        self.window = window
        self.lean = lean
        self.addresses: dict[str, Address] = {}
        self.tags = itertools.count(1)

    def address(self, name: str) -> Address:
        found = self.addresses.get(name)
        if found is None:
            found = self.addresses[name] = Address()
        return found

    # --- endpoints ------------------------------------------------------------------------

    def on_connection_remote_open(self, event: Any) -> None:
        if event.connection.state & LOCAL_UNINIT:
            event.connection.open()

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & LOCAL_UNINIT:
            event.session.open()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & LOCAL_UNINIT:
            return
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.is_receiver:
            link.snd_settle_mode = link.remote_snd_settle_mode
            link.rcv_settle_mode = Link.RCV_FIRST
            link.relay_address = self.address(link.remote_target.address or "")
            link.open()
            link.flow(self.window)
        else:
            link.snd_settle_mode = link.remote_snd_settle_mode
            address = self.address(link.remote_source.address or "")
            link.relay_address = address
            link.relay_held = {}
            link.open()
            address.consumers.append(link)

    def on_link_remote_close(self, event: Any) -> None:
        self.link_gone(event.link)
        if event.link.state & LOCAL_ACTIVE:
            event.link.close()

    on_link_remote_detach = on_link_remote_close

    def on_session_remote_close(self, event: Any) -> None:
        if event.session.state & LOCAL_ACTIVE:
            event.session.close()

    def on_connection_remote_close(self, event: Any) -> None:
        self.connection_gone(event.connection)
        if event.connection.state & LOCAL_ACTIVE:
            event.connection.close()

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            self.connection_gone(event.connection)

    def connection_gone(self, connection: Any) -> None:
        link = connection.link_head(0)
        while link is not None:
            self.link_gone(link)
            link = link.next(0)

    def link_gone(self, link: Any) -> None:
        held = getattr(link, "relay_held", None)
        if held is None:
            return
        link.relay_held = None
        address = link.relay_address
        if link in address.consumers:
            address.consumers.remove(link)
        address.messages.extendleft(reversed(list(held.values())))
        self.dispatch(address)

    # --- data -------------------------------------------------------------------------------

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        link = event.link
        if link.is_receiver:
            if delivery.aborted:
                delivery.settle()
                return
            if delivery.partial or not delivery.readable:
                return
            data = link.recv(delivery.pending)
            link.advance()
            address = link.relay_address
            address.messages.append(data)
            if self.lean and not delivery.settled:
                delivery.settle_as(ACCEPTED)  # update and settle
            else:
                if not delivery.settled:
                    delivery.update(ACCEPTED)
                delivery.settle()
            if link.credit < self.window // 2:
                link.flow(self.window - link.credit)
            if address.consumers:
                self.dispatch(address)
        else:
            state = delivery.remote_state
            if not state:
                return
            held = link.relay_held
            data = held.pop(delivery._impl, None) if held is not None else None
            delivery.settle()
            if data is not None and state != ACCEPTED and state != REJECTED:
                address = link.relay_address
                address.messages.appendleft(data)  # released or modified: back to the front
                self.dispatch(address)

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender and getattr(link, "relay_held", None) is not None:
            self.dispatch(link.relay_address)
            if link.drain_mode and link.credit > 0:
                link.drained()

    def dispatch(self, address: Address) -> None:
        messages = address.messages
        consumers = address.consumers
        while messages and consumers:
            progress = False
            for _ in range(len(consumers)):
                address.turn = (address.turn + 1) % len(consumers)
                link = consumers[address.turn]
                if link.credit <= 0:
                    continue
                data = messages.popleft()
                tag = str(next(self.tags))
                delivery = link.delivery(tag)
                link.send(data)
                link.advance()
                if link.snd_settle_mode == Link.SND_SETTLED:
                    delivery.settle()
                else:
                    # Keyed by the C delivery: what both Proton's Delivery and
                    # qpid-flow's LeanDelivery (on RelayContainer) hold.
                    link.relay_held[delivery._impl] = data
                progress = True
                if not messages:
                    return
            if not progress:
                return


def make_container(kind: str, handler: Handler) -> Container:
    """Proton's stock ``Container``, or qpid-flow's ``RelayContainer`` (qpid_flow/amqp/reactor.py:
    PN_DELIVERY events on a short path, transport I/O updates batched per reactor turn),
    to tell the cost of qpid-flow's data path from the cost of the reactor under it."""
    if kind == "qpid-flow":
        from qpid_flow.amqp.reactor import RelayContainer

        container = RelayContainer()
        container.handler = handler  # as qpid-flow's server sets it: the short path calls it directly
        return container
    return Container(handler)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:5674")
    parser.add_argument(
        "--container",
        choices=["proton", "qpid-flow"],
        default="proton",
        help="reactor: Proton's stock Container (default) or qpid-flow's RelayContainer",
    )
    parser.add_argument(
        "--window", type=int, default=100, help="credit per producer link (qpid-flow's producer_window is 100)"
    )
    args = parser.parse_args()
    container = make_container(args.container, MinimalRelay(args.window, lean=args.container == "qpid-flow"))
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
