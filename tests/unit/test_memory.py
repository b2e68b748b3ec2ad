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
