"""How TransactionalProducer reacts to librdkafka's transactional errors (fake producer)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from engine.adapters.kafka.io import (
    AbortedTransaction,
    ProducerFencedError,
    RecordRejectedError,
    TransactionalProducer,
)


def _error(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "simulated", **flags))


class FakeProducer:
    """Records calls; ``fail[name]`` holds exceptions to raise on the next calls of ``name``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[str] = []
        self.fail: dict[str, list[BaseException]] = {}
        self.closed = False

    def _call(self, name: str) -> None:
        self.calls.append(name)
        pending = self.fail.get(name)
        if pending:
            raise pending.pop(0)

    def init_transactions(self, timeout: float) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        self._call("produce")

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self._call("send_offsets")

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort")

    def poll(self, timeout: float) -> int:
        time.sleep(timeout)
        return 0

    def purge(self, *args: Any) -> None:
        self.calls.append("purge")

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.made: list[FakeProducer] = []

    def __call__(self, config: dict[str, Any]) -> Any:
        self.made.append(FakeProducer(config))
        return self.made[-1]

    @property
    def current(self) -> FakeProducer:
        return self.made[-1]


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def txn(factory: Factory) -> TransactionalProducer:
    producer = TransactionalProducer({"x": 1}, "app.worker.w1", 0.5, producer_factory=factory)
    producer.begin()
    producer.produce("t", b"k", b"v")
    return producer


def test_config_carries_the_transactional_id(factory: Factory, txn: TransactionalProducer) -> None:
    assert factory.current.config == {"x": 1, "transactional.id": "app.worker.w1"}
    assert factory.current.calls[:2] == ["init", "begin"]


def test_retriable_commit_errors_are_retried(factory: Factory, txn: TransactionalProducer) -> None:
    factory.current.fail["commit"] = [_error(KafkaError._TRANSPORT, retriable=True)]
    txn.commit()
    assert factory.current.calls.count("commit") == 2
    assert not txn.in_transaction


def test_abortable_errors_abort_and_raise(factory: Factory, txn: TransactionalProducer) -> None:
    factory.current.fail["commit"] = [_error(KafkaError._STATE, txn_requires_abort=True)]
    with pytest.raises(AbortedTransaction):
        txn.commit()
    assert factory.current.calls[-1] == "abort"
    assert len(factory.made) == 1 and not txn.in_transaction


@pytest.mark.parametrize(
    "error",
    [
        _error(KafkaError._TIMED_OUT, retriable=True),
        _error(KafkaError._FATAL, fatal=True),
    ],
)
def test_commit_timeouts_and_fatal_errors_recreate_the_producer(
    factory: Factory, txn: TransactionalProducer, error: KafkaException
) -> None:
    old = factory.current
    old.fail["commit"] = [error]
    with pytest.raises(AbortedTransaction):
        txn.commit()
    assert old.closed and len(factory.made) == 2
    assert factory.current.calls == ["init"], "the new producer fenced the old one"
    assert txn.recreated == 1 and not txn.in_transaction
    txn.begin()
    assert txn.in_transaction


def test_an_abort_that_times_out_recreates_the_producer(
    factory: Factory, txn: TransactionalProducer
) -> None:
    factory.current.fail["abort"] = [_error(KafkaError._TIMED_OUT, retriable=True)]
    txn.abort()
    assert len(factory.made) == 2 and not txn.in_transaction


def test_send_offsets_abortable_error(factory: Factory, txn: TransactionalProducer) -> None:
    factory.current.fail["send_offsets"] = [
        _error(KafkaError._TRANSPORT, retriable=True),
        _error(KafkaError._STATE, txn_requires_abort=True),
    ]
    with pytest.raises(AbortedTransaction):
        txn.send_offsets([TopicPartition("t", 0, 5)], object())
    assert factory.current.calls.count("send_offsets") == 2
    assert factory.current.calls[-1] == "abort"


def test_being_fenced_stops_instead_of_fencing_back(
    factory: Factory, txn: TransactionalProducer
) -> None:
    factory.current.fail["commit"] = [_error(KafkaError._FENCED, fatal=True)]
    with pytest.raises(ProducerFencedError, match="own id"):
        txn.commit()
    assert len(factory.made) == 1


def test_a_refused_record_leaves_the_transaction_open(
    factory: Factory, txn: TransactionalProducer
) -> None:
    factory.current.fail["produce"] = [_error(KafkaError.MSG_SIZE_TOO_LARGE)]
    with pytest.raises(RecordRejectedError):
        txn.produce("t", b"k", b"big")
    assert txn.in_transaction


def test_a_full_queue_waits_then_gives_up(factory: Factory, txn: TransactionalProducer) -> None:
    factory.current.fail["produce"] = [BufferError(), BufferError()]
    txn.produce("t", b"k", b"v")
    assert factory.current.calls.count("produce") == 4
    always_full: list[BaseException] = [BufferError() for _ in range(1000)]
    factory.current.fail["produce"] = always_full
    with pytest.raises(AbortedTransaction, match="queue stayed full"):
        txn.produce("t", b"k", b"v")


def test_calls_outside_a_transaction_are_refused(factory: Factory) -> None:
    producer = TransactionalProducer({}, "id", producer_factory=factory)
    calls: list[Callable[[], object]] = [
        lambda: producer.produce("t", None, b""),
        producer.commit,
        producer.abort,
    ]
    for call in calls:
        with pytest.raises(Exception, match="begin"):
            call()
