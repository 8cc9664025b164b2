"""The processor's spans: one per committed turn, one per run (generation) when it ends.

Trace context comes from history, never from memory: a run's context is its start event's
``traceparent`` (``engine.core.tracecontext``), and the run span's id is derived from it,
so any replica, after a restore or a takeover, parents its turns to the same run span and
the replica that ends the run emits it, once. Spans join the :class:`Batch` and are
exported only after its transaction commits; a batch that is rolled back and done again
emits nothing the first time, and a replay (a cold instance rebuilt from history) records
no new events, so it emits nothing at all.

While a traced turn's decisions become records, ``Batch.headers`` holds the turn's
context: the activity tasks, child starts, child results and events it sends carry it as
their ``traceparent`` header, so the worker's attempt span and a child's run span join the
trace. With tracing off (``NoTracing``) every function here returns after one attribute
read.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.tracecontext import (
    RunContext,
    SpanContext,
    from_headers,
    root_traceparent,
    run_context,
)
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded
from engine.services.tracing import AttributeValue, SpanRecord


def start_traceparent(b: Batch, instance_id: str, generation: int) -> str:
    """The trace context a new run records: the start record's ``traceparent`` header
    (a client's start span, a parent's turn), else, with tracing on, a new trace whose
    root is the run itself; '' when neither, and when the sampler drops the new trace: an
    unsampled run emits no span and sends no context, so recording one would only cost
    every later turn a parse."""
    record = b.current
    context = from_headers(record.headers) if record is not None else None
    if context is not None:
        return context.traceparent
    hook = b.env.tracing
    if not hook.enabled:
        return ""
    trace_id = hook.new_id(16)
    if not hook.sampled(trace_id):
        return ""
    return root_traceparent(trace_id, instance_id, generation)


def note_link(b: Batch, item: Loaded) -> None:
    """The record being handled feeds the instance's next turn: with tracing on, that
    turn's span links to the span the record names (an attempt, a child's last turn, the
    caller of a raise)."""
    if not b.env.tracing.enabled or b.current is None:
        return
    context = from_headers(b.current.headers)
    if context is not None and len(item.trace_links) < MAX_LINKS:
        item.trace_links.append((context.trace_id, context.span_id))


#: Links one turn span keeps at most (a turn fed by a large batch of results stays small).
MAX_LINKS = 32


def turn_ends(b: Batch, item: Loaded) -> None:
    """After the turn: what is sent from here on carries no turn's context."""
    b.headers = ()
    if item.trace_links:
        item.trace_links = []


def turn_begins(b: Batch, item: Loaded) -> None:
    """Note the turn's start (before a cold replay, which is part of the turn)."""
    b.headers = ()
    if not b.env.tracing.enabled:
        return
    b.turn_began_ns = b.env.tracing.now_ns()
    execution = item.execution
    history = execution.history if execution is not None else ()
    b.run_began_ms = history[0].timestamp_ms if history else None


def stepping(b: Batch, history: Sequence[HistoryEvent]) -> None:
    """Right before the step: when the running generation began (known now that a cold
    instance has been replayed), for the run span should this turn end it."""
    if b.env.tracing.enabled and history:
        b.run_began_ms = history[0].timestamp_ms


def turn_recorded(b: Batch, item: Loaded, events: list[HistoryEvent]) -> None:
    """A turn's events were recorded: its span, and the span of every run it ended, join
    the batch, and what the turn sends from here on carries the turn's context."""
    hook = b.env.tracing
    if not hook.enabled or not events:
        return
    run = _run_of(item, events, events[0].generation)
    if run is None or not run.span.sampled:
        return
    meta = item.meta
    turn = SpanContext(run.span.trace_id, hook.new_id(8))
    now_ns = hook.now_ns()
    attributes: dict[str, AttributeValue] = {
        "turnstile.workflow.name": meta.name,
        "turnstile.instance.id": meta.instance_id,
        "turnstile.run.generation": events[0].generation,
        "turnstile.turn.events": len(events),
        "turnstile.partition": b.partition,
    }
    began_ns = b.turn_began_ns or now_ns
    b.spans.append(
        SpanRecord(
            f"turn {meta.name}",
            turn.trace_id,
            turn.span_id,
            run.span.span_id,
            began_ns,
            now_ns,
            attributes,
            links=tuple(item.trace_links),
        )
    )
    b.headers = (turn.header,)
    generation = events[0].generation
    for event in events:
        if type(event.body) in _RUN_ENDS:
            known = run if event.generation == generation else None
            _end_run(b, item, events, event, now_ns, known)


def _end_run(
    b: Batch,
    item: Loaded,
    events: list[HistoryEvent],
    event: HistoryEvent,
    now_ns: int,
    run: RunContext | None,
) -> None:
    """The span of the run (generation) that ``event`` ended."""
    body = event.body
    if isinstance(body, ExecutionCompleted):
        status, error = body.status, body.failure.type if body.failure is not None else ""
    elif isinstance(body, ContinuedAsNew):
        status, error = RuntimeStatus.CONTINUED_AS_NEW, ""
    else:
        return
    run = run or _run_of(item, events, event.generation)
    if run is None:
        return
    meta = item.meta
    began_ms = _began_ms(events, event.generation) or b.run_began_ms or meta.created_ms
    attributes: dict[str, AttributeValue] = {
        "turnstile.workflow.name": meta.name,
        "turnstile.workflow.version": meta.version,
        "turnstile.instance.id": meta.instance_id,
        "turnstile.run.generation": event.generation,
        "turnstile.run.status": status.value,
    }
    if meta.parent_instance_id is not None:
        attributes["turnstile.parent.instance.id"] = meta.parent_instance_id
    if status is RuntimeStatus.FAILED and not error:
        error = "Failed"
    b.spans.append(
        SpanRecord(
            f"run {meta.name}",
            run.span.trace_id,
            run.span.span_id,
            run.parent_span_id,
            min(began_ms * 1_000_000, now_ns),
            now_ns,
            attributes,
            error,
        )
    )


#: The history events that end a run (one generation).
_RUN_ENDS = (ExecutionCompleted, ContinuedAsNew)


def _run_of(item: Loaded, events: list[HistoryEvent], generation: int) -> RunContext | None:
    """The context of the instance's run ``generation``: every generation of one run
    records the same ``traceparent`` (continue-as-new copies its start event)."""
    traceparent = next(
        (e.body.traceparent for e in events if isinstance(e.body, ExecutionStarted)), None
    )
    if traceparent is None:
        execution = item.execution
        started = execution.started if execution is not None else None
        traceparent = started.traceparent if started is not None else ""
    return run_context(traceparent, item.meta.instance_id, generation)


def _began_ms(events: list[HistoryEvent], generation: int) -> int | None:
    for event in events:
        if event.generation == generation and isinstance(event.body, ExecutionStarted):
            return event.timestamp_ms
    return None


def committed(b: Batch) -> None:
    """The batch committed: its spans leave for the exporter."""
    if b.spans:
        b.env.tracing.export(b.spans)
        b.spans = []


__all__ = [
    "committed",
    "note_link",
    "start_traceparent",
    "stepping",
    "turn_begins",
    "turn_ends",
    "turn_recorded",
]
