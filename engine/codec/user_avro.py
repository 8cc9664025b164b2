"""Avro values of the users' own topics: records a workflow publishes, records a trigger
reads.

These are not the engine's records: the value is plain Avro binary written with the schema
the user gives (what a consumer that agreed on the schema with the producer reads), without
the engine's single-object header. Schemas are parsed once per distinct text.
"""

from __future__ import annotations

import io
import json
from functools import lru_cache
from typing import Any

import fastavro
from fastavro.validation import ValidationError, validate

from engine.core.errors import CodecError


@lru_cache(maxsize=256)
def parse_user_schema(text: str) -> Any:
    """The parsed schema (``text`` is its JSON); a schema fastavro refuses is a CodecError."""
    try:
        return fastavro.parse_schema(json.loads(text))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise CodecError(f"the Avro schema is not valid: {exc}") from exc


def _schema_name(schema: Any) -> str:
    return str(schema.get("name", "schema")) if isinstance(schema, dict) else str(schema)


def encode_user_avro(schema_text: str, value: Any) -> bytes:
    """``value`` as Avro binary; a value that does not fit the schema is a CodecError that
    names the field."""
    schema = parse_user_schema(schema_text)
    try:
        validate(value, schema, raise_errors=True)
    except ValidationError as exc:
        raise CodecError(
            f"the value does not fit the Avro schema {_schema_name(schema)}: {exc}"
        ) from exc
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, value)
    return out.getvalue()


def decode_user_avro(schema_text: str, data: bytes) -> Any:
    """The value of Avro binary ``data`` written with the schema; bytes that are not such a
    value (too short, bytes left over) are a CodecError."""
    schema = parse_user_schema(schema_text)
    buf = io.BytesIO(data)
    try:
        value = fastavro.schemaless_reader(buf, schema, None)
    except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise CodecError(
            f"the value is not Avro written with schema {_schema_name(schema)}: {exc!r}"
        ) from exc
    if buf.tell() != len(data):
        raise CodecError(
            f"the value is not Avro written with schema {_schema_name(schema)}: "
            f"{len(data) - buf.tell()} bytes left over after the record"
        )
    return value
