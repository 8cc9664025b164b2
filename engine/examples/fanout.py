"""The fan-out benchmark workload: one instance starts n activities at once and sums them.

It exercises what chain3 does not: many activity tasks in flight for one instance, results
arriving in bursts that the processor folds into few turns, and a long history.
``fanout.paced`` is the per-turn variant (``benchmarks/fanout.py --per-turn``): 100,000
calls in flight, and results at its start and its end that arrive one per turn.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from engine import WorkflowContext, activity, workflow


@activity(name="fanout.echo")
def echo(x: int) -> int:
    return x


@workflow(name="fanout.fan")
async def fan(ctx: WorkflowContext, n: int) -> int:
    results = await ctx.when_all([ctx.call_activity(echo, i) for i in range(n)])
    return sum(results)


# --- the per-turn benchmark: where the fan-out's results arrive one per turn ---------------


@activity(name="fanout.paced")
def paced(call: dict[str, Any]) -> int:
    """Returns the call's index. A call with a ``gate`` first writes ``<gate>.reached`` and
    waits until the file ``gate`` exists (the benchmark opens it once it has read the
    processor's counters); a call with ``pace_ms`` takes that long, so that with a worker
    running one call at a time their results reach the processor one per turn."""
    gate = call.get("gate")
    if gate:
        Path(f"{gate}.reached").touch()
        while not os.path.exists(gate):
            time.sleep(0.01)
    time.sleep(call.get("pace_ms", 0) / 1000)
    return int(call["i"])


# a fan-out this wide records about two events per call in one generation: past the
# default history_events_max (51,200), so this workflow declares its own bound
@workflow(name="fanout.paced", history_events_warn=400_000, history_events_max=500_000)
async def paced_fan(ctx: WorkflowContext, spec: dict[str, Any]) -> int:
    """``spec["n"]`` calls of ``fanout.paced``, scheduled ``spec["chunk"]`` per turn (one
    turn's records must fit in one transaction), all awaited with one ``when_all``. The
    first and the last ``spec["window"]`` calls are paced; gates (files, ``spec["gates"]``)
    hold the call before each paced window and the call after the first one."""
    n, chunk, window = spec["n"], spec["chunk"], spec["window"]
    gates = {0: spec["gates"]["start"], window + 1: spec["gates"]["middle"]}
    gates[n - window - 1] = spec["gates"]["end"]
    calls = []
    for first in range(0, n, chunk):
        for i in range(first, min(first + chunk, n)):
            call: dict[str, Any] = {"i": i}
            if i in gates:
                call["gate"] = gates[i]
            elif 0 < i <= window or i >= n - window:
                call["pace_ms"] = spec["pace_ms"]
            calls.append(ctx.call_activity(paced, call))
        await ctx.sleep(0.001)  # the next chunk in a turn of its own
    ctx.set_custom_status({"scheduled": len(calls)})
    return sum(await ctx.when_all(calls))
