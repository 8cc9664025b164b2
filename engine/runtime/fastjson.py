"""Fast JSON payload conversion for the executor's hot path.

Replay encodes every activity input again (to compare it with the recorded one) and decodes
every result, so payload conversion dominates replay time. These functions give exactly the
bytes and values of :mod:`engine.core.payloads`' default JSON converter (compact, key-sorted,
ASCII-escaped), only faster: a pre-built encoder and scanner, and shortcuts for ints,
strings and None. When someone registers their own JSON converter, or a value is not plain
JSON, everything goes through :mod:`engine.core.payloads` unchanged.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from json.scanner import make_scanner
from typing import Any

from engine.core.payload_codecs import ACTIVE_CHAIN
from engine.core.payloads import (
    JSON,
    Payload,
    default_json_in_use,
    from_payload,
    plain_payload,
    seal,
    to_payload,
)

_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
_DECODER = json.JSONDecoder()
_SCAN = make_scanner(_DECODER)  # type: ignore[arg-type]


def encode(value: Any) -> Payload | None:
    """``to_payload(value)`` for workflow values; ``None`` stays ``None``."""
    if value is None:
        return None
    kind = type(value)
    if kind is Payload:
        return value  # type: ignore[no-any-return]
    if kind is bytes or not default_json_in_use():
        return to_payload(value)
    if kind is int:
        text = int.__repr__(value)
    elif kind is str:
        text = encode_basestring_ascii(value)
    else:
        try:
            text = _ENCODER.encode(value)
        except (TypeError, ValueError):
            return to_payload(value)  # raises the CodecError with its advice
    payload = Payload(text.encode(), JSON)
    return seal(payload) if ACTIVE_CHAIN[0] else payload


def encode_plain(value: Any) -> Payload | None:
    """``plain_payload(value)``: the JSON bytes without the codec chain."""
    if value is None:
        return None
    if ACTIVE_CHAIN[0] or type(value) is Payload:
        return plain_payload(value)  # the converter's bytes are exactly the fast path's
    return encode(value)


def decode(payload: Payload | None) -> Any:
    """``from_payload(payload)``."""
    if payload is None:
        return None
    if payload.encoding != JSON or not default_json_in_use():
        return from_payload(payload)
    data = payload.data
    if not data:
        return None
    try:
        text = data.decode()
        value, end = _SCAN(text, 0)
    except (StopIteration, UnicodeDecodeError, ValueError):
        return from_payload(payload)
    if end != len(text):
        return from_payload(payload)
    return value
