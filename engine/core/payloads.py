"""User payloads: bytes plus a declared encoding.

Payloads cross the wire as opaque bytes so that producers in any language can start
workflows; JSON is the default encoding because every language can write it. The converter
is pluggable per encoding so that users can carry, say, protobuf without the engine knowing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from engine.core.errors import CodecError
from engine.core.payload_codecs import ACTIVE_CHAIN, CHAIN_MARK, seal_bytes, unseal_bytes
from engine.core.payload_refs import (
    REF_ENCODING,
    PayloadRef,
    describe_ref,
    digest,
    fetch_stored,
    parse_ref,
    ref_bytes,
)
from engine.core.typed import to_jsonable

JSON = "json"
RAW = "binary"
#: A small JSON stand-in for a value too large to be copied (see engine.core.limits).
SUMMARY = "turnstile.summary"
#: A small stand-in for a value kept in chunks on the payloads topic (engine.core.payload_refs).
REF = REF_ENCODING


@dataclass(frozen=True, slots=True)
class Payload:
    """One user value as it is stored in history and on the wire."""

    data: bytes
    encoding: str = JSON


class PayloadConverter(Protocol):
    """Turns Python values into payload bytes of one encoding and back."""

    encoding: str

    def to_bytes(self, value: Any) -> bytes: ...

    def from_bytes(self, data: bytes) -> Any: ...


class JsonConverter:
    """Compact, key-sorted JSON so that equal values always give equal bytes."""

    encoding = JSON

    def to_bytes(self, value: Any) -> bytes:
        try:
            return json.dumps(
                value, separators=(",", ":"), sort_keys=True, default=to_jsonable
            ).encode()
        except (TypeError, ValueError) as exc:
            raise CodecError(
                f"cannot encode {type(value).__name__} as JSON: {exc}. Pass JSON-compatible "
                f"values (dict, list, str, int, float, bool, None), dataclasses, pydantic "
                f"models, or bytes."
            ) from exc

    def from_bytes(self, data: bytes) -> Any:
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise CodecError(f"payload is not valid JSON: {exc}") from exc


class BinaryConverter:
    """Raw bytes, passed through untouched."""

    encoding = RAW

    def to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise CodecError(f"binary payloads must be bytes, got {type(value).__name__}")
        return bytes(value)

    def from_bytes(self, data: bytes) -> Any:
        return data


class SummaryConverter(JsonConverter):
    """Reads summaries (JSON); nothing should encode user values as one."""

    encoding = SUMMARY


_CONVERTERS: dict[str, PayloadConverter] = {
    JSON: JsonConverter(),
    RAW: BinaryConverter(),
    SUMMARY: SummaryConverter(),
}


def register_converter(converter: PayloadConverter) -> None:
    """Add or replace the converter for ``converter.encoding``."""
    _CONVERTERS[converter.encoding] = converter


def default_json_in_use() -> bool:
    """Whether the JSON encoding is still served by the built-in :class:`JsonConverter`
    (the runtime's fast JSON path reproduces exactly its output, so it checks this)."""
    return type(_CONVERTERS.get(JSON)) is JsonConverter


def to_payload(value: Any, encoding: str | None = None) -> Payload:
    """Encode a Python value; bytes default to the binary encoding, everything else to JSON.
    The result went through the process's codec chain (:func:`seal`)."""
    if isinstance(value, Payload):
        return value
    return seal(plain_payload(value, encoding))


def plain_payload(value: Any, encoding: str | None = None) -> Payload:
    """The converter's bytes of ``value``, without the codec chain (for values that leave
    the engine as they are, such as records published to the user's topics)."""
    if isinstance(value, Payload):
        return unseal(value)
    if encoding is None:
        encoding = RAW if isinstance(value, bytes) else JSON
    return Payload(_converter(encoding).to_bytes(value), encoding)


def seal(payload: Payload) -> Payload:
    """``payload`` through the process's codec chain, the chain recorded in its encoding
    (a summary stays as it is: it holds the engine's own description, not user data)."""
    if not ACTIVE_CHAIN[0] or payload.encoding == SUMMARY:
        return payload
    data, encoding = seal_bytes(payload.data, payload.encoding)
    return payload if encoding is payload.encoding else Payload(data, encoding)


def unseal(payload: Payload) -> Payload:
    """``payload`` with the codec chain its encoding records undone (the converter's bytes);
    a reference is resolved first."""
    if payload.encoding == REF:
        payload = _resolved(payload)
    if CHAIN_MARK not in payload.encoding:
        return payload
    data, encoding = unseal_bytes(payload.data, payload.encoding)
    return Payload(data, encoding)


def same_payload(a: Payload | None, b: Payload | None) -> bool:
    """Whether two payloads hold the same value: equal as stored, or equal once their codec
    chains are undone (encryption gives new bytes every time, so replay compares this way)."""
    if a is None or b is None:
        return a is b
    if a.data == b.data and a.encoding == b.encoding:
        return True
    if (a.encoding == REF) != (b.encoding == REF):  # recomputed in full, recorded as a
        return _same_as_ref(a, b)  # reference
    if CHAIN_MARK not in a.encoding and CHAIN_MARK not in b.encoding:
        return False
    plain_a, plain_b = unseal(a), unseal(b)
    return plain_a.data == plain_b.data and plain_a.encoding == plain_b.encoding


def from_payload(payload: Payload | None) -> Any:
    """Decode a payload back into a Python value (``None`` stays ``None``), undoing the
    codec chain its encoding records first."""
    if payload is None:
        return None
    if payload.encoding == REF:
        payload = _resolved(payload)
    if CHAIN_MARK in payload.encoding:
        payload = unseal(payload)
    return _converter(payload.encoding).from_bytes(payload.data)


def describe_payload(payload: Payload | None) -> Any:
    """The value for display: decoded, or - when it cannot be decoded (malformed data, an
    unknown encoding) - a description of it instead of an error, so that one bad record
    never stops a listing."""
    if payload is None:
        return None
    if payload.encoding == REF:
        return describe_ref(parse_ref(payload.data))
    try:
        return from_payload(payload)
    except CodecError as exc:
        return {
            "undecodable": str(exc),
            "encoding": payload.encoding,
            "size": len(payload.data),
            "first_bytes": payload.data[:32].hex(),
        }


def _resolved(payload: Payload) -> Payload:
    ref = parse_ref(payload.data)
    return Payload(fetch_stored(ref), ref.encoding)


def is_ref(payload: Payload | None) -> bool:
    """Whether ``payload`` stands for one kept on the payloads topic."""
    return payload is not None and payload.encoding == REF


def ref_payload(ref: PayloadRef) -> Payload:
    """The small payload that carries ``ref`` in records."""
    return Payload(ref_bytes(ref), REF)


def resolve(payload: Payload) -> Payload:
    """``payload`` itself, or - for a reference - the stored payload it stands for."""
    return _resolved(payload) if payload.encoding == REF else payload


def stored_size(payload: Payload) -> int:
    """The size of the stored payload ``payload`` is or stands for."""
    return parse_ref(payload.data).size if payload.encoding == REF else len(payload.data)


def _same_as_ref(a: Payload, b: Payload) -> bool:
    """Whether a reference and a full payload stand for the same stored bytes (replay
    recomputes an activity input in full; the history recorded its reference). Compared
    by digest, without reading the chunks; with a codec chain that gives new bytes each
    time (encryption) the values are compared once resolved."""
    ref_side, full = (a, b) if a.encoding == REF else (b, a)
    ref = parse_ref(ref_side.data)
    if ref.encoding == full.encoding and ref.sha256 == digest(full.data):
        return True
    if CHAIN_MARK not in ref.encoding and CHAIN_MARK not in full.encoding:
        return False
    return same_payload(_resolved(ref_side), full)


def _converter(encoding: str) -> PayloadConverter:
    try:
        return _CONVERTERS[encoding]
    except KeyError:
        raise CodecError(
            f"no payload converter for encoding {encoding!r}; register one with "
            f"engine.core.payloads.register_converter()"
        ) from None
