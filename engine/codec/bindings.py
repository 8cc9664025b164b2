"""Which core class each Avro named type stands for, and the slow, obvious conversion
between core objects and fastavro's dict form.

The Avro schemas in ``schemas/`` name their records after the core classes (``KIND``), so
the binding is found by name and checked field by field when the codec is built: a schema
that drifts from the dataclasses fails at import, not at the first record.

The dict conversion here is the reference path. It serves records written with older
schemas (fastavro resolves them against the current schema, then these functions build the
objects), Avro container-file export, and the tests that check the compiled fast path
against fastavro.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from engine.core.concurrency import ConcurrencySlots, SlotHolder
from engine.core.errors import CodecError
from engine.core.failure import FailureDetails
from engine.core.history import EVENT_TYPES, HistoryEvent, ParentClosePolicy, RuntimeStatus
from engine.core.instance_row import InstanceRow, Parked, PendingEvent, RunningChild, SeenRequest
from engine.core.messages import (
    COMMAND_BODY_TYPES,
    ActivityCancel,
    ActivityResult,
    ActivityTask,
    ChildResult,
    CommandOutcome,
    CommandResult,
    DeadLetter,
    IdReusePolicy,
    InstanceStatus,
    Message,
    ResetTarget,
    SlotOp,
)
from engine.core.payloads import Payload
from engine.core.schedules import OverlapPolicy, ScheduleOp, ScheduleSpec, ScheduleState

Schema = Any
"""A parsed Avro schema node: a type name, a dict or a list (union), as fastavro gives it."""

#: Top-level records of the message topics (everything except history and commands).
MESSAGE_RECORD_TYPES: tuple[type[Message], ...] = (
    ChildResult,
    ActivityTask,
    ActivityResult,
    InstanceStatus,
    DeadLetter,
    CommandOutcome,
    ActivityCancel,
)

_PLAIN_RECORDS: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Payload,
        FailureDetails,
        HistoryEvent,
        *EVENT_TYPES,
        *MESSAGE_RECORD_TYPES,
        InstanceRow,
        PendingEvent,
        Parked,
        SeenRequest,
        RunningChild,
        ConcurrencySlots,
        SlotHolder,
        ScheduleSpec,
        ScheduleState,
    )
}
_COMMAND_BODIES: dict[str, type] = {cls.__name__: cls for cls in COMMAND_BODY_TYPES}
_ENUMS: dict[str, type[Enum]] = {
    "RuntimeStatus": RuntimeStatus,
    "IdReusePolicy": IdReusePolicy,
    "CommandResult": CommandResult,
    "ParentClosePolicy": ParentClosePolicy,
    "SlotOp": SlotOp,
    "OverlapPolicy": OverlapPolicy,
    "ScheduleOp": ScheduleOp,
    "ResetTarget": ResetTarget,
}

#: The Command envelope: its ``instance_id`` is lifted into the body, which is the message.
COMMAND_RECORD = "Command"
LIFTED_FIELDS = ("instance_id",)
COMMAND_BODY_FIELD = "body"


@dataclass(frozen=True)
class RecordBinding:
    """How one Avro record maps onto a core class.

    ``lifted`` names constructor arguments that the enclosing record supplies (a command
    body gets ``instance_id`` from the Command envelope). ``self_field`` names the field
    whose value is the object itself (the Command envelope's ``body``): such a record has
    no class of its own.
    """

    cls: type | None
    lifted: tuple[str, ...] = ()
    self_field: str | None = None


def short_name(full_name: str) -> str:
    return full_name.rsplit(".", 1)[-1]


def record_binding(full_name: str) -> RecordBinding:
    """The binding of an Avro record, found by its short name."""
    name = short_name(full_name)
    if name == COMMAND_RECORD:
        return RecordBinding(None, self_field=COMMAND_BODY_FIELD)
    if name in _COMMAND_BODIES:
        return RecordBinding(_COMMAND_BODIES[name], lifted=LIFTED_FIELDS)
    if name in _PLAIN_RECORDS:
        return RecordBinding(_PLAIN_RECORDS[name])
    raise CodecError(
        f"Avro record {full_name} has no core class; name schema records after the classes "
        f"in engine.core.history or engine.core.messages"
    )


def enum_binding(full_name: str) -> type[Enum]:
    try:
        return _ENUMS[short_name(full_name)]
    except KeyError:
        raise CodecError(f"Avro enum {full_name} has no core enum class") from None


def check_record_fields(full_name: str, schema: Mapping[str, Any]) -> None:
    """Fail early when a schema record and its dataclass disagree on field names."""
    binding = record_binding(full_name)
    avro_fields = {f["name"] for f in schema["fields"]}
    if binding.cls is None:
        expected = {*LIFTED_FIELDS, COMMAND_BODY_FIELD}
    else:
        expected = {f.name for f in dataclasses.fields(binding.cls)} - set(binding.lifted)
    if avro_fields != expected:
        raise CodecError(
            f"Avro record {full_name} does not mirror its class: only in the schema "
            f"{sorted(avro_fields - expected)}, only in the class {sorted(expected - avro_fields)}."
            f" Keep schemas/*.avsc and engine/core in step (see schemas/README.md)."
        )


# --- reference conversion: objects <-> fastavro dicts -------------------------------------


def _resolve(schema: Schema, named: Mapping[str, Any]) -> Schema:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    return schema


def _type_name(schema: Schema) -> str:
    if isinstance(schema, dict):
        return str(schema["type"])
    if isinstance(schema, list):
        return "union"
    return str(schema)


def to_avro(value: Any, schema: Schema, named: Mapping[str, Any]) -> Any:
    """A core value as a fastavro datum (unions of records use tuple notation)."""
    schema = _resolve(schema, named)
    kind = _type_name(schema)
    if kind == "record":
        return _record_to_avro(value, schema, named)
    if kind == "enum":
        return value.value if isinstance(value, Enum) else value
    if kind == "union":
        return _union_to_avro(value, schema, named)
    if kind == "map":
        return {k: to_avro(v, schema["values"], named) for k, v in value.items()}
    if kind == "array":
        return [to_avro(v, schema["items"], named) for v in value]
    return value


def _record_to_avro(value: Any, schema: Mapping[str, Any], named: Mapping[str, Any]) -> Any:
    binding = record_binding(schema["name"])
    out: dict[str, Any] = {}
    for field in schema["fields"]:
        name = field["name"]
        if name in binding.lifted:
            continue
        item = value if name == binding.self_field else getattr(value, name)
        out[name] = to_avro(item, field["type"], named)
    return out


def _union_to_avro(value: Any, branches: list[Any], named: Mapping[str, Any]) -> Any:
    for branch in branches:
        resolved = _resolve(branch, named)
        kind = _type_name(resolved)
        if kind == "record":
            if record_binding(resolved["name"]).cls is type(value):
                return (resolved["name"], _record_to_avro(value, resolved, named))
        elif _matches_primitive(value, kind, resolved):
            return to_avro(value, resolved, named)
    raise CodecError(f"{type(value).__name__} value {value!r:.80} fits no branch of {branches}")


def _matches_primitive(value: Any, kind: str, schema: Schema) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float", "double"):
        return isinstance(value, float)
    if kind in ("bytes", "fixed"):
        return isinstance(value, bytes | bytearray | memoryview)
    if kind == "string":
        return isinstance(value, str)
    if kind == "enum":
        return isinstance(value, enum_binding(schema["name"]))
    if kind == "map":
        return isinstance(value, dict)
    return kind == "array" and isinstance(value, list | tuple)


def from_avro(datum: Any, schema: Schema, named: Mapping[str, Any]) -> Any:
    """A fastavro datum (read with ``return_record_name`` and its override) as core values."""
    schema = _resolve(schema, named)
    kind = _type_name(schema)
    if kind == "record":
        return _record_from_avro(datum, schema, named, {})
    if kind == "enum":
        return enum_binding(schema["name"])(datum)
    if kind == "union":
        return _union_from_avro(datum, schema, named)
    if kind == "map":
        return {k: from_avro(v, schema["values"], named) for k, v in datum.items()}
    if kind == "array":
        return [from_avro(v, schema["items"], named) for v in datum]
    if kind == "long" and isinstance(datum, datetime):
        # Avro container files readers apply the timestamp-millis logical type.
        return int(datum.timestamp() * 1000)
    return datum


def _record_from_avro(
    datum: Mapping[str, Any],
    schema: Mapping[str, Any],
    named: Mapping[str, Any],
    lifted: dict[str, Any],
) -> Any:
    binding = record_binding(schema["name"])
    values = dict(lifted)
    body: Any = None
    for field in schema["fields"]:
        name = field["name"]
        if name == binding.self_field:
            body = datum[name]
            continue
        values[name] = from_avro(datum[name], field["type"], named)
    if binding.self_field is not None:
        return _union_from_avro(body, _field_type(schema, binding.self_field), named, values)
    assert binding.cls is not None
    return binding.cls(**values)


def _field_type(schema: Mapping[str, Any], name: str) -> Schema:
    return next(f["type"] for f in schema["fields"] if f["name"] == name)


def _union_from_avro(
    datum: Any,
    branches: list[Any],
    named: Mapping[str, Any],
    lifted: dict[str, Any] | None = None,
) -> Any:
    records = [_resolve(b, named) for b in branches]
    records = [r for r in records if _type_name(r) == "record"]
    if isinstance(datum, tuple):
        name, datum = datum
        record = next(r for r in records if r["name"] == name)
        return _record_from_avro(datum, record, named, lifted or {})
    if isinstance(datum, dict) and len(records) == 1:
        return _record_from_avro(datum, records[0], named, lifted or {})
    for branch in branches:
        resolved = _resolve(branch, named)
        if _type_name(resolved) == "enum" and isinstance(datum, str):
            return from_avro(datum, resolved, named)
    return datum
