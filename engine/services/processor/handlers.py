"""Inbound handlers, one small function per record type, each writing into the batch.

Most handlers only queue an event on the instance's inbox; the workflow code runs when the
batch ends. Starting and purging change the instance's row itself, so they are handled here.
Each command handler returns its :class:`Verdict` (accepted, buffered, or refused with the
error the client raises); ``command_outcomes.answered`` de-duplicates it by request id and
answers it. A new inbound record kind is one function here and one entry in
:data:`MESSAGE_HANDLERS` (and, if it arrives on a new topic, one entry in
``inputs.accepted_kinds``).
"""

from __future__ import annotations

import logging
from typing import Any

from engine.core import errors
from engine.core.concurrency import SLOTS_PREFIX
from engine.core.errors import PayloadTooLargeError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowFailed,
    EventRaised,
    ExecutionCancelRequested,
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
from engine.core.instance_row import InstanceRow, PendingEvent
from engine.core.messages import (
    ActivityResult,
    CancelWorkflow,
    ChildResult,
    ConcurrencySlot,
    IdReusePolicy,
    Message,
    PurgeWorkflow,
    QueryWorkflow,
    RaiseEvent,
    RerunFrom,
    ResetWorkflow,
    ResumeWorkflow,
    ScheduleCommand,
    SignalWithStart,
    SlotOp,
    StartWorkflow,
    SuspendWorkflow,
    TerminateWorkflow,
    UpdateWithStart,
    UpdateWorkflow,
)
from engine.core.payloads import Payload
from engine.core.schedules import SCHEDULE_PREFIX
from engine.core.tags import checked_tags
from engine.runtime.executor import WorkflowExecution
from engine.services.processor import (
    backlog,
    cancels,
    children,
    heartbeat_rows,
    heartbeats,
    keys,
    parking,
    pending,
    queries,
    requeued,
    reset,
    retention,
    runs,
    schedules,
    slots,
    spans,
    timeouts,
    updates,
)
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import (
    MessageHandler,
    Verdict,
    accepted,
    answered,
    buffered,
    refused,
)
from engine.services.processor.outcome import step_instance
from engine.services.processor.payload_purge import delete_payloads
from engine.services.processor.state import Loaded

log = logging.getLogger("engine.processor")

#: Timer task id reserved for a start that waits for its scheduled time.
START_TIMER = -1

_RESERVED_FOR_SCHEDULES = (
    f"instance ids starting with {SCHEDULE_PREFIX!r} are the rows of schedules; choose "
    f"another id (manage schedules with 'turnstile schedule ...')"
)


# --- start ---------------------------------------------------------------------------------


def on_start(b: Batch, msg: StartWorkflow, now_ms: int) -> Verdict:
    keys.check_instance_id(msg.instance_id)
    checked_tags(msg.tags)  # a plain producer's bad tags: refused, and in dead letters
    item = b.load(msg.instance_id)
    meta = item.meta
    if meta.exists and msg.request_id and msg.request_id == meta.request_id:
        return accepted("already started by this request")  # a row from before the window
    limit_refusal = _limit_refusal(b, msg)
    if limit_refusal is not None:
        return limit_refusal
    if meta.exists and item.inbox:
        # events this batch queued before the start (a termination, say) apply first, so
        # the ID-reuse policy judges the instance as the records before it left it
        step_instance(b, item, now_ms)
    if meta.exists:
        refusal = _reuse_refusal(b, item, msg, now_ms)
        if refusal is not None:
            return refusal
    if msg.scheduled_start_ms is not None and msg.scheduled_start_ms > now_ms:
        _schedule_start(b, item, msg, now_ms)
        return accepted(f"scheduled to start at {msg.scheduled_start_ms} (epoch ms)")
    return start_now(b, item, msg, now_ms)


def start_now(b: Batch, item: Loaded, msg: StartWorkflow, now_ms: int) -> Verdict:
    """Begin the run, or, under a per-key concurrency limit, queue it for a slot."""
    limit = slots.limit_of(b, msg.name, msg.version) if msg.concurrency_key else 0
    if limit == 0:
        begin(b, item, msg, now_ms)
        return accepted()
    slots.wait_for_slot(b, item, msg, limit, now_ms)
    return buffered(
        f"the start waits as PENDING for a slot: workflow {msg.name!r} runs at most {limit} "
        f"instances at once for concurrency key {msg.concurrency_key!r}"
    )


def _limit_refusal(b: Batch, msg: StartWorkflow) -> Verdict | None:
    """A start the per-key concurrency limits cannot take: a key for a workflow without a
    limit (it would silently run unlimited), or an id reserved for the limits' rows."""
    if msg.instance_id.startswith(SLOTS_PREFIX):
        reason = f"instance ids starting with {SLOTS_PREFIX!r} are reserved; choose another id"
        return _refuse(b, msg, errors.NoConcurrencyLimitError, reason)
    if msg.instance_id.startswith(SCHEDULE_PREFIX):
        return _refuse(b, msg, errors.ScheduleDefinitionError, _RESERVED_FOR_SCHEDULES)
    if msg.concurrency_key and slots.limit_of(b, msg.name, msg.version) == 0:
        reason = (
            f"the start names concurrency_key {msg.concurrency_key!r} but workflow "
            f"{msg.name!r} declares no limit: declare @workflow(max_concurrency_per_key=K) "
            f"on the processors' code, or start it without a concurrency_key"
        )
        return _refuse(b, msg, errors.NoConcurrencyLimitError, reason)
    return None


def _reuse_refusal(b: Batch, item: Loaded, msg: StartWorkflow, now_ms: int) -> Verdict | None:
    """What the ID-reuse policy says to a start of an existing id (None: start a new run)."""
    meta = item.meta
    assert meta.status is not None
    policy = msg.reuse_policy
    if meta.status.is_terminal:
        if policy is IdReusePolicy.REJECT_DUPLICATE:
            reason = f"instance {msg.instance_id} already ran (REJECT_DUPLICATE)"
            return _refuse(b, msg, errors.WorkflowAlreadyRanError, reason)
        return None
    shown = meta.reported_status or meta.status
    if policy is IdReusePolicy.IGNORE_IF_RUNNING:
        return accepted(f"instance is {shown.value}; start ignored (IGNORE_IF_RUNNING)")
    if policy is IdReusePolicy.TERMINATE_IF_RUNNING:
        if meta.status is RuntimeStatus.PENDING:
            _cancel_scheduled_start(b, meta)
            slots.give_back(b, meta)  # its place in a slot queue, if it waited for one
            return None
        item.inbox.append(Inbound(ExecutionTerminated("restarted by a new start")))
        step_instance(b, item, now_ms)
        return None
    reason = f"instance {msg.instance_id} is {shown.value} (ERROR_IF_RUNNING)"
    return _refuse(b, msg, errors.WorkflowAlreadyRunningError, reason)


def _refuse(
    b: Batch, msg: StartWorkflow, error: type[errors.CommandRefusedError], reason: str
) -> Verdict:
    """A start the ID-reuse policy refused; a parent learns it as a failed child."""
    log.warning("start refused: %s", reason)
    if msg.parent_instance_id is not None:
        failure = FailureDetails("InstanceAlreadyExistsError", reason, retryable=False)
        b.send(
            b.env.topics.instance_messages,
            ChildResult(
                instance_id=msg.parent_instance_id,
                generation=msg.parent_generation or 0,
                task_id=msg.parent_task_id or 0,
                child_instance_id=msg.instance_id,
                status=RuntimeStatus.FAILED,
                failure=failure,
                run_id=msg.parent_run_id,
            ),
        )
    return refused(error, reason)


def _schedule_start(b: Batch, item: Loaded, msg: StartWorkflow, now_ms: int) -> None:
    meta = item.meta
    if meta.exists:
        meta.generation += 1
    meta.status = RuntimeStatus.PENDING
    meta.name, meta.input = msg.name, msg.input
    meta.version = b.env.registry.start_version(msg.name, msg.version)  # re-resolved at start
    meta.request_id = msg.request_id
    meta.created_ms = meta.last_updated_ms = now_ms
    meta.scheduled_start = msg
    meta.run_id = runs.new_run_id(b, meta.instance_id)  # the timer that begins it has none
    assert msg.scheduled_start_ms is not None
    b.tables.put_timer(
        keys.TimerKey(msg.scheduled_start_ms, msg.instance_id, meta.generation, START_TIMER)
    )
    b.save(meta)


def _cancel_scheduled_start(b: Batch, meta: InstanceRow) -> None:
    start = meta.scheduled_start
    if isinstance(start, StartWorkflow) and start.scheduled_start_ms is not None:
        key = keys.TimerKey(start.scheduled_start_ms, meta.instance_id, meta.generation, -1)
        b.tables.delete_timer(key)
    meta.scheduled_start = None


def begin(b: Batch, item: Loaded, msg: StartWorkflow, now_ms: int) -> None:
    """Start a new run: a fresh execution, fed the start and any events that waited for it."""
    meta = item.meta
    slots.give_back(b, meta)  # the run it replaces held a slot (TERMINATE_IF_RUNNING)
    if meta.exists:
        meta.generation += 0 if meta.status is RuntimeStatus.PENDING else 1
        _drop_history(b, meta)
    meta.status = RuntimeStatus.RUNNING
    meta.name, meta.version, meta.input = msg.name, msg.version, msg.input
    meta.output = meta.failure = meta.custom_status = None
    meta.created_ms = meta.last_updated_ms = now_ms
    meta.parent_instance_id = msg.parent_instance_id
    meta.parent_generation = msg.parent_generation
    meta.parent_task_id = msg.parent_task_id
    meta.run_id, meta.parent_run_id = runs.run_id_at_begin(b, meta), msg.parent_run_id
    meta.tags, meta.request_id = dict(msg.tags), msg.request_id
    meta.scheduled_start = None
    meta.concurrency_key = msg.concurrency_key
    meta.generation_start, meta.history_bytes = meta.next_sequence, 0
    item.execution = WorkflowExecution(
        b.env.registry,
        meta.instance_id,
        start_sequence=meta.next_sequence,
        generation=meta.generation,
        max_turn_events=b.env.turn_max_events,
    )
    meta.version = b.env.registry.start_version(msg.name, msg.version)
    traceparent = spans.start_traceparent(b, meta.instance_id, meta.generation)
    item.inbox = [Inbound(_started(msg, meta.version, traceparent, meta.run_id))]
    for event in pending.unexpired(b, meta, now_ms):
        item.inbox.append(Inbound(EventRaised(event.name, event.input)))
    meta.pending_events = []
    timeouts.arm_at_begin(b, meta, msg, now_ms)
    b.save(meta)


def _started(msg: StartWorkflow, version: str, traceparent: str, run_id: str) -> ExecutionStarted:
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
        traceparent=traceparent,
        run_id=run_id,
        parent_run_id=msg.parent_run_id,
    )


def _drop_history(b: Batch, meta: InstanceRow) -> None:
    """The previous run's events leave the state table (the history topic keeps them)."""
    b.tables.delete_history(meta.instance_id, meta.generation_start, meta.next_sequence)


# --- events and replies --------------------------------------------------------------------


def on_raise(b: Batch, msg: RaiseEvent, now_ms: int) -> Verdict:
    b.env.limits.check("event", f"the payload of event {msg.name!r}", msg.input)
    if schedules.is_schedule_id(msg.instance_id):
        return refused(errors.ScheduleDefinitionError, _RESERVED_FOR_SCHEDULES)
    item = b.load(msg.instance_id)
    meta = item.meta
    if meta.status in (None, RuntimeStatus.PENDING):
        return pending.keep(b, meta, msg.name, msg.input, now_ms)
    if meta.status.is_terminal:
        return _ended(msg, meta)
    spans.note_link(b, item)
    return _live_event(b, item, msg.name, msg.input, now_ms)


def _live_event(b: Batch, item: Loaded, name: str, data: Payload | None, now_ms: int) -> Verdict:
    """An event for an instance that runs: behind its backlog while it has one (each
    name's events keep their order, parked or not), else kept for a parked one's retry,
    else into its next turn."""
    if parking.keeps_events(item) and not item.meta.backlog:
        return parking.keep_event(b, item, name, data, now_ms)
    return backlog.deliver(b, item, name, data, now_ms)


def _ended(msg: Message, meta: InstanceRow) -> Verdict:
    assert meta.status is not None
    return refused(
        errors.InstanceNotRunningError, f"instance {msg.instance_id} is {meta.status.value}"
    )


def _not_found(msg: Message) -> Verdict:
    return refused(errors.InstanceNotFoundError, f"no instance {msg.instance_id}")


def _reject(b: Batch, msg: Message, reason: str) -> None:
    b.counters.reject(msg.KIND)
    log.info("%s for %s ignored: %s", msg.KIND, msg.instance_id, reason)


def _deliver(b: Batch, msg: Message, inbound: Inbound) -> None:
    item = b.load(msg.instance_id)
    status = item.meta.status
    if status in (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED):
        item.inbox.append(inbound)
        spans.note_link(b, item)
    else:
        _reject(b, msg, f"instance is {status.value if status else 'unknown'}")


def on_activity_result(b: Batch, msg: ActivityResult, now_ms: int) -> None:
    if msg.heartbeat:  # a heartbeat by task token (an attempt that completes later)
        heartbeats.on_heartbeat(b, msg, now_ms)
        return
    if msg.heartbeat_timeout_ms > 0 and msg.output is None and msg.failure is None:
        heartbeats.on_handed_over(b, msg, now_ms)  # its worker let go: timed here now
        return
    if msg.unserved or msg.requeued_to >= 0:  # a note, not an outcome
        if msg.unserved:
            _note_unserved(b, msg)
        if msg.requeued_to >= 0:
            cancels.note_requeued(b, msg)  # where a requeued copy of the task is now
        return
    body: Any
    item = b.load(msg.instance_id)
    if runs.is_other_run(item.meta, msg.run_id):
        _reject(b, msg, f"the result is for run {msg.run_id}, not the current run")
        return
    if item.meta.unserved:
        item.meta.unserved = ""  # some worker serves it after all: the note is over
        b.save(item.meta)
    failure = msg.failure or oversized_result(b, msg)
    if failure is not None:
        details = msg.details if msg.details is not None else heartbeats.last_details(b, msg)
        body = TaskFailed(msg.task_id, failure, msg.attempt, details)
    else:
        body = TaskCompleted(msg.task_id, msg.output, msg.attempt)
    _deliver(b, msg, Inbound(body, msg.generation))


def _note_unserved(b: Batch, msg: ActivityResult) -> None:
    """A worker received the task but does not register the activity (the task went back
    to its queue): show it in the status, so a missing worker is visible, until a result
    arrives. Nothing reaches the workflow code: the attempt is still open."""
    item = b.load(msg.instance_id)
    meta = item.meta
    if meta.status in (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED) and (
        msg.generation == meta.generation
        and meta.unserved != msg.unserved
        and not runs.is_other_run(meta, msg.run_id)
    ):
        meta.unserved = msg.unserved
        b.save(meta)


def oversized_result(b: Batch, msg: ActivityResult) -> FailureDetails | None:
    """A result over the activity result limit fails its attempt (the retry policy decides)."""
    try:
        b.env.limits.check("activity_result", f"the result of task {msg.task_id}", msg.output)
    except PayloadTooLargeError as exc:
        return failure_from_exception(exc, retryable=False)
    return None


def on_child_result(b: Batch, msg: ChildResult, now_ms: int) -> None:
    if schedules.is_schedule_id(msg.instance_id):
        schedules.on_run_ended(b, msg, now_ms)  # a run a schedule started has ended
        return
    if msg.status is RuntimeStatus.PARKED:
        _reject(b, msg, "only a schedule hears that a run it started parked")
        return
    parent = b.load(msg.instance_id).meta
    if runs.is_other_run(parent, msg.run_id):  # a child of a purged run of this id
        _reject(b, msg, f"the result is for run {msg.run_id}, not the current run")
        return
    if children.note_ended(b.tables, parent, msg.child_instance_id):
        b.save(parent)
    body: Any
    if msg.status is RuntimeStatus.COMPLETED:
        body = ChildWorkflowCompleted(msg.task_id, msg.output)
    else:
        failure = msg.failure or FailureDetails(
            "ChildWorkflowFailedError", f"child {msg.child_instance_id} ended {msg.status.value}"
        )
        body = ChildWorkflowFailed(msg.task_id, failure)
    _deliver(b, msg, Inbound(body, msg.generation))


def _not_live(msg: Message, meta: InstanceRow) -> Verdict | None:
    """The refusal of a command that needs an instance that exists and has not ended."""
    if meta.status is None:
        return _not_found(msg)
    if meta.status.is_terminal:
        return _ended(msg, meta)
    return None


def _end_scheduled_start(
    b: Batch,
    meta: InstanceRow,
    status: RuntimeStatus,
    now_ms: int,
    failure: FailureDetails | None = None,
) -> None:
    """End an instance whose start is still scheduled (PENDING): its timer goes, it never
    runs, and it ends ``status`` at once."""
    _cancel_scheduled_start(b, meta)
    meta.status = status
    if failure is not None:
        meta.failure = failure
    meta.last_updated_ms = now_ms
    b.save(meta)


def on_terminate(b: Batch, msg: TerminateWorkflow, now_ms: int) -> Verdict:
    item = b.load(msg.instance_id)
    meta = item.meta
    refusal = _not_live(msg, meta)
    if refusal is not None:
        return refusal
    if meta.status is RuntimeStatus.PENDING:
        _end_scheduled_start(b, meta, RuntimeStatus.TERMINATED, now_ms)
        return accepted("terminated before its scheduled start")
    item.inbox.append(Inbound(ExecutionTerminated(msg.reason, msg.recursive)))
    return accepted()


def on_cancel(b: Batch, msg: CancelWorkflow, now_ms: int) -> None:
    """A client's cancel (it has a request id: answered) or a parent's REQUEST_CANCEL
    policy (none: delivered if the child still runs, else ignored)."""
    if msg.request_id:
        _answered_cancel(b, msg, now_ms)
        return
    _deliver(b, msg, Inbound(ExecutionCancelRequested(msg.reason, every_fiber=True)))


def on_cancel_command(b: Batch, msg: CancelWorkflow, now_ms: int) -> Verdict:
    """The code sees ``CancelledError`` in its next turn (a suspended instance when it is
    resumed); one whose start is still scheduled ends CANCELLED at once."""
    item = b.load(msg.instance_id)
    meta = item.meta
    refusal = _not_live(msg, meta)
    if refusal is not None:
        return refusal
    if meta.status is RuntimeStatus.PENDING:
        failure = FailureDetails("CancelledError", msg.reason or "cancelled", "", False)
        _end_scheduled_start(b, meta, RuntimeStatus.CANCELLED, now_ms, failure)
        return accepted("cancelled before its scheduled start")
    item.inbox.append(Inbound(ExecutionCancelRequested(msg.reason, every_fiber=True)))
    return accepted()


_answered_cancel = answered(on_cancel_command)


def on_suspend(b: Batch, msg: SuspendWorkflow, now_ms: int) -> Verdict:
    item = b.load(msg.instance_id)
    meta = item.meta
    refusal = _not_live(msg, meta)
    if refusal is not None:
        return refusal
    parked = meta.parked
    if parked is not None:
        item.inbox.append(Inbound(ExecutionSuspended(msg.reason)))
        return buffered(
            f"instance {msg.instance_id} is PARKED (its code raised {parked.failure.type}): "
            f"the suspension is kept with its events and applies when a retry runs its code "
            f"on a fix; until then it stays PARKED ('turnstile terminate' ends it now)"
        )
    if meta.status is RuntimeStatus.SUSPENDED:
        return refused(
            errors.InstanceAlreadySuspendedError, f"instance {msg.instance_id} is SUSPENDED"
        )
    if meta.status is RuntimeStatus.PENDING:
        reason = f"instance {msg.instance_id} is PENDING: it waits for its scheduled start"
        return refused(errors.InstanceNotRunningError, reason)
    item.inbox.append(Inbound(ExecutionSuspended(msg.reason)))
    return accepted()


def on_resume(b: Batch, msg: ResumeWorkflow, now_ms: int) -> Verdict:
    item = b.load(msg.instance_id)
    meta = item.meta
    refusal = _not_live(msg, meta)
    if refusal is not None:
        return refusal
    status = meta.status or RuntimeStatus.PENDING
    if status is not RuntimeStatus.SUSPENDED and meta.parked is None:
        reason = f"instance {msg.instance_id} is {status.value}, neither suspended nor parked"
        return refused(errors.InstanceNotSuspendedError, reason)
    item.inbox.append(Inbound(ExecutionResumed(msg.reason)))
    return accepted()


def on_purge(b: Batch, msg: PurgeWorkflow, now_ms: int) -> Verdict:
    item = b.load(msg.instance_id)
    meta = item.meta
    if meta.status is None:
        return _not_found(msg)
    if not meta.status.is_terminal:
        shown = meta.reported_status or meta.status
        reason = (
            f"instance {msg.instance_id} is {shown.value}: only completed, failed or "
            f"terminated instances can be purged"
        )
        return refused(errors.InstanceStillRunningError, reason)
    purge_row(b, item)
    return accepted()


def purge_row(b: Batch, item: Loaded) -> None:
    """Remove an ended instance: its row, history rows, timers, running-children rows
    and status (a purge, or its retention time passed)."""
    meta = item.meta
    delete_payloads(b, meta)
    _drop_history(b, meta)
    for timer in b.tables.timers_of(meta.instance_id):
        b.tables.delete_timer(timer)
    children.forget_all(b.tables, meta)
    requeued.forget_all(b.tables, meta.instance_id)
    heartbeat_rows.forget_all(b.tables, meta.instance_id)
    b.remove(meta)
    item.meta = InstanceRow(meta.instance_id)
    item.execution = None


def on_signal_with_start(b: Batch, msg: SignalWithStart, now_ms: int) -> Verdict:
    """Deliver to a live instance, keep for a PENDING one, else start a run with it; the
    ID-reuse policy judges an existing instance as it would judge a start."""
    keys.check_instance_id(msg.instance_id)
    checked_tags(msg.tags)
    if msg.instance_id.startswith(SLOTS_PREFIX):
        reason = f"instance ids starting with {SLOTS_PREFIX!r} are reserved; choose another id"
        return refused(errors.NoConcurrencyLimitError, reason)
    if schedules.is_schedule_id(msg.instance_id):
        return refused(errors.ScheduleDefinitionError, _RESERVED_FOR_SCHEDULES)
    b.env.limits.check("event", f"the payload of event {msg.event_name!r}", msg.event_input)
    item = b.load(msg.instance_id)
    meta = item.meta
    start = StartWorkflow(
        instance_id=msg.instance_id,
        name=msg.name,
        input=msg.input,
        version=msg.version,
        reuse_policy=msg.reuse_policy,
        request_id=msg.request_id,
        tags=dict(msg.tags),
        execution_timeout_ms=msg.execution_timeout_ms,
        run_timeout_ms=msg.run_timeout_ms,
    )
    if meta.exists and item.inbox:
        step_instance(b, item, now_ms)  # as a start: what the batch queued applies first
    if meta.status is not None and not meta.status.is_terminal and msg.reuse_policy in _SIGNALS:
        return _signal(b, item, msg, now_ms)
    if meta.exists:
        refusal = _reuse_refusal(b, item, start, now_ms)
        if refusal is not None:
            return refusal
    meta.pending_events.append(PendingEvent(msg.event_name, msg.event_input, now_ms))
    begin(b, item, start, now_ms)
    return accepted("started a new run with the event")


def on_update(b: Batch, msg: UpdateWorkflow, now_ms: int) -> None:
    """An update (``processor.updates``). One for a run begun in this batch, or for a
    generation that waits to begin after a continue-as-new (in memory or evicted: the
    instance row shows it RUNNING), joins that turn: the runtime runs a generation's code
    before the first update offered to it, so its handlers are set."""
    updates.on_update(b, msg, now_ms)


def on_update_with_start(b: Batch, msg: UpdateWithStart, now_ms: int) -> None:
    """Begin a run unless the instance lives (judged as a signal-with-start judges it),
    then the update, which the run's first turn precedes."""
    update = UpdateWorkflow(msg.instance_id, msg.update_name, msg.update_input, msg.request_id)
    start = StartWorkflow(
        instance_id=msg.instance_id,
        name=msg.name,
        input=msg.input,
        version=msg.version,
        reuse_policy=msg.reuse_policy,
        request_id=msg.request_id,
        tags=checked_tags(msg.tags),
        execution_timeout_ms=msg.execution_timeout_ms,
        run_timeout_ms=msg.run_timeout_ms,
    )
    keys.check_instance_id(msg.instance_id)
    refusal = _reserved(msg.instance_id)
    item = b.load(msg.instance_id)
    meta = item.meta
    if refusal is None and meta.exists and item.inbox:
        step_instance(b, item, now_ms)  # as a start: what the batch queued applies first
    live = meta.status is not None and not meta.status.is_terminal
    if refusal is None and not (live and msg.reuse_policy in _SIGNALS):
        refusal = _reuse_refusal(b, item, start, now_ms) if meta.exists else None
        if refusal is None:
            begin(b, item, start, now_ms)
    if refusal is not None:
        updates.send_refusal(b, msg.instance_id, msg.request_id, refusal, now_ms)
        return
    on_update(b, update, now_ms)


def _reserved(instance_id: str) -> Verdict | None:
    if instance_id.startswith(SLOTS_PREFIX):
        reason = f"instance ids starting with {SLOTS_PREFIX!r} are reserved; choose another id"
        return refused(errors.NoConcurrencyLimitError, reason)
    if schedules.is_schedule_id(instance_id):
        return refused(errors.ScheduleDefinitionError, _RESERVED_FOR_SCHEDULES)
    return None


#: The policies under which a signal-with-start signals a live or PENDING instance.
_SIGNALS = frozenset({IdReusePolicy.IGNORE_IF_RUNNING, IdReusePolicy.REJECT_DUPLICATE})


def _signal(b: Batch, item: Loaded, msg: SignalWithStart, now_ms: int) -> Verdict:
    """The event of a signal-with-start for an instance that has not ended."""
    meta = item.meta
    if meta.status is RuntimeStatus.PENDING:
        return pending.keep(b, meta, msg.event_name, msg.event_input, now_ms)
    verdict = _live_event(b, item, msg.event_name, msg.event_input, now_ms)
    if verdict.reason:  # queued behind its backlog, or refused
        return verdict
    status = meta.reported_status or meta.status
    assert status is not None
    return accepted(f"instance is {status.value}; the event was delivered")


# --- timers ---------------------------------------------------------------------------------


def fire_timer(b: Batch, timer: keys.TimerKey, now_ms: int) -> None:
    b.tables.delete_timer(timer)
    item = b.load(timer.instance_id)
    meta = item.meta
    if timer.task_id == schedules.SCHEDULE_TIMER:
        schedules.fire(b, item, timer, now_ms)
        return
    if timer.task_id == pending.PENDING_TIMER:
        pending.expire_due(b, item, now_ms)  # the row's kept events, whatever its generation
        return
    if timer.task_id == backlog.WAKE_TIMER:
        backlog.woken(b, item, timer)  # one of an older generation is simply done
        return
    if timer.task_id == heartbeats.HEARTBEAT_TIMER:
        heartbeats.fire(b, item, now_ms)  # its rows say which attempt (and generation)
        return
    if timer.task_id in timeouts.TIMERS:
        timeouts.fire(b, item, timer)  # an execution timeout outlives its generation
        return
    if timer.generation != meta.generation:
        b.counters.reject("TimerFired")
        return  # a timer of an older generation: dropped, never applied
    if timer.task_id == parking.PARK_TIMER:
        parking.retry_due(b, item)
        return
    if timer.task_id == retention.RETENTION_TIMER:
        if meta.status is not None and meta.status.is_terminal:
            purge_row(b, item)
        return
    if timer.task_id == START_TIMER:
        start = meta.scheduled_start
        if meta.status is RuntimeStatus.PENDING and isinstance(start, StartWorkflow):
            start_now(b, item, start, now_ms)
        return
    if meta.status in (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED):
        item.inbox.append(Inbound(TimerFired(timer.task_id, timer.fire_at_ms), timer.generation))


# --- per-key concurrency limits ---------------------------------------------------------------


def on_concurrency_slot(b: Batch, msg: ConcurrencySlot, now_ms: int) -> None:
    """ACQUIRE and RELEASE reach the slots row; a GRANT begins the run it admits."""
    if msg.op is not SlotOp.GRANT:
        slots.on_slots_row(b, msg)
        return
    start = slots.granted_start(b, msg)
    if start is None:
        return
    item = b.load(msg.instance_id)
    if not isinstance(start, StartWorkflow):
        reset.run_granted(b, item, start, now_ms)  # a reset or rerun that waited for it
        return
    held, item.meta.slot = item.meta.slot, ""  # begin gives back a replaced run's slot
    begin(b, item, start, now_ms)
    item.meta.slot = held


MESSAGE_HANDLERS: dict[type[Message], MessageHandler] = {
    StartWorkflow: answered(on_start),
    RaiseEvent: answered(on_raise),
    TerminateWorkflow: answered(on_terminate),
    SuspendWorkflow: answered(on_suspend),
    ResumeWorkflow: answered(on_resume),
    PurgeWorkflow: answered(on_purge),
    SignalWithStart: answered(on_signal_with_start),
    ActivityResult: on_activity_result,
    ChildResult: on_child_result,
    CancelWorkflow: on_cancel,
    ConcurrencySlot: on_concurrency_slot,
    ScheduleCommand: answered(schedules.on_schedule_command),
    ResetWorkflow: reset.on_reset_command,
    RerunFrom: reset.on_rerun_from,
    QueryWorkflow: queries.on_query,
    UpdateWorkflow: on_update,
    UpdateWithStart: on_update_with_start,
}
