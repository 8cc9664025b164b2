"""Traces on the real broker: trace context travels in Kafka record headers from the
client's start, through the command, the activity tasks and results and the child's start
and result, into one trace; a restarted replica emits no run span twice."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine import WorkflowContext, activity, workflow
from engine.adapters.kafka.processor import ProcessorRunner
from engine.adapters.kafka.worker import KafkaWorker
from engine.adapters.tracing import Tracing, tracing_with
from engine.core.history import ExecutionStarted, RuntimeStatus
from engine.core.tracecontext import TRACEPARENT, SpanContext, parse_traceparent
from engine.runtime.registry import default_registry
from tests.engine_harness import (
    RunningEngine,
    ThreadProcess,
    histories_of,
    read_topic,
    running_engine,
    wait_until,
)

pytestmark = pytest.mark.kafka


@activity(name="trace.double")
def double(x: int) -> int:
    return 2 * x


@workflow(name="trace.child")
async def traced_child(ctx: WorkflowContext, x: int) -> int:
    return int(await ctx.call_activity(double, x))


@workflow(name="trace.parent")
async def traced_parent(ctx: WorkflowContext, x: int) -> int:
    y = int(await ctx.call_activity(double, x))
    return int(await ctx.call_child_workflow(traced_child, y))


@workflow(name="trace.waits")
async def waits(ctx: WorkflowContext, x: int) -> int:
    bump = int(await ctx.wait_for_event("go"))
    return int(await ctx.call_activity(double, x + bump))


@functools.cache
def _tracing() -> tuple[Tracing, InMemorySpanExporter]:
    """One SDK provider for the test process, also the global one (the client's start
    span goes through the global API, as in a user's application)."""
    exporter = InMemorySpanExporter()
    tracing = tracing_with(SimpleSpanProcessor(exporter))
    otel_trace.set_tracer_provider(tracing.provider)
    return tracing, exporter


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    _, exporter = _tracing()
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def engine(kafka_bootstrap: str, tmp_path: Path) -> Iterator[RunningEngine]:
    with running_engine(
        kafka_bootstrap, partitions=2, replicas=0, workers=0, state_dir=tmp_path
    ) as engine:
        yield engine


def _replica(engine: RunningEngine, name: str, tmp_path: Path) -> ThreadProcess:
    settings = replace(engine.settings, replica_id=name, state_dir=str(tmp_path / name))
    runner = ProcessorRunner(settings, default_registry, tracing=_tracing()[0].hook)
    return ThreadProcess(name, runner.run).start()


def _worker(engine: RunningEngine) -> ThreadProcess:
    worker = KafkaWorker(engine.settings, default_registry, tracing=_tracing()[0].hook)
    return ThreadProcess("worker", worker.run).start()


def _named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _stop(*handles: ThreadProcess) -> None:
    for handle in handles:
        handle.stop()
    for handle in handles:
        assert handle.error is None, handle.error


def test_client_start_turns_attempts_and_child_are_one_trace(
    engine: RunningEngine, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    handles = [_replica(engine, "processor-0", tmp_path), _worker(engine)]
    try:
        run = engine.client.start(traced_parent, 5)
        assert engine.client.wait_for_completion(run, 120).output == 20
        wait_until(
            lambda: len(_named(exporter.get_finished_spans(), "run ")) == 2,
            what="both run spans",
        )
    finally:
        _stop(*handles)
    spans = exporter.get_finished_spans()
    (start,) = _named(spans, "start trace.parent")
    assert start.parent is None and start.attributes["turnstile.instance.id"] == run
    assert start.kind is otel_trace.SpanKind.PRODUCER
    assert start.context is not None
    assert {s.context.trace_id for s in spans if s.context} == {start.context.trace_id}
    runs = {s.attributes["turnstile.workflow.name"]: s for s in _named(spans, "run ")}
    assert _parent(runs["trace.parent"]) == _id(start)
    turns = _named(spans, "turn ")
    turn_ids = {_id(t) for t in turns}
    assert all(_parent(t) == _id(runs[str(t.attributes["turnstile.workflow.name"])]) for t in turns)
    assert _parent(runs["trace.child"]) in turn_ids  # through the child's start record
    attempts = _named(spans, "activity trace.double")
    assert len(attempts) == 2 and all(_parent(a) in turn_ids for a in attempts)
    # the results came back with the attempts' context: the turns applying them link to them
    linked = {link.context.span_id for t in turns for link in t.links}
    assert {_id(a) for a in attempts} <= linked
    assert len({_id(s) for s in spans}) == len(spans)
    # the command carried the client's context and the start event recorded it
    assert start.context is not None
    sent = SpanContext(f"{start.context.trace_id:032x}", f"{_id(start):016x}")
    commands = read_topic(engine.bootstrap, engine.topics.commands)
    headers = [r.headers.get(TRACEPARENT, b"") for r in commands if r.key == run.encode()]
    assert [parse_traceparent(h.decode()) for h in headers] == [sent]
    history = histories_of(read_topic(engine.bootstrap, engine.topics.history))[run]
    started = [e.body for _, e in history if isinstance(e.body, ExecutionStarted)]
    assert [parse_traceparent(s.traceparent) for s in started] == [sent]


def test_a_restarted_replica_emits_no_run_span_twice(
    engine: RunningEngine, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    worker = _worker(engine)
    first = _replica(engine, "processor-0", tmp_path)
    run = engine.client.start(waits, 1)
    try:
        wait_until(
            lambda: _named(exporter.get_finished_spans(), "turn trace.waits"),
            what="the first turn's span",
        )
        # the span is exported once its batch committed; the status view may lag behind
        wait_until(
            lambda: (s := engine.client.get(run)) is not None and s.status is RuntimeStatus.RUNNING,
            what="the instance to show RUNNING",
        )
    finally:
        first.stop()
    assert first.error is None, first.error
    second = _replica(engine, "processor-1", tmp_path)  # restores from the changelogs
    try:
        engine.client.raise_event(run, "go", 2)
        assert engine.client.wait_for_completion(run, 120).output == 6
        wait_until(lambda: _named(exporter.get_finished_spans(), "run "), what="the run span")
    finally:
        _stop(second, worker)
    spans = exporter.get_finished_spans()
    (run_span,) = _named(spans, "run trace.waits")
    assert run_span.attributes["turnstile.run.status"] == "COMPLETED"
    turns = _named(spans, "turn trace.waits")
    assert len(turns) >= 2 and {_parent(t) for t in turns} == {_id(run_span)}
    assert len({_id(s) for s in spans}) == len(spans)
