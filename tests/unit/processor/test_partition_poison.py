"""A bad instance fails alone at the partition level: limits, the turn budget, a bug while
finishing a turn (redone with the instance quarantined), a bug handling a record, the
status record's size. Driven through engine.testing (the real state machine over memory)
and, for the redo protocol itself, the state machine's API directly."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_message, encode_message
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import (
    InstanceTurnError,
    PayloadTooLargeError,
    RecordHandlingError,
)
from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    RuntimeStatus,
    TaskFailed,
    TurnStarted,
)
from engine.core.limits import SUMMARY_ENCODING, Limits, fit_status, status_size
from engine.core.messages import InstanceStatus, RaiseEvent, StartWorkflow
from engine.core.payloads import Payload, to_payload
from engine.services.processor import handlers
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.records import RawRecord
from engine.services.watchdog import TurnWatchdog
from engine.testing import TestEngine

NOW = 1_700_000_000_000

SETTINGS = Settings(
    max_workflow_input_bytes=1000,
    max_workflow_output_bytes=1000,
    max_activity_input_bytes=1000,
    max_activity_result_bytes=1000,
    max_event_bytes=1000,
    max_custom_status_bytes=1000,
    max_record_bytes=40_000,
    turn_budget_ms=200,
    turn_max_events=500,
    pending_events_max=2,
)

registry = Registry()


@registry.workflow(name="echo")
async def echo(ctx: WorkflowContext, value: Any) -> Any:
    return value


@registry.workflow(name="grow")
async def grow(ctx: WorkflowContext, n: int) -> str:
    return "x" * n


@registry.workflow(name="spin")
async def spin(ctx: WorkflowContext) -> None:
    while True:
        pass


def _one() -> int:
    return 1


@registry.workflow(name="endless")
async def endless(ctx: WorkflowContext) -> None:
    while True:
        await ctx.run("one", _one)


@registry.workflow(name="bad_timer")
async def bad_timer(ctx: WorkflowContext) -> None:
    await ctx.create_timer(-1)


@registry.workflow(name="waits")
async def waits(ctx: WorkflowContext) -> Any:
    return await ctx.wait_for_event("go")


@registry.activity(name="big")
def big() -> str:
    return "y" * 3000


@registry.workflow(name="remote")
async def remote(ctx: WorkflowContext) -> Any:
    try:
        return await ctx.call_activity("big")
    except Exception as exc:
        return f"caught {type(exc).__name__}"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, settings=SETTINGS) as engine:
        yield engine


def failure_type(env: TestEngine, instance_id: str) -> str:
    state = env.get(instance_id)
    assert state is not None and state.status is RuntimeStatus.FAILED, state
    assert state.failure is not None
    return state.failure.type


def test_an_input_over_its_limit_fails_the_instance_with_a_summary(env: TestEngine) -> None:
    big = StartWorkflow(instance_id="a", name="echo", input=to_payload("i" * 2000))
    env.produce(env.topics.commands, b"a", encode_message(big))  # the client would refuse it
    env.run()
    state = env.get("a")
    assert state is not None and state.failure is not None
    assert failure_type(env, "a") == "PayloadTooLargeError"
    assert "max_workflow_input_bytes" in state.failure.message
    assert "2002 bytes" in state.failure.message
    assert state.raw.input is not None and state.raw.input.encoding == SUMMARY_ENCODING
    events = [e.body for e in env.history("a")]
    assert [type(b) for b in events] == [TurnStarted, ExecutionStarted, ExecutionCompleted]
    started = events[1]
    assert isinstance(started, ExecutionStarted) and started.input is not None
    assert started.input.encoding == SUMMARY_ENCODING


def test_an_output_over_its_limit_fails_the_instance(env: TestEngine) -> None:
    env.start("grow", 5000, instance_id="b")
    env.run()
    state = env.get("b")
    assert failure_type(env, "b") == "PayloadTooLargeError"
    assert state is not None and state.failure is not None
    assert "the workflow output" in state.failure.message and state.raw.output is None


def test_a_too_large_activity_result_fails_the_attempt_not_the_instance(env: TestEngine) -> None:
    env.start("remote", instance_id="r")
    env.run()
    failed = [e.body for e in env.history("r") if isinstance(e.body, TaskFailed)]
    assert failed, env.history("r")
    message = failed[0].failure.message
    assert failed[0].failure.type == "PayloadTooLargeError", failed[0].failure
    assert "the result of task" in message and "max_activity_result_bytes" in message, message
    state = env.get("r")
    assert state is not None and state.status is RuntimeStatus.COMPLETED
    assert state.output == "caught ActivityFailedError"


def test_an_event_over_its_limit_goes_to_dead_letters_and_the_instance_goes_on(
    env: TestEngine,
) -> None:
    env.start("waits", instance_id="w")
    env.run()
    with pytest.raises(PayloadTooLargeError, match="max_event_bytes"):
        env.raise_event("w", "go", "e" * 5000)  # the client refuses it before sending
    big = RaiseEvent("w", "go", to_payload("e" * 5000))
    env.produce(env.topics.commands, b"w", encode_message(big))  # as any producer could
    env.run()
    (letter,) = env.dead_letters()
    assert "max_event_bytes" in letter.reason
    env.raise_event("w", "go", "small")
    env.run()
    state = env.get("w")
    assert state is not None and state.output == "small"


def test_a_turn_that_never_yields_fails_on_the_budget(env: TestEngine) -> None:
    env.start("spin", instance_id="s")
    env.start("echo", 1, instance_id="e")
    env.run()
    assert failure_type(env, "s") == "WorkflowTurnTimeoutError"
    healthy = env.get("e")
    assert healthy is not None and healthy.status is RuntimeStatus.COMPLETED


def test_an_endless_inline_loop_stops_at_the_event_bound(env: TestEngine) -> None:
    env.start("endless", instance_id="i")
    env.run()
    assert failure_type(env, "i") == "StepBudgetExceededError"
    state = env.get("i")
    assert state is not None and state.failure is not None
    assert "turn_max_events" in state.failure.message
    assert len(env.history("i")) == 3  # start and end only: the runaway turn is not recorded


def test_a_bug_while_finishing_a_turn_fails_that_instance_alone(env: TestEngine) -> None:
    env.start("bad_timer", instance_id="t")
    env.start("echo", 2, instance_id="h")
    env.run()
    state = env.get("t")
    assert failure_type(env, "t") == "error"  # struct.error, from packing the timer key
    assert state is not None and state.failure is not None
    assert "Traceback" in state.failure.stack and "keys.py" in state.failure.stack
    healthy = env.get("h")
    assert healthy is not None and healthy.output == 2


# --- the redo protocol, on the state machine's API --------------------------------------


@pytest.fixture
def pp() -> PartitionProcessor:
    environment = Environment(
        registry,
        topic_names("t"),
        partitions=1,
        pending_events_max=2,
        pending_events_ttl_ms=10**6,
        limits=SETTINGS.limits,
        watchdog=TurnWatchdog(200),
        turn_max_events=500,
    )
    return PartitionProcessor(0, MemoryPartitionStore(), environment)


def command(offset: int, message: StartWorkflow) -> RawRecord:
    key = message.instance_id.encode()
    return RawRecord(0, offset, key, encode_message(message), NOW, "t.commands")


def statuses(out: list[Any]) -> dict[str, InstanceStatus]:
    found = {}
    for r in out:
        if r.topic == "t.status" and r.value:
            message = decode_message(r.value)
            assert isinstance(message, InstanceStatus)
            found[message.instance_id] = message
    return found


def test_a_turn_error_names_the_instance_and_the_redo_fails_it_alone(
    pp: PartitionProcessor,
) -> None:
    records = [
        command(0, StartWorkflow("t", name="bad_timer")),
        command(1, StartWorkflow("h", name="echo", input=to_payload(2))),
    ]
    for record in records:
        pp.accept(record, NOW)
    with pytest.raises(InstanceTurnError) as caught:
        pp.end_batch(NOW)
    assert caught.value.instance_id == "t" and caught.value.partition == 0
    pp.rolled_back()
    assert pp.isolate(caught.value)
    assert not pp.isolate(caught.value)  # isolated already: failing it alone failed too
    for record in records:
        pp.accept(record, NOW)
    batch = pp.end_batch(NOW)
    found = statuses(batch.out)
    assert found["t"].status is RuntimeStatus.FAILED
    assert found["h"].status is RuntimeStatus.COMPLETED
    history_origins = {r.origin for r in batch.out if r.topic == "t.history"}
    assert history_origins == {"t", "h"}
    pp.committed({})
    assert not pp.quarantine.instances  # applied and committed


def test_a_bug_handling_a_record_sends_it_to_dead_letters_on_the_redo(
    pp: PartitionProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(b: Any, msg: StartWorkflow, now_ms: int) -> None:
        raise KeyError("a bug")

    record = command(0, StartWorkflow("x", name="echo"))
    monkeypatch.setitem(handlers.MESSAGE_HANDLERS, StartWorkflow, broken)
    with pytest.raises(RecordHandlingError) as caught:
        pp.accept(record, NOW)
    assert (caught.value.topic, caught.value.offset) == ("t.commands", 0)
    pp.rolled_back()
    assert pp.isolate(caught.value)
    pp.accept(record, NOW)
    batch = pp.end_batch(NOW)
    (letter,) = [r for r in batch.out if r.topic == "t.dead-letters"]
    assert letter.origin == ""  # a dead letter never fails an instance
    assert b"KeyError" in dict(letter.headers)["reason"]


def test_an_oversized_value_in_a_dead_letter_is_cut(pp: PartitionProcessor) -> None:
    record = RawRecord(0, 0, b"k", b"\x00" * 50_000, NOW, "t.commands")
    pp.accept(record, NOW)
    batch = pp.end_batch(NOW)
    (letter,) = [r for r in batch.out if r.topic == "t.dead-letters"]
    assert letter.value is not None and len(letter.value) < 40_000
    assert b"value cut from 50000" in dict(letter.headers)["reason"]


def test_the_status_record_always_fits() -> None:
    big = Payload(b"z" * 30_000)
    s = InstanceStatus("x", input=big, output=big, custom_status=Payload(b"c" * 100))
    fitted = fit_status(s, 40_000)
    assert status_size(fitted) <= 40_000
    assert fitted.custom_status == s.custom_status
    assert [p.encoding for p in (fitted.input, fitted.output) if p].count(SUMMARY_ENCODING) >= 1
    assert fit_status(replace(s, input=None, output=None), 40_000) == replace(
        s, input=None, output=None
    )


def test_limits_that_do_not_fit_in_one_record_are_refused() -> None:
    with pytest.raises(ValueError, match="workflow_input"):
        Limits(workflow_input=2_000_000, record=1_000_000)
