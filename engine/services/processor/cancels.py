"""Telling workers that the workflow stopped waiting for an activity attempt.

An attempt is abandoned when its workflow no longer waits for it: its timeout fired (and a
retry replaced it, or the call gave up), its schedule-to-close passed, it lost a when_any
race, or the instance ended (completed, failed, terminated, continued as new). The worker
running it should stop it then, not let it run to its end. After each turn the processor
compares the attempts it sent with what the execution still waits for and sends an
:class:`ActivityCancel` for each abandoned one, on the attempt's task-queue topic with the
instance id as key: the same partition as the task, so it reaches the worker that owns it,
after the task.

The processor keeps the open attempts of a hot instance in memory (``Loaded.open_attempts``,
never stored); a cold instance's are read from its replayed execution before its turn, so a
termination of an instance evicted from the cache still reaches its activities.

:func:`send_activity_cancel` is the one place that makes the record, for any other code
that decides to cancel an attempt.
"""

from __future__ import annotations

from engine.core.history import Inbound, RuntimeStatus, TaskCompleted, TaskFailed
from engine.core.messages import ActivityCancel
from engine.runtime import actions as act
from engine.runtime.actions import TurnResult
from engine.runtime.durable import RUNNING, ActivityCall
from engine.runtime.executor import WorkflowExecution
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded, OpenAttempt

__all__ = ["after_turn", "before_turn", "send_activity_cancel"]

_WAITING = (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED)


def send_activity_cancel(
    b: Batch,
    instance_id: str,
    generation: int,
    task_id: int,
    attempt: int,
    task_queue: str,
    reason: str,
    *,
    run_id: str,
) -> None:
    """Ask the worker running this attempt (of run ``run_id``) to stop it (idempotent: a
    worker that no longer runs it ignores the request)."""
    cancel = ActivityCancel(instance_id, generation, task_id, attempt, reason, run_id)
    b.send(b.env.topics.task_queue(task_queue), cancel)


def _waiting(execution: WorkflowExecution | None) -> dict[int, OpenAttempt]:
    """The activity attempts ``execution`` waits for now, by task id."""
    if execution is None or execution.status not in _WAITING:
        return {}
    gen = execution.current_generation
    if gen is None:
        return {}
    return {
        task_id: (gen.number, task.attempt, task.task_queue)
        for task_id, task in gen.tasks.items()
        if type(task) is ActivityCall and task.phase == RUNNING
    }


def _still_waiting(execution: WorkflowExecution | None, task_id: int, open_: OpenAttempt) -> bool:
    if execution is None or execution.status not in _WAITING:
        return False
    gen = execution.current_generation
    if gen is None or gen.number != open_[0]:
        return False
    task = gen.tasks.get(task_id)
    return type(task) is ActivityCall and task.phase == RUNNING and task.attempt == open_[1]


def before_turn(item: Loaded, execution: WorkflowExecution) -> None:
    """Before a turn of an instance whose open attempts are not known (it was cold): read
    them from its (replayed) execution."""
    if item.open_attempts is None:
        item.open_attempts = _waiting(execution)


def after_turn(b: Batch, item: Loaded, inbox: list[Inbound], result: TurnResult) -> None:
    """Note the attempts the turn scheduled; cancel those the execution stopped waiting
    for, except the ones whose own result arrived in this turn."""
    open_ = item.open_attempts if item.open_attempts is not None else {}
    reported = {
        (i.body.task_id, i.body.attempt)
        for i in inbox
        if type(i.body) is TaskCompleted or type(i.body) is TaskFailed
    }
    execution = item.execution
    instance_id, run_id = item.meta.instance_id, item.meta.run_id

    def settle(task_id: int, attempt: OpenAttempt, reason: str) -> None:
        generation, number, queue = attempt
        if (task_id, number) not in reported:
            send_activity_cancel(
                b, instance_id, generation, task_id, number, queue, reason, run_id=run_id
            )

    for action in result.actions:
        if type(action) is act.ScheduleActivity:
            replaced = open_.get(action.task_id)
            if replaced is not None and replaced[1] != action.attempt:  # a retry replaces it
                settle(action.task_id, replaced, "a retry of the call replaced this attempt")
            open_[action.task_id] = (action.generation, action.attempt, action.task_queue)
    for task_id, attempt in list(open_.items()):
        if not _still_waiting(execution, task_id, attempt):
            del open_[task_id]
            settle(task_id, attempt, _reason(execution))
    item.open_attempts = open_


def _reason(execution: WorkflowExecution | None) -> str:
    if execution is None or execution.status not in _WAITING:
        status = "ended" if execution is None else execution.status.value
        return f"its workflow instance is {status}"
    return "the workflow stopped waiting for this attempt (a timeout, or it was cancelled)"
