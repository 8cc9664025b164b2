"""Where a reset cuts a run's history, and what the new run starts from (pure).

A reset (or rerun) builds a new run from the current run's history up to a *point*, an
event's sequence number. History is a list of turns (``TurnStarted``, the inbound events
it applied, the decisions the code made); a turn's decisions are only valid together with
all of its inbound events, so the cut is made at the start of the turn that holds the
point:

- every turn before it is *kept*: copied into the new run and replayed, so the results it
  recorded (activities, inline steps, children, timers) are reused, never redone;
- of the turn that holds the point, the inbound events *before* the point are offered
  again (reused), the event at the point and everything after it are dropped, and the
  code decides that turn again; the first turn's ``ExecutionStarted`` is always reused;
- events raised after the point (``EventRaised``: from clients and other instances) are
  delivered again, in order, so a reset never loses what others sent it, and so are the
  updates a continue-as-new carried into the run (``UpdatesCarried``), so a retry of one
  still gets its first answer; nothing else after the point is (results, timer fires,
  suspensions, the run's end are redone or gone).

``ExecutionTerminated`` is never reused: a reset is how a run is brought back to life.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.errors import InvalidResetPointError
from engine.core.history import (
    ChildWorkflowFailed,
    EventBody,
    EventRaised,
    ExecutionCompleted,
    ExecutionReset,
    ExecutionStarted,
    ExecutionTerminated,
    HistoryEvent,
    InlineStepFailed,
    RuntimeStatus,
    TaskFailed,
    TurnStarted,
    UpdatesCarried,
)
from engine.core.messages import ResetTarget
from engine.runtime.handlers import INBOUND

#: Inbound kinds of the cut turn that are offered again (a termination is not; a reset's
#: own marker belongs to the run it started).
_REUSED = frozenset(INBOUND) - {ExecutionTerminated, ExecutionReset}


#: What is offered again even from after the point: what others sent, what was carried.
_KEPT_AFTER_THE_POINT = frozenset({EventRaised, UpdatesCarried})


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What a new run is made of: ``kept`` (whole turns, from the run's first event, to be
    copied and replayed) and ``inbox`` (the first new turn's events: the reused inbound
    events, the reset marker, then the events raised after the point)."""

    point: int
    kept: list[HistoryEvent]
    inbox: list[EventBody]


def resolve_point(events: Sequence[HistoryEvent], target: ResetTarget, sequence: int) -> int:
    """The sequence number a reset target names in this run, or a clear refusal."""
    if not events:
        raise InvalidResetPointError("the instance has no history yet (it has not started)")
    first, last = events[0].sequence, events[-1].sequence
    if target is ResetTarget.FIRST_TURN:
        return _start_of(events).sequence
    if target is ResetTarget.LAST_FAILURE:
        failure = next((e for e in reversed(events) if _is_failure(e.body)), None)
        if failure is not None:
            return _first_failure_of_turn(events, failure)
        raise InvalidResetPointError(
            f"the current run (events {first}-{last}) has no failure to reset to; "
            f"reset to a sequence number (--to SEQ) or to the first turn"
        )
    if sequence < first:
        raise InvalidResetPointError(
            f"event {sequence} is before the current run, which starts at event {first} "
            f"(earlier runs cannot be reset); pick a point between {first} and {last}"
        )
    if sequence > last:
        raise InvalidResetPointError(
            f"event {sequence} is past the end of the run: its last event is {last}; "
            f"pick a point between {first} and {last}"
        )
    return sequence


def plan_reset(events: Sequence[HistoryEvent], point: int) -> ResetPlan:
    """Cut the run's events (its first event first) at the turn holding ``point``."""
    started = _start_of(events)
    turn = _turn_start(events, point)
    first_turn = turn <= started.sequence
    kept = [] if first_turn else [e for e in events if e.sequence < turn]
    reused: list[EventBody] = [started.body] if first_turn else []
    raised: list[EventBody] = []
    for event in events:
        if event.sequence < turn or event is started:
            continue
        body = event.body
        if event.sequence < point and type(body) in _REUSED:
            reused.append(body)
        elif event.sequence >= point and type(body) in _KEPT_AFTER_THE_POINT:
            raised.append(body)
    return ResetPlan(point, kept, reused + raised)


def marked(plan: ResetPlan, marker: ExecutionReset) -> list[EventBody]:
    """The plan's first turn with the reset marker in its place: right after the start
    when the run is begun again, else first."""
    inbox = list(plan.inbox)
    at = 1 if inbox and type(inbox[0]) is ExecutionStarted else 0
    inbox.insert(at, marker)
    return inbox


def _start_of(events: Sequence[HistoryEvent]) -> HistoryEvent:
    for event in events:
        if type(event.body) is ExecutionStarted:
            return event
    raise InvalidResetPointError("the run's history has no ExecutionStarted event")


def _turn_start(events: Sequence[HistoryEvent], point: int) -> int:
    start = events[0].sequence
    for event in events:
        if event.sequence > point:
            break
        if type(event.body) is TurnStarted:
            start = event.sequence
    return start


def _first_failure_of_turn(events: Sequence[HistoryEvent], last: HistoryEvent) -> int:
    """The failure that began the turn's trouble: a run that failed because an activity
    did is reset to the activity's failure (so the activity runs again), not to the end."""
    turn = _turn_start(events, last.sequence)
    for event in events:
        if turn <= event.sequence and _is_failure(event.body):
            return event.sequence
    return last.sequence


def _is_failure(body: EventBody) -> bool:
    if isinstance(body, ExecutionCompleted):
        return body.status is RuntimeStatus.FAILED
    return isinstance(body, TaskFailed | InlineStepFailed | ChildWorkflowFailed)
