"""Turn logic of one partition, on an in-memory table (the Kafka path has its own tests)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_history, decode_message
from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.messages import (
    ActivityResult,
    ActivityTask,
    InstanceStatus,
    PurgeWorkflow,
    RaiseEvent,
    StartWorkflow,
)
from engine.core.payloads import from_payload, to_payload
from engine.services.processor import keys
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.ports import OutRecord
from engine.services.topics import topic_names

NOW = 1_700_000_000_000


class MemoryStore:
    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.rows.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(k for k in self.rows if start <= k < end):
            yield key, self.rows[key]

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        for key, value in changes.items():
            if value is None:
                self.rows.pop(key, None)
            else:
                self.rows[key] = value

    def close(self) -> None:
        pass


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


@pytest.fixture
def pp() -> PartitionProcessor:
    env = Environment(registry, topic_names("t"), pending_events_max=2, pending_events_ttl_ms=10**6)
    return PartitionProcessor(0, MemoryStore(), env)


def run_batch(pp: PartitionProcessor, *messages: Any, now: int = NOW) -> list[OutRecord]:
    for message in messages:
        pp.handle(message, now)
    out, changes = pp.end_batch(now)
    pp.committed(changes, {})
    return out


def history(out: list[OutRecord]) -> list[HistoryEvent]:
    return [decode_history(r.value) for r in out if r.topic == "t.history" and r.value]


def messages(out: list[OutRecord], topic: str) -> list[Any]:
    return [decode_message(r.value) for r in out if r.topic == topic and r.value]


def test_inline_steps_complete_in_one_turn_with_one_status_record(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("a", name="inline3", input=to_payload(1)))
    events = history(out)
    assert [e.sequence for e in events] == list(range(len(events)))
    assert isinstance(events[-1].body, ExecutionCompleted)
    statuses: list[InstanceStatus] = messages(out, "t.status")
    assert len(statuses) == 1
    assert statuses[0].status is RuntimeStatus.COMPLETED
    assert from_payload(statuses[0].output) == 4
    assert all(e.previous_hash == p.hash for p, e in itertools.pairwise(events))


def test_every_table_change_goes_to_its_changelog(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("a", name="counter", input=to_payload(3)))
    state = {r.key for r in out if r.topic == "t.state-changelog"}
    timers = {r.key for r in out if r.topic == "t.timer-changelog"}
    assert keys.meta_key("a") in state
    assert timers and all(k.startswith(keys.TIMER) for k in timers)
    assert all(r.partition == 0 for r in out if r.topic.endswith("changelog"))


def test_activity_result_is_applied_once(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("r", name="remote", input=to_payload(5)))
    (task,) = messages(out, "t.activity-tasks")
    assert isinstance(task, ActivityTask) and task.idempotency_key == "r/0/0/1"
    result = ActivityResult("r", generation=0, task_id=0, attempt=1, output=to_payload(10))
    out = run_batch(pp, result, result)
    assert pp.counters.rejected == 1
    (status,) = messages(out, "t.status")
    assert from_payload(status.output) == 10


def test_cold_instance_is_rebuilt_from_its_history_rows(pp: PartitionProcessor) -> None:
    run_batch(pp, StartWorkflow("w", name="waiter"))
    pp.cache._items.clear()
    out = run_batch(pp, RaiseEvent("w", name="go", input=to_payload("yes")))
    (status,) = messages(out, "t.status")
    assert status.status is RuntimeStatus.COMPLETED and from_payload(status.output) == "yes"


def test_events_raised_before_the_start_are_kept_and_applied(pp: PartitionProcessor) -> None:
    run_batch(pp, RaiseEvent("w", name="go", input=to_payload(1)))
    assert messages(run_batch(pp), "t.status") == []
    out = run_batch(pp, StartWorkflow("w", name="waiter"))
    (status,) = messages(out, "t.status")
    assert from_payload(status.output) == 1


def test_pending_events_beyond_the_bound_go_to_dead_letters(pp: PartitionProcessor) -> None:
    out = run_batch(pp, *(RaiseEvent("w", name="go") for _ in range(3)))
    assert len(messages(out, "t.dead-letters")) == 1


def test_aborted_batch_leaves_no_trace(pp: PartitionProcessor) -> None:
    pp.handle(StartWorkflow("a", name="inline3", input=to_payload(1)), NOW)
    pp.end_batch(NOW)
    pp.rolled_back()
    assert pp.tables.load_meta("a") is None
    out = run_batch(pp, StartWorkflow("a", name="inline3", input=to_payload(1)))
    assert history(out)[0].sequence == 0


def test_continue_as_new_keeps_only_the_current_generation_in_the_table(
    pp: PartitionProcessor,
) -> None:
    run_batch(pp, StartWorkflow("c", name="counter", input=to_payload(1)))
    for step in range(1, 4):
        now = NOW + step * 2000
        pp.fire_due_timers(now)
        _out, changes = pp.end_batch(now)
        pp.committed(changes, {})
    meta = pp.tables.load_meta("c")
    assert meta is not None and meta.status is RuntimeStatus.COMPLETED and meta.generation == 2
    rows = list(pp.tables.scan(keys.history_prefix("c"), keys.history_prefix("c") + b"\xff"))
    first = decode_history(rows[0][1])
    assert first.sequence == meta.generation_start and first.generation == 2
    assert not any(isinstance(decode_history(v).body, ContinuedAsNew) for _, v in rows)


def test_purge_removes_a_finished_instance_and_refuses_a_running_one(
    pp: PartitionProcessor,
) -> None:
    run_batch(pp, StartWorkflow("w", name="waiter"))
    run_batch(pp, PurgeWorkflow("w"))
    assert pp.tables.load_meta("w") is not None
    run_batch(pp, StartWorkflow("a", name="inline3", input=to_payload(1)))
    out = run_batch(pp, PurgeWorkflow("a"))
    assert [r.value for r in out if r.topic == "t.status"] == [None]
    assert pp.tables.load_meta("a") is None
    assert list(pp.tables.scan(keys.history_prefix("a"), keys.history_prefix("a") + b"\xff")) == []


def test_scheduled_start_waits_for_its_timer(pp: PartitionProcessor) -> None:
    start = StartWorkflow("s", name="inline3", input=to_payload(1), scheduled_start_ms=NOW + 500)
    out = run_batch(pp, start)
    (status,) = messages(out, "t.status")
    assert status.status is RuntimeStatus.PENDING
    assert pp.fire_due_timers(NOW + 499) == 0
    assert pp.fire_due_timers(NOW + 500) == 1
    out, _changes = pp.end_batch(NOW + 500)
    (status,) = messages(out, "t.status")
    assert status.status is RuntimeStatus.COMPLETED


def test_unknown_workflow_waits_alone(pp: PartitionProcessor) -> None:
    """An unregistered workflow parks (tests/unit/processor/test_parking.py); the others
    in its batch go on."""
    out = run_batch(
        pp,
        StartWorkflow("x", name="no-such-workflow"),
        StartWorkflow("a", name="inline3", input=to_payload(1)),
    )
    by_id = {s.instance_id: s for s in messages(out, "t.status")}
    assert by_id["x"].status is RuntimeStatus.RUNNING
    assert by_id["a"].status is RuntimeStatus.COMPLETED


def test_unknown_workflow_fails_alone_with_parking_off() -> None:
    env = Environment(
        registry,
        topic_names("t"),
        pending_events_max=2,
        pending_events_ttl_ms=10**6,
        park_workflow_errors=False,
    )
    pp = PartitionProcessor(0, MemoryStore(), env)
    out = run_batch(
        pp,
        StartWorkflow("x", name="no-such-workflow"),
        StartWorkflow("a", name="inline3", input=to_payload(1)),
    )
    by_id = {s.instance_id: s for s in messages(out, "t.status")}
    assert by_id["x"].status is RuntimeStatus.FAILED
    assert by_id["x"].failure is not None
    assert by_id["a"].status is RuntimeStatus.COMPLETED


@registry.workflow(name="versioned", version="2")
async def versioned(ctx: WorkflowContext, _: Any) -> str:
    return "v2"


def test_history_and_status_name_the_version_that_ran(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("v", name="versioned"))
    started = next(e.body for e in history(out) if type(e.body).__name__ == "ExecutionStarted")
    assert started.version == "2"
    (status,) = messages(out, "t.status")
    assert status.version == "2" and from_payload(status.output) == "v2"
