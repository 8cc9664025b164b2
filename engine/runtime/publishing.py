"""Checking what ``ctx.publish`` is given and turning it into the event that journals it.

Pure: the value is made into bytes here (its bytes, or JSON); Avro needs fastavro and so
the codec, which the processor calls when it produces the record (the event keeps the JSON
form and the schema). Anything malformed is a :class:`PublishError` at the call, in the
workflow's own turn, so the workflow fails with the reason instead of a record going out
wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.core.errors import CodecError, PublishError
from engine.core.history import RecordPublished
from engine.core.payloads import RAW, Payload
from engine.runtime.fastjson import encode_plain


def publish_request(
    topic: str,
    value: Any,
    key: str | None,
    headers: Mapping[str, str] | None,
    partition: int | None,
    avro_schema: str | Mapping[str, Any] | None,
) -> RecordPublished:
    """The event for one ``ctx.publish`` call (``task_id`` is set by the generation)."""
    if not isinstance(topic, str) or not topic.strip():
        raise PublishError(f"ctx.publish needs a topic name, got {topic!r}")
    if key is not None and not isinstance(key, str):
        raise PublishError(f"ctx.publish: key must be a str or None, got {type(key).__name__}")
    if partition is not None and (
        isinstance(partition, bool) or not isinstance(partition, int) or partition < 0
    ):
        raise PublishError(f"ctx.publish: partition must be a number >= 0, got {partition!r}")
    return RecordPublished(
        task_id=0,
        topic=topic,
        value=_value(value, avro_schema),
        key=key,
        partition=partition,
        headers=_headers(headers),
        avro_schema=_schema_text(avro_schema),
    )


def _value(value: Any, avro_schema: object) -> Payload:
    if isinstance(value, bytes | bytearray | memoryview):
        if avro_schema is not None:
            raise PublishError(
                "ctx.publish: a bytes value is published as it is; pass the value itself "
                "(a dict) to have it written with avro_schema"
            )
        return Payload(bytes(value), RAW)
    try:
        payload = encode_plain(value)
    except (CodecError, TypeError, ValueError) as exc:
        raise PublishError(f"ctx.publish: the value cannot be written as JSON: {exc}") from exc
    return Payload(b"null") if payload is None else payload


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise PublishError("ctx.publish: headers must be a mapping of str to str")
    out: dict[str, str] = {}
    for name, text in headers.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise PublishError(
                f"ctx.publish: header {name!r} must map a str to a str (header values are "
                f"text; encode binary values, e.g. as base64)"
            )
        out[name] = text
    return out


def _schema_text(schema: str | Mapping[str, Any] | None) -> str:
    if schema is None:
        return ""
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except ValueError as exc:
            raise PublishError(f"ctx.publish: avro_schema is not valid JSON: {exc}") from exc
    elif isinstance(schema, Mapping):
        parsed = dict(schema)
    else:
        raise PublishError("ctx.publish: avro_schema must be the schema as JSON text or a dict")
    return json.dumps(parsed, separators=(",", ":"), sort_keys=True)
