"""Schedules on the processor: the schedule's row, its timer, and the runs it starts.

A schedule is the row of a reserved id (``~schedules/NAME``, see ``engine.core.schedules``)
on the partition that owns it. Its commands (``ScheduleCommand``, on the commands topic,
keyed by that id) and its timer (task id :data:`SCHEDULE_TIMER`, set for the next fire time)
only ever reach that partition, so one replica at a time decides every fire time. A due fire time
becomes a ``StartWorkflow`` on instance-messages, for the run id of the fire time, under
REJECT_DUPLICATE and with the schedule's row as its parent: the fire time's decision, the
timer for the next fire time and the start are in one transaction, and a start that reached
the run's partition twice is refused there, so each fire time starts exactly one run. The
run's end (or its refused start) comes back as a ``ChildResult`` to the row, which is
how the overlap policy knows what still runs.

A schedule notices its runs failing: a run that parks (its code raised a bug, or its
workflow is not registered: a typo in the schedule's workflow name) tells the row with a
PARKED child result, and a run whose start was refused or whose workflow is not
registered (parking off) ends with a failed one; either pauses the schedule, with the
reason as its note (``schedule describe``/``list`` show it), instead of letting the
overlap policy skip every later fire time behind a run that never ends. ``schedule resume``
takes it back.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core import errors
from engine.core.errors import PayloadTooLargeError, ScheduleSpecError
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow
from engine.core.messages import ChildResult, IdReusePolicy, ScheduleCommand, StartWorkflow
from engine.core.schedules import (
    SCHEDULE_PREFIX,
    Decision,
    OverlapPolicy,
    ScheduleOp,
    ScheduleState,
    check_name,
    check_spec,
    decide,
    due_fire_times,
    next_fire_time,
    run_id,
    schedule_name,
)
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, accepted, refused
from engine.services.processor.state import Loaded
from engine.services.time_zones import resolve_zone

#: Timer task id of a schedule's next fire time.
SCHEDULE_TIMER = -3


def is_schedule_id(instance_id: str) -> bool:
    return instance_id.startswith(SCHEDULE_PREFIX)


def on_schedule_command(b: Batch, msg: ScheduleCommand, now_ms: int) -> Verdict:
    """Create, pause, resume, delete or trigger the schedule the command is keyed by."""
    if not is_schedule_id(msg.instance_id):
        reason = (
            f"schedule commands are keyed by the schedule's row id ({SCHEDULE_PREFIX}NAME), "
            f"not {msg.instance_id!r}"
        )
        return refused(errors.ScheduleDefinitionError, reason)
    item = b.load(msg.instance_id)
    if msg.op is ScheduleOp.CREATE:
        return _create(b, item, msg, now_ms)
    state = item.meta.schedule
    if state is None:
        name = schedule_name(msg.instance_id)
        return refused(errors.ScheduleNotFoundError, f"there is no schedule {name!r}")
    return _OPS[msg.op](b, item, state, msg, now_ms)


def _create(b: Batch, item: Loaded, msg: ScheduleCommand, now_ms: int) -> Verdict:
    meta = item.meta
    name = schedule_name(meta.instance_id)
    if meta.schedule is not None:
        return refused(errors.ScheduleAlreadyExistsError, f"schedule {name!r} exists already")
    try:
        check_name(name)
        if msg.spec is None:
            raise ScheduleSpecError("a CREATE needs the schedule's spec")
        spec = check_spec(msg.spec)
        zone = resolve_zone(spec.timezone)
        b.env.limits.check("workflow_input", f"the input of schedule {name!r}", spec.input)
    except (ScheduleSpecError, PayloadTooLargeError) as exc:
        return refused(errors.ScheduleDefinitionError, str(exc))
    state = ScheduleState(spec=spec, created_ms=now_ms)
    meta.schedule = state
    meta.last_updated_ms = now_ms
    _arm(b, meta.instance_id, state, next_fire_time(spec, now_ms - 1, zone))
    b.save(meta)
    return accepted(_next_text(state))


def _pause(b: Batch, item: Loaded, state: ScheduleState, msg: ScheduleCommand, now: int) -> Verdict:
    if state.paused:
        return accepted("the schedule was paused already")
    _disarm(b, item.meta.instance_id, state)
    state.paused, state.note = True, msg.reason
    _touch(b, item, now)
    return accepted("paused: no fire time starts a run until it is resumed")


def _resume(
    b: Batch, item: Loaded, state: ScheduleState, msg: ScheduleCommand, now: int
) -> Verdict:
    if not state.paused:
        return accepted("the schedule was not paused")
    try:
        zone = resolve_zone(state.spec.timezone)
    except ScheduleSpecError as exc:
        return refused(errors.ScheduleDefinitionError, f"cannot resume: {exc}")
    state.paused, state.note = False, ""
    _arm(b, item.meta.instance_id, state, next_fire_time(state.spec, now - 1, zone))
    started = _start_buffered(b, item, state)
    _touch(b, item, now)
    running = f"; {len(state.running)} run(s) it started still run" if state.running else ""
    return accepted(
        f"resumed (the fire times while it was paused are not run){started}{running}; "
        f"{_next_text(state)}"
    )


def _delete(
    b: Batch, item: Loaded, state: ScheduleState, msg: ScheduleCommand, now: int
) -> Verdict:
    meta = item.meta
    _disarm(b, meta.instance_id, state)
    running = len(state.running)
    b.remove(meta)
    item.meta = InstanceRow(meta.instance_id)
    return accepted(f"deleted; {running} run(s) it started still run on their own")


def _trigger(
    b: Batch, item: Loaded, state: ScheduleState, msg: ScheduleCommand, now: int
) -> Verdict:
    run = run_id(_name(item), now, triggered=True)
    if run in state.running or run == state.last_run_id:
        # a trigger of the same millisecond (the same batch): its run id is taken, and a
        # second start of it would only be refused as a duplicate
        return accepted(f"already started {run} by another trigger at the same time")
    decision = _fire(b, item, state, now, triggered=True)
    _touch(b, item, now)
    if decision is Decision.START:
        return accepted(f"started {state.last_run_id}")
    if decision is Decision.BUFFER:
        return accepted("buffered: it starts when the running run ends (BUFFER_ONE)")
    return accepted(f"skipped: a run still runs ({state.spec.overlap.value})")


_Op = Callable[[Batch, Loaded, ScheduleState, ScheduleCommand, int], Verdict]
_OPS: dict[ScheduleOp, _Op] = {
    ScheduleOp.PAUSE: _pause,
    ScheduleOp.RESUME: _resume,
    ScheduleOp.DELETE: _delete,
    ScheduleOp.TRIGGER: _trigger,
}


# --- fire times ----------------------------------------------------------------------------------


def fire(b: Batch, item: Loaded, timer: keys.TimerKey, now_ms: int) -> None:
    """The schedule's timer: handle every due fire time (the catch-up window decides which
    missed ones still run), then set the timer for the next fire time."""
    state = item.meta.schedule
    if state is None or state.paused or timer.fire_at_ms != state.next_fire_ms:
        b.counters.reject("ScheduleTimer")  # deleted, paused or re-armed since: stale
        return
    try:
        zone = resolve_zone(state.spec.timezone)
    except ScheduleSpecError as exc:  # a replica whose tz database lacks the zone
        _disarm(b, item.meta.instance_id, state)
        state.paused, state.note = True, f"paused by the engine: {exc}; then resume it"
        _touch(b, item, now_ms)
        return
    due = due_fire_times(state.spec, state.next_fire_ms, now_ms, zone)
    state.skipped_missed += due.missed
    for fire in due.times:
        _fire(b, item, state, fire, triggered=False)
    _arm(b, item.meta.instance_id, state, due.next_ms)
    _touch(b, item, now_ms)


def _fire(
    b: Batch, item: Loaded, state: ScheduleState, fire_ms: int, *, triggered: bool
) -> Decision:
    decision = decide(state)
    if not triggered:
        state.last_fire_ms = fire_ms
    if decision is Decision.START:
        _start_run(b, item, state, run_id(_name(item), fire_ms, triggered=triggered))
    elif decision is Decision.BUFFER:
        state.buffered_ms = fire_ms
    else:
        state.skipped_overlap += 1
    return decision


def _start_run(b: Batch, item: Loaded, state: ScheduleState, run: str) -> None:
    row_id = item.meta.instance_id
    spec = state.spec
    start = StartWorkflow(
        instance_id=run,
        name=spec.workflow,
        input=spec.input,
        version=spec.version,
        reuse_policy=IdReusePolicy.REJECT_DUPLICATE,
        request_id=f"{row_id}/{run}",
        tags={"schedule": _name(item)},
        parent_instance_id=row_id,
        parent_generation=0,
        parent_task_id=state.started,
    )
    b.send(b.env.topics.instance_messages, start)
    state.running.append(run)
    state.started += 1
    state.last_run_id = run


def on_run_ended(b: Batch, msg: ChildResult, now_ms: int) -> None:
    """A run the schedule started ended (or its start was refused): it no longer runs;
    a fire time buffered behind it (BUFFER_ONE) starts now. A run that parked still runs, but
    the schedule pauses, and so it does when a start was refused or found no workflow."""
    item = b.load(msg.instance_id)
    state = item.meta.schedule
    if state is None or msg.child_instance_id not in state.running:
        b.counters.reject(msg.KIND)  # the schedule was deleted meanwhile
        return
    why = _why_pause(item, msg)
    if why:
        _pause_itself(b, item, state, why)
    if msg.status is not RuntimeStatus.PARKED:
        state.running.remove(msg.child_instance_id)
        _start_buffered(b, item, state)
    _touch(b, item, now_ms)


#: Failure types of a run that never ran its code: its start was refused (the failed
#: child result of a refused start), or its workflow is not registered (parking off).
_NOT_STARTED_FAILURES = frozenset({"InstanceAlreadyExistsError", "NotRegisteredError"})


def _why_pause(item: Loaded, msg: ChildResult) -> str:
    """Why the run's result pauses the schedule ("": it does not)."""
    run, name = msg.child_instance_id, _name(item)
    failure = msg.failure
    error = f"{failure.type}: {failure.message}" if failure is not None else "no details"
    after = f"then 'turnstile schedule resume {name}'"
    if msg.status is RuntimeStatus.PARKED:
        return (
            f"paused by the engine: run {run} is PARKED, its workflow code raised {error}; "
            f"deploy a fix and 'turnstile retry {run}' (or terminate it; a wrong workflow "
            f"name needs the schedule created again), {after}"
        )
    if msg.status is RuntimeStatus.FAILED and failure and failure.type in _NOT_STARTED_FAILURES:
        return f"paused by the engine: run {run} did not start ({error}); fix the cause, {after}"
    return ""


def _pause_itself(b: Batch, item: Loaded, state: ScheduleState, why: str) -> None:
    """Pause the schedule for ``why`` (its note); one paused already keeps its note."""
    if state.paused:
        return
    _disarm(b, item.meta.instance_id, state)
    state.paused, state.note = True, why


def _start_buffered(b: Batch, item: Loaded, state: ScheduleState) -> str:
    """Start the fire time buffered behind the runs that ran (BUFFER_ONE) once none runs and
    the schedule is not paused; says what it started ("": nothing)."""
    buffered = state.buffered_ms
    if not buffered or state.running or state.paused:
        return ""
    if state.spec.overlap is not OverlapPolicy.BUFFER_ONE:
        return ""
    state.buffered_ms = 0
    run = run_id(_name(item), buffered)
    _start_run(b, item, state, run)
    return f"; the buffered fire time starts {run}"


# --- helpers --------------------------------------------------------------------------------


def _arm(b: Batch, row_id: str, state: ScheduleState, fire_ms: int) -> None:
    state.next_fire_ms = fire_ms
    if fire_ms:
        b.tables.put_timer(keys.TimerKey(fire_ms, row_id, 0, SCHEDULE_TIMER))


def _disarm(b: Batch, row_id: str, state: ScheduleState) -> None:
    if state.next_fire_ms:
        b.tables.delete_timer(keys.TimerKey(state.next_fire_ms, row_id, 0, SCHEDULE_TIMER))
    state.next_fire_ms = 0


def _touch(b: Batch, item: Loaded, now_ms: int) -> None:
    item.meta.last_updated_ms = now_ms
    b.save(item.meta)


def _name(item: Loaded) -> str:
    return schedule_name(item.meta.instance_id)


def _next_text(state: ScheduleState) -> str:
    if not state.next_fire_ms:
        return "no fire time is left before its end"
    return f"next fire time at {state.next_fire_ms} (epoch ms)"
