"""Turning an instance's turn result into durable output.

New history events are chained (hash of the previous event) and written both to the history
topic and to the state table; each outbound action maps to one small handler that produces
a message or a timer row. Everything lands in the batch's transaction. A new outbound
action is one handler here and one entry in :data:`ACTION_HANDLERS`.

A turn that cannot be recorded ends the instance FAILED in its place (:func:`fail_turn`),
for one of these reasons, each decided by its own function in :func:`step_instance`:
an earlier try of the batch could not finish the turn (``_fail_quarantined``), the turn
broke one of the engine's bounds - the turn budget, the events per turn, a value's size
limit (``_fail_on_bound``; deliberate, never retried) - or the runtime itself could not go on
(``_fail_instance``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.codec import seal_history
from engine.core.errors import PayloadTooLargeError, WorkflowRuntimeError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    EventBody,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TurnStarted,
)
from engine.core.instance_row import InstanceRow, RunningChild
from engine.core.limits import RECORD_OVERHEAD, shorten_failure
from engine.core.messages import (
    ActivityTask,
    CancelWorkflow,
    ChildResult,
    IdReusePolicy,
    RaiseEvent,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.runtime import actions as act
from engine.runtime.actions import TurnResult
from engine.runtime.interrupt import TurnEventsExceeded
from engine.services.processor import (
    backlog,
    cancels,
    children,
    history_limits,
    keys,
    parking,
    pending,
    runs,
    spans,
    timeouts,
    updates,
)
from engine.services.processor.batch import Batch
from engine.services.processor.history_rows import pack_rows
from engine.services.processor.payload_aside import Aside, put_aside_turn
from engine.services.processor.poison import BOUND_ERRORS, TINY, check_turn, fitting
from engine.services.processor.publish import publish_record
from engine.services.processor.state import RUN_EVENTS, Loaded
from engine.services.watchdog import REPLAY_EVENTS_PER_BUDGET

log = logging.getLogger("engine.processor")


def step_instance(b: Batch, item: Loaded, now_ms: int) -> None:
    """Run the instance's code on its inbox and record everything it decided (what it
    sends carries the turn's trace context, and only its records do)."""
    spans.turn_begins(b, item)
    try:
        _step_instance(b, item, now_ms)
    finally:
        spans.turn_ends(b, item)


def _step_instance(b: Batch, item: Loaded, now_ms: int) -> None:
    if (
        item.requeue_checks
        and not item.inbox
        and not item.wake
        and not b.is_quarantined(item.meta.instance_id)
    ):
        _check_requeued(b, item)
        return
    item.wake = False
    item.continuing = item.execution.continuation if item.execution is not None else None
    inbox = parking.take_inbox(b, item, now_ms)
    if inbox is None:
        return  # parked: the events wait for its retry
    meta = item.meta
    generation = meta.generation
    b.counters.turns += 1
    refused = b.quarantined(meta.instance_id)
    if refused is not None:
        _fail_quarantined(b, item, inbox, refused, now_ms)
        return
    try:
        result = _run_turn(b, item, inbox, now_ms)
    except BOUND_ERRORS as exc:
        _fail_on_bound(b, item, inbox, failure_from_exception(exc, retryable=False), now_ms)
        return
    except Exception as exc:
        if not parking.parks_turn(b, item, inbox, exc, now_ms):
            _fail_instance(b, item, inbox, exc, now_ms)
        return
    if parking.parks_turn(b, item, inbox, parking.code_error(item, result), now_ms):
        return
    for rejected in result.rejected:
        b.counters.reject(rejected.inbound.body.KIND)
        log.info("%s: rejected %s: %s", meta.instance_id, rejected.inbound.body, rejected.reason)
    updates.answer_rejected(b, item, result, now_ms)
    try:
        result, aside = put_aside_turn(b, meta.instance_id, result)
    except PayloadTooLargeError as exc:
        _fail_on_bound(b, item, inbox, failure_from_exception(exc, retryable=False), now_ms)
        return
    if not result.new_events or not _record_turn(b, item, inbox, result, now_ms):
        return
    updates.answer_finished(b, item, result, now_ms)
    for action in result.actions:
        handler = ACTION_HANDLERS.get(type(action))
        if handler is not None:
            handler(b, item, action, now_ms)
    cancels.after_turn(b, item, inbox, result)  # workers stop what it no longer waits for
    _refresh_meta(item, now_ms, aside)
    timeouts.arm_new_run(b, meta, generation, now_ms)
    b.save(meta)
    backlog.after_turn(b, item, now_ms)
    if meta.status is not None and meta.status.is_terminal:
        b.counters.completed += 1
        if meta.status is RuntimeStatus.FAILED:
            log_failed(meta)


def log_failed(meta: InstanceRow) -> None:
    """The one ERROR line of an instance that ended FAILED (the failure is in its status
    and history too; this is for whoever watches the logs)."""
    failure = meta.failure
    why = f"{failure.type}: {failure.message}" if failure is not None else "no failure details"
    log.error(
        "instance %s (%s, generation %d) FAILED: %s",
        meta.instance_id,
        meta.name,
        meta.generation,
        why,
        extra={
            "instance_id": meta.instance_id,
            "generation": meta.generation,
            "error_type": failure.type if failure is not None else "",
        },
    )


def _run_turn(b: Batch, item: Loaded, inbox: list[Inbound], now_ms: int) -> TurnResult:
    """Replay (if cold) and step the execution, each under the turn watchdog: a cold
    replay gets a budget that grows with its history (it re-runs every recorded turn)."""
    _replay_if_cold(b, item)
    description = f"the turn of {item.meta.instance_id!r}"
    return b.env.watchdog.run(lambda: _step(b, item, inbox, now_ms), description)


def _replay_if_cold(b: Batch, item: Loaded) -> None:
    meta = item.meta
    if item.execution is None:
        rows = b.tables.history(meta.instance_id, meta.generation_start)
        b.env.watchdog.run(
            lambda: b.replay(item, rows),
            f"the replay of {meta.instance_id!r}",
            scale=len(rows) / REPLAY_EVENTS_PER_BUDGET,
        )


def _check_requeued(b: Batch, item: Loaded) -> None:
    """Notes about requeued copies of its tasks came for a cold instance, and no event:
    replay it to learn which attempts it still waits for (``cancels.note_requeued``). A
    parked instance, or one whose history does not replay, keeps the notes for its next
    turn, which replays it anyway."""
    if item.meta.parked is not None:
        return
    try:
        _replay_if_cold(b, item)
    except Exception as exc:
        item.execution = None
        log.warning("%s: not replayed to check its requeued tasks: %s", item.meta.instance_id, exc)
        return
    assert item.execution is not None
    cancels.before_turn(b, item, item.execution)


def _step(b: Batch, item: Loaded, inbox: list[Inbound], now_ms: int) -> TurnResult:
    execution = b.execution(item)
    item.continuing = execution.continuation
    cancels.before_turn(b, item, execution)
    backlog.feed(b, item, execution, inbox)
    suggested = history_limits.suggests(b, item.meta)
    try:
        spans.stepping(b, execution.history)
        return execution.step(inbox, now_ms, continue_as_new_suggested=suggested)
    except TurnEventsExceeded as exc:
        raise exc.error() from None


def _record_turn(
    b: Batch, item: Loaded, inbox: list[Inbound], result: TurnResult, now_ms: int
) -> bool:
    """Record the turn's events, unless one of the engine's bounds refuses them (a value
    over its size limit, the history limit): the instance then fails in their place."""
    meta = item.meta
    refusal = check_turn(b.env.limits, result.new_events)
    sealed = seal_events(meta, result.new_events) if refusal is None else []
    if refusal is None:
        refusal = history_limits.exceeded(b, meta, result, sealed)
    if refusal is not None:
        _fail_on_bound(b, item, inbox, refusal, now_ms)
        return False
    begins = any(type(e.body) is ExecutionStarted for e in result.new_events)
    before = (0, 0) if begins else history_limits.size(meta)
    write_events(b, item, result.new_events, sealed)
    history_limits.note_recorded(b, meta, before)
    return True


def record_events(b: Batch, item: Loaded, events: list[HistoryEvent]) -> None:
    """Chain ``events`` onto the instance's history and write them (history topic and
    state table)."""
    write_events(b, item, events, seal_events(item.meta, events))


def seal_events(meta: InstanceRow, events: list[HistoryEvent]) -> list[tuple[HistoryEvent, bytes]]:
    """The events chained onto the instance's hash chain and encoded; nothing is written
    yet (so a bound can still refuse them by their encoded size)."""
    sealed = []
    last_hash = meta.last_hash
    for event in events:
        chained, data = seal_history(event, last_hash)
        last_hash = chained.hash
        sealed.append((chained, data))
    return sealed


def write_events(
    b: Batch, item: Loaded, events: list[HistoryEvent], sealed: list[tuple[HistoryEvent, bytes]]
) -> None:
    """Write sealed events: each as its own record of the history topic, all of them as one
    row of the state table (``history_rows``: one changelog record for the turn). A
    generation that begins among them leaves the ones before it out of the state table,
    and the instance row counts the current generation's bytes."""
    meta = item.meta
    b.emit_all(b.env.topics.history, meta.instance_id.encode(), [d for _, d in sealed], b.partition)
    previous: HistoryEvent | None = None
    previous_size = 0
    for event, data in sealed:
        body = event.body
        if isinstance(body, RUN_EVENTS):  # most events neither start nor end a run
            b.counters.recorded(meta.name, meta.version, body)
        meta.history_bytes += len(data)
        if isinstance(body, ExecutionStarted):
            _new_generation(b, meta, event, previous)
            meta.history_bytes = len(data) + (previous_size if _opens(previous) else 0)
        previous, previous_size = event, len(data)
    if sealed:
        last = sealed[-1][0]
        meta.last_hash = last.hash
        meta.next_sequence = last.sequence + 1
    _put_row(b, meta, sealed)
    spans.turn_recorded(b, item, events)


def _put_row(b: Batch, meta: InstanceRow, sealed: list[tuple[HistoryEvent, bytes]]) -> None:
    """The turn's events of the current generation as one row keyed by the first (or as
    few rows as fit in a changelog record, for a turn that adds very many)."""
    kept = [(e.sequence, data) for e, data in sealed if e.sequence >= meta.generation_start]
    for first, row in pack_rows(kept, b.env.limits.record - RECORD_OVERHEAD):
        b.tables.put(keys.history_key(meta.instance_id, first), row)


def _opens(event: HistoryEvent | None) -> bool:
    return event is not None and isinstance(event.body, TurnStarted)


def _new_generation(
    b: Batch, meta: InstanceRow, started: HistoryEvent, previous: HistoryEvent | None
) -> None:
    """A generation began: it starts at the turn's ``TurnStarted`` (or at its start, in
    histories whose continue-as-new began the next generation in the same turn), and the
    generations before it leave the state table (the history topic keeps them), so a cold
    load replays only the current one. A new run has moved ``generation_start`` already."""
    begins = started.sequence
    if previous is not None and _opens(previous):
        begins = previous.sequence
    if begins > meta.generation_start:
        b.tables.delete_history(meta.instance_id, meta.generation_start, begins)
        meta.generation_start = begins


def _refresh_meta(item: Loaded, now_ms: int, aside: Aside) -> None:
    execution = item.execution
    assert execution is not None
    meta = item.meta
    status = execution.status
    # between a continue-as-new and the turn that begins the next generation (the next
    # batch) the instance runs on; the row shows it RUNNING, as every reader expects
    meta.status = RuntimeStatus.RUNNING if status is RuntimeStatus.CONTINUED_AS_NEW else status
    meta.generation = execution.generation
    meta.output = aside.swap(execution.output)  # the row holds what the history holds
    meta.failure = execution.failure
    meta.custom_status = execution.custom_status
    meta.tags = execution.tags
    meta.input = aside.swap(execution.input)
    meta.last_updated_ms = now_ms


# --- failed turns: one function per reason ----------------------------------------------------


def _fail_quarantined(
    b: Batch, item: Loaded, inbox: list[Inbound], details: FailureDetails, now_ms: int
) -> None:
    """An earlier try of this batch could not finish the turn (a record of it was refused,
    or a bug turning it into records): the instance fails with that reason, its values
    summarised so that the failure itself is accepted."""
    log.warning("instance %s failed: %s", item.meta.instance_id, details.message)
    fail_turn(b, item, inbox, details, now_ms, shrink=True)


def _fail_on_bound(
    b: Batch, item: Loaded, inbox: list[Inbound], details: FailureDetails, now_ms: int
) -> None:
    """The turn broke one of the engine's bounds (turn budget, events per turn, a size
    limit): a deliberate failure, never retried."""
    log.warning("instance %s failed: %s", item.meta.instance_id, details.message)
    fail_turn(b, item, inbox, details, now_ms)


def _fail_instance(
    b: Batch, item: Loaded, inbox: list[Inbound], exc: Exception, now_ms: int
) -> None:
    """The runtime itself could not go on (non-determinism, unknown workflow, a bug): the
    instance fails with the error and its traceback."""
    meta = item.meta
    log.warning("instance %s failed in the runtime: %s", meta.instance_id, exc)
    if not isinstance(exc, WorkflowRuntimeError | LookupError):
        log.exception("unexpected error while running %s", meta.instance_id)
    fail_turn(b, item, inbox, failure_from_exception(exc, retryable=False), now_ms)


def fail_turn(
    b: Batch,
    item: Loaded,
    inbox: list[Inbound],
    details: FailureDetails,
    now_ms: int,
    *,
    shrink: bool = False,
) -> None:
    """End the instance FAILED in place of its turn, with ``details`` as the reason.

    A turn that starts a generation records its start first (the input summarised when it
    is over its limit), so the history stays a valid one: start, then end. ``shrink``
    (after a refused record) summarises every value but tiny ones, so the failure itself
    is small enough to be accepted.
    """
    meta = item.meta
    if meta.status is None:  # never started: its kept events go to dead letters
        log.warning(
            "%s: a turn failed before the instance started (%s: %s); its %d kept events go "
            "to dead letters",
            meta.instance_id,
            details.type,
            details.message,
            len(meta.pending_events),
        )
        pending.give_up(b, meta, f"a turn failed before it started ({details.type})")
        b.save(meta)
        return
    limits = TINY if shrink else b.env.limits
    details = shorten_failure(details) or details
    record_events(b, item, _failed_events(item, inbox, details, limits.workflow_input, now_ms))
    if item.execution is not None:
        item.execution.close()
    item.execution = None
    meta.status = RuntimeStatus.FAILED
    meta.failure = details
    meta.output = None
    meta.input = fitting(meta.input, limits.workflow_input)
    meta.custom_status = fitting(meta.custom_status, limits.custom_status)
    meta.last_updated_ms = now_ms
    notify_parent(b, meta.instance_id, item, RuntimeStatus.FAILED, None, details)
    _close_children(b, item, now_ms)
    if meta.backlog:
        backlog.give_up(b, meta, "its run failed before reading it")
    b.save(meta)
    b.counters.completed += 1
    log_failed(meta)


def _close_children(b: Batch, item: Loaded, now_ms: int) -> None:
    """The processor failed the instance in place of its turn: the current generation's
    running children get their parent-close policies from its running-children rows, as
    the runtime's own end would give them."""
    meta = item.meta
    kids = [
        (c.instance_id, c.parent_close_policy)
        for c in children.running(b.tables, meta)
        if c.generation == meta.generation
    ]
    reason = f"parent {meta.instance_id} ended FAILED"
    for action in act.close_children(kids, reason, meta.generation):
        ACTION_HANDLERS[type(action)](b, item, action, now_ms)


def _failed_events(
    item: Loaded, inbox: list[Inbound], details: FailureDetails, input_limit: int, now_ms: int
) -> list[HistoryEvent]:
    meta = item.meta
    bodies: list[EventBody] = []
    started = next((i.body for i in inbox if isinstance(i.body, ExecutionStarted)), None)
    if started is None and item.continuing is not None:
        # the turn was to begin the generation a continue-as-new asked for: it begins it
        started, meta.generation = item.continuing.started, item.continuing.generation
    if isinstance(started, ExecutionStarted):
        started = replace(started, input=fitting(started.input, input_limit))
        bodies += [TurnStarted(now_ms), started]
        meta.input = started.input
    bodies.append(ExecutionCompleted(RuntimeStatus.FAILED, None, details))
    return [
        HistoryEvent(meta.instance_id, meta.next_sequence + i, now_ms, meta.generation, body)
        for i, body in enumerate(bodies)
    ]


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
        task_queue=a.task_queue,
        schedule_to_start_ms=a.schedule_to_start_ms,
        deadline_ms=a.deadline_ms,
        heartbeat_timeout_ms=a.heartbeat_timeout_ms,
        heartbeat_details=a.heartbeat_details,
        run_id=item.meta.run_id,
    )
    b.send(b.env.topics.task_queue(a.task_queue), task)


def _cancel_activity(b: Batch, item: Loaded, a: act.CancelActivity, now_ms: int) -> None:
    """The workflow stopped waiting for a running attempt (``ActivityCancelRequested`` is
    already in the turn's history, and the attempt's late result will be rejected as
    stale). The worker is told by :func:`cancels.after_turn`, from the ``AbandonAttempt``
    the runtime reports with it, like every other abandoned attempt; this handler says so
    in the log."""
    log.info(
        "%s: activity %s (task %d, attempt %d, idempotency key %s) cancelled: its worker "
        "is told, a late result will be dropped",
        item.meta.instance_id,
        a.name,
        a.task_id,
        a.attempt,
        a.idempotency_key,
    )


def _abandon_attempt(b: Batch, item: Loaded, a: act.AbandonAttempt, now_ms: int) -> None:
    """The workflow stopped waiting for a running attempt: :func:`cancels.after_turn`
    tells its worker, after every other record of the turn (it knows the turn's inbox, and
    an attempt whose own result is in it needs no cancel)."""


def _start_child(b: Batch, item: Loaded, a: act.StartChild, now_ms: int) -> None:
    start_child(b, item, a, IdReusePolicy.ERROR_IF_RUNNING)


def start_child(b: Batch, item: Loaded, a: act.StartChild, reuse_policy: IdReusePolicy) -> None:
    """Note the child as running and send its start (request id: the parent's call, with
    its run id, so a redone turn's start is answered as a duplicate and a later run of the
    parent's id is not); a reset starts a child the new run waits for again with
    ``TERMINATE_IF_RUNNING``, replacing the old run's."""
    meta = item.meta
    parent = meta.instance_id
    child = RunningChild(a.instance_id, a.generation, a.parent_close_policy)
    children.note_started(b.tables, meta, child)
    start = StartWorkflow(
        instance_id=a.instance_id,
        name=a.name,
        input=a.input,
        version=a.version,
        reuse_policy=reuse_policy,
        request_id=runs.child_request_id(parent, meta.run_id, a.generation, a.task_id),
        parent_instance_id=parent,
        parent_generation=a.generation,
        parent_task_id=a.task_id,
        parent_run_id=meta.run_id,
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
    notify_parent(b, item.meta.instance_id, item, a.status, a.output, a.failure)


def notify_parent(
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
        run_id=meta.parent_run_id,
    )
    b.send(b.env.topics.instance_messages, result)


def _terminate_children(b: Batch, item: Loaded, a: act.TerminateChildren, now_ms: int) -> None:
    ids = list(a.instance_ids)
    if a.every_generation:  # also the children that earlier generations left running
        named = set(a.instance_ids)
        running = children.running(b.tables, item.meta)
        ids += [c.instance_id for c in running if c.instance_id not in named]
    for child in ids:
        message = TerminateWorkflow(instance_id=child, reason=a.reason, recursive=a.recursive)
        b.send(b.env.topics.instance_messages, message)


def _cancel_children(b: Batch, item: Loaded, a: act.CancelChildren, now_ms: int) -> None:
    for child in a.instance_ids:
        b.send(b.env.topics.instance_messages, CancelWorkflow(instance_id=child, reason=a.reason))


def _continue_as_new(b: Batch, item: Loaded, a: act.ContinueAsNew, now_ms: int) -> None:
    """The generation ended; the next one begins in the instance's next turn, which the
    wake-up timer brings. Unread events beyond what it is given at its start wait in the
    backlog (``backlog``)."""
    if a.overflow:
        backlog.carry(b, item, a.overflow, now_ms)
    backlog.wake(b, item.meta.instance_id, a.generation, now_ms)


def _nothing_to_send(b: Batch, item: Loaded, a: Any, now_ms: int) -> None:
    """Recorded in history and in the row already; nothing leaves the partition."""


ActionHandler = Callable[[Batch, Loaded, Any, int], None]

ACTION_HANDLERS: dict[type, ActionHandler] = {
    act.ScheduleActivity: _schedule_activity,
    act.StartChild: _start_child,
    act.CreateTimer: _create_timer,
    act.CancelTimer: _cancel_timer,
    act.SendEvent: _send_event,
    act.CompleteExecution: _complete,
    act.ContinueAsNew: _continue_as_new,
    act.TerminateChildren: _terminate_children,
    act.CancelChildren: _cancel_children,
    act.CancelActivity: _cancel_activity,
    act.AbandonAttempt: _abandon_attempt,
    act.RunInlineStep: _nothing_to_send,
    act.SetCustomStatus: _nothing_to_send,
    act.PublishRecord: publish_record,
}
