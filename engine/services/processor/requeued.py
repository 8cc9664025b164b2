"""Where requeued copies of activity tasks are: the rows :mod:`cancels` keeps for them.

A task whose worker lacks the activity goes back to its queue, one partition further on
(``services.worker``; the ``turnstile-requeues`` header counts the trips), so its copy no
longer sits on the partition its instance id keys to. Every worker that reads such a copy
tells the processor where it is (an ``ActivityResult`` note with ``requeued_to``,
``requeues`` and ``task_queue``), and for an attempt its instance still waits for the
processor keeps the latest location in a row of the state table, ``r | instance | 0x00 |
task id`` (value: generation, attempt, partition, requeues as 4-byte big-endian integers,
then the task queue), so that a cancellation of the attempt goes to that partition
(:mod:`cancels` says why that is exact).

Rows exist only for attempts that were requeued; each goes when its attempt settles (its
result, its cancellation), with a reset or with a purge. A lookup is a point read, so an
instance that never had a task requeued pays one read per result or cancellation.
"""

from __future__ import annotations

import struct

from engine.services.processor import keys
from engine.services.processor.tables import Tables

__all__ = ["Location", "forget_all", "keep", "read", "settled", "take"]

#: Where a requeued copy of an attempt is: generation, attempt number, partition of its
#: task queue's topic, how often it was requeued, task queue.
Location = tuple[int, int, int, int, str]

_FIELDS = struct.Struct(">IIIi")


def read(tables: Tables, instance_id: str, task_id: int) -> Location | None:
    value = tables.get(keys.requeued_key(instance_id, task_id))
    return None if value is None else _decode(value)


def keep(tables: Tables, instance_id: str, task_id: int, location: Location) -> None:
    tables.put(keys.requeued_key(instance_id, task_id), _encode(location))


def drop(tables: Tables, instance_id: str, task_id: int) -> None:
    tables.put(keys.requeued_key(instance_id, task_id), None)


def take(tables: Tables, instance_id: str, call: tuple[int, int, int]) -> int | None:
    """Attempt ``call`` (generation, task id, attempt) is cancelled: the partition its
    requeued copy is on, None when it was never requeued (its task is where its key puts
    it); the row goes."""
    generation, task_id, attempt = call
    location = read(tables, instance_id, task_id)
    if location is None or location[:2] != (generation, attempt):
        return None
    drop(tables, instance_id, task_id)
    return location[2]


def settled(tables: Tables, instance_id: str, call: tuple[int | None, int, int]) -> None:
    """The attempt's result was taken: its copy's row goes (generation None: current)."""
    generation, task_id, attempt = call
    location = read(tables, instance_id, task_id)
    if location is not None and location[1] == attempt and generation in (None, location[0]):
        drop(tables, instance_id, task_id)


def forget_all(tables: Tables, instance_id: str) -> None:
    """The run ends without a turn (a reset, a purge): no copy of it is tracked any more."""
    prefix = keys.requeued_prefix(instance_id)
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    for key, _ in list(tables.scan(prefix, end)):
        tables.put(key, None)


def _encode(location: Location) -> bytes:
    return _FIELDS.pack(*location[:4]) + location[4].encode()


def _decode(value: bytes) -> Location:
    generation, attempt, partition, requeues = _FIELDS.unpack_from(value)
    return (generation, attempt, partition, requeues, value[_FIELDS.size :].decode())
