"""A workflow with a bug that a test can "fix" (the engine under test runs in-process)."""

from __future__ import annotations

from typing import Any

from engine import WorkflowContext, workflow

#: Flipped by the test to stand for a deploy of fixed code.
FIXED = {"value": False}


@workflow(name="parking.buggy")
async def buggy(ctx: WorkflowContext, data: dict[str, Any]) -> str:
    first = await ctx.wait_for_event("go")
    if not FIXED["value"]:
        raise KeyError("nmae")  # the bug
    return f"{data['name']} {first}"
