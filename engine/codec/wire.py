"""Records on the wire: single-object-encoded Avro for every topic, and the history hash
chain.

Encoding always uses the current schemas. Decoding dispatches on the fingerprint in the
header: records of the current schemas go through the compiled fast path, records of a
released older schema through fastavro's schema resolution. Tables are built on first use,
so importing the codec reads no files.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from hashlib import sha256
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import schemaless_reader
from fastavro.validation import validate

from engine.codec.bindings import MESSAGE_RECORD_TYPES, from_avro, to_avro
from engine.codec.bulk import ManyReader, compile_many_reader
from engine.codec.compiler import compile_schema
from engine.codec.confluent import is_confluent, registry_configured, to_single_object
from engine.codec.registry import (
    COMMAND,
    HEADER_SIZE,
    HISTORY,
    INSTANCE_ROW,
    MARKER,
    MESSAGE_SCHEMAS,
    STATE_SCHEMAS,
    WriterSchema,
    load_current,
    load_released,
)
from engine.core.errors import (
    CodecError,
    HistoryIntegrityError,
    MalformedRecordError,
    UnknownSchemaError,
)
from engine.core.history import HistoryEvent
from engine.core.instance_row import InstanceRow
from engine.core.messages import COMMAND_BODY_TYPES, Message

Decoder = Callable[[bytes], Any]
Encoder = Callable[[Any], bytes]

HASH_SIZE = 32
#: The Avro length prefix of a 32-byte ``bytes`` value (zig-zag 32 = 0x40).
_HASH_PREFIX = b"\x40"
_SEALED_TAIL = 1 + HASH_SIZE

_DECODE_ERRORS = (
    IndexError,
    UnicodeDecodeError,
    struct.error,
    MalformedRecordError,
    RecursionError,
)
_ENCODE_ERRORS = (
    AttributeError,
    TypeError,
    ValueError,
    KeyError,
    OverflowError,
    UnicodeEncodeError,
    RecursionError,
)

#: The history bodies a replay meets most, most frequent first: the bulk decoder reads them
#: inline (any other body goes through the same compiled reader as a single decode).
HOT_EVENTS = (
    "TaskScheduled",
    "TurnStarted",
    "TaskCompleted",
    "InlineStepCompleted",
    "TimerCreated",
    "TimerFired",
    "EventRaised",
    "ChildWorkflowCreated",
    "ChildWorkflowCompleted",
)

#: Decoders keyed by the whole 10-byte header, so one slice and one lookup check both the
#: marker and the fingerprint on the hot path.
_HISTORY_DECODERS: dict[bytes, Decoder] = {}
_MESSAGE_DECODERS: dict[bytes, Decoder] = {}
_ROW_DECODERS: dict[bytes, Decoder] = {}
_ENCODERS: dict[type, Encoder] = {}
#: The bulk history decoder (current schema), under the key ``HISTORY``.
_MANY: dict[str, ManyReader] = {}
_KNOWN: dict[bytes, WriterSchema] = {}
_CURRENT: dict[str, WriterSchema] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class SchemaInfo:
    """A writer schema the engine can read, for tools that list or document them."""

    name: str
    version: str
    fingerprint: str


# --- public API ---------------------------------------------------------------------------


def encode_history(event: HistoryEvent) -> bytes:
    """One history event as single-object-encoded Avro (current HistoryEvent schema)."""
    encoder = _ENCODERS.get(HistoryEvent) or _encoder_for(event)
    return encoder(event)


def decode_history(data: bytes) -> HistoryEvent:
    """Decode one history record written with any known HistoryEvent schema version."""
    if data.__class__ is not bytes:
        data = _as_bytes(data)
    decoder = _HISTORY_DECODERS.get(data[:HEADER_SIZE])
    if decoder is None:
        data, decoder = _lookup(data, _HISTORY_DECODERS, "history event")
    event: HistoryEvent = decoder(data)
    return event


def decode_histories(rows: Iterable[bytes]) -> list[HistoryEvent]:
    """Decode the history records of ``rows`` in one call (a cold load's whole history).

    Equal to ``[decode_history(row) for row in rows]``, value for value and error for error,
    at a fraction of the cost per record: records of the current schema are read in one
    generated loop, anything else (older schemas, Confluent framing, bad bytes) by
    ``decode_history``.
    """
    read_many = _MANY.get(HISTORY)
    if read_many is None:
        _ensure_loaded()
        read_many = _MANY[HISTORY]
    events: list[HistoryEvent] = read_many(rows, decode_history)
    return events


def encode_message(msg: Message) -> bytes:
    """A command (as a Command record), child result, activity task or result, instance
    status or dead letter as single-object-encoded Avro."""
    encoder = _ENCODERS.get(type(msg)) or _encoder_for(msg)
    return encoder(msg)


def decode_message(data: bytes) -> Message:
    """Decode any message record; the fingerprint says which record type it is."""
    if data.__class__ is not bytes:
        data = _as_bytes(data)
    decoder = _MESSAGE_DECODERS.get(data[:HEADER_SIZE])
    if decoder is None:
        data, decoder = _lookup(data, _MESSAGE_DECODERS, "message")
    msg: Message = decoder(data)
    return msg


def encode_row(row: InstanceRow) -> bytes:
    """The processor's instance row as single-object-encoded Avro (InstanceRow schema)."""
    encoder = _ENCODERS.get(InstanceRow) or _encoder_for(row)
    return encoder(row)


def decode_row(data: bytes) -> InstanceRow:
    """Decode an instance row written with any known InstanceRow schema version."""
    if data.__class__ is not bytes:
        data = _as_bytes(data)
    decoder = _ROW_DECODERS.get(data[:HEADER_SIZE])
    if decoder is None:
        data, decoder = _lookup(data, _ROW_DECODERS, "instance row")
    row: InstanceRow = decoder(data)
    return row


def seal_history(event: HistoryEvent, previous_hash: bytes) -> tuple[HistoryEvent, bytes]:
    """Link ``event`` into its instance's hash chain.

    The hash is SHA-256 over the encoded record up to the hash field, which is the last
    field of the schema, so it covers the header (the writer schema), every field and
    ``previous_hash``. Returns the event with both hashes set and its encoded bytes.

    Every turn seals each of its events, so this encodes the event once, as the runtime
    left it (both hashes empty: the record ends in their two zero length bytes), and puts
    ``previous_hash`` in place of the first of them, instead of building an unsealed copy
    of the event to encode.
    """
    if event.previous_hash or event.hash:  # sealed before: encode it as if it were not
        event = HistoryEvent(
            event.instance_id,
            event.sequence,
            event.timestamp_ms,
            event.generation,
            event.body,
        )
    prefix = encode_history(event)[:-2] + _bytes_length(len(previous_hash)) + previous_hash
    digest = sha256(prefix).digest()
    sealed = HistoryEvent(
        event.instance_id,
        event.sequence,
        event.timestamp_ms,
        event.generation,
        event.body,
        previous_hash,
        digest,
    )
    return sealed, prefix + _HASH_PREFIX + digest


def _bytes_length(size: int) -> bytes:
    """The Avro length prefix of a ``bytes`` value of ``size`` bytes (zig-zag varint)."""
    if size == HASH_SIZE:
        return _HASH_PREFIX
    n, out = size << 1, bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def history_hash_ok(data: bytes) -> bool:
    """Whether one encoded history record carries the right hash of its own bytes.

    Works on the raw bytes of any writer schema version (the hash field is always last);
    an unsealed record (empty hash) is not ok. A Confluent-framed record is checked as the
    single-object record it was sealed as.
    """
    if is_confluent(data) and registry_configured():
        try:
            data = to_single_object(bytes(data))
        except CodecError:
            return False
    if len(data) < HEADER_SIZE + _SEALED_TAIL or data[-_SEALED_TAIL] != 0x40:
        return False
    if bytes(data[:HEADER_SIZE]) not in _known_history():
        return False
    return sha256(data[:-_SEALED_TAIL]).digest() == data[-HASH_SIZE:]


def previous_hash_of(data: bytes) -> bytes:
    return decode_history(data).previous_hash


def hash_of(data: bytes) -> bytes:
    return decode_history(data).hash


def verify_history_chain(records: Iterable[bytes], previous_hash: bytes = b"") -> bytes:
    """Check that encoded events of one instance, in order, form an intact hash chain.

    Returns the last hash (to continue verifying from it later); raises
    HistoryIntegrityError naming the first event that does not fit.
    """
    expected = previous_hash
    for data in records:
        event = decode_history(data)
        if event.previous_hash != expected:
            raise HistoryIntegrityError(
                f"history of {event.instance_id!r} is broken at event #{event.sequence}: it "
                f"links to {event.previous_hash.hex() or 'nothing'}, expected "
                f"{expected.hex() or 'nothing'} (an event was removed, reordered or inserted)"
            )
        if not history_hash_ok(data):
            raise HistoryIntegrityError(
                f"history of {event.instance_id!r}: event #{event.sequence} does not match its "
                f"hash (its bytes were altered after it was written, or it was never sealed)"
            )
        expected = event.hash
    return expected


def known_schemas() -> list[SchemaInfo]:
    """Every writer schema this engine can decode (current and released versions)."""
    _ensure_loaded()
    return [SchemaInfo(s.name, s.version, s.fingerprint.hex()) for s in _KNOWN.values()]


def current_schema(name: str) -> WriterSchema:
    """The current version of a top-level schema (``"HistoryEvent"``, ``"Command"``...)."""
    _ensure_loaded()
    try:
        return _CURRENT[name]
    except KeyError:
        raise CodecError(f"no schema named {name!r}; known: {', '.join(_CURRENT)}") from None


# --- lookup and errors --------------------------------------------------------------------


def _as_bytes(data: object) -> bytes:
    """Accept any bytes-like value; the compiled readers need real bytes."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    kind = "None (a tombstone?)" if data is None else type(data).__name__
    raise CodecError(f"decode takes the record value as bytes, got {kind}")


def _first_bytes(data: bytes) -> str:
    return data[:16].hex(" ") + (" ..." if len(data) > 16 else "")


def _lookup(data: bytes, table: dict[bytes, Decoder], what: str) -> tuple[bytes, Decoder]:
    """The slow path of a decode: load tables, reframe a Confluent-framed record as
    single-object encoding, check the header, explain failures. Returns the record as
    single-object bytes and its decoder."""
    _ensure_loaded()
    if is_confluent(data) and registry_configured():
        data = to_single_object(data)
    if len(data) < HEADER_SIZE or data[:2] != MARKER:
        raise MalformedRecordError(
            f"not a single-object-encoded Avro {what}: expected the marker c3 01 and an 8-byte "
            f"schema fingerprint, found {len(data)} bytes starting {_first_bytes(data)!r}. "
            f"Producers must write records as described in schemas/README.md (a record in the "
            f"Confluent wire format, magic byte 00 and a schema id, needs schema_registry_url)."
        )
    fingerprint = data[2:HEADER_SIZE]
    if data[:HEADER_SIZE] in table:
        return data, table[data[:HEADER_SIZE]]
    other = _KNOWN.get(fingerprint)
    if other is not None:
        raise UnknownSchemaError(
            f"record is a {other.name} (schema version {other.version}, fingerprint "
            f"{fingerprint.hex()}), not a {what}; it was produced onto the wrong topic"
        )
    raise UnknownSchemaError(
        f"unknown writer schema fingerprint {fingerprint.hex()} in a {len(data)}-byte {what} "
        f"record starting {_first_bytes(data)!r}. Known fingerprints: "
        f"{', '.join(sorted(header[2:].hex() for header in table))}. The producer used a "
        f"schema this engine does not know: produce with the schemas in schemas/, or upgrade "
        f"the engine (older schemas stay readable from schemas/released/<version>/)."
    )


def _malformed(data: bytes, schema: WriterSchema, detail: object) -> MalformedRecordError:
    return MalformedRecordError(
        f"malformed {schema.name} record ({len(data)} bytes, schema version {schema.version}, "
        f"fingerprint {schema.fingerprint.hex()}): {detail}. First bytes: "
        f"{_first_bytes(data)!r}. The bytes do not follow the schema their header names; the "
        f"record cannot be used (route it to the dead-letter topic)."
    )


def _encode_failure(obj: Any, schema: WriterSchema, exc: Exception) -> CodecError:
    """Explain an encode failure, naming the offending field where fastavro can tell."""
    detail = f"{type(exc).__name__}: {exc}"
    try:
        validate(to_avro(obj, schema.parsed, schema.parsed["__named_schemas"]), schema.parsed)
    except Exception as why:  # fastavro's ValidationError lists the failing field paths
        detail = f"{detail}; {why}"
    return CodecError(
        f"cannot encode {type(obj).__name__} as Avro {schema.name}: {detail}. Field values "
        f"must have the types declared in engine.core (str, int, bytes, Payload...)."
    )


def _encoder_for(obj: Any) -> Encoder:
    _ensure_loaded()
    encoder = _ENCODERS.get(type(obj))
    if encoder is None:
        known = ", ".join(sorted(t.__name__ for t in _ENCODERS))
        raise CodecError(f"cannot encode a {type(obj).__name__}; the codec encodes {known}")
    return encoder


def _known_history() -> dict[bytes, Decoder]:
    if not _HISTORY_DECODERS:
        _ensure_loaded()
    return _HISTORY_DECODERS


# --- building the tables ------------------------------------------------------------------


def _fast_decoder(schema: WriterSchema) -> Decoder:
    read = compile_schema(schema.parsed).read

    def decode(data: bytes) -> Any:
        try:
            obj, pos = read(data, HEADER_SIZE)
        except IndexError as exc:
            raise _malformed(data, schema, "the record ends too early (truncated)") from exc
        except _DECODE_ERRORS as exc:
            raise _malformed(data, schema, f"{type(exc).__name__}: {exc}") from exc
        if pos != len(data):
            problem = "truncated" if pos > len(data) else f"{len(data) - pos} trailing bytes"
            raise _malformed(data, schema, problem)
        return obj

    return decode


def _resolving_decoder(writer: WriterSchema, reader: WriterSchema) -> Decoder:
    """Records of an older schema: fastavro resolves them against the current schema."""
    named = reader.parsed["__named_schemas"]

    def decode(data: bytes) -> Any:
        stream = BytesIO(data)
        stream.seek(HEADER_SIZE)
        try:
            datum = schemaless_reader(
                stream,
                writer.parsed,
                reader.parsed,
                return_record_name=True,
                return_record_name_override=True,
            )
            obj = from_avro(datum, reader.parsed, named)
        except Exception as exc:  # fastavro raises assorted types on bad input
            raise _malformed(data, writer, f"{type(exc).__name__}: {exc}") from exc
        if stream.tell() != len(data):
            raise _malformed(data, writer, f"{len(data) - stream.tell()} trailing bytes")
        return obj

    return decode


def _encoder(schema: WriterSchema) -> Encoder:
    write = compile_schema(schema.parsed).write
    header = schema.header

    def encode(obj: Any) -> bytes:
        out = bytearray(header)
        try:
            write(out, obj)
        except _ENCODE_ERRORS as exc:
            raise _encode_failure(obj, schema, exc) from exc
        return bytes(out)

    return encode


def reload_schemas(directory: Path | None = None) -> None:
    """Rebuild the codec tables from ``directory`` (default: the repository's schemas/).

    For tools and tests that work with another set of schema files; the engine itself
    loads the tables once, on first use.
    """
    with _LOCK:
        tables = (
            _HISTORY_DECODERS,
            _MESSAGE_DECODERS,
            _ROW_DECODERS,
            _ENCODERS,
            _MANY,
            _KNOWN,
            _CURRENT,
        )
        for table in tables:
            table.clear()
        _build_tables(directory)


def _ensure_loaded() -> None:
    if _CURRENT:
        return
    with _LOCK:
        if not _CURRENT:
            _build_tables(None)


def _build_tables(directory: Path | None) -> None:
    current = load_current(directory)
    known = {s.fingerprint: s for s in current.values()}
    history_decoders = {current[HISTORY].header: _fast_decoder(current[HISTORY])}
    message_decoders = {current[n].header: _fast_decoder(current[n]) for n in MESSAGE_SCHEMAS}
    row_decoders = {current[n].header: _fast_decoder(current[n]) for n in STATE_SCHEMAS}
    for old in load_released(directory):
        if old.fingerprint in known or old.name not in current:
            continue
        known[old.fingerprint] = old
        target = (
            history_decoders
            if old.name == HISTORY
            else row_decoders
            if old.name in STATE_SCHEMAS
            else message_decoders
        )
        target[old.header] = _resolving_decoder(old, current[old.name])
    encoders: dict[type, Encoder] = {HistoryEvent: _encoder(current[HISTORY])}
    command_encoder = _encoder(current[COMMAND])
    encoders.update({cls: command_encoder for cls in COMMAND_BODY_TYPES})
    encoders.update({cls: _encoder(current[cls.__name__]) for cls in MESSAGE_RECORD_TYPES})
    encoders[InstanceRow] = _encoder(current[INSTANCE_ROW])
    _KNOWN.update(known)
    _HISTORY_DECODERS.update(history_decoders)
    _MESSAGE_DECODERS.update(message_decoders)
    _ROW_DECODERS.update(row_decoders)
    _ENCODERS.update(encoders)
    _MANY[HISTORY] = compile_many_reader(
        current[HISTORY].parsed, current[HISTORY].header, HOT_EVENTS
    )
    _CURRENT.update(current)  # last: it marks the tables as ready
