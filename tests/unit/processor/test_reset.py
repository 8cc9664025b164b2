"""Reset and rerun on the test engine: what the new run reuses and redoes, what of the old
run is dropped, the history it leaves, and the refusals."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Registry, RetryPolicy, WorkflowContext
from engine.codec import encode_message
from engine.core.errors import (
    InstanceNotFoundError,
    InvalidResetPointError,
    WorkflowAlreadyRunningError,
)
from engine.core.history import (
    EventRaised,
    ExecutionReset,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCreated,
)
from engine.core.messages import ActivityResult, ResetTarget
from engine.core.payloads import to_payload
from engine.runtime.executor import WorkflowExecution
from engine.services.audit.chain import verify_records
from engine.services.audit.replay import ReplayChecker
from engine.testing import TestEngine

registry = Registry()
calls: list[tuple[str, Any]] = []
broken = {"charge": False}


@registry.activity(name="add")
def add(x: int) -> int:
    calls.append(("add", x))
    return x + 1


@registry.activity(name="charge")
def charge(x: int) -> int:
    calls.append(("charge", x))
    if broken["charge"]:
        raise ValueError("card service down")
    return x * 10


@registry.workflow(name="steps")
async def steps(ctx: WorkflowContext, x: int) -> int:
    a = await ctx.call_activity("add", x)
    extra = await ctx.wait_for_event("go")
    b = await ctx.call_activity("add", a + extra)
    return int(await ctx.call_activity("charge", b, retry=RetryPolicy(max_attempts=1)))


@registry.workflow(name="napper")
async def napper(ctx: WorkflowContext, x: int) -> int:
    a = await ctx.call_activity("add", x)
    await ctx.sleep(60)
    return int(await ctx.call_activity("add", a))


@registry.workflow(name="child")
async def child(ctx: WorkflowContext, x: int) -> int:
    await ctx.wait_for_event("finish")
    return x * 2


@registry.workflow(name="parent")
async def parent(ctx: WorkflowContext, x: int) -> int:
    a = await ctx.call_activity("add", x)
    return int(await ctx.call_child_workflow("child", a, instance_id="kid"))


@pytest.fixture
def env() -> Iterator[TestEngine]:
    calls.clear()
    broken["charge"] = False
    with TestEngine(registry, partitions=2) as engine:
        yield engine


def _kinds(events: list[HistoryEvent], generation: int) -> list[str]:
    return [type(e.body).__name__ for e in events if e.generation == generation]


def _finish_steps(env: TestEngine, instance_id: str) -> None:
    env.start("steps", 1, instance_id=instance_id)
    env.run()
    env.raise_event(instance_id, "go", 10)
    env.run()


def _sequence_of(env: TestEngine, instance_id: str, kind: type, nth: int = 0) -> int:
    found = [e.sequence for e in env.history(instance_id) if type(e.body) is kind]
    return found[nth]


# --- what a reset reuses and redoes -------------------------------------------------------------


def test_reset_reuses_the_turns_before_the_point_and_redoes_the_rest(env: TestEngine) -> None:
    _finish_steps(env, "s")
    assert env.wait_for_completion("s").output == 130
    second_add = _sequence_of(env, "s", TaskScheduled, 1)
    calls.clear()
    outcome = env.reset("s", second_add, "redo the second add")
    assert outcome is not None and outcome.generation == 1
    state = env.wait_for_completion("s")
    assert (state.status, state.output, state.generation) == (RuntimeStatus.COMPLETED, 130, 1)
    # the first add's result was reused; the second add and the charge ran again
    assert calls == [("add", 12), ("charge", 13)]
    history = env.history("s")
    new_run = [e for e in history if e.generation == 1]
    marker = next(e.body for e in new_run if isinstance(e.body, ExecutionReset))
    assert marker == ExecutionReset(second_add, "redo the second add", marker.request_id)
    assert marker.request_id  # the client's request id, so the reset is traceable
    # the kept turns are copies: the same bodies, renumbered after the old run
    old = [e.body for e in history if e.generation == 0]
    assert [e.body for e in new_run][:4] == old[:4]
    assert new_run[0].sequence == history[[e.generation for e in history].index(1) - 1].sequence + 1
    # the event raised in the cut turn was delivered again, after the marker
    after_marker = _kinds(history, 1)[_kinds(history, 1).index("ExecutionReset") :]
    assert after_marker[:2] == ["ExecutionReset", "EventRaised"]


def test_reset_to_the_last_failure_runs_the_failed_activity_again(env: TestEngine) -> None:
    broken["charge"] = True
    _finish_steps(env, "f")
    failed = env.wait_for_completion("f")
    assert failed.status is RuntimeStatus.FAILED
    broken["charge"] = False  # the fix is deployed
    calls.clear()
    env.reset("f", ResetTarget.LAST_FAILURE, "card service is back")
    state = env.wait_for_completion("f")
    assert (state.status, state.output) == (RuntimeStatus.COMPLETED, 130)
    assert calls == [("charge", 13)]  # only the failed call ran again
    marker = next(e.body for e in env.history("f") if isinstance(e.body, ExecutionReset))
    assert marker.from_sequence == _sequence_of(env, "f", TaskFailed)


def test_reset_to_the_first_turn_redoes_everything_and_keeps_the_events(env: TestEngine) -> None:
    _finish_steps(env, "t")
    env.wait_for_completion("t")
    calls.clear()
    env.reset("t", ResetTarget.FIRST_TURN, "from scratch")
    state = env.wait_for_completion("t")
    assert (state.output, state.generation) == (130, 1)
    assert calls == [("add", 1), ("add", 12), ("charge", 13)]
    kinds = _kinds(env.history("t"), 1)
    assert kinds[:4] == ["TurnStarted", "ExecutionStarted", "ExecutionReset", "EventRaised"]


def test_a_running_instance_is_reset_and_its_old_timer_never_fires(env: TestEngine) -> None:
    env.start("napper", 5, instance_id="n")
    env.run()
    assert env.get("n").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    env.reset("n", _sequence_of(env, "n", TaskCompleted), "the add again")
    state = env.wait_for_completion("n")
    assert (state.output, state.generation) == (7, 1)
    assert calls == [("add", 5), ("add", 5), ("add", 6)]
    history = env.history("n")
    assert not any(type(e.body).__name__ == "TimerFired" for e in history if e.generation == 0)
    assert len([e for e in history if isinstance(e.body, TimerCreated)]) == 2  # one per run


def test_timers_and_attempts_the_kept_turns_wait_for_are_asked_for_again(env: TestEngine) -> None:
    env.start("napper", 5, instance_id="w")
    env.run()
    # the point is the timer's own turn: the kept turns end with the add's result, the
    # code creates the timer again; resetting after it keeps the timer, whose row is new
    timer_turn_end = _sequence_of(env, "w", TimerCreated) + 1
    env.raise_event("w", "noise", None)  # a later turn, so the point is inside the run
    env.run()
    env.reset("w", timer_turn_end, "keep the timer")
    env.advance(timedelta(seconds=61))
    state = env.wait_for_completion("w")
    assert (state.output, state.generation) == (7, 1)
    assert calls == [("add", 5), ("add", 6)]  # no activity ran twice


def test_a_late_result_of_the_old_run_is_dropped(env: TestEngine) -> None:
    env.start("napper", 5, instance_id="late")
    env.run()
    env.reset("late", ResetTarget.FIRST_TURN, "again")
    env.run()
    before = env.history("late")
    stale = ActivityResult("late", generation=0, task_id=0, output=to_payload(99))
    env.produce(env.topics.activity_results, b"late", encode_message(stale))
    env.run()
    assert env.history("late") == before  # rejected by the generation check
    env.advance(timedelta(seconds=61))
    assert env.wait_for_completion("late").output == 7


def test_a_child_the_kept_turns_wait_for_is_started_again(env: TestEngine) -> None:
    env.start("parent", 1, instance_id="p")
    env.run()
    assert env.get("kid").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    # reset after the child started: the old run ends (the child is terminated by its
    # parent-close policy) and the new run starts it again
    env.reset("p", _sequence_of(env, "p", ExecutionStarted) + 4, "restart the child")
    env.run()
    kid = env.get("kid")
    assert kid is not None and kid.status is RuntimeStatus.RUNNING and kid.generation == 1
    env.raise_event("kid", "finish", None)
    state = env.wait_for_completion("p")
    assert (state.output, state.generation) == (4, 1)


def test_a_recursive_terminate_after_a_reset_reaches_the_restarted_child(
    env: TestEngine,
) -> None:
    env.start("parent", 1, instance_id="p2")
    env.run()
    env.reset("p2", 0, "restart")  # from the first turn: the child starts again
    env.run()
    assert env.get("kid").generation == 1  # type: ignore[union-attr]
    env.terminate("p2", "stop all", recursive=True)
    env.run()
    kid = env.get("kid")
    assert kid is not None and (kid.status, kid.generation) == (RuntimeStatus.TERMINATED, 1)


def test_the_same_reset_request_is_applied_once(env: TestEngine) -> None:
    _finish_steps(env, "d")
    env.wait_for_completion("d")
    first = env.reset("d", ResetTarget.FIRST_TURN, request_id="once")
    env.run()
    again = env.reset("d", ResetTarget.FIRST_TURN, request_id="once")
    assert first is not None and again is not None and again.duplicate
    assert env.get("d").generation == 1  # type: ignore[union-attr]


def test_every_run_of_a_reset_replays_cold(env: TestEngine) -> None:
    _finish_steps(env, "r")
    env.wait_for_completion("r")
    env.reset("r", _sequence_of(env, "r", EventRaised), "from the event")
    env.wait_for_completion("r")
    history = env.history("r")
    for generation in (0, 1):
        execution = WorkflowExecution(registry, "r")
        execution.replay([e for e in history if e.generation == generation])
        assert execution.status is RuntimeStatus.COMPLETED


def test_a_reset_history_verifies_and_passes_the_replay_check(env: TestEngine) -> None:
    _finish_steps(env, "audit")
    env.wait_for_completion("audit")
    env.reset("audit", _sequence_of(env, "audit", EventRaised), "audited")
    env.wait_for_completion("audit")
    raw = [r.value for r in env.records(env.topics.history) if r.key == b"audit"]
    chain = verify_records([(None, value) for value in raw if value is not None])
    assert [result.ok for result in chain] == [True]
    checker = ReplayChecker(registry)
    checker.feed_all(env.history("audit"))
    report = checker.finish()
    assert report.ok and report.generations == 2


# --- rerun ----------------------------------------------------------------------------------------


def test_rerun_makes_a_new_instance_and_leaves_the_source(env: TestEngine) -> None:
    _finish_steps(env, "src")
    env.wait_for_completion("src")
    source_history = env.history("src")
    calls.clear()
    outcome = env.rerun("src", "copy", _sequence_of(env, "src", TaskScheduled, 2), "try again")
    assert outcome is not None and outcome.instance_id == "copy"
    state = env.wait_for_completion("copy")
    assert (state.output, state.generation) == (130, 0)
    assert calls == [("charge", 13)]
    assert env.history("src") == source_history
    marker = next(e.body for e in env.history("copy") if isinstance(e.body, ExecutionReset))
    assert marker.source_instance_id == "src"


def test_rerun_from_the_first_turn_is_the_default(env: TestEngine) -> None:
    _finish_steps(env, "a")
    env.wait_for_completion("a")
    env.rerun("a", "b")
    assert env.wait_for_completion("b").output == 130


# --- refusals ------------------------------------------------------------------------------


def test_reset_of_an_unknown_instance_is_refused(env: TestEngine) -> None:
    with pytest.raises(InstanceNotFoundError, match="no instance ghost"):
        env.reset("ghost", 3)


def test_reset_past_the_end_is_refused_and_changes_nothing(env: TestEngine) -> None:
    _finish_steps(env, "e")
    env.wait_for_completion("e")
    before = env.history("e")
    last = before[-1].sequence
    with pytest.raises(InvalidResetPointError, match=f"its last event is {last}"):
        env.reset("e", last + 5)
    assert env.history("e") == before


def test_reset_to_a_point_of_an_earlier_run_is_refused(env: TestEngine) -> None:
    _finish_steps(env, "g")
    env.wait_for_completion("g")
    env.reset("g", ResetTarget.FIRST_TURN)
    env.wait_for_completion("g")
    with pytest.raises(InvalidResetPointError, match="before the current run"):
        env.reset("g", 2)


def test_reset_to_the_last_failure_of_a_run_without_one_is_refused(env: TestEngine) -> None:
    _finish_steps(env, "ok")
    env.wait_for_completion("ok")
    with pytest.raises(InvalidResetPointError, match="no failure"):
        env.reset("ok", ResetTarget.LAST_FAILURE)


def test_rerun_into_a_running_instance_is_refused(env: TestEngine) -> None:
    _finish_steps(env, "one")
    env.wait_for_completion("one")
    env.start("napper", 1, instance_id="busy")
    env.run()
    with pytest.raises(WorkflowAlreadyRunningError, match="busy is RUNNING"):
        env.rerun("one", "busy")


def test_reset_of_a_scheduled_instance_is_refused(env: TestEngine) -> None:
    _finish_steps(env, "sched")
    env.wait_for_completion("sched")
    later = env.now() + timedelta(hours=1)
    env.start("steps", 1, instance_id="sched", start_at=later)
    env.run()
    with pytest.raises(InvalidResetPointError, match="waits for its start"):
        env.reset("sched", ResetTarget.FIRST_TURN)


def test_a_negative_point_is_refused_by_the_client(env: TestEngine) -> None:
    with pytest.raises(ValueError, match="negative"):
        env.reset("x", -1)


# --- every point of a run ----------------------------------------------------------------


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_reset_to_any_point_ends_with_the_same_result(data: st.DataObject) -> None:
    calls.clear()
    broken["charge"] = False
    with TestEngine(registry) as engine:
        _finish_steps(engine, "any")
        engine.wait_for_completion("any")
        events = engine.history("any")
        point = data.draw(st.sampled_from([e.sequence for e in events]))
        engine.reset("any", point, "property")
        state = engine.wait_for_completion("any")
        assert (state.status, state.output, state.generation) == (RuntimeStatus.COMPLETED, 130, 1)
