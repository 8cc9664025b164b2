"""Schema Registry interop on the real broker: with ``wire_format = "confluent"`` the
processor writes history, status and command outcomes in the registry's wire format, a
consumer that knows only confluent_kafka's own ``SchemaRegistryClient`` and
``AvroDeserializer`` reads them, and a command written by confluent_kafka's
``AvroSerializer`` starts a workflow beside one written single-object by the engine's client.

The registry is its REST API faked at the HTTP layer (tests/schema_registry_fake.py says
why no real registry server runs here); everything else is real.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from engine_harness import RunningEngine, running_engine
from schema_registry_fake import FakeRegistry, fake_schema_registry

from engine.adapters.kafka.history import read_instance_history
from engine.adapters.schema_registry import subject_of
from engine.cli.main import EXIT_ERROR
from engine.codec import current_schema, decode_message, encode_message, verify_history_chain
from engine.codec.confluent import forget_schema_ids, to_confluent
from engine.core.history import RuntimeStatus
from engine.core.messages import DeadLetter, StartWorkflow

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def registry() -> Iterator[tuple[str, FakeRegistry]]:
    with fake_schema_registry() as running:
        yield running
    forget_schema_ids()  # later tests in this process see no registry


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str, registry: tuple[str, FakeRegistry]) -> Iterator[RunningEngine]:
    url, _ = registry
    settings = {"schema_registry_url": url, "wire_format": "confluent"}
    with running_engine(kafka_bootstrap, partitions=2, settings_changes=settings) as running:
        yield running


def _read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every committed record of ``topic``, from the start to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sr-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records, ended = [], set()
        while len(ended) < len(partitions):
            msg = consumer.poll(10)
            assert msg is not None, f"no record or end of partition of {topic} within 10 s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                ended.add(msg.partition())
                continue
            records.append(msg)
        return records
    finally:
        consumer.close()


def _start_with_avro_serializer(engine: RunningEngine, url: str, instance_id: str) -> None:
    """A registry-aware producer of the commands topic: confluent_kafka's AvroSerializer
    registers the Command schema under ``<topic>-value`` and frames the record."""
    serializer = AvroSerializer(
        SchemaRegistryClient({"url": url}), json.dumps(current_schema("Command").raw)
    )
    start = {
        "name": "chain3.inline",
        "input": {"data": b"5", "encoding": "json"},
        "reuse_policy": "ERROR_IF_RUNNING",
        "request_id": uuid.uuid4().hex,
    }
    record = {"instance_id": instance_id, "body": ("io.turnstile.command.StartWorkflow", start)}
    topic = engine.topics.commands
    value = serializer(record, SerializationContext(topic, MessageField.VALUE))
    assert value[:1] == b"\x00"
    producer = Producer({"bootstrap.servers": engine.bootstrap, "partitioner": "murmur2_random"})
    producer.produce(topic, key=instance_id.encode(), value=value)
    assert producer.flush(30) == 0


def test_registry_consumers_read_what_the_engine_writes(
    engine: RunningEngine, registry: tuple[str, FakeRegistry]
) -> None:
    url, fake = registry
    from_serializer = f"sr-avro-{uuid.uuid4().hex[:8]}"
    _start_with_avro_serializer(engine, url, from_serializer)
    from_client = f"sr-client-{uuid.uuid4().hex[:8]}"
    engine.client.start("chain3.inline", 7, instance_id=from_client)
    for instance_id in (from_serializer, from_client):
        state = engine.wait_for_completion(instance_id, 60)
        assert state.status is RuntimeStatus.COMPLETED, state.failure

    topics = engine.topics
    assert set(fake.subjects) >= {
        subject_of(t) for t in (topics.history, topics.status, topics.command_outcomes)
    }
    assert subject_of(topics.commands) in fake.subjects  # registered by the serializer
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": url}))
    decoded: dict[str, list[dict[str, Any]]] = {}
    raw: dict[str, list[Any]] = {}
    for topic in (topics.history, topics.status, topics.command_outcomes):
        raw[topic] = records = _read_all(engine.bootstrap, topic)
        assert records and all(m.value()[:1] == b"\x00" for m in records), topic
        context = SerializationContext(topic, MessageField.VALUE)
        decoded[topic] = [deserialize(m.value(), context) for m in records]

    for instance_id in (from_serializer, from_client):
        history = [e for e in decoded[topics.history] if e["instance_id"] == instance_id]
        assert [e["sequence"] for e in history] == list(range(len(history)))
        assert "chain3.inline" in [e["body"].get("name") for e in history], history[:2]
        statuses = [s for s in decoded[topics.status] if s["instance_id"] == instance_id]
        assert statuses[-1]["status"] == "COMPLETED"
    outcomes = [o for o in decoded[topics.command_outcomes] if o["command"] == "StartWorkflow"]
    assert {o["instance_id"] for o in outcomes} >= {from_serializer, from_client}
    assert all(o["result"] == "ACCEPTED" for o in outcomes)

    # the engine's own readers take the registry's format too, hash chain included
    events = read_instance_history(engine.settings, from_serializer)
    assert [e.sequence for e in events] == [e["sequence"] for e in history]
    framed = [m.value() for m in raw[topics.history] if m.key() == from_serializer.encode()]
    assert verify_history_chain(framed) == events[-1].hash


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_processor_whose_registry_is_down_stops_at_start_with_the_reason(
    kafka_bootstrap: str,
) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env |= {"TURNSTILE_SCHEMA_REGISTRY_URL": url, "TURNSTILE_WIRE_FORMAT": "confluent"}
    namespace = f"sr-down-{uuid.uuid4().hex}"
    argv = ["run", "processor", "--module", "engine.examples.chain3", "--namespace", namespace]
    run = subprocess.run(
        [sys.executable, "-m", "engine", *argv, "--bootstrap-servers", kafka_bootstrap],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == EXIT_ERROR, run.stderr
    assert f"the Schema Registry at {url} does not answer" in run.stderr
    assert "schema_registry_url" in run.stderr


def test_a_command_framed_with_an_id_no_registry_knows_goes_to_dead_letters(
    engine: RunningEngine,
) -> None:
    instance_id = f"sr-unknown-{uuid.uuid4().hex[:8]}"
    start = StartWorkflow(instance_id, name="chain3.inline", request_id=uuid.uuid4().hex)
    unknown_id = 2**31 - 7  # the fake registry's ids are far below
    value = to_confluent(encode_message(start), unknown_id)
    producer = Producer({"bootstrap.servers": engine.bootstrap, "partitioner": "murmur2_random"})
    producer.produce(engine.topics.commands, key=instance_id.encode(), value=value)
    assert producer.flush(30) == 0

    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 60  # a bound on the wait, not a speed target
    while not letters and time.monotonic() < deadline:
        decoded = [decode_message(r.value) for r in engine.dead_letters() if r.value]
        letters = [d for d in decoded if isinstance(d, DeadLetter) and d.value == value]
        if not letters:
            time.sleep(0.5)
    assert letters, "the record did not reach the dead letters"
    assert f"schema id {unknown_id}" in letters[0].reason
    assert "HTTP 404" in letters[0].reason
    assert engine.client.get(instance_id) is None
