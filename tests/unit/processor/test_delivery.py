"""Delivery semantics on the processor, through engine.testing: every event an instance
receives is read by the code exactly once, or still waits, or is carried to the next
generation - a continue-as-new or a when_any never drops one; an unawaited thread that
fails fails the workflow. (The runtime's model test, tests/unit/runtime/test_delivery_model.py,
checks the same invariant over random workflows and arrival orders.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from engine import ApplicationError, Registry, WorkflowContext
from engine.codec import decode_message
from engine.core.history import EventRaised, RuntimeStatus
from engine.core.messages import ActivityCancel
from engine.testing import TestEngine

registry = Registry()


@registry.activity(name="delivery.tick")
def tick(n: int) -> int:
    return n + 1


@registry.workflow(name="delivery.listener")
async def listener(ctx: WorkflowContext, state: dict[str, Any]) -> dict[str, Any]:
    """A spawned listener collects events; main continues as new after an activity."""
    seen: list[Any] = list(state["seen"])

    async def listen() -> None:
        while True:
            seen.append(await ctx.wait_for_event("e"))
            ctx.set_custom_status(seen)

    ctx.spawn(listen())
    n = await ctx.call_activity(tick, state["n"])
    if n < 2:
        ctx.continue_as_new({"n": n, "seen": seen, "want": state["want"]})
    await ctx.wait_condition(lambda: len(seen) >= state["want"])
    return {"seen": seen, "generation": ctx.generation}


@registry.workflow(name="delivery.loop")
async def loop(ctx: WorkflowContext, state: dict[str, Any]) -> dict[str, Any]:
    """The when_any loop that continues as new on every timeout."""
    event = ctx.wait_for_event("e")
    winner = await ctx.when_any([ctx.sleep(60), event])
    if winner is event:
        return {"got": event.result(), "timeouts": state["timeouts"]}
    ctx.continue_as_new({"timeouts": state["timeouts"] + 1})


@registry.workflow(name="delivery.race")
async def race(ctx: WorkflowContext, _: Any) -> dict[str, Any]:
    """A timer wins the when_any; the event of the loser must still be there later."""
    first = await ctx.when_any([ctx.sleep(60), ctx.wait_for_event("sig")])
    later = await ctx.wait_for_event("sig", timeout=1)
    return {"timer_won": first.exception() is None and first.result() is None, "sig": later}


@registry.workflow(name="delivery.cancel_listener")
async def cancel_listener(ctx: WorkflowContext, _: Any) -> Any:
    """Main cancels a listener whose event arrived in the same batch as main's own."""

    async def listen() -> Any:
        return await ctx.wait_for_event("e")

    thread = ctx.spawn(listen())
    await ctx.wait_for_event("go")
    thread.cancel()  # the listener was woken by "e" but has not resumed
    return await ctx.wait_for_event("e", timeout=1)


@registry.workflow(name="delivery.orphan")
async def orphan(ctx: WorkflowContext, how: str) -> str:
    async def fails() -> None:
        await ctx.sleep(1)
        raise ApplicationError(f"the thread failed ({how})", non_retryable=True)

    thread = ctx.spawn(fails())
    if how == "cancelled":
        await ctx.sleep(0.5)
        thread.cancel()
    await ctx.sleep(5)
    return "main finished"


@registry.workflow(name="delivery.awaited")
async def awaited(ctx: WorkflowContext, _: Any) -> str:
    async def fails() -> None:
        await ctx.sleep(1)
        raise ApplicationError("caught by main", non_retryable=True)

    thread = ctx.spawn(fails())
    try:
        await thread
    except ApplicationError as exc:
        return f"main saw: {exc}"
    return "unreachable"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry) as engine:
        yield engine


def raised(env: TestEngine, instance_id: str) -> list[tuple[int, Any]]:
    """(generation, name) of every EventRaised in the instance's history."""
    return [
        (e.generation, e.body.name)
        for e in env.history(instance_id)
        if isinstance(e.body, EventRaised)
    ]


def test_continue_as_new_carries_an_event_a_listener_claimed_in_the_same_batch(
    env: TestEngine,
) -> None:
    env.start("delivery.listener", {"n": 0, "seen": [], "want": 1}, instance_id="l-1")
    env.step()  # the start: main schedules the activity, which runs; its result waits
    env.raise_event("l-1", "e", "first")  # lands in one batch after the activity result
    env.step()  # main continues as new before the listener resumed with the event
    state = env.wait_for_completion("l-1", timeout=60)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output == {"seen": ["first"], "generation": 1}
    # received once in generation 0, carried once into generation 1
    assert raised(env, "l-1") == [(0, "e"), (1, "e")]


def test_continue_as_new_carries_claimed_and_buffered_events_in_arrival_order(
    env: TestEngine,
) -> None:
    env.start("delivery.listener", {"n": 0, "seen": [], "want": 3}, instance_id="l-2")
    env.step()
    for value in ("a", "b", "c"):  # the listener claims "a"; "b" and "c" are buffered
        env.raise_event("l-2", "e", value)
    env.step()
    state = env.wait_for_completion("l-2", timeout=60)
    assert state.output == {"seen": ["a", "b", "c"], "generation": 1}


def test_when_any_loop_carries_the_event_that_lost_to_the_timer(env: TestEngine) -> None:
    # the timer fires and the event arrives before the code runs again (the instance is
    # suspended meanwhile): the timer won, the event must survive the continue-as-new
    env.start("delivery.loop", {"timeouts": 0}, instance_id="loop-1")
    env.run()
    env.suspend("loop-1")
    env.run()
    env.advance(61)  # the timer fires while suspended
    env.raise_event("loop-1", "e", "late")
    env.resume("loop-1")
    state = env.wait_for_completion("loop-1", timeout=600)
    assert state.output == {"got": "late", "timeouts": 1}
    assert raised(env, "loop-1") == [(0, "e"), (1, "e")]


def test_when_any_loser_gives_its_event_back(env: TestEngine) -> None:
    env.start("delivery.race", None, instance_id="race-1")
    env.run()
    env.suspend("race-1")
    env.run()
    env.advance(61)
    env.raise_event("race-1", "sig", {"ok": True})
    env.resume("race-1")
    state = env.wait_for_completion("race-1", timeout=600)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output == {"timer_won": True, "sig": {"ok": True}}


def test_a_fiber_cancelled_before_it_read_its_event_gives_it_back(env: TestEngine) -> None:
    env.start("delivery.cancel_listener", None, instance_id="cl-1")
    env.run()
    env.raise_event("cl-1", "go")
    env.raise_event("cl-1", "e", "for main")  # one batch: main runs first
    state = env.wait_for_completion("cl-1", timeout=60)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output == "for main"


def test_an_unawaited_thread_that_fails_fails_the_workflow(env: TestEngine) -> None:
    env.start("delivery.orphan", "plain", instance_id="o-1")
    state = env.wait_for_completion("o-1", timeout=60)
    assert state.status is RuntimeStatus.FAILED
    assert state.failure is not None
    assert state.failure.type == "ApplicationError"
    assert "the thread failed (plain)" in state.failure.message


def test_a_cancelled_thread_does_not_fail_the_workflow(env: TestEngine) -> None:
    env.start("delivery.orphan", "cancelled", instance_id="o-2")
    state = env.wait_for_completion("o-2", timeout=60)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output == "main finished"


def test_an_awaited_thread_failure_reaches_its_awaiter_only(env: TestEngine) -> None:
    env.start("delivery.awaited", None, instance_id="o-3")
    state = env.wait_for_completion("o-3", timeout=60)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output == "main saw: caught by main"


# --- losing activities and children; the parent-close policy ----------------------------------

slow_registry = Registry()


@slow_registry.activity(name="delivery.slow")
def slow(value: str) -> str:
    return value


@slow_registry.workflow(name="delivery.activity_race")
async def activity_race(ctx: WorkflowContext, _: Any) -> str:
    work = ctx.call_activity(slow, "done")
    winner = await ctx.when_any([ctx.wait_for_event("go"), work])
    await ctx.sleep(1)  # still running when the activity's result comes back
    return "event" if winner is not work else "activity"


@slow_registry.workflow(name="delivery.child")
async def child(ctx: WorkflowContext, _: Any) -> str:
    try:
        await ctx.wait_for_event("never")
    except BaseException:
        ctx.set_custom_status("cleaning up")
        await ctx.sleep(1)  # clean-up work after the cancellation
        raise
    return "unreachable"


@slow_registry.workflow(name="delivery.parent")
async def parent(ctx: WorkflowContext, spec: dict[str, Any]) -> str:
    policy = spec["policy"]
    if spec.get("race"):
        kid = ctx.call_child_workflow(
            child, None, instance_id=f"{ctx.instance_id}:kid", parent_close_policy=policy
        )
        await ctx.when_any([ctx.sleep(1), kid])
        await ctx.sleep(10)
        return "raced"
    kid = f"{ctx.instance_id}:kid{ctx.generation}"
    if policy is None:  # the default policy
        ctx.call_child_workflow(child, None, instance_id=kid)
    else:
        ctx.call_child_workflow(child, None, instance_id=kid, parent_close_policy=policy)
    if spec.get("fail"):
        await ctx.sleep(1)
        raise ApplicationError("the parent gave up", non_retryable=True)
    if ctx.generation < spec.get("generations", 0):
        await ctx.sleep(1)
        ctx.continue_as_new(spec)
    await ctx.wait_for_event("finish")
    return "finished"


@slow_registry.workflow(name="delivery.too_big")
async def too_big(ctx: WorkflowContext, _: Any) -> str:
    ctx.call_child_workflow(child, None, instance_id=f"{ctx.instance_id}:kid")
    await ctx.sleep(1)
    return "x" * (300 * 1024)  # over the workflow output limit: the processor fails it


@slow_registry.workflow(name="delivery.middle")
async def middle(ctx: WorkflowContext, policy: str) -> str:
    ctx.call_child_workflow(
        child, None, instance_id=f"{ctx.instance_id}:grand", parent_close_policy=policy
    )
    await ctx.wait_for_event("never")
    return "unreachable"


@slow_registry.workflow(name="delivery.top")
async def top(ctx: WorkflowContext, policy: str) -> str:
    ctx.call_child_workflow(middle, policy, instance_id=f"{ctx.instance_id}:mid")
    await ctx.sleep(1)
    return "done"


@pytest.fixture
def slow_env() -> Iterator[TestEngine]:
    with TestEngine(slow_registry) as engine:
        yield engine


def test_a_losing_activity_gets_a_cancellation_request_and_its_late_result_is_stale(
    slow_env: TestEngine, caplog: pytest.LogCaptureFixture
) -> None:
    env = slow_env
    caplog.set_level(logging.INFO, logger="engine.processor")
    env.start("delivery.activity_race", None, instance_id="ar-1")
    env.raise_event("ar-1", "go")  # in the start's batch: the event wins at once
    state = env.wait_for_completion("ar-1", timeout=60)
    assert state.output == "event"
    kinds = [type(e.body).__name__ for e in env.history("ar-1")]
    assert kinds.index("TaskScheduled") < kinds.index("ActivityCancelRequested")
    assert "TaskCompleted" not in kinds  # never applied
    # the worker either stopped the attempt (no result) or its result came back late and
    # was rejected as stale
    counters = env.processors[env.partition_of("ar-1")].counters
    assert counters.rejected_kinds.get("TaskCompleted", 0) in (0, 1)
    # the CancelActivity action reached its handler with the call's idempotency key
    state = env.get("ar-1")
    assert state is not None and state.run_id
    assert f"idempotency key ar-1/{state.run_id}/0/0) cancelled" in caplog.text
    # and the worker was told: an ActivityCancel for attempt 1 on the task's queue
    cancels = [
        decode_message(r.value)
        for r in env.records(env.topics.activity_tasks)
        if r.value is not None and type(decode_message(r.value)) is ActivityCancel
    ]
    assert [(c.instance_id, c.task_id, c.attempt) for c in cancels] == [("ar-1", 0, 1)]


def child_state(env: TestEngine, instance_id: str) -> tuple[RuntimeStatus, Any]:
    state = env.get(instance_id)
    assert state is not None
    return state.status, state.failure.type if state.failure else None


def test_parent_close_terminate_is_the_default(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": None}, instance_id="pc-1")
    env.run()
    env.raise_event("pc-1", "finish")
    assert env.wait_for_completion("pc-1").output == "finished"
    env.run()
    assert child_state(env, "pc-1:kid0") == (RuntimeStatus.TERMINATED, "Terminated")


def test_parent_close_request_cancel_lets_the_child_clean_up(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": "REQUEST_CANCEL"}, instance_id="pc-2")
    env.run()
    env.raise_event("pc-2", "finish")
    env.wait_for_completion("pc-2")
    state = env.wait_for_completion("pc-2:kid0", timeout=60)
    assert state.status is RuntimeStatus.CANCELLED
    assert state.failure is not None and state.failure.type == "CancelledError"
    assert state.custom_status == "cleaning up"
    kinds = [type(e.body).__name__ for e in env.history("pc-2:kid0")]
    assert kinds.count("ExecutionCancelRequested") == 1
    assert "TimerFired" in kinds  # its clean-up ran to the end


def test_parent_close_abandon_leaves_the_child_running(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": "ABANDON"}, instance_id="pc-3")
    env.run()
    env.raise_event("pc-3", "finish")
    env.wait_for_completion("pc-3")
    env.run()
    assert child_state(env, "pc-3:kid0") == (RuntimeStatus.RUNNING, None)


def test_the_policy_applies_when_the_parent_fails_or_is_terminated(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": "TERMINATE"}, instance_id="pc-4")
    env.run()
    env.terminate("pc-4", "stop")  # not recursive: the policy still applies
    env.run()
    assert child_state(env, "pc-4:kid0") == (RuntimeStatus.TERMINATED, "Terminated")


def test_the_policy_applies_when_the_parent_code_fails(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": "TERMINATE", "fail": True}, instance_id="pc-9")
    env.advance(2)
    state = env.get("pc-9")
    assert state is not None and state.status is RuntimeStatus.FAILED
    assert state.failure is not None and state.failure.message == "the parent gave up"
    env.run()
    assert child_state(env, "pc-9:kid0") == (RuntimeStatus.TERMINATED, "Terminated")


def test_the_policy_applies_at_continue_as_new(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": "TERMINATE", "generations": 1}, instance_id="pc-5")
    env.advance(2)
    assert child_state(env, "pc-5:kid0") == (RuntimeStatus.TERMINATED, "Terminated")
    assert child_state(env, "pc-5:kid1") == (RuntimeStatus.RUNNING, None)


def test_a_child_that_loses_a_when_any_is_handled_by_its_policy(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.parent", {"policy": "TERMINATE", "race": True}, instance_id="pc-6")
    env.advance(2)  # the timer wins; the parent still runs
    assert child_state(env, "pc-6") == (RuntimeStatus.RUNNING, None)
    assert child_state(env, "pc-6:kid") == (RuntimeStatus.TERMINATED, "Terminated")


def test_a_child_that_loses_a_when_any_under_request_cancel_cleans_up(
    slow_env: TestEngine,
) -> None:
    env = slow_env
    spec = {"policy": "REQUEST_CANCEL", "race": True}
    env.start("delivery.parent", spec, instance_id="pc-10")
    env.advance(3)  # the timer wins; the child is asked to cancel and cleans up
    assert child_state(env, "pc-10") == (RuntimeStatus.RUNNING, None)
    state = env.get("pc-10:kid")
    assert state is not None and state.status is RuntimeStatus.CANCELLED
    assert state.failure is not None and state.failure.type == "CancelledError"
    assert state.custom_status == "cleaning up"


def test_recursive_terminate_reaches_children_of_earlier_generations(
    slow_env: TestEngine,
) -> None:
    env = slow_env
    spec = {"policy": "ABANDON", "generations": 2}
    env.start("delivery.parent", spec, instance_id="pc-7")
    env.advance(5)  # generations 0, 1 and 2 each started a child and left it running
    assert [child_state(env, f"pc-7:kid{g}")[0] for g in range(3)] == [RuntimeStatus.RUNNING] * 3
    env.terminate("pc-7", "stop all", recursive=True)
    env.run()
    assert [child_state(env, f"pc-7:kid{g}")[0] for g in range(3)] == [RuntimeStatus.TERMINATED] * 3


def test_the_policy_applies_when_the_processor_fails_the_parent(slow_env: TestEngine) -> None:
    env = slow_env
    env.start("delivery.too_big", None, instance_id="pc-8")
    state = env.wait_for_completion("pc-8", timeout=60)
    assert state.status is RuntimeStatus.FAILED
    assert state.failure is not None and state.failure.type == "PayloadTooLargeError"
    env.run()
    assert child_state(env, "pc-8:kid") == (RuntimeStatus.TERMINATED, "Terminated")


@pytest.mark.parametrize(
    ("policy", "grandchild"),
    [("ABANDON", RuntimeStatus.RUNNING), ("TERMINATE", RuntimeStatus.TERMINATED)],
)
def test_a_terminated_child_applies_its_own_childrens_policies(
    slow_env: TestEngine, policy: str, grandchild: RuntimeStatus
) -> None:
    env = slow_env
    env.start("delivery.top", policy, instance_id=f"top-{policy}")
    assert env.wait_for_completion(f"top-{policy}", timeout=60).output == "done"
    env.run()
    assert child_state(env, f"top-{policy}:mid")[0] is RuntimeStatus.TERMINATED
    assert child_state(env, f"top-{policy}:mid:grand")[0] is grandchild
