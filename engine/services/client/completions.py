"""Finishing an activity attempt from outside the worker, by its task token.

``Client.complete_activity`` and ``Client.fail_activity`` write the very record the worker
writes when an attempt ends (an :class:`ActivityResult` naming instance, run id,
generation, task id and attempt), so the processor applies it exactly as a worker's: the
first result for the current attempt of a running call wins, and any later one - a second
completion, a retry of the client, a late worker - is dropped by the checks that already
keep worker results exactly once. The record goes on the commands topic, which clients
already write (no new topic permission); the processor accepts it there as on the
activity-results topic.

What the client can tell, it refuses before writing: a string that is no task token
(:class:`InvalidTaskTokenError`), and, from the status view, an instance that is unknown or
has ended or has moved on to another run or generation (:class:`StaleTaskTokenError`). An
earlier attempt of a call that is still running (its retry is now current) looks the same
from outside; the processor drops its result and logs why, as it does a late worker's.
"""

from __future__ import annotations

from typing import Any

from engine.core.errors import StaleTaskTokenError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import RuntimeStatus
from engine.core.messages import ActivityResult
from engine.core.payloads import to_payload
from engine.core.task_tokens import TaskToken
from engine.services.client.workflow_client import InstanceState

__all__ = ["completion", "failure_of", "heartbeat"]

#: The states in which an instance still waits for its activities.
_WAITING = (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED)


def completion(
    token: str,
    state: InstanceState | None,
    output: Any = None,
    failure: FailureDetails | None = None,
) -> ActivityResult:
    """The result record ``token``'s attempt ends with; raises :class:`InvalidTaskTokenError`
    or :class:`StaleTaskTokenError` (``state``: the instance as the client sees it)."""
    t = TaskToken.decode(token)
    _check_current(t, state)
    payload = None if failure is not None else to_payload(output)
    return ActivityResult(
        t.instance_id, t.generation, t.task_id, t.attempt, payload, failure, run_id=t.run_id
    )


def heartbeat(
    token: str, state: InstanceState | None, details: Any, request_id: str
) -> ActivityResult:
    """The heartbeat record of ``token``'s attempt (answered under ``request_id``); raises
    as :func:`completion`."""
    t = TaskToken.decode(token)
    _check_current(t, state)
    payload = None if details is None else to_payload(details)
    return ActivityResult(
        t.instance_id,
        t.generation,
        t.task_id,
        t.attempt,
        details=payload,
        run_id=t.run_id,
        heartbeat=True,
        request_id=request_id,
    )


def failure_of(error: BaseException | str) -> FailureDetails:
    """What ``fail_activity`` reports: an exception as a worker would capture it (its
    ``non_retryable`` decides the retry), or a message as a retryable failure."""
    if isinstance(error, BaseException):
        return failure_from_exception(error)
    return FailureDetails("ActivityFailed", str(error), retryable=True)


def _check_current(t: TaskToken, state: InstanceState | None) -> None:
    what = f"the task token of activity task {t.task_id} (attempt {t.attempt}) of {t.instance_id!r}"
    if state is None:
        raise StaleTaskTokenError(f"{what} names no instance (purged, or never started)")
    if t.run_id and state.run_id and t.run_id != state.run_id:
        raise StaleTaskTokenError(
            f"{what} is for run {t.run_id}; the instance id now runs run {state.run_id}"
        )
    if state.status not in _WAITING:
        raise StaleTaskTokenError(
            f"{what} is stale: the instance is {state.status.value} and waits for nothing"
        )
    if state.generation != t.generation:
        raise StaleTaskTokenError(
            f"{what} is for generation {t.generation}; the instance moved on to generation "
            f"{state.generation} (continue-as-new or reset), whose calls have other tokens"
        )
