"""One exception tree for the whole engine.

Every error a user can see derives from :class:`TurnstileError`, so ``except TurnstileError``
is always enough. Messages say what to do next, not only what went wrong. A command the
processor refused raises a :class:`CommandRefusedError` subclass (under
:class:`InstanceError`) carrying the processor's answer; one that got no answer in time
raises :class:`CommandTimeoutError` (a :class:`WaitTimeoutError`). A refused
``ctx.publish`` raises :class:`PublishError`; a malformed trigger is a
:class:`TriggerError` (a :class:`ConfigurationError`).

The tree (``(also X)``: the class also derives from the builtin X, so ``except X`` still
works where Python code expects it)::

    TurnstileError
    +-- ConfigurationError
    |   +-- TriggerError
    +-- RegistrationError
    +-- NotRegisteredError
    +-- WorkflowRuntimeError
    |   +-- NonDeterminismError
    |   +-- StepBudgetExceededError
    |   +-- WorkflowTurnTimeoutError
    |   +-- HistoryLimitExceededError
    |   +-- InstanceTurnError
    +-- RecordHandlingError
    +-- PayloadTooLargeError
    +-- WorkflowFailure
    |   +-- ActivityFailedError
    |   +-- InlineStepFailedError
    |   +-- ChildWorkflowFailedError
    |   +-- WorkflowTimeoutError
    |   +-- InstanceFailedError
    |   +-- ApplicationError
    +-- ActivityCancelledError
    +-- ActivityTimeoutError (also TimeoutError)
    +-- CodecError
    |   +-- UnknownSchemaError
    |   +-- MalformedRecordError
    +-- InstanceError
    |   +-- CommandRefusedError
    |       +-- InstanceNotFoundError
    |       +-- InstanceAlreadyExistsError
    |       |   +-- WorkflowAlreadyRunningError
    |       |   +-- WorkflowAlreadyRanError
    |       +-- InstanceNotRunningError
    |       +-- InstanceNotSuspendedError
    |       +-- InstanceAlreadySuspendedError
    |       +-- InstanceStillRunningError
    |       +-- PendingEventsFullError
    |       +-- ParkedEventsFullError
    |       +-- NoConcurrencyLimitError
    |       +-- ScheduleRefusedError
    |       |   +-- ScheduleAlreadyExistsError
    |       |   +-- ScheduleNotFoundError
    |       |   +-- ScheduleDefinitionError
    |       +-- InvalidResetPointError
    |       +-- RerunTooLargeError
    |       +-- UnknownQueryError
    |       +-- QueryFailedError
    |       +-- UnknownUpdateError
    |       +-- UpdateRejectedError
    |       +-- UpdateFailedError
    |       +-- StaleTaskTokenError
    +-- ScheduleSpecError (also ValueError)
    +-- WaitTimeoutError
    |   +-- CommandTimeoutError
    +-- BrokerError
    |   +-- BrokerUnreachableError
    |   +-- TopicDriftError
    |   +-- BrokerRefusalError
    +-- LocalKafkaError
    +-- HistoryIntegrityError
    +-- InvalidTagsError (also ValueError)
    +-- InvalidPageTokenError (also ValueError)
    +-- InvalidTaskTokenError (also ValueError)
    +-- PublishError
    +-- SchemaRegistryError

The Kafka adapters add a few :class:`BrokerError` subclasses of their own (an aborted or
fenced transaction, a rejected record, a call past its deadline) that the engine handles
itself; they never reach workflow code.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TurnstileError(Exception):
    """Base of every error raised by the engine."""


class ConfigurationError(TurnstileError):
    """Settings are missing or contradict each other."""


class RegistrationError(TurnstileError):
    """A workflow or activity could not be registered (for example a duplicate name)."""


class NotRegisteredError(TurnstileError):
    """A history or task names a workflow or activity this process does not know."""


# --- workflow execution -------------------------------------------------------------------


class WorkflowRuntimeError(TurnstileError):
    """The workflow runtime cannot go on executing an instance."""


class NonDeterminismError(WorkflowRuntimeError):
    """Workflow code asked for something different from what its history recorded.

    Raised during replay. ``sequence`` is the history sequence number of the recorded action,
    ``recorded`` and ``attempted`` describe both sides.
    """

    def __init__(self, sequence: int, recorded: str, attempted: str) -> None:
        self.sequence = sequence
        self.recorded = recorded
        self.attempted = attempted
        super().__init__(
            f"non-deterministic workflow: history event #{sequence} recorded {recorded}, "
            f"but the code now asks for {attempted}. Keep the old code path for running "
            f"instances (branch with ctx.patched, or register the change as a new version) or "
            f"let them finish before deploying this change."
        )


class StepBudgetExceededError(WorkflowRuntimeError):
    """Workflow code ran too long without awaiting anything durable (an infinite loop?)."""


class WorkflowTurnTimeoutError(WorkflowRuntimeError):
    """One turn of workflow code ran past the turn budget (a loop that never awaits?).

    Raised by the turn watchdog from outside the workflow's own control flow, so it ends
    ``while True: pass`` as well as endless chains of already-resolved awaits.
    """


class HistoryLimitExceededError(WorkflowRuntimeError):
    """A turn took its generation's history past ``history_events_max`` events or
    ``history_bytes_max`` bytes: the instance fails. Long-running workflows continue as
    new before that (``ctx.continue_as_new_suggested`` turns True at the ``*_warn``
    sizes)."""


class InstanceTurnError(WorkflowRuntimeError):
    """Finishing one instance's turn failed (a bug, a record the broker refused).

    The processor redoes the batch with this instance failed (``details`` says why, with
    the traceback) instead of stopping the replica.
    """

    def __init__(
        self, instance_id: str, message: str, details: Any = None, *, partition: int = -1
    ) -> None:
        super().__init__(f"instance {instance_id!r}: {message}")
        self.instance_id = instance_id
        self.details = details
        self.partition = partition


class RecordHandlingError(TurnstileError):
    """Handling one input record failed unexpectedly (a bug, not bad input).

    The processor redoes the batch with the record sent to dead letters (``details`` has
    the traceback) instead of stopping the replica.
    """

    def __init__(self, topic: str, partition: int, offset: int, details: Any) -> None:
        super().__init__(f"handling {topic}[{partition}]@{offset} failed: {details}")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.details = details


class PayloadTooLargeError(TurnstileError):
    """A value is larger than the size limit configured for its kind.

    ``limit_name`` is the setting to raise (for example ``max_workflow_input_bytes``),
    ``size`` and ``limit`` are in bytes, ``what`` names the value.
    """

    def __init__(self, what: str, size: int, limit_name: str, limit: int) -> None:
        self.what = what
        self.size = size
        self.limit_name = limit_name
        self.limit = limit
        super().__init__(
            f"{what} is {size} bytes, over the {limit_name} limit of {limit} bytes; pass a "
            f"smaller value (store large data elsewhere and pass a reference) or raise "
            f"{limit_name}"
        )


class WorkflowFailure(TurnstileError):
    """Base of failures that workflow code sees when something it awaited failed.

    ``details`` is a :class:`engine.core.failure.FailureDetails` with type, message, stack and
    the cause chain of the original failure.
    """

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.details = details


class ActivityFailedError(WorkflowFailure):
    """An activity failed and its retry policy gave up."""


class InlineStepFailedError(WorkflowFailure):
    """An inline step (``ctx.run``) raised."""


class ChildWorkflowFailedError(WorkflowFailure):
    """A child workflow ended FAILED, TERMINATED, CANCELLED or TIMED_OUT."""


class WorkflowTimeoutError(WorkflowFailure):
    """A wait with a timeout (event, condition, activity) ran out of time."""


class InstanceFailedError(WorkflowFailure):
    """An instance a client waited for ended FAILED, TERMINATED, CANCELLED or TIMED_OUT
    (``details``: why)."""


class ApplicationError(WorkflowFailure):
    """Raise this from activities or workflows to fail with a chosen type and retryability."""

    def __init__(
        self, message: str, *, type: str | None = None, non_retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.type = type or "ApplicationError"
        self.non_retryable = non_retryable


# --- activity attempts (raised inside activity code, on the worker) --------------------------


class ActivityCancelledError(TurnstileError):
    """The workflow stopped waiting for this activity attempt (a when_any loser, a timeout,
    a termination, the instance ended) or its heartbeat timed out: ``activity.heartbeat()``
    raises it, so a sync activity stops at its next heartbeat. Let it propagate (clean up
    in ``finally``); the worker records the attempt as cancelled, not failed."""


class ActivityTimeoutError(TurnstileError, TimeoutError):
    """A sync activity ran past its start-to-close timeout: the worker abandoned its thread
    (or killed its process, with ``--executor process``) and failed the attempt, retryably,
    so the retry policy decides what happens next."""


# --- codec --------------------------------------------------------------------------------


class CodecError(TurnstileError):
    """A record could not be encoded or decoded."""


class UnknownSchemaError(CodecError):
    """A record names a writer schema (by fingerprint) that this engine does not know."""


class MalformedRecordError(CodecError):
    """A record's bytes are not a valid single-object-encoded Avro record."""


# --- instances and client ----------------------------------------------------------------


class InstanceError(TurnstileError):
    """An operation on a workflow instance was refused."""


class CommandRefusedError(InstanceError):
    """The processor refused a command (its answer on the command-outcomes topic).

    ``outcome`` is that answer (an ``engine.core.messages.CommandOutcome``: the reason and
    the instance's status), or None when the refusal was decided without asking the
    processor (a read of the status view). Each refusal has its own subclass below, and
    each subclass its stable ``code``: the processor writes the code into the answer
    (``CommandOutcome.code``) and the client maps it back to the class, so a class can be
    renamed without breaking clients or producers in other languages.
    """

    code: ClassVar[str] = "refused"

    def __init__(self, message: str, outcome: Any = None) -> None:
        super().__init__(message)
        self.outcome = outcome


class StaleTaskTokenError(CommandRefusedError):
    """A task token whose attempt can no longer be finished or heartbeated by it: its
    instance is unknown or ended, or a later run, generation or attempt is current. The
    client refuses what its status view shows before anything is sent; the processor
    refuses a heartbeat for an attempt it does not wait for (a completion of one is dropped
    instead: see the how-to on completing activities from outside)."""

    code: ClassVar[str] = "stale_task_token"


class InstanceNotFoundError(CommandRefusedError):
    """No instance exists for the id (never started, or purged)."""

    code: ClassVar[str] = "instance_not_found"


class InstanceAlreadyExistsError(CommandRefusedError):
    """A start was refused by the ID-reuse policy."""

    code: ClassVar[str] = "instance_already_exists"


class WorkflowAlreadyRunningError(InstanceAlreadyExistsError):
    """A start under ERROR_IF_RUNNING found the instance PENDING, RUNNING, SUSPENDED or
    PARKED."""

    code: ClassVar[str] = "already_running"


class WorkflowAlreadyRanError(InstanceAlreadyExistsError):
    """A start under REJECT_DUPLICATE found an instance that already ran under the id."""

    code: ClassVar[str] = "already_ran"


class InstanceNotRunningError(CommandRefusedError):
    """The instance has ended (COMPLETED, FAILED, TERMINATED): it takes no more commands
    or events; start a new run under the id instead (``signal_with_start`` does both)."""

    code: ClassVar[str] = "instance_not_running"


class InstanceNotSuspendedError(CommandRefusedError):
    """A resume found the instance neither suspended nor parked."""

    code: ClassVar[str] = "instance_not_suspended"


class InstanceAlreadySuspendedError(CommandRefusedError):
    """A suspend found the instance suspended already."""

    code: ClassVar[str] = "already_suspended"


class InstanceStillRunningError(CommandRefusedError):
    """A purge found the instance still PENDING, RUNNING, SUSPENDED or PARKED."""

    code: ClassVar[str] = "still_running"


class PendingEventsFullError(CommandRefusedError):
    """An event for an instance that has not started found its bound of pending events
    full (``pending_events_max``); the event went to dead letters."""

    code: ClassVar[str] = "pending_events_full"


class ParkedEventsFullError(CommandRefusedError):
    """An event for a PARKED instance found the events it keeps for its retry at their
    bound (``parked_events_max``, ``parked_events_max_bytes``); the event went to dead
    letters and the instance stays parked."""

    code: ClassVar[str] = "parked_events_full"


# --- per-key concurrency limits on starts ---------------------------------------------------


class NoConcurrencyLimitError(CommandRefusedError):
    """A start named a ``concurrency_key`` for a workflow that declares no
    ``max_concurrency_per_key``, or used an instance id reserved for the limits' rows."""

    code: ClassVar[str] = "no_concurrency_limit"


# --- schedules --------------------------------------------------------------------------------


class ScheduleSpecError(TurnstileError, ValueError):
    """A schedule's definition is unusable (a bad cron expression, no interval, an unknown
    overlap policy, a name with characters ids cannot hold): raised before anything is
    sent, and by the processor for a plain producer's command (then as a refusal)."""


class ScheduleRefusedError(CommandRefusedError):
    """The processor refused a schedule command; the subclasses say why."""

    code: ClassVar[str] = "schedule_refused"


class ScheduleAlreadyExistsError(ScheduleRefusedError):
    """A create named a schedule that exists (delete it first, or pick another name)."""

    code: ClassVar[str] = "schedule_already_exists"


class ScheduleNotFoundError(ScheduleRefusedError):
    """A pause, resume, delete or trigger named no existing schedule."""

    code: ClassVar[str] = "schedule_not_found"


class ScheduleDefinitionError(ScheduleRefusedError):
    """The processor found the schedule's definition unusable (see ScheduleSpecError)."""

    code: ClassVar[str] = "schedule_definition"


# --- reset and rerun --------------------------------------------------------------------------


class InvalidResetPointError(CommandRefusedError):
    """A reset or rerun named a point its instance's current run does not have (a sequence
    number before the run's start or past its last event, a last failure in a run that has
    none), or an instance that has not started; nothing was changed."""

    code: ClassVar[str] = "invalid_reset_point"


class RerunTooLargeError(CommandRefusedError):
    """A rerun's history is more than one record can carry to the new instance id (it
    travels on instance-messages); reset in place instead, or raise max_record_bytes."""

    code: ClassVar[str] = "rerun_too_large"


class UnknownQueryError(CommandRefusedError):
    """A query named no handler the instance set (``ctx.set_query_handler``); the reason
    lists the names it knows."""

    code: ClassVar[str] = "unknown_query"


class QueryFailedError(CommandRefusedError):
    """A query could not be answered: its handler raised, returned something that is not
    JSON, tried to schedule or change anything (a query is read-only), or the instance
    has not started or cannot be replayed."""

    code: ClassVar[str] = "query_failed"


class UnknownUpdateError(CommandRefusedError):
    """An update named no handler the instance set (``ctx.set_update_handler``); the
    reason lists the names it knows. Nothing was recorded."""

    code: ClassVar[str] = "unknown_update"


class UpdateRejectedError(CommandRefusedError):
    """An update was not accepted: its validator rejected it, or the instance is parked,
    suspended, ended or not started yet (the reason says which). Nothing was recorded."""

    code: ClassVar[str] = "update_rejected"


class UpdateFailedError(CommandRefusedError):
    """An accepted update's handler raised (the reason carries its error), or the
    workflow ended before the handler finished. The update is in the history."""

    code: ClassVar[str] = "update_failed"


class WaitTimeoutError(TurnstileError):
    """A client wait (for start, for completion) ran out of time."""


class CommandTimeoutError(WaitTimeoutError):
    """A command was written but its outcome did not arrive in time (is a processor
    running?); sending it again with the same request id is safe."""


# --- infrastructure -----------------------------------------------------------------------


class BrokerError(TurnstileError):
    """Kafka could not be reached or refused an operation."""


class BrokerUnreachableError(BrokerError):
    """No Kafka broker answered at the configured address within the command's timeout."""


class TopicDriftError(BrokerError):
    """The topics on the cluster differ from the declarative spec."""


class BrokerRefusalError(BrokerError):
    """The broker refuses what a replica must write even after the instance that made it
    was failed alone (an ACL on a whole topic, a topic's size limit): recreating clients and
    rejoining would not help, so the replica stops."""


class LocalKafkaError(TurnstileError):
    """The embedded development broker could not be fetched, started or stopped."""


class HistoryIntegrityError(TurnstileError):
    """A history's hash chain is broken: events were altered, removed or reordered."""


# --- search attributes and listing --------------------------------------------------------


class InvalidTagsError(TurnstileError, ValueError):
    """Tags (search attributes) that break their bounds: not str, too many, too long."""


class InvalidPageTokenError(TurnstileError, ValueError):
    """A ``page_token`` that no list page handed out (mangled, or from another tool)."""


class InvalidTaskTokenError(TurnstileError, ValueError):
    """A task token that no activity handed out (mangled, truncated, or another string):
    pass the exact string ``current_activity().task_token`` returned."""


# --- Kafka integration: publishing from workflows, triggers -------------------------------


class PublishError(TurnstileError):
    """``ctx.publish`` was refused: the topic is not declared for publishing
    (``publish_topics``), or the value, key or headers cannot be written as asked. The
    instance fails with this error; nothing is published."""


class TriggerError(ConfigurationError):
    """A trigger (``--trigger``, ``[[triggers]]``) is malformed or names what does not
    exist."""


# --- Schema Registry ------------------------------------------------------------------------


class SchemaRegistryError(TurnstileError):
    """The Schema Registry given by ``schema_registry_url`` cannot be used: it does not
    answer, or it refuses to register or look up a schema."""
