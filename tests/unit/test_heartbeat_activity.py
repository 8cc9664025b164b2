"""Heartbeats by task token: an attempt that completes later is heartbeated from outside
(``heartbeat_activity``); the processor times its heartbeat timeout once the worker let go
of it, keeps the details for the next attempt, and refuses a heartbeat of an attempt it no
longer waits for (the Kafka side: tests/integration/test_complete_later_kafka.py)."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Registry, RetryPolicy, WorkflowContext
from engine.codec import decode_message
from engine.core.activity_info import current_activity
from engine.core.errors import ActivityFailedError, StaleTaskTokenError
from engine.core.history import RuntimeStatus, TaskFailed
from engine.core.messages import ActivityResult
from engine.core.task_tokens import TaskToken
from engine.testing import TestEngine

app = Registry()
#: (task token, heartbeat details the attempt began with), per attempt, in order.
attempts: list[tuple[str, Any]] = []

RETRY = RetryPolicy(max_attempts=2, initial_interval=0)


@app.activity(name="review.request")
def request_review(what: str) -> str:
    info = current_activity()
    attempts.append((info.task_token, info.heartbeat_details))
    if info.attempt == 1:
        info.heartbeat({"pages": 0})  # in-process, before it lets go
    info.complete_later()


@app.workflow(name="review.flow")
async def review_flow(ctx: WorkflowContext, timeout_s: float | None) -> Any:
    try:
        return await ctx.call_activity(
            request_review, "contract", heartbeat_timeout=timeout_s, retry=RETRY
        )
    except ActivityFailedError as exc:
        return {"failed": str(exc)}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    attempts.clear()


def _started(env: TestEngine, instance_id: str, timeout_s: float | None = 10.0) -> str:
    env.start("review.flow", timeout_s, instance_id=instance_id)
    env.run()
    assert env.get(instance_id).status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    return attempts[-1][0]


def _failures(env: TestEngine, instance_id: str) -> list[TaskFailed]:
    return [e.body for e in env.history(instance_id) if isinstance(e.body, TaskFailed)]


def test_heartbeats_keep_the_timeout_from_firing_and_their_details_reach_the_retry() -> None:
    with TestEngine(app) as env:
        first = _started(env, "beat")
        for pages in (3, 7):
            env.advance(8)  # less than the 10 s heartbeat timeout since the last beat
            env.heartbeat_activity(first, {"pages": pages})
        env.advance(8)
        assert len(attempts) == 1 and not _failures(env, "beat")  # 24 s, still attempt 1
        env.advance(3)  # 11 s without a heartbeat: the processor fails the attempt
        [failed] = _failures(env, "beat")
        assert failed.failure.type == "ActivityTimeoutError"
        assert "no heartbeat for 10000 ms" in failed.failure.message
        assert len(attempts) == 2 and attempts[1][1] == {"pages": 7}  # the retry resumes
        second = attempts[1][0]
        env.complete_activity(second, "signed")
        assert env.wait_for_completion("beat").output == "signed"


def test_without_heartbeats_the_timeout_fires_with_the_details_of_the_body() -> None:
    with TestEngine(app) as env:
        _started(env, "silent")
        env.advance(11)
        env.run()
        assert len(attempts) == 2 and attempts[1][1] == {"pages": 0}
        assert [f.attempt for f in _failures(env, "silent")] == [1]


def test_a_heartbeat_of_an_attempt_no_longer_waited_for_is_refused_by_the_processor() -> None:
    with TestEngine(app) as env:
        first = _started(env, "stale")
        env.fail_activity(first, "the reviewer is away")
        env.run()
        with pytest.raises(StaleTaskTokenError, match="at attempt 2 now") as refused:
            env.heartbeat_activity(first, {"pages": 1})
        assert refused.value.code == "stale_task_token"
        assert refused.value.outcome is not None  # the processor's answer
        second = attempts[1][0]
        env.heartbeat_activity(second)
        env.complete_activity(second, "signed")
        env.wait_for_completion("stale")
        with pytest.raises(StaleTaskTokenError, match="COMPLETED"):
            env.heartbeat_activity(second)  # refused by the client: the instance ended


def test_a_failure_by_token_carries_the_details_of_the_last_heartbeat() -> None:
    with TestEngine(app) as env:
        first = _started(env, "fail", timeout_s=None)  # no heartbeat timeout: none fires
        env.heartbeat_activity(first, {"pages": 12})
        env.advance(3600)
        assert len(attempts) == 1
        env.fail_activity(first, "interrupted")
        env.run()
        assert attempts[1][1] == {"pages": 12}
        [failed] = _failures(env, "fail")
        assert failed.details is not None


def test_the_worker_hands_the_timing_over_only_for_calls_with_a_heartbeat_timeout() -> None:
    with TestEngine(app) as env:
        _started(env, "timed")
        _started(env, "untimed", timeout_s=None)
        notes = [decode_message(r.value) for r in env.records("activity-results") if r.value]
        handed = [n for n in notes if isinstance(n, ActivityResult)]
        assert [(n.instance_id, n.heartbeat_timeout_ms) for n in handed] == [("timed", 10_000)]
        assert handed[0].output is None and handed[0].failure is None


def test_a_late_hand_over_note_of_a_retried_attempt_takes_nothing_from_the_retry() -> None:
    """The token holder failed attempt 1 before its worker's note came; the retry was
    handed over since. The late note of attempt 1 is dropped, so attempt 2 keeps being
    timed (and times out)."""
    with TestEngine(app) as env:
        first = _started(env, "late")
        env.fail_activity(first, "not yet")
        env.run()
        token = TaskToken.decode(first)
        late = ActivityResult(
            "late",
            token.generation,
            token.task_id,
            1,
            run_id=token.run_id,
            heartbeat_timeout_ms=10_000,
        )
        env.send(late)
        env.run()
        env.advance(11)
        env.run()
        final = env.get("late")
        assert final is not None and final.status is RuntimeStatus.COMPLETED
        assert "no heartbeat for 10000 ms" in final.output["failed"]
        assert [f.attempt for f in _failures(env, "late")] == [1, 2]
