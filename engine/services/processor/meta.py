"""Reading and writing the processor's instance row (``engine.core.instance_row``).

Rows are Avro records (``schemas/InstanceRow.avsc``) like everything else the engine
writes. Rows written by the first release were compact JSON with a format number; they are
still read (a state table or changelog from then stays usable) and are rewritten as Avro
the next time their instance changes.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from engine.codec import MARKER, decode_row, encode_row
from engine.core.failure import FailureDetails
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow, PendingEvent
from engine.core.messages import IdReusePolicy, StartWorkflow
from engine.core.payloads import Payload

__all__ = ["InstanceRow", "PendingEvent", "decode_meta", "encode_meta"]

#: The format number of the first release's JSON rows (read only).
LEGACY_JSON_FORMAT = 1


# --- the first release's JSON rows (read only) ---------------------------------------------


def _payload_in(raw: Any) -> Payload | None:
    return None if raw is None else Payload(base64.b64decode(raw[1]), raw[0])


def _failure_in(raw: Any) -> FailureDetails | None:
    if raw is None:
        return None
    return FailureDetails(raw[0], raw[1], raw[2], bool(raw[3]), _failure_in(raw[4]))


def _start_in(raw: Any) -> StartWorkflow | None:
    if raw is None:
        return None
    parent = raw["parent"]
    return StartWorkflow(
        instance_id=raw["instance_id"],
        name=raw["name"],
        input=_payload_in(raw["input"]),
        version=raw["version"],
        reuse_policy=IdReusePolicy(raw["reuse_policy"]),
        request_id=raw["request_id"],
        scheduled_start_ms=raw["scheduled_start_ms"],
        tags=dict(raw["tags"]),
        parent_instance_id=parent[0],
        parent_generation=parent[1],
        parent_task_id=parent[2],
    )


def encode_meta(meta: InstanceRow) -> bytes:
    """The row as written to the state table and the state changelog (Avro)."""
    return encode_row(meta)


def decode_meta(data: bytes) -> InstanceRow:
    """A row of any release: Avro, or the first release's JSON."""
    if data[:2] == MARKER:
        return decode_row(data)
    return _decode_legacy_json(data)


def _decode_legacy_json(data: bytes) -> InstanceRow:
    doc = json.loads(data)
    parent = doc["parent"]
    return InstanceRow(
        instance_id=doc["id"],
        name=doc["name"],
        version=doc["version"],
        status=None if doc["status"] is None else RuntimeStatus(doc["status"]),
        generation=doc["generation"],
        created_ms=doc["created"],
        last_updated_ms=doc["updated"],
        input=_payload_in(doc["input"]),
        output=_payload_in(doc["output"]),
        custom_status=_payload_in(doc["custom"]),
        failure=_failure_in(doc["failure"]),
        parent_instance_id=parent[0],
        parent_generation=parent[1],
        parent_task_id=parent[2],
        tags=dict(doc["tags"]),
        request_id=doc["request_id"],
        next_sequence=doc["next_seq"],
        generation_start=doc["gen_start"],
        last_hash=base64.b64decode(doc["hash"]),
        pending_events=[PendingEvent(n, _payload_in(p), t) for n, p, t in doc["pending"]],
        scheduled_start=_start_in(doc["scheduled"]),
    )
