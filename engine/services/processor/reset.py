"""Reset and rerun: a new run of an instance from its current run's history up to a point.

Where the history is cut and what the new run starts from is ``engine.runtime.reset``'s
(pure). Here the processor makes the new run. A reset is a new *generation* of the same
instance, like a continue-as-new: its history (on the history topic, after the old run's
events) begins with copies of the kept events, restamped with the new generation and the
next sequence numbers and chained on; then a turn whose first event is
``ExecutionReset(from_sequence, reason, request_id)`` and whose code runs live. The copied
turns are replayed, never re-run, so their results are reused; what the kept run still
waited for at the cut (an activity attempt, a timer, a child) is asked for again, for the
new generation (:meth:`WorkflowExecution.open_work`).

The old run is over: its timer rows are deleted, its running activity attempts are
cancelled on their workers, its running children get their parent-close policies (a
child the new run waits for is started again, ``TERMINATE_IF_RUNNING``). Anything of the
old generation that still arrives - an activity result, a child's result, a timer fire -
fails the generation check and is dropped. Nothing the old run sent after the point is
sent again.

A rerun (``ResetWorkflow.new_instance_id``) leaves the source as it is: the source's
partition checks the point and sends the run's events in one :class:`RerunFrom` message
to the new id's partition (instance-messages), which makes the new run there and answers
the client's request (the source answers only a refusal). The new instance has no parent.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from engine.codec import decode_history
from engine.core import errors
from engine.core.concurrency import SLOTS_PREFIX
from engine.core.errors import (
    InvalidResetPointError,
    NonDeterminismError,
    NotRegisteredError,
    TurnstileError,
)
from engine.core.failure import FailureDetails
from engine.core.history import (
    EventRaised,
    ExecutionReset,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
)
from engine.core.messages import (
    CommandResult,
    IdReusePolicy,
    RerunFrom,
    ResetWorkflow,
)
from engine.runtime import actions as act
from engine.runtime.executor import WorkflowExecution
from engine.runtime.reset import ResetPlan, marked, plan_reset, resolve_point
from engine.services.processor import (
    cancels,
    children,
    heartbeat_rows,
    keys,
    parking,
    pending,
    requeued,
    runs,
    slots,
    timeouts,
)
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import (
    Verdict,
    accepted,
    answered,
    buffered,
    find,
    refused,
    remember,
    remembered,
    send_outcome,
    settle,
)
from engine.services.processor.outcome import (
    ACTION_HANDLERS,
    record_events,
    start_child,
    step_instance,
)
from engine.services.processor.state import Loaded

log = logging.getLogger("engine.processor")

__all__ = ["on_rerun_from", "on_reset_command", "run_granted"]


# --- the command ------------------------------------------------------------------------------


def on_reset_command(b: Batch, msg: ResetWorkflow, now_ms: int) -> None:
    """A reset is answered here; a rerun only when refused (the new id answers it)."""
    if not msg.new_instance_id:
        _answered_reset(b, msg, now_ms)
        return
    verdict = _forward_rerun(b, msg, now_ms)
    if verdict is not None:
        settle(b, msg, verdict, now_ms)


def _reset(b: Batch, msg: ResetWorkflow, now_ms: int) -> Verdict:
    item = b.load(msg.instance_id)
    events = _current_run(b, item)
    if isinstance(events, Verdict):
        return events
    return _reset_from(b, item, msg, events, now_ms, granted=False)


def _reset_from(
    b: Batch,
    item: Loaded,
    msg: ResetWorkflow,
    events: list[HistoryEvent],
    now_ms: int,
    *,
    granted: bool,
) -> Verdict:
    """Reset the run of ``events``; an ended run under a per-key concurrency limit first
    waits for a slot of its key, as a start does (``granted``: it has one now)."""
    try:
        plan = plan_reset(events, resolve_point(events, msg.target, msg.sequence))
    except InvalidResetPointError as exc:
        return refused(type(exc), str(exc))
    meta = item.meta
    ended = meta.status is not None and meta.status.is_terminal
    if ended and not granted:  # a live run keeps the slot it holds (if any)
        limit = slots.limit_of(b, meta.name, meta.version) if meta.concurrency_key else 0
        if limit:
            return _wait(b, item, msg, plan, meta.concurrency_key, limit, now_ms)
    marker = ExecutionReset(plan.point, msg.reason, msg.request_id)
    return new_run(b, item, plan, marker, now_ms, same_instance=True)


_answered_reset = answered(_reset)


def _current_run(b: Batch, item: Loaded) -> list[HistoryEvent] | Verdict:
    """The current run's events, or the refusal of an instance that has none."""
    meta = item.meta
    if meta.status is None or meta.instance_id.startswith(SLOTS_PREFIX):
        return refused(errors.InstanceNotFoundError, f"no instance {meta.instance_id}")
    rows = b.tables.history(meta.instance_id, meta.generation_start)
    if not rows or meta.status is RuntimeStatus.PENDING:
        reason = (
            f"instance {meta.instance_id} is {meta.status.value} and has no history yet "
            f"(it waits for its start); terminate it or wait until it runs"
        )
        return refused(errors.InvalidResetPointError, reason)
    return [decode_history(raw) for raw in rows]


def _forward_rerun(b: Batch, msg: ResetWorkflow, now_ms: int) -> Verdict | None:
    """Check the rerun on the source and send its run to the new id (None: sent)."""
    target = msg.new_instance_id
    if target == msg.instance_id:
        reason = "a rerun needs a new instance id; to start this instance again, reset it"
        return refused(errors.InvalidResetPointError, reason)
    try:
        keys.check_instance_id(target)
    except TurnstileError as exc:
        return refused(errors.InvalidResetPointError, str(exc))
    if target.startswith(SLOTS_PREFIX):
        return refused(
            errors.InvalidResetPointError,
            f"instance ids starting with {SLOTS_PREFIX!r} are reserved",
        )
    item = b.load(msg.instance_id)
    events = _current_run(b, item)
    if isinstance(events, Verdict):
        return events
    try:
        point = resolve_point(events, msg.target, msg.sequence)
    except InvalidResetPointError as exc:
        return refused(type(exc), str(exc))
    rows = b.tables.history(msg.instance_id, item.meta.generation_start)
    size = sum(len(raw) for raw in rows)
    if size > b.env.limits.record // 2:
        reason = (
            f"the current run of {msg.instance_id} is {size} bytes of history, more than "
            f"one record carries to {target!r} (half of max_record_bytes="
            f"{b.env.limits.record})"
        )
        return refused(errors.RerunTooLargeError, reason)
    rerun = RerunFrom(
        target,
        msg.instance_id,
        point,
        msg.reason,
        msg.request_id,
        rows,
        concurrency_key=item.meta.concurrency_key,
    )
    b.send(b.env.topics.instance_messages, rerun)
    return None


# --- the new instance of a rerun ----------------------------------------------------------------


def on_rerun_from(b: Batch, msg: RerunFrom, now_ms: int) -> None:
    """Make the rerun's new run here and answer its request on command-outcomes."""
    item = b.load(msg.instance_id)
    meta = item.meta
    seen = find(meta, msg.request_id, now_ms - b.env.dedup_window_ms) if msg.request_id else None
    if seen is not None:
        verdict = remembered(seen)
        _answer_rerun(b, msg, verdict, now_ms, duplicate=True)
        return
    verdict = _rerun(b, item, msg, now_ms)
    b.counters.outcome(ResetWorkflow.KIND, verdict.result.value.lower())
    if msg.request_id and meta.exists:
        window, age = b.env.dedup_window, b.env.dedup_window_ms
        remember(item.meta, msg.request_id, verdict, now_ms, window, age)
        b.save(item.meta)
    _answer_rerun(b, msg, verdict, now_ms)


def _rerun(b: Batch, item: Loaded, msg: RerunFrom, now_ms: int) -> Verdict:
    meta = item.meta
    if meta.status is not None and not meta.status.is_terminal:
        shown = meta.reported_status or meta.status
        reason = (
            f"instance {meta.instance_id} is {shown.value}: a rerun needs a new id, "
            f"or one whose run has ended"
        )
        return refused(errors.WorkflowAlreadyRunningError, reason)
    return _rerun_from(b, item, msg, now_ms, granted=False)


def _rerun_from(b: Batch, item: Loaded, msg: RerunFrom, now_ms: int, *, granted: bool) -> Verdict:
    """The rerun's new run; under a per-key concurrency limit it first waits for a slot
    of the source run's key, as a start does (``granted``: it has one now)."""
    meta = item.meta
    run_id = runs.new_run_id(b, meta.instance_id)
    events = [
        _standalone(replace(decode_history(raw), instance_id=meta.instance_id), run_id)
        for raw in msg.history
    ]
    try:
        plan = plan_reset(events, msg.from_sequence)
    except InvalidResetPointError as exc:
        return refused(type(exc), str(exc))
    started = _started_of(events)
    key = msg.concurrency_key
    limit = slots.limit_of(b, started.name, started.version) if key and not granted else 0
    if limit:
        meta.name, meta.version, meta.input = started.name, started.version, started.input
        return _wait(b, item, msg, plan, key, limit, now_ms)
    marker = ExecutionReset(plan.point, msg.reason, msg.request_id, msg.source_instance_id)
    verdict = new_run(b, item, plan, marker, now_ms, same_instance=False)
    if verdict.result is not CommandResult.REFUSED:
        item.meta.concurrency_key = key  # a reset of it takes a slot of the same key
    return verdict


def _started_of(events: list[HistoryEvent]) -> ExecutionStarted:
    for event in events:
        if isinstance(event.body, ExecutionStarted):
            return event.body
    raise InvalidResetPointError("the run's history has no start; nothing to run again")


def _standalone(event: HistoryEvent, run_id: str) -> HistoryEvent:
    """A rerun's copy of an event: its start has no parent (the new instance is its own)
    and begins a run of its own (``run_id``)."""
    body = event.body
    if isinstance(body, ExecutionStarted):
        body = replace(
            body,
            parent_instance_id=None,
            parent_generation=None,
            parent_task_id=None,
            parent_run_id="",
            run_id=run_id,
        )
    return replace(event, body=body)


def _answer_rerun(
    b: Batch, msg: RerunFrom, verdict: Verdict, now_ms: int, duplicate: bool = False
) -> None:
    if msg.request_id:
        kind = ResetWorkflow.KIND
        send_outcome(b, msg.instance_id, msg.request_id, kind, verdict, now_ms, duplicate)


# --- making the new run -----------------------------------------------------------------------


def new_run(
    b: Batch,
    item: Loaded,
    plan: ResetPlan,
    marker: ExecutionReset,
    now_ms: int,
    *,
    same_instance: bool,
) -> Verdict:
    """Replace the instance's run by one built from ``plan``: check the kept turns replay
    on the deployed code, end the old run, record the copies and run the first turn."""
    meta = item.meta
    prepared = _prepare(b, item, plan, same_instance=same_instance)
    if isinstance(prepared, Verdict):
        return prepared
    execution, kept, waited = prepared
    generation = execution.generation
    held = parking.kept_events(meta)  # a parked run's events never reached its history
    held += [  # raised while the reset waited for a slot
        Inbound(EventRaised(e.name, e.input)) for e in pending.unexpired(b, meta, now_ms)
    ]
    meta.pending_events = []
    _end_old_run(b, item, now_ms)
    _open(b, item, execution, plan, generation, now_ms)
    record_events(b, item, kept)
    item.inbox = [*(Inbound(body) for body in marked(plan, marker)), *held]
    step_instance(b, item, now_ms)
    _ask_again(b, item, waited, now_ms)
    log.info(
        "%s: new run %d from event %d (%s)", meta.instance_id, generation, plan.point, marker.reason
    )
    return accepted(f"generation {generation} runs from event {plan.point}")


Prepared = tuple[WorkflowExecution, list[HistoryEvent], list[act.Action]]


def _prepare(b: Batch, item: Loaded, plan: ResetPlan, *, same_instance: bool) -> Prepared | Verdict:
    """The new run's execution with the kept turns replayed on the deployed code, the
    kept events renumbered for it, and what those turns waited for; or the refusal."""
    meta = item.meta
    waits = meta.status is RuntimeStatus.PENDING  # it waited for a slot: already counted
    generation = (meta.generation + (0 if waits else 1)) if meta.exists else 0
    kept = [
        replace(event, sequence=meta.next_sequence + i, generation=generation)
        for i, event in enumerate(plan.kept)
    ]
    execution = WorkflowExecution(
        b.env.registry,
        meta.instance_id,
        start_sequence=meta.next_sequence,
        generation=generation,
        max_turn_events=b.env.turn_max_events,
    )
    refusal = _replayed(b, execution, kept)
    if refusal is not None:
        return refusal
    waited = execution.open_work()
    if not same_instance and any(isinstance(a, act.StartChild) for a in waited):
        reason = (
            "a child workflow runs at that point, and its id belongs to the source; rerun to "
            "a point before the child started or after its result arrived"
        )
        return refused(errors.InvalidResetPointError, reason)
    return execution, kept, waited


# --- waiting for a slot of the concurrency key --------------------------------------------------


def _wait(
    b: Batch,
    item: Loaded,
    command: ResetWorkflow | RerunFrom,
    plan: ResetPlan,
    key: str,
    limit: int,
    now_ms: int,
) -> Verdict:
    """The new run waits as PENDING for a slot of ``key`` (checked first: the kept turns
    replay now), as a start over the limit does; the GRANT runs it (:func:`run_granted`)."""
    prepared = _prepare(b, item, plan, same_instance=isinstance(command, ResetWorkflow))
    if isinstance(prepared, Verdict):
        return prepared
    prepared[0].close()
    slots.queue(b, item, command, key, limit, now_ms)
    what = "reset" if isinstance(command, ResetWorkflow) else "rerun"
    return buffered(
        f"the {what} waits as PENDING for a slot: workflow {item.meta.name!r} runs at most "
        f"{limit} instances at once for concurrency key {key!r}; its new run begins when "
        f"one is free"
    )


def run_granted(b: Batch, item: Loaded, command: ResetWorkflow | RerunFrom, now_ms: int) -> None:
    """A reset or rerun that waited for a slot has one: make its run now. If the deployed
    code no longer replays the kept turns, the waiting run ends TERMINATED with the
    reason (its answer was given when it began to wait) and gives the slot back."""
    meta = item.meta
    if isinstance(command, ResetWorkflow):
        rows = b.tables.history(meta.instance_id, meta.generation_start)
        events = [decode_history(raw) for raw in rows]
        verdict = _reset_from(b, item, command, events, now_ms, granted=True)
    else:
        verdict = _rerun_from(b, item, command, now_ms, granted=True)
    if verdict.result is not CommandResult.REFUSED:
        return
    log.warning(
        "%s: the %s that waited for a slot cannot run: %s",
        meta.instance_id,
        command.KIND,
        verdict.reason,
    )
    meta.status = RuntimeStatus.TERMINATED
    meta.failure = FailureDetails(verdict.error, verdict.reason, retryable=False)
    meta.scheduled_start = None
    meta.last_updated_ms = now_ms
    b.save(meta)


def _replayed(b: Batch, execution: WorkflowExecution, kept: list[HistoryEvent]) -> Verdict | None:
    if not kept:
        return None
    try:
        b.env.watchdog.run(
            lambda: execution.replay(kept), f"the replay of {execution.instance_id!r} for a reset"
        )
    except (NonDeterminismError, NotRegisteredError) as exc:
        reason = (
            f"the deployed code does not replay the history kept before that point ({exc}); "
            f"reset to an earlier point (the first turn always replays)"
        )
        return refused(errors.InvalidResetPointError, reason)
    return None


def _end_old_run(b: Batch, item: Loaded, now_ms: int) -> None:
    """The old run stops: no timer of it fires, its attempts are cancelled, its running
    children get their parent-close policies, and its execution leaves memory."""
    meta = item.meta
    for timer in b.tables.timers_of(meta.instance_id):
        b.tables.delete_timer(timer)
    if item.execution is not None:
        cancels.before_turn(b, item, item.execution)
        item.execution.close()
        item.execution = None
    for task_id, (generation, attempt, queue) in (item.open_attempts or {}).items():
        reason = f"instance {meta.instance_id} was reset"
        cancels.send_activity_cancel(
            b, meta.instance_id, generation, task_id, attempt, queue, reason, run_id=meta.run_id
        )
    item.open_attempts = None
    requeued.forget_all(b.tables, meta.instance_id)
    heartbeat_rows.forget_all(b.tables, meta.instance_id)
    item.requeue_checks = set()
    kids = [(c.instance_id, c.parent_close_policy) for c in children.running(b.tables, meta)]
    for action in act.close_children(kids, f"parent {meta.instance_id} was reset", meta.generation):
        ACTION_HANDLERS[type(action)](b, item, action, now_ms)
    children.forget_all(b.tables, meta)
    b.tables.delete_history(meta.instance_id, meta.generation_start, meta.next_sequence)


def _open(
    b: Batch,
    item: Loaded,
    execution: WorkflowExecution,
    plan: ResetPlan,
    generation: int,
    now_ms: int,
) -> None:
    """The row of the new run (its first turn's step then brings it up to date)."""
    meta = item.meta
    started = execution.started
    if started is None:  # begun again from the first turn: its start is in the inbox
        started = next(b for b in plan.inbox if isinstance(b, ExecutionStarted))
    meta.generation = generation
    meta.generation_start, meta.history_bytes = meta.next_sequence, 0
    meta.status = execution.status if execution.started is not None else RuntimeStatus.RUNNING
    meta.name, meta.version, meta.input = started.name, started.version, started.input
    meta.parent_instance_id = started.parent_instance_id
    meta.parent_generation = started.parent_generation
    meta.parent_task_id = started.parent_task_id
    meta.tags, meta.request_id = dict(started.tags), started.request_id
    meta.run_id, meta.parent_run_id = started.run_id, started.parent_run_id
    meta.output = meta.failure = meta.custom_status = None
    meta.parked = meta.scheduled_start = None
    meta.unserved = ""
    meta.created_ms = meta.last_updated_ms = now_ms
    item.execution = execution
    timeouts.arm_reset_run(b, meta, now_ms)
    b.save(meta)


def _ask_again(b: Batch, item: Loaded, waited: list[act.Action], now_ms: int) -> None:
    """Ask again, for the new generation, for what the kept turns waited for and the new
    run's first turn still waits for (a result it reused is not asked for again)."""
    execution = item.execution
    still = waited if execution is None else execution.open_work()
    for action in (a for a in still if a in waited):
        if isinstance(action, act.StartChild):
            _start_child_again(b, item, action)
            continue
        handler = ACTION_HANDLERS.get(type(action))
        if handler is not None:
            handler(b, item, action, now_ms)
    b.save(item.meta)


def _start_child_again(b: Batch, item: Loaded, a: act.StartChild) -> None:
    """A child the new run waits for starts again (its old run is replaced)."""
    start_child(b, item, a, IdReusePolicy.TERMINATE_IF_RUNNING)
