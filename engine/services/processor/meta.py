"""The per-instance metadata row of the processor's state table.

It holds what the status record shows plus the engine's own bookkeeping: where the current
generation's history starts, the next sequence number, the tail of the hash chain, events
raised before the instance started, and a start that waits for its scheduled time. It is
internal state (never a public contract), stored as compact JSON with a format version so
that a later release can read rows written by this one.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from engine.core.failure import FailureDetails
from engine.core.history import RuntimeStatus
from engine.core.messages import IdReusePolicy, InstanceStatus, StartWorkflow
from engine.core.payloads import Payload
from engine.services.processor.parking import Parked, parked_from_json, parked_to_json

FORMAT = 1


@dataclass(slots=True)
class PendingEvent:
    """An event raised for an instance that has not started yet."""

    name: str
    input: Payload | None
    received_ms: int


@dataclass(slots=True)
class InstanceMeta:
    instance_id: str
    name: str = ""
    version: str = ""
    #: ``None`` while only pending events exist for the id (the instance has not started).
    status: RuntimeStatus | None = None
    generation: int = 0
    created_ms: int = 0
    last_updated_ms: int = 0
    input: Payload | None = None
    output: Payload | None = None
    custom_status: Payload | None = None
    failure: FailureDetails | None = None
    parent_instance_id: str | None = None
    parent_generation: int | None = None
    parent_task_id: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    request_id: str = ""
    next_sequence: int = 0
    generation_start: int = 0
    last_hash: bytes = b""
    pending_events: list[PendingEvent] = field(default_factory=list)
    scheduled_start: StartWorkflow | None = None
    #: Set while a bug in the workflow code keeps the instance waiting (see parking.py).
    parked: Parked | None = None

    @property
    def exists(self) -> bool:
        return self.status is not None

    def to_status(self) -> InstanceStatus:
        return InstanceStatus(
            instance_id=self.instance_id,
            name=self.name,
            version=self.version,
            status=self.status or RuntimeStatus.PENDING,
            generation=self.generation,
            created_ms=self.created_ms,
            last_updated_ms=self.last_updated_ms,
            input=self.input,
            output=self.output,
            custom_status=self.custom_status,
            failure=self.failure,
            parent_instance_id=self.parent_instance_id,
            tags=dict(self.tags),
            request_id=self.request_id,
        )


# --- JSON form ----------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _payload_out(p: Payload | None) -> Any:
    return None if p is None else [p.encoding, _b64(p.data)]


def _payload_in(raw: Any) -> Payload | None:
    return None if raw is None else Payload(base64.b64decode(raw[1]), raw[0])


def _failure_out(f: FailureDetails | None) -> Any:
    if f is None:
        return None
    return [f.type, f.message, f.stack, f.retryable, _failure_out(f.cause)]


def _failure_in(raw: Any) -> FailureDetails | None:
    if raw is None:
        return None
    return FailureDetails(raw[0], raw[1], raw[2], bool(raw[3]), _failure_in(raw[4]))


def _start_out(s: StartWorkflow | None) -> Any:
    if s is None:
        return None
    return {
        "instance_id": s.instance_id,
        "name": s.name,
        "input": _payload_out(s.input),
        "version": s.version,
        "reuse_policy": s.reuse_policy.value,
        "request_id": s.request_id,
        "scheduled_start_ms": s.scheduled_start_ms,
        "tags": s.tags,
        "parent": [s.parent_instance_id, s.parent_generation, s.parent_task_id],
    }


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


def encode_meta(meta: InstanceMeta) -> bytes:
    doc = {
        "f": FORMAT,
        "id": meta.instance_id,
        "name": meta.name,
        "version": meta.version,
        "status": None if meta.status is None else meta.status.value,
        "generation": meta.generation,
        "created": meta.created_ms,
        "updated": meta.last_updated_ms,
        "input": _payload_out(meta.input),
        "output": _payload_out(meta.output),
        "custom": _payload_out(meta.custom_status),
        "failure": _failure_out(meta.failure),
        "parent": [meta.parent_instance_id, meta.parent_generation, meta.parent_task_id],
        "tags": meta.tags,
        "request_id": meta.request_id,
        "next_seq": meta.next_sequence,
        "gen_start": meta.generation_start,
        "hash": _b64(meta.last_hash),
        "pending": [[e.name, _payload_out(e.input), e.received_ms] for e in meta.pending_events],
        "scheduled": _start_out(meta.scheduled_start),
    }
    if meta.parked is not None:  # only then: rows of unparked instances stay as they were
        doc["parked"] = parked_to_json(meta.parked, meta.instance_id, _failure_out)
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_meta(data: bytes) -> InstanceMeta:
    doc = json.loads(data)
    parent = doc["parent"]
    return InstanceMeta(
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
        parked=parked_from_json(doc.get("parked"), _failure_in),
    )
