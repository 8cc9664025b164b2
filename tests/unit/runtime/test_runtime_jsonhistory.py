"""The readable JSON form of history events."""

from __future__ import annotations

import json

import pytest

from engine.core.errors import CodecError
from engine.core.failure import FailureDetails
from engine.core.history import (
    EVENT_TYPES,
    ActivityCancelRequested,
    ChildWorkflowCompleted,
    ChildWorkflowCreated,
    ChildWorkflowFailed,
    ContinuedAsNew,
    CustomStatusSet,
    EventRaised,
    EventSent,
    ExecutionCancelRequested,
    ExecutionCompleted,
    ExecutionReset,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    HistoryEvent,
    InlineStepCompleted,
    InlineStepFailed,
    ParentClosePolicy,
    PatchMarker,
    RecordPublished,
    RuntimeStatus,
    TagsUpserted,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCancelled,
    TimerCreated,
    TimerFired,
    TurnStarted,
    UpdateAccepted,
    UpdateCompleted,
    UpdatesCarried,
)
from engine.core.payloads import Payload, to_payload
from engine.runtime.jsonhistory import history_from_json, history_to_json

FAILURE = FailureDetails("E", "msg", "stack", False, FailureDetails("Cause", "why"))
BODIES = [
    ExecutionStarted("wf", to_payload({"a": [1]}), "2", "p", 1, 3, 99, {"t": "v"}, "req"),
    ExecutionCompleted(RuntimeStatus.FAILED, None, FAILURE),
    ExecutionTerminated("why", True),
    ExecutionSuspended("s"),
    ExecutionResumed("r"),
    ContinuedAsNew(to_payload(1), 2),
    TaskScheduled(1, "act", Payload(b"\x00\xff", "binary"), 2, 500),
    TaskCompleted(1, Payload(b'{"b":1,"a":2}'), 2),  # not canonical JSON: kept as bytes
    TaskFailed(1, FAILURE, 3),
    InlineStepCompleted(2, "step", to_payload("é")),
    InlineStepFailed(2, "step", FAILURE),
    ChildWorkflowCreated(3, "child", "c-1", None, "1", ParentClosePolicy.REQUEST_CANCEL),
    ChildWorkflowCompleted(3, to_payload(None)),
    ChildWorkflowFailed(3, FAILURE),
    TimerCreated(4, 123),
    TimerFired(4, 123),
    TimerCancelled(4),
    EventRaised("ev", to_payload(1.5)),
    EventSent(5, "other", "ev", to_payload(True)),
    CustomStatusSet(to_payload({"stage": 1})),
    TurnStarted(77),
    ActivityCancelRequested(4, 2),
    ExecutionCancelRequested("parent closed"),
    TagsUpserted({"customer": "c-42", "tier": ""}),
    PatchMarker("fix-42", deprecated=True),
    ExecutionReset(12, "redo the charge", "req-1", "source-1"),
    RecordPublished(6, "orders", Payload(b"\x00\x01", "binary"), "o-1", 2, {"h": "v"}, "{}"),
    UpdateAccepted("u-1", "add", to_payload(3)),
    UpdateCompleted("u-1", None, FAILURE),
    UpdatesCarried([UpdateCompleted("u-1", to_payload(3)), UpdateCompleted("u-2", None, FAILURE)]),
]


def test_every_event_kind_round_trips_through_json_text() -> None:
    assert {type(b) for b in BODIES} == set(EVENT_TYPES)
    events = [
        HistoryEvent("wf", i, 1000 + i, 0, body, b"\x01" * (i % 2), b"\x02" * (i % 2))
        for i, body in enumerate(BODIES)
    ]
    text = json.dumps(history_to_json(events))
    assert history_from_json(json.loads(text)) == events


def test_json_payloads_are_shown_as_values() -> None:
    (shown,) = history_to_json([HistoryEvent("wf", 0, 0, 0, EventRaised("e", to_payload([1])))])
    assert shown["kind"] == "EventRaised"
    assert shown["body"] == {"name": "e", "input": {"json": [1]}}
    assert "hash" not in shown


def test_malformed_json_history_is_a_codec_error() -> None:
    with pytest.raises(CodecError):
        history_from_json([{"kind": "Nope"}])
    with pytest.raises(CodecError, match="unknown history event kind"):
        history_from_json(
            [
                {
                    "kind": "Nope",
                    "instance_id": "x",
                    "sequence": 0,
                    "timestamp_ms": 0,
                    "generation": 0,
                }
            ]
        )
