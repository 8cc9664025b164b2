"""The idempotency key of one call a workflow makes: an activity call or an inline step.

Both kinds of call may run their body more than once (an activity attempt after a worker
crash or a retry, an inline step after a turn is redone), so code with side effects hands
the key to the system it touches. The key must be the same on every re-run of the one
call and differ between calls: a call is named by its instance, the run id of the start
that began the run (so a later life of a purged and reused instance id gets new keys), the
generation it belongs to, and its task id, which the runtime hands out deterministically
in each generation, so a redone turn gives its calls the same ids again. Task ids are
unique within a generation across every kind of call, so an activity's key and a step's
key never collide. This function is the one place the key is made.
"""

from __future__ import annotations

__all__ = ["call_key"]


def call_key(instance_id: str, run_id: str, generation: int, task_id: int) -> str:
    """``instance/run id/generation/task id``: one per call, the same on every re-run of
    it; runs from before run ids (``run_id`` empty) have ``instance/generation/task id``."""
    if run_id:
        return f"{instance_id}/{run_id}/{generation}/{task_id}"
    return f"{instance_id}/{generation}/{task_id}"
