"""One bad instance or record fails alone: quarantine, and the failed turn that replaces it.

When finishing an instance's turn goes wrong after the workflow code ran (a bug in turning
its decisions into records, a record the broker refuses), part of its output is already in
the batch. The processor then drops the whole batch (nothing is committed), puts the
instance in this partition's :class:`Quarantine` and does the batch again: on the redo the
instance's turn is replaced by :func:`fail_turn`, which records only a FAILED end with the
reason, and every other instance of the batch goes on as usual. A record whose handler
crashed is quarantined the same way and goes to dead letters on the redo.

An entry stays until a batch that applied it commits, so a redo that aborts for another
reason applies it again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from engine.core.errors import InstanceTurnError
from engine.core.failure import FailureDetails
from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TurnStarted,
)
from engine.core.limits import Limits, is_summary, shorten_failure, summarize
from engine.core.payloads import Payload
from engine.services.processor import keys

if TYPE_CHECKING:
    from engine.services.processor.partition import Loaded, PartitionProcessor

log = logging.getLogger("engine.processor")


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


def fail_turn(
    pp: PartitionProcessor,
    item: Loaded,
    inbox: list[Inbound],
    details: FailureDetails,
    now_ms: int,
    *,
    shrink: bool = False,
) -> None:
    """End the instance FAILED in place of its turn, with ``details`` as the reason.

    A turn that starts a generation records its start first (the input summarised when it
    is over its limit), so the history stays a valid one: start, then end. ``shrink``
    (after the broker refused one of its records) summarises every value but tiny ones,
    so the failure itself is small enough to be accepted.
    """
    from engine.services.processor.handlers import save_meta
    from engine.services.processor.outcome import notify_parent, record_events

    meta = item.meta
    if meta.status is None:  # never started: only its waiting events can go
        log.warning(
            "dropping %d events raised for %s: %s",
            len(meta.pending_events),
            meta.instance_id,
            details,
        )
        meta.pending_events = []
        save_meta(pp, meta)
        return
    limits = pp.env.limits
    if shrink:
        limits = _TINY
    details = shorten_failure(details) or details
    bodies: list[object] = []
    started = next((i.body for i in inbox if isinstance(i.body, ExecutionStarted)), None)
    if isinstance(started, ExecutionStarted):
        started = replace(started, input=_fitting(started.input, limits.workflow_input))
        bodies += [TurnStarted(now_ms), started]
        meta.input = started.input
    bodies.append(ExecutionCompleted(RuntimeStatus.FAILED, None, details))
    events = [
        HistoryEvent(meta.instance_id, meta.next_sequence + i, now_ms, meta.generation, body)  # type: ignore[arg-type]
        for i, body in enumerate(bodies)
    ]
    record_events(pp, item, events)
    if item.execution is not None:
        item.execution.close()
    item.execution = None
    meta.status = RuntimeStatus.FAILED
    meta.failure = details
    meta.output = None
    meta.input = _fitting(meta.input, limits.workflow_input)
    meta.custom_status = _fitting(meta.custom_status, limits.custom_status)
    meta.last_updated_ms = now_ms
    notify_parent(pp, meta.instance_id, item, RuntimeStatus.FAILED, None, details)
    save_meta(pp, meta)
    pp.counters.completed += 1


#: What a failure after a refused record keeps of its values: summaries for all but tiny ones.
_TINY = Limits(workflow_input=1024, custom_status=1024)


def _fitting(payload: Payload | None, limit: int) -> Payload | None:
    if payload is None or is_summary(payload) or len(payload.data) <= limit:
        return payload
    return summarize(payload)


def check_turn(limits: Limits, events: list[HistoryEvent]) -> FailureDetails | None:
    """Why the turn's new events cannot be recorded (a value over its limit), or None."""
    from engine.core.failure import failure_from_exception

    error = limits.first_oversized(events)
    return None if error is None else failure_from_exception(error, retryable=False)


def turn_error(partition: int, instance_id: str, exc: BaseException) -> InstanceTurnError:
    """The error that makes the Kafka loop redo the batch with ``instance_id`` failed."""
    from engine.core.failure import failure_from_exception

    details = failure_from_exception(exc, retryable=False)
    return InstanceTurnError(
        instance_id,
        f"finishing its turn failed: {type(exc).__name__}: {exc}",
        details,
        partition=partition,
    )


def instance_of_key(key: bytes) -> str:
    """The instance a state or timer table key belongs to ('' for bookkeeping keys)."""
    kind = key[:1]
    if kind == keys.META:
        body = key[1:]
    elif kind == keys.HISTORY:
        body = key[1:].split(keys.SEP, 1)[0]
    elif kind == keys.TIMER:
        body = key[9:].split(keys.SEP, 1)[0]
    else:
        return ""
    return body.decode(errors="replace")
