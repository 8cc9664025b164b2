"""What a continue-as-new hands to the next generation.

A continue-as-new ends its turn; the next turn begins the next generation (see
``engine.runtime.executor``) with the unconsumed events of the one that ended, in arrival
order. Each of those is journaled again in the new generation, so a generation that was
handed a large backlog and read a little of it before continuing would journal the rest
again and again: history quadratic in the backlog. The new generation is therefore given
at most :data:`EVENT_WINDOW` unconsumed events of each name; the rest leave the runtime
with the ``ContinueAsNew`` action (``overflow``) and the processor keeps them, handing
them over as the code reads (``engine/services/processor/backlog.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.history import ExecutionStarted
from engine.core.payloads import Payload

EVENT_WINDOW = 32
"""Unconsumed events of one name a generation is given from outside the flow of new
events: carried over a continue-as-new, or handed over by the processor from what it keeps.
Each one may be journaled again in the next generation if the code does not read it, so the
window bounds that repetition: draining a backlog of n events costs history linear in n,
whatever the code reads per generation (about 4.5 events of history per event when it
reads ten per generation). It also bounds how many a turn hands over from the backlog."""

#: An event as the runtime carries it: its name and payload.
Carried = tuple[str, Payload | None]


@dataclass(frozen=True, slots=True)
class Continuation:
    """The generation a continue-as-new asked for, until the turn that begins it."""

    started: ExecutionStarted
    generation: int
    carried: list[Carried]


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
