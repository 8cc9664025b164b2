"""Records that cross topics other than history: commands, instance messages, activity tasks
and results, status records and dead letters.

Commands are the public inbound contract: any Kafka producer can write them from the Avro
schemas in ``schemas/`` alone. Instance messages carry work between instances (a child start,
a child's result, an event sent by one instance to another) and reuse the command records
where the meaning is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from engine.core.failure import FailureDetails
from engine.core.history import RuntimeStatus
from engine.core.idempotency import call_key
from engine.core.payloads import Payload
from engine.core.schedules import ScheduleOp, ScheduleSpec


class IdReusePolicy(StrEnum):
    """What a start does when an instance with the same id already exists.

    An instance that has ended (COMPLETED, FAILED, TERMINATED) is always replaced by a new
    run, except under REJECT_DUPLICATE.
    """

    ERROR_IF_RUNNING = "ERROR_IF_RUNNING"
    IGNORE_IF_RUNNING = "IGNORE_IF_RUNNING"
    TERMINATE_IF_RUNNING = "TERMINATE_IF_RUNNING"
    REJECT_DUPLICATE = "REJECT_DUPLICATE"


@dataclass(frozen=True, slots=True)
class Message:
    """Base of every record keyed by an instance id."""

    KIND: ClassVar[str] = ""
    instance_id: str


@dataclass(frozen=True, slots=True)
class StartWorkflow(Message):
    KIND: ClassVar[str] = "StartWorkflow"
    name: str = ""
    input: Payload | None = None
    version: str = ""
    reuse_policy: IdReusePolicy = IdReusePolicy.ERROR_IF_RUNNING
    request_id: str = ""
    scheduled_start_ms: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    parent_instance_id: str | None = None
    parent_generation: int | None = None
    parent_task_id: int | None = None
    #: Counts the start against its workflow's ``max_concurrency_per_key`` for this key
    #: ("": no limit); a start over the limit waits as PENDING for a slot.
    concurrency_key: str = ""
    #: The run of the parent that starts this child (its result names it, so a parent
    #: whose id was purged and reused never takes a result meant for its earlier run).
    parent_run_id: str = ""
    #: The whole chain of runs (across continue-as-new) ends TIMED_OUT this long after the
    #: start; and each run this long after it began (0: the workflow's own, if any).
    execution_timeout_ms: int = 0
    run_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class RaiseEvent(Message):
    KIND: ClassVar[str] = "RaiseEvent"
    name: str = ""
    input: Payload | None = None
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class TerminateWorkflow(Message):
    KIND: ClassVar[str] = "TerminateWorkflow"
    reason: str = ""
    recursive: bool = False
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class SuspendWorkflow(Message):
    KIND: ClassVar[str] = "SuspendWorkflow"
    reason: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class ResumeWorkflow(Message):
    KIND: ClassVar[str] = "ResumeWorkflow"
    reason: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class PurgeWorkflow(Message):
    KIND: ClassVar[str] = "PurgeWorkflow"
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class SignalWithStart(Message):
    """Start the instance unless it runs, then deliver an event to it, in one turn.

    Under the default ``reuse_policy`` (IGNORE_IF_RUNNING: the start is ignored, not the
    event) a live instance (RUNNING, SUSPENDED, PARKED) just receives the event, a PENDING
    one keeps it until it starts, and otherwise (never started, or ended) a new run starts
    with the event as its first input after the start, so the event can never be lost
    between the two. ERROR_IF_RUNNING refuses a live or PENDING instance,
    TERMINATE_IF_RUNNING replaces it by the new run, REJECT_DUPLICATE refuses an ended one
    (and delivers to a live one) - as a start under the same policy would judge the id.
    """

    KIND: ClassVar[str] = "SignalWithStart"
    name: str = ""
    input: Payload | None = None
    version: str = ""
    request_id: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    event_name: str = ""
    event_input: Payload | None = None
    reuse_policy: IdReusePolicy = IdReusePolicy.IGNORE_IF_RUNNING
    #: The workflow timeouts of the run the start half begins, as :class:`StartWorkflow`'s.
    execution_timeout_ms: int = 0
    run_timeout_ms: int = 0


# --- reset and rerun ------------------------------------------------------------------------


class ResetTarget(StrEnum):
    """Where a :class:`ResetWorkflow` starts the new run from."""

    #: The turn holding event ``sequence`` of the current run.
    SEQUENCE = "SEQUENCE"
    #: The run's last failure (a failed activity, inline step or child, or the run's own
    #: FAILED end; in a turn with several, the first: the activity that failed the run).
    LAST_FAILURE = "LAST_FAILURE"
    #: The first turn: only the start is kept, everything is done again.
    FIRST_TURN = "FIRST_TURN"


@dataclass(frozen=True, slots=True)
class CancelWorkflow(Message):
    """Ask an instance to cancel itself: its code gets ``CancelledError`` at its current
    await and may clean up (unlike a termination, which stops it at once). Sent by clients
    on the commands topic (answered by ``request_id``) and by a parent's REQUEST_CANCEL
    policy on ``instance-messages`` (no request id, no answer)."""

    KIND: ClassVar[str] = "CancelWorkflow"
    reason: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class ResetWorkflow(Message):
    """Start a new run of the instance from its current run's history up to a point.

    The events before the turn that holds the point are kept (their results are reused),
    everything from there on is done again by the code; events raised after the point are
    delivered again. With ``new_instance_id`` (a rerun) the new run is a new instance and
    the source keeps running as it was.
    """

    KIND: ClassVar[str] = "ResetWorkflow"
    target: ResetTarget = ResetTarget.SEQUENCE
    sequence: int = 0
    reason: str = ""
    request_id: str = ""
    new_instance_id: str = ""


@dataclass(frozen=True, slots=True)
class QueryWorkflow(Message):
    """Ask an instance's query handler ``name`` for a value (read-only: nothing is
    recorded). ``input`` is the JSON list of the handler's arguments; the answer is the
    command outcome, with the handler's return value in its ``output``."""

    KIND: ClassVar[str] = "QueryWorkflow"
    name: str = ""
    input: Payload | None = None
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class UpdateWorkflow(Message):
    """Ask an instance's update handler ``name`` to run with the argument ``input`` (a
    JSON value). ``request_id`` is the update id: a retry with the same id gets the first
    answer. Answered (on command-outcomes, the handler's value in ``output``) when the
    handler finishes, possibly turns later; a rejection writes no history."""

    KIND: ClassVar[str] = "UpdateWorkflow"
    name: str = ""
    input: Payload | None = None
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class UpdateWithStart(Message):
    """Start the instance unless it runs, then run update ``update_name`` on it, in one
    command: the start's turn runs first (so the code sets its handlers), the update right
    after it. ``request_id`` is the update id; ``reuse_policy`` judges an existing
    instance as for :class:`SignalWithStart`. Answered like :class:`UpdateWorkflow`."""

    KIND: ClassVar[str] = "UpdateWithStart"
    name: str = ""
    input: Payload | None = None
    version: str = ""
    request_id: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    update_name: str = ""
    update_input: Payload | None = None
    reuse_policy: IdReusePolicy = IdReusePolicy.IGNORE_IF_RUNNING
    #: The workflow timeouts of the run the start half begins, as :class:`StartWorkflow`'s.
    execution_timeout_ms: int = 0
    run_timeout_ms: int = 0


COMMAND_TYPES: tuple[type[Message], ...] = (
    StartWorkflow,
    RaiseEvent,
    TerminateWorkflow,
    SuspendWorkflow,
    ResumeWorkflow,
    PurgeWorkflow,
    SignalWithStart,
    ResetWorkflow,
    QueryWorkflow,
    CancelWorkflow,
    UpdateWorkflow,
    UpdateWithStart,
)


class SlotOp(StrEnum):
    """What a :class:`ConcurrencySlot` message asks or tells."""

    ACQUIRE = "ACQUIRE"
    GRANT = "GRANT"
    RELEASE = "RELEASE"


@dataclass(frozen=True, slots=True)
class ConcurrencySlot(Message):
    """Between instances only: a start under a per-key concurrency limit asks the slots
    row (``instance_id``, see ``engine.core.concurrency.slots_id``) for a slot (ACQUIRE),
    is admitted by a GRANT sent back to it (``instance_id`` = the holder), and gives the
    slot back when its run ends (RELEASE)."""

    KIND: ClassVar[str] = "ConcurrencySlot"
    op: SlotOp = SlotOp.ACQUIRE
    holder: str = ""
    generation: int = 0
    limit: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleCommand(Message):
    """Create, pause, resume, delete or trigger a schedule (``engine.core.schedules``).

    Keyed by the schedule's row id (``~schedules/NAME``, ``schedules.schedule_id``), so
    every command of one schedule reaches the one partition that owns it, in order.
    ``spec`` is the definition (CREATE only); ``reason`` is kept with a pause."""

    KIND: ClassVar[str] = "ScheduleCommand"
    op: ScheduleOp = ScheduleOp.CREATE
    spec: ScheduleSpec | None = None
    request_id: str = ""
    reason: str = ""


#: Commands on the commands topic beyond the instance commands of COMMAND_TYPES.
ENGINE_COMMAND_TYPES: tuple[type[Message], ...] = (ScheduleCommand,)


@dataclass(frozen=True, slots=True)
class RerunFrom(Message):
    """Between instances only: the second half of a rerun. The source instance sends the
    history it keeps (``history``: its events up to the reset point, each a single-object
    ``HistoryEvent`` record) to the new instance id, which starts its run from them and
    answers the rerun's request."""

    KIND: ClassVar[str] = "RerunFrom"
    source_instance_id: str = ""
    from_sequence: int = 0
    reason: str = ""
    request_id: str = ""
    history: list[bytes] = field(default_factory=list)
    #: The source run's concurrency key: the new run takes a slot of it, as a start would.
    concurrency_key: str = ""


COMMAND_BODY_TYPES: tuple[type[Message], ...] = (
    StartWorkflow,
    RaiseEvent,
    TerminateWorkflow,
    SuspendWorkflow,
    ResumeWorkflow,
    PurgeWorkflow,
    SignalWithStart,
    CancelWorkflow,
    ConcurrencySlot,
    *ENGINE_COMMAND_TYPES,
    ResetWorkflow,
    RerunFrom,
    QueryWorkflow,
    UpdateWorkflow,
    UpdateWithStart,
)
"""Every branch of the Command union, in the union's order (a new kind goes last); the
commands topic accepts only COMMAND_TYPES."""


@dataclass(frozen=True, slots=True)
class ChildResult(Message):
    """A child's outcome, sent to its parent (``instance_id`` is the parent)."""

    KIND: ClassVar[str] = "ChildResult"
    generation: int = 0
    task_id: int = 0
    child_instance_id: str = ""
    status: RuntimeStatus = RuntimeStatus.COMPLETED
    output: Payload | None = None
    failure: FailureDetails | None = None
    #: The parent run the result is for ("" from before run ids: matched by generation).
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class ActivityTask(Message):
    """One attempt of an activity, for the workers."""

    KIND: ClassVar[str] = "ActivityTask"
    generation: int = 0
    task_id: int = 0
    attempt: int = 1
    name: str = ""
    input: Payload | None = None
    #: The start-to-close timeout of the attempt, from when a worker starts it (0: none).
    timeout_ms: int = 0
    scheduled_ms: int = 0
    task_queue: str = "default"
    schedule_to_start_ms: int = 0
    #: When the workflow stops waiting for the attempt, epoch ms; 0: never.
    deadline_ms: int = 0
    heartbeat_timeout_ms: int = 0
    #: The previous attempt's last heartbeat details: a checkpoint to resume from.
    heartbeat_details: Payload | None = None
    #: The run that called it (its result carries it back; "" from before run ids).
    run_id: str = ""

    @property
    def idempotency_key(self) -> str:
        """``instance/run id/generation/task id``: one per activity call, the same for
        every attempt and redelivery of it (a retry after a timed-out attempt that did
        succeed must not pay twice), and new for a later run of a reused instance id;
        ``attempt`` says which attempt this is. Runs from before run ids have
        ``instance/generation/task id``."""
        return call_key(self.instance_id, self.run_id, self.generation, self.task_id)

    @property
    def attempt_label(self) -> str:
        """The call and its attempt, for log lines: ``instance/generation/task#attempt``."""
        return f"{self.idempotency_key}#{self.attempt}"


@dataclass(frozen=True, slots=True)
class ActivityCancel(Message):
    """The workflow stopped waiting for this attempt: the worker running it stops it. It
    travels on the attempt's task-queue topic, keyed by instance id, so it reaches the
    worker that owns the task's partition, after the task itself."""

    KIND: ClassVar[str] = "ActivityCancel"
    generation: int = 0
    task_id: int = 0
    attempt: int = 1
    reason: str = ""
    #: The run whose attempt it stops ("" from before run ids).
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class ActivityResult(Message):
    KIND: ClassVar[str] = "ActivityResult"
    generation: int = 0
    task_id: int = 0
    attempt: int = 1
    output: Payload | None = None
    failure: FailureDetails | None = None
    #: Set instead of an outcome by a worker that received the task but does not register
    #: the activity (it put the task back on its queue for a worker that does).
    unserved: str = ""
    #: A failed attempt's last heartbeat details (for the next attempt).
    details: Payload | None = None
    #: The run whose attempt it is (copied from the task; "" from before run ids).
    run_id: str = ""
    #: Set instead of an outcome by a worker that read a *requeued* copy of the task (one
    #: that went back to its queue unserved): the partition of the queue's topic the copy
    #: is on, so that a cancellation of the attempt is sent there (-1: not a requeued
    #: copy). Sent after the copy was read, so a cancellation sent on it comes after it.
    requeued_to: int = -1
    #: How often that copy went back to its queue (the ``turnstile-requeues`` header): the
    #: latest of the copies' notes names where the attempt is now.
    requeues: int = 0
    #: The task queue of that copy (where its cancellation goes).
    task_queue: str = ""
    #: Set instead of an outcome by the holder of the task token of an attempt that
    #: completes later: a heartbeat (``details``: its details, kept for the next attempt),
    #: answered on command-outcomes under ``request_id``.
    heartbeat: bool = False
    #: Set instead of an outcome by a worker whose attempt's body called ``complete_later()``
    #: on a call with a heartbeat timeout (``details``: its last heartbeat's): from now on
    #: the processor times the attempt's heartbeats, at most this long between two.
    heartbeat_timeout_ms: int = 0
    #: The request id of a heartbeat (its answer's key).
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class InstanceStatus(Message):
    """The latest metadata of an instance, kept on the compacted status topic."""

    KIND: ClassVar[str] = "InstanceStatus"
    name: str = ""
    version: str = ""
    status: RuntimeStatus = RuntimeStatus.PENDING
    generation: int = 0
    created_ms: int = 0
    last_updated_ms: int = 0
    input: Payload | None = None
    output: Payload | None = None
    custom_status: Payload | None = None
    failure: FailureDetails | None = None
    parent_instance_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    request_id: str = ""
    #: An activity it waits for that a worker reported it does not serve ("": none).
    unserved: str = ""
    #: Why the instance waits instead of running ("": it does not, or a PENDING one waits
    #: for its scheduled time): a PENDING one for a slot of its concurrency key, a PARKED
    #: one for fixed code (the error is in ``failure``; the attempts and next retry here).
    pending_reason: str = ""
    #: The id of its current run (a later start of the same id gets another one).
    run_id: str = ""


class CommandResult(StrEnum):
    """How the processor answered a command."""

    ACCEPTED = "ACCEPTED"
    #: Kept, not applied yet: an event for an instance that has not started (kept until it
    #: starts, at most ``pending_events_ttl_ms``) or that is PARKED (kept for its retry),
    #: a start that waits for a slot, a suspension of a PARKED instance.
    BUFFERED = "BUFFERED"
    REFUSED = "REFUSED"


@dataclass(frozen=True, slots=True)
class CommandOutcome(Message):
    """The processor's answer to one command, on the command-outcomes topic.

    Produced in the transaction of the turn that handled the command, keyed by instance id.
    ``code`` is a refusal's stable code (``instance_not_found``, ``already_running``, ...:
    ``CommandRefusedError.code``; empty unless REFUSED, and in answers written before codes
    existed); ``error`` is the class name of the error a client raises, kept for clients
    that predate codes; ``status`` and ``generation`` are the instance's after
    the command (status None: the id has no instance). ``duplicate`` marks the answer to a
    command whose request id was seen before: it repeats the first answer and nothing was
    applied again. ``output`` is the answer's value (a query's result; None otherwise).
    """

    KIND: ClassVar[str] = "CommandOutcome"
    request_id: str = ""
    command: str = ""
    result: CommandResult = CommandResult.ACCEPTED
    reason: str = ""
    error: str = ""
    status: RuntimeStatus | None = None
    duplicate: bool = False
    timestamp_ms: int = 0
    generation: int = 0
    code: str = ""
    output: Payload | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter(Message):
    """An input record the engine could not use, kept with the reason it was refused.

    ``instance_id`` is the original key decoded as UTF-8 where possible (else empty).
    """

    KIND: ClassVar[str] = "DeadLetter"
    reason: str = ""
    source_topic: str = ""
    source_partition: int = 0
    source_offset: int = 0
    key: bytes | None = None
    value: bytes | None = None
    timestamp_ms: int = 0
