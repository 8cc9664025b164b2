"""The history event model: what an instance's history is made of.

History is the audit record and the input to replay, so every event is a small immutable
value. The Avro schemas in ``schemas/`` mirror these classes one to one (a test keeps them
in step); ``KIND`` is the stable name that ties a class to its schema record.

Identifiers:
- ``sequence`` numbers an instance's events from 0, across generations, without gaps;
- ``generation`` starts at 0 and increases on every continue-as-new (and on a restart under
  an ID-reuse policy), so that messages aimed at an older generation can be recognised;
- ``run_id`` (in ``ExecutionStarted``) is new for every start of the id and kept across
  continue-as-new, so that messages aimed at an earlier life of a purged and reused id are
  recognised too (the generation starts at 0 again after a purge);
- ``task_id`` numbers the durable actions (activities, inline steps, child workflows, timers,
  events sent, records published) that one generation schedules, from 0, in the order the
  code asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from engine.core.failure import FailureDetails
from engine.core.payloads import Payload

#: Field metadata: a JSON history leaves the field out while it holds its empty default.
OMIT_EMPTY = "omit_empty"


class RuntimeStatus(StrEnum):
    """Where an instance stands. PARKED is the processor's own: the runtime never reaches
    it; an instance whose code raised an unexpected error waits for a fix in it
    (``engine/services/processor/parking.py``), alive like RUNNING."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TERMINATED = "TERMINATED"
    CONTINUED_AS_NEW = "CONTINUED_AS_NEW"
    PARKED = "PARKED"
    #: The code let a requested cancellation (``CancelledError``) end it.
    CANCELLED = "CANCELLED"
    #: Its ``execution_timeout`` or ``run_timeout`` fired before it ended.
    TIMED_OUT = "TIMED_OUT"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        RuntimeStatus.COMPLETED,
        RuntimeStatus.FAILED,
        RuntimeStatus.TERMINATED,
        RuntimeStatus.CANCELLED,
        RuntimeStatus.TIMED_OUT,
    }
)


class ParentClosePolicy(StrEnum):
    """What happens to a running child when its parent stops waiting for it: the parent
    ends (completes, fails, is terminated), continues as new, or a when_any drops it.

    TERMINATE (the default) terminates the child, and its own children by their policies;
    REQUEST_CANCEL sends it a cancellation it can clean up after
    (``ExecutionCancelRequested``); ABANDON leaves it running.
    """

    TERMINATE = "TERMINATE"
    ABANDON = "ABANDON"
    REQUEST_CANCEL = "REQUEST_CANCEL"


# --- event bodies -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventBody:
    KIND: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class ExecutionStarted(EventBody):
    KIND: ClassVar[str] = "ExecutionStarted"
    name: str
    input: Payload | None = None
    version: str = ""
    parent_instance_id: str | None = None
    parent_generation: int | None = None
    parent_task_id: int | None = None
    scheduled_start_ms: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    request_id: str = ""
    #: W3C trace context the run was started in (``engine.core.tracecontext``); recorded
    #: so that every replica names the same run span and no replay emits it again. JSON
    #: histories leave it out while it is empty (``OMIT_EMPTY``), so they read as before.
    traceparent: str = field(default="", metadata={OMIT_EMPTY: True})
    #: The run this generation belongs to: an id the processor makes when a start begins a
    #: run (continue-as-new copies it, like the trace context), so that whatever was sent
    #: for an earlier run of a reused instance id (after a purge) is told apart from this
    #: run's. Empty in histories from before run ids: those match by generation alone.
    run_id: str = field(default="", metadata={OMIT_EMPTY: True})
    #: The parent's run id (a child's result carries it back to the parent); "" if none.
    parent_run_id: str = field(default="", metadata={OMIT_EMPTY: True})


@dataclass(frozen=True, slots=True)
class ExecutionCompleted(EventBody):
    """The instance ended: status is COMPLETED, FAILED or TERMINATED."""

    KIND: ClassVar[str] = "ExecutionCompleted"
    status: RuntimeStatus
    output: Payload | None = None
    failure: FailureDetails | None = None


@dataclass(frozen=True, slots=True)
class ExecutionTerminated(EventBody):
    KIND: ClassVar[str] = "ExecutionTerminated"
    reason: str = ""
    recursive: bool = False
    #: Set when a workflow timeout ended the instance ("execution_timeout" or
    #: "run_timeout"): it ends TIMED_OUT instead of TERMINATED.
    timeout: str = field(default="", metadata={OMIT_EMPTY: True})


@dataclass(frozen=True, slots=True)
class ExecutionSuspended(EventBody):
    KIND: ClassVar[str] = "ExecutionSuspended"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ExecutionResumed(EventBody):
    KIND: ClassVar[str] = "ExecutionResumed"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ContinuedAsNew(EventBody):
    """Ends a generation; the next generation's ExecutionStarted follows it."""

    KIND: ClassVar[str] = "ContinuedAsNew"
    input: Payload | None = None
    new_generation: int = 0


@dataclass(frozen=True, slots=True)
class TaskScheduled(EventBody):
    """An activity attempt was handed to the workers."""

    KIND: ClassVar[str] = "TaskScheduled"
    task_id: int
    name: str
    input: Payload | None = None
    attempt: int = 1
    timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class TaskCompleted(EventBody):
    KIND: ClassVar[str] = "TaskCompleted"
    task_id: int
    output: Payload | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class TaskFailed(EventBody):
    KIND: ClassVar[str] = "TaskFailed"
    task_id: int
    failure: FailureDetails
    attempt: int = 1
    #: The attempt's last heartbeat details, handed to the next attempt (JSON histories
    #: leave it out while it is empty, ``OMIT_EMPTY``).
    details: Payload | None = field(default=None, metadata={OMIT_EMPTY: True})


@dataclass(frozen=True, slots=True)
class InlineStepCompleted(EventBody):
    """An inline step (``ctx.run``) ran in the processor; its result is journaled here."""

    KIND: ClassVar[str] = "InlineStepCompleted"
    task_id: int
    name: str
    output: Payload | None = None


@dataclass(frozen=True, slots=True)
class InlineStepFailed(EventBody):
    KIND: ClassVar[str] = "InlineStepFailed"
    task_id: int
    name: str
    failure: FailureDetails


@dataclass(frozen=True, slots=True)
class ChildWorkflowCreated(EventBody):
    KIND: ClassVar[str] = "ChildWorkflowCreated"
    task_id: int
    name: str
    instance_id: str
    input: Payload | None = None
    version: str = ""
    parent_close_policy: ParentClosePolicy = ParentClosePolicy.TERMINATE


@dataclass(frozen=True, slots=True)
class ChildWorkflowCompleted(EventBody):
    KIND: ClassVar[str] = "ChildWorkflowCompleted"
    task_id: int
    output: Payload | None = None


@dataclass(frozen=True, slots=True)
class ChildWorkflowFailed(EventBody):
    KIND: ClassVar[str] = "ChildWorkflowFailed"
    task_id: int
    failure: FailureDetails


@dataclass(frozen=True, slots=True)
class TimerCreated(EventBody):
    KIND: ClassVar[str] = "TimerCreated"
    task_id: int
    fire_at_ms: int


@dataclass(frozen=True, slots=True)
class TimerFired(EventBody):
    KIND: ClassVar[str] = "TimerFired"
    task_id: int
    fire_at_ms: int


@dataclass(frozen=True, slots=True)
class TimerCancelled(EventBody):
    KIND: ClassVar[str] = "TimerCancelled"
    task_id: int


@dataclass(frozen=True, slots=True)
class EventRaised(EventBody):
    """An external event reached the instance (from a client or another instance)."""

    KIND: ClassVar[str] = "EventRaised"
    name: str
    input: Payload | None = None


@dataclass(frozen=True, slots=True)
class EventSent(EventBody):
    KIND: ClassVar[str] = "EventSent"
    task_id: int
    target_instance_id: str
    name: str
    input: Payload | None = None


@dataclass(frozen=True, slots=True)
class CustomStatusSet(EventBody):
    KIND: ClassVar[str] = "CustomStatusSet"
    status: Payload | None = None


@dataclass(frozen=True, slots=True)
class TurnStarted(EventBody):
    """Marks the start of a turn; its time is what ``ctx.now()`` returns during that turn."""

    KIND: ClassVar[str] = "TurnStarted"
    time_ms: int
    #: The generation's history had reached its warning size (``history_events_warn`` or
    #: ``history_bytes_warn``) when the turn began: what ``ctx.continue_as_new_suggested``
    #: answers during the turn, recorded so that replay answers the same.
    continue_as_new_suggested: bool = field(default=False, metadata={OMIT_EMPTY: True})


@dataclass(frozen=True, slots=True)
class ActivityCancelRequested(EventBody):
    """The workflow stopped waiting for a running activity attempt (a when_any loser, a
    cancelled task or fiber); a late result of that attempt is rejected as stale."""

    KIND: ClassVar[str] = "ActivityCancelRequested"
    task_id: int
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class ExecutionCancelRequested(EventBody):
    """Someone asked the instance to stop (a client's ``cancel``, a parent's REQUEST_CANCEL
    policy): every fiber gets ``CancelledError`` at its current await and may clean up; the
    instance ends CANCELLED if the main coroutine lets it propagate."""

    KIND: ClassVar[str] = "ExecutionCancelRequested"
    reason: str = ""
    #: Written True since every fiber is cancelled (and an instance the cancellation ends
    #: ends CANCELLED). Histories recorded before hold False (JSON histories leave it out)
    #: and replay as they ran: only the main coroutine got ``CancelledError``, and an
    #: instance it ended ended FAILED.
    every_fiber: bool = field(default=False, metadata={OMIT_EMPTY: True})


@dataclass(frozen=True, slots=True)
class TagsUpserted(EventBody):
    """Workflow code set search attributes (``ctx.upsert_tags``): ``tags`` is merged into
    the instance's tags (an empty value removes a key), shown in its status and searched
    by ``list --tag``; replay takes the recorded values."""

    KIND: ClassVar[str] = "TagsUpserted"
    tags: dict[str, str] = field(default_factory=dict)


# --- patch markers (ctx.patched / ctx.deprecate_patch) --------------------------------------


@dataclass(frozen=True, slots=True)
class PatchMarker(EventBody):
    """The code called ``ctx.patched(patch_id)`` here and took the patched path (or called
    ``ctx.deprecate_patch(patch_id)``: ``deprecated``). Replay answers ``patched`` with True
    exactly where this marker is recorded, and False in histories recorded before the patch;
    a deprecated marker may be left unasked by code that no longer mentions the patch."""

    KIND: ClassVar[str] = "PatchMarker"
    patch_id: str
    deprecated: bool = False


# --- reset (engine reset / rerun) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutionReset(EventBody):
    """This generation is a reset: a new run built from an earlier run's history up to
    ``from_sequence`` (that run's events before the turn holding it were copied in front
    of this event and are reused; from there on the code runs again). For a rerun,
    ``source_instance_id`` names the instance the history came from ("": this one)."""

    KIND: ClassVar[str] = "ExecutionReset"
    from_sequence: int
    reason: str = ""
    request_id: str = ""
    source_instance_id: str = ""


# --- publishing (ctx.publish) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordPublished(EventBody):
    """The workflow published a record to a user topic (``ctx.publish``).

    The record went out in the transaction that recorded this event, so a read_committed
    consumer sees it exactly once, with the state change that made it; replay matches the
    event and publishes nothing. ``value`` is the value's bytes (JSON or binary); with
    ``avro_schema`` set it is the value's JSON form and the processor writes it as Avro
    binary with that schema.
    """

    KIND: ClassVar[str] = "RecordPublished"
    task_id: int
    topic: str
    value: Payload
    key: str | None = None
    #: The partition asked for; None: the key's partition (murmur2), or any without a key.
    partition: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    avro_schema: str = ""


@dataclass(frozen=True, slots=True)
class UpdateAccepted(EventBody):
    """A client's update passed its validator: its handler runs as a fiber from this turn
    on. Recorded so that replay starts the same fiber at the same point, and so that a
    retry with the same ``update_id`` is recognised instead of run twice."""

    KIND: ClassVar[str] = "UpdateAccepted"
    update_id: str
    name: str
    input: Payload | None = None


@dataclass(frozen=True, slots=True)
class UpdateCompleted(EventBody):
    """An accepted update's handler returned (``output``) or raised (``failure``): a
    decision of the code, answered to the client that sent the update."""

    KIND: ClassVar[str] = "UpdateCompleted"
    update_id: str
    output: Payload | None = None
    failure: FailureDetails | None = None


@dataclass(frozen=True, slots=True)
class UpdatesCarried(EventBody):
    """The updates earlier generations of the run completed, carried into this one right
    after its ``ExecutionStarted`` by a continue-as-new (the newest of them, within the
    bounds of ``engine.runtime.continuation``), so that a client's retry of one of them is
    answered with its first result instead of running its handler again."""

    KIND: ClassVar[str] = "UpdatesCarried"
    updates: list[UpdateCompleted] = field(default_factory=list)


EVENT_TYPES: tuple[type[EventBody], ...] = (
    ExecutionStarted,
    ExecutionCompleted,
    ExecutionTerminated,
    ExecutionSuspended,
    ExecutionResumed,
    ContinuedAsNew,
    TaskScheduled,
    TaskCompleted,
    TaskFailed,
    InlineStepCompleted,
    InlineStepFailed,
    ChildWorkflowCreated,
    ChildWorkflowCompleted,
    ChildWorkflowFailed,
    TimerCreated,
    TimerFired,
    TimerCancelled,
    EventRaised,
    EventSent,
    CustomStatusSet,
    TurnStarted,
    ActivityCancelRequested,
    ExecutionCancelRequested,
    TagsUpserted,
    PatchMarker,
    ExecutionReset,
    RecordPublished,
    UpdateAccepted,
    UpdateCompleted,
    UpdatesCarried,
)


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One entry of an instance's history (the envelope around a body).

    ``previous_hash`` and ``hash`` form a per-instance hash chain; the runtime leaves them
    empty and the processor fills them in when it writes the event (see the codec).
    """

    instance_id: str
    sequence: int
    timestamp_ms: int
    generation: int
    body: EventBody
    previous_hash: bytes = b""
    hash: bytes = b""


@dataclass(frozen=True, slots=True)
class Inbound:
    """A new event offered to an instance in a turn.

    ``generation`` is set for replies aimed at one generation (task results, timer fires,
    child results); such replies for another generation are rejected. ``None`` means the
    event belongs to whichever generation is current (external events, commands).
    """

    body: EventBody
    generation: int | None = None
