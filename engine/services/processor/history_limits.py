"""How large one generation's history may grow: a warning, a suggestion, then a failure.

Nothing else bounds a generation's history: a loop on ``await ctx.sleep(0)`` wrote 225,000
events in a quarter of an hour, every one of them kept in the state table (a cold turn
replays them all) and on the changelog. Like Temporal's, the bound is per generation (a
continue-as-new starts the count again) and comes in two steps, from the settings
(``engine.core.limits.HistoryLimits``) or the workflow's own
``@workflow(history_events_warn=..., history_events_max=...)``:

- from ``history_events_warn`` events or ``history_bytes_warn`` bytes on, the processor
  logs one WARNING when a turn crosses the size and tells every later turn of the
  generation to suggest a continue-as-new (``TurnStarted.continue_as_new_suggested``,
  read by the code as ``ctx.continue_as_new_suggested``; recorded, so replay agrees);
- a turn that would take the generation past ``history_events_max`` events or
  ``history_bytes_max`` bytes is not recorded: the instance fails in its place with a
  :class:`HistoryLimitExceededError` naming the limit and the setting, like the other
  engine bounds (``poison.BOUND_ERRORS``). A turn that ends the run is recorded anyway:
  its history stops growing there.

The size is cheap to know: the event count is ``next_sequence - generation_start`` and the
row keeps the encoded bytes of the current generation's events (``history_bytes``), which
the processor has in hand when it writes them.
"""

from __future__ import annotations

import logging

from engine.core.errors import HistoryLimitExceededError, TurnstileError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import ExecutionStarted, HistoryEvent, TurnStarted
from engine.core.instance_row import InstanceRow
from engine.core.limits import HistoryLimits
from engine.runtime.actions import TurnResult
from engine.services.processor.batch import Batch

log = logging.getLogger("engine.processor")

__all__ = ["exceeded", "limits_of", "note_recorded", "size", "suggests"]

#: A generation's history size: events and encoded bytes.
Size = tuple[int, int]


def limits_of(b: Batch, meta: InstanceRow) -> HistoryLimits:
    """The limits of the instance's workflow: its own event counts, else the settings'."""
    limits = b.env.history_limits
    try:
        definition = b.env.registry.get_workflow(meta.name, meta.version)
    except TurnstileError:
        return limits  # a workflow this processor does not know: the settings decide
    if definition.history_events_warn or definition.history_events_max:
        return limits.for_workflow(definition.history_events_warn, definition.history_events_max)
    return limits


def size(meta: InstanceRow) -> Size:
    """The current generation's recorded history: events and bytes."""
    return meta.next_sequence - meta.generation_start, meta.history_bytes


def suggests(b: Batch, meta: InstanceRow) -> bool:
    """Whether the coming turn suggests a continue-as-new (the generation reached a
    warning size before it)."""
    limits = limits_of(b, meta)
    events, data = size(meta)
    return events >= limits.events_warn or data >= limits.bytes_warn


def exceeded(
    b: Batch, meta: InstanceRow, result: TurnResult, sealed: list[tuple[HistoryEvent, bytes]]
) -> FailureDetails | None:
    """Why the turn may not be recorded: it takes the generation past a maximum."""
    if result.status.is_terminal:
        return None  # the run ends here: its history grows no further
    limits = limits_of(b, meta)
    events, data = _after(meta, sealed)
    if events > limits.events_max:
        what, limit, have = "events", limits.events_max, events
        where = "the setting, or @workflow(history_events_max=...)"
    elif data > limits.bytes_max:
        what, limit, have, where = "bytes", limits.bytes_max, data, "the setting"
    else:
        return None
    error = HistoryLimitExceededError(
        f"the history of instance {meta.instance_id!r} (generation {meta.generation}) would "
        f"grow to {have} {what}, past history_{what}_max={limit}: continue as new before "
        f"that (check ctx.continue_as_new_suggested in long-running loops), or raise "
        f"history_{what}_max ({where})"
    )
    return failure_from_exception(error, retryable=False)


def note_recorded(b: Batch, meta: InstanceRow, before: Size) -> None:
    """One WARNING when a turn took the generation to a warning size."""
    limits = limits_of(b, meta)
    events, data = size(meta)
    crossed = [
        f"{have} {what} (history_{what}_warn={warn})"
        for what, was, have, warn in (
            ("events", before[0], events, limits.events_warn),
            ("bytes", before[1], data, limits.bytes_warn),
        )
        if was < warn <= have
    ]
    if crossed:
        log.warning(
            "instance %s (%s): generation %d has %s of history; its code now sees "
            "ctx.continue_as_new_suggested: continue as new before history_events_max=%d "
            "or history_bytes_max=%d fails it",
            meta.instance_id,
            meta.name,
            meta.generation,
            " and ".join(crossed),
            limits.events_max,
            limits.bytes_max,
            extra={"instance_id": meta.instance_id, "generation": meta.generation},
        )


def _after(meta: InstanceRow, sealed: list[tuple[HistoryEvent, bytes]]) -> Size:
    """The generation's size once the turn is recorded (a turn that begins a generation
    counts from its TurnStarted)."""
    begins = next(
        (i for i, (event, _) in enumerate(sealed) if type(event.body) is ExecutionStarted), None
    )
    if begins is None:
        events, data = size(meta)
        return events + len(sealed), data + sum(len(raw) for _, raw in sealed)
    if begins > 0 and type(sealed[begins - 1][0].body) is TurnStarted:
        begins -= 1
    new = sealed[begins:]
    return len(new), sum(len(raw) for _, raw in new)
