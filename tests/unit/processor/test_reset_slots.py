"""Reset and rerun honour the per-key concurrency limit: a new run of an ended run takes a
slot of its key like a start (waiting as PENDING while the key is full) and gives it back
when it ends; a reset of a live run keeps the slot it holds. The Kafka side of the limits
is tests/integration/test_concurrency_limits_kafka.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import Registry, WorkflowContext
from engine.core.history import RuntimeStatus
from engine.core.messages import CommandResult, ResetTarget
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="sync", max_concurrency_per_key=1, failure_types=(ValueError,))
async def sync(ctx: WorkflowContext, account: str) -> str:
    outcome = await ctx.wait_for_event("go")
    if outcome == "fail":
        raise ValueError("sync failed")
    return f"synced {account} {outcome}"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=3) as engine:
        yield engine


def _status(env: TestEngine, instance_id: str) -> RuntimeStatus:
    state = env.get(instance_id)
    assert state is not None
    return state.status


def _running(env: TestEngine, ids: list[str]) -> list[str]:
    return [i for i in ids if _status(env, i) is RuntimeStatus.RUNNING]


def _ended_run(env: TestEngine, instance_id: str) -> None:
    """A run of key k that ended (terminated: a reset from its first turn has no event
    of it to deliver again) and gave its slot back."""
    env.start("sync", "acct", instance_id=instance_id, concurrency_key="k")
    env.run()
    env.terminate(instance_id, "stopped")
    assert env.wait_for_completion(instance_id).status is RuntimeStatus.TERMINATED


def test_resets_of_ended_runs_wait_for_a_slot_one_at_a_time(env: TestEngine) -> None:
    ids = ["r0", "r1", "r2"]
    for i in ids:
        _ended_run(env, i)
    answers = [env.reset(i, ResetTarget.FIRST_TURN, "again") for i in ids]
    env.run()
    for waiting in answers:  # like a start under the limit, each asks the key's slots row
        assert waiting is not None and waiting.result is CommandResult.BUFFERED
        assert "the reset waits as PENDING for a slot" in waiting.reason
    assert _running(env, ids) == ["r0"]
    state = env.get("r1")
    assert state is not None and state.status is RuntimeStatus.PENDING
    assert "waits for a slot" in state.pending_reason
    for n, i in enumerate(ids):
        assert _running(env, ids) == [i]
        env.raise_event(i, "go", f"ok{n}")
        env.run()
        assert env.wait_for_completion(i).output == f"synced acct ok{n}"
    assert [env.get(i).generation for i in ids] == [1, 1, 1]  # type: ignore[union-attr]
    env.start("sync", "acct", instance_id="after", concurrency_key="k")
    env.run()
    assert _status(env, "after") is RuntimeStatus.RUNNING  # every slot was given back


def test_a_rerun_waits_for_a_slot_of_the_source_key(env: TestEngine) -> None:
    _ended_run(env, "source")
    env.start("sync", "acct", instance_id="holder", concurrency_key="k")
    env.run()
    answer = env.rerun("source", "copy", ResetTarget.FIRST_TURN)
    env.run()
    assert answer is not None and answer.result is CommandResult.BUFFERED
    assert "the rerun waits as PENDING for a slot" in answer.reason
    assert _running(env, ["holder", "copy"]) == ["holder"]
    env.raise_event("copy", "go", "early")  # kept for its start
    env.raise_event("holder", "go", "done")
    env.run()
    assert env.wait_for_completion("copy").output == "synced acct early"
    env.start("sync", "acct", instance_id="next", concurrency_key="k")
    env.run()
    assert _status(env, "next") is RuntimeStatus.RUNNING


def test_a_reset_of_a_live_run_keeps_its_slot(env: TestEngine) -> None:
    env.start("sync", "acct", instance_id="live", concurrency_key="k")
    env.start("sync", "acct", instance_id="queued", concurrency_key="k")
    env.run()
    answer = env.reset("live", ResetTarget.FIRST_TURN, "again")
    env.run()
    assert answer is not None and answer.result is CommandResult.ACCEPTED
    assert _running(env, ["live", "queued"]) == ["live"]
    assert _status(env, "queued") is RuntimeStatus.PENDING
    env.raise_event("live", "go", "ok")
    env.run()
    assert _running(env, ["live", "queued"]) == ["queued"]


def test_a_waiting_reset_that_is_terminated_leaves_the_queue(env: TestEngine) -> None:
    _ended_run(env, "gone")
    env.start("sync", "acct", instance_id="holder", concurrency_key="k")
    env.run()
    env.reset("gone", ResetTarget.FIRST_TURN, "again")
    env.terminate("gone", "never mind")
    env.raise_event("holder", "go", "done")
    env.run()
    assert _status(env, "gone") is RuntimeStatus.TERMINATED
    env.start("sync", "acct", instance_id="next", concurrency_key="k")
    env.run()
    assert _status(env, "next") is RuntimeStatus.RUNNING
