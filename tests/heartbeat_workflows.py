"""Workflows and activities for the heartbeat and cancellation tests (the processor
imports this module; workers get a registry with the activities)."""

from __future__ import annotations

import asyncio
import threading
import time

from engine import RetryPolicy, WorkflowContext, activity, workflow
from engine.runtime.registry import Registry

activities = Registry()
FAST = RetryPolicy(max_attempts=3, initial_interval=0.1)
#: What the activities observed, per instance id (the tests read it in-process).
observed: dict[str, list[object]] = {}
_lock = threading.Lock()


def note(instance_id: str, what: object) -> None:
    with _lock:
        observed.setdefault(instance_id, []).append(what)


@activities.activity(name="hb.count")
async def count(to: int) -> dict[str, object]:
    """Counts to ``to`` with a checkpoint per step; the first attempt goes silent at 3."""
    info = activity.info()
    start = (info.heartbeat_details or {"at": 0})["at"]
    note(info.instance_id, ("attempt", info.attempt, "from", start))
    for at in range(start, to):
        if info.attempt == 1 and at == 3:
            await asyncio.sleep(3600)  # hangs: only the heartbeat timeout ends it
        activity.heartbeat({"at": at + 1})
    return {"attempt": info.attempt, "resumed_from": start}


@activities.activity(name="hb.count_sync")
def count_sync(to: int) -> dict[str, object]:
    """``hb.count`` as a sync activity on a thread: the first attempt goes silent at 3 and
    only returns once the worker, past the heartbeat timeout, marks it cancelled."""
    info = activity.info()
    start = (info.heartbeat_details or {"at": 0})["at"]
    note(info.instance_id, ("attempt", info.attempt, "from", start))
    for at in range(start, to):
        if info.attempt == 1 and at == 3:
            while not activity.is_cancelled():  # silent: no heartbeat from here on
                time.sleep(0.02)
            return {"attempt": info.attempt, "abandoned_at": at}
        activity.heartbeat({"at": at + 1})
    return {"attempt": info.attempt, "resumed_from": start}


@activities.activity(name="hb.wait_sync")
def wait_sync(_: object) -> str:
    """A sync activity that runs until it is cancelled, heartbeating as it goes."""
    info = activity.info()
    while not activity.is_cancelled():
        activity.heartbeat()
        time.sleep(0.05)
    note(info.instance_id, "sync saw is_cancelled")
    return "stopped"


@activities.activity(name="hb.wait_async")
async def wait_async(_: object) -> str:
    info = activity.info()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        note(info.instance_id, "async got CancelledError")
        raise
    return "slept"


@workflow(name="hb.count")
async def count_flow(ctx: WorkflowContext, to: int) -> object:
    return await ctx.call_activity("hb.count", to, heartbeat_timeout=1.0, retry=FAST)


@workflow(name="hb.count_sync")
async def count_sync_flow(ctx: WorkflowContext, to: int) -> object:
    return await ctx.call_activity("hb.count_sync", to, heartbeat_timeout=1.0, retry=FAST)


@workflow(name="hb.wait")
async def wait_flow(ctx: WorkflowContext, kind: str) -> object:
    return await ctx.call_activity(f"hb.wait_{kind}", None, retry=None)


@workflow(name="hb.race")
async def race_flow(ctx: WorkflowContext, kind: str) -> object:
    """The activity loses a when_any to an event: its worker must stop it."""
    winner = await ctx.when_any(
        [ctx.call_activity(f"hb.wait_{kind}", None, retry=None), ctx.wait_for_event("go")]
    )
    return await winner
