"""Workflow timeouts through ``TestEngine`` (its time can be advanced): ``run_timeout``
bounds each run and is armed again by every continue-as-new, ``execution_timeout`` bounds
the whole chain; a start's values override the workflow's; an instance that timed out ends
TIMED_OUT with the timeout named, and its children follow their parent-close policy."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.cli.main import build_parser
from engine.core.errors import RegistrationError
from engine.core.history import RuntimeStatus
from engine.core.messages import ResetTarget
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="to.waits", run_timeout=60)
async def waits(ctx: WorkflowContext, _: Any) -> str:
    return str(await ctx.wait_for_event("go"))


@registry.workflow(name="to.plain")
async def plain(ctx: WorkflowContext, _: Any) -> str:
    return str(await ctx.wait_for_event("go"))


@registry.workflow(name="to.loop", execution_timeout=timedelta(seconds=45), run_timeout=15)
async def loop(ctx: WorkflowContext, n: int) -> int:
    """A monitor: every run sleeps 10 s and continues as new, so no run reaches its
    run_timeout, but the chain reaches its execution_timeout."""
    await ctx.sleep(10)
    ctx.continue_as_new(n + 1)


@registry.workflow(name="to.parent", run_timeout=30)
async def parent(ctx: WorkflowContext, policy: str) -> str:
    ctx.call_child_workflow(
        plain, None, instance_id=f"{ctx.instance_id}:kid", parent_close_policy=policy
    )
    return str(await ctx.wait_for_event("never"))


@registry.workflow(name="to.buggy", run_timeout=100)
async def buggy(ctx: WorkflowContext, _: Any) -> None:
    await ctx.sleep(1)
    raise KeyError("a bug: the instance parks")


@registry.workflow(name="to.updatable")
async def updatable(ctx: WorkflowContext, _: Any) -> str:
    ctx.set_update_handler("ping", lambda: "pong")
    return str(await ctx.wait_for_event("go"))


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry) as engine:
        yield engine


def test_a_run_that_outlives_its_run_timeout_ends_timed_out(env: TestEngine) -> None:
    env.start("to.waits", None, instance_id="w")
    env.run()
    env.advance(59)
    assert env.get("w").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    env.advance(2)
    state = env.get("w")
    assert state is not None and state.status is RuntimeStatus.TIMED_OUT
    assert state.failure is not None and state.failure.type == "TimedOut"
    assert "run_timeout" in state.failure.message
    ends = [e.body for e in env.history("w") if type(e.body).__name__ == "ExecutionCompleted"]
    assert [getattr(b, "status", None) for b in ends] == [RuntimeStatus.TIMED_OUT]


def test_an_instance_that_ends_in_time_is_not_touched_by_its_timer(env: TestEngine) -> None:
    env.start("to.waits", None, instance_id="ok")
    env.run()
    env.raise_event("ok", "go", "done")
    assert env.wait_for_completion("ok").output == "done"
    env.advance(120)  # the timer fires and finds the instance ended
    assert env.get("ok").status is RuntimeStatus.COMPLETED  # type: ignore[union-attr]


def test_the_execution_timeout_spans_continue_as_new_and_run_timeouts_rearm(
    env: TestEngine,
) -> None:
    env.start("to.loop", 0, instance_id="m")
    env.run()
    env.advance(40)  # four runs of 10 s: none reached its 15 s run_timeout
    state = env.get("m")
    assert state is not None and state.status is RuntimeStatus.RUNNING
    assert state.generation >= 3
    env.advance(10)
    state = env.get("m")
    assert state is not None and state.status is RuntimeStatus.TIMED_OUT
    assert state.failure is not None and "execution_timeout" in state.failure.message


def test_a_start_overrides_the_workflow_timeouts(env: TestEngine) -> None:
    env.start("to.plain", None, instance_id="p", run_timeout=5)
    env.start("to.waits", None, instance_id="q", execution_timeout=timedelta(seconds=3))
    env.run()
    env.advance(6)
    p, q = env.get("p"), env.get("q")
    assert p is not None and p.status is RuntimeStatus.TIMED_OUT
    assert q is not None and q.status is RuntimeStatus.TIMED_OUT
    assert q.failure is not None and "execution_timeout" in q.failure.message


def test_a_new_start_of_the_same_id_is_a_new_chain(env: TestEngine) -> None:
    env.start("to.plain", None, instance_id="r", execution_timeout=5)
    env.run()
    env.terminate("r")
    env.run()
    env.start("to.plain", None, instance_id="r")  # no timeout of its own
    env.run()
    env.advance(10)  # the first chain's timer fires and is stale
    assert env.get("r").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]


def test_a_parked_instance_still_times_out(env: TestEngine) -> None:
    env.start("to.buggy", None, instance_id="bug")
    env.advance(2)
    assert env.get("bug").status is RuntimeStatus.PARKED  # type: ignore[union-attr]
    env.cancel("bug")  # kept for its retry, which never gets past the bug
    env.advance(101)
    state = env.get("bug")
    assert state is not None and state.status is RuntimeStatus.TIMED_OUT
    assert state.failure is not None and state.failure.message == (
        "its run_timeout elapsed (100 s)"
    )


def test_a_reset_run_and_a_rerun_get_their_own_run_timeout(env: TestEngine) -> None:
    env.start("to.waits", None, instance_id="rs")
    env.run()
    env.advance(50)
    env.reset("rs", ResetTarget.FIRST_TURN, "again")
    env.rerun("rs", "rs-copy")
    env.advance(50)  # 100 s after the start, 50 s after the reset: within the new run's 60
    assert env.get("rs").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    assert env.get("rs-copy").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    env.advance(11)
    assert env.get("rs").status is RuntimeStatus.TIMED_OUT  # type: ignore[union-attr]
    assert env.get("rs-copy").status is RuntimeStatus.TIMED_OUT  # type: ignore[union-attr]


@pytest.mark.parametrize("reset_after", [20, 31])
def test_a_reset_counts_the_execution_timeout_again_from_the_reset(
    env: TestEngine, reset_after: int
) -> None:
    """Before or after the chain's deadline (31: the instance timed out), a reset run gets
    the whole execution timeout again, counted from the reset, as in Temporal."""
    env.start("to.plain", None, instance_id="ex", execution_timeout=30)
    env.run()
    env.advance(reset_after)
    timed_out = env.get("ex").status is RuntimeStatus.TIMED_OUT  # type: ignore[union-attr]
    assert timed_out is (reset_after > 30)
    env.reset("ex", ResetTarget.FIRST_TURN, "again")
    env.advance(29)
    assert env.get("ex").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    env.advance(2)
    state = env.get("ex")
    assert state is not None and state.status is RuntimeStatus.TIMED_OUT
    assert state.failure is not None and "execution_timeout" in state.failure.message


@pytest.mark.parametrize(
    ("policy", "child_status"),
    [("TERMINATE", RuntimeStatus.TERMINATED), ("ABANDON", RuntimeStatus.RUNNING)],
)
def test_children_follow_the_parent_close_policy(
    env: TestEngine, policy: str, child_status: RuntimeStatus
) -> None:
    env.start("to.parent", policy, instance_id="pa")
    env.run()
    env.advance(31)
    assert env.get("pa").status is RuntimeStatus.TIMED_OUT  # type: ignore[union-attr]
    env.run()
    assert env.get("pa:kid").status is child_status  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [0, -1, True, "5"])
def test_a_timeout_must_be_positive(bad: Any) -> None:
    with pytest.raises(RegistrationError, match="run_timeout of workflow 'bad'"):
        Registry().workflow(name="bad", run_timeout=bad)(plain)
    with TestEngine(registry) as env, pytest.raises(ValueError, match="execution_timeout"):
        env.start("to.plain", None, execution_timeout=bad)


def test_signal_with_start_and_update_with_start_take_the_start_timeouts(env: TestEngine) -> None:
    env.signal_with_start("to.plain", "sws", "hello", execution_timeout=8)
    env.update_with_start(
        "to.updatable", None, instance_id="uws", update="ping", run_timeout=timedelta(seconds=8)
    )
    env.run()
    env.signal_with_start("to.plain", "sws", "again", run_timeout=1)  # live: the event only
    env.advance(7)
    assert env.get("sws").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    assert env.get("uws").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
    env.advance(2)
    sws, uws = env.get("sws"), env.get("uws")
    assert sws is not None and sws.status is RuntimeStatus.TIMED_OUT
    assert sws.failure is not None and "execution_timeout" in sws.failure.message
    assert uws is not None and uws.status is RuntimeStatus.TIMED_OUT
    assert uws.failure is not None and "run_timeout" in uws.failure.message


def test_the_cli_takes_the_start_timeouts_for_start_and_signal_with_start() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["signal-with-start", "wf", "i-1", "go", "--execution-timeout", "30", "--run-timeout", "5"]
    )
    assert (args.execution_timeout, args.run_timeout) == (30.0, 5.0)
    args = parser.parse_args(["start", "wf", "--run-timeout", "2.5"])
    assert (args.execution_timeout, args.run_timeout) == (None, 2.5)
    with pytest.raises(SystemExit):
        parser.parse_args(["start", "wf", "--execution-timeout", "0"])
