"""The span of one activity attempt, as the worker ran it.

The activity task's ``traceparent`` header names the turn that scheduled the attempt; the
attempt's span is its child, and the result record carries the attempt's own context, so
the processor's turn that applies the result sits in the same trace. Without tracing
(``NoTracing``) nothing is read or added.
"""

from __future__ import annotations

from engine.core.messages import ActivityTask
from engine.core.tracecontext import SpanContext, from_headers
from engine.services.records import RawRecord
from engine.services.tracing import AttributeValue, SpanRecord, TraceHook

Headers = tuple[tuple[str, bytes], ...]


def attempt_parent(hook: TraceHook, record: RawRecord) -> SpanContext | None:
    """The turn an attempt's task record names as its trace parent (None: untraced)."""
    if not hook.enabled:
        return None
    parent = from_headers(record.headers)
    return parent if parent is not None and parent.sampled else None


def attempt_span(
    hook: TraceHook,
    task: ActivityTask,
    parent: SpanContext | None,
    began_ns: int,
    took_s: float,
    outcome: str,
    failure_type: str,
) -> Headers:
    """Export the attempt's span; returns the result record's ``traceparent`` header."""
    if parent is None or not hook.enabled:
        return ()
    span = SpanContext(parent.trace_id, hook.new_id(8))
    attributes: dict[str, AttributeValue] = {
        "turnstile.activity.name": task.name,
        "turnstile.activity.attempt": task.attempt,
        "turnstile.activity.outcome": outcome,
        "turnstile.instance.id": task.instance_id,
        "turnstile.task.id": task.task_id,
        "turnstile.run.generation": task.generation,
    }
    began_ns = began_ns or hook.now_ns()
    hook.export(
        [
            SpanRecord(
                f"activity {task.name}",
                span.trace_id,
                span.span_id,
                parent.span_id,
                began_ns,
                began_ns + int(took_s * 1e9),
                attributes,
                failure_type,
            )
        ]
    )
    return (span.header,)


__all__ = ["attempt_parent", "attempt_span"]
