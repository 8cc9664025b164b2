"""Queries on a real broker: the client sends a QueryWorkflow command, the processor that
owns the instance answers on the command-outcomes topic with the request id and the
handler's value, and the client, the async client and the CLI read it. Nothing is written
to the instance's history. Waits are bounded guards against hanging."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
from engine_harness import RunningEngine, read_topic, running_engine

from engine.cli.main import EXIT_REFUSED, main
from engine.client import AsyncClient
from engine.codec import decode_message
from engine.core.errors import InstanceNotFoundError, QueryFailedError, UnknownQueryError
from engine.core.history import RuntimeStatus
from engine.core.messages import CommandOutcome, CommandResult
from engine.core.payloads import from_payload

pytestmark = pytest.mark.kafka

WAIT = 60.0


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_a_query_is_answered_on_the_outcome_topic_and_writes_no_history(
    engine: RunningEngine,
) -> None:
    client = engine.client
    handle = client.start("t.tally", 1, instance_id=new_id("q"))
    client.raise_event(handle, "add", 2)
    # an accepted event was applied in the turn its answer committed with
    assert handle.query("count", timeout=WAIT) == 3
    client.raise_event(handle, "add", 4)
    events_before = len(engine.history(handle))
    seven = handle.query("plus", 0, timeout=WAIT)
    assert seven == 7
    assert len(engine.history(handle)) == events_before
    answers = [
        decode_message(r.value)
        for r in read_topic(engine.bootstrap, engine.topics.command_outcomes)
        if r.key == handle.encode() and r.value is not None
    ]
    queries = [a for a in answers if isinstance(a, CommandOutcome) and a.command == "QueryWorkflow"]
    assert len(queries) == 2 and all(a.result is CommandResult.ACCEPTED for a in queries)
    assert from_payload(queries[-1].output) == seven


def test_refusals_and_ended_instances(engine: RunningEngine) -> None:
    client = engine.client
    handle = client.start("t.tally", 10, instance_id=new_id("q"))
    with pytest.raises(UnknownQueryError, match="'count', 'peek', 'plus'"):
        handle.query("total", timeout=WAIT)
    with pytest.raises(QueryFailedError, match="read-only"):
        handle.query("peek", timeout=WAIT)
    with pytest.raises(InstanceNotFoundError):
        client.query(new_id("nobody"), "count", timeout=WAIT)
    client.raise_event(handle, "add", 5)
    client.raise_event(handle, "add", "stop")
    state = client.wait_for_completion(handle, WAIT)
    assert state.status is RuntimeStatus.COMPLETED and state.output == 15
    assert handle.query("count", timeout=WAIT) == 15  # from its last state
    assert asyncio.run(_async_query(engine, handle)) == 17


async def _async_query(engine: RunningEngine, instance_id: str) -> object:
    async with AsyncClient(settings=engine.settings) as client:
        return await client.handle(instance_id).query("plus", 2, timeout=WAIT)


def test_the_cli_prints_the_answer_as_json(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    handle = engine.client.start("t.tally", 3, instance_id=new_id("q"))
    capsys.readouterr()
    assert main(["query", handle, "plus", "--arg", "4", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == 7
    assert main(["query", handle, "nope", *flags]) == EXIT_REFUSED
    assert "its queries: 'count', 'peek', 'plus'" in capsys.readouterr().err
