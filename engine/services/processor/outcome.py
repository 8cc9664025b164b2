"""Turning an instance's turn result into durable output.

New history events are chained (hash of the previous event) and written both to the history
topic and to the state table; each outbound action maps to one small handler that produces
a message or a timer row. Everything lands in the batch's transaction. A new outbound
action is one handler here and one entry in :data:`ACTION_HANDLERS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.codec import seal_history
from engine.core.errors import WorkflowRuntimeError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.messages import (
    ActivityTask,
    ChildResult,
    IdReusePolicy,
    RaiseEvent,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.runtime import actions as act
from engine.services.processor import keys, parking
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded

log = logging.getLogger("engine.processor")


def step_instance(b: Batch, item: Loaded, now_ms: int) -> None:
    """Run the instance's code on its inbox and record everything it decided."""
    inbox = parking.take_inbox(b, item)
    if inbox is None:
        return  # parked: the events wait for its retry
    meta = item.meta
    b.counters.turns += 1
    try:
        execution = b.execution(item)
        result = execution.step(inbox, now_ms)
    except Exception as exc:
        if not parking.parks_turn(b, item, inbox, exc, now_ms):
            _fail_instance(b, item, exc, now_ms)
        return
    if parking.parks_turn(b, item, inbox, parking.code_error(item, result), now_ms):
        return
    for rejected in result.rejected:
        b.counters.reject(rejected.inbound.body.KIND)
        log.info("%s: rejected %s: %s", meta.instance_id, rejected.inbound.body, rejected.reason)
    if not result.new_events:
        return
    _record_events(b, item, result.new_events)
    for action in result.actions:
        handler = ACTION_HANDLERS.get(type(action))
        if handler is not None:
            handler(b, item, action, now_ms)
    _refresh_meta(item, now_ms)
    b.save(meta)
    if meta.status is not None and meta.status.is_terminal:
        b.counters.completed += 1


def _record_events(b: Batch, item: Loaded, events: list[HistoryEvent]) -> None:
    meta = item.meta
    topic = b.env.topics.history
    key = meta.instance_id.encode()
    previous: HistoryEvent | None = None
    for event in events:
        sealed, data = seal_history(event, meta.last_hash)
        meta.last_hash = sealed.hash
        meta.next_sequence = event.sequence + 1
        b.tables.put(keys.history_key(meta.instance_id, event.sequence), data)
        b.emit(topic, key, data, b.partition)
        b.counters.recorded(meta.name, meta.version, event.body)
        if isinstance(event.body, ExecutionStarted) and _continues(previous):
            # the previous generation leaves the state table (the history topic keeps it),
            # so a cold load replays only the current generation
            b.tables.delete_history(meta.instance_id, meta.generation_start, event.sequence)
            meta.generation_start = event.sequence
        previous = event


def _continues(event: HistoryEvent | None) -> bool:
    return event is not None and isinstance(event.body, ContinuedAsNew)


def _refresh_meta(item: Loaded, now_ms: int) -> None:
    execution = item.execution
    assert execution is not None
    meta = item.meta
    meta.status = execution.status
    meta.generation = execution.generation
    meta.output = execution.output
    meta.failure = execution.failure
    meta.custom_status = execution.custom_status
    meta.input = execution.input
    meta.last_updated_ms = now_ms


def _fail_instance(b: Batch, item: Loaded, exc: Exception, now_ms: int) -> None:
    """The runtime itself could not go on (non-determinism, unknown workflow, a bug)."""
    meta = item.meta
    log.error("instance %s failed in the runtime: %s", meta.instance_id, exc)
    details = failure_from_exception(exc, retryable=False)
    if not isinstance(exc, WorkflowRuntimeError | LookupError):
        log.exception("unexpected error while running %s", meta.instance_id)
    event = HistoryEvent(
        meta.instance_id,
        meta.next_sequence,
        now_ms,
        meta.generation,
        ExecutionCompleted(RuntimeStatus.FAILED, None, details),
    )
    _record_events(b, item, [event])
    item.execution = None
    meta.status = RuntimeStatus.FAILED
    meta.failure = details
    meta.last_updated_ms = now_ms
    _notify_parent(b, meta.instance_id, item, RuntimeStatus.FAILED, None, details)
    b.save(meta)
    b.counters.completed += 1


# --- action handlers: one per outbound action ------------------------------------------------


def _schedule_activity(b: Batch, item: Loaded, a: act.ScheduleActivity, now_ms: int) -> None:
    task = ActivityTask(
        instance_id=item.meta.instance_id,
        generation=a.generation,
        task_id=a.task_id,
        attempt=a.attempt,
        name=a.name,
        input=a.input,
        timeout_ms=a.timeout_ms,
        scheduled_ms=now_ms,
    )
    b.send(b.env.topics.activity_tasks, task)


def _start_child(b: Batch, item: Loaded, a: act.StartChild, now_ms: int) -> None:
    parent = item.meta.instance_id
    start = StartWorkflow(
        instance_id=a.instance_id,
        name=a.name,
        input=a.input,
        version=a.version,
        reuse_policy=IdReusePolicy.ERROR_IF_RUNNING,
        request_id=f"{parent}/{a.generation}/{a.task_id}",
        parent_instance_id=parent,
        parent_generation=a.generation,
        parent_task_id=a.task_id,
    )
    b.send(b.env.topics.instance_messages, start)


def _create_timer(b: Batch, item: Loaded, a: act.CreateTimer, now_ms: int) -> None:
    key = keys.TimerKey(a.fire_at_ms, item.meta.instance_id, a.generation, a.task_id)
    b.tables.put_timer(key)


def _cancel_timer(b: Batch, item: Loaded, a: act.CancelTimer, now_ms: int) -> None:
    key = keys.TimerKey(a.fire_at_ms, item.meta.instance_id, a.generation, a.task_id)
    b.tables.delete_timer(key)


def _send_event(b: Batch, item: Loaded, a: act.SendEvent, now_ms: int) -> None:
    message = RaiseEvent(instance_id=a.target_instance_id, name=a.name, input=a.input)
    b.send(b.env.topics.instance_messages, message)


def _complete(b: Batch, item: Loaded, a: act.CompleteExecution, now_ms: int) -> None:
    _notify_parent(b, item.meta.instance_id, item, a.status, a.output, a.failure)


def _notify_parent(
    b: Batch,
    child_id: str,
    item: Loaded,
    status: RuntimeStatus,
    output: Any,
    failure: FailureDetails | None,
) -> None:
    meta = item.meta
    if meta.parent_instance_id is None:
        return
    result = ChildResult(
        instance_id=meta.parent_instance_id,
        generation=meta.parent_generation or 0,
        task_id=meta.parent_task_id or 0,
        child_instance_id=child_id,
        status=status,
        output=output,
        failure=failure,
    )
    b.send(b.env.topics.instance_messages, result)


def _terminate_children(b: Batch, item: Loaded, a: act.TerminateChildren, now_ms: int) -> None:
    for child in a.instance_ids:
        message = TerminateWorkflow(instance_id=child, reason=a.reason, recursive=True)
        b.send(b.env.topics.instance_messages, message)


def _nothing_to_send(b: Batch, item: Loaded, a: Any, now_ms: int) -> None:
    """Recorded in history and in the row already (continue-as-new moves the generation
    start when its ExecutionStarted is recorded); nothing leaves the partition."""


ActionHandler = Callable[[Batch, Loaded, Any, int], None]

ACTION_HANDLERS: dict[type, ActionHandler] = {
    act.ScheduleActivity: _schedule_activity,
    act.StartChild: _start_child,
    act.CreateTimer: _create_timer,
    act.CancelTimer: _cancel_timer,
    act.SendEvent: _send_event,
    act.CompleteExecution: _complete,
    act.ContinueAsNew: _nothing_to_send,
    act.TerminateChildren: _terminate_children,
    act.RunInlineStep: _nothing_to_send,
    act.SetCustomStatus: _nothing_to_send,
}
