"""Completing an activity by task token on the real broker: the worker leaves the attempt
open, another process completes it with its own client (and a second completion from
there is refused as stale), the CLI fails it, and the async client heartbeats and fails an
attempt and completes its retry. Heartbeats by token are timed by the processor, also across a
SIGKILL of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from engine.client import AsyncClient
from engine.codec import decode_message
from engine.core.messages import ActivityTask
from engine.core.payloads import from_payload
from engine.core.task_tokens import TaskToken
from tests import complete_later_workflows as lw
from tests.engine_harness import (
    REPO_ROOT,
    EngineProcess,
    RunningEngine,
    running_engine,
    wait_until,
)

pytestmark = pytest.mark.kafka

MODULES = ["tests.complete_later_workflows"]

#: What the other process runs: complete the attempt, then try the same token again.
COMPLETE = """
import sys
from engine.client import Client
from engine.core.errors import StaleTaskTokenError
from engine.core.task_tokens import TaskToken
bootstrap, namespace, token = sys.argv[1:]
with Client(bootstrap, namespace) as client:
    client.complete_activity(token, "approved")
    client.wait_for_completion(TaskToken.decode(token).instance_id, timeout=60)
    try:
        client.complete_activity(token, "rejected")
    except StaleTaskTokenError as refused:
        print("refused:", refused)
"""


def _complete_elsewhere(engine: RunningEngine, token: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", COMPLETE, engine.bootstrap, engine.namespace, token],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_another_process_completes_the_attempt_exactly_once(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, workers=1, modules=MODULES) as engine:
        instance = engine.client.start("later.pay", "invoice 9")
        wait_until(lambda: bool(lw.tokens.get(instance)), what="the activity's task token")
        state = engine.client.get(instance)
        assert state is not None and state.status.value == "RUNNING"
        printed = _complete_elsewhere(engine, lw.tokens[instance][0])
        final = engine.wait_for_completion(instance)
    assert final.output == "invoice 9: approved"
    assert "refused:" in printed and "COMPLETED" in printed
    assert lw.tokens[instance] == [lw.tokens[instance][0]]  # one attempt, no retry


def _cli(engine: RunningEngine, *argv: str) -> subprocess.CompletedProcess[str]:
    common = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    return subprocess.run(
        [sys.executable, "-m", "engine", "activity", *argv, *common],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_cli_fails_the_attempt_and_refuses_a_damaged_token(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, workers=1, modules=MODULES) as engine:
        instance = engine.client.start("later.pay", "invoice 10")
        wait_until(lambda: bool(lw.tokens.get(instance)), what="the activity's task token")
        token = lw.tokens[instance][0]
        damaged = _cli(engine, "complete", token[:-4], "--result", '"approved"')
        assert damaged.returncode == 1 and "damaged" in damaged.stderr
        failed = _cli(engine, "fail", token, "--error", "rejected", "--non-retryable")
        assert failed.returncode == 0, failed.stderr
        final = engine.wait_for_completion(instance)
        again = _cli(engine, "complete", token, "--result", '"approved"')
    assert final.status.value == "FAILED"
    assert final.failure is not None and "rejected" in final.failure.message
    assert again.returncode == 1 and "FAILED" in again.stderr


def test_the_async_client_fails_and_then_completes_the_retry(kafka_bootstrap: str) -> None:
    async def finish(engine: RunningEngine, instance: str) -> None:
        async with AsyncClient(settings=engine.settings) as client:
            await client.heartbeat_activity(lw.tokens[instance][0], {"read": 1})  # answered
            await client.fail_activity(lw.tokens[instance][0], "not yet")
            await asyncio.to_thread(
                wait_until, lambda: len(lw.tokens[instance]) == 2, what="the retry's token"
            )
            await client.complete_activity(lw.tokens[instance][1], "approved")

    with running_engine(kafka_bootstrap, workers=1, modules=MODULES) as engine:
        instance = engine.client.start("later.pay", "invoice 11")
        wait_until(lambda: bool(lw.tokens.get(instance)), what="the activity's task token")
        asyncio.run(finish(engine, instance))
        final = engine.wait_for_completion(instance)
    assert final.output == "invoice 11: approved"


def test_heartbeats_by_token_are_timed_by_the_processor(kafka_bootstrap: str) -> None:
    """A heartbeat by token is accepted and its details kept; once they stop, the
    processor's heartbeat timer fails the attempt and the retry begins with those details;
    a heartbeat of the first attempt is then refused by the processor (CLI exit 4)."""
    with running_engine(kafka_bootstrap, workers=1, modules=MODULES) as engine:
        instance = engine.client.start("later.review", "contract 3")
        wait_until(lambda: bool(lw.tokens.get(instance)), what="the activity's task token")
        first = lw.tokens[instance][0]
        engine.client.heartbeat_activity(first, {"pages": 4})
        wait_until(lambda: len(lw.tokens[instance]) == 2, 120, what="the retry after the timeout")
        stale = _cli(engine, "heartbeat", first, "--details", '{"pages": 5}')
        second = lw.tokens[instance][1]
        beat = _cli(engine, "heartbeat", second, "--details", '{"pages": 9}')
        engine.client.complete_activity(second, "signed")
        final = engine.wait_for_completion(instance)
        failures = [e.body for e in engine.history(instance) if e.body.KIND == "TaskFailed"]
    assert lw.began_with[instance] == [None, {"pages": 4}]
    assert stale.returncode == 4 and "stale" in stale.stderr, stale.stderr
    assert beat.returncode == 0 and "accepted" in beat.stdout, beat.stderr
    assert final.output == "contract 3: signed"
    assert [f.failure.type for f in failures] == ["ActivityTimeoutError"]


def _tasks(engine: RunningEngine, instance: str) -> list[ActivityTask]:
    """The attempts sent to workers for ``instance``, read from the task topic."""
    records = engine.read(engine.topics.activity_tasks)
    tasks = [decode_message(r.value) for r in records if r.value]
    return [t for t in tasks if isinstance(t, ActivityTask) and t.instance_id == instance]


def _token(task: ActivityTask) -> str:
    return TaskToken(
        task.instance_id, task.run_id, task.generation, task.task_id, task.attempt
    ).encode()


def test_a_heartbeat_deadline_outlives_a_sigkill_of_the_processor(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The deadline and details of an attempt handed over to the processor are in its
    state: after a SIGKILL and a restart the deadline still fails the attempt, and the
    retry begins with the details of the heartbeat sent before the kill."""
    with running_engine(
        kafka_bootstrap, modules=MODULES, in_process=False, state_dir=tmp_path
    ) as engine:
        processor = engine.processors["processor-0"]
        assert isinstance(processor, EngineProcess)
        processor.wait_for_log("restored:", 120)
        instance = engine.client.start("later.review", "contract 4")
        [first] = wait_until(lambda: _tasks(engine, instance), 120, 0.2, "the first attempt")
        engine.client.heartbeat_activity(_token(first), {"pages": 2})  # answered: applied
        processor.kill()
        processor.start()
        tasks = wait_until(lambda: _tasks(engine, instance)[1:], 120, 0.2, "the retry")
        second = tasks[0]
        engine.client.complete_activity(_token(second), "signed")
        final = engine.wait_for_completion(instance)
        failures = [e.body for e in engine.history(instance) if e.body.KIND == "TaskFailed"]
    assert second.attempt == 2 and from_payload(second.heartbeat_details) == {"pages": 2}
    assert final.output == "contract 4: signed"
    assert [(f.attempt, f.failure.type) for f in failures] == [(1, "ActivityTimeoutError")]
