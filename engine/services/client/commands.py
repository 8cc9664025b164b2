"""The command verbs, written once: what ``Client`` and ``TestEngine`` send and return.

Each verb builds its command record here and sends it through a :class:`WorkflowClient`,
which writes it, waits for the processor's answer and raises a refusal as its typed error
(``engine.services.client.outcomes``). :class:`CommandMethods` holds the verbs; the Kafka
client (:class:`engine.client.Client`) and the in-process test engine
(:class:`engine.testing.TestEngine`) inherit them and differ only in the
:class:`WorkflowClient` they hand over (a Kafka producer or the in-memory topics) and in how
they read and wait. So a start returns the same :class:`WorkflowHandle` in a test as in
production, and a new verb is one method here (plus a one-line delegation on each handle
and on ``AsyncClient``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Generic, Self, TypeVar

from engine.core.errors import InstanceFailedError
from engine.core.history import RuntimeStatus
from engine.core.messages import (
    CancelWorkflow,
    CommandOutcome,
    IdReusePolicy,
    PurgeWorkflow,
    QueryWorkflow,
    RaiseEvent,
    ResetTarget,
    ResetWorkflow,
    ResumeWorkflow,
    SignalWithStart,
    StartWorkflow,
    SuspendWorkflow,
    TerminateWorkflow,
    UpdateWithStart,
    UpdateWorkflow,
)
from engine.core.payloads import from_payload, to_payload
from engine.core.tags import checked_tags
from engine.core.task_tokens import TaskToken
from engine.core.typed import convert, return_type
from engine.runtime.registry import Registry
from engine.services.client.completions import completion, failure_of
from engine.services.client.outcomes import raise_for_refusal
from engine.services.client.workflow_client import InstanceState, WorkflowClient

__all__ = [
    "RETRY_REASON",
    "CommandMethods",
    "InstanceHandle",
    "WorkflowHandle",
    "request_id_or_new",
    "reset_command",
    "result_of",
    "start_command",
]

R = TypeVar("R")

#: The reason recorded for the resume that ``retry`` sends (a parked instance runs again).
RETRY_REASON = "retry"

#: What a command other than a start returns: the processor's answer (None: not waited for).
Outcome = CommandOutcome | None


# --- building commands ----------------------------------------------------------------------


def request_id_or_new(given: str | None) -> str:
    """The caller's request id, or a fresh one: every command carries one, so that the
    processor answers it and a resend is applied once."""
    return given or uuid.uuid4().hex


def start_command(
    registry: Registry,
    workflow: str | Callable[..., Any],
    input: Any = None,
    *,
    instance_id: str | None = None,
    reuse_policy: IdReusePolicy = IdReusePolicy.ERROR_IF_RUNNING,
    request_id: str | None = None,
    start_at: datetime | None = None,
    tags: dict[str, str] | None = None,
    version: str = "",
    concurrency_key: str = "",
    execution_timeout: timedelta | float | None = None,
    run_timeout: timedelta | float | None = None,
) -> StartWorkflow:
    """The StartWorkflow record :meth:`CommandMethods.start` sends (a fresh id without
    ``instance_id``); bad arguments fail here, before anything is written."""
    return StartWorkflow(
        instance_id=instance_id or uuid.uuid4().hex,
        name=registry.workflow_name(workflow),
        input=None if input is None else to_payload(input),
        version=version,
        reuse_policy=IdReusePolicy(reuse_policy),
        request_id=request_id_or_new(request_id),
        scheduled_start_ms=None if start_at is None else _epoch_ms(start_at),
        tags=checked_tags(tags),
        concurrency_key=_concurrency_key(concurrency_key),
        execution_timeout_ms=_timeout_ms("execution_timeout", execution_timeout),
        run_timeout_ms=_timeout_ms("run_timeout", run_timeout),
    )


def _timeout_ms(what: str, value: timedelta | float | None) -> int:
    """A start's workflow timeout in ms (0: the workflow's own, if any)."""
    if value is None:
        return 0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ValueError(
            f"{what} must be a timedelta or a number of seconds > 0, got {value!r}; leave it "
            f"out to use the workflow's own"
        )
    return max(1, round(seconds * 1000))


def reset_command(
    instance_id: str, to: int | ResetTarget, reason: str, new_instance_id: str, request_id: str
) -> ResetWorkflow:
    """The ResetWorkflow record for a point given as a sequence number or a target."""
    if isinstance(to, bool) or not isinstance(to, int | ResetTarget):
        raise TypeError(f"reset point must be a sequence number (int) or a ResetTarget, not {to!r}")
    if isinstance(to, ResetTarget):
        target, sequence = to, 0
    else:
        if to < 0:
            raise ValueError(f"reset point {to} is negative: sequence numbers start at 0")
        target, sequence = ResetTarget.SEQUENCE, to
    return ResetWorkflow(instance_id, target, sequence, reason, request_id, new_instance_id)


def _epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _concurrency_key(key: object) -> str:
    """A start's ``concurrency_key``, checked where the caller can still fix it."""
    if not isinstance(key, str):
        raise TypeError(
            f"concurrency_key must be a string (e.g. the account id), got {type(key).__name__}"
        )
    return key


# --- handles --------------------------------------------------------------------------------


class InstanceHandle(str):
    """What every handle shares: being the instance id, the client, the result type, and
    the answer to the command that made it (start, signal-with-start)."""

    _client: Any
    _result_type: Any
    _outcome: CommandOutcome | None

    def __new__(
        cls,
        instance_id: str,
        client: Any,
        result_type: Any = None,
        outcome: CommandOutcome | None = None,
    ) -> Self:
        handle = super().__new__(cls, instance_id)
        handle._client = client
        handle._result_type = result_type
        handle._outcome = outcome
        return handle

    @property
    def outcome(self) -> CommandOutcome | None:
        """The processor's answer to the start (None: not waited for, or a plain handle)."""
        return self._outcome

    @property
    def generation(self) -> int:
        """The generation the start began (0 when unknown): ``result()`` waits for the end
        of that run or a later one, never an earlier run of the same id."""
        return 0 if self._outcome is None else self._outcome.generation

    @property
    def instance_id(self) -> str:
        return str(self)

    @property
    def result_type(self) -> Any:
        """What ``result()`` converts the output to (None: plain JSON)."""
        return self._result_type


class WorkflowHandle(InstanceHandle, Generic[R]):
    """One instance: its id (this string itself) and what can be done with it.

    Being the id, a handle can be printed, stored, compared and used as a dict key; it
    works wherever an instance id does. Each method is the client's verb for this id.
    """

    _client: CommandMethods

    def result(self, timeout: float | None = None) -> R:
        """Wait until the instance ends and return its result (converted to the workflow's
        return type). Raises InstanceFailedError if it FAILED or was TERMINATED,
        WaitTimeoutError after ``timeout`` seconds."""
        state = self._client.wait_for_completion(self, timeout, generation=self.generation)
        value: R = result_of(state, self._result_type)
        return value

    def status(self) -> InstanceState | None:
        """The latest status, or None if the instance is not known (yet, or any more)."""
        return self._client.get(self)

    def raise_event(self, name: str, data: Any = None, **options: Any) -> CommandOutcome | None:
        """See :meth:`CommandMethods.raise_event` (``request_id``, ``wait``)."""
        return self._client.raise_event(self, name, data, **options)

    def terminate(self, reason: str = "", recursive: bool = False, **options: Any) -> Outcome:
        return self._client.terminate(self, reason, recursive, **options)

    def cancel(self, reason: str = "", **options: Any) -> Outcome:
        """See :meth:`CommandMethods.cancel`."""
        return self._client.cancel(self, reason, **options)

    def suspend(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return self._client.suspend(self, reason, **options)

    def resume(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return self._client.resume(self, reason, **options)

    def purge(self, **options: Any) -> CommandOutcome | None:
        return self._client.purge(self, **options)

    def retry(self, **options: Any) -> CommandOutcome | None:
        """See :meth:`CommandMethods.retry`."""
        return self._client.retry(self, **options)

    def query(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        """See :meth:`CommandMethods.query`."""
        return self._client.query(self, name, *args, timeout=timeout)

    def update(self, name: str, arg: Any = None, **options: Any) -> Any:
        """See :meth:`CommandMethods.update` (``update_id``, ``timeout``, ``result_type``)."""
        return self._client.update(self, name, arg, **options)


def result_of(state: InstanceState, result_type: Any) -> Any:
    """An ended instance's output converted to ``result_type``, or its failure raised."""
    if state.status is not RuntimeStatus.COMPLETED:
        failure = state.failure
        why = f": {failure.type}: {failure.message}" if failure is not None else ""
        raise InstanceFailedError(
            f"instance {state.instance_id!r} ended {state.status.value}{why}", failure
        )
    return convert(state.output, result_type)


# --- the verbs ------------------------------------------------------------------------------


class CommandMethods:
    """The command verbs of ``Client`` and ``TestEngine`` (one definition for both).

    A subclass gives :meth:`_command_client` (where commands go and answers come from),
    :meth:`get` and :meth:`wait_for_completion` (what a handle reads). Every verb waits for
    the processor's answer by default and raises a refusal as its error
    (``InstanceNotFoundError``, ``WorkflowAlreadyRunningError``, ... all
    ``CommandRefusedError``); ``wait=False`` returns once the command is written.
    """

    def _command_client(self) -> WorkflowClient:
        raise NotImplementedError

    def get(self, instance_id: str) -> InstanceState | None:
        raise NotImplementedError

    def wait_for_completion(
        self, instance_id: str, timeout: float | None = None, *, generation: int = 0
    ) -> InstanceState:
        raise NotImplementedError

    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        instance_id: str | None = None,
        reuse_policy: IdReusePolicy = IdReusePolicy.ERROR_IF_RUNNING,
        request_id: str | None = None,
        start_at: datetime | None = None,
        tags: dict[str, str] | None = None,
        version: str = "",
        concurrency_key: str = "",
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
        flush: bool = True,
        wait: bool = True,
    ) -> WorkflowHandle[Any]:
        """Start an instance of ``workflow`` (a name or a registered function).

        Returns its :class:`WorkflowHandle` (the instance id, with methods); given the
        function, the handle's :meth:`~WorkflowHandle.result` has its return type. ``input``
        may be a JSON value, a dataclass or a pydantic model. Waits for the processor's
        answer: a refused start raises (``WorkflowAlreadyRunningError`` under
        ERROR_IF_RUNNING, ``WorkflowAlreadyRanError`` under REJECT_DUPLICATE). With
        ``wait=False`` it returns once written; with ``flush=False`` the command is only
        queued (call :meth:`flush` after a batch) and not waited for. ``concurrency_key``
        counts it against the workflow's ``max_concurrency_per_key``: over the limit it
        waits, in order, as PENDING (the answer is BUFFERED) until a slot frees.
        ``execution_timeout``/``run_timeout`` (a timedelta or seconds) override the
        workflow's own: the instance ends TIMED_OUT when its chain of runs, or one run, has
        not ended that long after it began.
        """
        client = self._command_client()
        command = start_command(
            client.registry,
            workflow,
            input,
            instance_id=instance_id,
            reuse_policy=reuse_policy,
            request_id=request_id,
            start_at=start_at,
            tags=tags,
            version=version,
            concurrency_key=concurrency_key,
            execution_timeout=execution_timeout,
            run_timeout=run_timeout,
        )
        outcome = client.send(command, flush=flush, wait=wait and flush)
        result = None if isinstance(workflow, str) else return_type(workflow)
        return WorkflowHandle(command.instance_id, self, result, outcome)

    def handle(self, instance_id: str, result_type: Any = None) -> WorkflowHandle[Any]:
        """A handle on an existing instance; ``result_type`` converts its result."""
        return WorkflowHandle(instance_id, self, result_type)

    def start_many(
        self, workflow: str | Callable[..., Any], inputs: Iterable[Any], **options: Any
    ) -> list[WorkflowHandle[Any]]:
        """Start one instance per input, flushing once at the end (fast bulk starts; the
        answers are not waited for); returns their handles."""
        if "instance_id" in options:
            raise ValueError("start_many generates instance ids; do not pass instance_id")
        handles = [self.start(workflow, value, flush=False, **options) for value in inputs]
        self.flush()
        return handles

    def flush(self) -> None:
        """Wait until every queued command is written (raises BrokerError if one failed)."""
        self._command_client().flush()

    def raise_event(
        self,
        instance_id: str,
        name: str,
        data: Any = None,
        *,
        request_id: str | None = None,
        flush: bool = True,
        wait: bool = True,
    ) -> Outcome:
        """Deliver an external event; returns the processor's answer (None with
        ``wait=False``). An instance that has not started yet keeps the event until it
        starts, at most ``pending_events_ttl_ms`` (then it goes to dead letters), and a
        PARKED one keeps it for its retry (``result`` BUFFERED both); one that ended
        refuses it (InstanceNotRunningError). The same ``request_id`` sent again is
        delivered once."""
        payload = None if data is None else to_payload(data)
        command = RaiseEvent(instance_id, name, payload, request_id_or_new(request_id))
        return self._command_client().send(command, flush=flush, wait=wait and flush)

    def signal_with_start(
        self,
        workflow: str | Callable[..., Any],
        instance_id: str,
        event: str,
        data: Any = None,
        *,
        input: Any = None,
        version: str = "",
        tags: dict[str, str] | None = None,
        request_id: str | None = None,
        wait: bool = True,
        reuse_policy: IdReusePolicy = IdReusePolicy.IGNORE_IF_RUNNING,
    ) -> WorkflowHandle[Any]:
        """Deliver ``event`` to the instance, starting a run of ``workflow`` (with
        ``input``) first unless it is RUNNING, SUSPENDED, PARKED or PENDING, in one atomic
        step. Returns the instance's handle; its ``outcome`` is the processor's answer (the
        reason says which happened) and its ``result()`` waits for the run the event went
        to. ``reuse_policy`` judges an existing instance as for ``start``: the default,
        IGNORE_IF_RUNNING, delivers the event to a live one and replaces an ended one
        (what Temporal's signal-with-start does); ERROR_IF_RUNNING refuses a live one
        (WorkflowAlreadyRunningError), TERMINATE_IF_RUNNING replaces it, REJECT_DUPLICATE
        refuses an ended one (WorkflowAlreadyRanError)."""
        client = self._command_client()
        command = SignalWithStart(
            instance_id=instance_id,
            name=client.registry.workflow_name(workflow),
            input=None if input is None else to_payload(input),
            version=version,
            request_id=request_id_or_new(request_id),
            tags=checked_tags(tags),
            event_name=event,
            event_input=None if data is None else to_payload(data),
            reuse_policy=IdReusePolicy(reuse_policy),
        )
        outcome = client.send(command, wait=wait)
        result = None if isinstance(workflow, str) else return_type(workflow)
        return WorkflowHandle(instance_id, self, result, outcome)

    def terminate(
        self,
        instance_id: str,
        reason: str = "",
        recursive: bool = False,
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> Outcome:
        """End the instance TERMINATED (``recursive``: its running children too)."""
        command = TerminateWorkflow(instance_id, reason, recursive, request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def cancel(
        self,
        instance_id: str,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> Outcome:
        """Ask the instance to stop and clean up: every fiber of its code gets
        ``asyncio.CancelledError`` at its current ``await`` (its ``finally`` blocks run and
        may still await activities); it ends CANCELLED if the code lets the error propagate
        and runs on if it catches it. :meth:`terminate` is the hard stop."""
        command = CancelWorkflow(instance_id, reason, request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def suspend(
        self,
        instance_id: str,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> Outcome:
        """Stop running the instance's turns until :meth:`resume`; events and activity
        results that arrive meanwhile wait in its inbox."""
        command = SuspendWorkflow(instance_id, reason, request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def resume(
        self,
        instance_id: str,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> Outcome:
        """Run a suspended instance again (InstanceNotSuspendedError when it is not)."""
        command = ResumeWorkflow(instance_id, reason, request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def purge(
        self, instance_id: str, *, request_id: str | None = None, wait: bool = True
    ) -> Outcome:
        """Remove an ended instance's state and status (InstanceStillRunningError while
        it runs)."""
        command = PurgeWorkflow(instance_id, request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def reset(
        self,
        instance_id: str,
        to: int | ResetTarget,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> Outcome:
        """Start a new run (the next generation) of the instance from its current run's
        history up to ``to``: a sequence number (``turnstile history show``), or
        ``ResetTarget.LAST_FAILURE`` / ``ResetTarget.FIRST_TURN``. The turns before the
        point are reused, the rest is done again; ``reason`` is recorded in history.
        Refused with ``InvalidResetPointError`` for a point the run does not have."""
        command = reset_command(instance_id, to, reason, "", request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def rerun(
        self,
        instance_id: str,
        new_id: str,
        to: int | ResetTarget = ResetTarget.FIRST_TURN,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> Outcome:
        """As :meth:`reset`, but the new run is a new instance ``new_id`` (an unused id or
        one whose run ended); the source instance is left as it is."""
        command = reset_command(instance_id, to, reason, new_id, request_id_or_new(request_id))
        return self._command_client().send(command, wait=wait)

    def retry(
        self, instance_id: str, *, request_id: str | None = None, wait: bool = True
    ) -> Outcome:
        """Run a parked instance (one whose workflow code raised unexpectedly) again now,
        with the code deployed now, instead of at its next scheduled retry.

        It is sent as a resume: a suspended instance resumes, one neither parked nor
        suspended refuses it (InstanceNotSuspendedError)."""
        return self.resume(instance_id, RETRY_REASON, request_id=request_id, wait=wait)

    def query(self, instance_id: str, name: str, *args: Any, timeout: float | None = None) -> Any:
        """Ask the instance's query handler ``name`` (``ctx.set_query_handler``) for a
        value: ``args`` are its arguments (JSON values), the result is what it returns.

        Read-only: the processor that owns the instance runs the handler on its state as
        of the last turn and records nothing; an ended instance answers from its last
        state. Raises ``UnknownQueryError`` (the reason lists the known names),
        ``QueryFailedError`` (the handler raised or tried to schedule something),
        ``InstanceNotFoundError``, or ``CommandTimeoutError`` after ``timeout`` seconds
        (default: the client's answer timeout)."""
        client = self._command_client()
        command = QueryWorkflow(instance_id, name, to_payload(list(args)), request_id_or_new(None))
        future = client.send_expecting(command)
        client.flush()
        if future is None:
            raise RuntimeError("this client reads no command outcomes, so it cannot query")
        wait_s = client.outcome_timeout_s if timeout is None else timeout
        outcome = raise_for_refusal(client.answer(command.request_id, future, wait_s))
        return from_payload(outcome.output)

    def update(
        self,
        instance_id: str,
        name: str,
        arg: Any = None,
        *,
        update_id: str | None = None,
        timeout: float | None = None,
        result_type: Any = None,
    ) -> Any:
        """Run the instance's update handler ``name`` (``ctx.set_update_handler``) with
        ``arg`` (a JSON value) and return what it returns (converted to ``result_type``
        if given).

        Its validator runs first: a rejection records nothing and raises
        ``UpdateRejectedError`` (also for a parked, suspended or ended instance, with the
        reason), an unknown name ``UnknownUpdateError`` listing the known ones. An
        accepted update is recorded and its handler may await activities and timers; if
        it raises, ``UpdateFailedError``. ``update_id`` (default: a new one) de-duplicates:
        a retry with the same id gets the first answer. ``CommandTimeoutError`` after
        ``timeout`` seconds (default: the client's answer timeout); retry with the same
        ``update_id`` to keep waiting."""
        command = UpdateWorkflow(instance_id, name, to_payload(arg), request_id_or_new(update_id))
        return self._send_update(command, timeout, result_type)

    def update_with_start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        instance_id: str,
        update: str,
        arg: Any = None,
        update_id: str | None = None,
        version: str = "",
        tags: dict[str, str] | None = None,
        reuse_policy: IdReusePolicy = IdReusePolicy.IGNORE_IF_RUNNING,
        timeout: float | None = None,
        result_type: Any = None,
    ) -> Any:
        """Start a run of ``workflow`` with ``input`` unless the instance lives, then run
        its update handler ``update`` with ``arg``, in one command, and return what the
        handler returns (as :meth:`update`). The start's first turn runs before the
        update, so the code has set its handlers. ``reuse_policy`` judges an existing
        instance as for :meth:`signal_with_start` (the default updates a live one and
        replaces an ended one); its refusals are raised as for ``start``."""
        client = self._command_client()
        command = UpdateWithStart(
            instance_id=instance_id,
            name=client.registry.workflow_name(workflow),
            input=None if input is None else to_payload(input),
            version=version,
            request_id=request_id_or_new(update_id),
            tags=checked_tags(tags),
            update_name=update,
            update_input=to_payload(arg),
            reuse_policy=IdReusePolicy(reuse_policy),
        )
        return self._send_update(command, timeout, result_type)

    def _send_update(
        self, command: UpdateWorkflow | UpdateWithStart, timeout: float | None, result_type: Any
    ) -> Any:
        client = self._command_client()
        future = client.send_expecting(command)
        client.flush()
        if future is None:
            raise RuntimeError("this client reads no command outcomes, so it cannot update")
        wait_s = client.outcome_timeout_s if timeout is None else timeout
        outcome = raise_for_refusal(client.answer(command.request_id, future, wait_s))
        return convert(from_payload(outcome.output), result_type)

    # --- activities that complete later (engine.services.client.completions) ---------------

    def complete_activity(self, token: str, result: Any = None) -> None:
        """Finish the attempt ``token`` names (``current_activity().task_token`` of an
        activity that called ``complete_later()``) with ``result`` (a JSON value, dataclass
        or pydantic model), as its worker would have; from any process, at most once.

        Raises ``InvalidTaskTokenError`` for a string that is no task token and
        ``StaleTaskTokenError`` when the instance is unknown, has ended or moved on to
        another run or generation. A second completion of the same attempt, or one of an
        attempt already retried, is dropped by the processor (it logs why)."""
        token_id = _token_instance(token)
        self._command_client().send(completion(token, self.get(token_id), result))

    def fail_activity(self, token: str, error: BaseException | str) -> None:
        """Fail the attempt ``token`` names, as if the activity had raised ``error`` (an
        exception, whose ``non_retryable`` decides, or a message: a retryable failure); the
        call's retry policy decides what follows. Refusals as :meth:`complete_activity`."""
        failure = failure_of(error)
        token_id = _token_instance(token)
        self._command_client().send(completion(token, self.get(token_id), failure=failure))


def _token_instance(token: str) -> str:
    return TaskToken.decode(token).instance_id
