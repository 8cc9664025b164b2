"""Golden histories: recorded runs of the pattern workflows, replayed against today's code.

For every recorded turn, running that turn again from the history before it must decide
exactly what the history recorded (the same events, in the same order, with the same
sequence numbers and times). A full replay must end in the recorded status, and running
the pattern again today must record the very same history. Regenerate the files with
``tests/golden/generate_histories.py`` after an intended change, and review the diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from runtime_harness import strip_stacks
from runtime_patterns import PATTERN_RUNS, patterns

from engine.core.history import (
    ContinuedAsNew,
    EventRaised,
    ExecutionCancelRequested,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TurnStarted,
    UpdatesCarried,
)
from engine.runtime.executor import WorkflowExecution, execute
from engine.runtime.handlers import INBOUND
from engine.runtime.jsonhistory import history_from_json, history_to_json

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
FILES = sorted((GOLDEN / "histories").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _turns(history: list[HistoryEvent]) -> list[tuple[int, int]]:
    """(start, end) index ranges of the turns (each begins with TurnStarted)."""
    starts = [i for i, e in enumerate(history) if type(e.body) is TurnStarted]
    return list(zip(starts, [*starts[1:], len(history)], strict=True))


#: What a continue-as-new carries into the next generation, right after its start.
_CARRIED = (EventRaised, UpdatesCarried)


def _inbound(events: list[HistoryEvent], continued: bool) -> list[Inbound]:
    """The events a turn accepted: those after TurnStarted, up to its first decision. The
    turn after a continue-as-new begins the next generation by itself: its start and what
    is carried into it (right after the start: updates, events) are the runtime's, not
    offered."""
    out = []
    body = events[1].body if len(events) > 1 else None
    skip = 2 if continued and type(body) is ExecutionStarted else 1
    while continued and skip < len(events) and type(events[skip].body) in _CARRIED:
        skip += 1
    for event in events[skip:]:
        if type(event.body) not in INBOUND:
            break
        out.append(Inbound(event.body, event.generation))
    return out


def test_there_is_a_golden_file_per_pattern_run() -> None:
    assert {p.stem for p in FILES} == set(PATTERN_RUNS)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_turn_decides_what_was_recorded(path: Path) -> None:
    for instance_id, raw in _load(path)["instances"].items():
        history = history_from_json(raw)
        for start, end in _turns(history):
            events = history[start:end]
            result = execute(
                patterns,
                history[:start],
                _inbound(events, start > 0 and type(history[start - 1].body) is ContinuedAsNew),
                events[0].body.time_ms,  # type: ignore[attr-defined]
                instance_id=instance_id,
            )
            assert not result.rejected
            assert strip_stacks(result.new_events) == events, f"{instance_id} turn @{start}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_full_replay_reaches_the_recorded_end(path: Path) -> None:
    for instance_id, raw in _load(path)["instances"].items():
        history = history_from_json(raw)
        end = history[-1].body
        assert isinstance(end, ExecutionCompleted)
        execution = WorkflowExecution(patterns, instance_id)
        execution.replay(history)
        assert execution.status is end.status
        assert execution.output == end.output
        assert execution.next_sequence == history[-1].sequence + 1
        assert execution.pending_timers == {}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_running_the_pattern_today_records_the_same_history(path: Path) -> None:
    sys.path.insert(0, str(GOLDEN))
    try:
        from generate_histories import record
    finally:
        sys.path.remove(str(GOLDEN))
    assert record(path.stem) == _load(path)


def test_json_history_round_trips() -> None:
    for path in FILES:
        for raw in _load(path)["instances"].values():
            assert history_to_json(history_from_json(raw)) == raw


def test_golden_statuses_cover_success_and_failure() -> None:
    statuses = set()
    for path in FILES:
        for raw in _load(path)["instances"].values():
            statuses.add(history_from_json(raw)[-1].body.status)  # type: ignore[attr-defined]
    assert statuses == {RuntimeStatus.COMPLETED, RuntimeStatus.FAILED}


LEGACY = GOLDEN / "legacy" / "monitor_continue_in_one_turn.json"


def test_a_history_whose_continue_as_new_began_the_next_generation_in_its_turn_replays() -> None:
    """Before continue-as-new ended its turn, the next generation's ExecutionStarted (and
    its first decisions) followed ContinuedAsNew in the same turn. Such histories replay
    as they are, each generation alone and the whole, and pass the replay check."""
    from engine.services.audit.replay import OK, ReplayChecker

    history = history_from_json(_load(LEGACY)["instances"]["wf-1"])
    kinds = [type(e.body).__name__ for e in history]
    continued = kinds.index("ContinuedAsNew")
    assert kinds[continued + 1] == "ExecutionStarted"  # the old shape, in one turn
    execution = WorkflowExecution(patterns, "wf-1")
    execution.replay(history)
    end = history[-1].body
    assert isinstance(end, ExecutionCompleted) and execution.status is end.status
    assert execution.next_sequence == history[-1].sequence + 1
    checker = ReplayChecker(patterns)
    checker.feed_all(history)
    report = checker.finish()
    assert [r.outcome for r in report.results] == [OK]
    assert report.generations == kinds.count("ExecutionStarted")


CANCEL_LEGACY = GOLDEN / "legacy" / "cancel_before_every_fiber_was_cancelled.json"


def test_a_cancel_request_recorded_before_every_fiber_was_cancelled_replays_as_it_was() -> None:
    """Recorded by the engine before graceful cancel (``ExecutionCancelRequested`` without
    ``every_fiber``): only the main coroutine got CancelledError, the spawned watcher kept
    its timer, and the instance ended FAILED. Such a history replays and re-decides each
    turn as recorded, and a cancel request written today cancels every fiber instead."""
    from engine.services.audit.replay import OK, ReplayChecker

    history = history_from_json(_load(CANCEL_LEGACY)["instances"]["wf-1"])
    execution = WorkflowExecution(patterns, "wf-1")
    execution.replay(history)
    end = history[-1].body
    assert isinstance(end, ExecutionCompleted) and end.status is RuntimeStatus.FAILED
    assert execution.status is RuntimeStatus.FAILED
    for start, stop in _turns(history):
        result = execute(
            patterns,
            history[:start],
            _inbound(history[start:stop], False),
            history[start].body.time_ms,  # type: ignore[attr-defined]
            instance_id="wf-1",
        )
        assert strip_stacks(result.new_events) == history[start:stop]
    checker = ReplayChecker(patterns)
    checker.feed_all(history)
    assert [r.outcome for r in checker.finish().results] == [OK]
    today = execute(
        patterns,
        history[:3],
        [Inbound(ExecutionCancelRequested("the customer withdrew", every_fiber=True))],
        history[3].body.time_ms,  # type: ignore[attr-defined]
        instance_id="wf-1",
    )
    assert [type(e.body).__name__ for e in today.new_events][2:] == [
        "TimerCancelled",
        "ExecutionCompleted",
    ]
    assert today.status is RuntimeStatus.CANCELLED
