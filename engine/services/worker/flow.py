"""When the worker pauses its partitions and when it commits: the two small policies of its
Kafka loop, kept apart from the worker's logic so each reads on its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["CommitPolicy", "FlowAction", "flow_action"]


class FlowAction(StrEnum):
    NONE = "none"
    PAUSE = "pause"
    RESUME = "resume"


def flow_action(load: int, high: int, low: int, paused: bool) -> FlowAction:
    """Pause the partitions once ``high`` tasks are taken; resume when at most ``low`` are.

    Polling goes on while paused, so a long activity never exceeds max.poll.interval.ms and
    never causes a rebalance. The gap between the two marks is a prefetch backlog: pausing
    and resuming costs a fetch round trip each time, which short activities would otherwise
    pay on nearly every task.
    """
    if not paused and load >= high:
        return FlowAction.PAUSE
    if paused and load <= low:
        return FlowAction.RESUME
    return FlowAction.NONE


@dataclass
class CommitPolicy:
    """Batch offset commits: commit ``interval_s`` after something settled, or as soon as
    idle. Results do not wait for the commit (they are visible once delivered), so the
    interval only bounds how much a crash makes run again and how many commits are sent."""

    interval_s: float = 0.1
    clock: Callable[[], float] = time.monotonic
    _changed: float | None = None

    def changed(self) -> None:
        """Something settled since the last commit."""
        if self._changed is None:
            self._changed = self.clock()

    def committed(self) -> None:
        self._changed = None

    def due(self, *, idle: bool) -> bool:
        if self._changed is None:
            return False
        return idle or self.clock() - self._changed >= self.interval_s
