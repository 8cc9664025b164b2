"""The children an instance started whose result has not arrived yet.

Each running child is one row of the state table (``keys.child_key``: parent, then child
id), written when the parent starts it and deleted when its ``ChildResult`` arrives, so
a turn costs what it starts or ends, never a rewrite of a list of every child still
running: a parent's row stays small however many children it waits for (a row that listed
100,000 children would be several megabytes, rewritten on every turn and too large for one
changelog record). The whole list is read only when it is needed: a recursive terminate,
a failure the processor records in place of a turn, a reset, a purge.

Rows written before this table existed list their children in the row itself
(``InstanceRow.children``); they are read as well and leave the row as their results
arrive, so both kinds of row work side by side.

A row's value is the child's generation (4 bytes, big-endian) and its parent-close policy
(ASCII): ``processor.keys`` names the key layout.
"""

from __future__ import annotations

import struct

from engine.core.history import ParentClosePolicy
from engine.core.instance_row import InstanceRow, RunningChild
from engine.services.processor import keys
from engine.services.processor.tables import Tables

__all__ = ["forget_all", "note_ended", "note_started", "running"]

_GENERATION = struct.Struct(">I")


def _encode(child: RunningChild) -> bytes:
    return _GENERATION.pack(child.generation) + child.parent_close_policy.value.encode()


def _decode(child_id: str, value: bytes) -> RunningChild:
    generation = int(_GENERATION.unpack_from(value)[0])
    policy = ParentClosePolicy(value[_GENERATION.size :].decode())
    return RunningChild(child_id, generation, policy)


def note_started(tables: Tables, meta: InstanceRow, child: RunningChild) -> None:
    """``meta``'s instance started ``child`` (a child of the same id started before is
    replaced)."""
    if meta.children:  # a row from before the table: the id may be listed there
        meta.children = [c for c in meta.children if c.instance_id != child.instance_id]
    tables.put(keys.child_key(meta.instance_id, child.instance_id), _encode(child))


def note_ended(tables: Tables, meta: InstanceRow, child_id: str) -> bool:
    """The child's result arrived: it no longer runs, whatever its parent does. True when
    ``meta`` itself changed (a row from before the table listed it): save the row."""
    key = keys.child_key(meta.instance_id, child_id)
    if tables.get(key) is not None:
        tables.put(key, None)
    if not meta.children:
        return False
    kept = [c for c in meta.children if c.instance_id != child_id]
    changed = len(kept) != len(meta.children)
    meta.children = kept
    return changed


def running(tables: Tables, meta: InstanceRow) -> list[RunningChild]:
    """Every child of the instance whose result has not arrived, of any generation (a
    read of all of them: for the rare moments that need the whole list)."""
    return list(meta.children) + _listed(tables, meta.instance_id)


def forget_all(tables: Tables, meta: InstanceRow) -> None:
    """The instance no longer tracks any child (a reset ended its run, or it is purged)."""
    for child in _listed(tables, meta.instance_id):
        tables.put(keys.child_key(meta.instance_id, child.instance_id), None)
    meta.children = []


def _listed(tables: Tables, instance_id: str) -> list[RunningChild]:
    prefix = keys.child_prefix(instance_id)
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    return [_decode(key[len(prefix) :].decode(), value) for key, value in tables.scan(prefix, end)]
