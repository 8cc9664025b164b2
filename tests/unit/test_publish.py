"""ctx.publish on the test engine: the record goes out once with the turn that journals
it, replay publishes nothing, and what cannot be published fails the instance alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_user_avro
from engine.config.settings import Settings
from engine.core.errors import PublishError
from engine.core.history import RecordPublished, RuntimeStatus
from engine.runtime.publishing import publish_request
from engine.testing import TestEngine

app = Registry()

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "total", "type": "long"}],
}


@app.workflow(name="publisher")
async def publisher(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    """Publishes before and after a durable wait, so later turns replay the first publish."""
    await ctx.publish("orders", {"placed": order["id"]}, key=order["id"], headers={"v": "1"})
    await ctx.sleep(60)
    ctx.publish("orders-raw", b"\x00raw", key=order["id"])
    await ctx.publish(
        "orders-avro", {"id": order["id"], "total": order["total"]}, avro_schema=ORDER_SCHEMA
    )
    await ctx.wait_for_event("go")
    return "done"


@app.workflow(name="typo")
async def typo(ctx: WorkflowContext, _: Any) -> None:
    await ctx.publish("ordres", {"x": 1})


@app.workflow(name="huge")
async def huge(ctx: WorkflowContext, _: Any) -> None:
    await ctx.publish("orders", "x" * 5000)


@app.workflow(name="bad-avro")
async def bad_avro(ctx: WorkflowContext, _: Any) -> None:
    await ctx.publish("orders-avro", {"id": "a"}, avro_schema=ORDER_SCHEMA)


SETTINGS = Settings(publish_topics=("orders", "orders-raw", "orders-avro"))


def test_each_record_is_published_once_and_journaled() -> None:
    with TestEngine(app, settings=SETTINGS, partitions=2) as env:
        run = env.start("publisher", {"id": "o-1", "total": 42}, instance_id="o-1")
        env.advance(120)
        env.processors[env.partition_of("o-1")].cache.clear()  # the next turn replays
        env.raise_event("o-1", "go")
        assert env.wait_for_completion(run).status is RuntimeStatus.COMPLETED
        [placed] = env.records("orders")
        assert json.loads(placed.value or b"") == {"placed": "o-1"}
        assert placed.key == b"o-1" and dict(placed.headers) == {"v": b"1"}
        [raw] = env.records("orders-raw")
        assert raw.value == b"\x00raw"
        [avro] = env.records("orders-avro")
        schema = json.dumps(ORDER_SCHEMA)
        assert decode_user_avro(schema, avro.value or b"") == {"id": "o-1", "total": 42}
        journaled = [e.body for e in env.history("o-1") if isinstance(e.body, RecordPublished)]
        assert [b.topic for b in journaled] == ["orders", "orders-raw", "orders-avro"]
        assert [b.task_id for b in journaled] == [0, 2, 3]  # the timer is task 1


def test_an_undeclared_topic_fails_the_instance_and_names_the_setting() -> None:
    with TestEngine(app, settings=SETTINGS) as env:
        state = env.wait_for_completion(env.start("typo", None))
        assert state.status is RuntimeStatus.FAILED
        assert state.failure is not None
        assert "'ordres'" in state.failure.message and "publish_topics" in state.failure.message
        assert env.records("orders") == []


def test_a_value_that_does_not_fit_its_avro_schema_fails_the_instance() -> None:
    with TestEngine(app, settings=SETTINGS) as env:
        state = env.wait_for_completion(env.start("bad-avro", None))
        assert state.status is RuntimeStatus.FAILED
        assert state.failure is not None and "total" in state.failure.message
        assert env.records("orders-avro") == []


def test_a_published_value_over_max_event_bytes_fails_the_instance() -> None:
    settings = Settings(publish_topics=("orders",), max_event_bytes=1000)
    with TestEngine(app, settings=settings) as env:
        state = env.wait_for_completion(env.start("huge", None))
        assert state.status is RuntimeStatus.FAILED
        assert state.failure is not None and "max_event_bytes" in state.failure.message
        assert env.records("orders") == []


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"topic": ""}, "topic name"),
        ({"key": 5}, "key must be"),
        ({"partition": -1}, "partition"),
        ({"headers": {"h": b"x"}}, "header"),
        ({"value": b"x", "avro_schema": ORDER_SCHEMA}, "bytes value"),
        ({"avro_schema": "{not json"}, "not valid JSON"),
        ({"value": object()}, "JSON"),
    ],
)
def test_bad_arguments_are_refused_at_the_call(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {
        "topic": "orders",
        "value": {"a": 1},
        "key": None,
        "headers": None,
        "partition": None,
        "avro_schema": None,
    }
    args.update(kwargs)
    with pytest.raises(PublishError, match=needle):
        publish_request(**args)


def test_replay_matches_the_recorded_publish_and_a_changed_topic_diverges() -> None:
    from engine.core.errors import NonDeterminismError
    from engine.runtime.executor import WorkflowExecution

    with TestEngine(app, settings=SETTINGS) as env:
        env.start("publisher", {"id": "o-2", "total": 1}, instance_id="o-2")
        env.advance(120)
        history = env.history("o-2")
    replayed = WorkflowExecution(app, "o-2")
    replayed.replay(history)  # the same code: every RecordPublished matches, no action
    moved = Registry()

    @moved.workflow(name="publisher")
    async def publisher_moved(ctx: WorkflowContext, order: dict[str, Any]) -> None:
        await ctx.publish("orders-v2", {"placed": order["id"]})
        await ctx.sleep(60)

    with pytest.raises(NonDeterminismError, match="orders"):
        WorkflowExecution(moved, "o-2").replay(history)
