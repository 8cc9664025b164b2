"""Size limits of the values a workflow moves, checked where a record is made.

One value too large for the broker used to make the producer refuse a record, which stopped
the replica; the partition then moved to the next replica, which stopped the same way. So
every value that ends up in a record has a limit below what the topics accept, and going
over it fails only the instance (or the activity attempt) that made it, with a
:class:`~engine.core.errors.PayloadTooLargeError` that names the limit and the value.

The status record carries an instance's input, output, custom status and failure at once;
:func:`fit_status` keeps it below the record limit by replacing the largest values with a
*summary* (size, encoding, SHA-256) that points to the history, which has the full value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from engine.core.errors import PayloadTooLargeError
from engine.core.failure import FailureDetails
from engine.core.history import (
    ChildWorkflowCreated,
    ContinuedAsNew,
    CustomStatusSet,
    EventBody,
    EventRaised,
    EventSent,
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    InlineStepCompleted,
    RecordPublished,
    TaskCompleted,
    TaskScheduled,
)
from engine.core.messages import InstanceStatus, Message, RaiseEvent, SignalWithStart, StartWorkflow
from engine.core.payload_refs import DEFAULT_INLINE_MAX, DEFAULT_PAYLOAD_MAX
from engine.core.payloads import SUMMARY, Payload, is_ref, stored_size

KIB = 1024

#: Encoding of a summary that stands in for a value too large to be copied somewhere.
SUMMARY_ENCODING = SUMMARY

#: Room left in a record for everything but its large values (ids, names, tags, framing).
RECORD_OVERHEAD = 16 * KIB

#: Failure messages and stacks are cut to this many characters in records.
FAILURE_TEXT_MAX = 16 * KIB


@dataclass(frozen=True, slots=True)
class Limits:
    """Byte limits per kind of value; the setting names are ``max_<field>_bytes``."""

    workflow_input: int = 256 * KIB
    workflow_output: int = 256 * KIB
    activity_input: int = 256 * KIB
    activity_result: int = 256 * KIB
    event: int = 256 * KIB
    custom_status: int = 64 * KIB
    #: Any one record the engine writes (the topics' max.message.bytes follows it).
    record: int = 1_000_000
    #: A payload above ``payload_inline`` bytes is kept in chunks on the payloads topic
    #: (engine.core.payload_refs), up to ``payload_max`` bytes; 0: never (the per-kind
    #: limits above are then the largest values).
    payload_inline: int = DEFAULT_INLINE_MAX
    payload_max: int = DEFAULT_PAYLOAD_MAX

    def __post_init__(self) -> None:
        if self.payload_inline and not 0 < self.payload_inline < self.payload_max:
            raise ValueError(
                f"payload_inline_max_bytes={self.payload_inline} must be below "
                f"payload_max_bytes={self.payload_max} (0 keeps every payload inline)"
            )
        for name in _KINDS:
            value = getattr(self, name)
            if value < 1 or value + RECORD_OVERHEAD > self.record:
                raise ValueError(
                    f"max_{name}_bytes={value} must be at least 1 and leave "
                    f"{RECORD_OVERHEAD} bytes of max_record_bytes={self.record} free"
                )

    def check(self, kind: str, what: str, payload: Payload | None) -> None:
        """Raise :class:`PayloadTooLargeError` when ``payload`` is over the ``kind`` limit."""
        if payload is None:
            return
        if is_ref(payload):  # kept beside the record: only the largest payload counts
            if stored_size(payload) > self.payload_max:
                raise PayloadTooLargeError(
                    what, stored_size(payload), "payload_max_bytes", self.payload_max
                )
            return
        limit = getattr(self, kind)
        if len(payload.data) > limit:
            raise PayloadTooLargeError(what, len(payload.data), setting_name(kind), limit)

    def kept_aside(self, payload: Payload | None) -> bool:
        """Whether ``payload`` goes to the payloads topic (over ``payload_inline`` bytes);
        :class:`PayloadTooLargeError` for one over ``payload_max``, before anything is
        written."""
        if payload is None or not self.payload_inline or is_ref(payload):
            return False
        if len(payload.data) <= self.payload_inline:
            return False
        if len(payload.data) > self.payload_max:
            raise PayloadTooLargeError(
                "the payload", len(payload.data), "payload_max_bytes", self.payload_max
            )
        return True

    def check_event(self, body: EventBody) -> None:
        """Check the value a history event carries against the limit of its kind."""
        rule = _EVENT_RULES.get(type(body))
        if rule is not None:
            kind, attr, what = rule
            self.check(kind, what, getattr(body, attr))

    def check_command(self, command: Message) -> None:
        """Check the values a client's command carries, before it is sent: the processor
        would fail the instance for them, and one over the record limit would not even
        reach it (the broker refuses the record)."""
        for kind, attr, what in _COMMAND_RULES.get(type(command), ()):
            self.check(kind, what, getattr(command, attr))

    def first_oversized(self, events: Iterable[HistoryEvent]) -> PayloadTooLargeError | None:
        """The first event of a turn whose value is over its limit, as the error to fail
        the instance with (``None`` when the whole turn fits)."""
        for event in events:
            try:
                self.check_event(event.body)
            except PayloadTooLargeError as exc:
                return exc
        return None


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """How large one generation's history may grow (the settings ``history_events_warn``,
    ``history_events_max``, ``history_bytes_warn``, ``history_bytes_max``).

    Every turn replays nothing for a hot instance, but a cold one replays its whole
    generation, and the state table and the changelog keep it: a workflow that never
    continues as new would grow without bound. From a ``*_warn`` size on, the processor
    logs a WARNING and the code's ``ctx.continue_as_new_suggested`` is True; a turn that
    takes the generation past a ``*_max`` size fails the instance
    (:class:`~engine.core.errors.HistoryLimitExceededError`). A continue-as-new starts the
    count again. The defaults are Temporal's event counts (10,240 and 51,200) and 10 and
    50 MiB of encoded events.
    """

    events_warn: int = 10_240
    events_max: int = 51_200
    bytes_warn: int = 10 * 1024 * 1024
    bytes_max: int = 50 * 1024 * 1024

    def __post_init__(self) -> None:
        for kind in ("events", "bytes"):
            warn, most = getattr(self, f"{kind}_warn"), getattr(self, f"{kind}_max")
            if not 1 <= warn <= most:
                raise ValueError(
                    f"history_{kind}_warn={warn} must be at least 1 and at most "
                    f"history_{kind}_max={most}: the warning comes first (set both)"
                )

    def for_workflow(self, events_warn: int, events_max: int) -> HistoryLimits:
        """These limits with a workflow's own event counts (0: the setting's)."""
        most = events_max or self.events_max
        warn = events_warn or min(self.events_warn, most)
        return replace(self, events_warn=warn, events_max=most)


_KINDS = (
    "workflow_input",
    "workflow_output",
    "activity_input",
    "activity_result",
    "event",
    "custom_status",
)


def setting_name(kind: str) -> str:
    """The setting that configures the ``kind`` limit (``max_event_bytes``)."""
    return f"max_{kind}_bytes"


_EVENT_RULES: dict[type, tuple[str, str, str]] = {
    ExecutionStarted: ("workflow_input", "input", "the workflow input"),
    ContinuedAsNew: ("workflow_input", "input", "the continue-as-new input"),
    ChildWorkflowCreated: ("workflow_input", "input", "the child workflow input"),
    ExecutionCompleted: ("workflow_output", "output", "the workflow output"),
    TaskScheduled: ("activity_input", "input", "the activity input"),
    TaskCompleted: ("activity_result", "output", "the activity result"),
    InlineStepCompleted: ("activity_result", "output", "the inline step result"),
    EventRaised: ("event", "input", "the event payload"),
    EventSent: ("event", "input", "the event payload"),
    CustomStatusSet: ("custom_status", "status", "the custom status"),
    RecordPublished: ("event", "value", "the published value"),
}


_COMMAND_RULES: dict[type, tuple[tuple[str, str, str], ...]] = {
    StartWorkflow: (("workflow_input", "input", "the workflow input"),),
    RaiseEvent: (("event", "input", "the event payload"),),
    SignalWithStart: (
        ("workflow_input", "input", "the workflow input"),
        ("event", "event_input", "the event payload"),
    ),
}


# --- summaries ----------------------------------------------------------------------------


def summarize(payload: Payload) -> Payload:
    """A small stand-in for ``payload``: its size, encoding and SHA-256."""
    doc = {
        "summary": "value too large to copy here; the instance's history has it",
        "size": len(payload.data),
        "encoding": payload.encoding,
        "sha256": hashlib.sha256(payload.data).hexdigest(),
    }
    return Payload(json.dumps(doc, sort_keys=True).encode(), SUMMARY_ENCODING)


def is_summary(payload: Payload | None) -> bool:
    return payload is not None and payload.encoding == SUMMARY_ENCODING


def shorten_failure(details: FailureDetails | None) -> FailureDetails | None:
    """Failure details with message and stack cut to :data:`FAILURE_TEXT_MAX` characters."""
    if details is None:
        return None
    return replace(
        details,
        message=_cut(details.message),
        stack=_cut(details.stack),
        cause=shorten_failure(details.cause),
    )


def _cut(text: str) -> str:
    if len(text) <= FAILURE_TEXT_MAX:
        return text
    return text[: FAILURE_TEXT_MAX // 2] + "\n...[cut]...\n" + text[-FAILURE_TEXT_MAX // 2 :]


def _failure_size(details: FailureDetails | None) -> int:
    size = 0
    while details is not None:
        size += len(details.type) + len(details.message) + len(details.stack) + 16
        details = details.cause
    return size


def status_size(status: InstanceStatus) -> int:
    """An upper estimate of the encoded size of a status record."""
    size = RECORD_OVERHEAD // 4 + len(status.instance_id) + len(status.name)
    size += sum(len(k) + len(v) + 8 for k, v in status.tags.items()) + len(status.request_id)
    for payload in (status.input, status.output, status.custom_status):
        if payload is not None:
            size += len(payload.data) + len(payload.encoding) + 8
    return size + _failure_size(status.failure)


def fit_status(status: InstanceStatus, record_limit: int) -> InstanceStatus:
    """``status`` made to fit in one record: the largest values become summaries."""
    if status_size(status) <= record_limit:
        return status
    status = replace(status, failure=shorten_failure(status.failure))
    for name in sorted(
        ("input", "output", "custom_status"),
        key=lambda n: -len(getattr(status, n).data) if getattr(status, n) else 0,
    ):
        if status_size(status) <= record_limit:
            return status
        value = getattr(status, name)
        if value is not None and not is_summary(value):
            changes: dict[str, Any] = {name: summarize(value)}
            status = replace(status, **changes)
    if status_size(status) > record_limit:
        status = replace(status, tags={"turnstile.summary": f"{len(status.tags)} tags not copied"})
    return status
