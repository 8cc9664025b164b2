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
from engine.core.messages import DeadLetter, StartWorkflow
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

    # a record of a kind the commands topic does not take (activity results it does take:
    # that is how a client completes an activity from outside)
    wrong_kind_key = _id("wrong-kind")
    letter = DeadLetter(instance_id=wrong_kind_key, reason="copied from another topic")
    wrong_kind = engine.produce(commands, encode_message(letter), wrong_kind_key.encode())

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
        wrong_kind: ("DeadLetter records are not accepted", wrong_kind_key, None),
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


def test_the_dashboard_lists_a_dead_letter_written_twice_once(kafka_bootstrap: str) -> None:
    """A worker that crashed before committing a task's offset reads the task again and
    writes its dead letter again (same source place, same key): the dashboard's view shows
    one. Letters with no source record (offset -1) are all shown."""
    from engine.services.dead_letters import dead_letter_of
    from engine.services.records import RawRecord
    from engine.ui.source import DashboardSource

    with running_engine(kafka_bootstrap, partitions=2, replicas=0, workers=0) as engine:
        tasks = engine.topics.activity_tasks
        unusable = RawRecord(1, 7, b"i-1", b"\x00not a task", 1000, tasks)
        value, headers = dead_letter_of(unusable, tasks, "undecodable task")
        for _ in range(2):  # the first life of the worker, then the one after its crash
            engine.produce(engine.topics.dead_letters, value, b"i-1", headers=list(headers))
        other = RawRecord(1, 8, b"i-1", b"\x00another", 2000, tasks)
        value, headers = dead_letter_of(other, tasks, "undecodable task")
        engine.produce(engine.topics.dead_letters, value, b"i-1", headers=list(headers))
        for ms in (3000, 4000):  # expired kept events: the engine's own, no source record
            kept = RawRecord(0, -1, b"i-2", b"event", ms, engine.topics.commands)
            value, headers = dead_letter_of(kept, engine.topics.commands, "expired")
            engine.produce(engine.topics.dead_letters, value, b"i-2", headers=list(headers))

        source = DashboardSource(engine.settings)
        try:
            listed = source.dead_letters()
        finally:
            source.close()
    assert (listed["total"], listed["repeats"]) == (4, 1)
    places = [(d["source_partition"], d["source_offset"]) for d in listed["items"]]
    assert sorted(places) == [(0, -1), (0, -1), (1, 7), (1, 8)]
