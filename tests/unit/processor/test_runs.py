"""Run ids: a reused instance id (after a purge by hand, by ``Client.purge`` or by its own
retention) starts a run that nothing of the purged run can reach. Its child starts are
not answered as duplicates of the purged run's, and late replies of the purged run (an
activity result, a child's result) are rejected and counted, never applied; records from
before run ids still match by generation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from engine import Registry, WorkflowContext
from engine.codec import decode_message, encode_message
from engine.core.history import ExecutionStarted, HistoryEvent
from engine.core.messages import ActivityResult, ActivityTask, ChildResult
from engine.core.payloads import to_payload
from engine.services.records import RawRecord
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="child")
async def child(ctx: WorkflowContext, value: Any) -> Any:
    return {"child": value}


@registry.workflow(name="calls-child")
async def calls_child(ctx: WorkflowContext, value: Any) -> Any:
    return await ctx.call_child_workflow(child, value)  # default id: "<id>:0:0"


@registry.workflow(name="calls-named-child")
async def calls_named_child(ctx: WorkflowContext, value: Any) -> Any:
    return await ctx.call_child_workflow(child, value, instance_id=f"{ctx.instance_id}-kid")


@registry.workflow(name="short-lived-parent", retention=timedelta(minutes=10))
async def short_lived_parent(ctx: WorkflowContext, value: Any) -> Any:
    return await ctx.call_child_workflow(child, value)


@registry.activity(name="echo")
def echo(value: Any) -> Any:
    return value


@registry.workflow(name="calls-echo")
async def calls_echo(ctx: WorkflowContext, value: Any) -> Any:
    return await ctx.call_activity(echo, value)


def _runs(history: list[HistoryEvent]) -> list[str]:
    return [e.body.run_id for e in history if isinstance(e.body, ExecutionStarted)]


def _rejected(env: TestEngine, instance_id: str, kind: str) -> int:
    return env.processors[env.partition_of(instance_id)].counters.rejected_kinds.get(kind, 0)


def test_a_parent_purged_and_started_again_completes_its_child_call() -> None:
    with TestEngine(registry, partitions=2) as env:
        for workflow in ("calls-child", "calls-named-child"):
            parent = f"p-{workflow}"
            env.start(workflow, 1, instance_id=parent)
            assert env.wait_for_completion(parent).output == {"child": 1}
            env.purge(parent)
            env.start(workflow, 2, instance_id=parent)  # generation 0 again, same task ids
            assert env.wait_for_completion(parent).output == {"child": 2}
            first, second = _runs(env.history(parent))
            assert first and second and first != second
            state = env.get(parent)
            assert state is not None and state.run_id == second and state.generation == 0


def test_a_parent_purged_by_its_retention_and_started_again_completes_its_child_call() -> None:
    with TestEngine(registry, partitions=2) as env:
        env.start("short-lived-parent", 1, instance_id="r")
        assert env.wait_for_completion("r").output == {"child": 1}
        env.advance(timedelta(minutes=10))
        assert env.get("r") is None  # purged by its own retention
        env.start("short-lived-parent", 2, instance_id="r")
        assert env.wait_for_completion("r").output == {"child": 2}


def _record(env: TestEngine, topic: str, kind: type[Any], instance_id: str) -> RawRecord:
    found = [
        r
        for r in env.records(topic)
        if r.value is not None
        and isinstance(message := decode_message(r.value), kind)
        and message.instance_id == instance_id
    ]
    assert len(found) == 1
    return found[0]


def test_a_late_activity_result_of_the_purged_run_is_rejected() -> None:
    with TestEngine(registry) as env:
        env.start("calls-echo", "old", instance_id="a")
        assert env.wait_for_completion("a").output == "old"
        late = _record(env, env.topics.activity_results, ActivityResult, "a")
        env.purge("a")
        env.start("calls-echo", "new", instance_id="a")  # waits for its own attempt 1
        # the purged run's result again (a worker that crashed before its commit, say):
        # the same generation, task id and attempt as the new run's call
        assert late.value is not None
        env.produce(env.topics.activity_results, b"a", late.value)
        assert env.wait_for_completion("a").output == "new"
        assert _rejected(env, "a", "ActivityResult") == 1
        tasks = [r for r in env.records(env.topics.activity_tasks) if r.key == b"a"]
        keys = set()
        for raw in tasks:
            assert raw.value is not None
            task = decode_message(raw.value)
            assert isinstance(task, ActivityTask)
            keys.add(task.idempotency_key)
        assert len(keys) == 2  # the idempotency key is new for the new run's call


def test_a_late_child_result_of_the_purged_run_is_rejected() -> None:
    with TestEngine(registry) as env:
        env.start("calls-named-child", "old", instance_id="c")
        assert env.wait_for_completion("c").output == {"child": "old"}
        late = _record(env, env.topics.instance_messages, ChildResult, "c")
        env.purge("c")
        env.start("calls-named-child", "new", instance_id="c")
        assert late.value is not None
        env.produce(env.topics.instance_messages, b"c", late.value)
        assert env.wait_for_completion("c").output == {"child": "new"}
        assert _rejected(env, "c", "ChildResult") == 1


def test_results_without_a_run_id_match_by_generation_as_before() -> None:
    """A worker from before run ids answers without one: the result is applied to the
    generation it names, as it always was."""
    with TestEngine(registry) as env:
        env.start("calls-echo", "from the worker", instance_id="o")  # its attempt waits
        old_style = ActivityResult("o", 0, 0, 1, to_payload("from an old worker"))
        env.produce(env.topics.activity_results, b"o", encode_message(old_style))
        assert env.wait_for_completion("o").output == "from an old worker"
        env.run()
        assert _rejected(env, "o", "ActivityResult") == 1  # the real one, too late
