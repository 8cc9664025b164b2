"""Inbound event handlers: one small function per event kind.

A handler either refuses an event (returning the reason, with no side effect) or accepts
it: it journals the event (``ex._accept``) and then applies it. Applying only changes state
and queues waiters; the code runs after all of a turn's events are applied. The same
handlers apply recorded events on replay, where ``_accept`` journals nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowFailed,
    EventBody,
    EventRaised,
    ExecutionCompleted,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TimerFired,
)
from engine.runtime.durable import RUNNING, ActivityTask, ChildTask, TimerTask
from engine.runtime.generation import Generation
from engine.runtime.tasks import PENDING

if TYPE_CHECKING:
    from engine.runtime.executor import WorkflowExecution

Handler = Callable[["WorkflowExecution", Any], "str | None"]


def _unknown(gen: Generation, task_id: int, kind: str) -> str:
    task = gen.tasks.get(task_id)
    if task is None:
        return f"generation {gen.number} has no task {task_id}"
    return f"task {task_id} of generation {gen.number} is a {type(task).__name__}, not {kind}"


def _current(ex: WorkflowExecution) -> Generation:
    gen = ex._gen
    assert gen is not None  # guaranteed: events before ExecutionStarted are refused earlier
    return gen


def on_started(ex: WorkflowExecution, body: ExecutionStarted) -> str | None:
    if ex._gen is not None:
        return "the instance has already started"
    ex._accept(body)
    ex._begin(body)
    return None


def on_task_completed(ex: WorkflowExecution, body: TaskCompleted) -> str | None:
    gen = ex._gen
    assert gen is not None
    task = gen.tasks.get(body.task_id)
    if type(task) is not ActivityTask:
        return _unknown(gen, body.task_id, "an activity")
    if task.phase != RUNNING or task.attempt != body.attempt:
        return task.check_result(body.attempt)
    ex._accept(body)
    task.completed(body.output)
    return None


def on_task_failed(ex: WorkflowExecution, body: TaskFailed) -> str | None:
    gen = _current(ex)
    task = gen.tasks.get(body.task_id)
    if type(task) is not ActivityTask:
        return _unknown(gen, body.task_id, "an activity")
    reason = task.check_result(body.attempt)
    if reason is not None:
        return reason
    ex._accept(body)
    task.failed(body.failure)
    return None


def on_timer_fired(ex: WorkflowExecution, body: TimerFired) -> str | None:
    gen = _current(ex)
    task = gen.tasks.get(body.task_id)
    if type(task) is not TimerTask:
        return _unknown(gen, body.task_id, "a timer")
    if task._state != PENDING:
        how = "was cancelled" if task.cancelled() else "has already fired"
        return f"timer {body.task_id} of generation {gen.number} {how}"
    ex._accept(body)
    task.fire()
    return None


def _child(ex: WorkflowExecution, task_id: int) -> tuple[ChildTask | None, str | None]:
    gen = _current(ex)
    task = gen.tasks.get(task_id)
    if type(task) is not ChildTask:
        return None, _unknown(gen, task_id, "a child workflow")
    if task_id not in gen.children:
        return None, f"child workflow {task.instance_id!r} (task {task_id}) has already finished"
    return task, None


def on_child_completed(ex: WorkflowExecution, body: ChildWorkflowCompleted) -> str | None:
    task, reason = _child(ex, body.task_id)
    if task is None:
        return reason
    ex._accept(body)
    task.completed(body.output)
    return None


def on_child_failed(ex: WorkflowExecution, body: ChildWorkflowFailed) -> str | None:
    task, reason = _child(ex, body.task_id)
    if task is None:
        return reason
    ex._accept(body)
    task.failed(body.failure)
    return None


def on_event_raised(ex: WorkflowExecution, body: EventRaised) -> str | None:
    ex._accept(body)
    deliver_event(_current(ex), body)
    return None


def deliver_event(gen: Generation, body: EventRaised) -> None:
    """Hand the event to the oldest waiter for its name, or buffer it."""
    waiters = gen.event_waiters.get(body.name)
    while waiters:
        waiter = waiters.pop(0)
        if waiter._state == PENDING:
            waiter.deliver(body.input)
            return
    buffered = gen.event_buffers.get(body.name)
    if buffered is None:
        buffered = gen.event_buffers[body.name] = deque()
    buffered.append((gen.arrivals, body.input))
    gen.arrivals += 1


def on_terminated(ex: WorkflowExecution, body: ExecutionTerminated) -> str | None:
    ex._accept(body)
    ex._terminate(body)
    return None


def on_suspended(ex: WorkflowExecution, body: ExecutionSuspended) -> str | None:
    if ex._status is RuntimeStatus.SUSPENDED:
        return "the instance is already suspended"
    ex._accept(body)
    ex._status = RuntimeStatus.SUSPENDED
    return None


def on_resumed(ex: WorkflowExecution, body: ExecutionResumed) -> str | None:
    if ex._status is not RuntimeStatus.SUSPENDED:
        return f"the instance is not suspended (it is {ex._status.value})"
    ex._accept(body)
    ex._status = RuntimeStatus.RUNNING
    return None


def on_recorded_end(ex: WorkflowExecution, body: ExecutionCompleted) -> str | None:
    """Replay only: the ExecutionCompleted that a termination appended."""
    if body.status is RuntimeStatus.TERMINATED and ex._status is RuntimeStatus.TERMINATED:
        return None
    return f"the instance is {ex._status.value}, not {body.status.value}"


INBOUND: dict[type[EventBody], Handler] = {
    ExecutionStarted: on_started,
    TaskCompleted: on_task_completed,
    TaskFailed: on_task_failed,
    TimerFired: on_timer_fired,
    ChildWorkflowCompleted: on_child_completed,
    ChildWorkflowFailed: on_child_failed,
    EventRaised: on_event_raised,
    ExecutionTerminated: on_terminated,
    ExecutionSuspended: on_suspended,
    ExecutionResumed: on_resumed,
}
"""Events the processor may offer to an instance in a turn."""

RECORDED: dict[type[EventBody], Handler] = {**INBOUND, ExecutionCompleted: on_recorded_end}
"""Events applied from history on replay (commands excluded)."""
