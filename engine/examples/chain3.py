"""The chain3 benchmark workload: three sequential steps of x + 1.

Two variants: inline steps that the processor runs and journals in the same turn
(``ctx.run``, like Restate's ``ctx.run`` or DBOS steps), and remote activities that travel
through the activity-tasks topic to a worker and back.
"""

from __future__ import annotations

from engine import WorkflowContext, activity, workflow


def add_one(x: int) -> int:
    return x + 1


@activity(name="chain3.add_one")
def add_one_activity(x: int) -> int:
    return x + 1


@workflow(name="chain3.inline")
async def chain3_inline(ctx: WorkflowContext, x: int) -> int:
    for _ in range(3):
        x = await ctx.run("add_one", add_one, x)
    return x


@workflow(name="chain3.activities")
async def chain3_activities(ctx: WorkflowContext, x: int) -> int:
    for _ in range(3):
        x = await ctx.call_activity(add_one_activity, x)
    return x


@workflow(name="chain3.queried")
async def chain3_queried(ctx: WorkflowContext, x: int) -> int:
    """The query and update benchmarks' instance: answers query ``x`` and update ``add``
    (adds its argument to a running total and returns the total, in the turn that accepts
    it) until event ``done`` arrives."""
    total = {"value": x}

    def add(n: int) -> int:
        total["value"] += n
        return total["value"]

    ctx.set_query_handler("x", lambda: x)
    ctx.set_update_handler("add", add)
    await ctx.wait_for_event("done")
    return x
