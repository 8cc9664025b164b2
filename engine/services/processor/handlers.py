"""Inbound handlers, one small function per record type.

Most handlers only queue an event on the instance's inbox; the workflow code runs when the
batch ends. Starting and purging change the instance's row itself, so they are handled here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.errors import PayloadTooLargeError, TurnstileError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowFailed,
    EventRaised,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    Inbound,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TimerFired,
)
from engine.core.messages import (
    ActivityResult,
    ChildResult,
    IdReusePolicy,
    Message,
    PurgeWorkflow,
    RaiseEvent,
    ResumeWorkflow,
    StartWorkflow,
    SuspendWorkflow,
    TerminateWorkflow,
)
from engine.services.processor import keys
from engine.services.processor.meta import InstanceMeta, PendingEvent

if TYPE_CHECKING:
    from engine.services.processor.partition import Loaded, PartitionProcessor

log = logging.getLogger("engine.processor")

#: Timer task id reserved for a start that waits for its scheduled time.
START_TIMER = -1


# --- start ---------------------------------------------------------------------------------


def on_start(pp: PartitionProcessor, msg: StartWorkflow, now_ms: int) -> None:
    keys.check_instance_id(msg.instance_id)
    item = pp.load(msg.instance_id)
    meta = item.meta
    if meta.exists and msg.request_id and msg.request_id == meta.request_id:
        return  # the same start delivered again: idempotent
    if meta.exists and not _reuse_allowed(pp, item, msg, now_ms):
        return
    if msg.scheduled_start_ms is not None and msg.scheduled_start_ms > now_ms:
        _schedule_start(pp, item, msg, now_ms)
        return
    begin(pp, item, msg, now_ms)


def _reuse_allowed(pp: PartitionProcessor, item: Loaded, msg: StartWorkflow, now_ms: int) -> bool:
    meta = item.meta
    assert meta.status is not None
    policy = msg.reuse_policy
    if meta.status.is_terminal:
        if policy is IdReusePolicy.REJECT_DUPLICATE:
            return _refuse(pp, msg, f"instance {msg.instance_id} already ran (REJECT_DUPLICATE)")
        return True
    if policy is IdReusePolicy.IGNORE_IF_RUNNING:
        return False
    if policy is IdReusePolicy.TERMINATE_IF_RUNNING:
        if meta.status is RuntimeStatus.PENDING:
            _cancel_scheduled_start(pp, meta)
            return True
        item.inbox.append(Inbound(ExecutionTerminated("restarted by a new start")))
        pp._step(pp, item, now_ms)
        return True
    return _refuse(pp, msg, f"instance {msg.instance_id} is {meta.status.value}")


def _refuse(pp: PartitionProcessor, msg: StartWorkflow, reason: str) -> bool:
    """A start the ID-reuse policy refused; a parent learns it as a failed child."""
    pp.counters.rejected += 1
    log.warning("start refused: %s", reason)
    if msg.parent_instance_id is not None:
        failure = FailureDetails("InstanceAlreadyExistsError", reason, retryable=False)
        pp.send(
            pp.env.topics.instance_messages,
            ChildResult(
                instance_id=msg.parent_instance_id,
                generation=msg.parent_generation or 0,
                task_id=msg.parent_task_id or 0,
                child_instance_id=msg.instance_id,
                status=RuntimeStatus.FAILED,
                failure=failure,
            ),
        )
    return False


def _schedule_start(pp: PartitionProcessor, item: Loaded, msg: StartWorkflow, now_ms: int) -> None:
    meta = item.meta
    if meta.exists:
        meta.generation += 1
    meta.status = RuntimeStatus.PENDING
    meta.name, meta.version, meta.input = msg.name, msg.version, msg.input
    meta.request_id = msg.request_id
    meta.created_ms = meta.last_updated_ms = now_ms
    meta.scheduled_start = msg
    assert msg.scheduled_start_ms is not None
    pp.tables.put_timer(
        keys.TimerKey(msg.scheduled_start_ms, msg.instance_id, meta.generation, START_TIMER)
    )
    save_meta(pp, meta)


def _cancel_scheduled_start(pp: PartitionProcessor, meta: InstanceMeta) -> None:
    start = meta.scheduled_start
    if start is not None and start.scheduled_start_ms is not None:
        key = keys.TimerKey(start.scheduled_start_ms, meta.instance_id, meta.generation, -1)
        pp.tables.delete_timer(key)
    meta.scheduled_start = None


def begin(pp: PartitionProcessor, item: Loaded, msg: StartWorkflow, now_ms: int) -> None:
    """Start a new run: a fresh execution, fed the start and any events that waited for it."""
    from engine.runtime.executor import WorkflowExecution

    meta = item.meta
    if meta.exists:
        meta.generation += 0 if meta.status is RuntimeStatus.PENDING else 1
        _drop_history(pp, meta)
    meta.status = RuntimeStatus.RUNNING
    meta.name, meta.version, meta.input = msg.name, msg.version, msg.input
    meta.output = meta.failure = meta.custom_status = None
    meta.created_ms = meta.last_updated_ms = now_ms
    meta.parent_instance_id = msg.parent_instance_id
    meta.parent_generation = msg.parent_generation
    meta.parent_task_id = msg.parent_task_id
    meta.tags, meta.request_id = dict(msg.tags), msg.request_id
    meta.scheduled_start = None
    meta.generation_start = meta.next_sequence
    item.execution = WorkflowExecution(
        pp.env.registry,
        meta.instance_id,
        start_sequence=meta.next_sequence,
        generation=meta.generation,
        max_turn_events=pp.env.turn_max_events,
    )
    meta.version = _resolved_version(pp, msg)
    item.inbox = [Inbound(_started(msg, meta.version))]
    ttl_floor = now_ms - pp.env.pending_events_ttl_ms
    for event in meta.pending_events:
        if event.received_ms >= ttl_floor:
            item.inbox.append(Inbound(EventRaised(event.name, event.input)))
    meta.pending_events = []
    save_meta(pp, meta)


def _resolved_version(pp: PartitionProcessor, msg: StartWorkflow) -> str:
    """The version the registry picks for the start (an empty version finds the only one),
    so that history and status say which code ran."""
    try:
        return pp.env.registry.get_workflow(msg.name, msg.version).version
    except TurnstileError:
        return msg.version  # unknown workflow: the runtime fails the instance and says why


def _started(msg: StartWorkflow, version: str) -> ExecutionStarted:
    return ExecutionStarted(
        name=msg.name,
        input=msg.input,
        version=version,
        parent_instance_id=msg.parent_instance_id,
        parent_generation=msg.parent_generation,
        parent_task_id=msg.parent_task_id,
        scheduled_start_ms=msg.scheduled_start_ms,
        tags=dict(msg.tags),
        request_id=msg.request_id,
    )


def _drop_history(pp: PartitionProcessor, meta: InstanceMeta) -> None:
    """The previous run's events leave the state table (the history topic keeps them)."""
    pp.tables.delete_history(meta.instance_id, meta.generation_start, meta.next_sequence)


def save_meta(pp: PartitionProcessor, meta: InstanceMeta) -> None:
    """Mark the row changed; it is written (with one status record) when the batch ends."""
    pp.dirty[meta.instance_id] = meta


# --- events and replies --------------------------------------------------------------------


def on_raise(pp: PartitionProcessor, msg: RaiseEvent, now_ms: int) -> None:
    pp.env.limits.check("event", f"the payload of event {msg.name!r}", msg.input)
    item = pp.load(msg.instance_id)
    meta = item.meta
    if meta.status in (None, RuntimeStatus.PENDING):
        _keep_pending(pp, meta, msg, now_ms)
    elif meta.status.is_terminal:
        _reject(pp, msg, f"instance is {meta.status.value}")
    else:
        item.inbox.append(Inbound(EventRaised(msg.name, msg.input)))


def _keep_pending(pp: PartitionProcessor, meta: InstanceMeta, msg: RaiseEvent, now: int) -> None:
    ttl_floor = now - pp.env.pending_events_ttl_ms
    kept = [e for e in meta.pending_events if e.received_ms >= ttl_floor]
    held = sum(len(e.input.data) for e in kept if e.input is not None)
    size = len(msg.input.data) if msg.input is not None else 0
    if len(kept) >= pp.env.pending_events_max or held + size > pp.env.limits.record // 2:
        pp.dead_letter(
            f"instance {msg.instance_id} has not started and already holds "
            f"{len(kept)} pending events of {held} bytes (pending_events_max, and half of "
            f"max_record_bytes in all); start it or raise the bound",
            pp.env.topics.commands,
            -1,
            msg.instance_id.encode(),
            None,
            now,
        )
        return
    kept.append(PendingEvent(msg.name, msg.input, now))
    meta.pending_events = kept
    save_meta(pp, meta)


def _reject(pp: PartitionProcessor, msg: Message, reason: str) -> None:
    pp.counters.rejected += 1
    log.info("%s for %s ignored: %s", msg.KIND, msg.instance_id, reason)


def _deliver(pp: PartitionProcessor, msg: Message, inbound: Inbound) -> None:
    item = pp.load(msg.instance_id)
    status = item.meta.status
    if status in (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED):
        item.inbox.append(inbound)
    else:
        _reject(pp, msg, f"instance is {status.value if status else 'unknown'}")


def on_activity_result(pp: PartitionProcessor, msg: ActivityResult, now_ms: int) -> None:
    body: Any
    failure = msg.failure or oversized_result(pp, msg)
    if failure is not None:
        body = TaskFailed(msg.task_id, failure, msg.attempt)
    else:
        body = TaskCompleted(msg.task_id, msg.output, msg.attempt)
    _deliver(pp, msg, Inbound(body, msg.generation))


def oversized_result(pp: PartitionProcessor, msg: ActivityResult) -> FailureDetails | None:
    """A result over the activity result limit fails its attempt (the retry policy decides)."""
    try:
        pp.env.limits.check("activity_result", f"the result of task {msg.task_id}", msg.output)
    except PayloadTooLargeError as exc:
        return failure_from_exception(exc, retryable=False)
    return None


def on_child_result(pp: PartitionProcessor, msg: ChildResult, now_ms: int) -> None:
    body: Any
    if msg.status is RuntimeStatus.COMPLETED:
        body = ChildWorkflowCompleted(msg.task_id, msg.output)
    else:
        failure = msg.failure or FailureDetails(
            "ChildWorkflowFailedError", f"child {msg.child_instance_id} ended {msg.status.value}"
        )
        body = ChildWorkflowFailed(msg.task_id, failure)
    _deliver(pp, msg, Inbound(body, msg.generation))


def on_terminate(pp: PartitionProcessor, msg: TerminateWorkflow, now_ms: int) -> None:
    item = pp.load(msg.instance_id)
    meta = item.meta
    if meta.status is RuntimeStatus.PENDING:
        _cancel_scheduled_start(pp, meta)
        meta.status = RuntimeStatus.TERMINATED
        meta.last_updated_ms = now_ms
        save_meta(pp, meta)
        return
    _deliver(pp, msg, Inbound(ExecutionTerminated(msg.reason, msg.recursive)))


def on_suspend(pp: PartitionProcessor, msg: SuspendWorkflow, now_ms: int) -> None:
    _deliver(pp, msg, Inbound(ExecutionSuspended(msg.reason)))


def on_resume(pp: PartitionProcessor, msg: ResumeWorkflow, now_ms: int) -> None:
    _deliver(pp, msg, Inbound(ExecutionResumed(msg.reason)))


def on_purge(pp: PartitionProcessor, msg: PurgeWorkflow, now_ms: int) -> None:
    item = pp.load(msg.instance_id)
    meta = item.meta
    if meta.status is None or not meta.status.is_terminal:
        _reject(pp, msg, "only completed, failed or terminated instances can be purged")
        return
    _drop_history(pp, meta)
    for timer in pp.tables.timers_of(meta.instance_id):
        pp.tables.delete_timer(timer)
    pp.dirty.pop(meta.instance_id, None)
    pp.tables.delete_meta(meta.instance_id)
    pp.emit(pp.env.topics.status, meta.instance_id.encode(), None, pp.partition)
    item.meta = InstanceMeta(meta.instance_id)
    item.execution = None


# --- timers ---------------------------------------------------------------------------------


def fire_timer(pp: PartitionProcessor, timer: keys.TimerKey, now_ms: int) -> None:
    pp.tables.delete_timer(timer)
    item = pp.load(timer.instance_id)
    meta = item.meta
    if timer.generation != meta.generation:
        pp.counters.rejected += 1
        return  # a timer of an older generation: dropped, never applied
    if timer.task_id == START_TIMER:
        if meta.status is RuntimeStatus.PENDING and meta.scheduled_start is not None:
            begin(pp, item, meta.scheduled_start, now_ms)
        return
    if meta.status in (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED):
        item.inbox.append(Inbound(TimerFired(timer.task_id, timer.fire_at_ms), timer.generation))


Handler = Callable[["PartitionProcessor", Any, int], None]

MESSAGE_HANDLERS: dict[type[Message], Handler] = {
    StartWorkflow: on_start,
    RaiseEvent: on_raise,
    TerminateWorkflow: on_terminate,
    SuspendWorkflow: on_suspend,
    ResumeWorkflow: on_resume,
    PurgeWorkflow: on_purge,
    ActivityResult: on_activity_result,
    ChildResult: on_child_result,
}
