"""Queries in the pure runtime: handlers answer from the state the history gives (live or
replayed alike), follow continue-as-new, and never change what the code decides."""

from __future__ import annotations

from typing import Any

import pytest
from runtime_harness import Sim

from engine import Registry, WorkflowContext
from engine.core.errors import QueryFailedError, UnknownQueryError
from engine.core.history import RuntimeStatus
from engine.core.payloads import from_payload, to_payload
from engine.runtime import WorkflowExecution
from engine.runtime.queries import query_names, run_query

reg = Registry()


@reg.workflow
async def looping(ctx: WorkflowContext, state: dict[str, Any]) -> int:
    seen = list(state["seen"])
    ctx.set_query_handler("seen", lambda: seen)
    ctx.set_query_handler("generation", lambda: ctx.generation)
    if state["rounds"] == 0:
        return len(seen)
    seen.append(await ctx.wait_for_event("item"))
    ctx.continue_as_new({"seen": seen, "rounds": state["rounds"] - 1})


@reg.workflow
async def removes(ctx: WorkflowContext, _: Any) -> None:
    ctx.set_query_handler("once", lambda: 1)
    ctx.set_query_handler("once", None)
    await ctx.wait_for_event("go")


def _ask(execution: WorkflowExecution, name: str, *args: Any) -> Any:
    return from_payload(run_query(execution, name, to_payload(list(args))))


def test_handlers_follow_continue_as_new_and_replay_gives_the_same_answers() -> None:
    sim = Sim(reg)
    sim.start("looping", {"seen": [], "rounds": 2})
    sim.run()
    sim.raise_event("wf-1", "item", "a")
    sim.run()
    live = sim.execution()
    assert _ask(live, "seen") == ["a"] and _ask(live, "generation") == 1
    replayed = WorkflowExecution(reg, "wf-1")
    replayed.replay([e for e in sim.history() if e.generation == live.generation])
    assert _ask(replayed, "seen") == ["a"] and _ask(replayed, "generation") == 1
    assert query_names(replayed) == ["generation", "seen"]
    sim.raise_event("wf-1", "item", "b")
    sim.run()
    assert sim.status() is RuntimeStatus.COMPLETED
    assert _ask(sim.execution(), "seen") == ["a", "b"]  # the ended generation still answers


def test_a_removed_handler_is_unknown_and_an_unstarted_instance_has_none() -> None:
    sim = Sim(reg)
    sim.start("removes")
    sim.run()
    with pytest.raises(UnknownQueryError, match="its queries: none"):
        run_query(sim.execution(), "once", None)
    with pytest.raises(QueryFailedError, match="not started"):
        run_query(WorkflowExecution(reg, "nobody"), "once", None)


def test_arguments_must_be_a_list_and_handler_names_strings() -> None:
    sim = Sim(reg)
    sim.start("looping", {"seen": [], "rounds": 1})
    sim.run()
    with pytest.raises(QueryFailedError, match="JSON list"):
        run_query(sim.execution(), "seen", to_payload({"not": "a list"}))
    gen = sim.execution().current_generation
    assert gen is not None
    with pytest.raises(ValueError, match="non-empty string"):
        gen.set_query_handler("", lambda: 1)
    with pytest.raises(TypeError, match="callable"):
        gen.set_query_handler("x", 42)  # type: ignore[arg-type]


def test_a_refused_decision_leaves_the_next_turn_as_it_would_have_been() -> None:
    """A handler that tries to wait is refused; the instance then runs exactly as one never
    asked (same history, compared event by event)."""

    def run(ask: bool) -> list[Any]:
        sim = Sim(reg)
        sim.start("looping", {"seen": [], "rounds": 1})
        sim.run()
        if ask:
            gen = sim.execution().current_generation
            assert gen is not None
            gen.set_query_handler("wait", lambda: gen.wait_event("item", None))
            with pytest.raises(QueryFailedError, match="read-only"):
                run_query(sim.execution(), "wait", None)
        sim.raise_event("wf-1", "item", "x")
        sim.run()
        return [(e.sequence, type(e.body).__name__) for e in sim.history()]

    assert run(ask=True) == run(ask=False)
