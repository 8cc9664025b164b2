"""Parking: an instance whose workflow code has a bug waits for a fix instead of failing.

A bad deploy (a typo that raises ``AttributeError``, a workflow that is no longer
registered, code that no longer replays its history) would otherwise fail every instance
it touches, for good. With ``park_workflow_errors`` on (the default), a turn whose code
raised an *unexpected* exception is not recorded at all: the instance keeps its history and
status (RUNNING), the turn's inbound events are kept in its row, and it is retried with
backoff (1 s doubling to 5 minutes), with whatever code is deployed by then, or at once
on ``turnstile retry ID``. Events that arrive meanwhile join the kept ones, in order.

*Deliberate* failures still fail the instance: an :class:`~engine.ApplicationError` (or any
:class:`~engine.WorkflowFailure`, such as an activity failure the code did not catch), an
exception type the workflow declares with ``@workflow(failure_types=...)``, and input that
cannot be read as the workflow's parameter type (a CodecError: new code cannot fix it).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.codec import decode_history, encode_history
from engine.core.errors import CodecError, NotRegisteredError, WorkflowFailure
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ExecutionResumed,
    ExecutionTerminated,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
)
from engine.services.processor import keys

if TYPE_CHECKING:
    from engine.runtime.actions import TurnResult
    from engine.services.processor.partition import Loaded, PartitionProcessor

__all__ = [
    "PARK_TIMER",
    "Parked",
    "is_deliberate",
    "park",
    "parked_failure",
    "retry_now",
    "settled",
    "to_run",
]

log = logging.getLogger("engine.processor")

#: The timer task id of a parked instance's next retry (START_TIMER is -1).
PARK_TIMER = -2
FIRST_RETRY_MS = 1000
MAX_RETRY_MS = 5 * 60 * 1000
_NO_GENERATION = -1


@dataclass(slots=True)
class Parked:
    """Why and since when an instance waits, and the events its next retry applies."""

    attempts: int
    retry_at_ms: int
    failure: FailureDetails
    inbox: list[Inbound] = field(default_factory=list)
    #: A retry is running in this batch (never stored: a row is written after the turn).
    retrying: bool = False


def is_deliberate(error: BaseException, failure_types: tuple[type[BaseException], ...]) -> bool:
    """Whether an exception that escaped workflow code is meant to fail the instance."""
    if isinstance(error, NotRegisteredError):
        return False
    return isinstance(error, (WorkflowFailure, CodecError, *failure_types))


def parked_failure(
    pp: PartitionProcessor,
    item: Loaded,
    inbox: list[Inbound],
    result: TurnResult | None,
    error: BaseException | None,
) -> FailureDetails | None:
    """The failure to park on, or None when the turn's outcome stands.

    ``error`` is what the runtime raised (replay failed, the workflow is unknown); otherwise
    the turn's result ended the instance FAILED with the exception the code raised. A turn
    that terminates the instance is never parked: it ends, one way or the other.
    """
    if not pp.env.park_workflow_errors or _terminates(inbox):
        return None
    if error is not None:
        return failure_from_exception(error)
    execution = item.execution
    if result is None or execution is None or result.status is not RuntimeStatus.FAILED:
        return None
    raised = execution.code_error
    if raised is None:
        return None
    definition = execution.definition
    declared = definition.failure_types if definition is not None else ()
    return None if is_deliberate(raised, declared) else failure_from_exception(raised)


def park(
    pp: PartitionProcessor, item: Loaded, inbox: list[Inbound], failure: FailureDetails, now: int
) -> None:
    """Keep the turn's events, drop its decisions, and schedule the next retry."""
    meta = item.meta
    previous = meta.parked
    attempts = 1 if previous is None else previous.attempts + 1
    delay = min(FIRST_RETRY_MS * 2 ** min(attempts - 1, 20), MAX_RETRY_MS)
    meta.parked = Parked(attempts, now + delay, failure, list(inbox))
    pp.tables.put_timer(_timer(meta.instance_id, meta.generation, now + delay))
    item.execution = None  # it ran ahead of history: rebuild it from history on retry
    pp.dirty[meta.instance_id] = meta
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


def to_run(pp: PartitionProcessor, item: Loaded, inbox: list[Inbound]) -> list[Inbound] | None:
    """The events to run a turn on now, or None when a parked instance keeps them.

    A parked instance keeps new events for its retry, unless one asks for a retry now (a
    resume: ``turnstile retry``) or terminates it (its kept events are then dropped: the
    instance ends without running the code that raises).
    """
    parked = item.meta.parked
    if parked is None or parked.retrying:
        return inbox
    if _terminates(inbox):
        _begin_retry(pp, item)
        return inbox
    if any(isinstance(i.body, ExecutionResumed) for i in inbox):
        return [*_begin_retry(pp, item), *inbox]
    parked.inbox.extend(inbox)
    pp.dirty[item.meta.instance_id] = item.meta
    return None


def _terminates(inbox: list[Inbound]) -> bool:
    return any(isinstance(i.body, ExecutionTerminated) for i in inbox)


def retry_now(pp: PartitionProcessor, item: Loaded) -> None:
    """The retry timer fired: run the kept events again with the code deployed now."""
    parked = item.meta.parked
    if parked is not None and not parked.retrying:
        item.inbox = [*_begin_retry(pp, item), *item.inbox]


def settled(pp: PartitionProcessor, item: Loaded) -> None:
    """The turn's outcome stands (it ran on, or failed on purpose): no longer parked."""
    meta = item.meta
    parked = meta.parked
    if parked is not None:
        meta.parked = None
        pp.dirty[meta.instance_id] = meta
        log.info(
            "instance %s runs again after %d parked attempt(s)", meta.instance_id, parked.attempts
        )


def _begin_retry(pp: PartitionProcessor, item: Loaded) -> list[Inbound]:
    """Take the kept events for a retry in this batch and drop the retry timer."""
    meta = item.meta
    parked = meta.parked
    assert parked is not None
    pp.tables.delete_timer(_timer(meta.instance_id, meta.generation, parked.retry_at_ms))
    kept, parked.inbox, parked.retrying = parked.inbox, [], True
    pp.dirty[meta.instance_id] = meta
    if not any(True for _ in pp.tables.history(meta.instance_id, meta.generation_start)):
        # parked on its first turn: nothing to replay, so start from scratch as begin() does
        from engine.runtime.executor import WorkflowExecution

        item.execution = WorkflowExecution(
            pp.env.registry,
            meta.instance_id,
            start_sequence=meta.next_sequence,
            generation=meta.generation,
        )
    return kept


def _timer(instance_id: str, generation: int, fire_at_ms: int) -> keys.TimerKey:
    return keys.TimerKey(fire_at_ms, instance_id, generation, PARK_TIMER)


# --- the instance row's JSON form -----------------------------------------------------------


def parked_to_json(parked: Parked | None, instance_id: str, encode_failure: Any) -> Any:
    if parked is None:
        return None
    inbox = []
    for inbound in parked.inbox:
        generation = _NO_GENERATION if inbound.generation is None else inbound.generation
        event = HistoryEvent(instance_id, 0, 0, generation, inbound.body)
        inbox.append(base64.b64encode(encode_history(event)).decode())
    return [parked.attempts, parked.retry_at_ms, encode_failure(parked.failure), inbox]


def parked_from_json(raw: Any, decode_failure: Any) -> Parked | None:
    if raw is None:
        return None
    attempts, retry_at_ms, failure, inbox = raw
    events = [decode_history(base64.b64decode(item)) for item in inbox]
    kept = [
        Inbound(e.body, None if e.generation == _NO_GENERATION else e.generation) for e in events
    ]
    return Parked(attempts, retry_at_ms, decode_failure(failure), kept)
