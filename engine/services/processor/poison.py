"""One bad instance or record fails alone: the quarantine, and the checks behind it.

When finishing an instance's turn goes wrong after the workflow code ran (a bug in turning
its decisions into records, a record the broker refuses), part of its output is already in
the batch. The loop then drops the whole batch (nothing is committed), reports the failure
to the partition's state machine (:meth:`PartitionProcessor.isolate`), which puts the
instance in its :class:`Quarantine`, and does the batch again: on the redo the instance's
turn is replaced by a failed end with the reason (``outcome.fail_turn``), and every other
instance of the batch goes on as usual. A record whose handler crashed is quarantined the
same way and goes to dead letters on the redo.

An entry stays until a batch that applied it commits, so a redo that aborts for another
reason applies it again.

Failures decided here (a value over its size limit, the turn budget, a refused record) are
deliberate: they fail the instance, they are never retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.errors import (
    HistoryLimitExceededError,
    InstanceTurnError,
    PayloadTooLargeError,
    StepBudgetExceededError,
    WorkflowTurnTimeoutError,
)
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import HistoryEvent
from engine.core.limits import Limits, is_summary, summarize
from engine.core.payloads import Payload
from engine.services.processor import keys

#: Errors out of a turn that the engine's own bounds raised: the turn budget, the bound of
#: events per turn, a value over its size limit, the history limit. They fail the instance
#: for good.
BOUND_ERRORS: tuple[type[Exception], ...] = (
    WorkflowTurnTimeoutError,
    StepBudgetExceededError,
    PayloadTooLargeError,
    HistoryLimitExceededError,
)


@dataclass
class Quarantine:
    """A partition's instances and input records that must fail alone on the next try."""

    instances: dict[str, FailureDetails] = field(default_factory=dict)
    records: dict[tuple[str, int], FailureDetails] = field(default_factory=dict)
    _applied_instances: set[str] = field(default_factory=set)
    _applied_records: set[tuple[str, int]] = field(default_factory=set)

    def add_instance(self, instance_id: str, details: FailureDetails) -> bool:
        """Quarantine an instance; False when it already was (failing it failed too)."""
        if instance_id in self.instances:
            return False
        self.instances[instance_id] = details
        return True

    def add_record(self, topic: str, offset: int, details: FailureDetails) -> bool:
        if (topic, offset) in self.records:
            return False
        self.records[(topic, offset)] = details
        return True

    def take_instance(self, instance_id: str) -> FailureDetails | None:
        details = self.instances.get(instance_id)
        if details is not None:
            self._applied_instances.add(instance_id)
        return details

    def take_record(self, topic: str, offset: int) -> FailureDetails | None:
        details = self.records.get((topic, offset))
        if details is not None:
            self._applied_records.add((topic, offset))
        return details

    def committed(self) -> None:
        """The batch committed: what it applied is done."""
        for instance_id in self._applied_instances:
            self.instances.pop(instance_id, None)
        for record in self._applied_records:
            self.records.pop(record, None)
        self.rolled_back()

    def rolled_back(self) -> None:
        self._applied_instances = set()
        self._applied_records = set()


#: What a failure after a refused record keeps of its values: summaries for all but tiny ones.
TINY = Limits(workflow_input=1024, custom_status=1024)


def fitting(payload: Payload | None, limit: int) -> Payload | None:
    """The payload, or its summary when it is over ``limit``."""
    if payload is None or is_summary(payload) or len(payload.data) <= limit:
        return payload
    return summarize(payload)


def check_turn(limits: Limits, events: list[HistoryEvent]) -> FailureDetails | None:
    """Why the turn's new events cannot be recorded (a value over its limit), or None."""
    error = limits.first_oversized(events)
    return None if error is None else failure_from_exception(error, retryable=False)


def turn_error(partition: int, instance_id: str, exc: BaseException) -> InstanceTurnError:
    """The error that makes the loop redo the batch with ``instance_id`` failed."""
    details = failure_from_exception(exc, retryable=False)
    return InstanceTurnError(
        instance_id,
        f"finishing its turn failed: {type(exc).__name__}: {exc}",
        details,
        partition=partition,
    )


def fit_dead_letter(value: bytes | None, reason: str, limit: int) -> tuple[bytes | None, str]:
    """A dead letter carries its record's value, cut when it would not fit in one record."""
    keep = limit // 2
    if value is None or len(value) <= keep:
        return value, reason
    return value[:keep], f"{reason} (value cut from {len(value)} to its first {keep} bytes)"


def instance_of_key(key: bytes) -> str:
    """The instance a state or timer table key belongs to ('' for bookkeeping keys)."""
    kind = key[:1]
    if kind == keys.META:
        body = key[1:]
    elif kind in (keys.HISTORY, keys.CHILD, keys.REQUEUED, keys.HEARTBEATS):
        body = key[1:].split(keys.SEP, 1)[0]
    elif kind == keys.TIMER:
        body = key[9:].split(keys.SEP, 1)[0]
    else:
        return ""
    return body.decode(errors="replace")
