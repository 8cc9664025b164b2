"""Producing a batch so that a record the broker refuses fails only the instance behind it.

The processor produces a batch's records one by one into its transaction. A record can be
refused up front (the producer's own size check, an unknown topic: ``RecordRejectedError``)
or on delivery (the broker's ``max.message.bytes``, an authorization error: the commit then
fails with :class:`AbortedTransaction`). Either way the refused record's origin - the
instance whose handling or turn made it - is known, and the loop redoes the batch with that
instance failed (see :mod:`engine.services.processor.poison`). Errors that are not about a
record (the broker is gone, the producer was fenced) still abort the whole batch.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import NoReturn

from confluent_kafka import KafkaError

from engine.adapters.kafka.io import (
    AbortedTransaction,
    RecordRejectedError,
    TransactionalProducer,
    kafka_error,
)
from engine.adapters.schema_registry import SINGLE_OBJECT, WireFormat
from engine.core.errors import BrokerRefusalError, InstanceTurnError, PayloadTooLargeError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.services.processor.ports import OutRecord

#: Delivery errors about one record (or its topic), not about the broker or the producer.
RECORD_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_EXCEPTION,
    }
)

Produced = tuple[int, OutRecord]
"""A record of the batch with the input partition whose processor made it."""


def record_size(record: OutRecord) -> int:
    size = len(record.key or b"") + len(record.value or b"")
    if record.headers:  # most records have none: no generator to build for them
        size += sum(len(name) + len(value) for name, value in record.headers)
    return size


def produce_batch(
    producer: TransactionalProducer,
    outputs: Sequence[Produced],
    record_limit: int,
    wire: WireFormat = SINGLE_OBJECT,
    tracked: Container[str] = frozenset(),
) -> None:
    """Produce every record into the open transaction, framed as ``wire`` says for its
    topic; a record over ``record_limit`` or refused by the producer raises
    :class:`InstanceTurnError` for its origin. Only records of a ``tracked`` topic have
    their offsets reported (the changelogs, whose offsets the processor keeps): the loop
    runs once per record of the batch, so it does no work a record does not need."""
    produce = producer.produce
    framed = bool(wire.schema_ids)
    for partition, r in outputs:
        topic, value = r.topic, r.value
        size = len(r.key or b"") + len(value or b"")
        if r.headers:
            size = record_size(r)
        if size > record_limit:
            error = PayloadTooLargeError(
                f"a record for {topic}", size, "max_record_bytes", record_limit
            )
            raise refusal(partition, r, failure_from_exception(error, retryable=False))
        if framed:
            value = wire.frame(topic, value)
        try:
            produce(topic, r.key, value, r.partition, r.headers, track=topic in tracked)
        except RecordRejectedError as exc:
            _rejected(producer, partition, r, exc)


def _rejected(
    producer: TransactionalProducer, partition: int, record: OutRecord, exc: RecordRejectedError
) -> NoReturn:
    cause = kafka_error(exc.__cause__) if exc.__cause__ is not None else None
    if cause is None or cause.code() in RECORD_ERRORS:
        raise refusal(partition, record, failure_from_exception(exc, retryable=False)) from exc
    # Not this record: the transaction is in an error state, typically because the broker
    # refused an earlier record; the caller finds that one among the refused.
    producer.abort()
    raise AbortedTransaction(f"producing the batch failed: {exc}") from exc


def refused_in_delivery(
    producer: TransactionalProducer, outputs: Sequence[Produced]
) -> InstanceTurnError | None:
    """After an aborted commit: the first refused record that one instance made, if any."""
    for topic, key, error in producer.refused:
        if error.code() not in RECORD_ERRORS:
            continue
        for partition, r in outputs:
            if r.topic == topic and r.key == key:
                details = FailureDetails(
                    "RecordRefusedError",
                    f"the broker refused a record for {topic}: {error.str()}",
                    retryable=False,
                )
                return refusal(partition, r, details)
    return None


def refusal(partition: int, record: OutRecord, details: FailureDetails) -> InstanceTurnError:
    if not record.origin:
        raise BrokerRefusalError(
            f"a record for {record.topic} that no single instance made was refused: "
            f"{details.message}; check the topics (topics check) and the broker's limits"
        )
    return InstanceTurnError(
        record.origin,
        f"a record of its turn for {record.topic} was refused: {details.message}",
        details,
        partition=partition,
    )
