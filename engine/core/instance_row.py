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
from datetime import UTC, datetime

from engine.core.concurrency import ConcurrencySlots
from engine.core.failure import FailureDetails
from engine.core.history import ParentClosePolicy, RuntimeStatus
from engine.core.messages import InstanceStatus, RerunFrom, ResetWorkflow, StartWorkflow
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
    code: str = ""


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
    #: What a PENDING instance begins with when its time or its slot comes: its start, or
    #: a reset or rerun that waits for a slot of its concurrency key (a Command record).
    scheduled_start: StartWorkflow | ResetWorkflow | RerunFrom | None = None
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
    #: The concurrency key of the current run's start ("": none), kept after the run
    #: ends, so that a reset of it takes a slot of the same key as a start would.
    concurrency_key: str = ""
    #: The current run's id (``ExecutionStarted.run_id``; "" for runs from before run ids)
    #: and its parent's run, which its result names.
    run_id: str = ""
    parent_run_id: str = ""
    #: Events received but not given to the code yet, oldest first: those a continue-as-new
    #: carried beyond what a generation takes at once, and those that arrived behind them
    #: (``engine/services/processor/backlog.py``).
    backlog: list[PendingEvent] = field(default_factory=list)
    #: Encoded bytes of the current generation's history events (its count is
    #: ``next_sequence - generation_start``), for the history limits.
    history_bytes: int = 0
    #: The run timeout of this chain of runs (ms; 0: none), armed again for every run a
    #: continue-as-new begins, and when the chain times out as a whole (0: never).
    run_timeout_ms: int = 0
    execution_deadline_ms: int = 0
    #: The chain's execution timeout (ms; 0: none): a reset starts it again from the reset.
    execution_timeout_ms: int = 0

    @property
    def exists(self) -> bool:
        return self.status is not None

    @property
    def reported_status(self) -> RuntimeStatus | None:
        """The status the instance shows (status record, command answers, metrics):
        PARKED while a bug in its code keeps it waiting for a fix, else :attr:`status`.

        ``status`` itself stays what the history says (RUNNING or SUSPENDED), so a retry
        that runs on, or a termination, needs no other bookkeeping to leave PARKED."""
        if self.parked is not None and self.status is not None and not self.status.is_terminal:
            return RuntimeStatus.PARKED
        return self.status

    def to_status(self) -> InstanceStatus:
        if self.schedule is not None:
            return self._schedule_status(self.schedule)
        parked = self.parked if self.reported_status is RuntimeStatus.PARKED else None
        return InstanceStatus(
            instance_id=self.instance_id,
            name=self.name,
            version=self.version,
            status=self.reported_status or RuntimeStatus.PENDING,
            generation=self.generation,
            created_ms=self.created_ms,
            last_updated_ms=self.last_updated_ms,
            input=self.input,
            output=self.output,
            custom_status=self.custom_status,
            failure=self.failure if parked is None else parked.failure,
            parent_instance_id=self.parent_instance_id,
            tags=dict(self.tags),
            request_id=self.request_id,
            unserved=self.unserved,
            pending_reason=self._pending_reason() if parked is None else parked_reason(parked),
            run_id=self.run_id,
        )

    def _pending_reason(self) -> str:
        if self.status is not RuntimeStatus.PENDING or not self.slot:
            return ""
        start = self.scheduled_start
        key = self.concurrency_key
        if isinstance(start, StartWorkflow):
            key = key or start.concurrency_key  # a row from before the field
        what = (
            f" (a {start.KIND} waits to run)"
            if isinstance(start, ResetWorkflow | RerunFrom)
            else ""
        )
        return (
            f"waits for a slot: workflow {self.name!r} runs at most its "
            f"max_concurrency_per_key instances for concurrency key {key!r}{what}"
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


def parked_reason(parked: Parked) -> str:
    """Why a PARKED instance waits and what brings it back (its status record's reason)."""
    when = datetime.fromtimestamp(parked.retry_at_ms / 1000, UTC).isoformat(timespec="seconds")
    failure = parked.failure
    return (
        f"waits for fixed code: its workflow code raised {failure.type}: {failure.message} "
        f"(attempt {parked.attempts}); it keeps {len(parked.inbox)} event(s) and retries at "
        f"{when} with the code deployed then; deploy a fix and 'turnstile retry', or "
        f"'turnstile terminate' it"
    )
