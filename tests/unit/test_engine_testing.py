"""engine.testing: the example of docs/how-to/testing.md runs as written, and time skipping
fires timers in order with ctx.now() following the clock."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import Registry, RetryPolicy, WorkflowContext
from engine.core.activity_info import current_activity
from engine.core.errors import WaitTimeoutError
from engine.core.history import RuntimeStatus, TimerFired
from engine.services.processor.protocol import Step
from engine.testing import TestEngine

TESTING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "testing.md"


def test_the_testing_page_example_runs() -> None:
    code = re.search(r"```python\n(.*?)```", TESTING_PAGE.read_text(), re.S)
    assert code is not None, "docs/how-to/testing.md lost its example"
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code.group(1), "testing.md", "exec"), namespace)
    namespace["test_onboarding"]()


app = Registry()


@app.workflow(name="sleepers")
async def sleepers(ctx: WorkflowContext, days: list[int]) -> list[tuple[int, int]]:
    """Sleeps in parallel for each number of days; returns (days, elapsed days) in the
    order the timers fired."""
    start = ctx.now()
    fired: list[tuple[int, int]] = []

    async def one(d: int) -> None:
        await ctx.sleep(timedelta(days=d))
        fired.append((d, (ctx.now() - start).days))

    await ctx.when_all([ctx.spawn(one(d)) for d in days])
    return fired


@app.workflow(name="forever")
async def forever(ctx: WorkflowContext, _: Any) -> None:
    await ctx.wait_for_event("never")


def test_timers_fire_in_order_and_now_moves_with_them() -> None:
    with TestEngine(app) as env:
        before = env.now()
        run = env.start("sleepers", [30, 1, 7])
        state = env.wait_for_completion(run)
        assert [tuple(x) for x in state.output] == [(1, 1), (7, 7), (30, 30)]
        assert env.now() - before == timedelta(days=30)
        fired = [e.body.fire_at_ms for e in env.history(run) if isinstance(e.body, TimerFired)]
        assert fired == sorted(fired)


def test_two_instances_share_one_clock() -> None:
    with TestEngine(app) as env:
        long, short = env.start("sleepers", [10]), env.start("sleepers", [2])
        env.advance(timedelta(days=3))
        assert env.get(short).is_completed  # type: ignore[union-attr]
        assert not env.get(long).is_completed  # type: ignore[union-attr]
        assert env.wait_for_completion(long).output == [[10, 10]]


def test_waiting_for_an_instance_that_waits_for_the_test_says_so() -> None:
    with TestEngine(app) as env:
        run = env.start("forever")
        with pytest.raises(WaitTimeoutError, match="RUNNING"):
            env.wait_for_completion(run)


def test_advance_refuses_to_go_back() -> None:
    with TestEngine(app) as env, pytest.raises(ValueError, match="forward"):
        env.advance(-1)


class Steps:
    def __init__(self) -> None:
        self.seen: list[Step] = []

    def observe(self, step: Step, seconds: float, count: int) -> None:
        assert seconds >= 0 and count >= 0
        self.seen.append(step)


def test_the_test_engine_runs_the_same_protocol_steps() -> None:
    steps = Steps()
    with TestEngine(app, metrics=steps) as env:
        env.wait_for_completion(env.start("sleepers", [1]))
    wanted = [Step.POLL, Step.ACCEPT, Step.TIMERS, Step.STEP, Step.PRODUCE, Step.APPLY]
    assert steps.seen[: len(wanted)] == wanted


def test_records_of_an_unknown_topic_are_refused_with_the_names() -> None:
    with TestEngine(app) as env, pytest.raises(ValueError, match="dead-letters"):
        env.records("no-such-topic")


@app.activity(name="fetch")
def fetch(url: str) -> str:
    raise RuntimeError("the network: the test replaces it")


@app.workflow(name="fetcher")
async def fetcher(ctx: WorkflowContext, url: str) -> dict[str, Any]:
    started = ctx.now()
    retry = RetryPolicy(max_attempts=3, initial_interval=3600, max_interval=3600, jitter=0)
    body = await ctx.call_activity(fetch, url, retry=retry)
    return {"body": body, "hours": (ctx.now() - started).total_seconds() // 3600}


def test_activity_retries_wait_out_their_backoff_in_skipped_time() -> None:
    attempts: list[int] = []

    def flaky(url: str) -> str:
        attempts.append(current_activity().attempt)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return f"<html>{url}</html>"

    with TestEngine(app, activities={fetch: flaky}) as env:
        state = env.wait_for_completion(env.start("fetcher", "example.org"))
    assert state.output == {"body": "<html>example.org</html>", "hours": 2}
    assert attempts == [1, 2, 3]


def test_a_wait_with_a_timeout_skips_no_further() -> None:
    with TestEngine(app) as env:
        run = env.start("sleepers", [10])
        with pytest.raises(WaitTimeoutError, match="still RUNNING after"):
            env.wait_for_completion(run, timeout=timedelta(days=5))
        assert env.get(run).status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
        assert env.wait_for_completion(run, timeout=timedelta(days=6)).output == [[10, 10]]
