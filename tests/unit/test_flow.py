"""Flow-control thresholds and state, replaying the seeds' own numbers."""

from __future__ import annotations

import pytest

from qpid_flow.config import ConfigError, DestinationPolicy, build_config
from qpid_flow.policies.flow_control.plugin import limits_in_force
from qpid_flow.policies.flow_control.thresholds import FlowLimits, FlowState, FlowTransition, LimitError, flow_limits

KB = 1024


def test_seed_000_stop_900_resume_500_of_1000() -> None:
    limits, _ = flow_limits(DestinationPolicy.of(max_count=1000, flow_stop_count=900, flow_resume_count=500))
    state = FlowState(limits)
    for count in range(1, 901):
        assert state.update(count, 0) is None, f"{count} enqueued must still be OFF"
    assert state.update(901, 0) is FlowTransition.STOPPED
    assert state.stopped and state.stopped_count == 1
    for count in range(900, 499, -1):  # draining: 500 remaining is still ON
        assert state.update(count, 0) is None
        assert state.stopped
    assert state.update(499, 0) is FlowTransition.RESUMED
    assert not state.stopped
    assert state.update(600, 0) is None, "back between the thresholds: stays OFF (hysteresis)"
    assert state.update(901, 0) is FlowTransition.STOPPED
    assert state.stopped_count == 2


def test_seed_000_count_or_bytes_to_stop_both_to_resume() -> None:
    limits, _ = flow_limits(
        DestinationPolicy.of(
            max_count=5000,
            max_size=10 * KB,
            flow_stop_count=4000,
            flow_resume_count=3000,
            flow_stop_size=8 * KB,
            flow_resume_size=6 * KB,
        )
    )
    assert limits == FlowLimits(4000, 3000, 8 * KB, 6 * KB)
    by_count = FlowState(limits)
    assert by_count.update(4000, 1 * KB) is None
    assert by_count.update(4001, 1 * KB) is FlowTransition.STOPPED
    by_size = FlowState(limits)
    assert by_size.update(10, 8 * KB) is None
    assert by_size.update(11, 8 * KB + 1) is FlowTransition.STOPPED
    # ON until BOTH are below their resume thresholds.
    assert by_size.update(2999, 6 * KB) is None, "count is below 3000 but bytes are not below 6K"
    assert by_size.update(3000, 6 * KB - 1) is None, "bytes below 6K but count not below 3000"
    assert by_size.update(2999, 6 * KB - 1) is FlowTransition.RESUMED


def test_seed_000_defaults_90_75_of_10000_bytes() -> None:
    limits, _ = flow_limits(DestinationPolicy.of(max_size=10000), 90, 75)
    assert (limits.stop_size, limits.resume_size) == (9000, 7500)
    limits, _ = flow_limits(DestinationPolicy.of(max_count=10000), 90, 75)
    assert (limits.stop_count, limits.resume_count) == (9000, 7500)


def test_default_ratios_are_80_and_70() -> None:
    limits, _ = flow_limits(DestinationPolicy.of(max_count=1000))
    assert (limits.stop_count, limits.resume_count) == (800, 700)


def test_seed_003_200_mb_at_80_percent_stops_at_163840() -> None:
    # seed 003: "qpid.max_size of 204800 ... flow_stop_threshold of 80 ... 163840 bytes".
    limits, _ = flow_limits(DestinationPolicy.of(max_size=204800), 80, 70)
    assert limits.stop_size == 163840


def test_zero_default_ratios_disable_defaults_but_explicit_values_still_apply() -> None:
    limits, _ = flow_limits(DestinationPolicy.of(max_count=1000), 0, 0)
    assert not limits.enabled
    limits, _ = flow_limits(DestinationPolicy.of(max_count=1000, flow_stop_count=10, flow_resume_count=5), 0, 0)
    assert limits == FlowLimits(stop_count=10, resume_count=5)


def test_explicit_zero_stops_disable_flow_control_on_the_destination() -> None:
    limits, _ = flow_limits(DestinationPolicy.of(max_count=1000, max_size=10000, flow_stop_count=0, flow_stop_size=0))
    assert not limits.enabled


def test_ring_destinations_never_flow_control() -> None:
    limits, warnings = flow_limits(DestinationPolicy.of(max_count=10, limit_policy="ring"))
    assert not limits.enabled and warnings == []
    limits, warnings = flow_limits(DestinationPolicy.of(max_count=10, limit_policy="ring", flow_stop_count=5))
    assert not limits.enabled
    assert warnings == ["flow_stop_count has no effect: a ring destination drops its oldest, never stops"]


def test_resume_zero_with_stop_means_resume_at_stop() -> None:
    limits, _ = flow_limits(DestinationPolicy.of(flow_stop_count=100, flow_resume_count=0))
    assert (limits.stop_count, limits.resume_count) == (100, 100)
    state = FlowState(limits)
    state.update(101, 0)
    assert state.update(100, 0) is None
    assert state.update(99, 0) is FlowTransition.RESUMED


@pytest.mark.parametrize(
    ("maximum", "stop_percent", "resume_percent", "expected"),
    [(100, 80, 0, (80, 80)), (6, 50, 10, (3, 3)), (1000, 80, 70, (800, 700))],
)
def test_a_default_resume_of_zero_means_resume_at_stop(
    maximum: int, stop_percent: int, resume_percent: int, expected: tuple[int, int]
) -> None:
    """A 0 % resume default (or one truncated to 0 on a small maximum) with a stop set is
    read as explicit values are: resume = stop. At 0, "fewer than 0 messages" never holds
    and a destination that stopped once stayed stopped with nothing in it."""
    limits, _ = flow_limits(DestinationPolicy.of(max_count=maximum), stop_percent, resume_percent)
    assert (limits.stop_count, limits.resume_count) == expected
    state = FlowState(limits)
    state.update(expected[0] + 1, 0)
    assert state.update(0, 0) is FlowTransition.RESUMED


def test_resume_without_stop_is_a_warning() -> None:
    limits, warnings = flow_limits(DestinationPolicy.of(flow_resume_count=5), 0, 0)
    assert not limits.enabled
    assert warnings and "flow_resume_count" in warnings[0]


@pytest.mark.parametrize(
    ("policy", "key"),
    [
        (DestinationPolicy.of(flow_stop_count=500, flow_resume_count=900), "flow_resume_count"),
        (DestinationPolicy.of(max_count=1000, flow_stop_count=1000), "flow_stop_count"),
        (DestinationPolicy.of(max_size=100, flow_stop_size=200, flow_resume_size=10), "flow_stop_size"),
        (DestinationPolicy.of(flow_stop_size=10, flow_resume_size=20), "flow_resume_size"),
    ],
)
def test_impossible_thresholds_are_errors(policy: DestinationPolicy, key: str) -> None:
    with pytest.raises(LimitError) as caught:
        flow_limits(policy)
    assert caught.value.key == key


def test_configuration_refuses_bad_thresholds_naming_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(
            {"destinations": {"orders": {"max_count": 1000, "flow_stop_count": 900, "flow_resume_count": 950}}}
        )
    assert caught.value.key == 'destinations."orders".flow_resume_count'
    assert "must not be above flow_stop_count (900)" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        build_config({"default_flow_stop_threshold": 60, "default_flow_resume_threshold": 70})
    assert caught.value.key == "default_flow_resume_threshold"
    with pytest.raises(ConfigError):
        build_config({"destinations": {"q": {"limit_policy": "ring", "reject_after": "1s"}}})


def test_qpid_declare_aliases_for_thresholds() -> None:
    config = build_config({"destinations": {"q": {"qpid.flow_stop_count": 9, "qpid.flow_resume_count": 4}}})
    limits, _ = limits_in_force(config, config.policy_for("q"))
    assert (limits.stop_count, limits.resume_count) == (9, 4)


def test_headroom_admits_exactly_up_to_the_crossing_message() -> None:
    state = FlowState(FlowLimits(stop_count=900, resume_count=500))
    assert state.headroom(0, 0, 100) == 901  # the 901st is admitted: it is what turns flow ON
    assert state.headroom(850, 0, 100) == 51
    state.update(901, 0)
    assert state.headroom(901, 0, 100) == 0
    by_size = FlowState(FlowLimits(stop_size=8 * KB, resume_size=6 * KB))
    assert by_size.headroom(0, 8 * KB - 100, 100) == 2  # one fits under, the next crosses
    assert FlowState(FlowLimits()).headroom(10**6, 10**9, 100) is None


def test_policy_change_at_runtime_reevaluates() -> None:
    state = FlowState(FlowLimits(stop_count=10, resume_count=5))
    state.update(11, 0)
    assert state.change_limits(FlowLimits(stop_count=100, resume_count=50), 11, 0) is FlowTransition.RESUMED
    assert state.change_limits(FlowLimits(stop_count=5, resume_count=2), 11, 0) is FlowTransition.STOPPED
    assert state.change_limits(FlowLimits(), 11, 0) is FlowTransition.RESUMED


def test_time_stopped_is_accumulated() -> None:
    state = FlowState(FlowLimits(stop_count=1, resume_count=1))
    state.update(2, 0, now=10.0)
    assert state.seconds_stopped(12.5) == 2.5
    state.update(0, 0, now=13.0)
    assert state.seconds_stopped(100.0) == 3.0
