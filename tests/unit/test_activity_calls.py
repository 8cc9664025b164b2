"""What an activity call gives the activity: one idempotency key for all its attempts and
the attempt number beside it (on the in-process engine, with the real worker service)."""

from __future__ import annotations

import pytest

from engine import Registry, RetryPolicy, WorkflowContext
from engine.core.activity_info import current_activity
from engine.core.errors import ActivityFailedError
from engine.core.history import TaskScheduled
from engine.runtime.activity_options import DEFAULT_START_TO_CLOSE_S, activity_options
from engine.testing import TestEngine

registry = Registry()
seen: list[tuple[str, int]] = []


@registry.activity(name="pay")
def pay(amount: int) -> str:
    info = current_activity()
    seen.append((info.idempotency_key, info.attempt))
    if info.attempt < 3:
        raise RuntimeError("the provider timed out (but may have charged)")
    return f"paid {amount}"


@registry.workflow(name="checkout")
async def checkout(ctx: WorkflowContext, amount: int) -> list[str]:
    fast = RetryPolicy(max_attempts=3, initial_interval=0.01)
    first = await ctx.call_activity(pay, amount, retry=fast)
    second = await ctx.call_activity(pay, amount + 1, retry=fast)
    return [first, second]


def test_retries_of_one_call_share_its_key_and_each_call_has_its_own() -> None:
    seen.clear()
    with TestEngine(registry) as env:
        env.start("checkout", 5, instance_id="o-1")
        assert env.wait_for_completion("o-1").output == ["paid 5", "paid 6"]
        state = env.get("o-1")
        assert state is not None and state.run_id
        run = state.run_id  # a later run of the id (after a purge) gets keys of its own
    assert seen == [
        (f"o-1/{run}/0/0", 1),
        (f"o-1/{run}/0/0", 2),
        (f"o-1/{run}/0/0", 3),
        (f"o-1/{run}/0/3", 1),
        (f"o-1/{run}/0/3", 2),
        (f"o-1/{run}/0/3", 3),
    ]


@registry.activity(name="flaky")
def flaky(x: int) -> int:
    raise RuntimeError("still down")


@registry.workflow(name="bounded")
async def bounded(ctx: WorkflowContext, x: int) -> str:
    unlimited = RetryPolicy(max_attempts=0, initial_interval=1.0, backoff_coefficient=1.0)
    try:
        await ctx.call_activity(flaky, x, retry=unlimited, schedule_to_close=3.5)
    except ActivityFailedError as exc:
        assert exc.details is not None
        return f"{exc.details.type}: {exc.details.message}"
    return "completed?"


def test_schedule_to_close_ends_a_call_that_would_retry_forever() -> None:
    with TestEngine(registry) as env:
        env.start("bounded", 1, instance_id="b")
        output = env.wait_for_completion("b").output
        attempts = [e.body.attempt for e in env.history("b") if isinstance(e.body, TaskScheduled)]
    assert output.startswith("ActivityTimeoutError: ")
    assert "schedule-to-close timeout of 3.5s" in output
    assert attempts == [1, 2, 3, 4]  # at 0, 1, 2 and 3 s; the call ended at 3.5 s


def test_timeout_is_the_older_name_of_start_to_close() -> None:
    opts = activity_options("default", timeout=3)
    assert (opts.start_to_close_ms, opts.start_to_close_named) == (3000, True)
    assert activity_options("default").start_to_close_ms == DEFAULT_START_TO_CLOSE_S * 1000
    assert activity_options("default", start_to_close=0).attempt_timer_ms == 0
    assert activity_options("q", schedule_to_start=2, start_to_close=5).attempt_timer_ms == 7000
    with pytest.raises(ValueError, match="not both"):
        activity_options("default", timeout=1, start_to_close=2)
    with pytest.raises(ValueError, match="must not be negative"):
        activity_options("default", heartbeat_timeout=-1)
