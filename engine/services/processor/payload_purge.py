"""Purge and retention delete an instance's large payloads with it.

The chunks of a payload kept on the payloads topic (``engine.core.payload_refs``) are keyed
``<instance>/<sha256>/<i>`` on a compacted topic: a tombstone per chunk key, produced in the
transaction that removes the instance's row and history rows, makes compaction drop them.
The references are found in the history rows the state table still holds (the current
generation) - the ones the instance's own turns and its callers wrote for it.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass

from engine.codec import decode_histories
from engine.core.instance_row import InstanceRow
from engine.core.payload_refs import PayloadRef, parse_ref
from engine.core.payloads import Payload, is_ref
from engine.services.processor.batch import Batch


def references_of(bodies: list[object]) -> list[PayloadRef]:
    """The distinct references among the payload fields of ``bodies`` (history events)."""
    found: dict[tuple[str, str], PayloadRef] = {}
    for body in bodies:
        if not is_dataclass(body):
            continue
        for f in fields(body):
            value = getattr(body, f.name)
            if isinstance(value, Payload) and is_ref(value):
                ref = parse_ref(value.data)
                found[(ref.owner, ref.sha256)] = ref
    return list(found.values())


def delete_payloads(b: Batch, meta: InstanceRow) -> int:
    """Tombstones for the chunks of every reference the instance's history rows hold that
    its own partition keeps (a child's input written by its parent is the parent's to
    delete); returns how many."""
    rows = b.tables.history(meta.instance_id, meta.generation_start)
    if not rows:
        return 0
    refs = references_of([event.body for event in decode_histories(rows)])
    count = 0
    for ref in refs:
        if ref.owner != meta.instance_id:
            continue
        for key in ref.chunk_keys():
            b.emit(ref.topic, key, None, ref.partition)
            count += 1
    return count
