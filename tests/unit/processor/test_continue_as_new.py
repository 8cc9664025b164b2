"""Continue-as-new ends its turn, and a backlog of events drains over as many turns as it
needs: the next generation begins in the instance's next turn (the wake-up timer brings
it), a generation is given at most EVENT_WINDOW unread events of a name, and the rest wait
in the instance's backlog, so a loop that reads ten events per generation drains any
number of queued events without failing and with history linear in their number."""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine import Registry, WorkflowContext
from engine.config.settings import Settings
from engine.core.errors import PendingEventsFullError
from engine.core.history import ExecutionStarted, HistoryEvent, RuntimeStatus, TurnStarted
from engine.runtime.continuation import EVENT_WINDOW
from engine.services.processor.backlog import WAKE_TIMER
from engine.testing import TestEngine

PER_GENERATION = 10


def build(*, buggy: bool = False) -> Registry:
    registry = Registry()

    @registry.workflow(name="drain")
    async def drain(ctx: WorkflowContext, state: dict[str, Any]) -> dict[str, Any]:
        """Reads ten events per generation, checking they come in the order sent."""
        if buggy and ctx.generation == 1:
            raise KeyError("a bug in generation 1")
        if state.get("pause") and ctx.generation == 1:
            await ctx.sleep(3600)  # reads nothing for an hour: its backlog stays full
        for _ in range(PER_GENERATION):
            value = await ctx.wait_for_event("e")
            state["ordered"] = state["ordered"] and value == state["count"]
            state["count"] += 1
        if state["count"] >= state["total"]:
            return state
        ctx.continue_as_new(state)

    @registry.workflow(name="reads-two")
    async def reads_two(ctx: WorkflowContext, _: Any) -> list[Any]:
        return [await ctx.wait_for_event("e"), await ctx.wait_for_event("e")]

    @registry.workflow(name="hops")
    async def hops(ctx: WorkflowContext, left: int) -> int:
        """Continues as new with nothing to wait for: only the wake-up brings the next."""
        if left == 0:
            return ctx.generation
        ctx.continue_as_new(left - 1)

    return registry


def _state(total: int) -> dict[str, Any]:
    return {"count": 0, "total": total, "ordered": True}


def _raise_all(env: TestEngine, instance_id: str, total: int) -> None:
    for value in range(total):
        env.raise_event(instance_id, "e", value, wait=False)


def _turns(history: list[HistoryEvent]) -> list[list[HistoryEvent]]:
    turns: list[list[HistoryEvent]] = []
    for event in history:
        if isinstance(event.body, TurnStarted) or not turns:
            turns.append([])
        turns[-1].append(event)
    return turns


def _check_drained(env: TestEngine, instance_id: str, total: int) -> list[HistoryEvent]:
    state = env.wait_for_completion(instance_id)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output == {"count": total, "total": total, "ordered": True}
    assert state.generation == total // PER_GENERATION - 1  # every generation ran
    history = env.history(instance_id)
    # history linear in the backlog: each event is journaled at most a few times, however
    # many generations it waited through (it was 50,707 events for 1,000 queued ones)
    assert len(history) < 6 * total
    # one generation's code per turn: the turn budget counts one generation
    for turn in _turns(history):
        assert sum(isinstance(e.body, ExecutionStarted) for e in turn) <= 1
    assert env.dead_letters() == []
    return history


def test_a_loop_over_1500_queued_events_runs_all_its_generations() -> None:
    total = 1500
    with TestEngine(build(), settings=Settings(max_batch=2 * total)) as env:
        env.start("drain", _state(total), instance_id="d")
        _raise_all(env, "d", total)  # all in one batch, behind the start
        history = _check_drained(env, "d", total)
        kinds = Counter(type(e.body).__name__ for e in history)
        assert kinds["ContinuedAsNew"] == total // PER_GENERATION - 1
        row = env.processors[0].tables.load_meta("d")
        assert row is not None and row.backlog == []


def test_history_grows_linearly_with_the_backlog() -> None:
    sizes = {}
    for total in (500, 1000, 2000):
        with TestEngine(build(), settings=Settings(max_batch=2 * total)) as env:
            env.start("drain", _state(total), instance_id="d")
            _raise_all(env, "d", total)
            sizes[total] = len(_check_drained(env, "d", total))
    assert sizes[2000] < 2.2 * sizes[1000] < 2.2 * 2.2 * sizes[500]


def test_a_parked_instance_with_a_backlog_drains_it_after_its_fix() -> None:
    total = 1500
    with TestEngine(build(buggy=True), settings=Settings(max_batch=2 * total)) as env:
        env.start("drain", _state(total), instance_id="p")
        _raise_all(env, "p", total)
        env.run()  # generation 0 read ten and continued; generation 1 raises: parked
        row = env.processors[0].tables.load_meta("p")
        assert row is not None and row.parked is not None
        assert len(row.backlog) > 1000  # the events generation 1 was not given yet
        env.raise_event("p", "e", total, wait=False)  # one more while parked: queues behind
        env.deploy(build())
        env.retry("p")
        _check_drained(env, "p", total)


def test_the_next_generation_begins_without_any_new_input() -> None:
    with TestEngine(build()) as env:
        env.start("hops", 3, instance_id="h")
        assert env.wait_for_completion("h").output == 3
        turns = _turns(env.history("h"))
        assert len(turns) == 4  # one generation per turn, each brought by its wake-up
        pp = env.processors[0]
        assert [t for t in pp.tables.timers_of("h") if t.task_id == WAKE_TIMER] == []


def test_a_full_backlog_sends_what_does_not_fit_to_dead_letters() -> None:
    bound = 20
    settings = Settings(max_batch=1000, backlog_events_max=bound)
    with TestEngine(build(), settings=settings) as env:
        env.start("drain", {**_state(1000), "pause": True}, instance_id="f")
        _raise_all(env, "f", PER_GENERATION + EVENT_WINDOW + bound + 5)
        env.run()
        letters = env.dead_letters()
        assert len(letters) == 5  # the newest of the continue-as-new's overflow
        assert all("backlog_events_max=20" in letter.reason for letter in letters)
        try:
            env.raise_event("f", "e", "late")
        except PendingEventsFullError as exc:
            assert "backlog" in str(exc)
        else:  # pragma: no cover - the bound must refuse it
            raise AssertionError("an event beyond the backlog's bound was accepted")
        assert len(env.dead_letters()) == 6  # refused, and kept as a dead letter


def test_a_run_that_ends_sends_its_unread_backlog_to_dead_letters() -> None:
    with TestEngine(build(), settings=Settings(max_batch=1000)) as env:
        env.start("drain", _state(20), instance_id="e")  # two generations, then done
        _raise_all(env, "e", PER_GENERATION + EVENT_WINDOW + 7)
        state = env.wait_for_completion("e")
        assert state.output == {"count": 20, "total": 20, "ordered": True}
        env.run()
        letters = env.dead_letters()
        assert letters and all("its run ended COMPLETED" in x.reason for x in letters)
        unread = EVENT_WINDOW + 7 - PER_GENERATION  # given at most a window, read ten
        carried_and_unread = EVENT_WINDOW - PER_GENERATION
        assert len(letters) == unread - carried_and_unread  # the rest were in history


def test_events_behind_a_backlog_keep_their_order() -> None:
    with TestEngine(build(), settings=Settings(max_batch=1000)) as env:
        total = 200
        env.start("drain", _state(total), instance_id="o")
        _raise_all(env, "o", 100)
        env.run()
        row = env.processors[0].tables.load_meta("o")
        assert row is not None and row.backlog == []  # drained already
        for value in range(100, total):  # each batch arrives while a backlog may wait
            env.raise_event("o", "e", value, wait=False)
            if value % 7 == 0:
                env.step()
        _check_drained(env, "o", total)


def test_a_bound_failing_the_turn_that_begins_a_generation_begins_it_too() -> None:
    """The turn after a continue-as-new begins the next generation; when one of the
    engine's bounds fails that turn, the failure is recorded in that generation, after its
    start, so the history stays a valid one."""
    registry = Registry()

    def bump(x: int) -> int:
        return x + 1

    @registry.workflow(name="busy-second")
    async def busy_second(ctx: WorkflowContext, generation: int) -> int:
        if generation == 0:
            ctx.continue_as_new(1)
        total = 0
        for _ in range(100):  # too many events for one turn (turn_max_events)
            total = await ctx.run("bump", bump, total)
        return total

    with TestEngine(registry, settings=Settings(turn_max_events=50)) as env:
        env.start("busy-second", 0, instance_id="b")
        state = env.wait_for_completion("b")
        assert state.status is RuntimeStatus.FAILED and state.failure is not None
        assert state.failure.type == "StepBudgetExceededError" and state.generation == 1
        tail = env.history("b")[-4:]
        assert [type(e.body).__name__ for e in tail] == [
            "ContinuedAsNew",
            "TurnStarted",
            "ExecutionStarted",
            "ExecutionCompleted",
        ]
        assert [e.generation for e in tail] == [0, 1, 1, 1]
