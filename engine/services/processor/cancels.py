"""Telling workers that the workflow stopped waiting for an activity attempt.

An attempt is abandoned when its workflow no longer waits for it: its timeout fired (and a
retry replaced it, or the call gave up), its schedule-to-close passed, it lost a when_any
race, or the instance ended (completed, failed, terminated, continued as new). The worker
running it should stop it then, not let it run to its end. The runtime reports each
abandoned attempt as it lets go of it (an :class:`~engine.runtime.actions.AbandonAttempt`
action), and after the turn the processor sends an :class:`ActivityCancel` for each one,
unless its own result arrived in that turn, on the attempt's task-queue topic with the
instance id as key: the same partition as the task, so it reaches the worker that owns it,
after the task. A turn's work here is its actions and its inbox, never the attempts still
open: a fan-out of 100,000 activities costs each of its turns what one result costs.

A cold instance is replayed before its turn and its turn runs live, so a termination of an
instance evicted from the cache still reports (and cancels) every running attempt.

The processor also keeps the open attempts of a hot instance in memory
(``Loaded.open_attempts``, never stored; a cold instance's are read from its replayed
execution before its turn), updated from the same actions and results, for a reset, which
cancels every attempt of the run it ends.

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
) -> None:
    """Ask the worker running this attempt to stop it (idempotent: a worker that no longer
    runs it ignores the request)."""
    cancel = ActivityCancel(instance_id, generation, task_id, attempt, reason)
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


def before_turn(item: Loaded, execution: WorkflowExecution) -> None:
    """Before a turn of an instance whose open attempts are not known (it was cold): read
    them from its (replayed) execution."""
    if item.open_attempts is None:
        item.open_attempts = _waiting(execution)


def after_turn(b: Batch, item: Loaded, inbox: list[Inbound], result: TurnResult) -> None:
    """Note the attempts the turn scheduled, drop those whose result it took, and cancel
    those the runtime reports abandoned, except the ones whose own result arrived in this
    turn (their worker is done with them). The work is the turn's actions and inbox: the
    attempts still open are never looked at."""
    open_ = item.open_attempts if item.open_attempts is not None else {}
    # results by (generation, task id, attempt); generation None: the current one (a
    # reset's first turn offers the results of the turn it was cut at so)
    reported = {
        (i.generation, i.body.task_id, i.body.attempt)
        for i in inbox
        if type(i.body) is TaskCompleted or type(i.body) is TaskFailed
    }
    for action in result.actions:
        if type(action) is act.ScheduleActivity:
            open_[action.task_id] = (action.generation, action.attempt, action.task_queue)
        elif type(action) is act.AbandonAttempt:
            _forget(open_, action.generation, action.task_id, action.attempt)
            if not _reported(reported, action):
                _tell_worker(b, item, action)
    for generation, task_id, attempt in reported:  # the result was taken: settled
        _forget(open_, generation, task_id, attempt)
    item.open_attempts = open_


def _tell_worker(b: Batch, item: Loaded, a: act.AbandonAttempt) -> None:
    instance_id = item.meta.instance_id
    send_activity_cancel(b, instance_id, a.generation, a.task_id, a.attempt, a.task_queue, a.reason)


def _reported(reported: set[tuple[int | None, int, int]], a: act.AbandonAttempt) -> bool:
    """Whether the attempt's own result is in the turn's inbox (for its generation, or
    for whichever generation is current)."""
    call = (a.task_id, a.attempt)
    return (a.generation, *call) in reported or (None, *call) in reported


def _forget(
    open_: dict[int, OpenAttempt], generation: int | None, task_id: int, attempt: int
) -> None:
    known = open_.get(task_id)
    if known is not None and known[1] == attempt and generation in (None, known[0]):
        del open_[task_id]
