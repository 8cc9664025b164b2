"""TransactionalProducer and the consumer helpers against a real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from engine.adapters.kafka.config import (
    consumer_config,
    producer_config,
    transactional_producer_config,
)
from engine.adapters.kafka.io import (
    ProducerFencedError,
    TransactionalProducer,
    make_consumer,
    poll_batch,
    positions_for,
    resume_partitions,
    wait_for_assignment,
)

pytestmark = pytest.mark.kafka
TIMEOUT = 30.0

MakeTopic = Callable[..., str]


def _txn(bootstrap: str, txn_id: str | None = None) -> TransactionalProducer:
    txn_id = txn_id or f"test-io-{uuid.uuid4().hex}"
    return TransactionalProducer(transactional_producer_config(bootstrap, txn_id), txn_id)


def _committed_values(bootstrap: str, topic: str, partitions: int, expect: int) -> list[bytes]:
    consumer = Consumer(consumer_config(bootstrap, f"r-{uuid.uuid4().hex}"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    deadline = time.monotonic() + 3.0
    try:
        while time.monotonic() < deadline and len(out) <= expect:
            for m in poll_batch(consumer, 100, 0.2):
                value = m.value()
                if m.error() is None and value is not None:
                    out.append(value)
    finally:
        consumer.close()
    return out


def test_commit_reports_where_records_went_and_abort_hides_them(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=2)
    txn = _txn(kafka_bootstrap)
    try:
        txn.begin()
        txn.produce(topic, b"k", b"aborted")
        txn.abort()
        txn.begin()
        txn.produce(topic, b"a", b"one", partition=0)
        txn.produce(topic, b"b", b"two", partition=1, headers=[("h", b"1")])
        txn.produce(topic, b"c", b"three", partition=1)
        delivered = txn.commit()
    finally:
        txn.close()
    assert sorted((d.topic, d.partition) for d in delivered) == [
        (topic, 0),
        (topic, 1),
        (topic, 1),
    ]
    second = sorted(d.offset for d in delivered if d.partition == 1)
    assert second[1] == second[0] + 1, "records of one partition get consecutive offsets"
    assert txn.last_delivered == delivered
    assert sorted(_committed_values(kafka_bootstrap, topic, 2, 3)) == [b"one", b"three", b"two"]


def test_offsets_commit_with_the_transaction(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    source, sink = make_topic(partitions=1), make_topic(partitions=1)
    plain = Producer(producer_config(kafka_bootstrap))
    for i in range(3):
        plain.produce(source, str(i).encode(), b"k")
    assert plain.flush(TIMEOUT) == 0
    group = f"g-{uuid.uuid4().hex}"
    consumer = make_consumer(consumer_config(kafka_bootstrap, group), [source])
    txn = _txn(kafka_bootstrap)
    try:
        assignment, early = wait_for_assignment(consumer, TIMEOUT)
        assert [tp.partition for tp in assignment] == [0]
        records = list(early)
        deadline = time.monotonic() + TIMEOUT
        while len(records) < 3 and time.monotonic() < deadline:
            records += [m for m in poll_batch(consumer, 10, 0.2) if m.error() is None]
        positions = positions_for(consumer, assignment)
        assert [tp.offset for tp in positions] == [3]
        txn.begin()
        txn.produce(sink, b"k", b"done")
        txn.send_offsets(positions, consumer.consumer_group_metadata())
        txn.commit()
        committed = consumer.committed([TopicPartition(source, 0)], timeout=TIMEOUT)
        assert committed[0].offset == 3
        consumer.pause(assignment)
        resume_partitions(consumer, assignment)
    finally:
        txn.close()
        consumer.close()


def test_a_second_producer_with_the_same_id_fences_the_first(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=1)
    txn_id = f"test-fence-{uuid.uuid4().hex}"
    first = _txn(kafka_bootstrap, txn_id)
    first.begin()
    first.produce(topic, b"k", b"zombie")
    second = _txn(kafka_bootstrap, txn_id)
    try:
        with pytest.raises(ProducerFencedError):
            first.commit()
        second.begin()
        second.produce(topic, b"k", b"live")
        second.commit()
    finally:
        second.close()
    assert _committed_values(kafka_bootstrap, topic, 1, 1) == [b"live"]


def test_poll_batch_returns_as_soon_as_one_record_is_there(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=1)
    consumer = Consumer(consumer_config(kafka_bootstrap, f"g-{uuid.uuid4().hex}"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    plain = Producer(producer_config(kafka_bootstrap))
    try:
        assert poll_batch(consumer, 500, 0.5) == []
        plain.produce(topic, b"x", b"k")
        plain.flush(TIMEOUT)
        started = time.monotonic()
        got = []
        while not got and time.monotonic() - started < TIMEOUT:
            got = [m for m in poll_batch(consumer, 500, 2.0) if m.error() is None]
        assert len(got) == 1
        assert time.monotonic() - started < 1.5, "did not wait for a full batch"
    finally:
        consumer.close()
