"""The fan-out benchmark workload: one instance starts n activities at once and sums them.

It exercises what chain3 does not: many activity tasks in flight for one instance, results
arriving in bursts that the processor folds into few turns, and a long history.
"""

from __future__ import annotations

from engine import WorkflowContext, activity, workflow


@activity(name="fanout.echo")
def echo(x: int) -> int:
    return x


@workflow(name="fanout.fan")
async def fan(ctx: WorkflowContext, n: int) -> int:
    results = await ctx.when_all([ctx.call_activity(echo, i) for i in range(n)])
    return sum(results)
