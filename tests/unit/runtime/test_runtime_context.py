"""The workflow context: inline steps, children, timers, events, combinators, threads,
conditions, custom status and the replay-safe values."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from runtime_harness import START_MS, Sim

from engine import (
    ChildWorkflowFailedError,
    InlineStepFailedError,
    Registry,
    WorkflowContext,
    WorkflowTimeoutError,
)
from engine.core.history import (
    ChildWorkflowCreated,
    EventSent,
    ExecutionStarted,
    Inbound,
    InlineStepCompleted,
    InlineStepFailed,
    RuntimeStatus,
    TimerCancelled,
    TimerCreated,
    TimerFired,
)
from engine.core.payloads import to_payload
from engine.runtime import (
    RunInlineStep,
    SendEvent,
    SetCustomStatus,
    StartChild,
    WorkflowExecution,
)

reg = Registry()
seen: list[Any] = []


@reg.activity
def echo(value: Any) -> Any:
    return value


@reg.workflow
async def child(ctx: WorkflowContext, value: Any) -> Any:
    if value == "fail":
        raise ValueError("child failed")
    return {"child": value, "parent": ctx.parent_instance_id}


@reg.workflow
async def parent(ctx: WorkflowContext, value: Any) -> Any:
    first = await ctx.call_child_workflow(child, value)
    second = await ctx.call_child_workflow("child", 2, instance_id="fixed-id")
    try:
        await ctx.call_child_workflow(child, "fail")
    except ChildWorkflowFailedError as exc:
        return [first, second, exc.details.type, exc.details.message]
    return None


def _run(name: str, value: Any = None, **kw: Any) -> Sim:
    sim = Sim(reg, **kw)
    sim.start(name, value)
    sim.run()
    return sim


# --- inline steps -----------------------------------------------------------------------------


@reg.workflow
async def inline(ctx: WorkflowContext, value: int) -> Any:
    def bump(x: int) -> int:
        seen.append(x)
        return x + 1

    def boom() -> None:
        raise KeyError("missing")

    value = await ctx.run("bump", bump, value)
    value = await ctx.run("bump", bump, value)
    try:
        await ctx.run("boom", boom)
    except InlineStepFailedError as exc:
        return [value, exc.details.type]
    return None


def test_inline_steps_run_once_and_are_journaled_in_the_same_turn() -> None:
    seen.clear()
    execution = WorkflowExecution(reg, "wf")
    result = execution.step([Inbound(ExecutionStarted("inline", to_payload(1)))], 1000)
    assert execution.status is RuntimeStatus.COMPLETED
    assert execution.output == to_payload([3, "KeyError"])
    assert [type(e.body).__name__ for e in result.new_events] == [
        "TurnStarted",
        "ExecutionStarted",
        "InlineStepCompleted",
        "InlineStepCompleted",
        "InlineStepFailed",
        "ExecutionCompleted",
    ]
    assert [a for a in result.actions if isinstance(a, RunInlineStep)] == [
        RunInlineStep(0, "bump", generation=0),
        RunInlineStep(1, "bump", generation=0),
        RunInlineStep(2, "boom", generation=0),
    ]
    failed = result.new_events[4].body
    assert isinstance(failed, InlineStepFailed) and "KeyError" in failed.failure.stack
    assert seen == [1, 2]
    replayed = WorkflowExecution(reg, "wf")
    replayed.replay(execution.history)
    assert seen == [1, 2]  # replay used the journal, not the function
    assert replayed.output == execution.output


@reg.workflow
async def inline_then_wait(ctx: WorkflowContext, _: Any) -> Any:
    first = await ctx.run("one", lambda: 1)
    await ctx.sleep(10)
    second = await ctx.run("two", lambda: 2)
    return first + second


def test_inline_steps_can_be_left_waiting() -> None:
    execution = WorkflowExecution(reg, "wf")
    execution.step([Inbound(ExecutionStarted("inline_then_wait"))], 0)
    result = execution.step([Inbound(TimerFired(1, 10_000), 0)], 10_000, run_inline_steps=False)
    assert execution.status is RuntimeStatus.RUNNING
    assert [type(e.body).__name__ for e in result.new_events] == ["TurnStarted", "TimerFired"]
    recorded = list(execution.history)
    # the same turn with steps allowed completes
    again = WorkflowExecution(reg, "wf")
    again.replay(recorded[:-2])
    again.step([Inbound(TimerFired(1, 10_000), 0)], 10_000)
    assert again.output == to_payload(3)
    assert again.history[-2].body == InlineStepCompleted(2, "two", to_payload(2))


@reg.workflow
async def inline_async(ctx: WorkflowContext, _: Any) -> Any:
    async def not_sync() -> int:
        return 1

    try:
        await ctx.run("bad", not_sync)
    except InlineStepFailedError as exc:
        return exc.details.type
    return None


def test_inline_steps_must_be_synchronous() -> None:
    assert _run("inline_async").output() == "WorkflowRuntimeError"


# --- child workflows --------------------------------------------------------------------------


def test_child_workflows() -> None:
    sim = _run("parent", 1)
    assert sim.output() == [
        {"child": 1, "parent": "wf-1"},
        {"child": 2, "parent": "wf-1"},
        "ValueError",
        "child failed",
    ]
    created = sim.bodies(ChildWorkflowCreated)
    assert [c.instance_id for c in created] == ["wf-1:0:0", "fixed-id", "wf-1:0:2"]
    assert StartChild(0, "wf-1:0:0", "child", "", to_payload(1), generation=0) in sim.actions()
    assert sim.execution().running_children == []


def test_child_results_are_checked() -> None:
    execution = WorkflowExecution(reg, "p")
    execution.step([Inbound(ExecutionStarted("parent", to_payload(1)))], 0)
    assert execution.running_children == ["p:0:0"]
    from engine.core.history import ChildWorkflowCompleted

    done = Inbound(ChildWorkflowCompleted(0, to_payload("x")), 0)
    first = execution.step([done, done, Inbound(ChildWorkflowCompleted(5), 0)], 1)
    assert [r.reason for r in first.rejected] == [
        "child workflow 'p:0:0' (task 0) has already finished",
        "generation 0 has no task 5",
    ]
    assert execution.running_children == ["fixed-id"]


# --- timers -----------------------------------------------------------------------------------


@reg.workflow
async def timers(ctx: WorkflowContext, _: Any) -> Any:
    start = ctx.now()
    await ctx.sleep(1.5)
    after_sleep = ctx.now()
    await ctx.create_timer(timedelta(seconds=2))
    await ctx.create_timer(ctx.now_ms() + 500)
    await ctx.create_timer(datetime.fromtimestamp((ctx.now_ms() + 250) / 1000, tz=UTC))
    return [start.isoformat(), after_sleep.isoformat(), ctx.now_ms()]


def test_durable_timers_and_turn_time() -> None:
    sim = _run("timers")
    fires = [t.fire_at_ms - START_MS for t in sim.bodies(TimerCreated)]
    assert fires == [1500, 3500, 4000, 4250]
    start, after, end = sim.output()
    assert datetime.fromisoformat(start).timestamp() * 1000 == START_MS
    assert datetime.fromisoformat(after).timestamp() * 1000 == START_MS + 1500
    assert end == START_MS + 4250


def test_timer_fires_are_checked() -> None:
    execution = WorkflowExecution(reg, "wf")
    execution.step([Inbound(ExecutionStarted("timers"))], 0)
    fire = Inbound(TimerFired(0, 1500), 0)
    result = execution.step([fire, fire, Inbound(TimerFired(9, 1), 0)], 1500)
    assert [r.reason for r in result.rejected] == [
        "timer 0 of generation 0 has already fired",
        "generation 0 has no task 9",
    ]


def test_timer_arguments_are_validated() -> None:
    @reg.workflow
    async def bad_timer(ctx: WorkflowContext, kind: str) -> None:
        if kind == "naive":
            await ctx.create_timer(datetime(2030, 1, 1))
        await ctx.sleep(-1)

    assert "timezone-aware" in str(_run("bad_timer", "naive").failure())
    assert "must not be negative" in str(_run("bad_timer", "negative").failure())


# --- events -----------------------------------------------------------------------------------


@reg.workflow
async def events(ctx: WorkflowContext, _: Any) -> Any:
    first = await ctx.wait_for_event("go")
    second = await ctx.wait_for_event("go")
    try:
        await ctx.wait_for_event("never", timeout=30)
    except WorkflowTimeoutError as exc:
        timed_out = str(exc)
    ctx.send_event("other", "hello", {"from": ctx.instance_id})
    return [first, second, timed_out]


def test_events_are_buffered_in_arrival_order_and_waits_time_out() -> None:
    sim = Sim(reg)
    sim.start("events")
    sim.raise_event("wf-1", "go", 1)  # arrives in the start turn, before the wait
    sim.raise_event("wf-1", "go", 2)
    sim.run()
    assert sim.output() == [1, 2, "no event 'never' arrived within 30s"]
    assert sim.bodies(EventSent) == [EventSent(1, "other", "hello", to_payload({"from": "wf-1"}))]
    assert SendEvent(1, "other", "hello", to_payload({"from": "wf-1"}), generation=0) in (
        sim.actions()
    )


@reg.workflow
async def event_beats_timeout(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.wait_for_event("go", timeout=30)


def test_an_event_before_the_timeout_cancels_its_timer() -> None:
    sim = Sim(reg)
    sim.start("event_beats_timeout")
    sim.run(timers=False)
    sim.raise_event("wf-1", "go", "yes")
    sim.run()
    assert sim.output() == "yes"
    assert sim.bodies(TimerCancelled) == [TimerCancelled(0)]


# --- when_all / when_any ----------------------------------------------------------------------


@reg.workflow
async def combinators(ctx: WorkflowContext, _: Any) -> Any:
    values = await ctx.when_all([ctx.call_activity(echo, i) for i in range(3)])
    empty = await ctx.when_all([])
    timer = ctx.sleep(60)
    call = ctx.call_activity(echo, "fast")
    winner = await ctx.when_any([timer, call])
    return [values, empty, winner is call, await winner, timer.cancelled()]


def test_when_all_and_when_any() -> None:
    sim = _run("combinators")
    assert sim.output() == [[0, 1, 2], [], True, "fast", True]
    assert sim.bodies(TimerCancelled) == [TimerCancelled(3)]


@reg.workflow
async def when_all_fails(ctx: WorkflowContext, _: Any) -> Any:
    async def boom() -> None:
        await ctx.sleep(1)
        raise RuntimeError("branch failed")

    try:
        await ctx.when_all([ctx.call_activity(echo, 1), boom()])
    except RuntimeError as exc:
        return str(exc)
    return None


def test_when_all_raises_the_first_failure() -> None:
    assert _run("when_all_fails").output() == "branch failed"


@reg.workflow
async def cancel_thread(ctx: WorkflowContext, _: Any) -> Any:
    log: list[str] = []

    async def branch() -> None:
        try:
            await ctx.sleep(3600)
        except asyncio.CancelledError:
            log.append("cancelled")
            log.append(await ctx.call_activity(echo, "cleanup"))
            raise

    task = ctx.spawn(branch())
    await ctx.sleep(1)
    assert task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        log.append("joined")
    return log


def test_cancelling_a_thread_throws_cancelled_error_and_allows_cleanup() -> None:
    sim = _run("cancel_thread")
    assert sim.output() == ["cancelled", "cleanup", "joined"]
    # the thread starts once the main coroutine waits: its timer is task 1
    assert sim.bodies(TimerCancelled) == [TimerCancelled(1)]


def test_cancelled_error_is_asyncios() -> None:
    import engine
    import engine.runtime

    assert engine.CancelledError is asyncio.CancelledError
    assert engine.runtime.CancelledError is asyncio.CancelledError


# --- threads and conditions -------------------------------------------------------------------


@reg.workflow
async def condition_timeout(ctx: WorkflowContext, _: Any) -> Any:
    state = {"ready": False}
    try:
        await ctx.wait_condition(lambda: state["ready"], timeout=5)
    except WorkflowTimeoutError as exc:
        first = str(exc)

    async def flip() -> None:
        await ctx.sleep(1)
        state["ready"] = True

    ctx.spawn(flip())
    await ctx.wait_condition(lambda: state["ready"], timeout=60)
    return [first, ctx.now_ms() - START_MS]


def test_wait_condition_with_and_without_timeout() -> None:
    sim = _run("condition_timeout")
    assert sim.output() == ["condition did not become true within 5s", 6000]
    assert sim.bodies(TimerCancelled) == [TimerCancelled(1)]  # the 60 s timeout


@reg.workflow
async def spawn_results(ctx: WorkflowContext, _: Any) -> Any:
    async def double(x: int) -> int:
        value: int = await ctx.call_activity(echo, x)
        return 2 * value

    tasks = [ctx.spawn(double(i)) for i in range(3)]
    return [await t for t in tasks]


def test_spawned_threads_are_awaitable() -> None:
    assert _run("spawn_results").output() == [0, 2, 4]


def test_spawn_needs_a_coroutine() -> None:
    @reg.workflow
    async def bad_spawn(ctx: WorkflowContext, _: Any) -> None:
        ctx.spawn(bad_spawn)  # type: ignore[arg-type]

    assert "coroutine object" in str(_run("bad_spawn").failure())


# --- custom status and replay-safe values -----------------------------------------------------


@reg.workflow
async def values(ctx: WorkflowContext, _: Any) -> Any:
    ctx.set_custom_status({"stage": 1})
    await ctx.sleep(1)
    ctx.set_custom_status({"stage": 2})
    result = [str(ctx.new_uuid()), str(ctx.new_uuid()), ctx.random().random()]
    seen.append((ctx.is_replaying, result))
    ctx.logger.info("values computed")
    return result


def test_custom_status() -> None:
    sim = _run("values")
    assert sim.execution().custom_status == to_payload({"stage": 2})
    assert [a for a in sim.actions() if isinstance(a, SetCustomStatus)] == [
        SetCustomStatus(to_payload({"stage": 1}), generation=0),
        SetCustomStatus(to_payload({"stage": 2}), generation=0),
    ]
    assert sim.execution().metadata().custom_status == to_payload({"stage": 2})


def test_uuid_random_and_is_replaying_are_replay_safe(caplog: pytest.LogCaptureFixture) -> None:
    seen.clear()
    with caplog.at_level(logging.INFO, logger="engine.workflow"):
        sim = _run("values")
        replayed = WorkflowExecution(reg, "wf-1")
        replayed.replay(sim.history())
    assert [r.getMessage() for r in caplog.records] == ["values computed"]
    assert caplog.records[0].instance_id == "wf-1"  # type: ignore[attr-defined]
    (live_flag, live), (replay_flag, again) = seen
    assert (live_flag, replay_flag) == (False, True)
    assert live == again
    assert uuid.UUID(live[0]).version == 5 and live[0] != live[1]
    other = Sim(reg)
    other.start("values", instance_id="another")
    other.run()
    assert other.output("another")[0] != live[0]


def test_awaiting_a_foreign_awaitable_fails_clearly() -> None:
    @reg.workflow
    async def uses_asyncio(ctx: WorkflowContext, _: Any) -> None:
        loop_future: asyncio.Future[None] = asyncio.Future.__new__(asyncio.Future)
        await loop_future

    failure = _run("uses_asyncio").failure()
    assert failure is not None and failure.type in {"TypeError", "RuntimeError"}


@reg.workflow
async def bad_predicate(ctx: WorkflowContext, _: Any) -> Any:
    state = {"n": 0}

    def predicate() -> bool:
        if state["n"] == 1:
            raise LookupError("predicate broke")
        return False

    async def bump() -> None:
        await ctx.sleep(1)
        state["n"] = 1

    ctx.spawn(bump())
    try:
        await ctx.wait_condition(predicate)
    except LookupError as exc:
        return str(exc)
    return None


def test_a_failing_predicate_fails_the_wait() -> None:
    assert _run("bad_predicate").output() == "predicate broke"
