"""One bad workflow fails alone: two replicas, healthy workflows beside the poisoned ones.

Each poisoned workflow ends FAILED with a readable reason, every healthy one completes, no
replica exits, and nothing goes to dead letters. Before the size limits, the turn watchdog
and the per-instance isolation, each of these took down every replica in turn.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import (
    DEFAULT_MODULES,
    EngineProcess,
    RunningEngine,
    history_problems,
    wait_until,
)
from engine_harness import running_engine as _running_engine

from engine.core.history import ExecutionCompleted, ExecutionStarted, RuntimeStatus
from engine.core.limits import SUMMARY_ENCODING
from engine.core.messages import StartWorkflow
from engine.core.payloads import to_payload

pytestmark = pytest.mark.kafka

MODULES = (*DEFAULT_MODULES, "tests.poison_workflows")
HEALTHY = 30


@pytest.fixture
def engine(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningEngine]:
    # a short turn budget keeps the test quick; the replicas read it from the environment
    monkeypatch.setenv("TURNSTILE_TURN_BUDGET_MS", "1000")
    # values over 300 KB are kept aside, up to 500 KB: over that an instance fails alone
    # (a producer cannot write a start over the 1 MB record limit, so the largest payload
    # is set below it here)
    monkeypatch.setenv("TURNSTILE_PAYLOAD_INLINE_MAX_BYTES", "300000")
    monkeypatch.setenv("TURNSTILE_PAYLOAD_MAX_BYTES", "500000")
    with _running_engine(
        kafka_bootstrap,
        partitions=4,
        replicas=2,
        in_process=False,
        state_dir=tmp_path,
        modules=MODULES,
    ) as running:
        yield _settled(running)


def _settled(engine: RunningEngine) -> RunningEngine:
    """Wait until every replica owns partitions, so the group does not rebalance while the
    test runs (restoring right after a rebalance is another test's subject)."""
    for handle in engine.processors.values():
        assert isinstance(handle, EngineProcess)
        handle.wait_for_log(" restored: ", 120)
    return engine


def _healthy_round(engine: RunningEngine, first: int) -> float:
    """Start HEALTHY chain3 workflows, wait for all; returns the seconds it took."""
    started = time.monotonic()
    ids = {
        engine.client.start("chain3.activities", value, flush=False): value + 3
        for value in range(first, first + HEALTHY)
    }
    engine.client.flush()
    for instance_id, output in ids.items():
        state = engine.wait_for_completion(instance_id, 120)
        assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
        assert state.output == output
    return time.monotonic() - started


def _failed(engine: RunningEngine, instance_id: str) -> str:
    state = engine.wait_for_completion(instance_id, 120)
    assert state.status is RuntimeStatus.FAILED, (state, engine.logs())
    assert state.failure is not None
    return f"{state.failure.type}: {state.failure.message}"


def _start_unchecked(engine: RunningEngine, name: str, value: str, instance_id: str) -> str:
    """A start the client would refuse (its input is over the limit) written as any
    producer could, so the processor has to fail the instance alone."""
    engine.send_command(StartWorkflow(instance_id=instance_id, name=name, input=to_payload(value)))
    return instance_id


def _replicas_alive(engine: RunningEngine) -> None:
    for handle in engine.processors.values():
        assert isinstance(handle, EngineProcess)
        assert handle.alive, engine.logs()


def test_poisoned_workflows_fail_alone(engine: RunningEngine) -> None:
    client = engine.client
    normal = _healthy_round(engine, 0)
    poisoned = {
        "big-input": _start_unchecked(engine, "poison.echo", "i" * 600_000, "big-input"),
        "big-output": client.start("poison.big_output", 8_000_000, instance_id="big-output"),
        "spin": client.start("poison.spin", instance_id="spin"),
        "endless-inline": client.start("poison.endless_inline", instance_id="endless-inline"),
        "resolved-await": client.start("poison.resolved_await", instance_id="resolved-await"),
        "negative-timer": client.start("poison.negative_timer", instance_id="negative-timer"),
    }
    beside = _healthy_round(engine, 1000)

    reasons = {name: _failed(engine, instance_id) for name, instance_id in poisoned.items()}
    for big in ("big-input", "big-output"):
        assert reasons[big].startswith("PayloadTooLargeError:"), reasons[big]
        assert "payload_max_bytes" in reasons[big], reasons[big]
    assert reasons["spin"].startswith("WorkflowTurnTimeoutError:")
    assert reasons["resolved-await"].startswith("WorkflowTurnTimeoutError:")
    assert reasons["endless-inline"].startswith(("StepBudgetExceededError:", "WorkflowTurn"))
    assert reasons["negative-timer"].startswith("error: ")  # struct.error, with its traceback
    state = client.get("negative-timer")
    assert state is not None and state.failure is not None
    assert "Traceback" in state.failure.stack and "keys.py" in state.failure.stack

    after = _healthy_round(engine, 2000)
    _replicas_alive(engine)
    assert not engine.dead_letters()

    # the input over its limit is summarised in the start event and the status record
    # (the start command keeps it); the history is a valid start-then-end
    histories = engine.history_records()
    for name, instance_id in poisoned.items():
        assert not history_problems(instance_id, histories[instance_id]), name
        ends = [e.body for _, e in histories[instance_id] if type(e.body) is ExecutionCompleted]
        assert [end.status for end in ends] == [RuntimeStatus.FAILED], name
    start = next(e.body for _, e in histories["big-input"] if type(e.body) is ExecutionStarted)
    assert start.input is not None and start.input.encoding == SUMMARY_ENCODING
    status = engine.final_statuses()["big-input"]
    assert status.input is not None and status.input.encoding == SUMMARY_ENCODING
    # reported, not asserted: the machine is shared and noisy
    print(
        f"\nhealthy rounds: {normal:.2f}s before, {beside:.2f}s beside poison, {after:.2f}s after"
    )


def test_a_record_the_broker_refuses_fails_only_its_instance(engine: RunningEngine) -> None:
    """The history topic accepts less than the engine's limits (a misconfigured cluster):
    the broker refuses one instance's start event; that instance fails, the others go on."""
    from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

    from engine.adapters.kafka.admin import admin_for

    admin = admin_for(engine.settings)
    entry = ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", engine.topics.history, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    refused = engine.client.start("poison.echo", "r" * 30_000, instance_id="refused")
    _healthy_round(engine, 0)
    reason = _failed(engine, refused)
    assert reason.startswith("RecordRefusedError: the broker refused a record for"), reason
    assert "history" in reason
    _healthy_round(engine, 100)
    _replicas_alive(engine)
    records = engine.history_records()["refused"]
    assert not history_problems("refused", records)


@pytest.fixture
def slow_budget_engine(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningEngine]:
    # a turn budget longer than the group's session timeout (10 s): the replica must keep
    # its membership (librdkafka heartbeats from its own threads) while the turn spins
    monkeypatch.setenv("TURNSTILE_TURN_BUDGET_MS", "12000")
    with _running_engine(
        kafka_bootstrap,
        partitions=4,
        replicas=2,
        in_process=False,
        state_dir=tmp_path,
        modules=MODULES,
    ) as running:
        yield _settled(running)


def _restores(engine: RunningEngine) -> int:
    total = 0
    for handle in engine.processors.values():
        assert isinstance(handle, EngineProcess)
        total += handle.current_log().count(" restored: ")
    return total


def test_a_spinning_turn_keeps_the_group_and_sigterm_works(
    slow_budget_engine: RunningEngine, tmp_path: Path
) -> None:
    engine = slow_budget_engine
    _healthy_round(engine, 0)
    restores = _restores(engine)

    marker = tmp_path / "spinning-1"
    spinning = engine.client.start("poison.spin_after", str(marker), instance_id="spin-1")
    wait_until(marker.exists, 60, what="the workflow to reach its endless loop")
    _healthy_round(engine, 100)  # some wait for the spinning partition, none are lost
    assert _failed(engine, spinning).startswith("WorkflowTurnTimeoutError:")
    assert _restores(engine) == restores, "a rebalance happened: the spinning replica left"
    _replicas_alive(engine)

    # a replica joins while a turn spins: the rebalance completes and it gets partitions
    marker = tmp_path / "spinning-2"
    spinning = engine.client.start("poison.spin_after", str(marker), instance_id="spin-2")
    wait_until(marker.exists, 60, what="the workflow to reach its endless loop")
    joined = engine.start_processor("processor-2")
    assert isinstance(joined, EngineProcess)
    joined.wait_for_log(" restored: ", 120)
    assert _failed(engine, spinning).startswith("WorkflowTurnTimeoutError:")
    _healthy_round(engine, 200)

    # SIGTERM while a turn spins: every replica stops cleanly (after the turn budget at most)
    marker = tmp_path / "spinning-3"
    spinning = engine.client.start("poison.spin_after", str(marker), instance_id="spin-3")
    wait_until(marker.exists, 60, what="the workflow to reach its endless loop")
    time.sleep(0.5)  # let the processor pick up the result and enter the loop
    for handle in engine.processors.values():
        handle.request_stop()
    for handle in engine.processors.values():
        assert handle.wait(60) == 0, engine.logs()
    for name in list(engine.processors):
        engine.start_processor(name)
    assert _failed(engine, spinning).startswith("WorkflowTurnTimeoutError:")
    _healthy_round(engine, 300)
    histories = engine.history_records()
    for instance_id in ("spin-1", "spin-2", "spin-3"):
        # the turn that applied the activity's result is the one replaced by the failure,
        # so the result is not in history; anything else would be a problem
        problems = history_problems(instance_id, histories[instance_id])
        assert problems == [f"{instance_id}: task (0, 0) attempts [1] got results []"], problems


def test_hung_activities_do_not_take_the_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    """More hung sync activities than the worker's concurrency: each is abandoned at its
    timeout, healthy activities keep running, and SIGTERM ends the worker at once."""
    with _running_engine(
        kafka_bootstrap,
        partitions=4,
        replicas=2,
        in_process=False,
        state_dir=tmp_path,
        modules=MODULES,
        worker_concurrency=2,
    ) as engine:
        _settled(engine)
        hung = [engine.client.start("poison.call_hung", 3600.0) for _ in range(4)]
        _healthy_round(engine, 0)
        for instance_id in hung:
            state = engine.wait_for_completion(instance_id, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state, engine.logs())
            assert state.output.startswith("gave up: "), state.output
        worker = engine.workers["worker-0"]
        assert isinstance(worker, EngineProcess)
        assert "is abandoned" in worker.current_log()
        assert worker.stop(60) == 0, engine.logs()  # abandoned threads do not hold it up
        engine.start_worker("worker-0")
        _healthy_round(engine, 100)  # the timed-out tasks are not run again
        assert "is abandoned" not in worker.current_log()
