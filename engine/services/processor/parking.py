"""Parking: an instance whose workflow code has a bug waits for a fix instead of failing.

A bad deploy (a typo that raises ``AttributeError``, a workflow that is no longer
registered, code that no longer replays its history) would otherwise fail every instance
it touches, for good. With ``park_workflow_errors`` on (the default), a turn whose code
raised an *unexpected* exception is not recorded at all: the instance keeps its history and
status (RUNNING), the turn's inbound events are kept in its row (``InstanceRow.parked``),
and a timer (task id :data:`PARK_TIMER`) retries it with backoff (1 s doubling to 5
minutes) with whatever code is deployed by then, or at once on ``turnstile retry ID`` (a
resume). Events that arrive meanwhile join the kept ones, in order; a termination ends the
instance without running the code that raises.

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
from engine.core.errors import NonDeterminismError, NotRegisteredError, TurnstileError
from engine.core.failure import failure_from_exception
from engine.core.history import (
    ExecutionResumed,
    ExecutionStarted,
    ExecutionTerminated,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
)
from engine.core.instance_row import InstanceRow, Parked
from engine.runtime.actions import TurnResult
from engine.runtime.executor import WorkflowExecution
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded

__all__ = [
    "PARK_TIMER",
    "code_error",
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
    kept = [_encode(meta.instance_id, inbound) for inbound in inbox]
    meta.parked = Parked(attempts, now_ms + delay, failure, kept)
    b.tables.put_timer(_timer(meta, now_ms + delay))
    item.execution = None  # it ran ahead of history: rebuilt from history on retry
    item.retrying = False
    b.save(meta)
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


def take_inbox(b: Batch, item: Loaded) -> list[Inbound] | None:
    """The events to run the turn on, or None when a parked instance keeps them.

    A parked instance keeps new events for its retry, unless one asks for a retry now (a
    resume: ``turnstile retry``) or terminates it: its kept events are then dropped (all
    but its start, if the code never got past it), so it ends without running the code.
    """
    inbox, item.inbox = item.inbox, []
    parked = item.meta.parked
    if parked is None or item.retrying:
        return inbox
    if _terminates(inbox):
        started = [i for i in _begin_retry(b, item) if isinstance(i.body, ExecutionStarted)]
        return [*started, *inbox]
    if any(isinstance(i.body, ExecutionResumed) for i in inbox):
        return [*_begin_retry(b, item), *inbox]
    parked.inbox.extend(_encode(item.meta.instance_id, inbound) for inbound in inbox)
    b.save(item.meta)
    return None


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
