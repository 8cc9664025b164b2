"""Shared fixtures: a real Kafka broker for tests marked ``kafka``, started only when needed.

The broker comes from ``$ENGINE_BOOTSTRAP_SERVERS`` when set (CI starts one up front, and
anyone can point the tests at their own cluster); otherwise the first test that needs it
starts the local broker in a fresh temporary data folder, and it is stopped when the run
ends. Unit tests never pay for it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

BOOTSTRAP_ENV = "ENGINE_BOOTSTRAP_SERVERS"
KAFKA_FIXTURE = "kafka_bootstrap"
TOPIC_TIMEOUT = 30.0

MakeTopic = Callable[..., str]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the broker is a ``kafka`` test, so ``-m "not kafka"`` skips it."""
    for item in items:
        if KAFKA_FIXTURE in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "kafka"
        ):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(autouse=True)
def _broker_for_kafka_tests(request: pytest.FixtureRequest) -> None:
    """Tests marked ``kafka`` get the broker started before they run, even if they only use
    ``ENGINE_BOOTSTRAP_SERVERS``; other tests never trigger it."""
    if request.node.get_closest_marker("kafka") is not None:
        request.getfixturevalue(KAFKA_FIXTURE)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap servers of the Kafka broker under test (``host:port``).

    Also exported as ``$ENGINE_BOOTSTRAP_SERVERS`` for code under test that reads it.
    """
    configured = os.environ.get(BOOTSTRAP_ENV)
    if configured:
        yield configured
        return
    from engine.dev.local_kafka import LocalKafka

    broker = LocalKafka(Path(tmp_path_factory.mktemp("kafka")) / "broker")
    bootstrap = broker.start(timeout=120.0, fresh=True)
    os.environ[BOOTSTRAP_ENV] = bootstrap
    try:
        yield bootstrap
    finally:
        os.environ.pop(BOOTSTRAP_ENV, None)
        broker.stop()


@pytest.fixture(scope="session")
def admin(kafka_bootstrap: str) -> Any:
    """A confluent-kafka ``AdminClient`` connected to the broker under test."""
    from confluent_kafka.admin import AdminClient

    from engine.adapters.kafka.config import admin_config

    return AdminClient(admin_config(kafka_bootstrap))


def _await_metadata(admin: Any, topic: str, partitions: int) -> None:
    """Wait until the broker's metadata shows every partition of a new topic.

    CreateTopics returns once the controller has the topic; the broker serving metadata and
    produce requests learns of it a moment later. Tests start right after creating.
    """
    deadline = time.monotonic() + TOPIC_TIMEOUT
    while time.monotonic() < deadline:
        description = admin.list_topics(topic=topic, timeout=TOPIC_TIMEOUT).topics.get(topic)
        if (
            description is not None
            and description.error is None
            and len(description.partitions) == partitions
        ):
            return
        time.sleep(0.05)
    pytest.fail(f"topic {topic} did not show {partitions} partitions within {TOPIC_TIMEOUT}s")


@pytest.fixture
def make_topic(admin: Any, request: pytest.FixtureRequest) -> Iterator[MakeTopic]:
    """A factory: ``make_topic(partitions=1, prefix=None, config=None) -> name``.

    Each call creates a new, uniquely named topic (named after the test) and waits until
    it exists; the topics are deleted after the test.
    """
    from confluent_kafka.cimpl import NewTopic

    created: list[str] = []
    base = "".join(c if c.isalnum() or c in "-_" else "-" for c in request.node.name)[:60]

    def make(
        partitions: int = 1, prefix: str | None = None, config: dict[str, str] | None = None
    ) -> str:
        name = f"{prefix or 'test'}-{base}-{uuid.uuid4().hex[:8]}"
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        futures = admin.create_topics([topic], operation_timeout=TOPIC_TIMEOUT)
        futures[name].result(timeout=TOPIC_TIMEOUT)
        created.append(name)
        _await_metadata(admin, name, partitions)
        return name

    yield make
    if created:
        for future in admin.delete_topics(created, operation_timeout=TOPIC_TIMEOUT).values():
            # Best effort: a leftover topic must not fail the test.
            with contextlib.suppress(Exception):
                future.result(timeout=TOPIC_TIMEOUT)
