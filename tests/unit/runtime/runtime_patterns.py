"""The workflow pattern suite: workflows and activities used by the runtime tests, the
golden histories and the replay benchmark."""

from __future__ import annotations

import contextlib
from asyncio import CancelledError
from typing import Any

from engine import (
    ActivityFailedError,
    ApplicationError,
    Registry,
    WorkflowContext,
    WorkflowTimeoutError,
)

patterns = Registry()


# --- activities -------------------------------------------------------------------------------


@patterns.activity
def add_one(x: int) -> int:
    return x + 1


@patterns.activity
def square(x: int) -> int:
    return x * x


@patterns.activity
def check(count: int) -> str:
    return "done" if count >= 3 else "pending"


@patterns.activity
def reserve(order: dict[str, Any]) -> str:
    return f"reservation-{order['id']}"


@patterns.activity
def charge(order: dict[str, Any]) -> str:
    if order.get("decline"):
        raise ApplicationError("card declined", type="CardDeclined", non_retryable=True)
    return f"payment-{order['id']}"


@patterns.activity
def ship(order: dict[str, Any]) -> str:
    return f"shipment-{order['id']}"


@patterns.activity
def release(order: dict[str, Any]) -> str:
    return "released"


@patterns.activity
def refund(order: dict[str, Any]) -> str:
    return "refunded"


@patterns.activity
def work(i: int) -> int:
    return i * 10


# --- workflows --------------------------------------------------------------------------------


@patterns.workflow
async def chain(ctx: WorkflowContext, n: int) -> int:
    """Function chaining: each activity's output is the next one's input."""
    x = 0
    for _ in range(n):
        x = await ctx.call_activity(add_one, x)
    return x


@patterns.workflow
async def fan_out(ctx: WorkflowContext, n: int) -> int:
    """Fan-out/fan-in: n activities in parallel, then one aggregate."""
    results = await ctx.when_all([ctx.call_activity(square, i) for i in range(n)])
    return sum(results)


@patterns.workflow
async def approval_wait(ctx: WorkflowContext, request: str) -> str:
    """Human approval: wait for an event, give up after an hour."""
    try:
        decision = await ctx.wait_for_event("approval", timeout=3600)
    except WorkflowTimeoutError:
        return f"{request}: expired"
    return f"{request}: {decision}"


@patterns.workflow
async def approval_race(ctx: WorkflowContext, request: str) -> str:
    """Human approval as a race between the event and a durable timer."""
    event = ctx.wait_for_event("approval")
    deadline = ctx.sleep(3600)
    winner = await ctx.when_any([event, deadline])
    if winner is deadline:
        return f"{request}: expired"
    return f"{request}: {await event}"


@patterns.workflow
async def monitor(ctx: WorkflowContext, state: dict[str, int]) -> int:
    """A monitor loop that keeps its history short with continue-as-new."""
    count = state["count"]
    status = await ctx.call_activity(check, count)
    if status == "done":
        return count
    await ctx.sleep(60)
    ctx.continue_as_new({"count": count + 1})


@patterns.workflow
async def saga(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    """A saga: compensations for the completed steps run in ``finally`` on failure."""
    compensations: list[str] = []
    shipped = False
    try:
        await ctx.call_activity(reserve, order)
        compensations.append("release")
        await ctx.call_activity(charge, order)
        compensations.append("refund")
        await ctx.call_activity(ship, order)
        shipped = True
        return "shipped"
    finally:
        if not shipped:
            for name in reversed(compensations):
                await ctx.call_activity(name, order)


@patterns.workflow
async def threads(ctx: WorkflowContext, n: int) -> list[int]:
    """Threads inside one instance, joined with wait_condition."""
    finished: list[int] = []

    async def worker(i: int) -> None:
        finished.append(await ctx.call_activity(work, i))

    for i in range(n):
        ctx.spawn(worker(i))
    await ctx.wait_condition(lambda: len(finished) == n)
    return sorted(finished)


@patterns.workflow
async def parent(ctx: WorkflowContext, n: int) -> list[int]:
    """Sub-orchestrations: n children in parallel."""
    return await ctx.when_all([ctx.call_child_workflow(chain, i) for i in range(n)])


@patterns.workflow
async def racing_saga(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    """A branch that loses a race is cancelled and compensates in ``finally``."""

    async def slow_branch() -> str:
        await ctx.call_activity(reserve, order)
        try:
            await ctx.sleep(600)
            return "slow"
        finally:
            await ctx.call_activity(release, order)

    async def fast_branch() -> str:
        await ctx.sleep(10)
        return "fast"

    slow = ctx.spawn(slow_branch())
    winner = await ctx.when_any([slow, fast_branch()])
    with contextlib.suppress(CancelledError):
        await slow  # wait until the cancelled branch has compensated
    return str(await winner)


@patterns.workflow
async def inline3(ctx: WorkflowContext, x: int) -> int:
    """Three inline steps: one turn, no activities."""
    for _ in range(3):
        x = await ctx.run("add_one", add_one, x)
    return x


@patterns.workflow
async def retrying(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    """Compensation when an activity exhausts its retries."""
    try:
        await ctx.call_activity(charge, order)
    except ActivityFailedError as exc:
        return f"failed: {exc.details.type}"
    return "charged"


@patterns.workflow
async def watched(ctx: WorkflowContext, order: str) -> str:
    """The main coroutine waits for an approval while a spawned watcher sleeps; neither
    catches a cancellation (the legacy golden history of a cancel request)."""

    async def watcher() -> None:
        await ctx.sleep(600)
        ctx.set_custom_status(f"{order} is late")

    ctx.spawn(watcher())
    return str(await ctx.wait_for_event("approval"))


PATTERN_RUNS: dict[str, tuple[str, Any]] = {
    "chain_5": ("chain", 5),
    "fan_out_20": ("fan_out", 20),
    "approval_wait_approved": ("approval_wait", "expense-1"),
    "approval_wait_expired": ("approval_wait", "expense-2"),
    "approval_race_approved": ("approval_race", "expense-3"),
    "approval_race_expired": ("approval_race", "expense-4"),
    "monitor": ("monitor", {"count": 0}),
    "saga_shipped": ("saga", {"id": 1}),
    "saga_declined": ("saga", {"id": 2, "decline": True}),
    "threads_4": ("threads", 4),
    "parent_3": ("parent", 3),
    "racing_saga": ("racing_saga", {"id": 3}),
    "inline3": ("inline3", 1),
}
"""Named runs of the pattern workflows: the golden histories (input per run)."""

APPROVALS = {"approval_wait_approved", "approval_race_approved"}
"""Runs that receive an ``approval`` event right after their first turn."""
