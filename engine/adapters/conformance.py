"""Checks that a Kafka cluster behaves as the engine's exactly-once design assumes.

The engine commits every turn as one Kafka transaction together with the consumed offsets.
That is only sound if the broker in use really hides aborted records from read_committed
consumers, commits transactional offsets atomically with the output, and places keyed
records where the Java client would. These checks prove it on any cluster (they create and
delete their own uniquely named topics), so a misconfigured or non-Kafka broker is caught
before it silently breaks the guarantee.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from engine.adapters.kafka_config import (
    admin_config,
    consumer_config,
    expected_partition,
    producer_config,
    transactional_producer_config,
)
from engine.core.errors import BrokerError

__all__ = ["CheckResult", "run_conformance"]

_END = b"end"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check, with a one-line explanation either way."""

    name: str
    passed: bool
    detail: str


class _Context:
    """Shared state of one conformance run: the cluster, a run ID and the topics to clean."""

    def __init__(self, bootstrap: str, timeout: float) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.run_id = uuid.uuid4().hex[:8]
        self.admin = AdminClient(admin_config(bootstrap))
        self.topics: list[str] = []

    def topic(self, label: str, partitions: int) -> str:
        """Create a uniquely named topic and wait until it exists."""
        name = f"turnstile-conformance-{label}-{self.run_id}"
        futures = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=self.timeout,
        )
        try:
            futures[name].result(timeout=self.timeout)
        except Exception as error:
            raise BrokerError(
                f"could not create topic {name} on {self.bootstrap}: {error}. Check that the "
                f"broker is up ('python -m engine dev kafka status')."
            ) from error
        self.topics.append(name)
        self._await_metadata(name, partitions)
        return name

    def _await_metadata(self, name: str, partitions: int) -> None:
        """Wait until the broker (not only the controller) knows every partition."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            description = self.admin.list_topics(topic=name, timeout=self.timeout).topics.get(name)
            if (
                description is not None
                and description.error is None
                and len(description.partitions) == partitions
            ):
                return
            time.sleep(0.05)
        raise BrokerError(f"topic {name} did not appear in the metadata within {self.timeout}s")

    def cleanup(self) -> None:
        if self.topics:
            self.admin.delete_topics(self.topics, operation_timeout=self.timeout)


def _transactional_producer(ctx: _Context, label: str) -> Producer:
    producer = Producer(
        transactional_producer_config(ctx.bootstrap, f"turnstile-conformance-{label}-{ctx.run_id}")
    )
    producer.init_transactions(ctx.timeout)
    return producer


def _in_transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value)
    producer.flush(10)
    if commit:
        producer.commit_transaction(10)
    else:
        producer.abort_transaction(10)


def _read_until_end(ctx: _Context, topic: str, isolation: str) -> list[bytes]:
    """Every value of partition 0 up to the end marker, as a consumer with ``isolation``."""
    group = f"turnstile-conformance-reader-{uuid.uuid4().hex}"
    consumer = Consumer(consumer_config(ctx.bootstrap, group, **{"isolation.level": isolation}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + ctx.timeout
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            value = message.value() or b""
            if value == _END:
                return values
            values.append(value)
    finally:
        consumer.close()
    raise BrokerError(f"timed out after {ctx.timeout:.0f}s reading {topic} ({isolation})")


def _check_transactions(ctx: _Context) -> CheckResult:
    """Committed records are visible to read_committed readers; aborted ones never are."""
    topic = ctx.topic("txn", 1)
    producer = _transactional_producer(ctx, "txn")
    _in_transaction(producer, topic, [b"committed-1", b"committed-2"], commit=True)
    _in_transaction(producer, topic, [b"aborted-1", b"aborted-2"], commit=False)
    _in_transaction(producer, topic, [b"committed-3", _END], commit=True)
    committed = _read_until_end(ctx, topic, "read_committed")
    uncommitted = _read_until_end(ctx, topic, "read_uncommitted")
    expected = [b"committed-1", b"committed-2", b"committed-3"]
    passed = committed == expected and b"aborted-1" in uncommitted
    detail = (
        f"read_committed saw {len(committed)} records (expected {len(expected)}), "
        f"read_uncommitted saw {len(uncommitted)} including the aborted ones"
    )
    return CheckResult("transactions hide aborted records", passed, detail)


def _committed_offset(ctx: _Context, group: str, topic: str) -> int:
    consumer = Consumer(consumer_config(ctx.bootstrap, group))
    try:
        [position] = consumer.committed([TopicPartition(topic, 0)], timeout=ctx.timeout)
        return int(position.offset)
    finally:
        consumer.close()


def _check_offsets_in_transaction(ctx: _Context) -> CheckResult:
    """``send_offsets_to_transaction`` commits offsets with the output, and only on commit."""
    source, sink = ctx.topic("offsets-in", 1), ctx.topic("offsets-out", 1)
    _in_transaction(_transactional_producer(ctx, "seed"), source, [b"1", b"2"], commit=True)
    group = f"turnstile-conformance-group-{ctx.run_id}"
    consumer = Consumer(consumer_config(ctx.bootstrap, group))
    consumer.assign([TopicPartition(source, 0, 0)])
    producer = _transactional_producer(ctx, "ctp")
    try:
        offsets = []
        for commit in (True, False):
            message = _poll_one(consumer, ctx.timeout)
            producer.begin_transaction()
            producer.produce(sink, value=(message.value() or b"") + b"-out")
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())
            if commit:
                producer.commit_transaction(10)
            else:
                producer.abort_transaction(10)
            offsets.append(_committed_offset(ctx, group, source))
    finally:
        consumer.close()
    passed = offsets == [1, 1]
    detail = f"group offset after commit: {offsets[0]} (expected 1), after abort: {offsets[1]}"
    return CheckResult("offsets commit with the transaction", passed, detail)


def _poll_one(consumer: Consumer, timeout: float) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            return message
    raise BrokerError(f"no record arrived within {timeout:.0f}s")


def _check_partitioner(ctx: _Context) -> CheckResult:
    """Keyed records land where the Java client's murmur2 partitioner would put them."""
    partitions = 12
    topic = ctx.topic("keys", partitions)
    producer = Producer(producer_config(ctx.bootstrap))
    landed: dict[bytes, int] = {}

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        key, partition = message.key(), message.partition()
        if error is None and key is not None and partition is not None:
            landed[key] = partition

    keys = [f"instance-{i}".encode() for i in range(50)]
    for key in keys:
        producer.produce(topic, key=key, value=b"x", on_delivery=on_delivery)
    producer.flush(ctx.timeout)
    wrong = [k for k in keys if landed.get(k) != expected_partition(k, partitions)]
    detail = f"{len(keys) - len(wrong)}/{len(keys)} keys on the Java murmur2 partition"
    return CheckResult("keys partitioned like the Java client", not wrong, detail)


def run_conformance(
    bootstrap_servers: str,
    *,
    timeout: float = 30.0,
    progress: Callable[[str], None] = lambda _: None,
) -> list[CheckResult]:
    """Run every check against ``bootstrap_servers``; topics are deleted afterwards."""
    ctx = _Context(bootstrap_servers, timeout)
    checks = (_check_transactions, _check_offsets_in_transaction, _check_partitioner)
    results: list[CheckResult] = []
    try:
        for check in checks:
            title = (check.__doc__ or check.__name__).splitlines()[0].replace("``", "")
            progress(f"checking: {title}")
            results.append(check(ctx))
    finally:
        ctx.cleanup()
    return results
