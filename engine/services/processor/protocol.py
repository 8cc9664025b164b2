"""The commit protocol's vocabulary, shared by every loop that drives a partition's state
machine: the numbered steps of a batch, the clock a loop reads time from, and the hook it
reports each step to.

The Kafka loop (``engine.adapters.kafka.processor``) and the in-process test engine
(``engine.testing``) both run a batch as these steps; a metrics exporter plugs into
:class:`BatchMetrics` without either loop knowing about it.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Protocol


class Step(StrEnum):
    """The steps of one batch, in protocol order (``ABORT`` replaces 5-8 on failure)."""

    POLL = "poll"  # 1. wait for input, at most until the next timer is due
    ACCEPT = "accept"  # 2. validate each record (or dead-letter it) and route it
    TIMERS = "timers"  # 3. fire the timers that are due
    STEP = "step"  # 4. run each touched instance once, collect the batch's output
    PRODUCE = "produce"  # 5. produce the output inside the transaction
    OFFSETS = "offsets"  # 6. add the consumed offsets to the transaction
    COMMIT = "commit"  # 7. commit the transaction
    APPLY = "apply"  # 8. write the committed table changes to the local store
    ABORT = "abort"  # the transaction failed: drop the batch, redo its input


def poll_wait_s(next_timer_ms: int | None, now_ms: int, longest_s: float) -> float:
    """How long step 1 may block for input: until the earliest timer is due (0 when one is
    overdue), never longer than ``longest_s`` (the loop checks its stop flag in between)."""
    if next_timer_ms is None:
        return longest_s
    return min(longest_s, max(0.0, (next_timer_ms - now_ms) / 1000))


class Clock(Protocol):
    """Where a loop reads time: wall time for turns and timers, a monotonic one for
    budgets and durations. The test engine substitutes a clock it can move."""

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (what ``ctx.now()`` is built on)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back (for durations)."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()


class BatchMetrics(Protocol):
    """Called once per step of every batch, with how long it took and how many things it
    handled (records, timers, instances, output records, offsets)."""

    def observe(self, step: Step, seconds: float, count: int) -> None: ...


class NoMetrics:
    """The hook when nothing collects metrics."""

    def observe(self, step: Step, seconds: float, count: int) -> None:
        return None


__all__ = ["BatchMetrics", "Clock", "NoMetrics", "Step", "SystemClock", "poll_wait_s"]
