"""Key encodings of the processor's per-partition tables.

One RocksDB database per partition holds these tables, told apart by a one-byte prefix, so
that one WriteBatch can change all of them atomically:

- ``m``: instance metadata, ``m | instance``;
- ``h``: history events of the current generation, one row per turn keyed by its first
  event, ``h | instance | 0x00 | seq (8 bytes BE)`` (``history_rows``; rows of older
  processors hold one event each): a turn appends a key instead of rewriting one growing
  value, and a prefix scan returns the events in sequence order;
- ``t``: durable timers, ``t | fire_at_ms (8 bytes BE) | instance | 0x00 | generation (4 BE)
  | task_id (4 BE, offset by 2**31 so that -1 sorts first)``: byte order is fire-time order,
  so the due timers are a prefix of the table;
- ``c``: running children, ``c | instance | 0x00 | child instance``, one row per child an
  instance started whose result has not arrived (value: ``processor.children``), so a turn
  of a parent with 100,000 children rewrites none of them;
- ``r``: requeued activity tasks, ``r | instance | 0x00 | task_id (4 BE)``: where the copy
  of an attempt that went back to its queue is now (``processor.requeued``);
- ``b``: attempts that complete later and are heartbeated from outside, ``b | instance |
  0x00 | task_id (4 BE)``: the heartbeat deadline and last details the processor keeps for
  them once the worker let go (``processor.heartbeats``);
- ``o``: bookkeeping (changelog offsets), never written to a changelog.

Instance ids may not contain NUL (checked where they enter the engine), which keeps the
separator unambiguous.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from engine.core.errors import TurnstileError

META = b"m"
HISTORY = b"h"
TIMER = b"t"
CHILD = b"c"
REQUEUED = b"r"
HEARTBEATS = b"b"
BOOKKEEPING = b"o"
SEP = b"\x00"

_U64 = struct.Struct(">Q")
_TASK_BIAS = 2**31


class TimerKey(NamedTuple):
    fire_at_ms: int
    instance_id: str
    generation: int
    task_id: int


def check_instance_id(instance_id: str) -> None:
    """Instance ids are keys everywhere; reject the few values that would corrupt them."""
    if not instance_id or "\x00" in instance_id or len(instance_id) > 1024:
        raise TurnstileError(
            f"invalid instance id {instance_id[:80]!r}: use 1-1024 characters without NUL"
        )


def meta_key(instance_id: str) -> bytes:
    return META + instance_id.encode()


def history_prefix(instance_id: str) -> bytes:
    return HISTORY + instance_id.encode() + SEP


def history_key(instance_id: str, sequence: int) -> bytes:
    return history_prefix(instance_id) + _U64.pack(sequence)


def history_sequence(key: bytes) -> int:
    return int(_U64.unpack_from(key, len(key) - 8)[0])


def timer_key(key: TimerKey) -> bytes:
    return b"".join(
        (
            TIMER,
            _U64.pack(key.fire_at_ms),
            key.instance_id.encode(),
            SEP,
            struct.pack(">I", key.generation),
            struct.pack(">I", key.task_id + _TASK_BIAS),
        )
    )


def parse_timer_key(raw: bytes) -> TimerKey:
    fire_at = _U64.unpack_from(raw, 1)[0]
    instance = raw[9:-9].decode()
    generation, biased = struct.unpack_from(">II", raw, len(raw) - 8)
    return TimerKey(int(fire_at), instance, int(generation), int(biased) - _TASK_BIAS)


def child_prefix(instance_id: str) -> bytes:
    return CHILD + instance_id.encode() + SEP


def child_key(instance_id: str, child_id: str) -> bytes:
    return child_prefix(instance_id) + child_id.encode()


def requeued_prefix(instance_id: str) -> bytes:
    return REQUEUED + instance_id.encode() + SEP


def requeued_key(instance_id: str, task_id: int) -> bytes:
    return requeued_prefix(instance_id) + struct.pack(">I", task_id)


def heartbeat_prefix(instance_id: str) -> bytes:
    return HEARTBEATS + instance_id.encode() + SEP


def heartbeat_key(instance_id: str, task_id: int) -> bytes:
    return heartbeat_prefix(instance_id) + struct.pack(">I", task_id)


def task_of_heartbeat_key(key: bytes) -> int:
    return int(struct.unpack_from(">I", key, len(key) - 4)[0])


def offset_key(name: str) -> bytes:
    return BOOKKEEPING + name.encode()
