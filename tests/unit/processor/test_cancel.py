"""Graceful cancel through ``TestEngine``: every fiber sees ``CancelledError`` at its
current await, clean-up code may still await activities, an instance that lets the error
propagate ends CANCELLED and one that catches it runs on; running activities get a
cancellation request, children follow their parent-close policy, refusals are typed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import decode_message
from engine.core.errors import InstanceNotFoundError, InstanceNotRunningError
from engine.core.history import ExecutionCancelRequested, RuntimeStatus
from engine.core.messages import ActivityCancel, CommandResult
from engine.runtime import CancelledError
from engine.testing import TestEngine

registry = Registry()
compensated: list[str] = []


@registry.activity(name="cancel.compensate")
def compensate(what: str) -> str:
    compensated.append(what)
    return f"undone {what}"


@registry.workflow(name="cancel.booking")
async def booking(ctx: WorkflowContext, what: str) -> str:
    """Waits for a confirmation; a cancellation undoes the booking in ``finally``."""
    done = False
    try:
        await ctx.wait_for_event("confirm")
        done = True
        return "confirmed"
    finally:
        if not done:
            await ctx.call_activity(compensate, what)


@registry.workflow(name="cancel.stubborn")
async def stubborn(ctx: WorkflowContext, _: Any) -> str:
    """Catches the cancellation and goes on to wait for an event."""
    try:
        await ctx.sleep(3600)
    except CancelledError:
        ctx.set_custom_status("ignored the cancel")
    return str(await ctx.wait_for_event("go"))


@registry.workflow(name="cancel.fibers")
async def fibers(ctx: WorkflowContext, count: int) -> list[str]:
    """Spawned fibers each record that they saw the cancellation; main lets it propagate
    after a clean-up activity (so the instance ends in a later turn than the cancel)."""
    seen: list[str] = []

    async def waiter(n: int) -> None:
        try:
            await ctx.wait_for_event(f"e{n}")
        except CancelledError:
            seen.append(f"fiber {n}")
            ctx.set_custom_status(sorted(seen))
            raise

    for n in range(count):
        ctx.spawn(waiter(n))
    try:
        await ctx.sleep(3600)
    finally:
        await ctx.call_activity(compensate, f"{ctx.instance_id} main")
    return seen


@registry.workflow(name="cancel.working")
async def working(ctx: WorkflowContext, _: Any) -> str:
    # no worker here registers "elsewhere": the attempt stays open, as on a busy worker
    return str(await ctx.call_activity("elsewhere", None))


@registry.workflow(name="cancel.parent")
async def parent(ctx: WorkflowContext, policy: str) -> str:
    ctx.call_child_workflow(
        booking, "child seat", instance_id=f"{ctx.instance_id}:kid", parent_close_policy=policy
    )
    await ctx.wait_for_event("never")
    return "unreachable"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    compensated.clear()
    with TestEngine(registry) as engine:
        yield engine


def test_a_cancelled_instance_compensates_in_finally_and_ends_cancelled(env: TestEngine) -> None:
    handle = env.start("cancel.booking", "seat 12", instance_id="b-1")
    env.run()
    answer = handle.cancel("customer changed their mind")
    assert answer is not None and answer.result is CommandResult.ACCEPTED
    state = env.wait_for_completion("b-1", timeout=60)
    assert state.status is RuntimeStatus.CANCELLED
    assert state.failure is not None
    assert (state.failure.type, state.failure.message) == (
        "CancelledError",
        "customer changed their mind",
    )
    assert compensated == ["seat 12"]
    kinds = [type(e.body).__name__ for e in env.history("b-1")]
    assert kinds.count("ExecutionCancelRequested") == 1
    assert kinds.index("ExecutionCancelRequested") < kinds.index("TaskCompleted")


def test_a_replayed_instance_cancels_as_the_live_one_did(env: TestEngine) -> None:
    """Evicted between the cancel and the end of its clean-up, the instance replays the
    cancellation from history (every fiber in the same order) and goes on."""
    env.start("cancel.fibers", 3, instance_id="cold")
    env.start("cancel.booking", "seat 7", instance_id="cold-b")
    env.run()
    env.cancel("cold", "evicted")
    env.cancel("cold-b", "evicted")
    for processor in env.processors.values():
        processor.cache.clear()
    assert env.wait_for_completion("cold").status is RuntimeStatus.CANCELLED
    assert env.get("cold").custom_status == ["fiber 0", "fiber 1", "fiber 2"]  # type: ignore[union-attr]
    assert env.wait_for_completion("cold-b").status is RuntimeStatus.CANCELLED
    assert sorted(compensated) == ["cold main", "seat 7"]


def test_an_instance_that_catches_the_cancellation_runs_on(env: TestEngine) -> None:
    env.start("cancel.stubborn", None, instance_id="s-1")
    env.run()
    env.cancel("s-1", "please stop")
    env.run()
    state = env.get("s-1")
    assert state is not None and state.status is RuntimeStatus.RUNNING
    assert state.custom_status == "ignored the cancel"
    env.raise_event("s-1", "go", "on")
    assert env.wait_for_completion("s-1").output == "on"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(min_value=0, max_value=4))
def test_every_fiber_sees_the_cancellation(count: int) -> None:
    with TestEngine(registry) as env:
        env.start("cancel.fibers", count, instance_id="f")
        env.run()
        env.cancel("f")
        state = env.wait_for_completion("f")
        assert state.status is RuntimeStatus.CANCELLED
        assert state.failure is not None and state.failure.message == "cancellation requested"
        expected = sorted(f"fiber {n}" for n in range(count))
        assert (state.custom_status or []) == expected


def test_a_running_activity_gets_a_cancellation_request(env: TestEngine) -> None:
    env.start("cancel.working", None, instance_id="w-1")
    env.run()
    env.cancel("w-1", "no longer needed")
    state = env.wait_for_completion("w-1", timeout=60)
    assert state.status is RuntimeStatus.CANCELLED
    kinds = [type(e.body).__name__ for e in env.history("w-1")]
    assert "ActivityCancelRequested" in kinds and "TaskCompleted" not in kinds
    cancels = [
        decode_message(r.value)
        for r in env.records(env.topics.activity_tasks)
        if r.value is not None and type(decode_message(r.value)) is ActivityCancel
    ]
    assert [(c.instance_id, c.task_id) for c in cancels] == [("w-1", 0)]


@pytest.mark.parametrize(
    ("policy", "child_status"),
    [
        ("TERMINATE", RuntimeStatus.TERMINATED),
        ("REQUEST_CANCEL", RuntimeStatus.CANCELLED),
        ("ABANDON", RuntimeStatus.RUNNING),
    ],
)
def test_children_follow_their_parent_close_policy(
    env: TestEngine, policy: str, child_status: RuntimeStatus
) -> None:
    env.start("cancel.parent", policy, instance_id="p")
    env.run()
    env.cancel("p", "parent cancelled")
    assert env.wait_for_completion("p").status is RuntimeStatus.CANCELLED
    env.run()
    child = env.get("p:kid")
    assert child is not None and child.status is child_status
    assert compensated == (["child seat"] if policy == "REQUEST_CANCEL" else [])


def test_refusals_and_duplicates(env: TestEngine) -> None:
    with pytest.raises(InstanceNotFoundError, match="no instance nobody"):
        env.cancel("nobody")
    env.start("cancel.stubborn", None, instance_id="s")
    env.run()
    first = env.cancel("s", request_id="c-1")
    again = env.cancel("s", request_id="c-1")  # a client retry: applied once
    assert first is not None and again is not None and again.duplicate
    env.run()
    bodies = [e.body for e in env.history("s")]
    assert sum(isinstance(b, ExecutionCancelRequested) for b in bodies) == 1
    env.terminate("s")
    env.run()
    with pytest.raises(InstanceNotRunningError, match="TERMINATED"):
        env.cancel("s")


def test_terminate_stays_the_hard_stop(env: TestEngine) -> None:
    env.start("cancel.booking", "seat 1", instance_id="t")
    env.run()
    env.terminate("t", "now")
    assert env.wait_for_completion("t").status is RuntimeStatus.TERMINATED
    assert compensated == []  # no clean-up code ran


def test_a_scheduled_start_cancelled_before_its_time_never_runs(env: TestEngine) -> None:
    env.start(
        "cancel.booking", "seat 3", instance_id="later", start_at=env.now() + timedelta(hours=1)
    )
    env.run()
    answer = env.cancel("later", "plans changed")
    assert answer is not None and "before its scheduled start" in answer.reason
    env.advance(timedelta(hours=2))
    state = env.get("later")
    assert state is not None and state.status is RuntimeStatus.CANCELLED
    assert env.history("later") == [] and compensated == []
