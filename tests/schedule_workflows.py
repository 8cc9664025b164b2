"""Workflows for the schedule and retention tests on the real broker (default registry,
the processors')."""

from __future__ import annotations

from engine import WorkflowContext, workflow


@workflow(name="sched.tick")
async def tick(ctx: WorkflowContext, label: str) -> str:
    return f"tick {label}"


@workflow(name="sched.brief", retention=2)
async def brief(ctx: WorkflowContext, x: int) -> int:
    """Purged by the processor two seconds after it ends."""
    return x
