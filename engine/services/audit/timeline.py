"""An instance's timeline for people (one line per event) and for programs (JSON).

A line shows what an auditor looks for first: sequence, time, generation, the kind of event
and its salient fields, with payloads decoded to JSON and failures as ``Type: message``.
Fields still at their default value are left out, so a line stays short; ``width`` cuts
long values (``0``: never).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from engine.core.errors import CodecError
from engine.core.failure import FailureDetails
from engine.core.history import EventBody, HistoryEvent, RuntimeStatus, TurnStarted
from engine.core.payloads import Payload, describe_payload, is_ref, unseal
from engine.runtime.jsonhistory import history_to_json, payload_to_json
from engine.services.audit.state import InstanceFold

__all__ = [
    "HEADER",
    "event_line",
    "format_time",
    "timeline_json",
    "timeline_lines",
]

HEADER = f"{'SEQ':>5}  {'TIME (UTC)':<24}  {'GEN':>3}  {'EVENT':<22}  DETAILS"

#: Fields left out of a line (still in the JSON form): identifiers nobody reads by eye.
_HIDDEN = frozenset({"request_id"})

#: Fields holding epoch milliseconds: shown as times.
_TIME_FIELDS = frozenset({"fire_at_ms", "time_ms", "scheduled_start_ms"})


def format_time(epoch_ms: int) -> str:
    """``2030-01-31T09:00:00.123Z``: UTC, milliseconds, sortable."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def _payload_text(payload: Payload) -> str:
    if is_ref(payload):  # kept on the payloads topic: its size and beginning, not all of it
        shown = describe_payload(payload)
        return json.dumps(shown, separators=(",", ":"), ensure_ascii=False)
    try:
        shown = payload_to_json(unseal(payload))  # the value, when this process has the keys
    except CodecError as exc:
        return f"<{len(payload.data)} bytes {payload.encoding}: {exc}>"
    if "json" in shown:
        return json.dumps(shown["json"], separators=(",", ":"), ensure_ascii=False)
    return f"<{len(payload.data)} bytes {payload.encoding}>"


def _failure_text(failure: FailureDetails) -> str:
    text = f"{failure.type}: {failure.message}"
    return text if failure.cause is None else f"{text} (caused by {_failure_text(failure.cause)})"


def _value_text(name: str, value: Any) -> str:
    if isinstance(value, Payload):
        return _payload_text(value)
    if isinstance(value, FailureDetails):
        return _failure_text(value)
    if isinstance(value, RuntimeStatus):
        return value.value
    if name in _TIME_FIELDS and isinstance(value, int):
        return format_time(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value)
    return str(value)


def _is_default(field: dataclasses.Field[Any], value: Any) -> bool:
    if field.default is not dataclasses.MISSING:
        return bool(value == field.default)
    if field.default_factory is not dataclasses.MISSING:
        return bool(value == field.default_factory())
    return False


def _cut(text: str, width: int) -> str:
    return text if width <= 0 or len(text) <= width else text[: max(1, width - 3)] + "..."


def body_details(body: EventBody, width: int = 80) -> str:
    """The body's non-default fields as ``name=value`` pairs."""
    parts = []
    for field in dataclasses.fields(body):
        value = getattr(body, field.name)
        if value is None or field.name in _HIDDEN or _is_default(field, value):
            continue
        parts.append(f"{field.name}={_cut(_value_text(field.name, value), width)}")
    return " ".join(parts)


def event_line(event: HistoryEvent, width: int = 80) -> str:
    """One event as one line, aligned under :data:`HEADER`."""
    body = event.body
    details = "" if type(body) is TurnStarted else body_details(body, width)
    return (
        f"{event.sequence:>5}  {format_time(event.timestamp_ms):<24}  {event.generation:>3}  "
        f"{body.KIND:<22}  {details}"
    ).rstrip()


def timeline_lines(events: Iterable[HistoryEvent], width: int = 80) -> list[str]:
    """One line per event (aligned under :data:`HEADER`) and a closing summary line."""
    fold = InstanceFold()
    lines = []
    instance = ""
    for event in events:
        instance = event.instance_id
        fold.apply(event)
        lines.append(event_line(event, width))
    if fold.events:
        status = fold.status.value if fold.status is not None else "unknown"
        lines.append(
            f"-- {instance}: {fold.events} events, generations {fold.first_generation}-"
            f"{fold.generation}, status {status}"
        )
    return lines


def timeline_json(
    instance_id: str, events: Sequence[HistoryEvent], partition: int | None = None
) -> dict[str, Any]:
    """The instance's events (lossless JSON form) plus what they add up to."""
    fold = InstanceFold()
    for event in events:
        fold.apply(event)
    return {
        "instance_id": instance_id,
        "partition": partition,
        "summary": fold.to_json() if fold.events else None,
        "events": history_to_json(events),
    }
