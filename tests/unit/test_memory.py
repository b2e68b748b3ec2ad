"""The router-wide memory meter: over the limit, and every listener told when it falls back."""

from __future__ import annotations

from qpid_flow.core.memory import MemoryMeter


def test_every_listener_hears_each_fall_back_below_the_limit() -> None:
    meter = MemoryMeter(limit=100)
    heard: list[str] = []
    meter.when_below(lambda: heard.append("flow control"))
    meter.when_below(lambda: heard.append("another plugin"))
    meter.add(150)
    assert meter.over
    meter.sub(30)  # 120: still over
    assert heard == []
    meter.sub(20)  # 100: the limit reached is still full (SEMANTICS: when reached, credit stops)
    assert meter.over and heard == []
    meter.sub(1)  # 99: below it
    assert not meter.over
    assert heard == ["flow control", "another plugin"]
    meter.sub(50)  # already below: nothing new
    assert heard == ["flow control", "another plugin"]


def test_no_limit_is_never_over() -> None:
    meter = MemoryMeter()
    meter.add(10**12)
    assert not meter.over


def test_each_message_counts_for_its_bytes_and_what_holding_it_costs() -> None:
    """10-byte messages under a 50 MB limit filled 794 MB resident: counted by their bytes
    alone, a message's own record (about 350 bytes) went uncounted. The router's meter
    counts MESSAGE_OVERHEAD more for each (ActiveMQ counts each at 1 KiB at least)."""
    from qpid_flow.core.memory import MESSAGE_OVERHEAD

    meter = MemoryMeter(limit=10 * (23 + MESSAGE_OVERHEAD), per_message=MESSAGE_OVERHEAD)
    for _ in range(9):
        meter.add(23)
    assert not meter.over
    meter.add(23)
    assert meter.over and meter.held == meter.charge(230, messages=10)
    meter.hold(23)
    assert meter.waiting == 23 + MESSAGE_OVERHEAD
    meter.unhold(23)
    meter.sub(230, messages=10)
    meter.add(5, messages=0)  # a message held already grew: no second record
    assert (meter.held, meter.waiting) == (5, 0)
