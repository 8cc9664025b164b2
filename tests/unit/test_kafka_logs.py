"""librdkafka's errors in the engine's words, and a lost connection said once a minute."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from engine.adapters.kafka import logs as kafka_logs
from engine.adapters.kafka.config import consumer_config, producer_config
from engine.adapters.kafka.logs import (
    LIBRDKAFKA_LOGGER,
    ConnectionWatch,
    explain_connection_error,
    unreachable_message,
    watch_of,
)


@dataclass
class FakeKafkaError:
    """The three methods of confluent_kafka.KafkaError the watch calls."""

    code_name: str
    text: str
    is_fatal: bool = False

    def name(self) -> str:
        return self.code_name

    def str(self) -> str:
        return self.text

    def fatal(self) -> bool:
        return self.is_fatal


REFUSED = "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused"


@pytest.mark.parametrize(
    ("detail", "words"),
    [
        (REFUSED, ["connection refused", "dev kafka start"]),
        ("Failed to resolve 'x.invalid:9092': Name or service not known", ["cannot resolve"]),
        ("Disconnected while requesting ApiVersion: might be caused by ...", ["not as a Kafka"]),
        ("SSL handshake failed: certificate verify failed", ["TLS handshake", "ssl.*"]),
        ("SASL authentication error: Authentication failed", ["credentials", "sasl.*"]),
        ("something else", ["cannot talk to Kafka"]),
    ],
)
def test_explanations_name_the_address_and_the_next_step(detail: str, words: list[str]) -> None:
    message = explain_connection_error("broker:9092", detail)
    assert "broker:9092" in message
    for word in words:
        assert word in message


def test_no_detail_means_no_answer_within_the_timeout() -> None:
    message = unreachable_message("broker:9092", None, 5)
    assert "no answer" in message and "5s" in message and "--connect-timeout" in message


def test_every_client_config_routes_logs_and_errors() -> None:
    for config in (producer_config("b:1"), consumer_config("b:1", "g")):
        assert config["logger"].name == LIBRDKAFKA_LOGGER
        watch = watch_of(config)
        assert watch is not None and watch.bootstrap_servers == "b:1"


def test_the_librdkafka_logger_is_silent_by_default() -> None:
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    assert not logger.propagate


def test_a_specific_error_is_kept_over_all_brokers_down() -> None:
    watch = ConnectionWatch("b:1")
    watch(FakeKafkaError("_TRANSPORT", REFUSED))
    watch(FakeKafkaError("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
    assert watch.last == REFUSED


def test_a_lost_connection_is_logged_once_per_minute_after_start_up(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(kafka_logs.time, "monotonic", lambda: clock[0])
    watch = ConnectionWatch("lost:9092")
    with caplog.at_level(logging.WARNING, logger="engine.kafka"):
        watch(FakeKafkaError("_TRANSPORT", REFUSED))  # during start-up: the caller reports
        clock[0] += kafka_logs.STARTUP_GRACE_S
        for _ in range(50):
            watch(FakeKafkaError("_TRANSPORT", REFUSED))
        assert len(caplog.records) == 1
        clock[0] += kafka_logs.REPEAT_AFTER_S
        watch(FakeKafkaError("_TRANSPORT", REFUSED))
    assert len(caplog.records) == 2
    assert "lost:9092" in caplog.records[0].getMessage()


def test_other_client_errors_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    watch = ConnectionWatch("b:1")
    with caplog.at_level(logging.WARNING, logger="engine.kafka"):
        watch(FakeKafkaError("_FATAL", "producer fenced", is_fatal=True))
    assert caplog.records[0].levelno == logging.ERROR
