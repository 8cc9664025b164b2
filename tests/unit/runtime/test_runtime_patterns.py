"""The pattern suite, each driven hot, cold (rebuilt from history every turn) and with
results arriving in shuffled order and random batches."""

from __future__ import annotations

import random
from typing import Any

import pytest
from runtime_harness import Sim
from runtime_patterns import APPROVALS, PATTERN_RUNS, patterns

from engine.core.history import (
    ContinuedAsNew,
    ExecutionStarted,
    Inbound,
    RuntimeStatus,
    TaskScheduled,
    TimerCancelled,
)
from engine.core.payloads import to_payload
from engine.runtime import WorkflowExecution

EXPECTED: dict[str, tuple[RuntimeStatus, Any]] = {
    "chain_5": (RuntimeStatus.COMPLETED, 5),
    "fan_out_20": (RuntimeStatus.COMPLETED, sum(i * i for i in range(20))),
    "approval_wait_approved": (RuntimeStatus.COMPLETED, "expense-1: approved"),
    "approval_wait_expired": (RuntimeStatus.COMPLETED, "expense-2: expired"),
    "approval_race_approved": (RuntimeStatus.COMPLETED, "expense-3: approved"),
    "approval_race_expired": (RuntimeStatus.COMPLETED, "expense-4: expired"),
    "monitor": (RuntimeStatus.COMPLETED, 3),
    "saga_shipped": (RuntimeStatus.COMPLETED, "shipped"),
    "saga_declined": (RuntimeStatus.FAILED, None),
    "threads_4": (RuntimeStatus.COMPLETED, [0, 10, 20, 30]),
    "parent_3": (RuntimeStatus.COMPLETED, [0, 1, 2]),
    "racing_saga": (RuntimeStatus.COMPLETED, "fast"),
    "inline3": (RuntimeStatus.COMPLETED, 4),
}

MODES: dict[str, dict[str, Any]] = {
    "hot": {},
    "cold": {"cold": True},
    "shuffled": {"rng": random.Random(7), "max_batch": 3},
    "shuffled-cold": {"rng": random.Random(11), "max_batch": 4, "cold": True},
}


def run_pattern(key: str, **kw: Any) -> Sim:
    name, value = PATTERN_RUNS[key]
    sim = Sim(patterns, **kw)
    sim.start(name, value)
    if key in APPROVALS:
        sim.run(timers=False)
        sim.raise_event("wf-1", "approval", "approved")
    sim.run()
    return sim


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("key", PATTERN_RUNS)
def test_pattern(key: str, mode: str) -> None:
    sim = run_pattern(key, **MODES[mode])
    status, output = EXPECTED[key]
    assert (sim.status(), sim.output()) == (status, output)
    assert all(sim.status(i).is_terminal for i in sim.instances)
    assert sim.timers == {}  # every timer fired or was cancelled
    assert not [r for i in sim.instances for r in sim.rejected(i)]


def test_saga_compensates_completed_steps_in_reverse_order() -> None:
    sim = run_pattern("saga_declined")
    assert [t.name for t in sim.bodies(TaskScheduled)] == ["reserve", "charge", "release"]
    failure = sim.failure()
    assert failure is not None and failure.type == "ActivityFailedError"
    assert "CardDeclined: card declined" in failure.message
    # the activity's own failure stays in the cause chain
    assert [f.type for f in failure.chain()] == ["ActivityFailedError", "CardDeclined"]
    assert failure.chain()[1].retryable is False


def test_losing_branch_is_cancelled_and_compensates() -> None:
    sim = run_pattern("racing_saga")
    assert [t.name for t in sim.bodies(TaskScheduled)] == ["reserve", "release"]
    assert sim.bodies(TimerCancelled) == [TimerCancelled(2)]


def test_monitor_keeps_each_generation_short() -> None:
    sim = run_pattern("monitor")
    assert [c.new_generation for c in sim.bodies(ContinuedAsNew)] == [1, 2, 3]
    assert sim.execution().generation == 3
    assert len(sim.execution().history) == 5  # only the last generation is kept in memory


def test_approval_timer_race_cancels_the_deadline() -> None:
    sim = run_pattern("approval_race_approved")
    assert sim.bodies(TimerCancelled) == [TimerCancelled(0)]


def test_fan_out_of_1000_activities() -> None:
    sim = Sim(patterns, rng=random.Random(3), max_batch=50)
    sim.start("fan_out", 1000)
    sim.run()
    assert sim.output() == sum(i * i for i in range(1000))
    assert len(sim.bodies(TaskScheduled)) == 1000
    replayed = WorkflowExecution(patterns, "wf-1")
    replayed.replay(sim.history())
    assert replayed.output == sim.execution().output


def test_three_inline_steps_complete_in_one_turn() -> None:
    """Three inline steps run and complete inside the start's own turn: one step, six
    events (how fast is benchmarks/chain3.py's business, not a test's)."""
    started = Inbound(ExecutionStarted("inline3", to_payload(1)))
    for i in range(50):
        execution = WorkflowExecution(patterns, f"wf-{i}")
        result = execution.step([started], i)
        assert result.status is RuntimeStatus.COMPLETED
        assert len(result.new_events) == 6
