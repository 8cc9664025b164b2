"""Per-key concurrency limits on starts: moving the slot messages.

A start that names a ``concurrency_key`` for a workflow declared with
``max_concurrency_per_key=K`` does not begin on its own partition. Its instance waits as
PENDING (the start kept in ``scheduled_start``, ``slot`` naming the slots row) and sends an
ACQUIRE to the slots row's id (``engine.core.concurrency.slots_id``) on instance-messages.
That row lives on the one partition owning the id, which applies every ACQUIRE and RELEASE
of the key in log order (``engine.core.concurrency`` decides) and answers each admitted run
with a GRANT; the instance begins when its GRANT arrives. A run that ends (completed,
failed, terminated; a continue-as-new keeps its slot) or stops waiting sends a RELEASE.
Every step is a row change and a message in the batch's transaction, so a restart or a
takeover finds the running set, the queue and the messages in flight exactly as committed.
"""

from __future__ import annotations

from engine.core.concurrency import (
    SLOTS_PREFIX,
    ConcurrencySlots,
    SlotHolder,
    acquire,
    release,
    slots_id,
)
from engine.core.errors import TurnstileError
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow
from engine.core.messages import ConcurrencySlot, RerunFrom, ResetWorkflow, SlotOp, StartWorkflow
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded


def limit_of(b: Batch, name: str, version: str) -> int:
    """The workflow's ``max_concurrency_per_key`` (0: none, or the workflow is unknown:
    then the runtime fails the instance and says why)."""
    try:
        return b.env.registry.get_workflow(name, version).max_concurrency_per_key
    except TurnstileError:
        return 0


def wait_for_slot(b: Batch, item: Loaded, msg: StartWorkflow, limit: int, now_ms: int) -> None:
    """The instance waits as PENDING for a slot of its key; asks the slots row for one."""
    meta = item.meta
    meta.name, meta.input = msg.name, msg.input
    meta.version = b.env.registry.start_version(msg.name, msg.version)  # re-resolved at start
    meta.request_id = msg.request_id
    queue(b, item, msg, msg.concurrency_key, limit, now_ms)


def queue(
    b: Batch,
    item: Loaded,
    waiting: StartWorkflow | ResetWorkflow | RerunFrom,
    key: str,
    limit: int,
    now_ms: int,
) -> None:
    """The instance waits as PENDING, ``waiting`` kept until its GRANT: a start, or a
    reset or rerun of a run of workflow ``meta.name`` (whose limit is ``limit``)."""
    meta = item.meta
    give_back(b, meta)  # a previous run's slot, if it still held one
    if meta.exists and meta.status is not RuntimeStatus.PENDING:
        meta.generation += 1
    meta.status = RuntimeStatus.PENDING
    meta.output = meta.failure = meta.custom_status = None
    meta.created_ms = meta.last_updated_ms = now_ms
    meta.scheduled_start = waiting
    meta.concurrency_key = key
    meta.slot = slots_id(meta.name, key)
    _send(b, meta.slot, SlotOp.ACQUIRE, meta.instance_id, meta.generation, limit)
    b.save(meta)


def give_back(b: Batch, meta: InstanceRow) -> None:
    """The run ended or stopped waiting: free its slot (or its place in the queue)."""
    if not meta.slot:
        return
    _send(b, meta.slot, SlotOp.RELEASE, meta.instance_id, meta.generation, 0)
    meta.slot = ""
    b.save(meta)


def release_ended(b: Batch) -> None:
    """Give back the slots of every run the batch ended, whichever way it ended (the
    state machine calls it before the batch closes)."""
    for item in list(b.touched.values()):
        status = item.meta.status
        if item.meta.slot and status is not None and status.is_terminal:
            b.origin = item.meta.instance_id
            give_back(b, item.meta)
    b.origin = ""


def on_slots_row(b: Batch, msg: ConcurrencySlot) -> None:
    """ACQUIRE or RELEASE at the slots row: apply it, GRANT whoever it admits."""
    if not msg.instance_id.startswith(SLOTS_PREFIX):
        b.dead_letter_current(
            f"{msg.op.value} for {msg.instance_id!r}, which is not a slots row (ids start "
            f"with {SLOTS_PREFIX!r}); only the engine sends these records",
            kind="NotASlotsRow",
        )
        return
    item = b.load(msg.instance_id)
    meta = item.meta
    slots = meta.slots or ConcurrencySlots()
    if msg.op is SlotOp.ACQUIRE:
        granted = acquire(slots, SlotHolder(msg.holder, msg.generation), msg.limit)
    else:
        granted = release(slots, msg.holder)
    for holder in granted:
        _send(b, holder.instance_id, SlotOp.GRANT, holder.instance_id, holder.generation, 0)
    if slots.empty:
        if meta.slots is not None:
            b.remove(meta)
            item.meta = InstanceRow(meta.instance_id)
        return
    meta.slots = slots
    b.save(meta)


def granted_start(
    b: Batch, msg: ConcurrencySlot
) -> StartWorkflow | ResetWorkflow | RerunFrom | None:
    """The start (or reset, or rerun) a GRANT admits, or None when the run it names no
    longer waits (it was terminated or replaced; its RELEASE already freed the slot)."""
    meta = b.load(msg.instance_id).meta
    waits = meta.status is RuntimeStatus.PENDING and bool(meta.slot)
    if not waits or meta.generation != msg.generation or meta.scheduled_start is None:
        b.counters.reject(msg.KIND)
        return None
    return meta.scheduled_start


def _send(b: Batch, to: str, op: SlotOp, holder: str, generation: int, limit: int) -> None:
    message = ConcurrencySlot(
        instance_id=to, op=op, holder=holder, generation=generation, limit=limit
    )
    b.send(b.env.topics.instance_messages, message)
