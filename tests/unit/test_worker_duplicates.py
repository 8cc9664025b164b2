"""Every record the worker writes may reach the processor twice (a worker that crashed
before committing runs the task again): each copy after the first changes nothing."""

from __future__ import annotations

from engine import Registry, WorkflowContext
from engine.codec import decode_message, encode_message
from engine.core.history import TaskCompleted
from engine.core.messages import ActivityResult, ActivityTask
from engine.core.payloads import from_payload, to_payload
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="dup.absent")
async def absent(ctx: WorkflowContext, x: int) -> int:
    return int(await ctx.call_activity("nowhere", x, task_queue="gpu"))


def test_notes_and_results_sent_twice_are_applied_once() -> None:
    with TestEngine(registry) as env:
        env.start("dup.absent", 2, instance_id="u")
        env.run()
        (task,) = [decode_message(r.value) for r in env.records("activity-tasks.gpu") if r.value]
        assert isinstance(task, ActivityTask)
        note = env.client.get("u").unserved
        assert "'nowhere'" in note
        copy = ActivityResult("u", 0, task.task_id, task.attempt, unserved=note)
        env.produce(env.topics.activity_results, b"u", encode_message(copy))  # the note again
        env.run()
        again = env.client.get("u")
        assert again.status.value == "RUNNING" and again.unserved == note
        done = ActivityResult("u", 0, task.task_id, task.attempt, output=to_payload(7))
        for _ in range(2):  # the result, and its copy from the re-run task
            env.produce(env.topics.activity_results, b"u", encode_message(done))
        final = env.wait_for_completion("u")
        late = ActivityResult("u", 0, task.task_id, task.attempt, output=to_payload(99))
        env.produce(env.topics.activity_results, b"u", encode_message(late))
        env.produce(env.topics.activity_results, b"u", encode_message(copy))  # a late note
        env.run()
        status = env.client.get("u")
        events = env.history("u")
    assert final.output == 7 and from_payload(status.output) == 7 and status.unserved == ""
    assert status.status.value == "COMPLETED"
    assert sum(isinstance(e.body, TaskCompleted) for e in events) == 1
