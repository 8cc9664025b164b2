"""The client's side of command outcomes: wait for the processor's answer to a command and
turn a refusal into a typed error.

One reader per client feeds every outcome record into :class:`OutcomeWaiters`, which holds
one future per command still waiting, keyed by request id; a record for a request nobody
waits for is skipped at the cost of a dictionary lookup. A thousand commands in flight
cost a thousand futures, not a thousand consumers.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from engine.codec import decode_message
from engine.core import errors
from engine.core.errors import CodecError, CommandRefusedError, CommandTimeoutError
from engine.core.messages import CommandOutcome, CommandResult

__all__ = ["REFUSALS", "OutcomeWaiters", "raise_for_refusal", "refusal_error"]

log = logging.getLogger(__name__)

#: The error a refusal raises, by its stable code (``CommandOutcome.code``): the one table
#: from the processor's answers to the exception tree.
REFUSALS: dict[str, type[CommandRefusedError]] = {
    cls.code: cls
    for cls in (
        errors.CommandRefusedError,
        errors.InstanceNotFoundError,
        errors.InstanceAlreadyExistsError,
        errors.WorkflowAlreadyRunningError,
        errors.WorkflowAlreadyRanError,
        errors.InstanceNotRunningError,
        errors.InstanceNotSuspendedError,
        errors.InstanceAlreadySuspendedError,
        errors.InstanceStillRunningError,
        errors.PendingEventsFullError,
        errors.ParkedEventsFullError,
        errors.NoConcurrencyLimitError,
        errors.ScheduleRefusedError,
        errors.ScheduleAlreadyExistsError,
        errors.ScheduleNotFoundError,
        errors.ScheduleDefinitionError,
        errors.InvalidResetPointError,
        errors.RerunTooLargeError,
        errors.UnknownQueryError,
        errors.QueryFailedError,
        errors.UnknownUpdateError,
        errors.UpdateRejectedError,
        errors.UpdateFailedError,
        errors.StaleTaskTokenError,
    )
}

#: The same errors by class name, for answers written before codes existed (``error``).
_BY_NAME = {cls.__name__: cls for cls in REFUSALS.values()}


def refusal_error(outcome: CommandOutcome) -> type[CommandRefusedError]:
    """The error class a refused outcome raises: by its code, else (an answer from a
    processor that predates codes) by its class name, else the base class."""
    if outcome.code:
        return REFUSALS.get(outcome.code, CommandRefusedError)
    return _BY_NAME.get(outcome.error, CommandRefusedError)


#: What to do next, by refusal (appended to the processor's reason).
_HINTS: dict[type[CommandRefusedError], str] = {
    errors.WorkflowAlreadyRunningError: "wait for it to end, or start with another "
    "reuse_policy (TERMINATE_IF_RUNNING, IGNORE_IF_RUNNING)",
    errors.WorkflowAlreadyRanError: "use a new instance id (REJECT_DUPLICATE never reuses one)",
    errors.InstanceNotFoundError: "check the instance id ('turnstile list')",
    errors.InstanceNotRunningError: "start a new run under the id (signal_with_start starts "
    "it and delivers an event in one step)",
    errors.InstanceNotSuspendedError: "only a suspended or parked instance can be resumed",
    errors.InstanceAlreadySuspendedError: "resume it first if it should run",
    errors.InstanceStillRunningError: "terminate it first, or wait for it to end",
    errors.PendingEventsFullError: "start the instance, or raise pending_events_max",
    errors.ParkedEventsFullError: "deploy a fix and 'turnstile retry' the instance, then "
    "send the event again from dead letters (or raise parked_events_max/_bytes)",
    errors.ScheduleAlreadyExistsError: "delete it first ('turnstile schedule delete NAME'), "
    "or choose another name",
    errors.ScheduleNotFoundError: "check the name ('turnstile schedule list')",
    errors.InvalidResetPointError: "pick a sequence number of the current run "
    "('turnstile history show ID' lists them)",
    errors.RerunTooLargeError: "reset the instance in place, or raise max_record_bytes",
    errors.UnknownQueryError: "use one of the names the workflow sets with ctx.set_query_handler",
    errors.QueryFailedError: "fix the query handler (it must only read the workflow's "
    "state and return JSON)",
    errors.UnknownUpdateError: "use one of the names the workflow sets with ctx.set_update_handler",
    errors.StaleTaskTokenError: "stop working on this attempt: the workflow no longer waits "
    "for it (a retry has its own token)",
}


def raise_for_refusal(outcome: CommandOutcome) -> CommandOutcome:
    """The outcome itself when the command was accepted or buffered; else its typed error."""
    if outcome.result is not CommandResult.REFUSED:
        return outcome
    cls = refusal_error(outcome)
    hint = _HINTS.get(cls)
    message = f"{outcome.command} for {outcome.instance_id!r} refused: {outcome.reason}"
    raise cls(f"{message}; {hint}" if hint else message, outcome)


class OutcomeWaiters:
    """Futures of the commands waiting for their outcome, resolved by the outcome reader.

    Thread-safe: the reader thread calls :meth:`apply_record` and :meth:`mark_failed`; any
    thread expects and waits. Expect a request id *before* sending its command, so the
    answer cannot pass by unseen.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, Future[CommandOutcome]] = {}
        self._error: BaseException | None = None
        self.skipped = 0

    def expect(self, request_id: str) -> Future[CommandOutcome]:
        future: Future[CommandOutcome] = Future()
        with self._lock:
            if self._error is not None:
                future.set_exception(self._error)
            else:
                self._waiting[request_id] = future
        return future

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._waiting.pop(request_id, None)

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def apply_record(self, value: bytes | None) -> None:
        """One record of the outcome topic: resolve the command waiting for it, if any."""
        if value is None:
            return
        try:
            outcome = decode_message(value)
        except CodecError as exc:
            self.skipped += 1
            log.warning("skipping an undecodable command outcome: %s", exc)
            return
        if not isinstance(outcome, CommandOutcome):
            self.skipped += 1
            return
        self.apply(outcome)

    def apply(self, outcome: CommandOutcome) -> None:
        with self._lock:
            future = self._waiting.pop(outcome.request_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def mark_failed(self, error: BaseException) -> None:
        """The reader stopped for good: every wait, now and later, raises ``error``."""
        with self._lock:
            self._error = error
            waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    def wait(
        self, request_id: str, future: Future[CommandOutcome], timeout_s: float, what: str
    ) -> CommandOutcome:
        """The outcome, or :class:`CommandTimeoutError` after ``timeout_s``."""
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            self.forget(request_id)
            raise CommandTimeoutError(
                f"{what} was sent (request id {request_id}) but no processor answered "
                f"within {timeout_s:g}s; check that a processor runs for this namespace. "
                f"Sending it again with the same request id is safe: it is applied once"
            ) from None
