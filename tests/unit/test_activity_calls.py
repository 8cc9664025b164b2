"""What an activity call gives the activity: one idempotency key for all its attempts and
the attempt number beside it (on the in-process engine, with the real worker service)."""

from __future__ import annotations

from engine import Registry, RetryPolicy, WorkflowContext
from engine.core.activity_info import current_activity
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
    assert seen == [
        ("o-1/0/0", 1),
        ("o-1/0/0", 2),
        ("o-1/0/0", 3),
        ("o-1/0/3", 1),
        ("o-1/0/3", 2),
        ("o-1/0/3", 3),
    ]
