"""Updates: a client's request that a workflow changes its state and answers.

Workflow code sets a handler with ``ctx.set_update_handler(name, fn, validator=None)``.
An update reaches the instance as an inbound ``UpdateAccepted``; before anything is
journaled its validator (a plain function, run read-only like a query handler) may reject
it, and a rejection leaves no trace in history. An accepted update is journaled, and its
handler runs as a fiber of the generation, so it may await activities, timers and events
like any fiber; when it returns or raises, the fiber records ``UpdateCompleted`` as a
decision. Replay applies the recorded ``UpdateAccepted`` where it happened and starts the
same fiber, so the handler decides the same things again. The generation remembers every
update id it accepted, so a retry with the same id is refused here and answered with the
first result by the caller; a continue-as-new carries the newest completed ones into the
next generation (``UpdatesCarried``, bounded: ``engine.runtime.continuation``), so a retry
after it is answered the same way. An update still running when its generation ends (the
code returned or continued as new) records nothing more; workflow code that takes updates
waits for ``ctx.all_updates_finished()`` before it ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from engine.core.errors import QueryFailedError
from engine.core.failure import failure_from_exception
from engine.core.history import EventBody, RuntimeStatus, UpdateAccepted, UpdateCompleted
from engine.core.payloads import Payload
from engine.runtime.cancel import is_cancelled
from engine.runtime.fastjson import decode, encode
from engine.runtime.generation import Generation, UpdateHandler

#: How the refusal of an unknown update name begins (the processor answers it
#: ``UnknownUpdateError``, every other refusal ``UpdateRejectedError``).
UNKNOWN_UPDATE = "the workflow has no update"

__all__ = ["UNKNOWN_UPDATE", "UpdateTarget", "on_update_accepted", "update_handler", "update_names"]


class UpdateTarget(Protocol):
    """What an update is applied to (the executor's WorkflowExecution)."""

    @property
    def current_generation(self) -> Generation | None: ...

    @property
    def status(self) -> RuntimeStatus: ...

    def journal_inbound(self, body: EventBody) -> None: ...


def update_handler(
    name: str, fn: Callable[..., Any], validator: Callable[..., Any] | None
) -> UpdateHandler:
    """The handler ``ctx.set_update_handler`` sets, checked."""
    for what, f in (("handler", fn), ("validator", validator)):
        if f is not None and not callable(f):
            raise TypeError(f"the {what} of update {name!r} must be callable, got {f!r}")
    return UpdateHandler(fn, validator)


def update_names(gen: Generation | None) -> list[str]:
    """The update names the generation knows, sorted."""
    return [] if gen is None else sorted(gen.updates)


def _call(fn: Callable[..., Any], arg: Any) -> Any:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: give it the argument
        return fn(arg)
    return fn(arg) if params else fn()


def _refusal(ex: UpdateTarget, gen: Generation, body: UpdateAccepted) -> str | None:
    if ex.status is RuntimeStatus.SUSPENDED:
        return "the instance is suspended: resume it before updating it"
    if body.update_id in gen.update_ids:
        return f"update {body.update_id!r} was already accepted"
    if body.name not in gen.updates:
        known = ", ".join(repr(n) for n in update_names(gen)) or "none"
        return f"{UNKNOWN_UPDATE} {body.name!r} (its updates: {known})"
    return None


def _validate(gen: Generation, handler: UpdateHandler, name: str, arg: Any) -> str | None:
    """Run the validator read-only; the reason it rejects the update, or None."""
    validator = handler.validator
    if validator is None:
        return None
    with gen.read_only():
        try:
            result = _call(validator, arg)
        except QueryFailedError:
            return f"the validator of update {name!r} tried to decide something; it is read-only"
        except Exception as exc:
            return f"update {name!r} was rejected by its validator: {exc}"
        refused = gen.query_refused
    if isinstance(result, Coroutine):
        result.close()
        return f"the validator of update {name!r} is async: a validator is a plain function"
    if refused:
        return f"the validator of update {name!r} tried to decide something; it is read-only"
    return None


def on_update_accepted(ex: UpdateTarget, body: UpdateAccepted) -> str | None:
    """Refuse (a suspended instance, a known update id, an unknown name, a rejection by
    the validator) or journal the update and start its handler's fiber."""
    gen = ex.current_generation
    assert gen is not None
    reason = _refusal(ex, gen, body)
    if reason is not None:
        return reason
    handler = gen.updates[body.name]
    arg = decode(body.input)
    if not gen.journal.replaying:  # a recorded update was validated when it was accepted
        reason = _validate(gen, handler, body.name, arg)
        if reason is not None:
            return reason
    ex.journal_inbound(body)
    gen.update_ids[body.update_id] = None
    gen.spawn(_run(gen, body.update_id, handler.fn, arg))
    return None


async def _run(gen: Generation, update_id: str, fn: Callable[..., Any], arg: Any) -> None:
    """The update's fiber: run the handler, then record how it ended."""
    try:
        value = _call(fn, arg)
        if isinstance(value, Coroutine):
            value = await value
        output: Payload | None = encode(value)
    except BaseException as exc:
        if not isinstance(exc, Exception) and not is_cancelled(exc):
            raise  # ContinueAsNewRequested and interrupts unwind the fiber
        done = UpdateCompleted(update_id, failure=failure_from_exception(exc))
    else:
        done = UpdateCompleted(update_id, output=output)
    gen.update_ids[update_id] = gen.command(done) or done
