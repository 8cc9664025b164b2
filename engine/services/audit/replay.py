"""Replay check: does the current workflow code still make the decisions history recorded?

Before a deploy, re-execute the new code against recorded histories. Each generation is
replayed into a fresh :class:`~engine.runtime.executor.WorkflowExecution`, exactly as a
processor rebuilds a cold instance; the runtime compares every decision the code asks for
with the recorded one and raises :class:`NonDeterminismError` at the first difference.
Replay never runs an inline step or an activity: their recorded results are used, so the
check has no side effects and needs no workers.

The checker is streaming: a generation is replayed as soon as its last event (completion or
continue-as-new) arrives, so memory holds only the generations still open.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.config.settings import Settings
from engine.core.errors import NonDeterminismError, NotRegisteredError, TurnstileError
from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    TurnStarted,
)
from engine.runtime.driver import DEFAULT_STEP_BUDGET
from engine.runtime.executor import WorkflowExecution
from engine.runtime.registry import Registry
from engine.services.watchdog import REPLAY_EVENTS_PER_BUDGET, TurnWatchdog

__all__ = ["DIVERGED", "ERROR", "OK", "SKIPPED", "ReplayChecker", "ReplayReport", "ReplayResult"]

OK = "ok"
DIVERGED = "diverged"
ERROR = "error"
SKIPPED = "skipped"


@dataclass(slots=True)
class ReplayResult:
    """One instance's verdict; ``sequence``/``recorded``/``attempted`` name the divergence."""

    instance_id: str
    name: str = ""
    version: str = ""
    outcome: str = OK
    events: int = 0
    generations: int = 0
    generation: int | None = None
    sequence: int | None = None
    recorded: str = ""
    attempted: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "name": self.name,
            "version": self.version,
            "outcome": self.outcome,
            "events": self.events,
            "generations": self.generations,
            "generation": self.generation,
            "sequence": self.sequence,
            "recorded": self.recorded,
            "attempted": self.attempted,
            "detail": self.detail,
        }

    def line(self) -> str:
        where = f"generation {self.generation}, event #{self.sequence}"
        if self.outcome == DIVERGED:
            return (
                f"DIVERGED {self.instance_id} ({self.name}) at {where}: recorded "
                f"{self.recorded}, the code now asks for {self.attempted}"
            )
        if self.outcome == ERROR:
            return f"ERROR    {self.instance_id} ({self.name}) at {where}: {self.detail}"
        if self.outcome == SKIPPED:
            return f"skipped  {self.instance_id} ({self.name}): {self.detail}"
        return f"ok       {self.instance_id} ({self.name}): {self.events} events"


@dataclass(slots=True)
class ReplayReport:
    results: list[ReplayResult] = field(default_factory=list)
    events: int = 0
    generations: int = 0
    replay_s: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def ok(self) -> bool:
        return not any(r.outcome in (DIVERGED, ERROR) for r in self.results)

    @property
    def problems(self) -> list[ReplayResult]:
        return [r for r in self.results if r.outcome in (DIVERGED, ERROR)]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "instances": len(self.results),
            "events": self.events,
            "generations": self.generations,
            "diverged": self.count(DIVERGED),
            "errors": self.count(ERROR),
            "skipped": self.count(SKIPPED),
            "replay_seconds": round(self.replay_s, 6),
            "results": [r.to_json() for r in self.results],
        }


@dataclass(slots=True)
class _Open:
    result: ReplayResult
    events: list[HistoryEvent] = field(default_factory=list)


class ReplayChecker:
    """Feed history events in topic order (any mix of instances); then :meth:`finish`.

    ``skip_unregistered``: instances of workflows the registry does not know are reported
    as skipped instead of as errors (check one workflow's change among many).
    """

    def __init__(
        self,
        registry: Registry,
        *,
        skip_unregistered: bool = False,
        step_budget: int = DEFAULT_STEP_BUDGET,
        watchdog: TurnWatchdog | None = None,
    ) -> None:
        self.registry = registry
        self.skip_unregistered = skip_unregistered
        self.step_budget = step_budget
        #: Bounds each replay like the processor bounds a turn: history recorded for an
        #: instance the watchdog failed (``while True: pass``) must not hang the check.
        self.watchdog = watchdog or TurnWatchdog(Settings().turn_budget_ms)
        self._open: dict[str, _Open] = {}
        self._report = ReplayReport()

    def feed(self, event: HistoryEvent) -> None:
        item = self._open.get(event.instance_id)
        if item is None:
            item = self._open[event.instance_id] = _Open(ReplayResult(event.instance_id))
            self._report.results.append(item.result)
        self._report.events += 1
        item.result.events += 1
        if item.result.outcome != OK:
            return  # already diverged, failed or skipped: its verdict stands
        body = event.body
        if isinstance(body, ExecutionStarted):
            if _holds_more_than_turn_starts(item.events):
                self._replay(item)  # a generation that never ended: replay it on its own
            item.result.name, item.result.version = body.name, body.version
        item.events.append(event)
        if isinstance(body, ExecutionCompleted | ContinuedAsNew):
            self._replay(item)

    def feed_all(self, events: Iterable[HistoryEvent]) -> None:
        for event in events:
            self.feed(event)

    def finish(self) -> ReplayReport:
        """Replay the generations still open (running instances) and return the report."""
        for item in self._open.values():
            self._replay(item)
        self._open.clear()
        return self._report

    def _replay(self, item: _Open) -> None:
        events, item.events = item.events, []
        if not events or item.result.outcome != OK:
            return
        self._report.generations += 1
        item.result.generations += 1
        started = time.perf_counter()
        try:
            self._replay_generation(item.result, events)
        finally:
            self._report.replay_s += time.perf_counter() - started

    def _replay_generation(self, result: ReplayResult, events: list[HistoryEvent]) -> None:
        first = events[0]
        execution = WorkflowExecution(
            self.registry, first.instance_id, step_budget=self.step_budget
        )
        try:
            self.watchdog.run(
                lambda: execution.replay(events),
                f"the replay of {first.instance_id!r}",
                scale=len(events) / REPLAY_EVENTS_PER_BUDGET,
            )
        except NonDeterminismError as exc:
            _set(result, DIVERGED, first.generation, exc.sequence, str(exc))
            result.recorded, result.attempted = exc.recorded, exc.attempted
        except NotRegisteredError as exc:
            self._unregistered(result, first, exc)
        except TurnstileError as exc:
            _set(result, ERROR, first.generation, first.sequence, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            detail = f"the workflow code raised {type(exc).__name__}: {exc}"
            _set(result, ERROR, first.generation, first.sequence, detail)
        finally:
            execution.close()

    def _unregistered(
        self, result: ReplayResult, first: HistoryEvent, exc: NotRegisteredError
    ) -> None:
        what = f"workflow {result.name!r}" + (
            f" version {result.version!r}" if result.version else ""
        )
        if self.skip_unregistered:
            detail = f"{what} is not defined by the code checked"
            _set(result, SKIPPED, first.generation, first.sequence, detail)
            return
        detail = (
            f"{what} is not defined by the code checked ({exc}); pass the module that defines "
            f"it with --module, or --skip-unregistered to leave such instances out"
        )
        _set(result, ERROR, first.generation, first.sequence, detail)


def _holds_more_than_turn_starts(events: list[HistoryEvent]) -> bool:
    """Whether the open events are more than the turn start a new run begins with.

    A new run's turn opens with ``TurnStarted`` before its ``ExecutionStarted``; that event
    belongs to the new generation. Anything else open at a start is an unfinished generation.
    """
    return any(type(e.body) is not TurnStarted for e in events)


def _set(result: ReplayResult, outcome: str, generation: int, sequence: int, detail: str) -> None:
    result.outcome = outcome
    result.generation = generation
    result.sequence = sequence
    result.detail = detail
