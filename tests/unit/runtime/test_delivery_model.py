"""The delivery invariant over random workflows, arrival orders and batch boundaries.

Hypothesis draws a workflow (reader threads and the main coroutine reading events by plain
waits, waits with a timeout and ``when_any`` races against timers, continue-as-new after a
sleep), a schedule of events, and how they and the timer fires are cut into turns and
ordered within each turn (timers before or after the events: a parked or suspended
instance can see either). A race's wait may also run in a fiber of its own, which is
cancelled when it loses. The workflow reports every event it reads with ``send_event``, so
what was consumed is in its history.

The harness plays the processor's part too: a continue-as-new ends its turn and the
next turn (the processor's wake-up) begins the next generation; unconsumed events beyond
``EVENT_WINDOW`` of a name are not carried but kept (the processor's backlog) and handed
back by the processor's rule, while fewer than ``EVENT_WINDOW`` of their name are unread,
with a wake-up turn whenever there is room.

The model is a ledger kept from the schedule, the history and what the harness handed
back: each generation holds the events carried into it, those that arrived during it and
those handed back to it; what it did not consume is exactly what the next generation
starts with (the first ``EVENT_WINDOW`` of each name, in arrival order) plus what went to
the backlog; the last generation and the backlog keep the rest pending. An event is
consumed at most once, only in a generation that held it, and never vanishes. After every
turn, what is held must also be deliverable: no event stays claimed by a wait nobody will
read (a ``when_any`` loser or a cancelled fiber gives it back), and no wait for a name
starves while an event of that name is held, in the generation or in the backlog. Turns
are sometimes replayed cold (a rebuilt execution), so the bookkeeping must survive replay
too.
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
    RuntimeStatus,
    TimerFired,
    TurnStarted,
)
from engine.core.payloads import Payload, from_payload, to_payload
from engine.runtime import actions as act
from engine.runtime.continuation import EVENT_WINDOW
from engine.runtime.executor import WorkflowExecution

START_MS = 1_700_000_000_000
CONTINUED = RuntimeStatus.CONTINUED_AS_NEW
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
# a turn: time passes, some events arrive (now and then a burst of one name, more than a
# generation is given at once: a continue-as-new then leaves some to the backlog), due
# timers fire (before or after the events)
arrivals = st.lists(st.sampled_from(NAMES), max_size=3) | st.sampled_from(NAMES).map(
    lambda name: [name] * (EVENT_WINDOW + 5)
)
turns = st.lists(
    st.tuples(
        st.integers(0, 25),
        arrivals,
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


@dataclass
class Run:
    """Drives one instance as a processor would: turns, timer rows, cold rebuilds, the
    wake-up turn after a continue-as-new and whenever the backlog has room, and the
    backlog itself (events kept, then handed back by the processor's rule)."""

    execution: WorkflowExecution
    now_ms: int = START_MS
    events: list[HistoryEvent] = field(default_factory=list)
    timers: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Every event the instance accepted, in arrival order, and each one's name.
    accepted: list[int] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    #: Events the processor keeps (a continue-as-new's overflow, and events that arrived
    #: behind it), oldest first.
    backlog: list[tuple[str, Payload | None]] = field(default_factory=list)
    #: Sequence numbers of the EventRaised events that were handed back from the backlog.
    handed_back: set[int] = field(default_factory=set)
    #: Per generation that continued as new: the ids it left to the backlog.
    overflow: dict[int, list[int]] = field(default_factory=dict)
    #: Backlog events of a run that ended without reading them: dead letters.
    dead: list[int] = field(default_factory=list)

    def step(self, inbound: list[Inbound]) -> None:
        """One turn, then the wake-up turns the processor would add."""
        wake = self._turn(self._arrive(inbound))
        for _ in range(200):
            if not wake:
                break
            wake = self._turn([])
        check_deliverable(self.execution, self.backlog)

    def _arrive(self, inbound: list[Inbound]) -> list[Inbound]:
        """New events are accepted; behind a non-empty backlog they queue (``deliver``)."""
        passed = []
        for item in inbound:
            if isinstance(item.body, EventRaised) and self.execution.status.is_terminal:
                continue  # refused: the instance ended (the processor answers so)
            if isinstance(item.body, EventRaised):
                event_id = from_payload(item.body.input)
                self.accepted.append(event_id)
                self.names[event_id] = item.body.name
                if self.backlog:
                    self.backlog.append((item.body.name, item.body.input))
                    continue
            passed.append(item)
        return passed

    def _turn(self, inbound: list[Inbound]) -> bool:
        handed = self._hand_back(inbound)
        result = self.execution.step([*inbound, *handed], self.now_ms)
        assert not [r for r in result.rejected if isinstance(r.inbound.body, EventRaised)]
        handed_ids = {from_payload(i.body.input) for i in handed}  # type: ignore[attr-defined]
        for event in result.new_events:
            body = event.body
            if isinstance(body, EventRaised) and from_payload(body.input) in handed_ids:
                self.handed_back.add(event.sequence)
        self.events += result.new_events
        check_deliverable(self.execution, [])
        if self.execution.status.is_terminal:  # ``backlog.after_turn``: to dead letters
            self.dead += [from_payload(p) for _, p in self.backlog]
            self.backlog = []
        wake = False
        for action in result.actions:
            if isinstance(action, act.CreateTimer):
                self.timers[(action.generation, action.task_id)] = action.fire_at_ms
            elif isinstance(action, act.CancelTimer):
                self.timers.pop((action.generation, action.task_id), None)
            elif isinstance(action, act.ContinueAsNew):
                self.backlog[:0] = list(action.overflow)
                self.overflow[action.generation] = [from_payload(p) for _, p in action.overflow]
                wake = True
        return wake or self._room()

    def _hand_back(self, inbound: list[Inbound]) -> list[Inbound]:
        """The processor's rule (``backlog.feed``): backlog events, oldest first, while
        fewer than EVENT_WINDOW of their name are unread (counting the turn's events)."""
        if self.execution.status.is_terminal:
            return []
        counts = self.execution.unconsumed_by_name()
        for item in inbound:
            if isinstance(item.body, EventRaised):
                counts[item.body.name] = counts.get(item.body.name, 0) + 1
        handed, kept = [], []
        for name, payload in self.backlog:
            if counts.get(name, 0) < EVENT_WINDOW:
                counts[name] = counts.get(name, 0) + 1
                handed.append(Inbound(EventRaised(name, payload)))
            else:
                kept.append((name, payload))
        self.backlog = kept
        return handed

    def _room(self) -> bool:
        """The processor's wake-up after a turn (``backlog.after_turn``)."""
        if not self.backlog or self.execution.status.is_terminal:
            return False
        counts = self.execution.unconsumed_by_name()
        return any(counts.get(name, 0) < EVENT_WINDOW for name, _ in self.backlog)

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
        check_deliverable(fresh, [])
        self.execution = fresh


def check_deliverable(
    execution: WorkflowExecution, backlog: list[tuple[str, Payload | None]]
) -> None:
    """After a turn, what the model says a later read gets: every claim was read or given
    back (a wait whose reader will not resume must not keep its event), and no wait for a
    name starves while an event of that name is held anywhere in the generation (or, once
    the wake-up turns are done, in the backlog)."""
    gen = execution.current_generation
    if gen is None or execution.status.is_terminal or execution.status is CONTINUED:
        return  # nothing to deliver to: it ended, or its next generation has not begun
    assert not gen.claims, "an event stayed claimed by a wait nobody will read"
    held = {name for name, _ in gen.unconsumed_events()} | {name for name, _ in backlog}
    for name in NAMES:
        waiting = [w for w in gen.event_waiters.get(name, []) if not w.done()]
        assert not (waiting and name in held), f"a wait for {name!r} starves beside its event"


#: One generation in the ledger: the events carried in at its start, those that arrived in
#: later turns, those handed back from the backlog, and those its code consumed (ids);
#: then every event it received, in the order it received them.
Ledger = tuple[list[int], list[int], list[int], list[int], list[int]]


def generations(events: list[HistoryEvent], handed_back: set[int]) -> list[Ledger]:
    """Per generation, from its history (and which journaled events were handed back)."""
    out: list[Ledger] = []
    opening = False
    for event in events:
        body = event.body
        if isinstance(body, ExecutionStarted):
            out.append(([], [], [], [], []))
            opening = True  # carried events follow the start within the same turn
        elif isinstance(body, TurnStarted):
            opening = False
        elif isinstance(body, EventRaised):
            which = 2 if event.sequence in handed_back else 0 if opening else 1
            out[-1][which].append(from_payload(body.input))
            out[-1][4].append(from_payload(body.input))
        elif isinstance(body, EventSent):
            out[-1][3].append(from_payload(body.input))
    return out


def check_ledger(run: Run) -> None:
    gens = generations(run.events, run.handed_back)
    arrival = {event_id: index for index, event_id in enumerate(run.accepted)}
    in_order = _in_order(run, arrival)
    arrived = [e for _, later, _, _, _ in gens for e in later]
    queued = set(run.accepted) - set(arrived)  # arrived behind a backlog: never "later"
    assert len(arrived) == len(set(arrived)), "an event arrived twice"
    consumed_all: list[int] = []
    held: list[int] = []
    ever_kept: set[int] = set(queued)
    for number, (carried, later, handed, consumed, received) in enumerate(gens):
        assert carried == _window(held, run.names), f"generation {number}: not its window"
        left = run.overflow.get(number - 1, [])
        assert [e for e in held if e not in carried] == left, "an unconsumed event vanished"
        ever_kept.update(left)
        assert set(handed) <= ever_kept, "handed back an event the backlog never had"
        assert in_order(received), "events of one name reached the code out of order"
        present = carried + later + handed
        assert set(consumed) <= set(present), f"generation {number} read an event it never had"
        consumed_all += consumed
        held = [e for e in received if e not in set(consumed)]  # in the order received
    assert len(set(consumed_all)) == len(consumed_all), "an event was consumed twice"
    label(f"generations: {len(gens)}")
    label(f"carried an event: {any(carried for carried, _, _, _, _ in gens)}")
    label(f"kept in the backlog: {bool(ever_kept)}")
    label(f"left pending: {bool(held)}")
    kept = [from_payload(p) for _, p in run.backlog]
    pending = held + kept
    assert not run.dead or run.execution.status.is_terminal
    accounted = consumed_all + pending + run.dead  # dead: to dead letters with the reason
    assert sorted(accounted) == sorted(run.accepted), "an event vanished"
    assert in_order(kept), "the backlog is out of order"
    # the last generation still holds exactly the pending ones, each deliverable
    gen = run.execution.current_generation
    if gen is not None and not run.execution.status.is_terminal:
        left = [from_payload(p) for _, p in gen.unconsumed_events()]
        assert sorted(left) == sorted(held)
        check_deliverable(run.execution, run.backlog)


def _in_order(run: Run, arrival: dict[int, int]) -> Any:
    """Whether ids are in arrival order within each name (the backlog may let one name's
    events pass another's, never an earlier event of the same name)."""

    def check(ids: list[int]) -> bool:
        for name in NAMES:
            mine = [e for e in ids if run.names[e] == name]
            if mine != sorted(mine, key=arrival.__getitem__):
                return False
        return True

    return check


def _window(held: list[int], names: dict[int, str]) -> list[int]:
    """What a continue-as-new carries: the first EVENT_WINDOW unread events of each name."""
    counts: dict[str, int] = {}
    out = []
    for event_id in held:
        name = names[event_id]
        if counts.get(name, 0) < EVENT_WINDOW:
            counts[name] = counts.get(name, 0) + 1
            out.append(event_id)
    return out


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
