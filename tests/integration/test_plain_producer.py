"""The commands topic is a public contract: a plain Kafka producer that knows nothing of the
engine's code - only ``schemas/Command.avsc``, an Avro library and the single-object
encoding spec - starts a workflow, and the engine runs it to completion.

Everything on the producing side is written from the specs: the schema file is parsed with
fastavro, the single-object header (``C3 01`` + the little-endian CRC-64-AVRO fingerprint
of the schema's Parsing Canonical Form) is built by hand, and the record is produced by a
bare confluent-kafka producer with the murmur2 partitioner.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import Producer
from engine_harness import RunningEngine, read_topic, running_engine

from engine.core.history import RuntimeStatus

pytestmark = pytest.mark.kafka

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "Command.avsc"
OUTCOME_FILE = SCHEMA_FILE.with_name("CommandOutcome.avsc")


def crc64_avro(data: bytes) -> int:
    """The 64-bit Rabin fingerprint of the Avro specification ("Schema Fingerprints")."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def header_of(schema_json: dict) -> bytes:
    canonical = fastavro.schema.to_parsing_canonical_form(schema_json)
    return b"\xc3\x01" + crc64_avro(canonical.encode()).to_bytes(8, "little")


def single_object(schema_json: dict, record: dict) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema_json), record)
    return header_of(schema_json) + body.getvalue()


def read_single_object(schema_json: dict, value: bytes) -> dict:
    header = header_of(schema_json)
    assert value[: len(header)] == header, "not a record of this schema"
    parsed = fastavro.parse_schema(schema_json)
    record = fastavro.schemaless_reader(io.BytesIO(value[len(header) :]), parsed)
    assert isinstance(record, dict)
    return record


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=6) as running:
        yield running


@pytest.mark.parametrize("workflow", ["chain3.inline", "chain3.activities"])
def test_a_plain_producer_starts_a_workflow(engine: RunningEngine, workflow: str) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    instance_id = f"plain-{uuid.uuid4().hex}"
    request_id = uuid.uuid4().hex
    start = {
        "name": workflow,
        "input": {"data": b"100", "encoding": "json"},
        "reuse_policy": "ERROR_IF_RUNNING",
        "request_id": request_id,
        "tags": {"producer": "plain"},
    }
    value = single_object(
        schema,
        {"instance_id": instance_id, "body": ("io.turnstile.command.StartWorkflow", start)},
    )
    producer = Producer({"bootstrap.servers": engine.bootstrap, "partitioner": "murmur2_random"})
    producer.produce(engine.topics.commands, key=instance_id.encode(), value=value)
    assert producer.flush(30) == 0

    state = engine.client.wait_for_completion(instance_id, 60)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output == 103
    assert state.tags == {"producer": "plain"}
    assert not engine.dead_letters(), "the plain record was accepted as it is"

    # the answer, read the same way: a bare consumer (read_committed) and the schema file
    outcome_schema = json.loads(OUTCOME_FILE.read_text())
    answers = [
        read_single_object(outcome_schema, r.value)
        for r in read_topic(engine.bootstrap, engine.topics.command_outcomes)
        if r.key == instance_id.encode() and r.value is not None
    ]
    assert [(a["request_id"], a["command"], a["result"]) for a in answers] == [
        (request_id, "StartWorkflow", "ACCEPTED")
    ]
    assert answers[0]["instance_id"] == instance_id and not answers[0]["duplicate"]
