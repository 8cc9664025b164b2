"""An instance's backlog: events it received but was not given yet, and the wake-up timer.

Two things follow from continue-as-new ending its turn (``engine.runtime.executor``).

*The next generation needs a turn.* Nothing may arrive for a while, so the turn that
records ``ContinuedAsNew`` also writes a timer row due at once (task id
:data:`WAKE_TIMER`, for the generation that ended), in the same transaction. When it fires
(the next batch), the instance takes a turn even with no new event, and the runtime begins
the next generation. A timer row, not a message to itself: it stays on the partition (no
record through the instance-messages topic and back, no new Command branch), it is written
and dropped with the state it belongs to, and the loop already wakes up for due timers.

*A generation is given only so many events.* Every event a generation does not read is
carried into the next one and journaled there again, so a generation that is handed a
thousand queued events and reads ten before it continues as new would journal the other 990
again in every generation: history quadratic in the backlog. So the runtime carries at
most ``EVENT_WINDOW`` unread events of a name into the next generation and hands the rest
(``ContinueAsNew.overflow``) to the processor, which keeps them in the instance row
(``InstanceRow.backlog``), oldest first. From then on, before every turn, it hands the
code events from the backlog only while fewer than ``EVENT_WINDOW`` of their name are
unread (:func:`feed`), in arrival order per name; an event that arrives while the backlog
is not empty queues behind it (:func:`deliver`), so the order of each name's events is
the order they arrived in. After a turn that left room for a name the backlog holds, the
wake-up timer brings the next turn (:func:`after_turn`), so a backlog drains over as many
turns as it needs, each event journaled at most once per generation that could read it.

Every event is read once, still waits (in the backlog or the generation), or goes to dead
letters with the reason, as a ``RaiseEvent`` record that can be sent again: when the
backlog is full (``backlog_events_max`` events, or a quarter of ``max_record_bytes``: the
row is one record) and when the run ends with events it never read.
"""

from __future__ import annotations

from engine.core import errors
from engine.core.history import EventRaised, Inbound, RuntimeStatus
from engine.core.instance_row import InstanceRow, PendingEvent
from engine.core.payloads import Payload
from engine.runtime.continuation import EVENT_WINDOW
from engine.runtime.executor import WorkflowExecution
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, accepted, refused
from engine.services.processor.pending import dead_letter_event
from engine.services.processor.state import Loaded

__all__ = ["WAKE_TIMER", "after_turn", "carry", "deliver", "feed", "give_up", "woken"]

#: Timer task id of an instance's wake-up: a generation to begin, or events to hand over.
WAKE_TIMER = -6
#: The dead-letter kinds (metrics labels) of a backlog event.
FULL = "BacklogFull"
ABANDONED = "BacklogAbandoned"

_LIVE = (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED)


def deliver(b: Batch, item: Loaded, name: str, data: Payload | None, now_ms: int) -> Verdict:
    """An event for a live instance: into its next turn, or behind its backlog."""
    meta = item.meta
    if not meta.backlog:
        item.inbox.append(Inbound(EventRaised(name, data)))
        return accepted()
    event = PendingEvent(name, data, now_ms)
    if _fits(b, meta, [*meta.backlog, event]) <= len(meta.backlog):
        reason = _full_reason(b, meta, name, len(meta.backlog))
        b.dead_letter_current(reason, kind=FULL)
        return refused(errors.PendingEventsFullError, reason)
    meta.backlog.append(event)
    b.save(meta)
    return accepted(f"queued behind {len(meta.backlog) - 1} events the instance has not read")


def carry(
    b: Batch, item: Loaded, overflow: tuple[tuple[str, Payload | None], ...], now_ms: int
) -> None:
    """A continue-as-new left more unread events than the next generation is given: they
    go before the backlog (they arrived earlier); what the bound leaves out, the newest,
    goes to dead letters."""
    meta = item.meta
    events = [PendingEvent(name, data, now_ms) for name, data in overflow] + meta.backlog
    kept = _fits(b, meta, events)
    for event in events[kept:]:
        reason = _full_reason(b, meta, event.name, kept)
        dead_letter_event(b, meta.instance_id, event, reason, FULL)
    meta.backlog = events[:kept]
    b.save(meta)


def feed(b: Batch, item: Loaded, execution: WorkflowExecution, inbox: list[Inbound]) -> None:
    """Before a turn: hand the code backlog events, oldest first, while fewer than
    ``EVENT_WINDOW`` of their name are unread (counting the turn's own events); the rest
    stay, each name's in order."""
    meta = item.meta
    if not meta.backlog:
        return
    counts = execution.unconsumed_by_name()
    for inbound in inbox:
        if type(inbound.body) is EventRaised:
            counts[inbound.body.name] = counts.get(inbound.body.name, 0) + 1
    kept = []
    for event in meta.backlog:
        count = counts.get(event.name, 0)
        if count < EVENT_WINDOW:
            counts[event.name] = count + 1
            inbox.append(Inbound(EventRaised(event.name, event.input)))
        else:
            kept.append(event)
    if len(kept) != len(meta.backlog):
        meta.backlog = kept
        b.save(meta)


def after_turn(b: Batch, item: Loaded, now_ms: int) -> None:
    """After a recorded turn: a run that ended gives its unread backlog to dead letters;
    a live one with room for a name its backlog holds is woken for another turn."""
    meta = item.meta
    if not meta.backlog:
        return
    if meta.status is not None and meta.status.is_terminal:
        give_up(b, meta, f"its run ended {meta.status.value} before reading it")
        return
    execution = item.execution
    if execution is None or meta.status not in _LIVE:
        return
    counts = execution.unconsumed_by_name()
    if any(counts.get(event.name, 0) < EVENT_WINDOW for event in meta.backlog):
        wake(b, meta.instance_id, meta.generation, now_ms)


def give_up(b: Batch, meta: InstanceRow, why: str) -> None:
    """Every backlog event goes to dead letters with ``why`` (the run will not read it)."""
    for event in meta.backlog:
        reason = (
            f"event {event.name!r} for instance {meta.instance_id} waited in its backlog, but "
            f"{why}; send the event again (this record) if a new run should read it"
        )
        dead_letter_event(b, meta.instance_id, event, reason, ABANDONED)
    meta.backlog = []
    b.save(meta)


def wake(b: Batch, instance_id: str, generation: int, now_ms: int) -> None:
    """A timer due now: the instance, still in ``generation``, takes a turn in the next
    batch."""
    b.tables.put_timer(keys.TimerKey(now_ms, instance_id, generation, WAKE_TIMER))


def woken(b: Batch, item: Loaded, timer: keys.TimerKey) -> None:
    """The wake-up fired: a live instance of that generation takes a turn (its next
    generation begins, or its backlog feeds it), even with no new event."""
    meta = item.meta
    if timer.generation == meta.generation and meta.status in _LIVE:
        item.wake = True


def _fits(b: Batch, meta: InstanceRow, events: list[PendingEvent]) -> int:
    """How many of ``events`` (from the first) the backlog's bounds hold."""
    limit, budget = b.env.backlog_events_max, b.env.limits.record // 4
    size = 0
    for index, event in enumerate(events):
        size += len(event.name) + (len(event.input.data) if event.input is not None else 0)
        if index >= limit or size > budget:
            return index
    return len(events)


def _full_reason(b: Batch, meta: InstanceRow, name: str, kept: int) -> str:
    return (
        f"event {name!r} for instance {meta.instance_id} does not fit in its backlog of "
        f"events it has not read yet ({kept} kept; at most backlog_events_max="
        f"{b.env.backlog_events_max} events and a quarter of max_record_bytes="
        f"{b.env.limits.record}); let the workflow read its events faster (continue as new "
        f"less often), raise the bound, or send the event again (this record) later"
    )
