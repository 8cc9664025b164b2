"""OpenTelemetry traces: the processor's and the worker's spans, and the client's start.

Optional: ``pip install 'turnstile-engine[tracing]'``. Without the extra, or without an
exporter configured, nothing here changes what the engine does: :func:`tracing_from_env`
answers None, the services keep their ``NoTracing`` hook, and :func:`current_headers`
adds no header.

Configuration is OpenTelemetry's own: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``,
``none``; a comma-separated list), ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP over HTTP/protobuf, port 4318),
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` for the batch
processor, ``OTEL_SDK_DISABLED``. Tracing is on when an exporter is named or an OTLP
endpoint is set.

The services decide finished spans with W3C ids (``engine.services.tracing.SpanRecord``:
a run's span id is derived from its history, so no replica emits it twice);
:class:`OtelTraceHook` hands each one to the span processor as an SDK ``ReadableSpan``,
which is what a span the SDK itself ended looks like to an exporter.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from engine import __version__
from engine.core.errors import ConfigurationError
from engine.core.tracecontext import TRACEPARENT, parse_traceparent
from engine.runtime.registry import default_registry
from engine.services.tracing import SpanRecord

log = logging.getLogger("engine.tracing")

try:  # the API alone is enough for the client's start span (the user's SDK records it)
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    otel_trace = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

F = TypeVar("F", bound=Callable[..., Any])

#: The instrumentation scope of every span the engine makes.
SCOPE = "turnstile"

_EXPORTERS = ("otlp", "console", "none")


def installed() -> bool:
    """Whether the OpenTelemetry SDK (the ``tracing`` extra) can be imported."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def wanted(environ: Mapping[str, str]) -> list[str]:
    """The exporters the OTEL_* variables ask for ([] = tracing off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    if not names and (
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        names = ["otlp"]
    unknown = [n for n in names if n not in _EXPORTERS]
    if unknown:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; Turnstile exports traces "
            f"with {', '.join(_EXPORTERS)} (set it to one of those, or unset it)"
        )
    return [n for n in names if n != "none"]


@dataclass
class Tracing:
    """What a process configured: the SDK provider, its span processor, and the hook the
    processor and the worker report to."""

    provider: Any
    processor: Any
    hook: OtelTraceHook

    def shutdown(self) -> None:
        """Flush what is buffered and stop exporting (at the end of the process)."""
        self.provider.shutdown()


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the OTEL_* variables configure it, installed as the process's global
    tracer provider (so the client's start spans go to the same place); None when they
    ask for none. Asked for without the extra installed: a warning, and no tracing."""
    env = os.environ if environ is None else environ
    names = wanted(env)
    if not names:
        return None
    if not installed():
        log.warning(
            "OTEL_* variables ask for traces, but OpenTelemetry is not installed: "
            "pip install 'turnstile-engine[tracing]' (running without traces)"
        )
        return None
    exporters = [_exporter(name) for name in names]
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    processors = [BatchSpanProcessor(e) for e in exporters]
    tracing = tracing_with(processors[0], extra=processors[1:])
    assert otel_trace is not None
    otel_trace.set_tracer_provider(tracing.provider)
    log.info("exporting traces with %s", ", ".join(names))
    return tracing


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigurationError(
            "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: "
            "pip install 'turnstile-engine[tracing]'"
        ) from exc
    return OTLPSpanExporter()


def tracing_with(processor: Any, *, extra: list[Any] | None = None, sampler: Any = None) -> Tracing:
    """Tracing through a given SDK span processor (``SimpleSpanProcessor`` around the
    SDK's ``InMemorySpanExporter`` in tests; a batch processor in production); the
    sampler defaults to the SDK's (``OTEL_TRACES_SAMPLER``)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "turnstile"}))
    provider = TracerProvider(resource=resource, sampler=sampler)
    for each in [processor, *(extra or [])]:
        provider.add_span_processor(each)
    return Tracing(provider, processor, OtelTraceHook(provider, [processor, *(extra or [])]))


class OtelTraceHook:
    """The services' :class:`~engine.services.tracing.TraceHook`, exporting through an
    OpenTelemetry SDK span processor."""

    enabled = True

    def __init__(self, provider: Any, processors: list[Any]) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
        from opentelemetry.trace.status import Status, StatusCode

        self._resource = provider.resource
        self._sampler = provider.sampler  # OTEL_TRACES_SAMPLER, parent-based always-on by default
        self._processors = processors
        self._scope = InstrumentationScope(SCOPE, __version__)
        # the SDK's types, looked up once: export runs on the processor's loop
        self._span, self._context, self._link = ReadableSpan, SpanContext, Link
        self._status, self._error_code = Status, StatusCode.ERROR
        self._ok = Status()
        self._flags = TraceFlags(TraceFlags.SAMPLED)
        self._internal, self._consumer = SpanKind.INTERNAL, SpanKind.CONSUMER

    def new_id(self, nbytes: int) -> str:
        # what the SDK's own RandomIdGenerator does: ids need to be unique, not secret,
        # and a syscall per id (``secrets``) costs more than the rest of a span; the
        # module's generator is reseeded in a forked child, so children never repeat ids
        bits = random.getrandbits(8 * nbytes) or 1
        return f"{bits:0{2 * nbytes}x}"

    def now_ns(self) -> int:
        return time.time_ns()

    def sampled(self, trace_id: str) -> bool:
        result = self._sampler.should_sample(None, int(trace_id, 16), "run")
        return bool(result.decision.is_sampled())

    def export(self, spans: list[SpanRecord]) -> None:
        for record in spans:
            span = self._readable(record)
            for processor in self._processors:
                processor.on_end(span)

    def _readable(self, record: SpanRecord) -> Any:
        trace_id = int(record.trace_id, 16)
        context, flags = self._context, self._flags
        parent_id = record.parent_span_id
        parent = None if parent_id is None else context(trace_id, int(parent_id, 16), False, flags)
        attributes = record.attributes
        status = self._ok
        if record.error:
            status = self._status(self._error_code, record.error)
            attributes = {**attributes, "turnstile.failure.type": record.error}
        links = [self._link(context(int(t, 16), int(s, 16), True, flags)) for t, s in record.links]
        return self._span(
            record.name,
            context(trace_id, int(record.span_id, 16), False, flags),
            parent,
            resource=self._resource,
            attributes=attributes,
            links=links,
            kind=self._consumer if record.name.startswith("activity") else self._internal,
            status=status,
            start_time=record.start_ns,
            end_time=max(record.end_ns, record.start_ns),
            instrumentation_scope=self._scope,
        )


def trace_header(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """Only the ``traceparent`` header of a consumed record's headers (confluent-kafka's
    list of pairs, or None): all the worker needs of them."""
    for name, value in headers or ():
        if name == TRACEPARENT and isinstance(value, bytes):
            return ((TRACEPARENT, value),)
    return ()


# --- the client -------------------------------------------------------------------------------


def current_headers() -> list[tuple[str, str | bytes | None]]:
    """The caller's current span as a ``traceparent`` header ([] when there is none, or
    OpenTelemetry is not installed): what a command record carries."""
    if otel_trace is None:
        return []
    context = otel_trace.get_current_span().get_span_context()
    if not context.is_valid:
        return []
    carrier: dict[str, str] = {}
    assert TraceContextTextMapPropagator is not None
    TraceContextTextMapPropagator().inject(carrier)
    value = carrier.get(TRACEPARENT)
    return [(TRACEPARENT, value.encode())] if value and parse_traceparent(value) else []


@contextmanager
def client_span(name: str, workflow: str) -> Iterator[Any]:
    """A PRODUCER span around a client's start (through the global tracer provider: the
    process's own when it set one up, a no-op otherwise); yields the span (None when
    OpenTelemetry is not installed) so the caller can add the instance id."""
    if otel_trace is None:
        yield None
        return
    tracer = otel_trace.get_tracer(SCOPE, __version__)
    with tracer.start_as_current_span(
        f"{name} {workflow}",
        kind=otel_trace.SpanKind.PRODUCER,
        attributes={"turnstile.workflow.name": workflow},
    ) as span:
        yield span


def traced_start(start: F) -> F:
    """Wrap a client's ``start(workflow, input, **options)`` in its start span; the
    command's ``traceparent`` header (:func:`current_headers`) is that span."""

    @functools.wraps(start)
    def wrapper(client: Any, workflow: Any, *args: Any, **options: Any) -> Any:
        with client_span("start", _workflow_name(workflow)) as span:
            handle = start(client, workflow, *args, **options)
            if span is not None:
                span.set_attribute("turnstile.instance.id", str(handle))
        return handle

    return cast(F, wrapper)


def _workflow_name(workflow: Any) -> str:
    """A start's workflow as its registered name (the span's name; never a payload)."""
    return default_registry.workflow_name(workflow)


__all__ = [
    "SCOPE",
    "OtelTraceHook",
    "Tracing",
    "client_span",
    "current_headers",
    "installed",
    "trace_header",
    "traced_start",
    "tracing_from_env",
    "tracing_with",
    "wanted",
]
