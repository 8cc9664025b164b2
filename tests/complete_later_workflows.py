"""A workflow whose activity completes later, by task token (tests/integration/
test_complete_later_kafka.py): the activity records its token here and leaves the attempt
open."""

from __future__ import annotations

from engine import RetryPolicy, WorkflowContext, activity, workflow

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


#: The heartbeat details each attempt of ``later.review`` began with, by instance id.
began_with: dict[str, list[object]] = {}


@activity(name="later.review_request")
def request_review(document: str) -> str:
    info = activity.info()
    began_with.setdefault(info.instance_id, []).append(info.heartbeat_details)
    tokens.setdefault(info.instance_id, []).append(info.task_token)
    info.complete_later()


@workflow(name="later.review")
async def review(ctx: WorkflowContext, document: str) -> str:
    """Its activity completes later and must be heartbeated by token every 5 s; a second
    attempt follows a missed heartbeat."""
    retry = RetryPolicy(max_attempts=2, initial_interval=0)
    verdict = await ctx.call_activity(request_review, document, heartbeat_timeout=5, retry=retry)
    return f"{document}: {verdict}"
