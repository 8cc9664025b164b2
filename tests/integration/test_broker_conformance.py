"""The broker in use must behave like Apache Kafka where exactly-once processing depends on it.

A broker that shows aborted records to read_committed consumers, commits transactional
offsets on abort, or places keys differently from the Java client is not Kafka for the
engine's purposes; these tests fail loudly on such a broker instead of letting the engine's
own tests pass on a false foundation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)

from engine.adapters.kafka.config import (
    consumer_config,
    producer_config,
    transactional_producer_config,
)
from engine.core.keys import murmur2_partition

pytestmark = pytest.mark.kafka

MakeTopic = Callable[..., str]
TIMEOUT = 30.0
END = b"end-of-test"

# (key, partitions) -> partition, printed by the Java client itself:
# Utils.toPositive(Utils.murmur2(key.getBytes(UTF_8))) % partitions with kafka-clients 4.1.1.
JAVA_PARTITIONS: list[tuple[str, int, int]] = [
    ("a", 100, 24),
    ("abcd", 100, 0),
    ("abcde", 3, 1),
    ("order-42", 32, 0),
    ("instance-0001", 32, 5),
    ("turnstile", 32, 22),
    ("héllo-wörld", 12, 0),
    ("wf/7f3c2a9e-1b2c-4d5e-8f90-0123456789ab", 12, 11),
]


def _group() -> str:
    return f"test-group-{uuid.uuid4().hex}"


def _txn_producer(bootstrap: str) -> Producer:
    producer = Producer(transactional_producer_config(bootstrap, f"test-txn-{uuid.uuid4().hex}"))
    producer.init_transactions(TIMEOUT)
    return producer


def _produce_in_transaction(
    producer: Producer, topic: str, values: list[bytes], *, commit: bool
) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value)
    # Without a flush, an abort would purge unsent records and they would never reach the
    # log; flushing makes the broker store them, so that hiding them is the broker's doing.
    assert producer.flush(TIMEOUT) == 0
    if commit:
        producer.commit_transaction(TIMEOUT)
    else:
        producer.abort_transaction(TIMEOUT)


def _read_until(consumer: Consumer, stop: Callable[[list[Message]], bool]) -> list[Message]:
    """Poll until ``stop(messages)`` is true; fail the test after ``TIMEOUT`` seconds."""
    messages: list[Message] = []
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        assert message.error() is None, message.error()
        messages.append(message)
        if stop(messages):
            return messages
    pytest.fail(f"timed out after {TIMEOUT}s; got {[m.value() for m in messages]}")


def _values_up_to_end(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = Consumer(consumer_config(bootstrap, _group(), **{"isolation.level": isolation}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = _read_until(consumer, lambda ms: ms[-1].value() == END)
    finally:
        consumer.close()
    return [m.value() or b"" for m in messages[:-1]]


def test_read_committed_never_sees_aborted_records(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=1)
    producer = _txn_producer(kafka_bootstrap)
    _produce_in_transaction(producer, topic, [b"c1", b"c2"], commit=True)
    _produce_in_transaction(producer, topic, [b"a1", b"a2", b"a3"], commit=False)
    _produce_in_transaction(producer, topic, [b"c3"], commit=True)
    _produce_in_transaction(producer, topic, [b"a4"], commit=False)
    _produce_in_transaction(producer, topic, [END], commit=True)

    committed = _values_up_to_end(kafka_bootstrap, topic, "read_committed")
    uncommitted = _values_up_to_end(kafka_bootstrap, topic, "read_uncommitted")

    assert committed == [b"c1", b"c2", b"c3"]
    # The aborted records really were written: a read_uncommitted reader sees them, so the
    # read_committed result above proves the broker filters them, not that they were lost.
    assert uncommitted == [b"c1", b"c2", b"a1", b"a2", b"a3", b"c3", b"a4"]


def _committed_offset(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0, read by a fresh consumer."""
    reader = Consumer(consumer_config(bootstrap, group))
    try:
        [position] = reader.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
    finally:
        reader.close()
    return int(position.offset)


def _transform_batch(
    consumer: Consumer, producer: Producer, sink: str, count: int, *, commit: bool
) -> None:
    """One consume-transform-produce turn with the consumed offsets in the transaction."""
    messages = _read_until(consumer, lambda ms: len(ms) == count)
    producer.begin_transaction()
    for message in messages:
        producer.produce(sink, value=(message.value() or b"") + b"-out")
    positions = consumer.position(consumer.assignment())
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), TIMEOUT)
    if commit:
        producer.commit_transaction(TIMEOUT)
    else:
        producer.abort_transaction(TIMEOUT)


def test_offsets_sent_to_a_transaction_commit_only_with_it(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    source, sink = make_topic(partitions=1), make_topic(partitions=1)
    values = [f"in-{i}".encode() for i in range(5)]
    _produce_in_transaction(_txn_producer(kafka_bootstrap), source, values, commit=True)
    group = _group()
    consumer = Consumer(consumer_config(kafka_bootstrap, group))
    consumer.subscribe([source])  # a group member, as a processor is (KIP-447 fencing)
    producer = _txn_producer(kafka_bootstrap)
    try:
        _transform_batch(consumer, producer, sink, 3, commit=True)
        assert _committed_offset(kafka_bootstrap, group, source) == 3

        _transform_batch(consumer, producer, sink, 2, commit=False)
        assert _committed_offset(kafka_bootstrap, group, source) == 3
    finally:
        consumer.close()

    _produce_in_transaction(producer, sink, [END], commit=True)
    output = _values_up_to_end(kafka_bootstrap, sink, "read_committed")
    assert output == [b"in-0-out", b"in-1-out", b"in-2-out"]


def test_consumer_group_gets_its_whole_assignment(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=4)
    assigned: list[TopicPartition] = []
    consumer = Consumer(consumer_config(kafka_bootstrap, _group()))
    started = time.monotonic()
    try:
        consumer.subscribe([topic], on_assign=lambda _c, parts: assigned.extend(parts))
        while not assigned and time.monotonic() - started < 60.0:
            consumer.poll(0.1)
    finally:
        consumer.close()
    assert sorted(p.partition for p in assigned) == [0, 1, 2, 3]


@pytest.mark.parametrize("partitions", [1, 3, 32])
def test_topics_are_created_with_the_requested_partitions(
    admin: Any, make_topic: MakeTopic, partitions: int
) -> None:
    topic = make_topic(partitions=partitions)
    futures = admin.describe_topics(TopicCollection([topic]), request_timeout=TIMEOUT)
    description = futures[topic].result(timeout=TIMEOUT)
    assert description.name == topic
    assert sorted(p.id for p in description.partitions) == list(range(partitions))
    assert all(len(p.replicas) == 1 and p.leader is not None for p in description.partitions)


def _produce_keys(bootstrap: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    """Produce one record per key with the engine's producer settings; key -> partition."""
    landed: dict[bytes, int] = {}
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        key, partition = message.key(), message.partition()
        if error is not None:
            failures.append(error)
        elif key is not None and partition is not None:
            landed[key] = partition

    producer = Producer(producer_config(bootstrap))
    for key in keys:
        producer.produce(topic, key=key, value=b"v", on_delivery=on_delivery)
    assert producer.flush(TIMEOUT) == 0, "records still in flight after the timeout"
    assert not failures, failures
    return landed


@pytest.mark.parametrize("partitions", sorted({n for _, n, _ in JAVA_PARTITIONS}))
def test_engine_producers_partition_keys_like_the_java_client(
    kafka_bootstrap: str, make_topic: MakeTopic, partitions: int
) -> None:
    topic = make_topic(partitions=partitions)
    vectors = {k.encode("utf-8"): p for k, n, p in JAVA_PARTITIONS if n == partitions}
    generated = [f"instance-{uuid.uuid4()}".encode() for _ in range(100)]
    landed = _produce_keys(kafka_bootstrap, topic, [*vectors, *generated])
    for key, java in vectors.items():
        assert landed[key] == java, key
    for key in generated:
        assert landed[key] == murmur2_partition(key, partitions), key
