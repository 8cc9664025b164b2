"""Turn logic of one partition, driven through engine.testing (the real state machine over
in-memory topics and the in-memory store; the Kafka path has its own tests)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_history, decode_message, encode_message
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import InstanceStillRunningError, PendingEventsFullError
from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.messages import (
    ActivityResult,
    ActivityTask,
    CommandResult,
    InstanceStatus,
    StartWorkflow,
)
from engine.core.payloads import from_payload, to_payload
from engine.services.processor import keys
from engine.services.processor.history_rows import split_row
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.records import RawRecord
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="inline3")
async def inline3(ctx: WorkflowContext, x: int) -> int:
    for _ in range(3):
        x = await ctx.run("inc", lambda v: v + 1, x)
    return x


@registry.activity(name="double")
def double(x: int) -> int:
    return 2 * x


@registry.workflow(name="remote")
async def remote(ctx: WorkflowContext, x: int) -> int:
    return int(await ctx.call_activity("double", x))


@registry.workflow(name="waiter")
async def waiter(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.wait_for_event("go")


@registry.workflow(name="counter")
async def counter(ctx: WorkflowContext, n: int) -> int:
    await ctx.sleep(1)
    if n < 3:
        ctx.continue_as_new(n + 1)
    return n


@registry.workflow(name="versioned", version="2")
async def versioned(ctx: WorkflowContext, _: Any) -> str:
    return "v2"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, settings=Settings(pending_events_max=2)) as engine:
        yield engine


def pp_of(env: TestEngine) -> PartitionProcessor:
    return env.processors[0]


def statuses(env: TestEngine, instance_id: str | None = None) -> list[InstanceStatus]:
    out = []
    for r in env.records("status"):
        if r.value is not None and (instance_id is None or r.key == instance_id.encode()):
            status = decode_message(r.value)
            assert isinstance(status, InstanceStatus)
            out.append(status)
    return out


def history_rows(pp: PartitionProcessor, instance_id: str) -> list[HistoryEvent]:
    prefix = keys.history_prefix(instance_id)
    rows = pp.tables.scan(prefix, prefix + b"\xff")
    return [decode_history(event) for _, v in rows for event in split_row(v)]


def test_inline_steps_complete_in_one_turn_with_one_status_record(env: TestEngine) -> None:
    env.start("inline3", 1, instance_id="a")
    env.run()
    events = env.history("a")
    assert [e.sequence for e in events] == list(range(len(events)))
    assert isinstance(events[-1].body, ExecutionCompleted)
    (status,) = statuses(env, "a")
    assert status.status is RuntimeStatus.COMPLETED
    assert from_payload(status.output) == 4
    assert all(e.previous_hash == p.hash for p, e in itertools.pairwise(events))


def test_every_table_change_goes_to_its_changelog(env: TestEngine) -> None:
    env.start("counter", 3, instance_id="a")
    env.run()
    state = {r.key for r in env.records("state-changelog")}
    timers = {r.key for r in env.records("timer-changelog")}
    assert keys.meta_key("a") in state
    assert timers and all(k is not None and k.startswith(keys.TIMER) for k in timers)
    assert all(r.partition == 0 for r in env.records("state-changelog"))


def test_activity_result_is_applied_once(env: TestEngine) -> None:
    env.start("remote", 5, instance_id="r")
    assert env.wait_for_completion("r").output == 10
    (task,) = [decode_message(r.value) for r in env.records("activity-tasks") if r.value]
    state = env.get("r")
    assert state is not None and state.run_id
    assert isinstance(task, ActivityTask) and task.idempotency_key == f"r/{state.run_id}/0/0"
    again = ActivityResult("r", generation=0, task_id=0, attempt=1, output=to_payload(99))
    rejected = pp_of(env).counters.rejected
    env.produce(env.topics.activity_results, b"r", encode_message(again))
    env.run()
    assert pp_of(env).counters.rejected == rejected + 1
    assert [from_payload(s.output) for s in statuses(env, "r")] == [None, 10]


def test_cold_instance_is_rebuilt_from_its_history_rows(env: TestEngine) -> None:
    env.start("waiter", instance_id="w")
    env.run()
    pp_of(env).cache.clear()
    env.raise_event("w", "go", "yes")
    state = env.wait_for_completion("w")
    assert state.status is RuntimeStatus.COMPLETED and state.output == "yes"


def test_events_raised_before_the_start_are_kept_and_applied(env: TestEngine) -> None:
    env.raise_event("w", "go", 1)
    env.run()
    assert statuses(env) == []
    env.start("waiter", instance_id="w")
    assert env.wait_for_completion("w").output == 1


def test_pending_events_beyond_the_bound_go_to_dead_letters(env: TestEngine) -> None:
    answers = [env.raise_event("w", "go") for _ in range(2)]
    assert [a.result for a in answers if a is not None] == [CommandResult.BUFFERED] * 2
    with pytest.raises(PendingEventsFullError, match="pending_events_max"):
        env.raise_event("w", "go")
    env.run()
    (letter,) = env.dead_letters()
    assert "pending_events_max" in letter.reason and letter.instance_id == "w"
    (third,) = [r for r in env.records("commands") if r.offset == letter.source_offset]
    assert letter.source_topic == env.topics.commands and letter.value == third.value


def test_aborted_batch_leaves_no_trace() -> None:
    environment = Environment(registry, topic_names("t"), 1, 2, 10**6)
    pp = PartitionProcessor(0, MemoryPartitionStore(), environment)
    start = encode_message(StartWorkflow("a", name="inline3", input=to_payload(1)))
    record = RawRecord(0, 0, b"a", start, 0, "t.commands")
    pp.accept(record, 1000)
    assert pp.end_batch(1000).out
    pp.rolled_back()
    assert pp.tables.load_meta("a") is None
    pp.accept(record, 1000)
    batch = pp.end_batch(1000)
    first = next(decode_history(r.value) for r in batch.out if r.topic == "t.history" and r.value)
    assert first.sequence == 0
    pp.committed({})
    assert pp.tables.load_meta("a") is not None


def test_continue_as_new_keeps_only_the_current_generation_in_the_table(
    env: TestEngine,
) -> None:
    env.start("counter", 1, instance_id="c")
    assert env.wait_for_completion("c").output == 3
    meta = pp_of(env).tables.load_meta("c")
    assert meta is not None and meta.status is RuntimeStatus.COMPLETED and meta.generation == 2
    rows = history_rows(pp_of(env), "c")
    assert rows[0].sequence == meta.generation_start and rows[0].generation == 2
    assert not any(isinstance(e.body, ContinuedAsNew) for e in rows)
    starts = [e.generation for e in env.history("c") if isinstance(e.body, ExecutionStarted)]
    assert starts == [0, 1, 2]


def test_purge_removes_a_finished_instance_and_refuses_a_running_one(env: TestEngine) -> None:
    env.start("waiter", instance_id="w")
    env.run()
    with pytest.raises(InstanceStillRunningError):
        env.purge("w")
    env.run()
    assert pp_of(env).tables.load_meta("w") is not None
    env.start("inline3", 1, instance_id="a")
    env.run()
    env.purge("a")
    env.run()
    assert [r.value for r in env.records("status") if r.key == b"a"][-1] is None
    assert env.get("a") is None
    assert pp_of(env).tables.load_meta("a") is None
    assert history_rows(pp_of(env), "a") == []


def test_scheduled_start_waits_for_its_timer(env: TestEngine) -> None:
    env.start("inline3", 1, instance_id="s", start_at=env.now() + timedelta(milliseconds=500))
    env.run()
    state = env.get("s")
    assert state is not None and state.status is RuntimeStatus.PENDING
    env.advance(0.499)
    assert env.get("s").status is RuntimeStatus.PENDING  # type: ignore[union-attr]
    env.advance(0.001)
    assert env.get("s").status is RuntimeStatus.COMPLETED  # type: ignore[union-attr]


def test_unknown_workflow_waits_alone(env: TestEngine) -> None:
    """An unregistered workflow parks (tests/unit/processor/test_parking.py); the others
    in its batch go on."""
    env.send(StartWorkflow("x", name="no-such-workflow"))
    env.start("inline3", 1, instance_id="a")
    env.run()
    x, a = env.get("x"), env.get("a")
    assert x is not None and x.status is RuntimeStatus.PARKED
    assert a is not None and a.status is RuntimeStatus.COMPLETED


def test_unknown_workflow_fails_alone_with_parking_off() -> None:
    settings = Settings(pending_events_max=2, park_workflow_errors=False)
    with TestEngine(registry, settings=settings) as env:
        env.send(StartWorkflow("x", name="no-such-workflow"))
        env.start("inline3", 1, instance_id="a")
        env.run()
        x, a = env.get("x"), env.get("a")
        assert x is not None and x.status is RuntimeStatus.FAILED and x.failure is not None
        assert x.failure.type == "NotRegisteredError"
        assert a is not None and a.status is RuntimeStatus.COMPLETED


def test_history_and_status_name_the_version_that_ran(env: TestEngine) -> None:
    env.start("versioned", instance_id="v")
    state = env.wait_for_completion("v")
    started = next(e.body for e in env.history("v") if isinstance(e.body, ExecutionStarted))
    assert started.version == "2"
    assert state.version == "2" and state.output == "v2"
