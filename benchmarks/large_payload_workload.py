"""The large-payload benchmark's workload: a value in, through an activity, and back out.

Imported by the engine processes (``--module benchmarks.large_payload_workload``) and by
the benchmark, which makes the values.
"""

from __future__ import annotations

import hashlib

from engine import WorkflowContext, activity, workflow


def value_of(size: int, seed: str) -> str:
    """``size`` characters that differ with ``seed``."""
    unit = hashlib.sha256(seed.encode()).hexdigest()
    return (unit * (size // len(unit) + 1))[:size]


@activity(name="large.reverse")
def reverse(text: str) -> str:
    return text[::-1]


@workflow(name="large.round_trip")
async def round_trip(ctx: WorkflowContext, text: str) -> str:
    """The input to the activity, its result back as the output: four large payloads
    (start input, activity input, activity result, workflow output)."""
    return await ctx.call_activity(reverse, text)
