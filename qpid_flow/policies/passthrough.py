"""The pass-through policy: what qpid-flow does when no other policy has an opinion.

Producers hold a fixed window of credit (``producer_window``), topped up as their
transfers settle, so a producer never has more than a window of messages in flight
through qpid-flow. Every transfer is admitted. Consumers take turns.

Registered ``trylast``: any installed plugin answering these questions is asked first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qpid_flow import hookimpl
from qpid_flow.core.credit import window_need
from qpid_flow.core.model import ADMIT, Producer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from qpid_flow.config import RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Decision


class Plugin:
    def __init__(self) -> None:
        self.window = 100

    @hookimpl(trylast=True)
    def qpid_flow_configure(self, config: RouterConfig) -> None:
        self.window = config.producer_window

    @hookimpl(trylast=True)
    def qpid_flow_producer_credit(self, producer: Producer) -> int:
        return window_need(self.window, producer)

    @hookimpl(trylast=True)
    def qpid_flow_transfer_arrived(self) -> Decision:
        return ADMIT

    @hookimpl(trylast=True)
    def qpid_flow_consumer_select(self, destination: Destination, consumers: Sequence[Consumer]) -> Consumer:
        # Round robin: remember where the last turn ended, per destination.
        turn = destination.plugin_state.get("passthrough", 0) + 1
        destination.plugin_state["passthrough"] = turn
        return consumers[turn % len(consumers)]
