"""The loop's wait for input (step 1 of the commit protocol) ends when the next timer is due."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.services.processor.protocol import Step, poll_wait_s

times = st.integers(min_value=0, max_value=2**50)


@given(now=times, ahead=st.integers(min_value=0, max_value=10**7), longest=st.floats(0.01, 5))
def test_the_wait_ends_when_the_next_timer_is_due(now: int, ahead: int, longest: float) -> None:
    wait = poll_wait_s(now + ahead, now, longest)
    assert wait == min(longest, ahead / 1000)


@given(now=times, behind=st.integers(min_value=0, max_value=10**7))
def test_an_overdue_timer_means_no_wait(now: int, behind: int) -> None:
    assert poll_wait_s(now - behind, now, 1.0) == 0.0


def test_without_timers_the_wait_is_bounded_for_the_stop_check() -> None:
    assert poll_wait_s(None, 0, 0.5) == 0.5


def test_the_steps_are_numbered_in_protocol_order() -> None:
    assert [s.value for s in Step] == [
        "poll",
        "accept",
        "timers",
        "step",
        "produce",
        "offsets",
        "commit",
        "apply",
        "abort",
    ]
