"""What a continue-as-new hands to the next generation.

A continue-as-new ends its turn; the next turn begins the next generation (see
``engine.runtime.executor``) with the unconsumed events of the one that ended, in arrival
order. Each of those is journaled again in the new generation, so a generation that was
handed a large backlog and read a little of it before continuing would journal the rest
again and again: history quadratic in the backlog. The new generation is therefore given
at most :data:`EVENT_WINDOW` unconsumed events of each name; the rest leave the runtime
with the ``ContinueAsNew`` action (``overflow``) and the processor keeps them, handing
them over as the code reads (``engine/services/processor/backlog.py``).

The updates the run completed are carried too (``UpdatesCarried``, right after the new
start), so that a client's retry of an update after a continue-as-new is answered with its
first result: the newest :data:`UPDATES_CARRIED` of them whose results fit in
:data:`UPDATE_RESULTS_CARRIED_BYTES`. An older one, or one whose result does not fit, is
forgotten: a retry of it runs its handler again. An update that had not finished is not
carried: its caller was answered that it did not finish, and a retry runs it anew.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.core.failure import FailureDetails
from engine.core.history import ExecutionStarted, UpdateCompleted
from engine.core.payloads import Payload

EVENT_WINDOW = 32
"""Unconsumed events of one name a generation is given from outside the flow of new
events: carried over a continue-as-new, or handed over by the processor from what it keeps.
Each one may be journaled again in the next generation if the code does not read it, so the
window bounds that repetition: draining a backlog of n events costs history linear in n,
whatever the code reads per generation (about 4.5 events of history per event when it
reads ten per generation). It also bounds how many a turn hands over from the backlog."""

UPDATES_CARRIED = 64
"""How many completed updates a continue-as-new carries into the next generation (the
newest), so that a retry of one of them is answered with its first result."""

UPDATE_RESULTS_CARRIED_BYTES = 64 * 1024
"""How many bytes of results (outputs and failure texts) the carried updates may hold:
they travel in one history event, which must stay well inside one record."""

#: An event as the runtime carries it: its name and payload.
Carried = tuple[str, Payload | None]


@dataclass(frozen=True, slots=True)
class Continuation:
    """The generation a continue-as-new asked for, until the turn that begins it."""

    started: ExecutionStarted
    generation: int
    carried: list[Carried]
    updates: list[UpdateCompleted] = field(default_factory=list)


def split_carried(events: list[Carried]) -> tuple[list[Carried], list[Carried]]:
    """Split unconsumed events (in arrival order) into those the next generation is given
    at its start (the first :data:`EVENT_WINDOW` of each name) and the rest."""
    given: list[Carried] = []
    rest: list[Carried] = []
    counts: dict[str, int] = {}
    for name, payload in events:
        count = counts.get(name, 0)
        if count < EVENT_WINDOW:
            counts[name] = count + 1
            given.append((name, payload))
        else:
            rest.append((name, payload))
    return given, rest


def count_by_name(events: list[Carried]) -> dict[str, int]:
    """How many of ``events`` each name has."""
    counts: dict[str, int] = {}
    for name, _ in events:
        counts[name] = counts.get(name, 0) + 1
    return counts


def carried_updates(completed: list[UpdateCompleted]) -> list[UpdateCompleted]:
    """The completed updates (oldest first) a continue-as-new carries, oldest first: the
    newest, at most :data:`UPDATES_CARRIED` of them and :data:`UPDATE_RESULTS_CARRIED_BYTES`
    of results. A failure is carried without its stack (a retry is answered with its type
    and message)."""
    kept: list[UpdateCompleted] = []
    budget = UPDATE_RESULTS_CARRIED_BYTES
    for done in reversed(completed):
        if len(kept) == UPDATES_CARRIED:
            break
        if done.failure is not None:
            done = replace(done, failure=_without_stacks(done.failure))
        size = _result_size(done)
        if size > budget:
            continue
        budget -= size
        kept.append(done)
    kept.reverse()
    return kept


def _result_size(done: UpdateCompleted) -> int:
    size = len(done.update_id)
    if done.output is not None:
        size += len(done.output.data)
    failure = done.failure
    while failure is not None:
        size += len(failure.type) + len(failure.message)
        failure = failure.cause
    return size


def _without_stacks(failure: FailureDetails) -> FailureDetails:
    cause = None if failure.cause is None else _without_stacks(failure.cause)
    return replace(failure, stack="", cause=cause)
