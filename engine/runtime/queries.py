"""Queries: read-only questions to a workflow's state.

Workflow code sets a handler with ``ctx.set_query_handler(name, fn)``; a handler is a plain
function, usually a closure over the workflow's local variables, that returns a JSON value.
The processor answers a query by calling it on the instance's execution as the last turn
(or a replay, for an instance not in memory) left it, so the answer is the state the
history says. A query records nothing: while the handler runs the generation refuses every
decision (``Generation.refuse`` raises :class:`QueryFailedError`), and the counters that
decisions would move (task ids, uuids, the seeded random generator) are put back, so a
query never changes what the code decides next or what a replay sees. Handlers set in an
ended generation stay, so an ended instance answers from its last state.
"""

from __future__ import annotations

from types import CoroutineType
from typing import TYPE_CHECKING

from engine.core.errors import QueryFailedError, UnknownQueryError
from engine.core.payloads import Payload
from engine.runtime.fastjson import decode, encode

if TYPE_CHECKING:
    from engine.runtime.executor import WorkflowExecution

__all__ = ["query_names", "run_query"]


def query_names(execution: WorkflowExecution) -> list[str]:
    """The query names the instance's current generation knows, sorted."""
    gen = execution.current_generation
    return [] if gen is None else sorted(gen.queries)


def run_query(execution: WorkflowExecution, name: str, input: Payload | None) -> Payload | None:
    """The handler's answer to query ``name`` with the arguments ``input`` (a JSON list).

    Raises :class:`UnknownQueryError` (naming the known queries) or
    :class:`QueryFailedError` (the handler raised, returned no JSON, or tried to decide
    something); nothing about the instance changes either way.
    """
    gen = execution.current_generation
    if gen is None:
        raise QueryFailedError("the instance has not started yet: it has no query handlers")
    handler = gen.queries.get(name)
    if handler is None:
        known = ", ".join(repr(n) for n in sorted(gen.queries)) or "none"
        raise UnknownQueryError(f"the workflow has no query {name!r} (its queries: {known})")
    args = [] if input is None else decode(input)
    if not isinstance(args, list):
        raise QueryFailedError("query arguments must be a JSON list (one value per parameter)")
    with gen.read_only():
        try:
            value = handler(*args)
        except QueryFailedError:
            raise
        except Exception as exc:
            raise QueryFailedError(
                f"query handler {name!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        if gen.query_refused:  # the handler caught the refusal and went on
            raise QueryFailedError(
                f"query handler {name!r} tried to decide something; " + "a query is read-only"
            )
    if isinstance(value, CoroutineType):
        value.close()
        raise QueryFailedError(
            f"query handler {name!r} is async: a query handler is a plain function that "
            f"returns the value at once"
        )
    try:
        return encode(value)
    except Exception as exc:
        raise QueryFailedError(f"query handler {name!r} returned no JSON value: {exc}") from exc
