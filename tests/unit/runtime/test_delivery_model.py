"""The delivery invariant over random workflows, arrival orders and batch boundaries.

Hypothesis draws a workflow (reader threads and the main coroutine reading events by plain
waits, waits with a timeout and ``when_any`` races against timers, continue-as-new after a
sleep), a schedule of events, and how they and the timer fires are cut into turns and
ordered within each turn (timers before or after the events: a parked or suspended
instance can see either). A race's wait may also run in a fiber of its own, which is
cancelled when it loses. The workflow reports every event it reads with ``send_event``, so
what was consumed is in its history.

The model is a ledger kept from the schedule and the history alone: each generation holds
the events carried into it plus those that arrived during it; what it did not consume is
exactly what the next generation starts with, in arrival order; the last generation keeps
the rest pending. An event is consumed at most once, only in a generation that held it,
and never vanishes. After every turn, what is held must also be deliverable: no event
stays claimed by a wait nobody will read (a ``when_any`` loser or a cancelled fiber gives
it back), and no wait for a name starves while an event of that name is held. Turns are
sometimes replayed cold (a rebuilt execution), so the bookkeeping must survive replay too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import event as label
from hypothesis import strategies as st

from engine import Registry, WorkflowContext, WorkflowTimeoutError
from engine.core.history import (
    EventRaised,
    EventSent,
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    TimerFired,
    TurnStarted,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime import actions as act
from engine.runtime.executor import WorkflowExecution

START_MS = 1_700_000_000_000
NAMES = ("a", "b")

registry = Registry()


@registry.workflow(name="model")
async def model(ctx: WorkflowContext, spec: dict[str, Any]) -> str:
    finished = [0]

    async def read_one(name: str) -> None:
        # the fiber reads (and reports) the event itself; it may lose the race before
        # it resumes (then the event goes back) or after (then it was read)
        ctx.send_event("sink", name, await ctx.wait_for_event(name))

    async def reader(name: str, reads: list[list[Any]]) -> None:
        for kind, ms in reads:
            if kind == "plain":
                value = await ctx.wait_for_event(name)
            elif kind == "timeout":
                try:
                    value = await ctx.wait_for_event(name, timeout=ms / 1000)
                except WorkflowTimeoutError:
                    continue
            elif kind == "any":
                wait = ctx.wait_for_event(name)
                winner = await ctx.when_any([ctx.sleep(ms / 1000), wait])
                if winner is not wait:
                    continue
                value = wait.result()
            else:  # the wait runs in a fiber of its own, which may lose the race
                await ctx.when_any([ctx.sleep(ms / 1000), read_one(name)])
                continue
            ctx.send_event("sink", name, value)
        finished[0] += 1

    for thread in spec["threads"]:
        ctx.spawn(reader(thread["name"], thread["reads"]))
    await reader(spec["main"]["name"], spec["main"]["reads"])
    if ctx.generation < spec["generations"]:
        await ctx.sleep(spec["sleep_ms"] / 1000)
        ctx.continue_as_new(spec)
    await ctx.wait_condition(lambda: finished[0] == len(spec["threads"]) + 1)
    return "done"


reads = st.lists(
    st.tuples(st.sampled_from(["plain", "timeout", "any", "race"]), st.integers(1, 40)).map(list),
    max_size=3,
)
reader_spec = st.fixed_dictionaries({"name": st.sampled_from(NAMES), "reads": reads})
workflows = st.fixed_dictionaries(
    {
        "threads": st.lists(reader_spec, max_size=3),
        "main": reader_spec,
        "generations": st.integers(0, 3),
        "sleep_ms": st.integers(1, 40),
    }
)
# a turn: time passes, some events arrive, due timers fire (before or after the events)
turns = st.lists(
    st.tuples(
        st.integers(0, 25),
        st.lists(st.sampled_from(NAMES), max_size=3),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


@dataclass
class Run:
    """Drives one instance as a processor would: turns, timer rows, cold rebuilds."""

    execution: WorkflowExecution
    now_ms: int = START_MS
    events: list[HistoryEvent] = field(default_factory=list)
    timers: dict[tuple[int, int], int] = field(default_factory=dict)
    accepted: list[int] = field(default_factory=list)

    def step(self, inbound: list[Inbound]) -> None:
        result = self.execution.step(inbound, self.now_ms)
        rejected = {id(r.inbound) for r in result.rejected}
        for item in inbound:
            if isinstance(item.body, EventRaised) and id(item) not in rejected:
                self.accepted.append(from_payload(item.body.input))
        self.events += result.new_events
        check_deliverable(self.execution)
        for action in result.actions:
            if isinstance(action, act.CreateTimer):
                self.timers[(action.generation, action.task_id)] = action.fire_at_ms
            elif isinstance(action, act.CancelTimer):
                self.timers.pop((action.generation, action.task_id), None)

    def due_fires(self) -> list[Inbound]:
        due = sorted((at, key) for key, at in self.timers.items() if at <= self.now_ms)
        for _, key in due:
            del self.timers[key]
        return [Inbound(TimerFired(task, at), gen) for at, (gen, task) in due]

    def rebuild(self) -> None:
        """A cold start: a new execution replays the history recorded so far."""
        self.execution.close()
        fresh = WorkflowExecution(registry, "m-1")
        fresh.replay(self.events)
        check_deliverable(fresh)
        self.execution = fresh


def check_deliverable(execution: WorkflowExecution) -> None:
    """After a turn, what the model says a later read gets: every claim was read or given
    back (a wait whose reader will not resume must not keep its event), and no wait for a
    name starves while an event of that name is held anywhere in the generation."""
    gen = execution.current_generation
    if gen is None or execution.status.is_terminal:
        return
    assert not gen.claims, "an event stayed claimed by a wait nobody will read"
    held = {name for name, _ in gen.unconsumed_events()}
    for name in NAMES:
        waiting = [w for w in gen.event_waiters.get(name, []) if not w.done()]
        assert not (waiting and name in held), f"a wait for {name!r} starves beside its event"


def generations(events: list[HistoryEvent]) -> list[tuple[list[int], list[int], list[int]]]:
    """Per generation: the events carried in at its start, the events that arrived in
    later turns, and the events its code consumed (ids, in history order)."""
    out: list[tuple[list[int], list[int], list[int]]] = []
    opening = False
    for event in events:
        body = event.body
        if isinstance(body, ExecutionStarted):
            out.append(([], [], []))
            opening = True  # carried events follow the start within the same turn
        elif isinstance(body, TurnStarted):
            opening = False
        elif isinstance(body, EventRaised):
            out[-1][0 if opening else 1].append(from_payload(body.input))
        elif isinstance(body, EventSent):
            out[-1][2].append(from_payload(body.input))
    return out


def check_ledger(run: Run) -> None:
    gens = generations(run.events)
    arrival = {event_id: index for index, event_id in enumerate(run.accepted)}
    arrived = [e for _, later, _ in gens for e in later]
    assert sorted(arrived) == sorted(run.accepted), "an accepted event is not in history"
    consumed_all: list[int] = []
    held: list[int] = []
    for number, (carried, later, consumed) in enumerate(gens):
        assert carried == held, f"generation {number} did not start with what was unconsumed"
        assert carried == sorted(carried, key=arrival.__getitem__), "carried out of order"
        present = carried + later
        assert set(consumed) <= set(present), f"generation {number} read an event it never had"
        assert len(set(consumed)) == len(consumed), "an event was consumed twice"
        consumed_all += consumed
        held = sorted(set(present) - set(consumed), key=arrival.__getitem__)
    assert len(set(consumed_all)) == len(consumed_all), "an event was consumed twice"
    label(f"generations: {len(gens)}")
    label(f"carried an event: {any(carried for carried, _, _ in gens)}")
    label(f"left pending: {bool(held)}")
    pending = held
    assert sorted(consumed_all + pending) == sorted(run.accepted), "an event vanished"
    # the last generation still holds exactly the pending ones, each deliverable
    gen = run.execution.current_generation
    if gen is not None and not run.execution.status.is_terminal:
        left = [from_payload(p) for _, p in gen.unconsumed_events()]
        assert sorted(left) == sorted(pending)
        check_deliverable(run.execution)


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=workflows, schedule=turns)
def test_every_received_event_is_consumed_once_or_still_pending(
    spec: dict[str, Any], schedule: list[tuple[int, list[str], bool, bool]]
) -> None:
    run = Run(WorkflowExecution(registry, "m-1"))
    run.step([Inbound(ExecutionStarted("model", to_payload(spec)))])
    next_id = 0
    for delay_ms, names, timers_first, cold in schedule:
        run.now_ms += delay_ms
        raised = []
        for name in names:
            raised.append(Inbound(EventRaised(name, to_payload(next_id))))
            next_id += 1
        fires = run.due_fires()
        run.step(fires + raised if timers_first else raised + fires)
        if cold and not run.execution.status.is_terminal:
            run.rebuild()
    for _ in range(50):  # let every timer fire: the instance settles
        if not run.timers or run.execution.status.is_terminal:
            break
        run.now_ms = max(run.now_ms, min(run.timers.values()))
        run.step(run.due_fires())
    check_ledger(run)
