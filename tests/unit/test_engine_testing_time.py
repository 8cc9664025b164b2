"""engine.testing: time follows what runs. A running activity moves engine time with the
wall clock (so a timer shorter than a real activity wins the race), a ``takes`` fake lasts
its declared span of engine time without costing wall time, and time still jumps when
nothing runs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from engine import ActivityFailedError, Registry, RetryPolicy, WorkflowContext
from engine.core.activity_info import current_activity
from engine.core.errors import WaitTimeoutError
from engine.core.history import TaskCompleted, TimerFired
from engine.testing import TestEngine, takes

app = Registry()


@app.activity(name="work")
def work(seconds: float) -> str:
    time.sleep(seconds)  # real work, taking real time
    return "done"


@app.workflow(name="race")
async def race(ctx: WorkflowContext, args: dict[str, float]) -> dict[str, Any]:
    """The commonest race: an activity against a durable timer."""
    began = ctx.now()
    call = ctx.call_activity(work, args["work"])
    winner = await ctx.when_any([call, ctx.sleep(args["timer"])])
    return {
        "winner": "activity" if winner is call else "timer",
        "seconds": (ctx.now() - began).total_seconds(),
    }


@app.workflow(name="sleeper")
async def sleeper(ctx: WorkflowContext, days: int) -> int:
    began = ctx.now()
    await ctx.sleep(timedelta(days=days))
    return (ctx.now() - began).days


def _calls(env: TestEngine, run: str) -> list[type]:
    return [
        type(e.body) for e in env.history(run) if isinstance(e.body, TaskCompleted | TimerFired)
    ]


def test_a_timer_shorter_than_a_real_activity_wins_the_race() -> None:
    with TestEngine(app) as env:
        run = env.start("race", {"work": 1.5, "timer": 0.5})
        state = env.wait_for_completion(run)
        assert state.output["winner"] == "timer"
        assert state.output["seconds"] >= 0.5
        assert _calls(env, run) == [TimerFired]


def test_a_real_activity_shorter_than_the_timer_wins_the_race() -> None:
    with TestEngine(app) as env:
        run = env.start("race", {"work": 0.0, "timer": 3600})
        state = env.wait_for_completion(run)
        assert state.output["winner"] == "activity"
        assert state.output["seconds"] < 3600


def test_a_fake_that_takes_ten_minutes_loses_to_a_one_minute_timer() -> None:
    slow = takes(timedelta(minutes=10), "done")
    with TestEngine(app, activities={work: slow}) as env:
        before = env.now()
        run = env.start("race", {"work": 0, "timer": 60})
        state = env.wait_for_completion(run)
        assert state.output == {"winner": "timer", "seconds": 60.0}
        assert env.now() - before == timedelta(minutes=1)


def test_a_fake_that_takes_one_minute_beats_a_ten_minute_timer() -> None:
    with TestEngine(app, activities={"work": takes(60, lambda seconds: "fast")}) as env:
        run = env.start("race", {"work": 0, "timer": 600})
        state = env.wait_for_completion(run)
        assert state.output == {"winner": "activity", "seconds": 60.0}
        assert _calls(env, run) == [TaskCompleted]


@dataclass
class Parcel:
    weight: int


@app.activity(name="weigh")
def weigh(parcel: Parcel) -> int:
    raise RuntimeError("a scale: the test replaces it")


@app.workflow(name="weigh_all")
async def weigh_all(ctx: WorkflowContext, weights: list[int]) -> dict[str, Any]:
    began = ctx.now()
    calls = [ctx.call_activity(weigh, Parcel(w)) for w in weights]
    total = sum(await ctx.when_all(calls))
    return {"total": total, "minutes": (ctx.now() - began).total_seconds() / 60}


@app.workflow(name="month")
async def month(ctx: WorkflowContext, _: Any) -> float:
    began = ctx.now()
    await ctx.when_all([ctx.call_activity(work, 0.2), ctx.sleep(timedelta(days=30))])
    await ctx.call_activity(weigh, Parcel(1), start_to_close=timedelta(days=3))  # takes 2
    return (ctx.now() - began).total_seconds() / 86400


def test_time_still_jumps_when_nothing_runs() -> None:
    with TestEngine(app, activities={weigh: takes(timedelta(days=2), 1)}) as env:
        before = env.now()
        assert env.wait_for_completion(env.start("sleeper", 30)).output == 30
        assert env.now() - before == timedelta(days=30)
        # a real activity beside a 30-day timer, then a fake of two days: 32 days, at once
        days = env.wait_for_completion(env.start("month")).output
        assert 32 <= days < 32 + 1 / 24


def test_parallel_slow_fakes_overlap_and_get_the_typed_input() -> None:
    seen: list[Any] = []

    def scale(parcel: Parcel) -> int:
        seen.append(parcel)
        return parcel.weight * 2

    with TestEngine(app, activities={weigh: takes(timedelta(minutes=5), scale)}) as env:
        state = env.wait_for_completion(env.start("weigh_all", [1, 2, 3]))
    assert state.output == {"total": 12, "minutes": 5.0}
    assert seen == [Parcel(1), Parcel(2), Parcel(3)]


@app.workflow(name="patient")
async def patient(ctx: WorkflowContext, minutes: float | None) -> dict[str, Any]:
    """Calls ``work`` with a start-to-close of ``minutes`` (None: the default, 10 minutes)
    and up to three attempts; returns the last error and the engine time it all took."""
    began = ctx.now()
    retry = RetryPolicy(max_attempts=3, initial_interval=1, backoff_coefficient=1.0, jitter=0)
    limit = None if minutes is None else timedelta(minutes=minutes)
    error = None
    try:
        await ctx.call_activity(work, 0, start_to_close=limit, retry=retry)
    except ActivityFailedError as exc:
        error = exc.details.type
    return {"error": error, "seconds": (ctx.now() - began).total_seconds()}


def test_a_fake_slower_than_its_start_to_close_timeout_times_out_in_engine_time() -> None:
    attempts: list[int] = []

    async def slow(seconds: float) -> str:
        attempts.append(current_activity().attempt)
        return "too late"

    with TestEngine(app, activities={work: takes(timedelta(minutes=15), slow)}) as env:
        named = env.wait_for_completion(env.start("patient", 2)).output
        default = env.wait_for_completion(env.start("patient", None)).output
        enough = env.wait_for_completion(env.start("patient", 20)).output
    # three attempts of two (then of the default ten) minutes each, one second apart
    assert named == {"error": "ActivityTimeoutError", "seconds": 3 * 120 + 2 * 1}
    assert default == {"error": "ActivityTimeoutError", "seconds": 3 * 600 + 2 * 1}
    assert enough == {"error": None, "seconds": 15 * 60}
    assert attempts == [1, 2, 3, 1, 2, 3, 1]


def test_a_wait_bounded_in_engine_time_stops_while_a_fake_is_held() -> None:
    with TestEngine(app, activities={work: takes(timedelta(minutes=5), "late")}) as env:
        run = env.start("race", {"work": 0, "timer": 1200})
        with pytest.raises(WaitTimeoutError, match="still RUNNING after"):
            env.wait_for_completion(run, timeout=timedelta(minutes=2))
        assert env.wait_for_completion(run).output == {"winner": "activity", "seconds": 300.0}
