"""ctx.call_activity: results, failures, retries with durable backoff, timeouts, and the
rejection of results that match no waiting point."""

from __future__ import annotations

from typing import Any

import pytest
from runtime_harness import START_MS, Sim

from engine import (
    ActivityFailedError,
    ApplicationError,
    Registry,
    RetryPolicy,
    WorkflowContext,
)
from engine.core.failure import FailureDetails
from engine.core.history import (
    ExecutionStarted,
    Inbound,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCancelled,
    TimerCreated,
    TimerFired,
)
from engine.core.payloads import to_payload
from engine.runtime import CancelTimer, CreateTimer, ScheduleActivity, WorkflowExecution
from engine.runtime.activity_options import DEFAULT_START_TO_CLOSE_S

reg = Registry()
calls: dict[str, int] = {}


@reg.activity
def flaky(times: int) -> str:
    """Fails ``times`` times, then succeeds."""
    calls["flaky"] = calls.get("flaky", 0) + 1
    if calls["flaky"] <= times:
        raise ConnectionError(f"try {calls['flaky']}")
    return "ok"


@reg.activity
def declines(_: Any) -> None:
    raise ApplicationError("declined", type="Declined", non_retryable=True)


@reg.activity
def slow(_: Any) -> str:
    return "slow done"


@reg.workflow
async def call_one(ctx: WorkflowContext, args: dict[str, Any]) -> Any:
    policy = RetryPolicy(**args["policy"]) if "policy" in args else RetryPolicy()
    try:
        return await ctx.call_activity(
            args["name"], args.get("input"), retry=policy, timeout=args.get("timeout")
        )
    except ActivityFailedError as exc:
        return {"error": exc.details.type, "message": exc.details.message}


@reg.workflow
async def single_attempt(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.call_activity(flaky, 5, retry=None)


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def _run(args: dict[str, Any], **sim_kw: Any) -> Sim:
    sim = Sim(reg, **sim_kw)
    sim.start("call_one", args)
    sim.run()
    return sim


def test_result_is_returned() -> None:
    sim = _run({"name": "flaky", "input": 0})
    assert sim.output() == "ok"
    assert sim.kinds() == [
        "TurnStarted",
        "ExecutionStarted",
        "TaskScheduled",
        "TurnStarted",
        "TaskCompleted",
        "ExecutionCompleted",
    ]


def test_retries_use_durable_backoff_timers_and_the_same_task_id() -> None:
    sim = _run({"name": "flaky", "input": 2, "policy": {"jitter": 0}})
    assert sim.output() == "ok"
    scheduled = sim.bodies(TaskScheduled)
    assert [(t.task_id, t.attempt) for t in scheduled] == [(0, 1), (0, 2), (0, 3)]
    timers = sim.bodies(TimerCreated)
    assert [t.task_id for t in timers] == [1, 2]
    fired_at = [e.timestamp_ms for e in sim.history() if type(e.body) is TimerCreated]
    assert [t.fire_at_ms - at for t, at in zip(timers, fired_at, strict=True)] == [1000, 2000]


def test_retries_give_up_after_max_attempts() -> None:
    sim = _run({"name": "flaky", "input": 9, "policy": {"max_attempts": 2}})
    assert sim.output() == {"error": "ConnectionError", "message": "try 2"}
    assert len(sim.bodies(TaskScheduled)) == 2


def test_non_retryable_failures_are_not_retried() -> None:
    sim = _run({"name": "declines"})
    assert sim.output() == {"error": "Declined", "message": "declined"}
    assert len(sim.bodies(TaskScheduled)) == 1
    by_type = _run(
        {"name": "flaky", "input": 9, "policy": {"non_retryable_errors": ["ConnectionError"]}}
    )
    assert len(by_type.bodies(TaskScheduled)) == 1


def test_retry_none_makes_one_attempt() -> None:
    sim = Sim(reg)
    sim.start("single_attempt")
    sim.run()
    failure = sim.failure()
    assert sim.status() is RuntimeStatus.FAILED
    assert failure is not None and failure.type == "ActivityFailedError"
    assert "after 1 attempt(s): ConnectionError: try 1" in failure.message


def test_zero_backoff_schedules_the_next_attempt_directly() -> None:
    sim = _run({"name": "flaky", "input": 1, "policy": {"initial_interval": 0}})
    assert sim.output() == "ok"
    assert sim.bodies(TimerCreated) == []


def test_start_to_close_timeout_fails_the_attempt_and_retries() -> None:
    sim = _run({"name": "slow", "timeout": 5, "policy": {"max_attempts": 2}}, hold={"slow"})
    assert sim.output() == {
        "error": "ActivityTimeoutError",
        "message": "activity 'slow' attempt 2 did not finish within its start-to-close "
        "timeout of 5s",
    }
    assert [t.attempt for t in sim.bodies(TaskScheduled)] == [1, 2]
    assert all(t.timeout_ms == 5000 for t in sim.bodies(TaskScheduled))


def test_a_late_result_of_a_timed_out_attempt_is_rejected() -> None:
    execution = WorkflowExecution(reg, "wf")
    args = {"name": "slow", "timeout": 5, "policy": {"jitter": 0}}
    execution.step([Inbound(ExecutionStarted("call_one", to_payload(args)))], 0)
    assert execution.pending_timers == {1: 5000}
    execution.step([Inbound(TimerFired(1, 5000), 0)], 5000)  # attempt 1 timed out
    assert execution.pending_timers == {2: 6000}  # the backoff
    late = Inbound(TaskCompleted(0, to_payload("late"), attempt=1), 0)
    assert "a retry is pending" in execution.step([late], 5500).rejected[0].reason
    result = execution.step([Inbound(TimerFired(2, 6000), 0)], 6000)
    assert result.actions == [  # the task carries its timer's time as its deadline
        CreateTimer(3, 11000, generation=0),
        ScheduleActivity(0, "slow", None, 2, 5000, generation=0, deadline_ms=11000),
    ]
    assert "the current attempt is 2" in execution.step([late], 6500).rejected[0].reason
    done = execution.step([Inbound(TaskCompleted(0, to_payload("ok"), attempt=2), 0)], 7000)
    assert execution.output == to_payload("ok")
    assert [type(a).__name__ for a in done.actions] == ["CancelTimer", "CompleteExecution"]


def test_completion_cancels_the_timeout_timer() -> None:
    sim = _run({"name": "slow", "timeout": 5})
    assert sim.output() == "slow done"
    assert sim.bodies(TimerCancelled) == [TimerCancelled(1)]
    actions = sim.actions()
    assert CreateTimer(1, START_MS + 5000, generation=0) in actions
    assert CancelTimer(1, START_MS + 5000, generation=0) in actions


def _started() -> WorkflowExecution:
    execution = WorkflowExecution(reg, "wf")
    args = {"name": "flaky", "input": 0, "policy": {"max_attempts": 3}}
    result = execution.step([Inbound(ExecutionStarted("call_one", to_payload(args)))], 1000)
    # no timeout named: the default start-to-close goes to the worker, no timer here
    default = round(DEFAULT_START_TO_CLOSE_S * 1000)
    assert result.actions == [ScheduleActivity(0, "flaky", to_payload(0), 1, default, generation=0)]
    return execution


def test_results_that_match_no_waiting_point_are_rejected() -> None:
    execution = _started()
    failure = FailureDetails("Boom", "boom")
    offers = [
        Inbound(TaskCompleted(7, to_payload(1)), 0),  # unknown task
        Inbound(TaskCompleted(0, to_payload(1), attempt=2), 0),  # attempt not scheduled
        Inbound(TaskCompleted(0, to_payload(1)), 1),  # another generation
        Inbound(TimerFired(0, 5), 0),  # task 0 is not a timer
    ]
    result = execution.step(offers, 2000)
    assert [r.inbound for r in result.rejected] == offers
    assert result.new_events == [] and result.actions == []
    reasons = [r.reason for r in result.rejected]
    assert reasons[0] == "generation 0 has no task 7"
    assert "is stale: the current attempt is 1" in reasons[1]
    assert "generation 1" in reasons[2]
    assert "not a timer" in reasons[3]
    # a failure then a stale result of the failed attempt in the same turn
    result = execution.step(
        [Inbound(TaskFailed(0, failure), 0), Inbound(TaskCompleted(0, to_payload(1)), 0)], 3000
    )
    assert [type(e.body).__name__ for e in result.new_events] == [
        "TurnStarted",
        "TaskFailed",
        "TimerCreated",
    ]
    assert "a retry is pending" in result.rejected[0].reason


def test_duplicate_results_are_rejected() -> None:
    execution = _started()
    done = Inbound(TaskCompleted(0, to_payload("ok")), 0)
    result = execution.step([done, done], 2000)
    assert execution.status is RuntimeStatus.COMPLETED
    assert len(result.rejected) == 1
    assert "has ended" not in result.rejected[0].reason
    assert "already completed" in result.rejected[0].reason
    late = execution.step([done], 3000)
    assert late.rejected[0].reason == "the instance has ended (COMPLETED)"


def test_an_undecodable_result_fails_the_await() -> None:
    execution = _started()
    from engine.core.payloads import Payload

    execution.step([Inbound(TaskCompleted(0, Payload(b"{not json")), 0)], 2000)
    assert execution.status is RuntimeStatus.FAILED
    assert execution.failure is not None and execution.failure.type == "CodecError"


def test_retry_policy_validation_and_delays() -> None:
    policy = RetryPolicy(initial_interval=1, backoff_coefficient=3, max_interval=5)
    assert [policy.delay_ms(n) for n in (1, 2, 3)] == [1000, 3000, 5000]
    assert policy.delay_ms(5000) == 5000  # no overflow
    assert RetryPolicy(max_attempts=0).should_retry(10_000, FailureDetails("E", "m"))
    with pytest.raises(ValueError):
        RetryPolicy(backoff_coefficient=0.5)
    with pytest.raises(TypeError):
        RetryPolicy(non_retryable_errors="ValueError")  # type: ignore[arg-type]
