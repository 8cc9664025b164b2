"""Module-level activities for the process-executor tests (a child process imports them by
name). Each writes its pid to the file it is given, so a test can check the process is gone."""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine import ActivityFailedError, WorkflowContext, workflow
from engine.core.activity_info import current_activity


def hang(pid_file: str) -> str:
    Path(pid_file).write_text(str(os.getpid()))
    while True:  # never returns: only killing its process stops it
        time.sleep(0.05)


def quick(x: int) -> list[object]:
    return [x * 2, current_activity().idempotency_key, os.getpid()]


def later(x: int) -> None:
    current_activity().complete_later()


def boom(x: int) -> None:
    raise ValueError(f"bad {x}")


@workflow(name="proc.hang")
async def hang_flow(ctx: WorkflowContext, pid_file: str) -> str:
    try:
        await ctx.call_activity("proc.hang", pid_file, retry=None, start_to_close=5)
    except ActivityFailedError as exc:
        return str(exc)
    return "finished?"
