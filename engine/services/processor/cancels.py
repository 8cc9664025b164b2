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

**Requeued tasks.** A task whose worker lacks the activity goes back to its queue one
partition further on, so the key's partition is not where it is any more. Every worker
that reads such a copy sends a note saying where it is (:func:`note_requeued`), after it
read it. For an attempt the instance still waits for, the processor keeps that location
(``processor.requeued``) and the attempt's cancellation goes there; for one it no longer
waits for, the cancellation is sent there at once. Either way it is produced after the note
arrived, so after the copy, on the copy's partition: that partition's owner sees the copy
and then the cancellation. A copy that moves on is noted again from its next partition and
answered the same way, so a cancellation follows a copy however far it goes.

The processor also keeps the open attempts of a hot instance in memory
(``Loaded.open_attempts``, never stored; a cold instance's are read from its replayed
execution before its turn), updated from the same actions and results: a reset cancels
them, and a note about a requeued copy is checked against them.

:func:`send_activity_cancel` is the one place that makes the record, for any other code
that decides to cancel an attempt.
"""

from __future__ import annotations

from engine.core.history import Inbound, RuntimeStatus, TaskCompleted, TaskFailed
from engine.core.messages import ActivityCancel, ActivityResult
from engine.runtime import actions as act
from engine.runtime.actions import TurnResult
from engine.runtime.durable import RUNNING, ActivityCall
from engine.runtime.executor import WorkflowExecution
from engine.services.processor import heartbeat_rows, requeued, runs
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded, OpenAttempt

__all__ = [
    "after_turn",
    "before_turn",
    "check_requeued",
    "note_requeued",
    "send_activity_cancel",
]

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
    worker that no longer runs it ignores the request): where its task is, the key's
    partition or, for a task that went back to its queue unserved, the partition its copy
    was last seen on."""
    call = (generation, task_id, attempt)
    partition = requeued.take(b.tables, instance_id, call)
    heartbeat_rows.settled(b.tables, instance_id, call)
    _send(b, instance_id, call, task_queue, reason, partition, run_id)


def _send(
    b: Batch,
    instance_id: str,
    call: tuple[int, int, int],
    task_queue: str,
    reason: str,
    partition: int | None,
    run_id: str,
) -> None:
    cancel = ActivityCancel(instance_id, *call, reason, run_id)
    b.send(b.env.topics.task_queue(task_queue), cancel, partition)


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


def before_turn(b: Batch, item: Loaded, execution: WorkflowExecution) -> None:
    """Before a turn of an instance whose open attempts are not known (it was cold): read
    them from its (replayed) execution, and check the requeued copies noted meanwhile."""
    if item.open_attempts is None:
        item.open_attempts = _waiting(execution)
    if item.requeue_checks:
        check_requeued(b, item)


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
    instance_id, run_id = item.meta.instance_id, item.meta.run_id
    for action in result.actions:
        if type(action) is act.ScheduleActivity:
            open_[action.task_id] = (action.generation, action.attempt, action.task_queue)
        elif type(action) is act.AbandonAttempt:
            a = action
            _forget(open_, a.generation, a.task_id, a.attempt)
            if not _reported(reported, a):
                ids = (a.generation, a.task_id, a.attempt)
                send_activity_cancel(b, instance_id, *ids, a.task_queue, a.reason, run_id=run_id)
    for result_of in reported:  # the result was taken: settled
        _forget(open_, *result_of)
        requeued.settled(b.tables, instance_id, result_of)
        heartbeat_rows.settled(b.tables, instance_id, result_of)
    item.open_attempts = open_


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


# --- requeued tasks ---------------------------------------------------------------------------


def note_requeued(b: Batch, msg: ActivityResult) -> None:
    """A worker read a requeued copy of an attempt, on partition ``msg.requeued_to``: keep
    where it is while the instance waits for the attempt, else cancel it there now."""
    item = b.load(msg.instance_id)
    meta = item.meta
    call = (msg.generation, msg.task_id, msg.attempt)
    if (
        meta.status not in _WAITING
        or msg.generation != meta.generation
        or runs.is_other_run(meta, msg.run_id)  # a copy of a purged run of this id
    ):
        what = "not running" if meta.status is None else meta.status.value
        reason = f"its workflow instance is {what}"
        _send(b, msg.instance_id, call, msg.task_queue, reason, msg.requeued_to, msg.run_id)
        return
    kept = requeued.read(b.tables, msg.instance_id, msg.task_id)
    if kept is None or kept[:2] != (msg.generation, msg.attempt) or kept[3] < msg.requeues:
        location = (msg.generation, msg.attempt, msg.requeued_to, msg.requeues, msg.task_queue)
        requeued.keep(b.tables, msg.instance_id, msg.task_id, location)
    if item.open_attempts is None:
        item.requeue_checks.add(msg.task_id)  # cold: checked once it is replayed
    else:
        _check(b, item, msg.task_id)


def check_requeued(b: Batch, item: Loaded) -> None:
    """The instance's open attempts are known now: cancel the requeued copies, noted while
    it was cold, of attempts it no longer waits for."""
    checks, item.requeue_checks = item.requeue_checks, set()
    for task_id in sorted(checks):
        _check(b, item, task_id)


def _check(b: Batch, item: Loaded, task_id: int) -> None:
    instance_id = item.meta.instance_id
    location = requeued.read(b.tables, instance_id, task_id)
    open_ = item.open_attempts
    if location is None or open_ is None:
        return
    attempt = open_.get(task_id)
    if attempt is not None and attempt[:2] == location[:2]:
        return  # still waited for: its cancellation, if any, goes where the copy is
    generation, number, partition, _, queue = location
    requeued.drop(b.tables, instance_id, task_id)
    reason = "the workflow stopped waiting for this attempt before its requeued task arrived"
    call = (generation, task_id, number)
    _send(b, instance_id, call, queue, reason, partition, item.meta.run_id)
