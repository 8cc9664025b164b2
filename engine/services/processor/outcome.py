"""Turning an instance's turn result into durable output.

New history events are chained (hash of the previous event) and written both to the history
topic and to the state table; each outbound action maps to one small handler that produces
a message or a timer row. Everything lands in the batch's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.codec import seal_history
from engine.core.errors import WorkflowRuntimeError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ContinuedAsNew,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
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
from engine.runtime.actions import TurnResult
from engine.runtime.interrupt import TurnEventsExceeded
from engine.services.processor import keys
from engine.services.processor.handlers import save_meta
from engine.services.processor.poison import check_turn, fail_turn
from engine.services.watchdog import REPLAY_EVENTS_PER_BUDGET

if TYPE_CHECKING:
    from engine.services.processor.partition import Loaded, PartitionProcessor

log = logging.getLogger("engine.processor")


def step_instance(pp: PartitionProcessor, item: Loaded, now_ms: int) -> None:
    """Run the instance's code on its inbox and record everything it decided."""
    inbox, item.inbox = item.inbox, []
    meta = item.meta
    pp.counters.turns += 1
    poisoned = pp.quarantine.take_instance(meta.instance_id)
    if poisoned is not None:  # an earlier try of this batch could not finish its turn
        fail_turn(pp, item, inbox, poisoned, now_ms, shrink=True)
        return
    try:
        if item.execution is None:  # cold: replay first, under a budget that grows with it
            rows = pp.tables.history(meta.instance_id, meta.generation_start)
            pp.env.watchdog.run(
                lambda: pp.replay(item, rows),
                f"the replay of {meta.instance_id!r}",
                scale=len(rows) / REPLAY_EVENTS_PER_BUDGET,
            )
        result = pp.env.watchdog.run(
            lambda: _run_turn(pp, item, inbox, now_ms), f"the turn of {meta.instance_id!r}"
        )
    except Exception as exc:
        _fail_instance(pp, item, inbox, exc, now_ms)
        return
    pp.counters.rejected += len(result.rejected)
    for rejected in result.rejected:
        log.info("%s: rejected %s: %s", meta.instance_id, rejected.inbound.body, rejected.reason)
    if not result.new_events:
        return
    oversized = check_turn(pp.env.limits, result.new_events)
    if oversized is not None:
        log.warning("instance %s failed: %s", meta.instance_id, oversized.message)
        fail_turn(pp, item, inbox, oversized, now_ms)
        return
    record_events(pp, item, result.new_events)
    for action in result.actions:
        handler = ACTION_HANDLERS.get(type(action))
        if handler is not None:
            handler(pp, item, action, now_ms)
    _refresh_meta(item, now_ms)
    save_meta(pp, meta)
    if meta.status is not None and meta.status.is_terminal:
        pp.counters.completed += 1


def _run_turn(
    pp: PartitionProcessor, item: Loaded, inbox: list[Inbound], now_ms: int
) -> TurnResult:
    """Replay (if cold) and step the execution; what the watchdog's budget covers."""
    try:
        return pp.execution(item).step(inbox, now_ms)
    except TurnEventsExceeded as exc:
        raise exc.error() from None


def record_events(pp: PartitionProcessor, item: Loaded, events: list[HistoryEvent]) -> None:
    meta = item.meta
    topic = pp.env.topics.history
    key = meta.instance_id.encode()
    previous: HistoryEvent | None = None
    for event in events:
        sealed, data = seal_history(event, meta.last_hash)
        meta.last_hash = sealed.hash
        meta.next_sequence = event.sequence + 1
        pp.tables.put(keys.history_key(meta.instance_id, event.sequence), data)
        pp.emit(topic, key, data, pp.partition)
        if isinstance(event.body, ExecutionStarted) and _continues(previous):
            # the previous generation leaves the state table (the history topic keeps it),
            # so a cold load replays only the current generation
            pp.tables.delete_history(meta.instance_id, meta.generation_start, event.sequence)
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


def _fail_instance(
    pp: PartitionProcessor, item: Loaded, inbox: list[Inbound], exc: Exception, now_ms: int
) -> None:
    """The runtime itself could not go on (non-determinism, unknown workflow, the turn
    budget, a bug): the instance fails with the error and its traceback."""
    log.error("instance %s failed in the runtime: %s", item.meta.instance_id, exc)
    if not isinstance(exc, WorkflowRuntimeError | LookupError):
        log.exception("unexpected error while running %s", item.meta.instance_id)
    fail_turn(pp, item, inbox, failure_from_exception(exc, retryable=False), now_ms)


# --- action handlers: one per outbound action ------------------------------------------------


def _schedule_activity(
    pp: PartitionProcessor, item: Loaded, a: act.ScheduleActivity, now_ms: int
) -> None:
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
    pp.send(pp.env.topics.activity_tasks, task)


def _start_child(pp: PartitionProcessor, item: Loaded, a: act.StartChild, now_ms: int) -> None:
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
    pp.send(pp.env.topics.instance_messages, start)


def _create_timer(pp: PartitionProcessor, item: Loaded, a: act.CreateTimer, now_ms: int) -> None:
    key = keys.TimerKey(a.fire_at_ms, item.meta.instance_id, a.generation, a.task_id)
    pp.tables.put_timer(key)


def _cancel_timer(pp: PartitionProcessor, item: Loaded, a: act.CancelTimer, now_ms: int) -> None:
    key = keys.TimerKey(a.fire_at_ms, item.meta.instance_id, a.generation, a.task_id)
    pp.tables.delete_timer(key)


def _send_event(pp: PartitionProcessor, item: Loaded, a: act.SendEvent, now_ms: int) -> None:
    message = RaiseEvent(instance_id=a.target_instance_id, name=a.name, input=a.input)
    pp.send(pp.env.topics.instance_messages, message)


def _complete(pp: PartitionProcessor, item: Loaded, a: act.CompleteExecution, now_ms: int) -> None:
    notify_parent(pp, item.meta.instance_id, item, a.status, a.output, a.failure)


def notify_parent(
    pp: PartitionProcessor,
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
    pp.send(pp.env.topics.instance_messages, result)


def _terminate_children(
    pp: PartitionProcessor, item: Loaded, a: act.TerminateChildren, now_ms: int
) -> None:
    for child in a.instance_ids:
        message = TerminateWorkflow(instance_id=child, reason=a.reason, recursive=True)
        pp.send(pp.env.topics.instance_messages, message)


def _nothing_to_send(pp: PartitionProcessor, item: Loaded, a: Any, now_ms: int) -> None:
    """Recorded in history and in the row already (continue-as-new moves the generation
    start when its ExecutionStarted is recorded); nothing leaves the partition."""


ActionHandler = Callable[["PartitionProcessor", "Loaded", Any, int], None]

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
