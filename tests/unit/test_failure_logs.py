"""Failures are visible in logs: a WARNING per failed activity attempt (worker), an ERROR per
instance that ends FAILED (processor), and the instance id and generation on every
``ctx.logger`` line, as text by default or as JSON (``--log-format json``)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine import Registry, RetryPolicy, WorkflowContext
from engine.cli.log_format import JsonFormatter, TextFormatter
from engine.cli.main import build_parser
from engine.core.history import RuntimeStatus
from engine.testing import TestEngine

registry = Registry()


@registry.activity(name="flaky")
def flaky(_: Any) -> None:
    raise ValueError("the card was declined")


hung = threading.Event()


@registry.activity(name="hangs")
def hangs(_: Any) -> None:
    hung.wait(60)  # past its start-to-close timeout; released when the test ends


@registry.workflow(name="slow_charge")
async def slow_charge(ctx: WorkflowContext, _: Any) -> None:
    await ctx.call_activity(hangs, None, start_to_close=0.2, retry=None)


@registry.workflow(name="charges")
async def charges(ctx: WorkflowContext, _: Any) -> None:
    ctx.logger.info("charging")
    await ctx.call_activity(flaky, None, retry=RetryPolicy(max_attempts=2, initial_interval=1))


class _Lines(logging.Handler):
    """Keeps each record and its formatted line."""

    def __init__(self, fmt: logging.Formatter) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(fmt)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def text() -> Iterator[_Lines]:
    yield from _captured(TextFormatter())


@pytest.fixture
def as_json() -> Iterator[_Lines]:
    yield from _captured(JsonFormatter())


def _captured(fmt: logging.Formatter) -> Iterator[_Lines]:
    handler = _Lines(fmt)
    root = logging.getLogger("engine")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _run_failing(instance_id: str) -> None:
    with TestEngine(registry) as env:
        env.start("charges", instance_id=instance_id)
        assert env.wait_for_completion(instance_id).status is RuntimeStatus.FAILED


def test_failed_attempts_warn_and_a_failed_instance_logs_one_error(text: _Lines) -> None:
    _run_failing("order-7")
    attempts = [r for r in text.records if r.name == "engine.services.worker.worker"]
    assert [(r.levelname, getattr(r, "attempt", None)) for r in attempts] == [
        ("WARNING", 1),
        ("WARNING", 2),
    ]
    assert all(getattr(r, "error_type", "") == "ValueError" for r in attempts)
    first = text.lines[text.records.index(attempts[0])]
    assert "instance order-7, task" in first and "attempt 1: ValueError" in first
    errors = [r for r in text.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].name == "engine.processor"
    assert "order-7" in errors[0].getMessage() and "FAILED" in errors[0].getMessage()


def _worker_warnings(text: _Lines) -> list[logging.LogRecord]:
    return [
        r
        for r in text.records
        if r.name == "engine.services.worker.worker" and r.levelno >= logging.WARNING
    ]


def _cancelled_and_abandoned(text: _Lines) -> list[logging.LogRecord]:
    """The thread's warning that it abandoned the run, once the processor cancelled it."""
    messages = [r.getMessage() for r in text.records]
    if not any("the workflow's timeout of 0.2s" in m for m in messages):
        return []
    return [r for r in text.records if "is abandoned" in r.getMessage()]


def test_a_timed_out_attempt_warns(text: _Lines) -> None:
    try:
        with TestEngine(registry) as env:
            env.start("slow_charge", instance_id="order-6")
            assert env.wait_for_completion("order-6").status is RuntimeStatus.FAILED
            # The worker's warning about its own timeout may come after the workflow's
            # failure (the processor's timer can pass first), and it may also log, at
            # INFO, that the processor cancelled the attempt: wait for the warning.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                _worker_warnings(text) or _cancelled_and_abandoned(text)
            ):
                time.sleep(0.01)
    finally:
        hung.set()
    if not _worker_warnings(text):
        # The processor's timer passed first and cancelled the attempt, so the worker
        # reports nothing of it; the thread that still runs it says it is abandoned.
        abandoned = _cancelled_and_abandoned(text)
        assert [r.levelname for r in abandoned] == ["WARNING"], text.lines
        assert "order-6" in abandoned[0].getMessage()
        return
    (warned,) = _worker_warnings(text)
    assert warned.levelname == "WARNING"
    assert (getattr(warned, "instance_id", None), getattr(warned, "attempt", None)) == (
        "order-6",
        1,
    )
    assert getattr(warned, "error_type", "") == "ActivityTimeoutError"
    line = text.lines[text.records.index(warned)]
    assert "activity hangs timed out: instance order-6, task 0, attempt 1" in line


def test_workflow_log_lines_name_the_instance_and_generation(text: _Lines) -> None:
    _run_failing("order-8")
    (line,) = [text.lines[i] for i, r in enumerate(text.records) if r.name == "engine.workflow"]
    assert "[order-8#0] charging" in line


def test_json_lines_carry_the_instance_fields(as_json: _Lines) -> None:
    _run_failing("order-9")
    lines = [json.loads(line) for line in as_json.lines]
    (said,) = [line for line in lines if line["logger"] == "engine.workflow"]
    assert (said["message"], said["instance_id"], said["generation"]) == ("charging", "order-9", 0)
    warned = [line for line in lines if line["level"] == "WARNING" and "attempt" in line]
    assert [w["attempt"] for w in warned] == [1, 2]
    assert {w["error_type"] for w in warned} == {"ValueError"}


def test_run_commands_take_a_log_format() -> None:
    args = build_parser().parse_args(["run", "worker", "--log-format", "json"])
    assert args.log_format == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "worker", "--log-format", "xml"])
