"""The bounds on recovering from Kafka failures by oneself (engine.adapters.kafka.recovery)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.adapters.kafka.recovery import Recovery
from engine.core.errors import BrokerError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_more_recoveries_than_the_limit_within_the_window_give_up_naming_the_cause() -> None:
    clock = Clock()
    recovery = Recovery("processor p-1", limit=3, window_s=600, clock=clock)
    for marker in range(3):
        recovery.failed(RuntimeError("fenced"))
        recovery.succeeded(marker)  # work went on in between: only the count bound is left
        clock.now += 60
    with pytest.raises(BrokerError, match=r"processor p-1 gives up.*fenced.*same id"):
        recovery.failed(RuntimeError("fenced"))


def test_recoveries_older_than_the_window_do_not_count() -> None:
    clock = Clock()
    recovery = Recovery("w", limit=2, window_s=100, clock=clock)
    for marker in range(10):
        recovery.failed(RuntimeError("x"))
        recovery.succeeded(marker)
        clock.now += 60
    assert recovery.recoveries <= 2


def test_failing_without_progress_for_longer_than_give_up_s_gives_up() -> None:
    clock = Clock()
    recovery = Recovery("p", limit=100, give_up_s=300, clock=clock)
    recovery.failed(RuntimeError("no broker"))
    for _ in range(29):  # further attempts of the same recovery: only the time counts
        clock.now += 10
        recovery.failed(RuntimeError("no broker"), again=True)
        recovery.succeeded(0)  # no progress: the marker did not move
    assert recovery.recoveries == 1
    clock.now += 11
    with pytest.raises(BrokerError, match="failing for 301s"):
        recovery.failed(RuntimeError("no broker"), again=True)


def test_progress_ends_the_failures_and_resets_the_backoff() -> None:
    clock = Clock()
    recovery = Recovery("p", first_backoff_s=0.5, max_backoff_s=10, clock=clock)
    recovery.succeeded(0)
    assert recovery.backoff_s() == 0.0
    delays = []
    for _ in range(7):
        recovery.failed(RuntimeError("x"), again=True)
        delays.append(recovery.backoff_s())
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    recovery.succeeded(1)
    assert recovery.backoff_s() == 0.0
    clock.now += 1000  # a long time later, failing again starts a new period
    recovery.failed(RuntimeError("x"))


@given(st.lists(st.floats(min_value=0, max_value=50), min_size=1, max_size=40))
def test_backoff_never_exceeds_its_maximum(gaps: list[float]) -> None:
    clock = Clock()
    recovery = Recovery("p", limit=1000, give_up_s=1e9, max_backoff_s=10, clock=clock)
    for gap in gaps:
        clock.now += gap
        recovery.failed(RuntimeError("x"), again=True)
        assert 0 < recovery.backoff_s() <= 10
