"""ctx.patched / ctx.deprecate_patch in the executor: what is recorded, what replay answers,
and which code changes a history survives (unit and Hypothesis)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import NonDeterminismError, Registry, WorkflowContext
from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    PatchMarker,
    RuntimeStatus,
    TaskCompleted,
    TaskScheduled,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime.executor import WorkflowExecution

OLD, PATCHED, DEPRECATED, REMOVED = "old", "patched", "deprecated", "removed"


def program(steps: int, at: int, mode: str) -> Registry:
    """``steps`` activities in a row; from ``PATCHED`` on, step ``at`` calls ``new``
    instead of ``a{at}`` (behind ctx.patched, then ctx.deprecate_patch, then plainly)."""

    async def flow(ctx: WorkflowContext) -> list[str]:
        done: list[str] = []
        for i in range(steps):
            name = f"a{i}"
            if i == at and mode == PATCHED:
                name = "new" if ctx.patched("p") else name
                assert ctx.patched("p") is (name == "new")  # the same answer every time
            elif i == at and mode == DEPRECATED:
                ctx.deprecate_patch("p")
                name = "new"
            elif i == at and mode == REMOVED:
                name = "new"
            done.append(await ctx.call_activity(name))
        return done

    registry = Registry()
    registry.add_workflow(flow, name="flow")
    return registry


def _open_task(events: Sequence[HistoryEvent]) -> TaskScheduled | None:
    done = {e.body.task_id for e in events if isinstance(e.body, TaskCompleted)}
    waiting = [e.body for e in events if isinstance(e.body, TaskScheduled)]
    return next((t for t in waiting if t.task_id not in done), None)


def drive(
    registry: Registry, history: Sequence[HistoryEvent], answers: int | None = None
) -> list[HistoryEvent]:
    """Replay ``history`` with ``registry``'s code, then go on live, completing each activity
    with its own name, ``answers`` times (None: to the end)."""
    execution = WorkflowExecution(registry, "wf-1")
    execution.replay(history)
    events = list(history)
    inbox = [] if events else [Inbound(ExecutionStarted("flow"))]
    now, answered = 1_000, 0
    while True:
        task = _open_task(events)
        if not inbox:
            if task is None or (answers is not None and answered >= answers):
                return events
            inbox = [Inbound(TaskCompleted(task.task_id, to_payload(task.name)), 0)]
            answered += 1
        result = execution.step(inbox, now)
        events += result.new_events
        inbox, now = [], now + 1


def markers(events: Sequence[HistoryEvent]) -> list[PatchMarker]:
    return [e.body for e in events if isinstance(e.body, PatchMarker)]


def output(events: Sequence[HistoryEvent]) -> Any:
    last = events[-1].body
    assert isinstance(last, ExecutionCompleted), f"the run did not end: {last}"
    return from_payload(last.output)


def test_a_new_instance_records_the_marker_and_takes_the_new_path() -> None:
    events = drive(program(3, 1, PATCHED), [])
    assert markers(events) == [PatchMarker("p")]
    assert output(events) == ["a0", "new", "a2"]
    index = next(i for i, e in enumerate(events) if isinstance(e.body, PatchMarker))
    assert isinstance(events[index + 1].body, TaskScheduled)  # recorded where it was asked


def test_an_instance_past_the_patch_point_keeps_the_old_path() -> None:
    old = drive(program(3, 1, OLD), [], answers=1)  # a1 is already scheduled
    events = drive(program(3, 1, PATCHED), old)
    assert markers(events) == [] and output(events) == ["a0", "a1", "a2"]


def test_an_instance_before_the_patch_point_takes_the_new_path() -> None:
    old = drive(program(3, 2, OLD), [], answers=1)  # waits on a1: step 2 not reached
    events = drive(program(3, 2, PATCHED), old)
    assert markers(events) == [PatchMarker("p")] and output(events) == ["a0", "a1", "new"]


def test_a_marker_the_code_no_longer_asks_for_is_a_clear_error() -> None:
    patched = drive(program(3, 1, PATCHED), [])
    with pytest.raises(NonDeterminismError) as info:
        WorkflowExecution(program(3, 1, REMOVED), "wf-1").replay(patched)
    message = str(info.value)
    assert "PatchMarker(patch_id='p')" in message and "ctx.patched('p')" in message
    assert "ctx.deprecate_patch('p')" in message


def test_deprecated_markers_are_skipped_once_the_call_is_gone() -> None:
    deprecated = drive(program(3, 1, DEPRECATED), [])
    assert markers(deprecated) == [PatchMarker("p", deprecated=True)]
    WorkflowExecution(program(3, 1, REMOVED), "wf-1").replay(deprecated)
    WorkflowExecution(program(3, 1, PATCHED), "wf-1").replay(deprecated)  # a rollback too


def test_deprecate_patch_replays_histories_of_patched() -> None:
    patched = drive(program(2, 0, PATCHED), [])
    events = drive(program(2, 0, DEPRECATED), patched[:-3])  # cut before the end
    assert markers(events) == [PatchMarker("p")] and output(events) == ["new", "a1"]


def test_an_empty_patch_id_is_refused() -> None:
    async def flow(ctx: WorkflowContext) -> bool:
        return ctx.patched("")

    registry = Registry()
    registry.add_workflow(flow, name="flow")
    execution = WorkflowExecution(registry, "wf-1")
    execution.step([Inbound(ExecutionStarted("flow"))], 0)
    assert execution.status is RuntimeStatus.FAILED
    assert execution.failure is not None and "non-empty string" in execution.failure.message


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(min_value=1, max_value=5),
    data=st.data(),
)
def test_every_history_replays_through_the_migration(steps: int, data: st.DataObject) -> None:
    """Old code runs ``before`` activities; patched code takes over. The patched code
    replays every history; deprecate_patch and the final code replay exactly the ones that
    took the new path (so the waiting rules of docs/how-to/change-code.md are the whole
    story)."""
    at = data.draw(st.integers(min_value=0, max_value=steps - 1), label="patch at")
    before = data.draw(st.integers(min_value=0, max_value=steps), label="old answers")
    old = drive(program(steps, at, OLD), [], answers=before)
    mixed = drive(program(steps, at, PATCHED), old)
    took_new = before < at  # the old code had not scheduled step `at` yet
    assert (markers(mixed) == [PatchMarker("p")]) is took_new
    expected = [("new" if i == at and took_new else f"a{i}") for i in range(steps)]
    assert output(mixed) == expected
    WorkflowExecution(program(steps, at, PATCHED), "wf-1").replay(mixed)
    for mode in (DEPRECATED, REMOVED):
        execution = WorkflowExecution(program(steps, at, mode), "wf-1")
        if took_new and mode == DEPRECATED:
            execution.replay(mixed)
        elif not took_new:
            with pytest.raises(NonDeterminismError):
                execution.replay(mixed)
        else:
            with pytest.raises(NonDeterminismError, match="PatchMarker"):
                execution.replay(mixed)
    deprecated = drive(program(steps, at, DEPRECATED), mixed[: len(old)] if took_new else [])
    WorkflowExecution(program(steps, at, REMOVED), "wf-1").replay(deprecated)
