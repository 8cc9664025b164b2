"""W3C trace context (``traceparent``) as plain strings, and the ids of a run's spans.

Trace context travels in Kafka record headers (``traceparent``) and is recorded in history
(``ExecutionStarted.traceparent``), so the core only ever sees the W3C text form:
``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``. No tracing library is imported
here; ``engine.adapters.tracing`` turns these values into OpenTelemetry spans.

A run's span id is derived, not drawn: ``run_span_id(trace id, instance, generation)``. So
every replica that ever owns the instance (after a restart, a restore or a takeover) names
the same run span, and the turns it runs are children of it without anything but the start
event being stored. A start that came without trace context is recorded with the run's own
span id as its ``traceparent`` (the run is then the root of its trace).
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

#: The record header that carries a ``traceparent`` (as in W3C trace context over HTTP).
TRACEPARENT = "traceparent"

#: version-trace id-span id-flags (lower-case hex; a later version may add fields after).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class SpanContext(NamedTuple):
    """One span's identity: ``trace_id`` (32 hex), ``span_id`` (16 hex), sampled flag.

    Tuples, not dataclasses, because the processor makes a few per turn."""

    trace_id: str
    span_id: str
    sampled: bool = True

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"

    @property
    def header(self) -> tuple[str, bytes]:
        """This context as a record header."""
        return (TRACEPARENT, self.traceparent.encode())


def parse_traceparent(text: str) -> SpanContext | None:
    """The context in a ``traceparent`` value; None when it is absent or malformed (a bad
    header from a foreign producer is ignored, never an error: tracing is best effort)."""
    match = _TRACEPARENT.fullmatch(text.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags = match.group(1, 2, 3, 4)
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and match.end(4) != len(text.strip()):
        return None  # version 00 has exactly four fields
    return SpanContext(trace_id, span_id, bool(int(flags, 16) & 1))


def from_headers(headers: tuple[tuple[str, bytes], ...]) -> SpanContext | None:
    """The context a record carries in its ``traceparent`` header, if any."""
    for name, value in headers:
        if name == TRACEPARENT:
            try:
                return parse_traceparent(value.decode("ascii"))
            except UnicodeDecodeError:
                return None
    return None


def run_span_id(trace_id: str, instance_id: str, generation: int) -> str:
    """The span id of one run (one generation) of an instance: a pure function, so that
    whichever replica ends the run emits the span the turns were parented to."""
    digest = hashlib.sha256(f"{trace_id}/{instance_id}/{generation}".encode()).hexdigest()
    span_id = digest[:16]
    return span_id if span_id != "0" * 16 else "1" * 16


class RunContext(NamedTuple):
    """Where one run sits in its trace: its own span, and the span it is a child of
    (None: the run is the trace's root)."""

    span: SpanContext
    parent_span_id: str | None


def run_context(traceparent: str, instance_id: str, generation: int) -> RunContext | None:
    """The run's span context from its start event's ``traceparent`` (None: not traced)."""
    recorded = parse_traceparent(traceparent) if traceparent else None
    if recorded is None:
        return None
    own = run_span_id(recorded.trace_id, instance_id, generation)
    parent = None if recorded.span_id == own else recorded.span_id
    return RunContext(SpanContext(recorded.trace_id, own, recorded.sampled), parent)


def root_traceparent(
    trace_id: str, instance_id: str, generation: int, *, sampled: bool = True
) -> str:
    """What a start without trace context records: a new trace whose root is the run
    (not sampled: the run and its turns emit no span)."""
    span_id = run_span_id(trace_id, instance_id, generation)
    return SpanContext(trace_id, span_id, sampled).traceparent


__all__ = [
    "TRACEPARENT",
    "RunContext",
    "SpanContext",
    "from_headers",
    "parse_traceparent",
    "root_traceparent",
    "run_context",
    "run_span_id",
]
