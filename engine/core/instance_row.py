"""The processor's per-instance row in its state table (and on the state changelog).

It holds what the status record shows plus the engine's own bookkeeping: where the current
generation's history starts, the next sequence number, the tail of the hash chain, events
raised before the instance started, a start that waits for its scheduled time, what a
parked instance waits with (``engine/services/processor/parking.py``), and the request ids
of recent commands (``engine/services/processor/command_outcomes.py``). It is an Avro
record like every other (``schemas/InstanceRow.avsc``), so the changelog can be read by any
Avro tool and evolves under the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.concurrency import ConcurrencySlots
from engine.core.failure import FailureDetails
from engine.core.history import ParentClosePolicy, RuntimeStatus
from engine.core.messages import InstanceStatus, StartWorkflow
from engine.core.payloads import Payload, to_payload
from engine.core.schedules import ScheduleState, describe, schedule_name


@dataclass(slots=True)
class PendingEvent:
    """An event raised for an instance that has not started yet."""

    name: str
    input: Payload | None
    received_ms: int


@dataclass(slots=True)
class SeenRequest:
    """A command request id the instance answered recently, with its answer, so that the
    same command sent again (a client retry) is answered alike and not applied twice."""

    request_id: str
    received_ms: int
    result: str
    error: str = ""
    reason: str = ""


@dataclass(slots=True)
class Parked:
    """Why an instance waits for fixed code, when it is retried, and the events it keeps.

    ``inbox`` holds the inbound events of the turn that raised and of every turn since, in
    order, each as a ``HistoryEvent`` record (single-object Avro, generation -1 when the
    event named none), so that the core needs no codec and the row stays one Avro record.
    """

    attempts: int
    retry_at_ms: int
    failure: FailureDetails
    inbox: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class RunningChild:
    """A child this instance started whose result has not arrived yet."""

    instance_id: str
    generation: int
    parent_close_policy: ParentClosePolicy = ParentClosePolicy.TERMINATE


@dataclass(slots=True)
class InstanceRow:
    instance_id: str
    name: str = ""
    version: str = ""
    #: ``None`` while only pending events exist for the id (the instance has not started).
    status: RuntimeStatus | None = None
    generation: int = 0
    created_ms: int = 0
    last_updated_ms: int = 0
    input: Payload | None = None
    output: Payload | None = None
    custom_status: Payload | None = None
    failure: FailureDetails | None = None
    parent_instance_id: str | None = None
    parent_generation: int | None = None
    parent_task_id: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    request_id: str = ""
    next_sequence: int = 0
    generation_start: int = 0
    last_hash: bytes = b""
    pending_events: list[PendingEvent] = field(default_factory=list)
    scheduled_start: StartWorkflow | None = None
    #: Set while a bug in the workflow code keeps the instance waiting for a fix.
    parked: Parked | None = None
    #: Recent command request ids, oldest first (bounded by count and age: the settings
    #: ``dedup_window`` and ``dedup_window_ms``).
    seen_requests: list[SeenRequest] = field(default_factory=list)
    #: Children started by any generation whose result has not arrived, in rows written
    #: before the processor kept them in a table of their own (``processor.children``, one
    #: row per child); such rows are still read, and no new child is added here.
    children: list[RunningChild] = field(default_factory=list)
    #: An activity it waits for that a worker reported it does not serve ("": none).
    unserved: str = ""
    #: The slots row (``engine.core.concurrency.slots_id``) of the concurrency key this
    #: run holds a slot of, or waits for ("": none); released when the run ends.
    slot: str = ""
    #: Only in a slots row: the running runs and waiting starts of one (name, key).
    slots: ConcurrencySlots | None = None
    #: Only in a schedule's row (``~schedules/NAME``): the schedule and its bookkeeping.
    schedule: ScheduleState | None = None

    @property
    def exists(self) -> bool:
        return self.status is not None

    def to_status(self) -> InstanceStatus:
        if self.schedule is not None:
            return self._schedule_status(self.schedule)
        return InstanceStatus(
            instance_id=self.instance_id,
            name=self.name,
            version=self.version,
            status=self.status or RuntimeStatus.PENDING,
            generation=self.generation,
            created_ms=self.created_ms,
            last_updated_ms=self.last_updated_ms,
            input=self.input,
            output=self.output,
            custom_status=self.custom_status,
            failure=self.failure,
            parent_instance_id=self.parent_instance_id,
            tags=dict(self.tags),
            request_id=self.request_id,
            unserved=self.unserved,
            pending_reason=self._pending_reason(),
        )

    def _pending_reason(self) -> str:
        start = self.scheduled_start
        if self.status is not RuntimeStatus.PENDING or not self.slot or start is None:
            return ""
        return (
            f"waits for a slot: workflow {self.name!r} runs at most its "
            f"max_concurrency_per_key instances for concurrency key {start.concurrency_key!r}"
        )

    def _schedule_status(self, schedule: ScheduleState) -> InstanceStatus:
        """A schedule's status record: RUNNING while active, SUSPENDED while paused, its
        description as the custom status (what ``schedule describe`` and ``list`` read)."""
        return InstanceStatus(
            instance_id=self.instance_id,
            name=schedule.spec.workflow,
            version=schedule.spec.version,
            status=RuntimeStatus.SUSPENDED if schedule.paused else RuntimeStatus.RUNNING,
            created_ms=schedule.created_ms,
            last_updated_ms=self.last_updated_ms,
            input=schedule.spec.input,
            custom_status=to_payload(describe(schedule_name(self.instance_id), schedule)),
            request_id=self.request_id,
        )
