"""Properties of the executor, checked with Hypothesis over the pattern suite, random
delivery orders and random batchings:

- replaying any prefix of a history and then feeding the rest turn by turn gives exactly
  the decisions of the uninterrupted run;
- the same inputs always give the same decisions (and hot equals cold execution);
- a changed workflow is caught as non-deterministic, at the right sequence number.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_harness import Sim, strip_stacks
from runtime_patterns import PATTERN_RUNS, patterns

from engine import NonDeterminismError, Registry, WorkflowContext
from engine.core.failure import FailureDetails
from engine.core.history import (
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    TaskCompleted,
    TaskScheduled,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime import Action, WorkflowExecution

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SCENARIOS: dict[str, tuple[str, Any]] = {
    **PATTERN_RUNS,
    "chain_3": ("chain", 3),
    "fan_out_6": ("fan_out", 6),
    "threads_3": ("threads", 3),
}


def _simulate(key: str, seed: int, max_batch: int, cold: bool = False) -> Sim:
    name, value = SCENARIOS[key]
    sim = Sim(patterns, rng=random.Random(seed), max_batch=max_batch, cold=cold)
    sim.start(name, value)
    sim.raise_event("wf-1", "approval", "approved")  # ignored by patterns that never wait
    sim.run()
    return sim


def _actions(actions: list[Action]) -> list[Action]:
    out = []
    for action in actions:
        failure = getattr(action, "failure", None)
        if isinstance(failure, FailureDetails):
            action = dataclasses.replace(action, failure=dataclasses.replace(failure, stack=""))  # type: ignore[call-arg]
        out.append(action)
    return out


scenario = st.sampled_from(sorted(SCENARIOS))
seed = st.integers(0, 10_000)
batch = st.integers(1, 5)


@SETTINGS
@given(key=scenario, seed=seed, max_batch=batch, data=st.data())
def test_replaying_a_prefix_then_the_rest_gives_the_same_decisions(
    key: str, seed: int, max_batch: int, data: st.DataObject
) -> None:
    sim = _simulate(key, seed, max_batch)
    for instance_id, instance in sim.instances.items():
        turns = instance.turns
        cut = data.draw(st.integers(0, len(turns)), label=f"cut {instance_id}")
        prefix: list[HistoryEvent] = [e for t in turns[:cut] for e in t.result.new_events]
        execution = WorkflowExecution(patterns, instance_id)
        execution.replay(prefix)
        for turn in turns[cut:]:
            result = execution.step(turn.inbound, turn.now_ms)
            assert strip_stacks(result.new_events) == strip_stacks(turn.result.new_events)
            assert _actions(result.actions) == _actions(turn.result.actions)
            assert result.rejected == turn.result.rejected
            assert result.status is turn.result.status
        assert execution.status is instance.execution.status
        assert execution.output == instance.execution.output


@SETTINGS
@given(key=scenario, seed=seed, max_batch=batch)
def test_the_same_inputs_give_the_same_decisions(key: str, seed: int, max_batch: int) -> None:
    first = _simulate(key, seed, max_batch)
    second = _simulate(key, seed, max_batch)
    cold = _simulate(key, seed, max_batch, cold=True)
    for instance_id in first.instances:
        expected = strip_stacks(first.history(instance_id))
        assert strip_stacks(second.history(instance_id)) == expected
        assert strip_stacks(cold.history(instance_id)) == expected
        assert _actions(first.actions(instance_id)) == _actions(cold.actions(instance_id))


# --- a changed workflow -----------------------------------------------------------------------


def _stepper(skip: int = -1, rename: int = -1, timer_before: int = -1) -> Registry:
    """A chain of distinct steps; optionally one step skipped, renamed or preceded by a timer."""
    registry = Registry()

    async def steps(ctx: WorkflowContext, n: int) -> int:
        x = 0
        for i in range(n):
            if i == skip:
                continue
            if i == timer_before:
                await ctx.sleep(1)
            name = "renamed" if i == rename else "step"
            x = await ctx.call_activity(name, [i, x])
        return x

    registry.add_workflow(steps, name="steps")
    return registry


def _record_steps(n: int) -> list[HistoryEvent]:
    execution = WorkflowExecution(_stepper(), "wf")
    history = list(
        execution.step([Inbound(ExecutionStarted("steps", to_payload(n)))], 0).new_events
    )
    now = 0
    while not execution.status.is_terminal:
        scheduled = history[-1].body
        assert isinstance(scheduled, TaskScheduled)
        i, x = from_payload(scheduled.input)
        now += 1
        done = Inbound(TaskCompleted(scheduled.task_id, to_payload(x + i + 1)), 0)
        history += execution.step([done], now).new_events
    return history


@SETTINGS
@given(
    n=st.integers(1, 8),
    change=st.sampled_from(["skip", "rename", "timer_before"]),
    data=st.data(),
)
def test_a_changed_workflow_is_caught_at_the_right_sequence(
    n: int, change: str, data: st.DataObject
) -> None:
    history = _record_steps(n)
    position = data.draw(st.integers(0, n - 1), label="changed step")
    scheduled = [e for e in history if type(e.body) is TaskScheduled]
    expected_sequence = scheduled[position].sequence
    execution = WorkflowExecution(_stepper(**{change: position}), "wf")
    try:
        execution.replay(history)
    except NonDeterminismError as err:
        assert err.sequence == expected_sequence, (err, expected_sequence)
        assert "TaskScheduled" in err.recorded
    else:
        raise AssertionError(f"{change} at step {position} was not detected")
