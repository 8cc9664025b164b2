"""How the worker's DeliveryProducer reports each record's outcome (fake producer for the
librdkafka error paths), and the settings its producer refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from engine.adapters.kafka.config import idempotent_producer_config
from engine.adapters.kafka.delivery import DeliveryProducer, Outcome, is_fatal, is_refusal
from engine.adapters.kafka.io import RecordRejectedError
from engine.core.errors import ConfigurationError

Callback = Callable[[KafkaError | None, Any], None]


class FakeProducer:
    """Keeps each record's delivery callback; ``raise_next`` is raised by the next produce."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.pending: list[Callback] = []
        self.raise_next: list[BaseException] = []
        self.purged = False

    def __len__(self) -> int:
        return len(self.pending)

    def produce(self, topic: str, **kwargs: Any) -> None:
        if self.raise_next:
            raise self.raise_next.pop(0)
        self.pending.append(kwargs["on_delivery"])

    def answer(self, error: KafkaError | None = None) -> None:
        self.pending.pop(0)(error, None)

    def poll(self, timeout: float) -> int:
        if self.purged:  # librdkafka reports purged records as failed on the next poll
            while self.pending:
                self.answer(KafkaError(KafkaError._PURGE_QUEUE, "purged"))
        return 0

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return len(self.pending)

    def purge(self, *flags: bool) -> None:
        self.purged = True


def _producer() -> tuple[DeliveryProducer, list[FakeProducer]]:
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    return DeliveryProducer({"x": 1}, "w", producer_factory=factory, queue_full_s=0.0), made


def test_every_record_gets_exactly_one_outcome() -> None:
    producer, [fake] = _producer()
    seen: list[Outcome] = []
    for _ in range(3):
        producer.produce("t", b"k", b"v", seen.append)
    assert producer.outstanding == 3
    fake.answer()
    fake.answer(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"))
    fake.answer()
    assert [e is None for e in seen] == [True, False, True]
    assert producer.outstanding == 0


def test_a_fatal_producer_is_replaced_and_what_it_held_comes_back_undelivered() -> None:
    producer, made = _producer()
    seen: list[Outcome] = []
    producer.produce("t", b"k", b"1", seen.append)
    producer.produce("t", b"k", b"2", seen.append)
    made[0].answer(KafkaError(KafkaError._FATAL, "out of order sequence", fatal=True))
    producer.poll(0)
    assert len(made) == 2 and producer.recreated == 1
    assert len(seen) == 2 and all(e is not None for e in seen)
    assert is_fatal(seen[0]) and not is_fatal(seen[1])
    producer.produce("t", b"k", b"3", seen.append)  # goes to the new producer
    assert len(made[1]) == 1


def test_a_fatal_error_on_produce_retries_on_a_new_producer() -> None:
    producer, made = _producer()
    made[0].raise_next.append(KafkaException(KafkaError(KafkaError._FATAL, "x", fatal=True)))
    producer.produce("t", b"k", b"v", lambda e: None)
    assert len(made) == 2 and len(made[1]) == 1


def test_a_local_refusal_raises_and_a_full_queue_reports_not_delivered() -> None:
    producer, [fake] = _producer()
    fake.raise_next.append(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "big")))
    with pytest.raises(RecordRejectedError, match="refused"):
        producer.produce("t", b"k", b"v", lambda e: None)
    seen: list[Outcome] = []
    fake.raise_next.append(BufferError("queue full"))
    producer.produce("t", b"k", b"v", seen.append)
    [error] = seen
    assert error is not None and not is_refusal(error), "produce it again later"


def test_only_errors_about_the_record_itself_are_refusals() -> None:
    assert is_refusal(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert is_refusal(KafkaError(KafkaError.INVALID_RECORD))
    assert not is_refusal(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert not is_refusal(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS))
    assert not is_refusal(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))


def test_the_worker_producer_is_idempotent_and_refuses_weaker_settings() -> None:
    config = idempotent_producer_config("127.0.0.1:9092", client_id="w", **{"linger.ms": 1})
    assert config["enable.idempotence"] is True and config["acks"] == "all"
    assert "transactional.id" not in config
    assert idempotent_producer_config("h:1", acks=-1)["acks"] == -1
    for bad in ({"acks": 1}, {"enable.idempotence": False}, {"transactional.id": "x"}):
        with pytest.raises(ConfigurationError, match="remove these from extra_kafka"):
            idempotent_producer_config("h:1", **bad)
