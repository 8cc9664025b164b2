"""Workflows for the per-key concurrency limit test on the real broker (default registry,
the processors')."""

from __future__ import annotations

from engine import WorkflowContext, workflow

#: At most this many instances of ``cl.sync`` run at once per concurrency key.
LIMIT = 2


@workflow(name="cl.sync", max_concurrency_per_key=LIMIT)
async def sync(ctx: WorkflowContext, account: str) -> str:
    await ctx.sleep(1)  # long enough that the starts of one key overlap
    return f"synced {account}"
