"""The tracing hook: where the processor's and the worker's spans go.

The services decide spans as plain :class:`SpanRecord` values with W3C ids in hex (see
``engine.core.tracecontext``); ``engine.adapters.tracing`` implements :class:`TraceHook`
with OpenTelemetry, so nothing below the adapters imports a tracing library. Without
tracing the hook is :class:`NoTracing` and costs one attribute read per turn or attempt.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

#: A span attribute's value: names, ids and counts only (bounded, never a payload).
AttributeValue = str | int | bool


class SpanRecord(NamedTuple):
    """A finished span: a run, a turn or an activity attempt, with W3C ids as hex.

    The processor's state machine collects them and the hook exports them once the
    batch that decided them has committed (a batch that is dropped and redone never
    emits its spans twice); the worker exports an attempt's span when it ends. A tuple,
    because the processor makes two per short run."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    #: The failure type when the span ended in error ('' for success).
    error: str = ""
    #: Spans this one follows from, as (trace id, span id): the attempts, children and
    #: callers whose records fed a turn.
    links: tuple[tuple[str, str], ...] = ()


class TraceHook(Protocol):
    """Where spans go (``engine.adapters.tracing`` exports them through OpenTelemetry).
    With tracing off the hook is :class:`NoTracing`, and the services do nothing but
    read ``enabled``."""

    @property
    def enabled(self) -> bool: ...

    def new_id(self, nbytes: int) -> str:
        """A random id of ``nbytes`` bytes as hex (16 for a trace id, 8 for a span id)."""
        ...

    def now_ns(self) -> int:
        """Wall-clock nanoseconds since the epoch (span times)."""
        ...

    def sampled(self, trace_id: str) -> bool:
        """Whether a new trace the engine starts (a run started without context) is
        recorded (``OTEL_TRACES_SAMPLER``; traces that came with context keep their flag)."""
        ...

    def export(self, spans: list[SpanRecord]) -> None:
        """Finished spans (a committed batch's, or one attempt's)."""
        ...


class NoTracing:
    """The hook when nothing collects traces."""

    enabled = False

    def new_id(self, nbytes: int) -> str:
        return "0" * (2 * nbytes)

    def now_ns(self) -> int:
        return 0

    def sampled(self, trace_id: str) -> bool:
        return False

    def export(self, spans: list[SpanRecord]) -> None:
        return None


__all__ = ["AttributeValue", "NoTracing", "SpanRecord", "TraceHook"]
