"""Deliberately bad workflows, for the tests that check a bad instance fails alone.

Importable in the test process and by engine processes started with
``--module tests.poison_workflows``; names start with ``poison.``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from engine import ActivityFailedError, WorkflowContext, activity, workflow


def one() -> int:
    return 1


@activity(name="poison.touch")
def touch(path: str) -> str:
    """Creates ``path``: lets a test see that a workflow got past this point."""
    Path(path).write_text(str(os.getpid()))
    return path


@workflow(name="poison.echo")
async def echo(ctx: WorkflowContext, value: Any) -> Any:
    """Returns its input (a large input makes a large output)."""
    return value


@workflow(name="poison.big_output")
async def big_output(ctx: WorkflowContext, size: int) -> str:
    return "x" * size


@workflow(name="poison.spin")
async def spin(ctx: WorkflowContext) -> None:
    while True:
        pass


@workflow(name="poison.spin_after")
async def spin_after(ctx: WorkflowContext, marker: str) -> None:
    """Runs an activity that creates ``marker``, then never yields again."""
    await ctx.call_activity(touch, marker)
    while True:
        pass


@workflow(name="poison.endless_inline")
async def endless_inline(ctx: WorkflowContext) -> None:
    while True:
        await ctx.run("one", one)


@workflow(name="poison.resolved_await")
async def resolved_await(ctx: WorkflowContext) -> None:
    done = ctx.run("one", one)
    while True:
        await done


@workflow(name="poison.negative_timer")
async def negative_timer(ctx: WorkflowContext) -> None:
    await ctx.create_timer(-1)


@activity(name="poison.hang")
def hang(seconds: float) -> str:
    """A sync activity that does not come back for a long time (a hung call)."""
    threading.Event().wait(seconds)
    return "woke up"


@workflow(name="poison.call_hung")
async def call_hung(ctx: WorkflowContext, seconds: float) -> str:
    """One attempt of a hung activity with a 2 s start-to-close timeout."""
    try:
        return str(await ctx.call_activity(hang, seconds, retry=None, timeout=2))
    except ActivityFailedError as exc:
        return f"gave up: {exc.details.type if exc.details else exc}"
