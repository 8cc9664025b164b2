"""The instance lifecycle on the processor state machine, through engine.testing: ID reuse,
idempotent starts, terminate (recursive too), suspend/resume, purge, continue-as-new and
events that arrive before the start. The same behaviours run end to end against a real
broker in tests/integration/test_lifecycle.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.core.errors import (
    InstanceNotRunningError,
    InstanceStillRunningError,
    WaitTimeoutError,
    WorkflowAlreadyRanError,
    WorkflowAlreadyRunningError,
)
from engine.core.history import (
    ContinuedAsNew,
    EventRaised,
    ExecutionCompleted,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.messages import IdReusePolicy, StartWorkflow
from engine.core.payloads import to_payload
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="wait")
async def wait(ctx: WorkflowContext, spec: Any) -> dict[str, Any]:
    return {"input": spec, "got": await ctx.wait_for_event("go")}


@registry.workflow(name="echo")
async def echo(ctx: WorkflowContext, value: Any) -> Any:
    return value


@registry.workflow(name="parent")
async def parent(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.call_child_workflow(wait, None, instance_id=f"{ctx.instance_id}:child")


@registry.activity(name="add")
def add(pair: list[int]) -> int:
    return pair[0] + pair[1]


@registry.workflow(name="counter")
async def counter(ctx: WorkflowContext, state: dict[str, int]) -> dict[str, int]:
    await ctx.sleep(0.05)
    acc = await ctx.call_activity(add, [state["acc"], state["n"]])
    n = state["n"] + 1
    if n < state["limit"]:
        ctx.continue_as_new({"n": n, "acc": acc, "limit": state["limit"]})
    return {"n": n, "acc": acc, "generation": ctx.generation}


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=2) as engine:
        yield engine


def kinds(events: list[HistoryEvent], kind: type) -> list[Any]:
    return [e.body for e in events if isinstance(e.body, kind)]


def started_and_running(env: TestEngine, workflow: str, spec: Any, instance_id: str) -> None:
    env.start(workflow, spec, instance_id=instance_id)
    env.run()
    state = env.get(instance_id)
    assert state is not None and state.status is RuntimeStatus.RUNNING


# --- ID reuse and idempotency ----------------------------------------------------------------


def test_error_if_running_refuses_a_second_start(env: TestEngine) -> None:
    started_and_running(env, "wait", 1, "i")
    with pytest.raises(WorkflowAlreadyRunningError, match="RUNNING") as refused:
        env.start("wait", 2, instance_id="i", reuse_policy=IdReusePolicy.ERROR_IF_RUNNING)
    assert refused.value.outcome.status is RuntimeStatus.RUNNING
    env.raise_event("i", "go", "x")
    state = env.wait_for_completion("i")
    assert state.output == {"input": 1, "got": "x"} and state.generation == 0
    assert env.processors[env.partition_of("i")].counters.rejected >= 1


def test_ignore_if_running_keeps_the_running_instance(env: TestEngine) -> None:
    started_and_running(env, "wait", 1, "i")
    env.start("wait", 2, instance_id="i", reuse_policy=IdReusePolicy.IGNORE_IF_RUNNING)
    env.raise_event("i", "go", "y")
    assert env.wait_for_completion("i").output == {"input": 1, "got": "y"}
    assert len(kinds(env.history("i"), ExecutionStarted)) == 1


def test_terminate_if_running_restarts_as_a_new_generation(env: TestEngine) -> None:
    started_and_running(env, "wait", 1, "i")
    env.start("wait", 2, instance_id="i", reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING)
    env.raise_event("i", "go", "z")
    state = env.wait_for_completion("i")
    assert state.output == {"input": 2, "got": "z"} and state.generation == 1
    events = env.history("i")
    assert [e.sequence for e in events] == list(range(len(events)))
    ends = [(e.generation, e.body.status) for e in events if isinstance(e.body, ExecutionCompleted)]
    assert ends == [(0, RuntimeStatus.TERMINATED), (1, RuntimeStatus.COMPLETED)]


def test_reject_duplicate_refuses_to_rerun_an_ended_instance(env: TestEngine) -> None:
    env.start("echo", "first", instance_id="i")
    env.run()
    with pytest.raises(WorkflowAlreadyRanError, match="REJECT_DUPLICATE"):
        env.start("echo", "second", instance_id="i", reuse_policy=IdReusePolicy.REJECT_DUPLICATE)
    env.run()
    state = env.get("i")
    assert state is not None and (state.output, state.generation) == ("first", 0)


def test_an_ended_instance_restarts_as_a_new_generation(env: TestEngine) -> None:
    env.start("echo", "first", instance_id="i")
    env.run()
    env.start("echo", "second", instance_id="i")
    env.run()
    state = env.get("i")
    assert state is not None and (state.output, state.generation) == ("second", 1)
    starts = [e.generation for e in env.history("i") if isinstance(e.body, ExecutionStarted)]
    assert starts == [0, 1]


def test_the_same_start_command_twice_runs_once(env: TestEngine) -> None:
    command = StartWorkflow("i", name="echo", input=to_payload("once"), request_id="r-1")
    env.send(command)
    env.send(command)
    assert env.wait_for_completion("i").output == "once"
    assert len(kinds(env.history("i"), ExecutionStarted)) == 1


# --- terminate, suspend, resume ----------------------------------------------------------


def test_terminate_ends_a_running_instance_and_later_events_are_not_applied(
    env: TestEngine,
) -> None:
    started_and_running(env, "wait", None, "i")
    env.terminate("i", "no longer needed")
    assert env.wait_for_completion("i").status is RuntimeStatus.TERMINATED
    with pytest.raises(InstanceNotRunningError, match="TERMINATED"):
        env.raise_event("i", "go", 1)
    env.run()
    assert env.get("i").status is RuntimeStatus.TERMINATED  # type: ignore[union-attr]
    assert not kinds(env.history("i"), EventRaised)


def test_recursive_terminate_ends_parent_and_child(env: TestEngine) -> None:
    env.start("parent", instance_id="p")
    env.run()
    child = env.get("p:child")
    assert child is not None and child.status is RuntimeStatus.RUNNING
    env.terminate("p", "stop everything", recursive=True)
    assert env.wait_for_completion("p").status is RuntimeStatus.TERMINATED
    assert env.wait_for_completion("p:child").status is RuntimeStatus.TERMINATED


def test_a_child_result_reaches_its_parent(env: TestEngine) -> None:
    env.start("parent", instance_id="p")
    env.run()
    env.raise_event("p:child", "go", "from the test")
    assert env.wait_for_completion("p").output == {"input": None, "got": "from the test"}


def test_events_raised_while_suspended_apply_after_resume(env: TestEngine) -> None:
    started_and_running(env, "wait", None, "i")
    env.suspend("i", "maintenance")
    env.raise_event("i", "go", "while suspended")
    env.run()
    assert env.get("i").status is RuntimeStatus.SUSPENDED  # type: ignore[union-attr]
    with pytest.raises(WaitTimeoutError, match="SUSPENDED"):
        env.wait_for_completion("i")
    env.resume("i", "done")
    assert env.wait_for_completion("i").output["got"] == "while suspended"
    order = [type(e.body) for e in env.history("i")]
    assert order.index(ExecutionSuspended) < order.index(EventRaised)
    assert order.index(EventRaised) < order.index(ExecutionResumed)


# --- purge, continue-as-new, pending events ------------------------------------------------


def test_purge_removes_an_ended_instance_so_its_id_starts_from_scratch(env: TestEngine) -> None:
    env.start("echo", "bye", instance_id="i")
    env.run()
    env.purge("i")
    env.run()
    assert env.get("i") is None
    assert kinds(env.history("i"), ExecutionCompleted), "the history topic keeps it"
    env.start("echo", "again", instance_id="i")
    state = env.wait_for_completion("i")
    assert (state.output, state.generation) == ("again", 0)


def test_purge_of_a_running_instance_is_refused(env: TestEngine) -> None:
    started_and_running(env, "wait", None, "i")
    with pytest.raises(InstanceStillRunningError, match="RUNNING"):
        env.purge("i")
    env.raise_event("i", "go", "still here")
    assert env.wait_for_completion("i").output["got"] == "still here"


def test_continue_as_new_runs_several_generations(env: TestEngine) -> None:
    env.start("counter", {"n": 0, "acc": 0, "limit": 4}, instance_id="c")
    state = env.wait_for_completion("c")
    assert state.output == {"n": 4, "acc": 6, "generation": 3} and state.generation == 3
    events = env.history("c")
    assert [e.sequence for e in events] == list(range(len(events)))
    assert len(kinds(events, ContinuedAsNew)) == 3


def test_an_event_raised_before_the_start_is_kept_and_applied(env: TestEngine) -> None:
    env.raise_event("early", "go", {"early": True})
    env.start("wait", {}, instance_id="early")
    assert env.wait_for_completion("early").output == {"input": {}, "got": {"early": True}}


def test_a_start_with_a_bad_instance_id_goes_to_dead_letters(env: TestEngine) -> None:
    bad = StartWorkflow("bad\x00id", name="echo")
    env.produce(env.topics.commands, bad.instance_id.encode(), encode_message(bad))
    env.run()
    (letter,) = env.dead_letters()
    assert "invalid instance id" in letter.reason
