"""The Confluent Schema Registry wire format, as a second framing of the same Avro bytes.

A Confluent-framed record is the magic byte ``00``, the 4-byte big-endian id the registry
gave the writer schema, then the Avro binary body. A single-object-encoded record is the
marker ``C3 01``, the 8-byte fingerprint of the writer schema, then the *same* body. So the
two framings differ only in their header, and a record converts between them without being
decoded: the engine keeps working on single-object bytes (the history hash chain is
computed over them) and swaps the header at the edge, where it writes ``history``,
``status`` and ``command-outcomes`` for tools that expect the registry's format.

The codec does no I/O: which id stands for which schema is taught to it by the process
(:func:`learn_schema_id` for the ids it registered itself) or found through a resolver the
process installs (:func:`use_schema_resolver`, the registry's ``GET /schemas/ids/{id}``),
once per id. Decoding accepts either framing wherever a registry was configured.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from engine.codec.registry import HEADER_SIZE, MARKER, schema_fingerprint
from engine.core.errors import CodecError, UnknownSchemaError

MAGIC = b"\x00"
#: Magic byte and the 4-byte schema id.
CONFLUENT_HEADER_SIZE = 5

#: A schema id -> the schema's JSON text, as the registry serves it.
SchemaResolver = Callable[[int], str]

#: Schema id -> the single-object header (marker + fingerprint) of the same schema.
_HEADERS: dict[int, bytes] = {}
_RESOLVER: list[SchemaResolver] = []
_LOCK = threading.Lock()


def confluent_header(schema_id: int) -> bytes:
    """The 5-byte header of a record written with the registry's schema ``schema_id``."""
    if not 0 <= schema_id < 2**31:
        raise CodecError(f"a registry schema id is a positive 32-bit number, got {schema_id}")
    return MAGIC + schema_id.to_bytes(4, "big")


def is_confluent(data: bytes) -> bool:
    """Whether a record value is Confluent-framed (the magic byte tells them apart: a
    single-object record starts with ``C3``)."""
    return data[:1] == MAGIC


def to_confluent(data: bytes, schema_id: int) -> bytes:
    """A single-object-encoded record reframed for the registry's schema ``schema_id``."""
    if data[:2] != MARKER or len(data) < HEADER_SIZE:
        raise CodecError(
            f"only single-object-encoded records can be reframed, got {len(data)} bytes "
            f"starting {data[:4].hex(' ')!r}"
        )
    return confluent_header(schema_id) + data[HEADER_SIZE:]


def learn_schema_id(schema_id: int, schema_json: str) -> bytes:
    """Remember that registry id ``schema_id`` names the schema ``schema_json``; returns
    the single-object header it stands for. The fingerprint of the Parsing Canonical Form
    ignores docs and formatting, so a schema the registry normalised still matches."""
    try:
        fingerprint = schema_fingerprint(json.loads(schema_json))
    except Exception as exc:  # bad JSON or a schema fastavro cannot parse
        raise UnknownSchemaError(
            f"registry schema id {schema_id} is not a readable Avro schema: {exc}"
        ) from exc
    header = MARKER + fingerprint
    with _LOCK:
        _HEADERS[schema_id] = header
    return header


def use_schema_resolver(resolver: SchemaResolver | None) -> None:
    """Install (or with None remove) the lookup of schema ids this process did not
    register itself; until one is installed, only learnt ids decode."""
    with _LOCK:
        _RESOLVER.clear()
        if resolver is not None:
            _RESOLVER.append(resolver)


def registry_configured() -> bool:
    """Whether this process reads the registry's format at all (it learnt an id or has a
    resolver); without one a leading ``00`` byte is just a malformed record."""
    return bool(_RESOLVER or _HEADERS)


def forget_schema_ids() -> None:
    """Drop every learnt id and the resolver (a process that switches registries)."""
    with _LOCK:
        _HEADERS.clear()
        _RESOLVER.clear()


def to_single_object(data: bytes) -> bytes:
    """A Confluent-framed record reframed as single-object encoding, its schema found by
    id; raises UnknownSchemaError when no registry knows the id."""
    if len(data) < CONFLUENT_HEADER_SIZE:
        raise UnknownSchemaError(
            f"a {len(data)}-byte record starting with the Confluent magic byte 00 is too "
            f"short for its 4-byte schema id"
        )
    schema_id = int.from_bytes(data[1:CONFLUENT_HEADER_SIZE], "big")
    header = _HEADERS.get(schema_id) or _resolve(schema_id)
    return header + data[CONFLUENT_HEADER_SIZE:]


def _resolve(schema_id: int) -> bytes:
    if not _RESOLVER:
        raise UnknownSchemaError(
            f"record is in the Confluent wire format (schema id {schema_id}) but no Schema "
            f"Registry is configured: set schema_registry_url (TURNSTILE_SCHEMA_REGISTRY_URL)"
        )
    try:
        text = _RESOLVER[0](schema_id)
    except CodecError:
        raise
    except Exception as exc:  # the registry's own error, already worded by the adapter
        raise UnknownSchemaError(f"registry schema id {schema_id}: {exc}") from exc
    return learn_schema_id(schema_id, text)
