"""Command outcomes on a real broker: the processor answers every command on the
command-outcomes topic in its transaction; the client and the CLI turn refusals into typed
errors and exit codes; retries with the same request id are applied once.

One engine (processor and worker as threads of the test process) serves the module; waits
are bounded guards against hanging, never performance assertions.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from engine_harness import (
    RunningEngine,
    create_topics,
    delete_topics,
    read_topic,
    running_engine,
    unique_namespace,
)

from engine.cli.main import EXIT_REFUSED, main
from engine.client import AsyncClient, Client
from engine.codec import decode_message
from engine.config.settings import load_settings
from engine.core.errors import (
    CommandTimeoutError,
    InstanceNotFoundError,
    InstanceNotRunningError,
    InstanceNotSuspendedError,
    InstanceStillRunningError,
    WorkflowAlreadyRunningError,
)
from engine.core.history import EventRaised, RuntimeStatus
from engine.core.messages import CommandOutcome, CommandResult

pytestmark = pytest.mark.kafka

WAIT = 60.0


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_refusals_reach_the_client_as_typed_errors(engine: RunningEngine) -> None:
    client = engine.client
    instance = new_id("o")
    client.start("t.wait_event", None, instance_id=instance)
    with pytest.raises(WorkflowAlreadyRunningError, match="ERROR_IF_RUNNING") as twice:
        client.start("t.wait_event", None, instance_id=instance)
    assert twice.value.outcome.status is RuntimeStatus.RUNNING
    with pytest.raises(InstanceStillRunningError):
        client.purge(instance)
    with pytest.raises(InstanceNotSuspendedError):
        client.resume(instance)
    with pytest.raises(InstanceNotFoundError):
        client.terminate(new_id("nobody"))
    answer = client.raise_event(instance, "go", {"ok": True})
    assert answer is not None and answer.result is CommandResult.ACCEPTED
    assert client.wait_for_completion(instance, WAIT).status is RuntimeStatus.COMPLETED
    with pytest.raises(InstanceNotRunningError, match="COMPLETED"):
        client.raise_event(instance, "go")
    purged = client.purge(instance)
    assert purged is not None and purged.result is CommandResult.ACCEPTED


def test_a_raise_to_an_unknown_id_is_answered_buffered(engine: RunningEngine) -> None:
    instance = new_id("early")
    answer = engine.client.raise_event(instance, "go", 1)
    assert answer is not None and answer.result is CommandResult.BUFFERED
    engine.client.start("t.wait_event", None, instance_id=instance)
    assert engine.client.wait_for_completion(instance, WAIT).output["got"] == 1


def test_a_retried_raise_is_delivered_once(engine: RunningEngine) -> None:
    client = engine.client
    instance = new_id("dup")
    client.start("t.wait_event", None, instance_id=instance)
    first = client.raise_event(instance, "go", "once", request_id="retry-1")
    again = client.raise_event(instance, "go", "once", request_id="retry-1")
    assert first is not None and not first.duplicate
    assert again is not None and again.duplicate
    client.wait_for_completion(instance, WAIT)
    history = engine.history(instance)
    assert len([e for e in history if isinstance(e.body, EventRaised)]) == 1
    answers = [
        decode_message(r.value)
        for r in read_topic(engine.bootstrap, engine.topics.command_outcomes)
        if r.key == instance.encode() and r.value is not None
    ]
    assert all(isinstance(a, CommandOutcome) for a in answers)
    assert [a.duplicate for a in answers if a.request_id == "retry-1"] == [False, True]


def test_signal_with_start_restarts_an_ended_instance_with_the_event(
    engine: RunningEngine,
) -> None:
    client = engine.client
    instance = new_id("sws")
    client.start("t.echo", "done", instance_id=instance)
    client.wait_for_completion(instance, WAIT)
    handle = client.signal_with_start("t.wait_event", instance, "go", {"n": 1})
    answer = handle.outcome
    assert answer is not None and "started" in answer.reason and answer.generation == 1
    # the handle waits for the run it started, not the first run's end
    assert handle.result(timeout=WAIT)["got"] == {"n": 1}
    assert client.wait_for_completion(instance, WAIT, generation=1).generation == 1


def test_the_async_client_raises_the_same_errors(engine: RunningEngine) -> None:
    async def scenario() -> None:
        async with AsyncClient(settings=engine.settings) as client:
            handle = await client.start("t.wait_event", None, instance_id=new_id("a"))
            with pytest.raises(WorkflowAlreadyRunningError):
                await client.start("t.wait_event", None, instance_id=str(handle))
            await handle.raise_event("go", 2)
            assert (await handle.result(timeout=WAIT))["got"] == 2
            with pytest.raises(InstanceNotRunningError):
                await handle.terminate("too late")

    asyncio.run(scenario())


def test_a_cancel_lets_the_instance_clean_up_and_end_cancelled(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    client = engine.client
    instance = new_id("cancel")
    handle = client.start("t.cleans_up", None, instance_id=instance)
    answer = handle.cancel("not needed any more")
    assert answer is not None and answer.result is CommandResult.ACCEPTED
    state = client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.CANCELLED
    assert state.failure is not None and state.failure.message == "not needed any more"
    assert state.custom_status == "cleaned up"  # its clean-up ran, a durable sleep included
    flags = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    capsys.readouterr()
    assert main(["cancel", instance, *flags]) == EXIT_REFUSED
    assert "CANCELLED" in capsys.readouterr().err
    with pytest.raises(InstanceNotFoundError):
        client.cancel(new_id("nobody"))

    async def through_the_async_client() -> None:
        async with AsyncClient(settings=engine.settings) as async_client:
            other = await async_client.start("t.cleans_up", None, instance_id=new_id("ac"))
            await other.cancel("from asyncio")
            done = await async_client.wait_for_completion(str(other), WAIT)
            assert done.status is RuntimeStatus.CANCELLED

    asyncio.run(through_the_async_client())


def test_a_run_timeout_ends_the_instance_timed_out(engine: RunningEngine) -> None:
    client = engine.client
    instance = new_id("timeout")
    client.start("t.wait_event", None, instance_id=instance, run_timeout=0.5)
    state = client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.TIMED_OUT
    assert state.failure is not None and "run_timeout" in state.failure.message
    with pytest.raises(InstanceNotRunningError, match="TIMED_OUT"):
        client.raise_event(instance, "go")


def test_no_answer_without_a_processor_times_out_with_advice(engine: RunningEngine) -> None:
    settings = engine.settings
    # a namespace whose topics exist but no processor reads them
    lonely = load_settings(
        bootstrap_servers=settings.bootstrap_servers,
        namespace=unique_namespace(),
        partitions=1,
        env={},
    )
    create_topics(lonely)
    try:
        client = Client(settings=lonely, read_status=False, timeout=2.0)
        with client, pytest.raises(CommandTimeoutError, match="same request id is safe"):
            client.raise_event("x", "go")
    finally:
        delete_topics(lonely)


def test_the_cli_prints_refusals_and_exits_non_zero(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    instance = new_id("cli")
    assert main(["start", "t.wait_event", "--id", instance, *flags]) == 0
    capsys.readouterr()
    assert main(["start", "t.wait_event", "--id", instance, *flags]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.startswith("refused: ") and "ERROR_IF_RUNNING" in err
    assert main(["purge", instance, *flags]) == EXIT_REFUSED
    assert "terminate it first" in capsys.readouterr().err
    assert main(["resume", instance, *flags]) == EXIT_REFUSED
    assert main(["raise", new_id("unknown"), "go", *flags]) == 0
    assert capsys.readouterr().out.startswith("BUFFERED: ")
    retry = ["raise", instance, "other", "--request-id", "cli-retry", *flags]
    assert main(retry) == 0
    assert capsys.readouterr().out.strip() == "ACCEPTED"
    assert main(retry) == 0  # a scripted retry: answered again, applied once
    assert capsys.readouterr().out.strip() == "ACCEPTED (a repeated request, applied once)"
    assert main(["raise", instance, "go", "--data", "3", *flags]) == 0
    assert capsys.readouterr().out.strip() == "ACCEPTED"
    engine.client.wait_for_completion(instance, WAIT)
    first_run = [e.body for e in engine.history(instance) if e.generation == 0]
    assert [b.name for b in first_run if isinstance(b, EventRaised)] == ["other", "go"]
    assert main(["terminate", instance, *flags]) == EXIT_REFUSED
    assert "COMPLETED" in capsys.readouterr().err
    signal = ["signal-with-start", "t.wait_event", instance, "go", "--data", "4", *flags]
    assert main(signal) == 0
    assert "started" in capsys.readouterr().out
    assert engine.client.wait_for_completion(instance, WAIT).generation == 1


def test_the_window_survives_a_takeover(engine: RunningEngine) -> None:
    """Last in the module: it replaces the module's replica by one with empty tables."""
    client = engine.client
    instance = new_id("moved")
    client.start("t.wait_event", None, instance_id=instance)
    first = client.raise_event(instance, "other", 1, request_id="before-the-move")
    assert first is not None and not first.duplicate
    engine.processors["processor-0"].stop()
    # a new replica with no state of its own restores the rows from the changelog
    engine.start_processor("processor-1")
    again = client.raise_event(instance, "other", 1, request_id="before-the-move")
    assert again is not None and again.duplicate
    client.raise_event(instance, "go", "done")
    assert client.wait_for_completion(instance, WAIT).output["got"] == "done"
    raised = [e.body for e in engine.history(instance) if isinstance(e.body, EventRaised)]
    assert [b.name for b in raised] == ["other", "go"]
