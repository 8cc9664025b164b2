"""Updates on a real broker: the client sends an UpdateWorkflow (or UpdateWithStart)
command, the processor that owns the instance runs the validator and the handler (which
awaits an activity on a worker) and answers on the command-outcomes topic under the
update id; the client, the async client and the CLI read it. A retry with the same update
id gets the first answer and runs nothing again. Waits are bounded guards against
hanging."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
from engine_harness import RunningEngine, running_engine

from engine.cli.main import EXIT_REFUSED, main
from engine.client import AsyncClient
from engine.core.errors import UnknownUpdateError, UpdateRejectedError
from engine.core.history import RuntimeStatus, UpdateAccepted, UpdateCompleted

pytestmark = pytest.mark.kafka

WAIT = 60.0


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_an_update_round_trip_is_journaled_once_and_answered(engine: RunningEngine) -> None:
    client = engine.client
    handle = client.start("t.ledger", 10, instance_id=new_id("u"))
    assert handle.update("deposit", 5, update_id="d-1", timeout=WAIT) == 15
    assert client.update(handle, "deposit", 5, update_id="d-1", timeout=WAIT) == 15  # a retry
    with pytest.raises(UpdateRejectedError, match="a deposit is positive, not -3"):
        handle.update("deposit", -3, timeout=WAIT)
    with pytest.raises(UnknownUpdateError, match="its updates: 'deposit'"):
        handle.update("withdraw", 1, timeout=WAIT)
    assert asyncio.run(_async_update(engine, handle)) == 17
    client.raise_event(handle, "close")
    state = client.wait_for_completion(handle, WAIT)
    assert state.status is RuntimeStatus.COMPLETED and state.output == 17
    bodies = [e.body for e in engine.history(handle)]
    accepted = [b.update_id for b in bodies if type(b) is UpdateAccepted]
    assert len(accepted) == 2 and accepted[0] == "d-1"  # no retry, no rejection
    assert sum(type(b) is UpdateCompleted for b in bodies) == 2


async def _async_update(engine: RunningEngine, instance_id: str) -> object:
    async with AsyncClient(settings=engine.settings) as client:
        return await client.handle(instance_id).update("deposit", 2, timeout=WAIT)


def test_update_with_start_starts_once_and_updates(engine: RunningEngine) -> None:
    client = engine.client
    instance_id = new_id("uws")
    first = client.update_with_start(
        "t.ledger", 100, instance_id=instance_id, update="deposit", arg=1, timeout=WAIT
    )
    second = client.update_with_start(
        "t.ledger", 100, instance_id=instance_id, update="deposit", arg=2, timeout=WAIT
    )
    assert (first, second) == (101, 103)
    starts = [e for e in engine.history(instance_id) if e.body.KIND == "ExecutionStarted"]
    assert len(starts) == 1


def test_the_cli_prints_the_answer_as_json(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    handle = engine.client.start("t.ledger", 3, instance_id=new_id("u"))
    capsys.readouterr()
    assert main(["update", handle, "deposit", "--arg", "4", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == 7
    assert main(["update", handle, "deposit", "--arg", "0", *flags]) == EXIT_REFUSED


def test_a_retry_after_a_continue_as_new_gets_the_first_answer(engine: RunningEngine) -> None:
    client = engine.client
    handle = client.start("t.rolling_ledger", 10, instance_id=new_id("roll"))
    assert handle.update("deposit", 5, update_id="r-1", timeout=WAIT) == 15
    client.raise_event(handle, "command", "roll")  # answered after the continue-as-new
    assert handle.update("deposit", 1, update_id="r-2", timeout=WAIT) == 16
    assert handle.update("deposit", 5, update_id="r-1", timeout=WAIT) == 15  # not run again
    client.raise_event(handle, "command", "close")
    state = client.wait_for_completion(handle, WAIT)
    assert state.status is RuntimeStatus.COMPLETED and state.output == 16
    accepted = [
        (e.generation, e.body.update_id)
        for e in engine.history(handle)
        if isinstance(e.body, UpdateAccepted)
    ]
    assert accepted == [(0, "r-1"), (1, "r-2")]
