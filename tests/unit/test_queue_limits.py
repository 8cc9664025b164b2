"""Fleet-wide task-queue limits split over partitions: whatever the partitions' owners do,
the sums stay within the queue's limits (pure logic, a fake clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.errors import ConfigurationError
from engine.services.worker.queue_limits import QueueLimits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(st.integers(1, 64), st.integers(1, 200))
def test_the_partition_slots_add_up_to_the_limit(partitions: int, extra: int) -> None:
    limits = QueueLimits(concurrency=partitions + extra - 1)
    limits.set_partitions(partitions)
    slots = [limits.slots(p) for p in range(partitions)]
    assert sum(slots) == limits.concurrency and min(slots) >= 1


def test_concurrency_stops_at_the_partition_share() -> None:
    limits = QueueLimits(concurrency=4)
    limits.set_partitions(2)
    for _ in range(2):
        assert limits.may_start(0)
        limits.started(0)
    assert not limits.may_start(0) and limits.may_start(1)
    limits.finished(0)
    assert limits.may_start(0)


@given(st.integers(1, 8), st.floats(0.5, 200), st.lists(st.floats(0, 0.5), max_size=300))
def test_starts_never_exceed_the_rate(partitions: int, rate: float, steps: list[float]) -> None:
    clock = Clock()
    limits = QueueLimits(rate=rate, clock=clock)
    limits.set_partitions(partitions)
    starts = 0
    for step in steps:
        clock.now += step
        for p in range(partitions):
            while limits.may_start(p):
                limits.started(p)
                starts += 1
    # a bucket holds at most one second's share (or one token): the burst, then the rate
    burst = sum(max(rate / partitions, 1.0) for _ in range(partitions))
    assert starts <= rate * clock.now + burst + 1e-9


def test_fewer_slots_than_partitions_is_refused_with_advice() -> None:
    with pytest.raises(ConfigurationError, match="at most 2 partitions"):
        QueueLimits(concurrency=2).set_partitions(3, "gpu")
