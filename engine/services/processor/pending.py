"""Events raised for an instance before it started, past their time to live.

Such an event is kept in the instance row for ``pending_events_ttl_ms``; once that passed
it leaves the row for the dead-letter topic, with the reason (as a RaiseEvent record a
tool can send again), instead of vanishing. It happens wherever the kept events are looked
at: when a new event joins them, and when the instance starts. A turn the processor had to
fail before the instance ever started (:func:`give_up`) sends its kept events the same way.
"""

from __future__ import annotations

from engine.codec import encode_message, instance_key
from engine.core.instance_row import InstanceRow, PendingEvent
from engine.core.messages import RaiseEvent
from engine.services.processor.batch import Batch
from engine.services.records import RawRecord

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
    """A kept event leaves the row for dead letters, as a RaiseEvent record (the command
    that would deliver it again) with ``reason``."""
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
