"""What a turn asks the outside world to do, and what a turn returns.

The executor never performs I/O: it returns these frozen values and the processor turns
them into records (activity tasks, instance messages, timer rows, status). Every action
carries the ``generation`` it belongs to, because one turn can span two generations (a
continue-as-new cancels the old generation's timers and schedules the new one's work).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.failure import FailureDetails
from engine.core.history import HistoryEvent, Inbound, ParentClosePolicy, RuntimeStatus
from engine.core.payloads import Payload
from engine.core.task_queues import DEFAULT_TASK_QUEUE


@dataclass(frozen=True, slots=True)
class Action:
    """Base of every outbound action."""


@dataclass(frozen=True, slots=True)
class ScheduleActivity(Action):
    """Hand one activity attempt to the workers (an ``ActivityTask`` record)."""

    task_id: int
    name: str
    input: Payload | None
    attempt: int
    #: The start-to-close timeout the worker enforces (0: none).
    timeout_ms: int
    generation: int = field(kw_only=True)
    #: The task queue (and so the topic) the attempt goes to.
    task_queue: str = field(default=DEFAULT_TASK_QUEUE, kw_only=True)
    #: A worker that takes the attempt later than this after scheduling fails it (0: never).
    schedule_to_start_ms: int = field(default=0, kw_only=True)
    #: When the workflow stops waiting for the attempt (its timer or the call's
    #: schedule-to-close), epoch ms; 0: never.
    deadline_ms: int = field(default=0, kw_only=True)
    heartbeat_timeout_ms: int = field(default=0, kw_only=True)
    #: The previous attempt's last heartbeat details.
    heartbeat_details: Payload | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class CancelActivity(Action):
    """The workflow stopped waiting for this running attempt (``ActivityCancelRequested``
    is in history): whoever runs the attempt may stop it; its late result is rejected.

    ``idempotency_key`` is the call's (the ``ActivityTask``'s: the same for every attempt),
    ``attempt`` says which attempt is cancelled.
    """

    task_id: int
    name: str
    attempt: int
    idempotency_key: str
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class AbandonAttempt(Action):
    """The workflow stopped waiting for this running attempt other than by taking its
    result: its timer or the call's schedule-to-close fired, the call was cancelled, or the
    generation ended. The worker running it may stop it; a late result is rejected.

    The runtime reports each attempt when it lets go of it, so the processor tells workers
    about exactly these, with no need to compare what it sent with what is still waited
    for (which would cost every turn the number of open attempts).
    """

    task_id: int
    attempt: int
    #: The task queue the attempt was sent to (where its worker is).
    task_queue: str
    reason: str
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class RunInlineStep(Action):
    """Informational: an inline step already ran during the turn and was journaled."""

    task_id: int
    name: str
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class StartChild(Action):
    """Start a child instance (a ``StartWorkflow`` instance message with parent fields)."""

    task_id: int
    instance_id: str
    name: str
    version: str
    input: Payload | None
    parent_close_policy: ParentClosePolicy = ParentClosePolicy.TERMINATE
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class CreateTimer(Action):
    """Add a durable timer row; fire it as ``Inbound(TimerFired(...), generation)``."""

    task_id: int
    fire_at_ms: int
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class CancelTimer(Action):
    """Delete a timer row (a late fire would be rejected anyway; this keeps tables small)."""

    task_id: int
    fire_at_ms: int
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class SendEvent(Action):
    """Deliver an event to another instance (a ``RaiseEvent`` instance message)."""

    task_id: int
    target_instance_id: str
    name: str
    input: Payload | None
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class CompleteExecution(Action):
    """The instance ended; tell the parent (if any) with a ``ChildResult``."""

    status: RuntimeStatus
    output: Payload | None
    failure: FailureDetails | None
    parent_instance_id: str | None
    parent_generation: int | None
    parent_task_id: int | None
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class ContinueAsNew(Action):
    """The generation ended with ``ContinuedAsNew``: ``new_generation`` begins in the
    instance's next turn (the processor makes sure one comes). ``overflow`` holds the
    unconsumed events beyond what the new generation is given at its start (at most
    :data:`engine.runtime.continuation.EVENT_WINDOW` of each name), in arrival order, as
    (name, payload): the processor keeps them and hands them over as the code reads."""

    input: Payload | None
    new_generation: int
    generation: int = field(kw_only=True)
    overflow: tuple[tuple[str, Payload | None], ...] = field(default=(), kw_only=True)


@dataclass(frozen=True, slots=True)
class TerminateChildren(Action):
    """Terminate these child instances (recursively, unless ``recursive`` is False).
    ``every_generation`` (a
    recursive terminate of this instance) adds every child the instance row still lists,
    those of earlier generations too; otherwise (the TERMINATE parent-close policy) only
    the ones named."""

    instance_ids: tuple[str, ...]
    reason: str
    every_generation: bool = False
    #: False for the TERMINATE policy: each child then applies its own children's policies.
    recursive: bool = True
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class CancelChildren(Action):
    """Ask these child instances to cancel themselves (the REQUEST_CANCEL policy)."""

    instance_ids: tuple[str, ...]
    reason: str
    generation: int = field(kw_only=True)


def close_children(
    children: list[tuple[str, ParentClosePolicy]], reason: str, generation: int
) -> list[Action]:
    """The actions that apply each child's parent-close policy (ABANDON: none)."""
    terminate = tuple(i for i, p in children if p is ParentClosePolicy.TERMINATE)
    cancel = tuple(i for i, p in children if p is ParentClosePolicy.REQUEST_CANCEL)
    out: list[Action] = []
    if terminate:
        out.append(TerminateChildren(terminate, reason, recursive=False, generation=generation))
    if cancel:
        out.append(CancelChildren(cancel, reason, generation=generation))
    return out


@dataclass(frozen=True, slots=True)
class SetCustomStatus(Action):
    """The workflow set its custom status (publish it with the instance's metadata)."""

    status: Payload | None
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class PublishRecord(Action):
    """Produce one record to a user topic in the turn's transaction (``ctx.publish``;
    ``RecordPublished`` is in history). The processor refuses a topic that is not declared
    (``publish_topics``) and writes ``value`` as Avro when ``avro_schema`` is set."""

    task_id: int
    topic: str
    value: Payload
    key: str | None
    partition: int | None
    headers: dict[str, str]
    avro_schema: str
    generation: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class Rejected:
    """An inbound event that matched no waiting point; it was not applied or recorded."""

    inbound: Inbound
    reason: str


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The outcome of one turn.

    ``new_events`` continue the instance's sequence numbers, carry the turn's time as
    ``timestamp_ms`` and leave the hash fields empty for the processor to fill.
    """

    new_events: list[HistoryEvent]
    actions: list[Action]
    rejected: list[Rejected]
    status: RuntimeStatus
    generation: int
    next_sequence: int

    @property
    def changed(self) -> bool:
        """Whether the turn appended anything (otherwise there is nothing to commit)."""
        return bool(self.new_events)
