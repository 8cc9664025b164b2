"""The processor's side of updates: offer an ``UpdateWorkflow`` to the instance's next
turn and answer it when the turn rejects it or when its handler finishes.

An update is answered on the command-outcomes topic under its update id (the command's
request id), like a query, but not at once: the runtime (``engine.runtime.updates``) runs
the validator in the turn, so a rejection is known after the turn (and wrote nothing), and
the handler's result only when the fiber that runs it records ``UpdateCompleted``, maybe
turns later. A retry with an update id the generation accepted (or an earlier generation
of the run completed: the runtime carries those over a continue-as-new) is rejected by the
runtime as "already accepted": it is answered with the recorded result if the handler
finished, and not at all while it runs (the first answer, under the same id, is still to
come).
Parked, suspended, ended and not yet started instances are refused before any turn.
"""

from __future__ import annotations

from engine.core import errors
from engine.core.history import Inbound, RuntimeStatus, UpdateAccepted, UpdateCompleted
from engine.core.messages import UpdateWorkflow
from engine.core.payloads import Payload
from engine.runtime import TurnResult
from engine.runtime.updates import UNKNOWN_UPDATE
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, accepted, refused, send_outcome
from engine.services.processor.state import Loaded

__all__ = [
    "answer_completed",
    "answer_finished",
    "answer_rejected",
    "on_update",
    "send_refusal",
]

KIND = UpdateWorkflow.KIND


def on_update(b: Batch, msg: UpdateWorkflow, now_ms: int) -> None:
    """Refuse an update the instance cannot take now, or offer it to the next turn."""
    b.env.limits.check("event", f"the argument of update {msg.name!r}", msg.input)
    item = b.load(msg.instance_id)
    refusal = _refusal(item, msg)
    if refusal is not None:
        _send(b, msg.instance_id, msg.request_id, refusal, now_ms)
        return
    item.inbox.append(Inbound(UpdateAccepted(msg.request_id, msg.name, msg.input)))


def _refusal(item: Loaded, msg: UpdateWorkflow) -> Verdict | None:
    meta = item.meta
    status = meta.status
    if status is None:
        return refused(errors.InstanceNotFoundError, f"no instance {msg.instance_id}")
    if not msg.request_id:
        return refused(errors.UpdateRejectedError, "an update needs an update id (request_id)")
    if meta.parked is not None and not status.is_terminal:
        why = meta.parked.failure
        return refused(
            errors.UpdateRejectedError,
            f"instance {msg.instance_id} is PARKED (its code raised {why.type}: "
            f"{why.message}); fix the code and retry it before updating it",
        )
    if status is RuntimeStatus.SUSPENDED:
        reason = f"instance {msg.instance_id} is SUSPENDED: resume it before updating it"
        return refused(errors.UpdateRejectedError, reason)
    if status is RuntimeStatus.PENDING or status.is_terminal:
        reason = f"instance {msg.instance_id} is {status.value}: only a running one takes updates"
        return refused(errors.UpdateRejectedError, reason)
    return None


def answer_rejected(b: Batch, item: Loaded, result: TurnResult, now_ms: int) -> None:
    """Answer the updates the turn rejected (a retry of one that finished: its result)."""
    gen = None if item.execution is None else item.execution.current_generation
    for rejected in result.rejected:
        body = rejected.inbound.body
        if type(body) is not UpdateAccepted:
            continue
        if gen is not None and body.update_id in gen.update_ids:
            done = gen.update_ids[body.update_id]
            if done is not None:
                answer_completed(b, item.meta.instance_id, done, now_ms)
            continue  # still running: its answer comes when it finishes
        kind = (
            errors.UnknownUpdateError
            if rejected.reason.startswith(UNKNOWN_UPDATE)
            else errors.UpdateRejectedError
        )
        _send(b, item.meta.instance_id, body.update_id, refused(kind, rejected.reason), now_ms)


def answer_finished(b: Batch, item: Loaded, result: TurnResult, now_ms: int) -> None:
    """Answer every update whose handler finished in the recorded turn, and, when the
    turn ended the generation (the instance ended or continued as new), every update
    whose handler had not finished: it never will, so its caller gets UpdateFailedError."""
    instance_id = item.meta.instance_id
    for event in result.new_events:
        if type(event.body) is UpdateCompleted:
            answer_completed(b, instance_id, event.body, now_ms)
    if result.status in _LIVE or item.execution is None:
        return
    gen = item.execution.current_generation
    if gen is None:
        return
    for update_id, done in gen.update_ids.items():
        if done is None:
            reason = (
                f"update {update_id!r} did not finish: the workflow ended "
                f"{result.status.value} first (wait for ctx.all_updates_finished() before "
                f"ending)"
            )
            _send(b, instance_id, update_id, refused(errors.UpdateFailedError, reason), now_ms)


_LIVE = frozenset({RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED})


def answer_completed(b: Batch, instance_id: str, done: UpdateCompleted, now_ms: int) -> None:
    failure = done.failure
    if failure is None:
        _send(b, instance_id, done.update_id, accepted(), now_ms, done.output)
        return
    reason = f"update {done.update_id!r} failed: {failure.type}: {failure.message}"
    _send(b, instance_id, done.update_id, refused(errors.UpdateFailedError, reason), now_ms)


def send_refusal(b: Batch, instance_id: str, update_id: str, verdict: Verdict, now_ms: int) -> None:
    """Answer an update-with-start whose start half was refused."""
    _send(b, instance_id, update_id, verdict, now_ms)


def _send(
    b: Batch,
    instance_id: str,
    update_id: str,
    verdict: Verdict,
    now_ms: int,
    output: Payload | None = None,
) -> None:
    b.counters.outcome(KIND, verdict.result.value.lower())
    if update_id:
        send_outcome(b, instance_id, update_id, KIND, verdict, now_ms, output=output)
