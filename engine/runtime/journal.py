"""The journal: the current generation's history, and replay matching.

Every decision the workflow code makes (schedule an activity, run an inline step, start a
child, create or cancel a timer, send an event, publish a record, set a custom status or
tags, complete an update, end) is a *command* event in history. Live, a command is appended
with the next sequence number. During replay the code runs again and each command it asks
for is matched, in order, against the command events that the same turn recorded; a
difference raises :class:`NonDeterminismError` naming the recorded event's sequence number
and both sides.

What counts as a difference: the kind of command always; the task id (which encodes the
order); an activity's name, input and attempt; an inline step's name; a child workflow's
name; an event's target and name; a published record's topic; the status an instance ends
with. A timer's fire time, an activity's timeout, a child's input, a published record's
value, a custom status value and upserted tags may change between deployments without
breaking running instances (the recorded values stay in force).

Patch markers (``ctx.patched``) are decisions too, but a recorded marker is looked up rather
than demanded: :meth:`Journal.patch` consumes it when the code asks for its patch id at that
point and answers None (the history predates the patch) otherwise. A marker the code never
asks for is a difference like any other, unless it is *deprecated* (``ctx.deprecate_patch``):
those are skipped, so the call can finally be removed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from engine.core.errors import NonDeterminismError
from engine.core.history import (
    ActivityCancelRequested,
    ChildWorkflowCreated,
    ContinuedAsNew,
    CustomStatusSet,
    EventBody,
    EventSent,
    ExecutionCompleted,
    HistoryEvent,
    InlineStepCompleted,
    InlineStepFailed,
    PatchMarker,
    RecordPublished,
    TagsUpserted,
    TaskScheduled,
    TimerCancelled,
    TimerCreated,
    UpdateCompleted,
)
from engine.core.payload_codecs import CHAIN_MARK
from engine.core.payloads import Payload, same_payload
from engine.runtime.actions import Action
from engine.runtime.interrupt import DEFAULT_MAX_TURN_EVENTS, too_many_events

B = TypeVar("B", bound=EventBody)

DECISION_TYPES: frozenset[type[EventBody]] = frozenset(
    {
        TaskScheduled,
        InlineStepCompleted,
        InlineStepFailed,
        ChildWorkflowCreated,
        TimerCreated,
        TimerCancelled,
        EventSent,
        CustomStatusSet,
        ExecutionCompleted,
        ContinuedAsNew,
        ActivityCancelRequested,
        TagsUpserted,
        PatchMarker,
        RecordPublished,
        UpdateCompleted,
    }
)
"""Event kinds that workflow code decides (everything else is applied from outside)."""


def _same_task(a: Any, b: Any) -> bool:
    return bool(a.task_id == b.task_id)


def _same_payload(a: Payload | None, b: Payload | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.data == b.data and a.encoding == b.encoding:
        return True
    return same_payload(a, b)  # equal once a codec chain (new bytes each time) is undone


def _same_activity(a: TaskScheduled, b: TaskScheduled) -> bool:
    return (
        a.task_id == b.task_id
        and a.name == b.name
        and a.attempt == b.attempt
        and _same_payload(a.input, b.input)
    )


def _same_named_task(a: Any, b: Any) -> bool:
    return bool(a.task_id == b.task_id and a.name == b.name)


def _same_event_sent(a: EventSent, b: EventSent) -> bool:
    return (
        a.task_id == b.task_id and a.target_instance_id == b.target_instance_id and a.name == b.name
    )


def _same_publish(a: RecordPublished, b: RecordPublished) -> bool:
    return a.task_id == b.task_id and a.topic == b.topic


def _same_end(a: ExecutionCompleted, b: ExecutionCompleted) -> bool:
    return a.status == b.status


def _always(a: Any, b: Any) -> bool:
    return True


_MATCHERS: dict[type[EventBody], Callable[[Any, Any], bool]] = {
    TaskScheduled: _same_activity,
    InlineStepCompleted: _same_named_task,
    InlineStepFailed: _same_named_task,
    ChildWorkflowCreated: _same_named_task,
    TimerCreated: _same_task,
    TimerCancelled: _same_task,
    EventSent: _same_event_sent,
    CustomStatusSet: _always,
    ExecutionCompleted: _same_end,
    ContinuedAsNew: _always,
    ActivityCancelRequested: lambda a, b: a.task_id == b.task_id and a.attempt == b.attempt,
    TagsUpserted: _always,
    PatchMarker: lambda a, b: a.patch_id == b.patch_id,
    RecordPublished: _same_publish,
    UpdateCompleted: lambda a, b: a.update_id == b.update_id,
}


def _is_deprecated_marker(body: EventBody) -> bool:
    return type(body) is PatchMarker and body.deprecated


def _short(payload: Payload | None) -> str:
    if payload is None:
        return "None"
    if CHAIN_MARK in payload.encoding:  # never the value: failure texts are not encrypted
        return f"<{len(payload.data)} bytes {payload.encoding}>"
    data = payload.data if len(payload.data) <= 60 else payload.data[:57] + b"..."
    return data.decode("utf-8", "replace") if payload.encoding == "json" else repr(data)


def describe(body: EventBody) -> str:
    """A one-line description of an event body for error messages."""
    kind = type(body).__name__
    if isinstance(body, TaskScheduled):
        return (
            f"{kind}(task_id={body.task_id}, name={body.name!r}, attempt={body.attempt}, "
            f"input={_short(body.input)})"
        )
    if isinstance(body, InlineStepCompleted | InlineStepFailed | ChildWorkflowCreated):
        return f"{kind}(task_id={body.task_id}, name={body.name!r})"
    if isinstance(body, EventSent):
        return (
            f"{kind}(task_id={body.task_id}, target={body.target_instance_id!r}, "
            f"name={body.name!r})"
        )
    if isinstance(body, ExecutionCompleted):
        return f"{kind}(status={body.status.value})"
    if isinstance(body, PatchMarker):
        flag = ", deprecated" if body.deprecated else ""
        return (
            f"{kind}(patch_id={body.patch_id!r}{flag}), written by ctx.patched({body.patch_id!r}): "
            f"keep that call (or ctx.deprecate_patch({body.patch_id!r})) while instances that "
            f"recorded it may replay"
        )
    if isinstance(body, RecordPublished):
        return f"{kind}(task_id={body.task_id}, topic={body.topic!r})"
    task_id = getattr(body, "task_id", None)
    if task_id is not None:
        return f"{kind}(task_id={task_id})"
    name = getattr(body, "name", None)
    return f"{kind}(name={name!r})" if name is not None else f"{kind}()"


class Journal:
    """Sequence numbering, the current generation's events, and the replay cursor.

    While ``replaying``, :meth:`command` consumes the recorded command events
    ``events[cursor:end]`` of the turn being replayed instead of appending.
    """

    __slots__ = (
        "_cursor",
        "_end",
        "actions",
        "continue_as_new_suggested",
        "events",
        "generation",
        "instance_id",
        "max_new_events",
        "new_events",
        "next_sequence",
        "now_ms",
        "replaying",
    )

    def __init__(
        self,
        instance_id: str,
        next_sequence: int = 0,
        generation: int = 0,
        max_new_events: int = DEFAULT_MAX_TURN_EVENTS,
    ) -> None:
        self.instance_id = instance_id
        self.max_new_events = max_new_events
        self.next_sequence = next_sequence
        self.generation = generation
        self.now_ms = 0
        #: The running turn's ``TurnStarted.continue_as_new_suggested`` (False in the turn
        #: that begins a generation): ``ctx.continue_as_new_suggested``.
        self.continue_as_new_suggested = False
        self.replaying = False
        self.events: list[HistoryEvent] = []
        self.new_events: list[HistoryEvent] = []
        self.actions: list[Action] = []
        self._cursor = 0
        self._end = 0

    # --- live ---------------------------------------------------------------------------------

    def append(self, body: EventBody) -> HistoryEvent:
        """Append a new event to history (live mode); past the turn's bound of new events
        the turn is stopped (:class:`TurnEventsExceeded`)."""
        if len(self.new_events) >= self.max_new_events:
            raise too_many_events(self.instance_id, self.max_new_events)
        event = HistoryEvent(
            self.instance_id, self.next_sequence, self.now_ms, self.generation, body
        )
        self.next_sequence += 1
        self.events.append(event)
        self.new_events.append(event)
        return event

    # --- replay -------------------------------------------------------------------------------

    def expect(self, start: int, end: int) -> None:
        """Replay the turn whose recorded commands are ``events[start:end]``."""
        self._cursor = start
        self._end = end

    def leftover(self) -> HistoryEvent | None:
        """The first recorded command of the replayed turn that the code did not ask for
        (deprecated patch markers may be left)."""
        self._skip_deprecated()
        if self.replaying and self._cursor < self._end:
            return self.events[self._cursor]
        return None

    def _skip_deprecated(self) -> bool:
        """Step over deprecated patch markers at the cursor: code that no longer calls
        ``ctx.deprecate_patch`` may leave them. True when the cursor moved."""
        cursor = start = self._cursor
        events = self.events
        while cursor < self._end and _is_deprecated_marker(events[cursor].body):
            cursor += 1
        self._cursor = cursor
        return cursor != start

    def patch(self, patch_id: str) -> PatchMarker | None:
        """On replay: consume and return the recorded marker of ``patch_id`` if it comes
        next (after deprecated markers of other patches); None when the history, at this
        point, was recorded without the patch (nothing is consumed then)."""
        cursor = self._cursor
        events = self.events
        while cursor < self._end:
            rec = events[cursor].body
            if type(rec) is not PatchMarker:
                return None
            if rec.patch_id == patch_id:
                self._cursor = cursor + 1
                return rec
            if not rec.deprecated:
                return None
            cursor += 1
        return None

    def _end_sequence(self) -> int:
        events = self.events
        if self._end < len(events):
            return events[self._end].sequence
        return events[-1].sequence + 1 if events else self.next_sequence

    def mismatch(self, attempted: EventBody) -> NonDeterminismError:
        """The error for ``attempted`` not matching the next recorded command."""
        if self._cursor >= self._end:
            return NonDeterminismError(
                self._end_sequence(), "no further decision in that turn", describe(attempted)
            )
        recorded = self.events[self._cursor]
        return NonDeterminismError(recorded.sequence, describe(recorded.body), describe(attempted))

    def match_activity(self, task_id: int, name: str, input: Payload | None, attempt: int) -> bool:
        """Replay fast path: consume the recorded TaskScheduled if it is this one."""
        cursor = self._cursor
        if cursor < self._end:
            rec = self.events[cursor].body
            if (
                type(rec) is TaskScheduled
                and rec.task_id == task_id
                and rec.attempt == attempt
                and rec.name == name
                and _same_payload(rec.input, input)
            ):
                self._cursor = cursor + 1
                return True
        if self._skip_deprecated():
            return self.match_activity(task_id, name, input, attempt)
        return False

    def match_timer(self, task_id: int) -> TimerCreated | None:
        """Replay fast path: consume and return the recorded TimerCreated if it is next."""
        cursor = self._cursor
        if cursor < self._end:
            rec = self.events[cursor].body
            if type(rec) is TimerCreated and rec.task_id == task_id:
                self._cursor = cursor + 1
                return rec
        if self._skip_deprecated():
            return self.match_timer(task_id)
        return None

    def command(self, body: B) -> B | None:
        """Journal a decision: append it live, or match it against the record on replay.

        Returns ``None`` live, and the recorded body on replay (its values stay in force).
        """
        if not self.replaying:
            self.append(body)
            return None
        cursor = self._cursor
        if cursor < self._end:
            rec = self.events[cursor].body
            if type(rec) is type(body) and _MATCHERS[type(body)](rec, body):
                self._cursor = cursor + 1
                result: B = rec
                return result
        if self._skip_deprecated():
            return self.command(body)
        raise self.mismatch(body)

    def recorded_inline_step(
        self, task_id: int, name: str
    ) -> InlineStepCompleted | InlineStepFailed:
        """On replay: the recorded outcome of inline step ``task_id`` (must come next)."""
        cursor = self._cursor
        if cursor < self._end:
            rec = self.events[cursor].body
            if (
                isinstance(rec, InlineStepCompleted | InlineStepFailed)
                and rec.task_id == task_id
                and rec.name == name
            ):
                self._cursor = cursor + 1
                return rec
        if self._skip_deprecated():
            return self.recorded_inline_step(task_id, name)
        raise self.mismatch(InlineStepCompleted(task_id, name))
