"""Parking: an instance whose workflow code has a bug waits for a fix instead of failing.

A bad deploy (a typo that raises ``AttributeError``, a workflow that is no longer
registered, code that no longer replays its history) would otherwise fail every instance
it touches, for good. With ``park_workflow_errors`` on (the default), a turn whose code
raised an *unexpected* exception is not recorded at all: the instance keeps its history,
shows as PARKED (its row's ``status`` stays what the history says; the status record,
command answers and metrics report PARKED, with the error as its failure), the turn's
inbound events are kept in its row (``InstanceRow.parked``), and a timer (task id
:data:`PARK_TIMER`) retries it with backoff (1 s doubling to 5 minutes) with whatever code
is deployed by then, or at once on ``turnstile retry ID`` (a resume). Events that arrive
meanwhile join the kept ones, in order; a termination ends the instance without running
the code that raises (the raised events it kept go to dead letters: they were never
delivered). A run a schedule started tells the schedule it parked, so the schedule pauses.

What a parked instance keeps is bounded (``parked_events_max`` events raised for it,
``parked_events_max_bytes`` of everything it keeps): a raised event past the bound goes to
dead letters with the reason, as a ``RaiseEvent`` record that can be sent again, and the
instance stays parked. Activity and child results, timer fires and commands are always
kept: they answer work the instance had open when it parked (a parked instance starts
none), so they are few, and they count against the byte bound, so events never push the
row over it.

Which errors park is decided in one place, :func:`should_park`: only what new code can
fix. Everything the engine raises on purpose (a :class:`~engine.WorkflowFailure` such as
``ApplicationError``, unreadable input, an engine limit: any other ``TurnstileError``) and
every exception type the workflow declares with ``@workflow(failure_types=...)`` still
fails the instance.

Like the handlers, every function here writes only into the :class:`Batch`.
"""

from __future__ import annotations

import logging

from engine.codec import decode_history, encode_history
from engine.core import errors
from engine.core.errors import NonDeterminismError, NotRegisteredError, TurnstileError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    EventRaised,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionTerminated,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
)
from engine.core.instance_row import InstanceRow, Parked, PendingEvent
from engine.core.messages import ChildResult
from engine.core.payloads import Payload
from engine.core.schedules import SCHEDULE_PREFIX
from engine.runtime.actions import TurnResult
from engine.runtime.executor import WorkflowExecution
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, buffered, refused
from engine.services.processor.pending import dead_letter_event
from engine.services.processor.state import Loaded

__all__ = [
    "PARK_TIMER",
    "code_error",
    "keep_event",
    "keeps_events",
    "kept_events",
    "parks_turn",
    "retry_due",
    "should_park",
    "take_inbox",
]

log = logging.getLogger("engine.processor")

#: The timer task id of a parked instance's next retry (START_TIMER is -1).
PARK_TIMER = -2
FIRST_RETRY_MS = 1000
MAX_RETRY_MS = 5 * 60 * 1000
#: The generation a kept event carries when it named none (Inbound.generation None).
_NO_GENERATION = -1
#: Dead-letter kinds (metrics labels): a raised event past the parked bound, and a kept
#: raised event of a parked instance that was terminated (it was never delivered).
OVER_BOUND = "ParkedEventsFull"
DROPPED = "ParkedEventDropped"

#: Engine errors that new code can fix: the workflow is not registered (yet), or the code
#: no longer replays its history. Every other TurnstileError is deliberate.
_FIXABLE_BY_NEW_CODE: tuple[type[BaseException], ...] = (NotRegisteredError, NonDeterminismError)


def should_park(error: BaseException, declared: tuple[type[BaseException], ...]) -> bool:
    """Whether an error of a turn parks the instance (True) or fails it (False).

    The rule: a type the workflow declares in ``failure_types`` fails; an unregistered
    workflow or a replay divergence parks; any other engine error (``TurnstileError``:
    ``WorkflowFailure``/``ApplicationError``, unreadable input, an engine limit such as the
    step budget) fails; every other exception is a bug in the code, and parks.
    """
    if declared and isinstance(error, declared):
        return False
    if isinstance(error, _FIXABLE_BY_NEW_CODE):
        return True
    return not isinstance(error, TurnstileError)


def code_error(item: Loaded, result: TurnResult) -> BaseException | None:
    """The exception that escaped the workflow code and failed the instance in this turn."""
    execution = item.execution
    if execution is None or not result.new_events or result.status is not RuntimeStatus.FAILED:
        return None
    return execution.code_error


def parks_turn(
    b: Batch, item: Loaded, inbox: list[Inbound], error: BaseException | None, now_ms: int
) -> bool:
    """Park the turn (True: drop its decisions, keep its events) or let it stand (False).

    ``error`` is what the runtime raised or what the code raised (:func:`code_error`);
    None when the turn went well. A turn that terminates the instance always stands.
    """
    if (
        error is None
        or not b.env.park_workflow_errors
        or _terminates(inbox)
        or not should_park(error, _declared(item))
    ):
        _settle(b, item)
        return False
    _park(b, item, inbox, error, now_ms)
    return True


def _declared(item: Loaded) -> tuple[type[BaseException], ...]:
    execution = item.execution
    definition = execution.definition if execution is not None else None
    return definition.failure_types if definition is not None else ()


def _park(b: Batch, item: Loaded, inbox: list[Inbound], error: BaseException, now_ms: int) -> None:
    """Keep the turn's events, drop its decisions, and schedule the next retry."""
    meta = item.meta
    previous = meta.parked
    attempts = 1 if previous is None else previous.attempts + 1
    delay = min(FIRST_RETRY_MS * 2 ** min(attempts - 1, 20), MAX_RETRY_MS)
    failure = failure_from_exception(error)
    meta.parked = Parked(attempts, now_ms + delay, failure, [])
    _keep(b, item, inbox, now_ms)
    b.tables.put_timer(_timer(meta, now_ms + delay))
    item.execution = None  # it ran ahead of history: rebuilt from history on retry
    item.retrying = False
    meta.last_updated_ms = now_ms
    b.save(meta)
    if previous is None:
        _tell_schedule(b, meta, failure)
    log.warning(
        "instance %s (%s) is parked: its workflow code raised %s: %s; retry %d in %.0f s "
        "(deploy a fix, or 'turnstile retry %s' once it is deployed)",
        meta.instance_id,
        meta.name,
        failure.type,
        failure.message,
        attempts,
        delay / 1000,
        meta.instance_id,
    )


def _settle(b: Batch, item: Loaded) -> None:
    """The turn's outcome stands (it ran on, or failed on purpose): no longer parked."""
    item.retrying = False
    meta = item.meta
    parked = meta.parked
    if parked is not None:
        meta.parked = None
        b.save(meta)
        log.info(
            "instance %s runs again after %d parked attempt(s)", meta.instance_id, parked.attempts
        )


def take_inbox(b: Batch, item: Loaded, now_ms: int) -> list[Inbound] | None:
    """The events to run the turn on, or None when a parked instance keeps them.

    A parked instance keeps new events for its retry, unless one asks for a retry now (a
    resume: ``turnstile retry``; the resume itself is not delivered, so a suspension kept
    while parked still applies) or terminates it: its kept events are then dropped (all
    but its start, if the code never got past it; raised events go to dead letters), so it
    ends without running the code.
    """
    inbox, item.inbox = item.inbox, []
    parked = item.meta.parked
    if parked is None or item.retrying:
        return inbox
    if _terminates(inbox):
        kept = _begin_retry(b, item)
        _drop_raised(b, item, kept, now_ms)
        return [*[i for i in kept if isinstance(i.body, ExecutionStarted)], *inbox]
    if any(isinstance(i.body, ExecutionResumed) for i in inbox):
        # the resume asks for the retry; it does not undo a suspension kept while parked
        # (one the instance was in when it parked is undone by the resume it keeps)
        asked = [i for i in inbox if not isinstance(i.body, ExecutionResumed)]
        return [*_begin_retry(b, item), *asked]
    _keep(b, item, inbox, now_ms)
    b.save(item.meta)
    return None


def keeps_events(item: Loaded) -> bool:
    """Whether the instance is parked and what this batch queued for it does not end
    that (a retry or a termination): an event for it is kept for its retry."""
    return (
        item.meta.parked is not None
        and not item.retrying
        and not _terminates(item.inbox)
        and not any(isinstance(i.body, ExecutionResumed) for i in item.inbox)
    )


def keep_event(b: Batch, item: Loaded, name: str, data: Payload | None, now_ms: int) -> Verdict:
    """Keep an event raised for a parked instance (:func:`keeps_events`), or, past the
    bound, refuse it: the record goes to dead letters and the instance stays parked."""
    meta = item.meta
    parked = meta.parked
    assert parked is not None
    _keep(b, item, item.inbox, now_ms)  # what this batch queued before it comes first
    item.inbox = []
    inbound = Inbound(EventRaised(name, data))
    raw = _encode(meta.instance_id, inbound)
    full = _full(b, parked, len(raw))
    b.save(meta)
    if full:
        reason = _over_bound_reason(meta.instance_id, name, parked, full)
        b.dead_letter_current(reason, kind=OVER_BOUND)
        return refused(errors.ParkedEventsFullError, reason)
    parked.inbox.append(raw)
    return buffered(
        f"instance {meta.instance_id} is PARKED (its code raised {parked.failure.type}); "
        f"the event is kept with its {len(parked.inbox)} kept event(s) and delivered when a "
        f"retry runs its code on a fix; a termination sends the kept events to dead letters"
    )


def kept_events(meta: InstanceRow) -> list[Inbound]:
    """The raised events a parked instance keeps, in order (a reset delivers them to its
    new run: they never reached the history)."""
    parked = meta.parked
    if parked is None:
        return []
    kept = (_decode(raw) for raw in parked.inbox)
    return [i for i in kept if isinstance(i.body, EventRaised)]


def _keep(b: Batch, item: Loaded, inbox: list[Inbound], now_ms: int) -> None:
    """Add ``inbox`` to the kept events, in order; a raised event past the bound goes to
    dead letters instead (everything else is always kept)."""
    meta = item.meta
    parked = meta.parked
    assert parked is not None
    for inbound in inbox:
        raw = _encode(meta.instance_id, inbound)
        body = inbound.body
        full = _full(b, parked, len(raw)) if isinstance(body, EventRaised) else ""
        if isinstance(body, EventRaised) and full:
            reason = _over_bound_reason(meta.instance_id, body.name, parked, full)
            event = PendingEvent(body.name, body.input, now_ms)
            dead_letter_event(b, meta.instance_id, event, reason, OVER_BOUND)
            continue
        parked.inbox.append(raw)


def _full(b: Batch, parked: Parked, size: int) -> str:
    """Which bound one more kept event of ``size`` bytes breaks ("": none)."""
    if len(parked.inbox) >= b.env.parked_events_max:
        return f"{len(parked.inbox)} events (parked_events_max={b.env.parked_events_max})"
    held = sum(len(raw) for raw in parked.inbox)
    if held + size > b.env.parked_events_max_bytes:
        limit = b.env.parked_events_max_bytes
        return f"{held} bytes of kept events (parked_events_max_bytes={limit})"
    return ""


def _over_bound_reason(instance_id: str, name: str, parked: Parked, full: str) -> str:
    return (
        f"event {name!r} for instance {instance_id}, which is PARKED (its code raised "
        f"{parked.failure.type}: {parked.failure.message}), was not kept: it already keeps "
        f"{full}; deploy a fix and 'turnstile retry {instance_id}', then send the event "
        f"again (this record)"
    )


def _drop_raised(b: Batch, item: Loaded, kept: list[Inbound], now_ms: int) -> None:
    """A parked instance is terminated: the raised events it kept were never delivered;
    they go to dead letters, where they can be sent again (to a new run, say)."""
    meta = item.meta
    for inbound in kept:
        body = inbound.body
        if isinstance(body, EventRaised):
            reason = (
                f"event {body.name!r} was kept for instance {meta.instance_id} while it was "
                f"PARKED, and the instance was terminated before its code read it; send it "
                f"again (this record) if a new run should get it"
            )
            event = PendingEvent(body.name, body.input, now_ms)
            dead_letter_event(b, meta.instance_id, event, reason, DROPPED)


def _tell_schedule(b: Batch, meta: InstanceRow, failure: FailureDetails) -> None:
    """A run a schedule started parked: the schedule's row hears it (as a PARKED child
    result; other parents do not: for them a parked child simply still runs)."""
    parent = meta.parent_instance_id
    if parent is None or not parent.startswith(SCHEDULE_PREFIX):
        return
    note = ChildResult(
        instance_id=parent,
        generation=meta.parent_generation or 0,
        task_id=meta.parent_task_id or 0,
        child_instance_id=meta.instance_id,
        status=RuntimeStatus.PARKED,
        failure=failure,
    )
    b.send(b.env.topics.instance_messages, note)


def retry_due(b: Batch, item: Loaded) -> None:
    """The retry timer fired: run the kept events again with the code deployed now."""
    if item.meta.parked is not None and not item.retrying:
        item.inbox = [*_begin_retry(b, item), *item.inbox]


def _terminates(inbox: list[Inbound]) -> bool:
    return any(isinstance(i.body, ExecutionTerminated) for i in inbox)


def _begin_retry(b: Batch, item: Loaded) -> list[Inbound]:
    """Take the kept events for a retry in this batch and drop the retry timer."""
    meta = item.meta
    parked = meta.parked
    assert parked is not None
    b.tables.delete_timer(_timer(meta, parked.retry_at_ms))
    kept = [_decode(raw) for raw in parked.inbox]
    parked.inbox = []
    item.retrying = True
    b.save(meta)
    item.execution = None
    if meta.next_sequence == meta.generation_start:
        # parked on its first turn: nothing to replay, so start afresh as a start does
        item.execution = WorkflowExecution(
            b.env.registry,
            meta.instance_id,
            start_sequence=meta.next_sequence,
            generation=meta.generation,
        )
    return kept


def _timer(meta: InstanceRow, fire_at_ms: int) -> keys.TimerKey:
    return keys.TimerKey(fire_at_ms, meta.instance_id, meta.generation, PARK_TIMER)


def _encode(instance_id: str, inbound: Inbound) -> bytes:
    generation = _NO_GENERATION if inbound.generation is None else inbound.generation
    return encode_history(HistoryEvent(instance_id, 0, 0, generation, inbound.body))


def _decode(raw: bytes) -> Inbound:
    event = decode_history(raw)
    generation = None if event.generation == _NO_GENERATION else event.generation
    return Inbound(event.body, generation)
