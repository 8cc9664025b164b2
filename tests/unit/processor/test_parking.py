"""Parking: a bug in workflow code (or an unregistered workflow) parks the instance instead
of failing it; a fix deployed later runs it on from where it stood, with every event that
arrived meanwhile. Deliberate failures still fail."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from engine import ApplicationError, Registry, WorkflowContext
from engine.codec import decode_history, decode_message
from engine.core.history import ExecutionCompleted, HistoryEvent, RuntimeStatus
from engine.core.messages import (
    InstanceStatus,
    RaiseEvent,
    ResumeWorkflow,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.core.payloads import from_payload, to_payload
from engine.services.processor import keys, parking
from engine.services.processor.meta import decode_meta
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


class Rejected(Exception):
    pass


def build_registry(buggy: bool) -> Registry:
    """The same workflows before and after a fix is deployed."""
    registry = Registry()

    @registry.workflow(name="greet")
    async def greet(ctx: WorkflowContext, data: dict[str, Any]) -> str:
        if buggy:
            return data["nmae"]  # the bug: a typo
        return f"hello {data['name']}"

    @registry.workflow(name="two_events")
    async def two_events(ctx: WorkflowContext, _: Any) -> list[Any]:
        first = await ctx.wait_for_event("a")
        if buggy:
            raise AttributeError("'NoneType' object has no attribute 'x'")
        return [first, await ctx.wait_for_event("b")]

    @registry.workflow(name="refuse", failure_types=(Rejected,))
    async def refuse(ctx: WorkflowContext, kind: str) -> None:
        if kind == "application":
            raise ApplicationError("declined", type="Declined")
        raise Rejected("not today")

    return registry


def processor(buggy: bool = True, park: bool = True) -> PartitionProcessor:
    env = Environment(
        build_registry(buggy),
        topic_names("t"),
        pending_events_max=10,
        pending_events_ttl_ms=10**6,
        park_workflow_errors=park,
    )
    return PartitionProcessor(0, MemoryStore(), env)


def deploy_fix(pp: PartitionProcessor) -> PartitionProcessor:
    """A new processor on the same tables with fixed code (a restart after a deploy)."""
    fixed = processor(buggy=False)
    fixed.tables = pp.tables
    return fixed


def run_batch(pp: PartitionProcessor, *messages: Any, now: int = NOW) -> list[OutRecord]:
    for message in messages:
        pp.handle(message, now)
    out, changes = pp.end_batch(now)
    pp.committed(changes, {})
    return out


def fire(pp: PartitionProcessor, now: int) -> list[OutRecord]:
    pp.fire_due_timers(now)
    return run_batch(pp, now=now)


def history(out: list[OutRecord]) -> list[HistoryEvent]:
    return [decode_history(r.value) for r in out if r.topic == "t.history" and r.value]


def statuses(out: list[OutRecord]) -> list[InstanceStatus]:
    return [decode_message(r.value) for r in out if r.topic == "t.status" and r.value]


def parked(pp: PartitionProcessor, instance_id: str) -> parking.Parked | None:
    row = pp.tables.store.get(keys.meta_key(instance_id))
    assert row is not None
    return decode_meta(row).parked


def test_a_bug_on_the_first_turn_parks_and_a_fix_completes_it() -> None:
    pp = processor()
    out = run_batch(pp, StartWorkflow("g", name="greet", input=to_payload({"name": "ann"})))
    assert history(out) == []
    assert [s.status for s in statuses(out)] == [RuntimeStatus.RUNNING]
    state = parked(pp, "g")
    assert state is not None and state.failure.type == "KeyError" and state.attempts == 1
    out = fire(pp, NOW + 1000)  # the retry with the same code parks it again, later
    second = parked(pp, "g")
    assert second is not None and second.attempts == 2 and second.retry_at_ms == NOW + 3000
    fixed = deploy_fix(pp)
    out = fire(fixed, NOW + 3000)
    events = history(out)
    assert isinstance(events[-1].body, ExecutionCompleted)
    assert from_payload(events[-1].body.output) == "hello ann"
    assert [e.sequence for e in events] == list(range(len(events)))
    assert parked(fixed, "g") is None
    assert not [t for t in fixed.tables.timers_of("g")]


def test_events_that_arrive_while_parked_are_applied_after_the_fix() -> None:
    pp = processor()
    out = run_batch(pp, StartWorkflow("e", name="two_events"))
    recorded = len(history(out))
    assert recorded > 0
    out = run_batch(pp, RaiseEvent("e", "a", to_payload(1)))
    assert history(out) == [] and parked(pp, "e") is not None
    out = run_batch(pp, RaiseEvent("e", "b", to_payload(2)))
    kept = parked(pp, "e")
    assert kept is not None and len(kept.inbox) == 2
    fixed = deploy_fix(pp)
    out = run_batch(fixed, ResumeWorkflow("e", reason="retry"))  # turnstile retry e
    events = history(out)
    assert events[0].sequence == recorded
    assert isinstance(events[-1].body, ExecutionCompleted)
    assert from_payload(events[-1].body.output) == [1, 2]


def test_an_unregistered_workflow_parks_until_it_is_deployed() -> None:
    pp = processor()
    run_batch(pp, StartWorkflow("u", name="not_deployed_yet"))
    state = parked(pp, "u")
    assert state is not None and state.failure.type == "NotRegisteredError"


@pytest.mark.parametrize(("kind", "failure_type"), [("application", "Declined"), ("x", "Rejected")])
def test_deliberate_failures_still_fail(kind: str, failure_type: str) -> None:
    pp = processor()
    out = run_batch(pp, StartWorkflow("r", name="refuse", input=to_payload(kind)))
    (status,) = statuses(out)
    assert status.status is RuntimeStatus.FAILED
    assert status.failure is not None and status.failure.type == failure_type
    assert parked(pp, "r") is None


def test_a_parked_instance_can_be_terminated() -> None:
    pp = processor()
    run_batch(pp, StartWorkflow("t", name="two_events"))
    run_batch(pp, RaiseEvent("t", "a", to_payload(1)))
    out = run_batch(pp, TerminateWorkflow("t", reason="giving up"))
    assert statuses(out)[-1].status is RuntimeStatus.TERMINATED
    assert parked(pp, "t") is None


def test_with_parking_off_a_bug_fails_the_instance() -> None:
    pp = processor(park=False)
    out = run_batch(pp, StartWorkflow("g", name="greet", input=to_payload({"name": "ann"})))
    (status,) = statuses(out)
    assert status.status is RuntimeStatus.FAILED and status.failure is not None
    assert status.failure.type == "KeyError"
