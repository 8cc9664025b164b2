"""A workflow whose activity completes later, by task token (tests/integration/
test_complete_later_kafka.py): the activity records its token here and leaves the attempt
open."""

from __future__ import annotations

from engine import WorkflowContext, activity, workflow

#: The task tokens handed out, by instance id.
tokens: dict[str, list[str]] = {}


@activity(name="later.approve")
def approve(invoice: str) -> str:
    info = activity.info()
    tokens.setdefault(info.instance_id, []).append(info.task_token)
    info.complete_later()


@workflow(name="later.pay")
async def pay(ctx: WorkflowContext, invoice: str) -> str:
    decision = await ctx.call_activity(approve, invoice)
    return f"{invoice}: {decision}"
