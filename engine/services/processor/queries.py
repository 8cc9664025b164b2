"""The processor's side of queries: answer a ``QueryWorkflow`` from the instance's state.

A query is read-only, so it is not a command in the usual sense: it is not de-duplicated
(asking twice is harmless and the state may have moved on), nothing is remembered in the
instance row, and no history is written. The answer is a :class:`CommandOutcome` on the
command-outcomes topic with the query's request id and the handler's value in ``output``,
produced in the batch's transaction like every answer, so a client reads it the way it
reads any command's answer. The handler runs on the instance's execution as the last turn
left it (the cached one, or one replayed from the current generation's history rows, which
then stays in the cache for the next turn); ``engine.runtime.queries`` keeps it read-only.
Replay and handler run under the turn watchdog like a turn, so a handler that never returns
is stopped and answered ``QueryFailedError`` instead of holding up the partition.
"""

from __future__ import annotations

import logging

from engine.core import errors
from engine.core.messages import QueryWorkflow
from engine.core.payloads import Payload
from engine.runtime.queries import run_query
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, accepted, refused, send_outcome
from engine.services.watchdog import REPLAY_EVENTS_PER_BUDGET

log = logging.getLogger("engine.processor")

__all__ = ["on_query"]


def on_query(b: Batch, msg: QueryWorkflow, now_ms: int) -> None:
    """Answer the query (accepted with the value, or refused with the reason)."""
    verdict, output = _answer(b, msg)
    b.counters.outcome(msg.KIND, verdict.result.value.lower())
    if msg.request_id:
        send_outcome(b, msg.instance_id, msg.request_id, msg.KIND, verdict, now_ms, output=output)


def _answer(b: Batch, msg: QueryWorkflow) -> tuple[Verdict, Payload | None]:
    item = b.load(msg.instance_id)
    meta = item.meta
    if not meta.exists:
        return refused(errors.InstanceNotFoundError, f"no instance {msg.instance_id}"), None
    watchdog = b.env.watchdog
    try:
        if item.execution is None:
            rows = b.tables.history(meta.instance_id, meta.generation_start)
            watchdog.run(
                lambda: b.replay(item, rows),
                f"the replay of {meta.instance_id!r} for a query",
                scale=len(rows) / REPLAY_EVENTS_PER_BUDGET,
            )
    except Exception as exc:  # its code does not replay (a parked instance, say)
        item.execution = None
        log.info("%s: not replayed to answer a query: %s", msg.instance_id, exc)
        reason = (
            f"instance {msg.instance_id} could not be replayed to answer the query "
            f"({type(exc).__name__}: {exc}); its status says why"
        )
        return refused(errors.QueryFailedError, reason), None
    execution = item.execution
    assert execution is not None
    try:
        what = f"query {msg.name!r} of {meta.instance_id!r}"
        return accepted(), watchdog.run(lambda: run_query(execution, msg.name, msg.input), what)
    except (errors.UnknownQueryError, errors.QueryFailedError) as exc:
        return refused(type(exc), str(exc)), None
    except errors.WorkflowTurnTimeoutError as exc:  # a handler that never returns
        item.execution = None  # rebuilt by the next turn: nothing half-read stays
        return refused(errors.QueryFailedError, str(exc)), None
