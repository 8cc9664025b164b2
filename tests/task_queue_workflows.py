"""Workflows for the task-queue tests: two kinds of worker with disjoint activities.

The workflows register in the default registry (the processor's); each kind of worker has
its own registry with only its own activities, as a separate deployment would.
"""

from __future__ import annotations

from engine import WorkflowContext, workflow
from engine.runtime.registry import Registry

gpu_activities = Registry()
mail_activities = Registry()


@gpu_activities.activity(name="tq.render", task_queue="gpu")
def render(x: int) -> int:
    return x * 10


@mail_activities.activity(name="tq.send")
def send(x: int) -> str:
    return f"sent {x}"


@workflow(name="tq.render")
async def render_flow(ctx: WorkflowContext, x: int) -> int:
    # the queue comes from the activity's registration (the function carries it)
    return int(await ctx.call_activity(render, x))


@workflow(name="tq.mail")
async def mail_flow(ctx: WorkflowContext, x: int) -> str:
    return str(await ctx.call_activity("tq.send", x))
