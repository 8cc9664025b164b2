"""Inbound event handlers: one small function per event kind.

A handler either refuses an event (returning the reason, with no side effect) or accepts
it: it journals the event (``ex.journal_inbound``) and then applies it. Applying only
changes state and queues waiters; the code runs after all of a turn's events are applied.
The same handlers apply recorded events on replay, where ``journal_inbound`` journals
nothing. Handlers see the execution only through :class:`EventTarget`, so this module does
not import the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowFailed,
    EventBody,
    EventRaised,
    ExecutionCancelRequested,
    ExecutionCompleted,
    ExecutionReset,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TimerFired,
    UpdateAccepted,
    UpdatesCarried,
)
from engine.runtime.durable import RUNNING, ActivityCall, ChildTask, TimerTask
from engine.runtime.generation import Generation
from engine.runtime.updates import on_update_accepted


class EventTarget(Protocol):
    """What a handler applies an event to (the executor's WorkflowExecution)."""

    @property
    def current_generation(self) -> Generation | None: ...

    @property
    def status(self) -> RuntimeStatus: ...

    def journal_inbound(self, body: EventBody) -> None: ...

    def begin_generation(self, started: ExecutionStarted) -> None: ...

    def apply_termination(self, body: ExecutionTerminated) -> None: ...

    def set_suspended(self, suspended: bool) -> None: ...


InboundHandler = Callable[[EventTarget, Any], "str | None"]


def _unknown(gen: Generation, task_id: int, kind: str) -> str:
    task = gen.tasks.get(task_id)
    if task is None:
        return f"generation {gen.number} has no task {task_id}"
    return f"task {task_id} of generation {gen.number} is a {type(task).__name__}, not {kind}"


def _current(ex: EventTarget) -> Generation:
    gen = ex.current_generation
    assert gen is not None  # guaranteed: events before ExecutionStarted are refused earlier
    return gen


def on_started(ex: EventTarget, body: ExecutionStarted) -> str | None:
    if ex.current_generation is not None:
        return "the instance has already started"
    ex.journal_inbound(body)
    ex.begin_generation(body)
    return None


def on_task_completed(ex: EventTarget, body: TaskCompleted) -> str | None:
    gen = ex.current_generation
    assert gen is not None
    task = gen.tasks.get(body.task_id)
    if type(task) is not ActivityCall:
        return _unknown(gen, body.task_id, "an activity")
    if task.phase != RUNNING or task.attempt != body.attempt:
        return task.check_result(body.attempt)
    ex.journal_inbound(body)
    task.completed(body.output)
    return None


def on_task_failed(ex: EventTarget, body: TaskFailed) -> str | None:
    gen = _current(ex)
    task = gen.tasks.get(body.task_id)
    if type(task) is not ActivityCall:
        return _unknown(gen, body.task_id, "an activity")
    reason = task.check_result(body.attempt)
    if reason is not None:
        return reason
    ex.journal_inbound(body)
    task.failed(body.failure, body.details)
    return None


def on_timer_fired(ex: EventTarget, body: TimerFired) -> str | None:
    gen = _current(ex)
    task = gen.tasks.get(body.task_id)
    if type(task) is not TimerTask:
        return _unknown(gen, body.task_id, "a timer")
    if task.done():
        how = "was cancelled" if task.cancelled() else "has already fired"
        return f"timer {body.task_id} of generation {gen.number} {how}"
    ex.journal_inbound(body)
    task.fire()
    return None


def _child(ex: EventTarget, task_id: int) -> tuple[ChildTask | None, str | None]:
    gen = _current(ex)
    task = gen.tasks.get(task_id)
    if type(task) is not ChildTask:
        return None, _unknown(gen, task_id, "a child workflow")
    if task_id not in gen.children:
        return None, f"child workflow {task.instance_id!r} (task {task_id}) has already finished"
    return task, None


def on_child_completed(ex: EventTarget, body: ChildWorkflowCompleted) -> str | None:
    task, reason = _child(ex, body.task_id)
    if task is None:
        return reason
    ex.journal_inbound(body)
    task.completed(body.output)
    return None


def on_child_failed(ex: EventTarget, body: ChildWorkflowFailed) -> str | None:
    task, reason = _child(ex, body.task_id)
    if task is None:
        return reason
    ex.journal_inbound(body)
    task.failed(body.failure)
    return None


def on_event_raised(ex: EventTarget, body: EventRaised) -> str | None:
    ex.journal_inbound(body)
    deliver_event(_current(ex), body)
    return None


def deliver_event(gen: Generation, body: EventRaised) -> None:
    """Hand the event to the oldest waiter for its name, or buffer it."""
    gen.receive_event(body.name, body.input)


def on_cancel_requested(ex: EventTarget, body: ExecutionCancelRequested) -> str | None:
    """Every fiber gets ``CancelledError`` at its current await when the code runs next
    (so what each waited on is cancelled by running code, journaled as decisions: a running
    activity gets a cancellation request, a timer is cancelled). Spawned fibers first, in
    the order they were spawned (so replay cancels them alike), the main coroutine last: its
    end ends the instance, and the others have seen the error by then. A request recorded
    before that (``every_fiber`` False) replays as it ran: the main coroutine alone."""
    gen = _current(ex)
    if gen.cancel_reason is not None:
        return "a cancellation was already requested"
    ex.journal_inbound(body)
    gen.cancel_reason = body.reason or "cancellation requested"
    gen.cancel_every_fiber = body.every_fiber
    main = gen.main
    if body.every_fiber:
        gen.ready.extend(fiber.cancel for fiber in gen.fibers if fiber is not main)
    if main is not None:
        gen.ready.append(main.cancel)
    return None


def on_terminated(ex: EventTarget, body: ExecutionTerminated) -> str | None:
    ex.journal_inbound(body)
    ex.apply_termination(body)
    return None


def on_suspended(ex: EventTarget, body: ExecutionSuspended) -> str | None:
    if ex.status is RuntimeStatus.SUSPENDED:
        return "the instance is already suspended"
    ex.journal_inbound(body)
    ex.set_suspended(True)
    return None


def on_resumed(ex: EventTarget, body: ExecutionResumed) -> str | None:
    if ex.status is not RuntimeStatus.SUSPENDED:
        return f"the instance is not suspended (it is {ex.status.value})"
    ex.journal_inbound(body)
    ex.set_suspended(False)
    return None


def on_updates_carried(ex: EventTarget, body: UpdatesCarried) -> str | None:
    """The updates earlier generations completed: remembered by update id, so a retry of
    one is refused as already accepted and answered with the first result."""
    ex.journal_inbound(body)
    update_ids = _current(ex).update_ids
    for done in body.updates:
        update_ids[done.update_id] = done
    return None


def on_reset(ex: EventTarget, body: ExecutionReset) -> str | None:
    """A reset's marker: the run before it was copied from an earlier run; nothing in
    the code's state changes (the events around it do that)."""
    ex.journal_inbound(body)
    return None


def on_recorded_end(ex: EventTarget, body: ExecutionCompleted) -> str | None:
    """Replay only: the ExecutionCompleted that a termination appended."""
    if body.status in APPENDED_ENDS and ex.status is body.status:
        return None
    return f"the instance is {ex.status.value}, not {body.status.value}"


#: The ends an ExecutionTerminated appends (inbound, not decisions of the code): a
#: termination's, a workflow timeout's.
APPENDED_ENDS = frozenset({RuntimeStatus.TERMINATED, RuntimeStatus.TIMED_OUT})


def termination_end(body: ExecutionTerminated) -> tuple[RuntimeStatus, str]:
    """The status and failure type an ExecutionTerminated ends the instance with."""
    if body.timeout:
        return RuntimeStatus.TIMED_OUT, "TimedOut"
    return RuntimeStatus.TERMINATED, "Terminated"


INBOUND: dict[type[EventBody], InboundHandler] = {
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
    ExecutionCancelRequested: on_cancel_requested,
    ExecutionReset: on_reset,
    UpdateAccepted: on_update_accepted,
    UpdatesCarried: on_updates_carried,
}
"""Events the processor may offer to an instance in a turn."""

RECORDED: dict[type[EventBody], InboundHandler] = {**INBOUND, ExecutionCompleted: on_recorded_end}
"""Events applied from history on replay (commands excluded)."""
