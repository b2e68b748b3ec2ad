"""Producer flow control as the Qpid C++ broker defines it: thresholds and their state.

Plain Python, no Proton. :func:`flow_limits` turns a destination policy into stop and
resume thresholds (explicit values, or defaults as percentages of the destination's
maximum), checking the rules qpidd checks; :class:`FlowState` is the per-destination
state machine with qpidd's exact comparisons:

- it turns ON when ``count > stop_count`` or ``size > stop_size`` (strictly greater; a
  zero stop value disables that dimension);
- it stays ON until ``count < resume_count`` and ``size < resume_size`` (strictly less).

With stop 900 / resume 500: 900 messages is still OFF, the 901st turns it ON, and it
turns OFF again only when fewer than 500 remain.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qpid_flow.config import DestinationPolicy

__all__ = ["FlowLimits", "FlowState", "FlowTransition", "LimitError", "flow_limits"]


class LimitError(ValueError):
    """Thresholds that break qpidd's rules; ``key`` names the offending setting."""

    def __init__(self, key: str, value: int, rule: str) -> None:
        super().__init__(f"{key} = {value}: {rule}")
        self.key = key
        self.value = value
        self.rule = rule


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Stop and resume thresholds in messages and bytes; 0 disables a dimension."""

    stop_count: int = 0
    resume_count: int = 0
    stop_size: int = 0
    resume_size: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.stop_count or self.stop_size)

    def as_dict(self) -> dict[str, int]:
        return {
            "flowStopCount": self.stop_count,
            "flowResumeCount": self.resume_count,
            "flowStopSize": self.stop_size,
            "flowResumeSize": self.resume_size,
        }


def _dimension(
    name: str,
    maximum: int,
    explicit_stop: int | None,
    explicit_resume: int | None,
    stop_percent: int,
    resume_percent: int,
    warnings: list[str],
) -> tuple[int, int]:
    """Stop and resume for one dimension ("count" or "size")."""
    if explicit_stop is None and explicit_resume is not None:
        # A resume alone is dropped, not read as "no flow control here" (a stop of 0): the
        # dimension gets the router defaults, as one with neither threshold set does.
        # (It came out as stop 0, which switched flow control off for the dimension: max_count
        # 1000 with flow_resume_count 500 filled to the max and rejected.)
        warnings.append(
            f"flow_resume_{name} = {explicit_resume} has no effect without flow_stop_{name}: the router defaults apply"
        )
        explicit_resume = None
    if explicit_stop is None and explicit_resume is None:
        if not maximum or not stop_percent:
            return 0, 0
        # qpidd: the stop threshold is rounded, the resume threshold truncated.
        stop = int(maximum * stop_percent / 100 + 0.5)
        if maximum > 1:
            # Below the maximum, as an explicit stop must be: flow has to turn ON before the
            # maximum rejects (80 % of max_count 2 rounds to 2, and a 100 % default is the
            # max itself: producers were rejected at the max instead of held). With a maximum
            # of 1 no stop fits below it; the maximum alone limits.
            stop = min(stop, maximum - 1)
        resume = min(maximum * resume_percent // 100, stop)
        # As for explicit values, a resume of 0 (a 0 % default, or one truncated to 0 on a
        # small maximum) means "resume below the stop threshold": at 0 flow never resumes.
        return stop, resume or stop
    stop = explicit_stop or 0
    resume = explicit_resume or 0
    if not stop:
        if resume:
            warnings.append(f"flow_resume_{name} = {resume} has no effect without flow_stop_{name}")
        return 0, 0
    if resume > stop:
        raise LimitError(f"flow_resume_{name}", resume, f"must not be above flow_stop_{name} ({stop})")
    if maximum and stop >= maximum:
        raise LimitError(f"flow_stop_{name}", stop, f"must be below max_{name} ({maximum})")
    # A resume of 0 with a stop set means "resume as soon as below the stop threshold".
    return stop, resume or stop


def flow_limits(
    policy: DestinationPolicy,
    default_stop_percent: int = 80,
    default_resume_percent: int = 70,
) -> tuple[FlowLimits, list[str]]:
    """The thresholds in force for ``policy``, and warnings worth logging.

    Explicit per-destination thresholds win; a dimension without them gets the router
    defaults as percentages of the destination's maximum (none without a maximum). Ring
    destinations never flow-control. Raises :class:`LimitError` for impossible values.
    """
    warnings: list[str] = []
    if policy.limit_policy == "ring":
        given = [f"flow_{k}" for k in ("stop_count", "resume_count", "stop_size", "resume_size")]
        given = [key for key in given if policy.setting(key) is not None]
        if given:
            warnings.append(f"{', '.join(given)} has no effect: a ring destination drops its oldest, never stops")
        return FlowLimits(), warnings
    stop_count, resume_count = _dimension(
        "count",
        policy.max_count or 0,
        policy.setting("flow_stop_count"),
        policy.setting("flow_resume_count"),
        default_stop_percent,
        default_resume_percent,
        warnings,
    )
    stop_size, resume_size = _dimension(
        "size",
        policy.max_size or 0,
        policy.setting("flow_stop_size"),
        policy.setting("flow_resume_size"),
        default_stop_percent,
        default_resume_percent,
        warnings,
    )
    return FlowLimits(stop_count, resume_count, stop_size, resume_size), warnings


class FlowTransition(enum.Enum):
    STOPPED = "flow_stopped"
    RESUMED = "flow_resumed"


class FlowState:
    """One destination's flow-control state, updated on every change of its depth."""

    __slots__ = ("limits", "stopped", "stopped_count", "stopped_since", "time_stopped")

    def __init__(self, limits: FlowLimits) -> None:
        self.limits = limits
        self.stopped = False
        self.stopped_count = 0  # flowStoppedCount: times it went ON
        self.stopped_since = 0.0
        self.time_stopped = 0.0  # seconds spent ON, up to the last resume

    def update(self, count: int, size: int, now: float = 0.0) -> FlowTransition | None:
        """Apply the new depth; return the transition it caused, if any."""
        limits = self.limits
        if not self.stopped:
            if (limits.stop_count and count > limits.stop_count) or (limits.stop_size and size > limits.stop_size):
                self.stopped = True
                self.stopped_count += 1
                self.stopped_since = now
                return FlowTransition.STOPPED
            return None
        if (not limits.stop_count or count < limits.resume_count) and (
            not limits.stop_size or size < limits.resume_size
        ):
            self.stopped = False
            self.time_stopped += now - self.stopped_since
            return FlowTransition.RESUMED
        return None

    def change_limits(self, limits: FlowLimits, count: int, size: int, now: float = 0.0) -> FlowTransition | None:
        """New thresholds at runtime: re-evaluate at once (this may stop or resume)."""
        self.limits = limits
        if self.stopped and not limits.enabled:
            self.stopped = False
            self.time_stopped += now - self.stopped_since
            return FlowTransition.RESUMED
        return self.update(count, size, now)

    def headroom(self, count: int, size: int, message_size: int) -> int | None:
        """How many more messages may be admitted while OFF, the crossing one included.

        None when no threshold limits it. With a size threshold, ``message_size`` is
        the size to assume for the coming messages (the largest seen is the safe bet).
        """
        if self.stopped:
            return 0
        limits = self.limits
        room: int | None = None
        if limits.stop_count:
            room = max(0, limits.stop_count + 1 - count)
        if limits.stop_size:
            by_size = max(0, (limits.stop_size - size) // max(1, message_size) + 1) if size <= limits.stop_size else 0
            room = by_size if room is None else min(room, by_size)
        return room

    def seconds_stopped(self, now: float) -> float:
        """Total time spent ON, including the current stop."""
        return self.time_stopped + (now - self.stopped_since if self.stopped else 0.0)
