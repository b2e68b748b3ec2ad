"""Producer credit as a window: the rule the pass-through policy and the router's
default share (no Proton here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qpid_flow.core.model import Producer

__all__ = ["window_need"]


def window_need(window: int, producer: Producer) -> int:
    """Credit that tops a producer up to ``window`` (credit held + transfers unsettled).

    Top up in batches of at least half a window: one flow frame per many messages.
    """
    missing = window - producer.credit - producer.unsettled
    if missing <= 0 or (missing * 2 < window and producer.credit > 0):
        return 0
    return missing
