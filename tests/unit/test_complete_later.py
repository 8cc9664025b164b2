"""Activities that complete later: the worker reports nothing for an attempt whose body
called ``complete_later()``, and the holder of its task token finishes it exactly once
with ``complete_activity`` / ``fail_activity``; stale and malformed tokens are refused
(the Kafka side, from another process: tests/integration/test_complete_later_kafka.py)."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Registry, RetryPolicy, WorkflowContext
from engine.codec import decode_message, encode_message
from engine.core.activity_info import current_activity
from engine.core.errors import (
    ActivityFailedError,
    InvalidTaskTokenError,
    StaleTaskTokenError,
)
from engine.core.history import RuntimeStatus
from engine.core.messages import ActivityResult, ActivityTask
from engine.core.payloads import to_payload
from engine.core.task_tokens import TaskToken
from engine.services.worker.worker import Outbound, TaskRecord, Worker
from engine.testing import TestEngine
from tests import process_activities

app = Registry()
#: The task tokens the approval activity handed out, in order.
tokens: list[str] = []


@app.activity(name="approval.request")
def request_approval(what: str) -> str:
    tokens.append(current_activity().task_token)
    current_activity().complete_later()


@app.workflow(name="approval.flow")
async def approval_flow(ctx: WorkflowContext, what: str) -> Any:
    try:
        decision = await ctx.call_activity(
            request_approval, what, retry=RetryPolicy(max_attempts=2, initial_interval=0)
        )
    except ActivityFailedError as exc:
        return {"failed": str(exc)}
    return {"decision": decision}


@pytest.fixture(autouse=True)
def _fresh_tokens() -> None:
    tokens.clear()


def _waiting(env: TestEngine, instance_id: str) -> str:
    env.start("approval.flow", "invoice 7", instance_id=instance_id)
    env.run()
    state = env.get(instance_id)
    assert state is not None and state.status is RuntimeStatus.RUNNING
    return tokens[-1]


def test_the_worker_reports_nothing_and_the_token_completes_the_attempt() -> None:
    with TestEngine(app) as env:
        token = _waiting(env, "a")
        results = [decode_message(r.value) for r in env.records("activity-results") if r.value]
        assert not [r for r in results if isinstance(r, ActivityResult)]
        env.complete_activity(token, "approved")
        final = env.wait_for_completion("a")
    assert final.output == {"decision": "approved"}
    decoded = TaskToken.decode(token)
    assert (decoded.instance_id, decoded.task_id, decoded.attempt) == ("a", 0, 1)
    assert decoded.run_id == final.run_id and decoded.generation == final.generation


def test_a_second_completion_is_refused_once_the_instance_ended() -> None:
    with TestEngine(app) as env:
        token = _waiting(env, "twice")
        env.complete_activity(token, "approved")
        env.wait_for_completion("twice")
        with pytest.raises(StaleTaskTokenError, match="COMPLETED"):
            env.complete_activity(token, "rejected")
        assert env.get("twice").output == {"decision": "approved"}  # type: ignore[union-attr]


def test_a_failure_by_token_follows_the_retry_policy() -> None:
    with TestEngine(app) as env:
        first = _waiting(env, "f")
        env.fail_activity(first, "the approver is away")
        env.run()
        assert len(tokens) == 2  # the retry ran the activity again, with a new token
        second = tokens[1]
        assert TaskToken.decode(second).attempt == 2
        env.complete_activity(first, "too late")  # the first attempt's: dropped
        env.run()
        assert env.get("f").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
        env.fail_activity(second, ValueError("rejected by the approver"))
        final = env.wait_for_completion("f")
    assert "rejected by the approver" in final.output["failed"]


def test_unknown_and_malformed_tokens_are_refused_before_anything_is_sent() -> None:
    with TestEngine(app) as env:
        with pytest.raises(InvalidTaskTokenError, match="not a task token"):
            env.complete_activity("hello", 1)
        token = _waiting(env, "m")
        with pytest.raises(InvalidTaskTokenError, match="damaged"):
            env.complete_activity(token[:-3], 1)
        other = TaskToken("nobody", "r", 1, 0, 1).encode()
        with pytest.raises(StaleTaskTokenError, match="names no instance"):
            env.fail_activity(other, "no")
        moved = TaskToken.decode(token)
        wrong_run = TaskToken("m", "another-run", moved.generation, 0, 1).encode()
        with pytest.raises(StaleTaskTokenError, match="another-run"):
            env.complete_activity(wrong_run, 1)
        before = len(env.records("commands"))
        with pytest.raises(StaleTaskTokenError):
            env.complete_activity(wrong_run, 1)
        assert len(env.records("commands")) == before


def test_tokens_round_trip() -> None:
    token = TaskToken("orders/ü 1", "r-1", 3, 12, 4)
    assert TaskToken.decode(token.encode()) == token
    assert token.encode().startswith("tt1.")


def test_two_completions_of_one_attempt_apply_once() -> None:
    with TestEngine(app) as env:
        token = _waiting(env, "race")
        env.complete_activity(token, "first")
        env.complete_activity(token, "second")  # both written before either is applied
        final = env.wait_for_completion("race")
    assert final.output == {"decision": "first"}


async def later_async(x: int) -> None:
    current_activity().complete_later()


@pytest.mark.parametrize("executor", ["thread", "process", "async"])
def test_the_worker_writes_nothing_for_an_attempt_that_completes_later(executor: str) -> None:
    reg = Registry()
    fn: Any = later_async if executor == "async" else process_activities.later
    reg.add_activity(fn, name="later")
    kind = "thread" if executor == "async" else executor
    worker = Worker(reg, source_topic="t.activity-tasks", concurrency=2, executor=kind)
    worker.assigned([0])
    task = ActivityTask("i", 0, 1, 1, "later", to_payload(1))
    worker.accept([TaskRecord(0, 0, b"i", encode_message(task), 0)])
    out: list[Outbound] = []
    while worker.stats["later"] == 0:
        out.extend(worker.collect(0.05))
    out.extend(worker.collect(0.05))
    assert out == [] and worker.stats["results"] == 0 and worker.stats["failures"] == 0
    assert worker.offsets.to_commit() == {0: 1}
