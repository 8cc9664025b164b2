"""A readable JSON form of history events (``history show --json``, golden test files).

Each event becomes ``{"sequence", "timestamp_ms", "generation", "instance_id", "kind",
"body": {...}}`` plus the hashes in hex when set. Payloads are shown as their JSON value
(``{"json": ...}``) when that round-trips to the very same bytes, and as base64 otherwise
(``{"encoding": ..., "base64": ...}``), so that the conversion is lossless both ways.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from engine.core.errors import CodecError
from engine.core.failure import FailureDetails
from engine.core.history import EVENT_TYPES, OMIT_EMPTY, EventBody, HistoryEvent, RuntimeStatus
from engine.core.payloads import JSON, Payload, plain_payload

_BY_KIND: dict[str, type[EventBody]] = {cls.KIND: cls for cls in EVENT_TYPES}


def payload_to_json(payload: Payload | None) -> Any:
    if payload is None:
        return None
    if payload.encoding == JSON:
        try:
            value = json.loads(payload.data)
            if plain_payload(value, JSON).data == payload.data:
                return {"json": value}
        except (ValueError, CodecError):
            pass
    return {"encoding": payload.encoding, "base64": base64.b64encode(payload.data).decode()}


def payload_from_json(data: Any) -> Payload | None:
    if data is None:
        return None
    if "json" in data:
        return plain_payload(data["json"], JSON)
    return Payload(base64.b64decode(data["base64"]), data["encoding"])


def failure_to_json(failure: FailureDetails | None) -> Any:
    if failure is None:
        return None
    return {
        "type": failure.type,
        "message": failure.message,
        "stack": failure.stack,
        "retryable": failure.retryable,
        "cause": failure_to_json(failure.cause),
    }


def failure_from_json(data: Any) -> FailureDetails | None:
    if data is None:
        return None
    return FailureDetails(
        data["type"],
        data["message"],
        data.get("stack", ""),
        data.get("retryable", True),
        failure_from_json(data.get("cause")),
    )


def _value_to_json(value: Any) -> Any:
    if isinstance(value, Payload):
        return payload_to_json(value)
    if isinstance(value, FailureDetails):
        return failure_to_json(value)
    if isinstance(value, RuntimeStatus):
        return value.value
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):  # events inside an event (UpdatesCarried)
        return [body_to_json(item) for item in value]
    return value


def _value_from_json(annotation: str, value: Any) -> Any:
    if value is None:
        return None
    if "Payload" in annotation:
        return payload_from_json(value)
    if "FailureDetails" in annotation:
        return failure_from_json(value)
    if "RuntimeStatus" in annotation:
        return RuntimeStatus(value)
    if annotation.startswith("dict"):
        return dict(value)
    if annotation.startswith("list["):  # events inside an event: list[<event kind>]
        kind = annotation[5:-1]
        return [body_from_json(kind, item) for item in value]
    return value


def body_to_json(body: EventBody) -> dict[str, Any]:
    return {
        field.name: _value_to_json(getattr(body, field.name))
        for field in dataclasses.fields(body)
        if not (field.metadata.get(OMIT_EMPTY) and getattr(body, field.name) == field.default)
    }


def body_from_json(kind: str, data: Mapping[str, Any]) -> EventBody:
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise CodecError(f"unknown history event kind {kind!r}")
    kwargs = {
        field.name: _value_from_json(str(field.type), data[field.name])
        for field in dataclasses.fields(cls)
        if field.name in data
    }
    return cls(**kwargs)


def event_to_json(event: HistoryEvent) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sequence": event.sequence,
        "timestamp_ms": event.timestamp_ms,
        "generation": event.generation,
        "instance_id": event.instance_id,
        "kind": event.body.KIND,
        "body": body_to_json(event.body),
    }
    if event.previous_hash:
        out["previous_hash"] = event.previous_hash.hex()
    if event.hash:
        out["hash"] = event.hash.hex()
    return out


def event_from_json(data: Mapping[str, Any]) -> HistoryEvent:
    return HistoryEvent(
        instance_id=data["instance_id"],
        sequence=data["sequence"],
        timestamp_ms=data["timestamp_ms"],
        generation=data["generation"],
        body=body_from_json(data["kind"], data.get("body", {})),
        previous_hash=bytes.fromhex(data.get("previous_hash", "")),
        hash=bytes.fromhex(data.get("hash", "")),
    )


def history_to_json(events: Iterable[HistoryEvent]) -> list[dict[str, Any]]:
    """Events as JSON-ready dicts (``json.dumps`` them as they are)."""
    return [event_to_json(event) for event in events]


def history_from_json(data: Iterable[Mapping[str, Any]]) -> list[HistoryEvent]:
    """The inverse of :func:`history_to_json`."""
    try:
        return [event_from_json(item) for item in data]
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecError(f"not a JSON history: {exc!r}") from exc
