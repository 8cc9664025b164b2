"""Workflows of the Kafka integration tests: started by triggers, publishing to user topics.

Importable in the test process and by engine processes (``--module tests.publish_workflows``).
The business record's value names the topic to publish to (``out``), so one workflow serves
every test's fresh topics.
"""

from __future__ import annotations

from typing import Any

from engine import WorkflowContext, workflow


@workflow(name="pub.order")
async def order(ctx: WorkflowContext, record: dict[str, Any]) -> str:
    """Publishes one record per run, after a durable timer (so a crash can land between
    the start and the publish) and before its end."""
    await ctx.sleep(record.get("sleep", 0.2))
    await ctx.publish(
        record["out"],
        {"order": ctx.instance_id, "total": record.get("total", 0)},
        key=ctx.instance_id,
        headers={"source": "pub.order"},
    )
    return ctx.instance_id


@workflow(name="pub.waiter")
async def waiter(ctx: WorkflowContext, _: Any) -> Any:
    """Waits for the event a trigger raises, and returns its payload."""
    return await ctx.wait_for_event("paid")
