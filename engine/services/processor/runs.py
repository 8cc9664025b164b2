"""Run ids: telling the runs of one instance id apart, across purges.

Within one life of an instance row the generation tells its runs apart: every new run and
every continue-as-new moves it on, and a reply for another generation is dropped. A purge
removes the row, so a later start of the same id begins again at generation 0, and a reply
of the purged run (a late activity result, a child's result, the child start a worker or
the broker delivers again) would look exactly like one of the new run's. So every run gets
an id: the processor makes it when a start begins a run (a first start, a restart of an
ended id, a start after a purge, a rerun's new instance) and records it in the run's
``ExecutionStarted`` and in the row. Continue-as-new keeps it: the runtime, which must stay
free of randomness, begins those generations itself, and the generation already tells them
apart; a reset keeps it too (its new generation does). So (run id, generation) is unique
for every generation of every life of an id.

What a run sends carries its run id (activity tasks, child starts, activity cancels), and
what comes back names it (activity results, child results); a reply naming another run
than the row's is rejected and counted, never applied. Records without a run id (written
before run ids, or for a run from before them) match by generation alone, as they did.
Timers need none: a purge deletes an instance's timer rows with it.
"""

from __future__ import annotations

import uuid

from engine.core.instance_row import InstanceRow


def new_run_id() -> str:
    """A fresh run id (random: it must differ from every earlier run of the id, and the
    processor keeps nothing of a purged run to count on)."""
    return uuid.uuid4().hex


def is_other_run(meta: InstanceRow, run_id: str) -> bool:
    """Whether a reply naming ``run_id`` was meant for another run than the row's current
    one (False when either side predates run ids: the generation check decides)."""
    return bool(run_id) and bool(meta.run_id) and run_id != meta.run_id


def child_request_id(parent: str, run_id: str, generation: int, task_id: int) -> str:
    """The request id of a child start: the parent's call, so that a start sent again (a
    redone turn) is answered as a duplicate, and a later run of the parent's id (after a
    purge, with the same generation and task id) is not."""
    if run_id:
        return f"{parent}/{run_id}/{generation}/{task_id}"
    return f"{parent}/{generation}/{task_id}"
