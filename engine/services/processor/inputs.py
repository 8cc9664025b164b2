"""Which records the processor accepts, and on which topic: the checks every input record
passes before it reaches a handler.

A record that fails them is not an error of the partition: the state machine parks it in
dead letters with the reason, so the partition goes on.
"""

from __future__ import annotations

from engine.codec import decode_message
from engine.config.topics import TopicNames
from engine.core.errors import CodecError
from engine.core.keys import murmur2_partition
from engine.core.messages import (
    COMMAND_TYPES,
    ENGINE_COMMAND_TYPES,
    ActivityResult,
    CancelWorkflow,
    ChildResult,
    ConcurrencySlot,
    Message,
    RaiseEvent,
    RerunFrom,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.services.records import RawRecord

#: Record kinds that instances send each other on ``instance-messages``.
INSTANCE_MESSAGE_TYPES: frozenset[type[Message]] = frozenset(
    {
        StartWorkflow,
        RaiseEvent,
        ChildResult,
        TerminateWorkflow,
        CancelWorkflow,
        ConcurrencySlot,
        RerunFrom,
    }
)


def accepted_kinds(topics: TopicNames) -> dict[str, frozenset[type[Message]]]:
    """The record kinds each input topic may carry."""
    return {
        # ActivityResult: an attempt finished by task token (services/client/completions.py)
        topics.commands: frozenset((*COMMAND_TYPES, *ENGINE_COMMAND_TYPES, ActivityResult)),
        topics.activity_results: frozenset({ActivityResult}),
        topics.instance_messages: INSTANCE_MESSAGE_TYPES,
    }


def validate(
    record: RawRecord, accepts: dict[str, frozenset[type[Message]]], partitions: int
) -> Message:
    """The decoded message, or :class:`CodecError` saying what is wrong with the record."""
    kinds = accepts.get(record.topic)
    if kinds is None:
        raise CodecError(f"topic {record.topic!r} is not an input topic of the processor")
    if record.value is None:
        raise CodecError("record has no value (tombstones are not accepted on input topics)")
    decoded = decode_message(record.value)
    if type(decoded) not in kinds:
        raise CodecError(f"{decoded.KIND} records are not accepted on topic {record.topic}")
    key = decoded.instance_id.encode()
    if record.key != key:
        raise CodecError(
            f"record key {record.key!r} does not match its instance id {decoded.instance_id!r}; "
            f"key every record by its instance id (UTF-8)"
        )
    expected = murmur2_partition(key, partitions)
    if expected != record.partition:
        raise CodecError(
            f"record for {decoded.instance_id!r} is on partition {record.partition} but "
            f"murmur2 gives {expected}: configure the producer with the murmur2 partitioner"
        )
    return decoded
