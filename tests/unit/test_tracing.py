"""Traces without a broker: the trace context helpers, the processor's run and turn spans
and the worker's attempt spans on the test engine, exported through the OpenTelemetry
SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from engine import Registry, RetryPolicy, WorkflowContext
from engine.adapters import tracing as tracing_module
from engine.adapters.tracing import tracing_with, wanted
from engine.codec import encode_message, instance_key
from engine.core.errors import ConfigurationError
from engine.core.history import ExecutionStarted
from engine.core.messages import StartWorkflow
from engine.core.payloads import to_payload
from engine.core.tracecontext import (
    TRACEPARENT,
    SpanContext,
    from_headers,
    parse_traceparent,
    root_traceparent,
    run_context,
    run_span_id,
)
from engine.testing import TestEngine

app = Registry()


@app.activity(name="t.double")
def double(x: int) -> int:
    return 2 * x


@app.activity(name="t.flaky")
def flaky(x: int) -> int:
    raise ValueError("not today")


@app.workflow(name="t.child")
async def child(ctx: WorkflowContext, x: int) -> int:
    return int(await ctx.call_activity(double, x))


@app.workflow(name="t.parent")
async def parent(ctx: WorkflowContext, x: int) -> int:
    y = int(await ctx.call_activity(double, x))
    return int(await ctx.call_child_workflow(child, y))


@app.workflow(name="t.fails")
async def fails(ctx: WorkflowContext, x: int) -> int:
    return int(
        await ctx.call_activity(flaky, x, retry=RetryPolicy(max_attempts=2, initial_interval=0.1))
    )


@app.workflow(name="t.loops")
async def loops(ctx: WorkflowContext, n: int) -> int:
    if n > 0:
        ctx.continue_as_new(n - 1)
    return n


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traced(exporter: InMemorySpanExporter) -> Iterator[TestEngine]:
    tracing = tracing_with(SimpleSpanProcessor(exporter))
    with TestEngine(app, tracing=tracing.hook) as engine:
        yield engine
    tracing.shutdown()


def _by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# --- trace context ---------------------------------------------------------------------------


def test_traceparent_parses_and_refuses_malformed_values() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(good) == SpanContext(
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True
    )
    assert parse_traceparent(good[:-1] + "0") is not None
    assert not parse_traceparent(good[:-2] + "00").sampled  # type: ignore[union-attr]
    for bad in [
        "",
        "00-xyz",
        "ff-" + good[3:],
        good.replace("4bf9", "4BF9"),
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        good.replace("00f067aa0ba902b7", "0" * 16),
    ]:
        assert parse_traceparent(bad) is None, bad
    assert from_headers(((TRACEPARENT, good.encode()),)) == parse_traceparent(good)
    assert from_headers((("other", b"x"), (TRACEPARENT, b"\xff"))) is None


def test_a_runs_span_id_is_derived_and_a_root_run_has_no_parent() -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert run_span_id(trace, "i", 0) == run_span_id(trace, "i", 0)
    assert run_span_id(trace, "i", 0) != run_span_id(trace, "i", 1)
    root = run_context(root_traceparent(trace, "i", 0), "i", 0)
    assert root is not None and root.parent_span_id is None
    # the next generation (continue-as-new copies the start event) is the root's child
    follow = run_context(root_traceparent(trace, "i", 0), "i", 1)
    assert follow is not None and follow.parent_span_id == root.span.span_id
    called = run_context(f"00-{trace}-00f067aa0ba902b7-01", "i", 0)
    assert called is not None and called.parent_span_id == "00f067aa0ba902b7"
    assert run_context("", "i", 0) is None


def test_the_otel_variables_choose_the_exporters() -> None:
    assert wanted({}) == []
    assert wanted({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == ["otlp"]
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp,console"}) == ["otlp", "console"]
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == []
    with pytest.raises(ConfigurationError, match="zipkin"):
        wanted({"OTEL_TRACES_EXPORTER": "zipkin"})


# --- spans of runs, turns, attempts and children ---------------------------------------------


def test_turns_attempts_and_the_child_share_one_trace(
    traced: TestEngine, exporter: InMemorySpanExporter
) -> None:
    run = traced.start(parent, 5)
    assert traced.wait_for_completion(run).output == 20
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans if s.context}) == 1
    runs = {s.attributes["turnstile.workflow.name"]: s for s in _by_name(spans, "run ")}
    assert set(runs) == {"t.parent", "t.child"}
    assert runs["t.parent"].parent is None  # started without context: the run is the root
    turns = _by_name(spans, "turn ")
    turn_ids = {_id(t) for t in turns}
    for turn in turns:
        name = turn.attributes["turnstile.workflow.name"]
        assert _parent(turn) == _id(runs[str(name)])
    # the child run hangs off the parent's turn that started it
    assert _parent(runs["t.child"]) in turn_ids
    attempts = _by_name(spans, "activity t.double")
    assert len(attempts) == 2
    assert all(_parent(a) in turn_ids for a in attempts)
    assert {a.attributes["turnstile.activity.outcome"] for a in attempts} == {"success"}
    # the turns that applied the results link to the attempts and to the child's last turn
    linked = {link.context.span_id for t in turns for link in t.links}
    assert {_id(a) for a in attempts} <= linked
    child_turns = {_id(t) for t in turns if t.attributes["turnstile.workflow.name"] == "t.child"}
    assert child_turns & linked
    # bounded attributes: names, ids and counts, never a payload
    for span in spans:
        for value in (span.attributes or {}).values():
            assert isinstance(value, str | int | bool)
            assert value != "20"
    assert len({_id(s) for s in spans}) == len(spans)


def test_a_start_with_trace_context_records_it_and_the_run_joins_that_trace(
    traced: TestEngine, exporter: InMemorySpanExporter
) -> None:
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced._produce(
        traced.topics.commands,
        instance_key("traced-1"),
        encode_message(StartWorkflow("traced-1", "t.child", to_payload(3), request_id="r")),
        None,
        ((TRACEPARENT, caller.encode()),),
    )
    traced.wait_for_completion("traced-1")
    started = traced.history("traced-1")[1].body
    assert isinstance(started, ExecutionStarted) and started.traceparent == caller
    (run,) = _by_name(exporter.get_finished_spans(), "run ")
    assert run.context is not None and run.context.trace_id == int(caller[3:35], 16)
    assert _parent(run) == int("b7ad6b7169203331", 16)
    # the activity task left with the turn's context in its header
    (task,) = traced.records(traced.topics.activity_tasks)
    header = from_headers(task.headers)
    assert header is not None and int(header.span_id, 16) in {
        _id(t) for t in _by_name(exporter.get_finished_spans(), "turn ")
    }


def test_a_failed_run_and_its_failed_attempts_are_errors(
    traced: TestEngine, exporter: InMemorySpanExporter
) -> None:
    run = traced.start(fails, 1)
    traced.wait_for_completion(run)
    spans = exporter.get_finished_spans()
    (failed_run,) = _by_name(spans, "run ")
    assert failed_run.status.status_code is StatusCode.ERROR
    assert failed_run.attributes["turnstile.run.status"] == "FAILED"
    attempts = _by_name(spans, "activity t.flaky")
    assert sorted(a.attributes["turnstile.activity.attempt"] for a in attempts) == [1, 2]
    assert all(a.status.status_code is StatusCode.ERROR for a in attempts)
    assert {a.attributes["turnstile.failure.type"] for a in attempts} == {"ValueError"}


def test_each_generation_is_a_run_span_chained_to_the_first(
    traced: TestEngine, exporter: InMemorySpanExporter
) -> None:
    run = traced.start(loops, 2)
    traced.wait_for_completion(run)
    runs = sorted(
        _by_name(exporter.get_finished_spans(), "run "),
        key=lambda s: int(s.attributes["turnstile.run.generation"]),  # type: ignore[arg-type]
    )
    assert [s.attributes["turnstile.run.status"] for s in runs] == [
        "CONTINUED_AS_NEW",
        "CONTINUED_AS_NEW",
        "COMPLETED",
    ]
    assert runs[0].parent is None
    assert {_parent(s) for s in runs[1:]} == {_id(runs[0])}


def test_replaying_after_a_restart_emits_no_span_again(
    traced: TestEngine, exporter: InMemorySpanExporter
) -> None:
    run = traced.start(parent, 1)
    traced.run()  # the first turns and the first attempt; the instance now waits
    before = {_id(s) for s in exporter.get_finished_spans()}
    traced.deploy(app)  # as a restart: every instance is rebuilt from its history
    traced.wait_for_completion(run)
    spans = exporter.get_finished_spans()
    assert len({_id(s) for s in spans}) == len(spans)
    assert before <= {_id(s) for s in spans}
    assert len(_by_name(spans, "run t.parent")) == 1


def test_without_tracing_nothing_is_recorded_or_sent() -> None:
    with TestEngine(app) as engine:
        run = engine.start(parent, 2)
        assert engine.wait_for_completion(run).output == 8
        started = engine.history(run)[1].body
        assert isinstance(started, ExecutionStarted) and started.traceparent == ""
        for topic in (engine.topics.activity_tasks, engine.topics.instance_messages):
            assert all(not r.headers for r in engine.records(topic))


def test_asked_for_without_the_extra_warns_and_runs_untraced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tracing_module, "installed", lambda: False)
    assert tracing_module.tracing_from_env({"OTEL_TRACES_EXPORTER": "console"}) is None
    assert "turnstile-engine[tracing]" in caplog.text
    assert tracing_module.tracing_from_env({}) is None  # nothing asked: nothing said
    assert tracing_module.current_headers() == []  # no current span: no header


def test_the_variables_build_the_exporters_they_name(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: list[object] = []
    monkeypatch.setattr(tracing_module.otel_trace, "set_tracer_provider", installed.append)
    tracing = tracing_module.tracing_from_env(
        {
            "OTEL_TRACES_EXPORTER": "console,otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        }
    )
    assert tracing is not None and installed == [tracing.provider]
    assert tracing.hook.enabled
    tracing.provider.shutdown()


def test_the_cli_refuses_an_unknown_exporter_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli.main import main
    from engine.cli.traces import process_tracing

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    process_tracing.cache_clear()
    try:
        assert main(["dev", "kafka", "status"]) != 0
    finally:
        process_tracing.cache_clear()
    err = capsys.readouterr().err
    assert "error: OTEL_TRACES_EXPORTER names zipkin" in err and "unset it" in err


def test_the_sampler_decides_for_runs_started_without_context(
    exporter: InMemorySpanExporter,
) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    tracing = tracing_with(SimpleSpanProcessor(exporter), sampler=ALWAYS_OFF)
    with TestEngine(app, tracing=tracing.hook) as engine:
        run = engine.start(parent, 1)
        assert engine.wait_for_completion(run).output == 4
        started = engine.history(run)[1].body
        assert isinstance(started, ExecutionStarted)
        assert started.traceparent == ""  # a dropped trace costs no later turn anything
        for topic in (engine.topics.activity_tasks, engine.topics.instance_messages):
            assert all(not r.headers for r in engine.records(topic))
    assert exporter.get_finished_spans() == ()
    tracing.shutdown()
