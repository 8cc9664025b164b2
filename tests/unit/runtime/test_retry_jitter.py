"""Retry jitter: each backoff is shortened by up to ``jitter`` of itself, by a fraction drawn
from the instance's seed, so instances failed by one outage spread their retries while a
replay computes (and keeps) the same delays."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtime_harness import Sim

from engine import Registry, RetryPolicy, WorkflowContext
from engine.core.history import TimerCreated

reg = Registry()
failures_left: dict[str, int] = {}


@reg.activity
def fails_twice(key: str) -> str:
    left = failures_left.get(key, 2)
    failures_left[key] = left - 1
    if left > 0:
        raise ConnectionError("try again")
    return "ok"


@reg.workflow
async def retried(ctx: WorkflowContext, policy: dict[str, Any]) -> list[float]:
    draws_before = [ctx.random().random() for _ in range(2)]
    await ctx.call_activity(fails_twice, ctx.instance_id, retry=RetryPolicy(**policy))
    return [*draws_before, ctx.random().random()]


def _delays(instance_id: str, policy: dict[str, Any], *, cold: bool = False) -> list[int]:
    """The backoff delays of one instance's two retries, in ms."""
    failures_left.pop(instance_id, None)
    sim = Sim(reg, cold=cold)
    sim.start("retried", policy, instance_id=instance_id)
    sim.run()
    assert sim.output(instance_id) is not None
    created = [
        (e.body, e.timestamp_ms) for e in sim.history(instance_id) if type(e.body) is TimerCreated
    ]
    return [body.fire_at_ms - at for body, at in created]


def test_jitter_is_on_by_default_and_shortens_each_delay_by_at_most_its_fraction() -> None:
    assert RetryPolicy().jitter == 0.2
    delays = _delays("order-1", {})
    assert len(delays) == 2
    assert 800 <= delays[0] <= 1000 and 1600 <= delays[1] <= 2000
    assert delays != [1000, 2000]


def test_zero_jitter_keeps_the_exact_backoff() -> None:
    assert _delays("order-1", {"jitter": 0}) == [1000, 2000]


def test_the_same_instance_gets_the_same_delays_and_replay_keeps_them() -> None:
    first = _delays("order-7", {"jitter": 0.5})
    assert _delays("order-7", {"jitter": 0.5}) == first
    assert _delays("order-7", {"jitter": 0.5}, cold=True) == first  # replayed every turn


def test_instances_spread_their_retries() -> None:
    firsts = {_delays(f"order-{n}", {"jitter": 1})[0] for n in range(20)}
    assert len(firsts) > 10  # twenty instances failed at once do not retry together


def test_jitter_leaves_the_workflow_random_sequence_alone() -> None:
    """The draw has its own seed: turning jitter on or off never changes ctx.random()."""
    outputs = []
    for jitter in (0, 0.2):
        failures_left.clear()
        sim = Sim(reg)
        sim.start("retried", {"jitter": jitter}, instance_id="order-3")
        sim.run()
        outputs.append(sim.output("order-3"))
    assert outputs[0] == outputs[1]


@given(
    initial=st.floats(0, 100),
    coefficient=st.floats(1, 10),
    cap=st.floats(0, 1000),
    jitter=st.floats(0, 1),
    attempt=st.integers(1, 10_000),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_a_jittered_delay_lies_between_the_shortened_and_the_plain_backoff(
    initial: float, coefficient: float, cap: float, jitter: float, attempt: int, draw: float
) -> None:
    policy = RetryPolicy(
        initial_interval=initial, backoff_coefficient=coefficient, max_interval=cap, jitter=jitter
    )
    plain = policy.delay_ms(attempt)
    jittered = policy.delay_ms(attempt, draw)
    assert plain <= round(cap * 1000)
    assert plain * (1 - jitter) - 1 <= jittered <= plain
    assert RetryPolicy(jitter=0, initial_interval=initial).delay_ms(1, draw) == round(
        initial * 1000
    )


def test_jitter_is_validated() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        RetryPolicy(jitter=1.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        RetryPolicy(jitter=-0.1)
    with pytest.raises(TypeError, match="not a bool"):
        RetryPolicy(jitter=True)
