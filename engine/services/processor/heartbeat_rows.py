"""Rows of the attempts that complete later and are heartbeated from outside (``b|``).

An activity whose body called ``complete_later()`` is no longer run by its worker, so the
worker no longer times its heartbeats: the processor does, from the row of the attempt
(one per task id: its generation, attempt, run, heartbeat deadline and timeout, and the
last heartbeat's details). The worker's note that it let go of the attempt arms the
deadline; each heartbeat by task token (``Client.heartbeat_activity``) moves it and keeps
its details; a durable timer (``heartbeats.HEARTBEAT_TIMER``) fails the attempt when the
deadline passes, with those details for the next attempt, as the worker would have.

A row goes when its attempt settles or is abandoned (``cancels``), with a reset or a
purge, or when its deadline passes. A row with no deadline (deadline 0) keeps the details
of a heartbeat that came before the worker's note, or of a call without a heartbeat
timeout, until the attempt settles.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from engine.core.payloads import Payload
from engine.services.processor import keys
from engine.services.processor.tables import Tables

__all__ = ["LaterAttempt", "drop", "forget_all", "read", "rows", "settled", "write"]

_FIELDS = struct.Struct(">IIqqH")
_LEN = struct.Struct(">H")


@dataclass(frozen=True, slots=True)
class LaterAttempt:
    """What the processor keeps of one attempt that completes later."""

    generation: int
    attempt: int
    run_id: str
    #: When the attempt times out without a heartbeat (0: not timed).
    deadline_ms: int = 0
    #: The call's heartbeat timeout (0: unknown until the worker's note, or none).
    timeout_ms: int = 0
    details: Payload | None = None

    def is_for(self, generation: int, attempt: int, run_id: str) -> bool:
        return (self.generation, self.attempt, self.run_id) == (generation, attempt, run_id)


def read(tables: Tables, instance_id: str, task_id: int) -> LaterAttempt | None:
    value = tables.get(keys.heartbeat_key(instance_id, task_id))
    return None if value is None else _decode(value)


def write(tables: Tables, instance_id: str, task_id: int, row: LaterAttempt) -> None:
    tables.put(keys.heartbeat_key(instance_id, task_id), _encode(row))


def drop(tables: Tables, instance_id: str, task_id: int) -> None:
    tables.put(keys.heartbeat_key(instance_id, task_id), None)


def rows(tables: Tables, instance_id: str) -> list[tuple[int, LaterAttempt]]:
    """The instance's rows, by task id."""
    prefix = keys.heartbeat_prefix(instance_id)
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    return [
        (keys.task_of_heartbeat_key(key), _decode(value)) for key, value in tables.scan(prefix, end)
    ]


def settled(tables: Tables, instance_id: str, call: tuple[int | None, int, int]) -> None:
    """Attempt ``call`` (generation or None for the current one, task id, attempt) was
    settled or abandoned: its row goes."""
    generation, task_id, attempt = call
    row = read(tables, instance_id, task_id)
    if row is not None and row.attempt == attempt and generation in (None, row.generation):
        drop(tables, instance_id, task_id)


def forget_all(tables: Tables, instance_id: str) -> None:
    """The run ends without a turn (a reset, a purge): no attempt of it is timed any more."""
    for task_id, _ in rows(tables, instance_id):
        drop(tables, instance_id, task_id)


def _encode(row: LaterAttempt) -> bytes:
    run = row.run_id.encode()
    head = _FIELDS.pack(row.generation, row.attempt, row.deadline_ms, row.timeout_ms, len(run))
    if row.details is None:
        return head + run
    encoding = row.details.encoding.encode()
    return head + run + _LEN.pack(len(encoding)) + encoding + row.details.data


def _decode(value: bytes) -> LaterAttempt:
    generation, attempt, deadline_ms, timeout_ms, run_len = _FIELDS.unpack_from(value)
    at = _FIELDS.size
    run_id = value[at : at + run_len].decode()
    at += run_len
    details = None
    if at < len(value):
        (enc_len,) = _LEN.unpack_from(value, at)
        at += _LEN.size
        details = Payload(value[at + enc_len :], value[at : at + enc_len].decode())
    return LaterAttempt(generation, attempt, run_id, deadline_ms, timeout_ms, details)
