"""accept(record): the state machine checks every raw input record itself and parks an
unusable one in dead letters with the reason and its source, while the partition goes on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.core.keys import murmur2_partition
from engine.core.messages import ActivityTask, PurgeWorkflow, StartWorkflow
from engine.core.payloads import to_payload
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="echo")
async def echo(ctx: WorkflowContext, value: object) -> object:
    return value


PARTITIONS = 3


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=PARTITIONS) as engine:
        yield engine


def start(instance_id: str) -> bytes:
    return encode_message(StartWorkflow(instance_id, name="echo", input=to_payload(1)))


def only_letter_reason(env: TestEngine) -> str:
    env.run()
    (letter,) = env.dead_letters()
    return letter.reason


def test_an_undecodable_record_is_dead_lettered_with_its_source(env: TestEngine) -> None:
    written = env.produce(env.topics.commands, b"x", b"not avro")
    reason = only_letter_reason(env)
    assert reason
    (record,) = env.records("dead-letters")
    headers = dict(record.headers)
    assert headers["source-topic"] == env.topics.commands.encode()
    assert headers["source-offset"] == str(written.offset).encode()
    assert headers["source-partition"] == str(written.partition).encode()


def test_a_tombstone_is_dead_lettered(env: TestEngine) -> None:
    env.produce(env.topics.commands, b"x", None)
    assert "tombstone" in only_letter_reason(env)


def test_a_record_keyed_by_another_id_is_dead_lettered(env: TestEngine) -> None:
    env.produce(env.topics.commands, b"other", start("a"))
    assert "does not match its instance id" in only_letter_reason(env)


def test_a_record_on_the_wrong_partition_is_dead_lettered(env: TestEngine) -> None:
    right = murmur2_partition(b"a", PARTITIONS)
    env.produce(env.topics.commands, b"a", start("a"), partition=(right + 1) % PARTITIONS)
    assert "murmur2" in only_letter_reason(env)
    assert env.get("a") is None


def test_a_kind_not_accepted_on_its_topic_is_dead_lettered(env: TestEngine) -> None:
    task = ActivityTask("a", 0, 0, 1, "x", None)
    env.produce(env.topics.commands, b"a", encode_message(task))
    assert "not accepted on topic" in only_letter_reason(env)


def test_a_purge_between_instances_is_not_accepted(env: TestEngine) -> None:
    env.produce(env.topics.instance_messages, b"a", encode_message(PurgeWorkflow("a")))
    assert "not accepted on topic" in only_letter_reason(env)


def test_the_partition_goes_on_after_a_dead_letter(env: TestEngine) -> None:
    env.produce(env.topics.commands, b"a", b"garbage", partition=murmur2_partition(b"a", 3))
    env.produce(env.topics.commands, b"a", start("a"))
    assert env.wait_for_completion("a").output == 1
    assert len(env.dead_letters()) == 1
