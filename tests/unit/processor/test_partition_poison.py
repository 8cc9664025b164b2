"""A bad instance fails alone at the partition level: limits, the turn budget, a bug while
finishing a turn (redone with the instance quarantined), the status record's size."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_history, decode_message
from engine.core.errors import InstanceTurnError
from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    RuntimeStatus,
    TaskFailed,
    TurnStarted,
)
from engine.core.limits import SUMMARY_ENCODING, Limits
from engine.core.messages import ActivityResult, InstanceStatus, RaiseEvent, StartWorkflow
from engine.core.payloads import Payload, to_payload
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.ports import OutRecord
from engine.services.topics import topic_names
from engine.services.watchdog import TurnWatchdog

NOW = 1_700_000_000_000


class MemoryStore:
    """One partition's tables in a dict."""

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


LIMITS = Limits(
    workflow_input=1000,
    workflow_output=1000,
    activity_input=1000,
    activity_result=1000,
    event=1000,
    custom_status=1000,
    record=40_000,
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


@registry.activity(name="big")
def big() -> str:
    return ""


@registry.workflow(name="remote")
async def remote(ctx: WorkflowContext) -> Any:
    try:
        return await ctx.call_activity("big")
    except Exception as exc:
        return f"caught {type(exc).__name__}"


@pytest.fixture
def pp() -> PartitionProcessor:
    env = Environment(
        registry,
        topic_names("t"),
        pending_events_max=2,
        pending_events_ttl_ms=10**6,
        limits=LIMITS,
        watchdog=TurnWatchdog(200),
        turn_max_events=500,
    )
    return PartitionProcessor(0, MemoryStore(), env)


def run_batch(pp: PartitionProcessor, *messages: Any) -> list[OutRecord]:
    for message in messages:
        pp.handle(message, NOW)
    out, changes = pp.end_batch(NOW)
    pp.committed(changes, {})
    return out


def status(out: list[OutRecord]) -> InstanceStatus:
    (record,) = [r for r in out if r.topic == "t.status"]
    assert record.value is not None
    message = decode_message(record.value)
    assert isinstance(message, InstanceStatus)
    return message


def bodies(out: list[OutRecord]) -> list[Any]:
    return [decode_history(r.value).body for r in out if r.topic == "t.history" and r.value]


def test_an_input_over_its_limit_fails_the_instance_with_a_summary(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("a", name="echo", input=to_payload("i" * 2000)))
    s = status(out)
    assert s.status is RuntimeStatus.FAILED and s.failure is not None
    assert s.failure.type == "PayloadTooLargeError"
    assert "max_workflow_input_bytes" in s.failure.message and "2002 bytes" in s.failure.message
    assert s.input is not None and s.input.encoding == SUMMARY_ENCODING
    events = bodies(out)
    assert [type(b) for b in events] == [TurnStarted, ExecutionStarted, ExecutionCompleted]
    assert events[1].input.encoding == SUMMARY_ENCODING


def test_an_output_over_its_limit_fails_the_instance(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("b", name="grow", input=to_payload(5000)))
    s = status(out)
    assert s.status is RuntimeStatus.FAILED and s.failure is not None
    assert "the workflow output" in s.failure.message and s.output is None


def test_a_too_large_activity_result_fails_the_attempt_not_the_instance(
    pp: PartitionProcessor,
) -> None:
    run_batch(pp, StartWorkflow("r", name="remote"))
    result = ActivityResult("r", 0, 0, 1, output=Payload(b'"' + b"y" * 3000 + b'"'))
    out = run_batch(pp, result)
    assert any(isinstance(b, TaskFailed) for b in bodies(out))
    s = status(out)
    assert s.status is RuntimeStatus.COMPLETED
    assert s.output is not None and b"ActivityFailedError" in s.output.data


def test_an_event_over_its_limit_is_refused_and_the_instance_goes_on(
    pp: PartitionProcessor,
) -> None:
    from engine.core.errors import PayloadTooLargeError

    with pytest.raises(PayloadTooLargeError, match="max_event_bytes"):
        pp.handle(RaiseEvent("w", name="go", input=to_payload("e" * 5000)), NOW)


def test_a_turn_that_never_yields_fails_on_the_budget(pp: PartitionProcessor) -> None:
    out = run_batch(
        pp, StartWorkflow("s", name="spin"), StartWorkflow("e", name="echo", input=to_payload(1))
    )
    statuses = {
        m.instance_id: m
        for r in out
        if r.topic == "t.status" and r.value
        for m in [decode_message(r.value)]
        if isinstance(m, InstanceStatus)
    }
    assert statuses["s"].status is RuntimeStatus.FAILED
    assert statuses["s"].failure is not None
    assert statuses["s"].failure.type == "WorkflowTurnTimeoutError"
    assert statuses["e"].status is RuntimeStatus.COMPLETED


def test_an_endless_inline_loop_stops_at_the_event_bound(pp: PartitionProcessor) -> None:
    out = run_batch(pp, StartWorkflow("i", name="endless"))
    s = status(out)
    assert s.failure is not None and s.failure.type == "StepBudgetExceededError"
    assert "turn_max_events" in s.failure.message
    assert len(bodies(out)) == 3  # start and end only: the runaway turn is not recorded


def test_a_bug_while_finishing_a_turn_is_redone_with_the_instance_failed(
    pp: PartitionProcessor,
) -> None:
    start = StartWorkflow("t", name="bad_timer")
    healthy = StartWorkflow("h", name="echo", input=to_payload(2))
    pp.handle(start, NOW)
    pp.handle(healthy, NOW)
    with pytest.raises(InstanceTurnError) as caught:
        pp.end_batch(NOW)
    assert caught.value.instance_id == "t" and caught.value.partition == 0
    pp.rolled_back()
    assert pp.quarantine.add_instance("t", caught.value.details)
    out = run_batch(pp, start, healthy)
    failed = decode_message(
        next(r for r in out if r.topic == "t.status" and r.key == b"t").value or b""
    )
    assert isinstance(failed, InstanceStatus) and failed.status is RuntimeStatus.FAILED
    assert failed.failure is not None and "Traceback" in failed.failure.stack
    assert not pp.quarantine.instances  # applied and committed


def test_the_status_record_always_fits(pp: PartitionProcessor) -> None:
    from engine.core.limits import fit_status, status_size

    big = Payload(b"z" * 30_000)
    s = InstanceStatus("x", input=big, output=big, custom_status=Payload(b"c" * 100))
    fitted = fit_status(s, 40_000)
    assert status_size(fitted) <= 40_000
    assert fitted.custom_status == s.custom_status
    assert [p.encoding for p in (fitted.input, fitted.output) if p].count(SUMMARY_ENCODING) >= 1
    assert fit_status(replace(s, input=None, output=None), 40_000) == replace(
        s, input=None, output=None
    )
