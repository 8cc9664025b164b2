"""Concurrency limits on starts per workflow name and key: the admission logic, pure.

A workflow declared with ``max_concurrency_per_key=K`` runs at most K instances at once
for each concurrency key its starts name (``start(..., concurrency_key=...)``); further
starts wait, in arrival order, as PENDING. The state of one (name, key) is a
:class:`ConcurrencySlots` kept in the row of a reserved id (:func:`slots_id`), so it lives
on the one partition that owns that id: every acquire and release for the key is applied
there, one at a time, in the order the partition's log holds them, which is what makes the
limit exact. The functions here decide; the processor (``services/processor/slots.py``)
moves the messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.errors import RegistrationError

#: Ids of the rows that hold the slots of a (workflow name, key); user ids may not use it.
SLOTS_PREFIX = "~slots/"


@dataclass(slots=True)
class SlotHolder:
    """One run of an instance that holds, or waits for, a slot (a run is its generation)."""

    instance_id: str
    generation: int


@dataclass(slots=True)
class ConcurrencySlots:
    """The running runs and the FIFO queue of waiting starts of one (name, key)."""

    limit: int = 0
    running: list[SlotHolder] = field(default_factory=list)
    waiting: list[SlotHolder] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.running and not self.waiting


def slots_id(name: str, key: str) -> str:
    """The reserved id whose row holds the slots of workflow ``name`` for ``key``."""
    return f"{SLOTS_PREFIX}{name}/{key}"


def check_limit(name: str, limit: object) -> int:
    """``max_concurrency_per_key`` as declared: a whole number >= 0 (0: no limit)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise RegistrationError(
            f"max_concurrency_per_key of workflow {name!r} must be a whole number >= 0 "
            f"(0: no limit), got {limit!r}"
        )
    return limit


def acquire(slots: ConcurrencySlots, holder: SlotHolder, limit: int) -> list[SlotHolder]:
    """Ask for a slot: the runs granted one now (the holder, or nobody if it must wait).

    Runs are told apart by instance id: an instance sends its RELEASE before it asks again
    for a new run, in the same partition's log, so one id is never in the set twice. Asking
    again for a run already admitted grants it again (its start is never lost). ``limit``
    is the current declaration, so raising it admits waiting starts at once."""
    slots.limit = max(1, limit)
    for running in slots.running:
        if running.instance_id == holder.instance_id:
            running.generation = holder.generation
            return [running]
    for waiting in slots.waiting:
        if waiting.instance_id == holder.instance_id:
            waiting.generation = holder.generation
            break
    else:
        slots.waiting.append(holder)
    return _admit(slots)


def release(slots: ConcurrencySlots, instance_id: str) -> list[SlotHolder]:
    """The instance's run ended (or stopped waiting): its slot, or its place in the queue,
    is freed; returns the waiting runs that start now, oldest first."""
    slots.running = [h for h in slots.running if h.instance_id != instance_id]
    slots.waiting = [h for h in slots.waiting if h.instance_id != instance_id]
    return _admit(slots)


def _admit(slots: ConcurrencySlots) -> list[SlotHolder]:
    granted = []
    while slots.waiting and len(slots.running) < slots.limit:
        holder = slots.waiting.pop(0)
        slots.running.append(holder)
        granted.append(holder)
    return granted
