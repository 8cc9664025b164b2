"""Run ids: telling the runs of one instance id apart, across purges.

Within one life of an instance row the generation tells its runs apart: every new run and
every continue-as-new moves it on, and a reply for another generation is dropped. A purge
removes the row, so a later start of the same id begins again at generation 0, and a reply
of the purged run (a late activity result, a child's result, the child start a worker or the
broker delivers again) would look exactly like one of the new run's. So every run gets an
id: the processor makes it when a start begins a run (a first start, a restart of an ended
id, a start after a purge, a rerun's new instance) and records it in the run's
``ExecutionStarted`` and in the row. It is derived from the record that starts the run (its
topic, partition and offset, and the instance id): offsets never repeat, so no two lives of
an id share it, and a batch that is redone after an abort makes the same id again, so what
the run's first turn did (an inline step's idempotency key) is named alike both times. A
start that waits for its scheduled time gets its id when the start arrives; a begin no
record brought (there is none left) gets a random one. Continue-as-new keeps it: the
runtime, which must stay free of randomness, begins those generations itself, and the
generation already tells them apart; a reset keeps it too (its new generation does). So (run
id, generation) is unique for every generation of every life of an id.

What a run sends carries its run id (activity tasks, child starts, activity cancels), and
what comes back names it (activity results, child results); a reply naming another run than
the row's is rejected and counted, never applied. Records without a run id (written before
run ids, or for a run from before them) match by generation alone, as they did. Timers need
none: a purge deletes an instance's timer rows with it.
"""

from __future__ import annotations

import hashlib
import uuid

from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow
from engine.services.processor.batch import Batch


def new_run_id(b: Batch, instance_id: str) -> str:
    """The run id of a run the record being handled starts (random when no record is)."""
    record = b.current
    if record is None:
        return uuid.uuid4().hex
    seed = f"{record.topic}/{record.partition}/{record.offset}/{instance_id}"
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


def run_id_at_begin(b: Batch, meta: InstanceRow) -> str:
    """The id of the run ``meta`` begins now: the one its start got when it arrived, for a
    start that waited for its time (a timer begins it), else one from the record at hand."""
    if b.current is None and meta.status is RuntimeStatus.PENDING and meta.run_id:
        return meta.run_id
    return new_run_id(b, meta.instance_id)


def is_other_run(meta: InstanceRow, run_id: str) -> bool:
    """Whether a reply naming ``run_id`` was meant for another run than the row's current
    one (False when either side predates run ids: the generation check decides)."""
    return is_other_run_id(meta.run_id, run_id)


def is_other_run_id(current: str, run_id: str) -> bool:
    """:func:`is_other_run` for a run id kept elsewhere than the row."""
    return bool(run_id) and bool(current) and run_id != current


def child_request_id(parent: str, run_id: str, generation: int, task_id: int) -> str:
    """The request id of a child start: the parent's call, so that a start sent again (a
    redone turn) is answered as a duplicate, and a later run of the parent's id (after a
    purge, with the same generation and task id) is not."""
    if run_id:
        return f"{parent}/{run_id}/{generation}/{task_id}"
    return f"{parent}/{generation}/{task_id}"
