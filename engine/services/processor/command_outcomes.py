"""Every command is answered once and applied at most once: de-duplication by request id
and the command outcome records.

A command handler returns a :class:`Verdict` (accepted, buffered, or refused with the
error a client raises); :func:`answered` wraps it. Before the handler runs, the request id
is looked up in the instance row's window of recent requests (``InstanceRow.seen_requests``,
bounded by the ``dedup_window`` count and ``dedup_window_ms`` age): a request seen before is
answered with its first answer, marked duplicate, and not applied again. The window lives
in the row, so it is on the state changelog and survives restarts and takeovers.

A command read from the commands topic (a client's) is answered with a
:class:`CommandOutcome` on the command-outcomes topic, in the batch's transaction, so an
answer exists exactly when the command's effect was committed. Commands instances send each
other (child starts, recursive terminations) are de-duplicated the same way but answered
through their own channels (a refused child start becomes a failed child result).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core import errors
from engine.core.errors import TurnstileError
from engine.core.instance_row import InstanceRow, SeenRequest
from engine.core.messages import CommandOutcome, CommandResult, Message
from engine.core.payloads import Payload
from engine.services.processor.batch import Batch

log = logging.getLogger("engine.processor")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a command handler decided: the result, why, and for a refusal its stable code
    (``CommandRefusedError.code``, what clients map to their error) and the name of the
    error class, for clients that predate codes."""

    result: CommandResult
    reason: str = ""
    error: str = ""
    code: str = ""


def accepted(reason: str = "") -> Verdict:
    return Verdict(CommandResult.ACCEPTED, reason)


def buffered(reason: str) -> Verdict:
    return Verdict(CommandResult.BUFFERED, reason)


def refused(error: type[TurnstileError], reason: str) -> Verdict:
    """A refusal raising ``error`` in the client; an error that is not a refusal (a record
    the handler could not use) is answered with the code of :class:`CommandRefusedError`."""
    code = getattr(error, "code", errors.CommandRefusedError.code)
    return Verdict(CommandResult.REFUSED, reason, error.__name__, code)


def remembered(seen: SeenRequest) -> Verdict:
    """The first answer to a request seen before (rows written before codes existed have
    none: their clients map the class name)."""
    return Verdict(CommandResult(seen.result), seen.reason, seen.error, seen.code)


CommandHandler = Callable[[Batch, Any, int], Verdict]
MessageHandler = Callable[[Batch, Any, int], None]


def answered(handler: CommandHandler) -> MessageHandler:
    """The handler of a command: de-duplicated by request id and answered."""

    def run(b: Batch, msg: Any, now_ms: int) -> None:
        request_id: str = msg.request_id
        if request_id:
            seen = find(b.load(msg.instance_id).meta, request_id, now_ms - b.env.dedup_window_ms)
            if seen is not None:
                b.counters.outcome(msg.KIND, "duplicate")
                verdict = remembered(seen)
                _answer(b, msg, verdict, now_ms, duplicate=True)
                return
        try:
            verdict = handler(b, msg, now_ms)
        except TurnstileError as exc:  # the record goes to dead letters; still answered
            verdict = refused(type(exc), str(exc))
            settle(b, msg, verdict, now_ms)
            raise
        settle(b, msg, verdict, now_ms)

    run.__name__ = run.__qualname__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def settle(b: Batch, msg: Any, verdict: Verdict, now_ms: int) -> None:
    """Count, remember and answer a verdict (for handlers that answer only some of their
    outcomes themselves, like a rerun's source, which answers only a refusal)."""
    b.counters.outcome(msg.KIND, verdict.result.value.lower())
    if verdict.result is CommandResult.REFUSED:
        b.counters.refuse(msg.KIND, verdict.error)
        log.info("%s for %s refused: %s", msg.KIND, msg.instance_id, verdict.reason)
    if msg.request_id:
        meta = b.load(msg.instance_id).meta
        if meta.exists or meta.pending_events or meta.schedule is not None:  # not for unknown ids
            remember(
                meta, msg.request_id, verdict, now_ms, b.env.dedup_window, b.env.dedup_window_ms
            )
            b.save(meta)
    _answer(b, msg, verdict, now_ms)


def _answer(b: Batch, msg: Message, verdict: Verdict, now_ms: int, duplicate: bool = False) -> None:
    """The outcome record, for commands a client sent (read from the commands topic)."""
    record = b.current
    request_id: str = getattr(msg, "request_id", "")
    if record is None or record.topic != b.env.topics.commands or not request_id:
        return
    send_outcome(b, msg.instance_id, request_id, msg.KIND, verdict, now_ms, duplicate)


def send_outcome(
    b: Batch,
    instance_id: str,
    request_id: str,
    command: str,
    verdict: Verdict,
    now_ms: int,
    duplicate: bool = False,
    output: Payload | None = None,
) -> None:
    """Answer ``request_id`` on the command-outcomes topic, with the instance's status as
    this batch leaves it (a rerun's new instance answers the request it was made for) and
    the answer's value (``output``: a query's)."""
    meta = b.load(instance_id).meta
    outcome = CommandOutcome(
        instance_id=instance_id,
        request_id=request_id,
        command=command,
        result=verdict.result,
        reason=verdict.reason,
        error=verdict.error,
        code=verdict.code,
        status=meta.reported_status,
        duplicate=duplicate,
        timestamp_ms=now_ms,
        generation=meta.generation,
        output=output,
    )
    b.send(b.env.topics.command_outcomes, outcome)


# --- the window of recent requests ----------------------------------------------------------


def find(meta: InstanceRow, request_id: str, since_ms: int) -> SeenRequest | None:
    """The request with this id, if the instance answered it at or after ``since_ms``."""
    for seen in reversed(meta.seen_requests):
        if seen.received_ms < since_ms:
            return None  # older entries are older still: out of the window
        if seen.request_id == request_id:
            return seen
    return None


def remember(
    meta: InstanceRow, request_id: str, verdict: Verdict, now_ms: int, count: int, age_ms: int
) -> None:
    """Add the request to the row's window, dropping the entries past its count and age."""
    if count <= 0:
        meta.seen_requests = []
        return
    floor = now_ms - age_ms
    kept = [s for s in meta.seen_requests if s.received_ms >= floor]
    kept.append(
        SeenRequest(
            request_id, now_ms, verdict.result.value, verdict.error, verdict.reason, verdict.code
        )
    )
    meta.seen_requests = kept[-count:]
