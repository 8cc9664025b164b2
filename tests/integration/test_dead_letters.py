"""Unusable input never blocks a partition and is never silently dropped: it lands on the
dead-letters topic with the reason and where it came from, and the partition goes on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from engine_harness import Record, RunningEngine, running_engine, wait_until

from engine.codec import decode_message, encode_message
from engine.core.history import RuntimeStatus
from engine.core.keys import murmur2_partition
from engine.core.messages import ActivityResult, DeadLetter, StartWorkflow
from engine.core.payloads import to_payload

pytestmark = pytest.mark.kafka

PARTITIONS = 4


@pytest.fixture
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=PARTITIONS) as running:
        yield running


def _id(prefix: str, partition: int | None = None) -> str:
    while True:
        candidate = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if partition is None or murmur2_partition(candidate.encode(), PARTITIONS) == partition:
            return candidate


def _headers(record: Record) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers.items()}


def test_bad_records_go_to_dead_letters_and_the_partitions_go_on(engine: RunningEngine) -> None:
    commands = engine.topics.commands
    garbage_key = _id("garbage")
    garbage = engine.produce(commands, b"\x00not avro at all", garbage_key.encode())

    wrong_kind_key = _id("wrong-kind")
    result = ActivityResult(instance_id=wrong_kind_key, task_id=0, output=to_payload(1))
    wrong_kind = engine.produce(commands, encode_message(result), wrong_kind_key.encode())

    misplaced_key = _id("misplaced")
    right = murmur2_partition(misplaced_key.encode(), PARTITIONS)
    start = StartWorkflow(instance_id=misplaced_key, name="t.echo", input=to_payload("x"))
    misplaced = engine.produce(
        commands, encode_message(start), misplaced_key.encode(), partition=(right + 1) % PARTITIONS
    )

    # a valid workflow on each partition that received a bad record, started after it
    followers = {}
    for partition in sorted({garbage[0], wrong_kind[0], misplaced[0]}):
        follower = _id("after", partition)
        engine.client.start("t.echo", partition, instance_id=follower)
        followers[follower] = partition
    for follower, partition in followers.items():
        state = engine.client.wait_for_completion(follower, 60)
        assert (state.status, state.output) == (RuntimeStatus.COMPLETED, partition)

    letters = wait_until(
        lambda: (found := engine.dead_letters()) and len(found) >= 3 and found,
        60,
        what="three dead letters",
    )
    assert len(letters) == 3
    by_offset = {
        (int(_headers(r)["source-partition"]), int(_headers(r)["source-offset"])): r
        for r in letters
    }
    expected = {
        garbage: ("garbage", garbage_key, b"\x00not avro at all"),
        wrong_kind: ("ActivityResult records are not accepted", wrong_kind_key, None),
        misplaced: ("murmur2", misplaced_key, None),
    }
    assert set(by_offset) == set(expected)
    for source, (reason_part, key, raw) in expected.items():
        record = by_offset[source]
        headers = _headers(record)
        assert headers["source-topic"] == commands
        assert headers["reason"], "the reason is in the headers"
        if reason_part != "garbage":
            assert reason_part in headers["reason"], headers["reason"]
        assert record.key == key.encode()
        letter = decode_message(record.value or b"")
        assert isinstance(letter, DeadLetter)
        assert letter.reason == headers["reason"]
        assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
            commands,
            *source,
        )
        assert letter.key == key.encode()
        if raw is not None:
            assert letter.value == raw, "the original bytes are kept"

    # the misplaced start was not run on the wrong partition
    assert engine.client.get(misplaced_key) is None
    assert misplaced_key not in engine.histories()
