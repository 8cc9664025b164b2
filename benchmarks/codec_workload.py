"""The payload codec benchmark's workload: chain3 through activities, carrying a document.

Imported by the engine processes (``--module benchmarks.codec_workload``) and by the
benchmark, which makes the documents. A document is JSON records of short words and
numbers, as orders or events are: it compresses, but not to nothing.
"""

from __future__ import annotations

import random
from typing import Any

from engine import WorkflowContext, activity, workflow

WORDS = [
    "order",
    "item",
    "paid",
    "shipped",
    "berlin",
    "lisbon",
    "warehouse",
    "express",
    "standard",
    "refund",
]


def document(size: int, seed: int) -> dict[str, Any]:
    """A JSON document of about ``size`` bytes (its records vary with ``seed``)."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    while len(records) * 72 < size:
        records.append(
            {
                "id": rng.getrandbits(48),
                "what": rng.choice(WORDS),
                "where": rng.choice(WORDS),
                "amount": round(rng.uniform(1, 500), 2),
            }
        )
    return {"step": 0, "records": records}


@activity(name="codecs.step")
def step(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "step": doc["step"] + 1}


@workflow(name="codecs.chain3")
async def chain3(ctx: WorkflowContext, doc: dict[str, Any]) -> int:
    """Three activities in a row, each taking and returning the whole document."""
    for _ in range(3):
        doc = await ctx.call_activity(step, doc)
    return int(doc["step"])
