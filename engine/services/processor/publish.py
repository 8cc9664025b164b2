"""Producing the records workflows publish (``ctx.publish``) in the turn's transaction.

The record is one more output of the batch, so it commits, or is dropped, with the
``RecordPublished`` event that journals it and the state change that made it: a
read_committed consumer of the user topic sees it exactly once. Only declared topics
(``publish_topics``) are written; anything else fails the instance with the reason, and a
topic is never created here.
"""

from __future__ import annotations

from engine.codec import encode_user_avro
from engine.core.errors import CodecError, PublishError
from engine.core.payloads import from_payload
from engine.runtime.actions import PublishRecord
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded


def publish_record(b: Batch, item: Loaded, a: PublishRecord, now_ms: int) -> None:
    """Queue the record in the batch; an undeclared topic or a value that does not fit its
    Avro schema raises :class:`PublishError` (the instance then fails alone)."""
    declared = b.env.publish_topics
    if a.topic not in declared:
        listed = ", ".join(sorted(declared)) or "none"
        raise PublishError(
            f"ctx.publish to topic {a.topic!r}, which is not declared for publishing "
            f"(declared: {listed}); add it to the publish_topics setting ([publish] topics "
            f"in the config file, TURNSTILE_PUBLISH_TOPICS or --publish-topic) and create "
            f"the topic; the engine never creates it"
        )
    headers = tuple((name, text.encode()) for name, text in a.headers.items())
    key = a.key.encode() if a.key is not None else None
    b.emit(a.topic, key, _value_bytes(a), a.partition, headers)


def _value_bytes(a: PublishRecord) -> bytes:
    if not a.avro_schema:
        return a.value.data
    try:
        return encode_user_avro(a.avro_schema, from_payload(a.value))
    except CodecError as exc:
        raise PublishError(f"ctx.publish to topic {a.topic!r}: {exc}") from exc
