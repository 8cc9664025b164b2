"""Events raised for an instance before it started: kept, bounded, and expired.

Such an event is kept in the instance row (:func:`keep`), at most ``pending_events_max``
of them and half of ``max_record_bytes`` in all, for ``pending_events_ttl_ms``; once that
passed it leaves the row for the dead-letter topic, with the reason (as a RaiseEvent
record a tool can send again), instead of vanishing. A timer (task id
:data:`PENDING_TIMER`, at the oldest kept event's expiry) makes that happen on time even
for an id that never starts, and removes the row once nothing else is left in it; the
kept events are also checked when a new event joins them and when the instance starts. A
turn the processor had to fail before the instance ever started (:func:`give_up`) sends
its kept events the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime

from engine.codec import encode_message, instance_key
from engine.core import errors
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow, PendingEvent
from engine.core.messages import RaiseEvent, StartWorkflow
from engine.core.payloads import Payload
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, buffered, refused
from engine.services.processor.state import Loaded
from engine.services.records import RawRecord

#: Timer task id of the expiry of the oldest event kept for an instance not started yet.
PENDING_TIMER = -5

#: The dead-letter kind (a metrics label) of an event that waited too long.
EXPIRED = "PendingEventExpired"
#: The dead-letter kind of a kept event whose never-started instance's turn failed.
ABANDONED = "PendingEventAbandoned"


def unexpired(b: Batch, meta: InstanceRow, now_ms: int) -> list[PendingEvent]:
    """The instance's kept events still within their time to live, in arrival order;
    the others go to dead letters (the caller stores the list it keeps)."""
    ttl = b.env.pending_events_ttl_ms
    kept = []
    for event in meta.pending_events:
        if event.received_ms >= now_ms - ttl:
            kept.append(event)
        else:
            waited_s = (now_ms - event.received_ms) / 1000
            reason = (
                f"event {event.name!r} for instance {meta.instance_id} waited {waited_s:.0f}s "
                f"for the instance to start, longer than pending_events_ttl_ms ({ttl} ms); "
                f"start the instance sooner, raise the setting, or send the event again "
                f"(this record)"
            )
            dead_letter_event(b, meta.instance_id, event, reason, EXPIRED)
    return kept


def keep(b: Batch, meta: InstanceRow, name: str, data: Payload | None, now: int) -> Verdict:
    """Keep an event for an instance that has not started (no row, or PENDING), or refuse
    it past the bound (the record goes to dead letters); the answer says until when."""
    kept = unexpired(b, meta, now)
    if len(kept) != len(meta.pending_events):
        meta.pending_events = kept
        b.save(meta)
    held = sum(len(e.input.data) for e in kept if e.input is not None)
    size = len(data.data) if data is not None else 0
    if len(kept) >= b.env.pending_events_max or held + size > b.env.limits.record // 2:
        reason = (
            f"instance {meta.instance_id} has not started and already holds "
            f"{len(kept)} pending events of {held} bytes (pending_events_max, and half of "
            f"max_record_bytes in all); start it or raise the bound"
        )
        b.dead_letter_current(reason, kind="PendingEventsFull")
        return refused(errors.PendingEventsFullError, reason)
    kept.append(PendingEvent(name, data, now))
    meta.pending_events = kept
    if len(kept) == 1:
        _arm(b, meta)
    b.save(meta)
    return buffered(_kept_text(b, meta, _expiry(b, now)))


def _kept_text(b: Batch, meta: InstanceRow, expires_ms: int) -> str:
    """What becomes of an event kept for ``meta``'s start, exactly."""
    ttl = b.env.pending_events_ttl_ms
    until = (
        f"the event is kept until it starts, at most pending_events_ttl_ms ({ttl} ms): if "
        f"it has not started by {_iso(expires_ms)}, the event goes to dead letters"
    )
    start = meta.scheduled_start
    if meta.status is not RuntimeStatus.PENDING:
        return f"instance {meta.instance_id} has not started yet; {until}"
    if meta.slot:
        return (
            f"instance {meta.instance_id} waits as PENDING for a slot of its concurrency key "
            f"{meta.concurrency_key!r} (workflow {meta.name!r}); {until}"
        )
    when = start.scheduled_start_ms if isinstance(start, StartWorkflow) else None
    if when is None:
        return f"instance {meta.instance_id} is PENDING; {until}"
    later = " (its scheduled start is later: the event will be in dead letters first)"
    return (
        f"instance {meta.instance_id} waits for its scheduled start at {_iso(when)}; {until}"
        f"{later if when >= expires_ms else ''}"
    )


def expire_due(b: Batch, item: Loaded, now_ms: int) -> None:
    """The oldest kept event's time to live ran out (:data:`PENDING_TIMER`): expired
    events go to dead letters, the timer follows the next oldest, and a row that holds
    nothing else (an id that never started) is removed."""
    meta = item.meta
    kept = unexpired(b, meta, now_ms)
    if len(kept) == len(meta.pending_events):  # a stale timer: its event was delivered
        if kept:
            _arm(b, meta)  # the oldest left (its timer is this same key, or a later one)
        return
    meta.pending_events = kept
    b.save(meta)
    if kept:
        _arm(b, meta)
    elif not meta.exists and meta.schedule is None and meta.slots is None:
        b.remove(meta)
        item.meta = InstanceRow(meta.instance_id)


def _arm(b: Batch, meta: InstanceRow) -> None:
    """The timer at the oldest kept event's expiry."""
    oldest = meta.pending_events[0]
    key = keys.TimerKey(_expiry(b, oldest.received_ms), meta.instance_id, 0, PENDING_TIMER)
    b.tables.put_timer(key)


def _expiry(b: Batch, received_ms: int) -> int:
    """The first time at which an event received at ``received_ms`` is past its TTL."""
    return received_ms + b.env.pending_events_ttl_ms + 1


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


def give_up(b: Batch, meta: InstanceRow, why: str) -> None:
    """Every kept event of a never-started instance goes to dead letters with ``why``
    (the caller stores the row)."""
    for event in meta.pending_events:
        reason = (
            f"event {event.name!r} for instance {meta.instance_id} was kept for its start, "
            f"but {why}; send the event again (this record) once the cause is fixed"
        )
        dead_letter_event(b, meta.instance_id, event, reason, ABANDONED)
    meta.pending_events = []


def dead_letter_event(
    b: Batch, instance_id: str, event: PendingEvent, reason: str, kind: str
) -> None:
    """Send a kept event to dead letters with ``reason``, as the ``RaiseEvent`` record a
    tool can send again (``kind`` is its metrics label)."""
    raised = RaiseEvent(instance_id=instance_id, name=event.name, input=event.input)
    record = RawRecord(
        partition=b.partition,
        offset=-1,
        key=instance_key(instance_id),
        value=encode_message(raised),
        timestamp_ms=event.received_ms,
        topic=b.env.topics.commands,
    )
    b.dead_letter(record, reason, kind=kind)
