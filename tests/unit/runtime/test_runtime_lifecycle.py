"""Instance lifecycle: start, failure, termination, suspension, continue-as-new, the step
budget, non-determinism, metadata and the pure ``execute`` function."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from runtime_harness import START_MS, Sim

from engine import NonDeterminismError, NotRegisteredError, Registry, WorkflowContext
from engine.core.errors import HistoryIntegrityError, WorkflowRuntimeError
from engine.core.history import (
    ContinuedAsNew,
    EventRaised,
    ExecutionCompleted,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    Inbound,
    RuntimeStatus,
    TaskCompleted,
    TaskScheduled,
    TimerFired,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime import (
    CancelTimer,
    CompleteExecution,
    ContinueAsNew,
    TerminateChildren,
    WorkflowExecution,
    execute,
)
from engine.runtime.continuation import EVENT_WINDOW

reg = Registry()


@reg.activity
def echo(value: Any) -> Any:
    return value


def _start(name: str, value: Any = None, instance_id: str = "wf") -> WorkflowExecution:
    execution = WorkflowExecution(reg, instance_id)
    payload = None if value is None else to_payload(value)
    execution.step([Inbound(ExecutionStarted(name, payload))], START_MS)
    return execution


def _kinds(result: Any) -> list[str]:
    return [type(e.body).__name__ for e in result.new_events]


# --- start and failure ------------------------------------------------------------------------


@reg.workflow
async def fails(ctx: WorkflowContext, _: Any) -> None:
    try:
        raise KeyError("inner")
    except KeyError as exc:
        raise ValueError("outer") from exc


def test_an_escaping_exception_fails_the_instance_with_details() -> None:
    execution = _start("fails")
    failure = execution.failure
    assert execution.status is RuntimeStatus.FAILED
    assert failure is not None and (failure.type, failure.message) == ("ValueError", "outer")
    assert "raise ValueError" in failure.stack
    assert failure.cause is not None and failure.cause.type == "KeyError"
    completion = [a for a in execution.step([], 0).actions]
    assert completion == []


def test_events_before_the_start_and_unknown_kinds_are_rejected() -> None:
    execution = WorkflowExecution(reg, "wf")
    early = Inbound(EventRaised("x"))
    wrong = Inbound(TaskScheduled(0, "x"))
    result = execution.step([early, wrong], 0)
    assert [r.reason for r in result.rejected] == [
        "the instance has not started (ExecutionStarted must come first)",
        "TaskScheduled is not an inbound event (the workflow code decides it); offer only "
        "results, timer fires, events and instance commands",
    ]
    assert result.new_events == [] and execution.status is RuntimeStatus.PENDING
    execution.step([Inbound(ExecutionStarted("sleeper"))], 0)
    again = execution.step([Inbound(ExecutionStarted("sleeper"))], 0)
    assert again.rejected[0].reason == "the instance has already started"


def test_an_unknown_workflow_fails_live_and_refuses_replay() -> None:
    execution = _start("nobody")
    assert execution.status is RuntimeStatus.FAILED
    assert execution.failure is not None and execution.failure.type == "NotRegisteredError"
    with pytest.raises(NotRegisteredError):
        WorkflowExecution(Registry(), "wf").replay(execution.history)


def test_start_sequence_and_generation_place_a_new_run_after_an_old_one() -> None:
    execution = WorkflowExecution(reg, "wf", start_sequence=40, generation=3)
    result = execution.step([Inbound(ExecutionStarted("sleeper"))], 0)
    assert [(e.sequence, e.generation) for e in result.new_events] == [(40, 3), (41, 3), (42, 3)]
    assert result.next_sequence == 43 and execution.generation == 3


# --- termination ------------------------------------------------------------------------------


@reg.workflow
async def sleeper(ctx: WorkflowContext, _: Any) -> None:
    await ctx.sleep(3600)


@reg.workflow
async def family(ctx: WorkflowContext, _: Any) -> None:
    ctx.call_child_workflow(sleeper)
    ctx.call_child_workflow(sleeper, instance_id="named-child")
    await ctx.sleep(3600)


def test_terminate_recursive_ends_the_instance_and_its_children() -> None:
    execution = _start("family", instance_id="top")
    result = execution.step([Inbound(ExecutionTerminated("stop", recursive=True))], 5)
    assert execution.status is RuntimeStatus.TERMINATED
    assert _kinds(result) == ["TurnStarted", "ExecutionTerminated", "ExecutionCompleted"]
    assert result.actions[:2] == [
        CompleteExecution(
            RuntimeStatus.TERMINATED,
            None,
            execution.failure,
            None,
            None,
            None,
            generation=0,
        ),
        TerminateChildren(("top:0:0", "named-child"), "stop", every_generation=True, generation=0),
    ]
    assert result.actions[2:] == [CancelTimer(2, START_MS + 3_600_000, generation=0)]
    assert execution.failure is not None and execution.failure.message == "stop"
    after = execution.step([Inbound(TimerFired(2, 0), 0)], 6)
    assert after.rejected[0].reason == "the instance has ended (TERMINATED)"
    replayed = WorkflowExecution(reg, "top")
    replayed.replay(execution.history)
    assert replayed.status is RuntimeStatus.TERMINATED


def test_recursive_termination_through_the_harness() -> None:
    sim = Sim(reg)
    sim.start("family", instance_id="top")
    sim.run(timers=False)
    sim.send("top", ExecutionTerminated("stop", recursive=True))
    sim.run()
    assert {i: sim.status(i) for i in sim.instances} == {
        "top": RuntimeStatus.TERMINATED,
        "top:0:0": RuntimeStatus.TERMINATED,
        "named-child": RuntimeStatus.TERMINATED,
    }


# --- suspension -------------------------------------------------------------------------------


@reg.workflow
async def two_steps(ctx: WorkflowContext, _: Any) -> Any:
    first = await ctx.call_activity(echo, 1)
    event = await ctx.wait_for_event("go")
    return [first, event, await ctx.call_activity(echo, 2)]


def test_suspended_instances_apply_events_but_run_no_code_until_resumed() -> None:
    execution = _start("two_steps")
    suspended = execution.step([Inbound(ExecutionSuspended("maintenance"))], 1)
    assert execution.status is RuntimeStatus.SUSPENDED and suspended.actions == []
    while_suspended = execution.step(
        [Inbound(TaskCompleted(0, to_payload(1)), 0), Inbound(EventRaised("go", to_payload("e")))],
        2,
    )
    assert _kinds(while_suspended) == ["TurnStarted", "TaskCompleted", "EventRaised"]
    assert while_suspended.actions == [] and while_suspended.rejected == []
    again = execution.step([Inbound(ExecutionSuspended()), Inbound(TaskCompleted(0), 0)], 3)
    assert [r.reason for r in again.rejected] == [
        "the instance is already suspended",
        "activity task 0 ('echo') has already completed",
    ]
    resumed = execution.step([Inbound(ExecutionResumed())], 4)
    assert _kinds(resumed) == ["TurnStarted", "ExecutionResumed", "TaskScheduled"]
    assert resumed.status is RuntimeStatus.RUNNING
    assert execution.step([Inbound(ExecutionResumed())], 5).rejected[0].reason == (
        "the instance is not suspended (it is RUNNING)"
    )
    execution.step([Inbound(TaskCompleted(1, to_payload(2)), 0)], 6)
    assert execution.output == to_payload([1, "e", 2])
    replayed = WorkflowExecution(reg, "wf")
    replayed.replay(execution.history)
    assert replayed.output == execution.output


# --- continue-as-new --------------------------------------------------------------------------


@reg.workflow
async def looper(ctx: WorkflowContext, count: int) -> Any:
    if count == 3:
        return [count, await ctx.wait_for_event("carried"), ctx.generation]
    await ctx.call_activity(echo, count)
    ctx.sleep(3600)  # left pending: cancelled when the generation ends
    ctx.continue_as_new(count + 1)


def test_continue_as_new_ends_the_turn_and_the_next_turn_begins_the_next_generation() -> None:
    execution = _start("looper", 0)
    event = Inbound(EventRaised("carried", to_payload("kept")))
    result = execution.step([Inbound(TaskCompleted(0, to_payload(0)), 0), event], 10)
    assert _kinds(result) == [
        "TurnStarted",
        "TaskCompleted",
        "EventRaised",
        "TimerCreated",
        "ContinuedAsNew",
    ]
    assert result.new_events[4].body == ContinuedAsNew(to_payload(1), 1)
    assert ContinueAsNew(to_payload(1), 1, generation=0) in result.actions
    assert CancelTimer(1, 10 + 3_600_000, generation=0) in result.actions
    # between the two turns the instance waits to begin generation 1
    assert execution.status is RuntimeStatus.CONTINUED_AS_NEW and execution.generation == 0
    assert execution.unconsumed_by_name() == {"carried": 1}
    stale = execution.step([Inbound(TimerFired(1, 0), 0)], 11)  # e.g. the wake-up's turn
    assert _kinds(stale) == [
        "TurnStarted",
        "ExecutionStarted",
        "EventRaised",  # carried over: nobody consumed it in generation 0
        "TaskScheduled",
    ]
    assert [e.generation for e in stale.new_events] == [1, 1, 1, 1]
    assert stale.new_events[3].body == TaskScheduled(0, "echo", to_payload(1))  # ids restart
    assert stale.rejected[0].reason == (
        "the event is for generation 0, but the instance is in generation 1"
    )
    assert execution.generation == 1 and execution.status is RuntimeStatus.RUNNING
    assert execution.history[0].body == ExecutionStarted("looper", to_payload(1))
    assert execution.history[0].sequence == 9  # after the turn start at 8
    full = [*_history_of(execution, result), *stale.new_events]
    for count in (1, 2):
        step = execution.step([Inbound(TaskCompleted(0, to_payload(count)), count)], 20 + count)
        full.extend(step.new_events)
        assert _kinds(step)[-1] == "ContinuedAsNew"
        full.extend(execution.step([], 30 + count).new_events)  # the next generation begins
    assert execution.output == to_payload([3, "kept", 3])
    from_full = WorkflowExecution(reg, "wf")
    from_full.replay(full)  # a whole multi-generation history: replays the last generation
    assert from_full.output == execution.output and from_full.generation == 3
    assert from_full.next_sequence == execution.next_sequence


def _history_of(execution: WorkflowExecution, last: Any) -> list[Any]:
    """The first turn (re-created) plus the continue-as-new turn's events."""
    first = WorkflowExecution(reg, "wf")
    started = first.step([Inbound(ExecutionStarted("looper", to_payload(0)))], START_MS)
    return [*started.new_events, *last.new_events]


def test_a_replayed_generation_that_continued_as_new_begins_the_next_one_on_its_next_turn() -> None:
    execution = _start("looper", 0)
    result = execution.step([Inbound(TaskCompleted(0, to_payload(0)), 0)], 10)
    old_generation = [*_history_of(execution, result)]
    assert type(old_generation[-1].body) is ContinuedAsNew
    replayed = WorkflowExecution(reg, "wf")
    replayed.replay(old_generation)
    assert replayed.status is RuntimeStatus.CONTINUED_AS_NEW
    live = execution.step([Inbound(EventRaised("x"))], 20)
    cold = replayed.step([Inbound(EventRaised("x"))], 20)
    assert cold.new_events == live.new_events  # the same next generation, hot or cold
    assert _kinds(cold)[:3] == ["TurnStarted", "ExecutionStarted", "EventRaised"]


@reg.workflow
async def endless(ctx: WorkflowContext, count: int) -> None:
    ctx.continue_as_new(count + 1)


def test_a_continue_as_new_loop_without_waiting_runs_one_generation_per_turn() -> None:
    """Each turn runs one generation's code, so the turn's budget counts one generation
    (a loop that never waits takes a turn per generation instead of failing at once)."""
    execution = _start("endless", 0)
    assert execution.status is RuntimeStatus.CONTINUED_AS_NEW and execution.generation == 0
    for generation in range(1, 5):
        result = execution.step([], START_MS + generation)
        assert _kinds(result) == ["TurnStarted", "ExecutionStarted", "ContinuedAsNew"]
        assert [e.generation for e in result.new_events] == [generation] * 3
    assert execution.status is RuntimeStatus.CONTINUED_AS_NEW


@reg.workflow
async def many_events(ctx: WorkflowContext, read: int) -> int:
    for _ in range(read):
        await ctx.wait_for_event("e")
    ctx.continue_as_new(read)


def test_a_continue_as_new_carries_a_window_of_each_name_and_hands_the_rest_over() -> None:
    execution = _start("many_events", 2)
    events = [Inbound(EventRaised("e", to_payload(i))) for i in range(EVENT_WINDOW + 10)]
    events += [Inbound(EventRaised("f", to_payload(i))) for i in range(3)]
    result = execution.step(events, 10)
    (continued,) = [a for a in result.actions if isinstance(a, ContinueAsNew)]
    # read: e0, e1; carried: the next EVENT_WINDOW "e" and every "f"; the rest go over
    assert [from_payload(p) for _, p in continued.overflow] == list(
        range(2 + EVENT_WINDOW, EVENT_WINDOW + 10)
    )
    assert execution.unconsumed_by_name() == {"e": EVENT_WINDOW, "f": 3}
    begun = execution.step([], 11)
    carried = [e.body for e in begun.new_events if isinstance(e.body, EventRaised)]
    assert [(b.name, from_payload(b.input)) for b in carried] == [
        *[("e", i) for i in range(2, 2 + EVENT_WINDOW)],
        *[("f", i) for i in range(3)],
    ]


# --- the step budget --------------------------------------------------------------------------


@reg.workflow
async def spinner(ctx: WorkflowContext, _: Any) -> None:
    while True:
        await asyncio.sleep(0)


def test_a_turn_that_never_waits_on_anything_durable_fails_the_instance() -> None:
    execution = WorkflowExecution(reg, "wf", step_budget=500)
    execution.step([Inbound(ExecutionStarted("spinner"))], 0)
    assert execution.status is RuntimeStatus.FAILED
    assert execution.failure is not None
    assert execution.failure.type == "StepBudgetExceededError"
    assert "ran 500 scheduling steps" in execution.failure.message
    replayed = WorkflowExecution(reg, "wf", step_budget=500)
    replayed.replay(execution.history)
    assert replayed.status is RuntimeStatus.FAILED


# --- non-determinism --------------------------------------------------------------------------


def _registry_with(body: Any) -> Registry:
    registry = Registry()
    registry.add_workflow(body, name="changing")
    return registry


async def _v1(ctx: WorkflowContext, _: Any) -> None:
    await ctx.call_activity("a", 1)
    await ctx.sleep(5)
    await ctx.call_activity("b", 2)


async def _v2(ctx: WorkflowContext, _: Any) -> None:
    await ctx.call_activity("a", 1)
    await ctx.sleep(5)
    await ctx.call_activity("b", 3)  # changed input


async def _v3(ctx: WorkflowContext, _: Any) -> None:
    await ctx.call_activity("a", 1)  # the timer and second activity were removed


def _v1_history() -> list[Any]:
    execution = WorkflowExecution(_registry_with(_v1), "wf")
    events = list(execution.step([Inbound(ExecutionStarted("changing"))], 0).new_events)
    events += execution.step([Inbound(TaskCompleted(0), 0)], 1).new_events
    events += execution.step([Inbound(TimerFired(1, 5001), 0)], 5001).new_events
    return events


def test_a_changed_input_is_non_deterministic_and_names_the_sequence() -> None:
    history = _v1_history()
    with pytest.raises(NonDeterminismError) as info:
        WorkflowExecution(_registry_with(_v2), "wf").replay(history)
    err = info.value
    assert err.sequence == 8 and type(history[8].body) is TaskScheduled
    assert "name='b'" in err.recorded and "input=2" in err.recorded
    assert "input=3" in err.attempted
    assert "history event #8" in str(err)


def test_removed_decisions_are_non_deterministic() -> None:
    history = _v1_history()
    with pytest.raises(NonDeterminismError) as info:
        WorkflowExecution(_registry_with(_v3), "wf").replay(history)
    assert info.value.sequence == 5  # TimerCreated recorded, ExecutionCompleted attempted
    assert "TimerCreated" in info.value.recorded
    assert "ExecutionCompleted" in info.value.attempted


async def _swallows(ctx: WorkflowContext, _: Any) -> str:
    try:
        await ctx.call_activity("other", 1)
    except Exception:
        return "hidden"
    return "ran"


def test_workflow_code_cannot_swallow_non_determinism() -> None:
    history = _v1_history()
    execution = WorkflowExecution(_registry_with(_swallows), "wf")
    with pytest.raises(NonDeterminismError):
        execution.replay(history)
    with pytest.raises(WorkflowRuntimeError, match="unusable after an earlier error"):
        execution.step([], 0)


def test_replay_checks_the_history_itself() -> None:
    history = _v1_history()
    with pytest.raises(HistoryIntegrityError, match="jumps from sequence 3 to 5"):
        WorkflowExecution(_registry_with(_v1), "wf").replay(history[:4] + history[5:])
    with pytest.raises(HistoryIntegrityError, match="no ExecutionStarted"):
        WorkflowExecution(_registry_with(_v1), "wf").replay(history[2:])
    with pytest.raises(NonDeterminismError, match="no waiting point"):
        bogus = [
            *history[:4],
            history[4].__class__(**{**_fields(history[4]), "body": TaskCompleted(9)}),
        ]
        WorkflowExecution(_registry_with(_v1), "wf").replay(bogus)


def _fields(event: Any) -> dict[str, Any]:
    return {name: getattr(event, name) for name in event.__slots__}


# --- metadata and the pure function -----------------------------------------------------------


def test_metadata_and_properties() -> None:
    execution = WorkflowExecution(reg, "wf")
    started = ExecutionStarted(
        "two_steps", to_payload("in"), parent_instance_id="p", tags={"t": "1"}, request_id="r"
    )
    execution.step([Inbound(started)], 100)
    execution.step([Inbound(TaskCompleted(0, to_payload(1)), 0)], 200)
    meta = execution.metadata()
    assert (meta.instance_id, meta.name, meta.status, meta.generation) == (
        "wf",
        "two_steps",
        RuntimeStatus.RUNNING,
        0,
    )
    assert (meta.created_ms, meta.last_updated_ms, meta.input) == (100, 200, to_payload("in"))
    assert (meta.parent_instance_id, meta.tags, meta.request_id) == ("p", {"t": "1"}, "r")
    assert execution.name == "two_steps" and execution.version == ""
    assert execution.started == started
    assert execution.next_sequence == len(execution.history) == 5
    nothing = execution.step([], 300)
    assert not nothing.changed and execution.last_updated_ms == 200


def test_execute_is_replay_plus_step() -> None:
    first = execute(reg, [], [Inbound(ExecutionStarted("two_steps"))], 0, instance_id="wf")
    second = execute(reg, first.new_events, [Inbound(TaskCompleted(0, to_payload(1)), 0)], 1)
    assert [type(e.body).__name__ for e in second.new_events] == [
        "TurnStarted",
        "TaskCompleted",
    ]
    assert second.status is RuntimeStatus.RUNNING and second.next_sequence == 5
    with pytest.raises(ValueError, match="instance_id"):
        execute(reg, [], [], 0)
    by_function = execute(sleeper, [], [Inbound(ExecutionStarted("sleeper"))], 0, instance_id="x")
    assert by_function.status is RuntimeStatus.RUNNING


def test_completion_carries_the_parent_fields() -> None:
    execution = WorkflowExecution(reg, "child")
    started = ExecutionStarted(
        "fails", parent_instance_id="p", parent_generation=2, parent_task_id=7
    )
    result = execution.step([Inbound(started)], 0)
    completion = result.actions[-1]
    assert isinstance(completion, CompleteExecution)
    assert (completion.parent_instance_id, completion.parent_generation) == ("p", 2)
    assert completion.parent_task_id == 7 and completion.status is RuntimeStatus.FAILED
    assert type(result.new_events[-1].body) is ExecutionCompleted


# --- closing and more divergence ----------------------------------------------------------


@reg.workflow
async def cleanup_on_close(ctx: WorkflowContext, _: Any) -> None:
    try:
        await ctx.sleep(3600)
    finally:
        closing_log.append("finally ran")
        try:
            await ctx.call_activity(echo, "too late")
        except asyncio.CancelledError:
            closing_log.append("refused")
            raise


closing_log: list[str] = []


def test_close_runs_finally_blocks_with_ctx_operations_refused() -> None:
    closing_log.clear()
    execution = _start("cleanup_on_close")
    history_length = len(execution.history)
    execution.close()
    assert closing_log == ["finally ran", "refused"]
    assert len(execution.history) == history_length
    execution.close()  # idempotent
    assert closing_log == ["finally ran", "refused"]


def test_dropping_an_execution_closes_its_coroutines_without_warnings(
    recwarn: pytest.WarningsRecorder,
) -> None:
    closing_log.clear()
    execution = _start("cleanup_on_close")
    del execution
    import gc

    gc.collect()
    assert closing_log == ["finally ran", "refused"]
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def _inline_a(ctx: WorkflowContext, _: Any) -> int:
    return int(await ctx.run("a", lambda: 1))


async def _inline_b(ctx: WorkflowContext, _: Any) -> int:
    return int(await ctx.run("b", lambda: 1))


def test_a_renamed_inline_step_is_non_deterministic() -> None:
    execution = WorkflowExecution(_registry_with(_inline_a), "wf")
    execution.step([Inbound(ExecutionStarted("changing"))], 0)
    with pytest.raises(NonDeterminismError) as info:
        WorkflowExecution(_registry_with(_inline_b), "wf").replay(execution.history)
    assert info.value.sequence == 2
    assert info.value.recorded == "InlineStepCompleted(task_id=0, name='a')"
    assert "name='b'" in info.value.attempted


def test_terminating_an_instance_that_has_not_started_is_rejected() -> None:
    execution = WorkflowExecution(reg, "wf")
    result = execution.step([Inbound(ExecutionTerminated("x"))], 0)
    assert result.rejected[0].reason.startswith("the instance has not started")
