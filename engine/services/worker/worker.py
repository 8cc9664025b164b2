"""The activity worker's logic, free of Kafka: what to run, what to produce, what to commit.

The Kafka loop (``engine.adapters.kafka.worker``) feeds task records in and asks this module
what to do next. The split keeps the delicate parts - which offsets are safe to commit, when
to pause, how a failure is reported - testable without a broker.

Delivery guarantees. An activity body runs *at least once*: results of finished tasks are
produced as soon as they are ready (by an idempotent producer, outside any transaction), and
a partition's offset is only committed up to its lowest task that is not *settled*: still
running, or with a record (result, dead letter, note, requeued task) whose delivery the
broker has not acknowledged yet. A worker that crashes before committing past a task hands
it to the next owner, which runs it again, so a result can reach the processor twice; the
processor applies each attempt's result at most once and drops the copy. Activities that
touch the outside world should use ``current_activity().idempotency_key`` (one per call:
the same across retries and redeliveries).

A record whose delivery fails is handed out again (:meth:`Worker.redo`) and keeps its task's
offset from being committed until it is delivered, so a failure never loses a result and
never forces a task to run again.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from engine.codec import decode_message, encode_message
from engine.core.activity_info import ActivityCompletesLater
from engine.core.errors import CodecError, TurnstileError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.messages import ActivityCancel, ActivityResult, ActivityTask
from engine.core.payloads import Payload
from engine.core.task_queues import DEFAULT_TASK_QUEUE
from engine.core.tracecontext import SpanContext
from engine.runtime.registry import Registry
from engine.services.dead_letters import dead_letter_of
from engine.services.records import RawRecord as TaskRecord
from engine.services.tracing import NoTracing, TraceHook
from engine.services.worker.attempt_spans import attempt_parent, attempt_span
from engine.services.worker.attempts import CANCELLED_TYPE, Attempt, cancelled_failure
from engine.services.worker.offsets import OffsetTracker
from engine.services.worker.queue_limits import QueueLimits
from engine.services.worker.runner import ActivityRunner
from engine.services.worker.timeouts import TIMEOUT_TYPE, not_startable

__all__ = [
    "REQUEUES_HEADER",
    "ActivityRunner",
    "CommitPolicy",
    "Completion",
    "FlowAction",
    "OffsetTracker",
    "Outbound",
    "TaskRecord",
    "Worker",
    "dead_letter",
]

log = logging.getLogger(__name__)


Headers = tuple[tuple[str, bytes], ...]


# --- records in and out --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outbound:
    """A record to produce: a result (``dead=False``) or a dead letter (``dead=True``).

    ``partition``, ``offset`` and ``epoch`` name the *source* task record it answers: its
    offset is not committed until this record is delivered, and records of partitions this
    worker no longer owns are dropped; the output partition is chosen by key (murmur2).
    """

    key: bytes
    value: bytes
    partition: int
    dead: bool = False
    headers: Headers = ()
    #: A task put back on the worker's own task-queue topic, on partition ``requeue_to``
    #: (see :meth:`Worker.accept`); ``None``: a result or a dead letter.
    requeue_to: int | None = None
    #: Offset and epoch of the source task record (see :class:`OffsetTracker`).
    offset: int = -1
    epoch: int = 0


def dead_letter(record: TaskRecord, topic: str, reason: str, epoch: int = 0) -> Outbound:
    """The dead-letter record for an unusable input record, with the reason in headers."""
    value, headers = dead_letter_of(record, topic, reason)
    key = record.key or b""
    return Outbound(key, value, record.partition, True, headers, None, record.offset, epoch)


# --- activities ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished activity run, as handed back by the runner."""

    task: ActivityTask
    partition: int
    offset: int
    epoch: int
    output: Payload | None = None
    failure: FailureDetails | None = None
    duration_s: float = 0.0
    #: The attempt's trace parent (the scheduling turn) and wall-clock start, if traced.
    parent: SpanContext | None = None
    began_ns: int = 0
    #: The last heartbeat details of a failed attempt.
    details: Payload | None = None

    @property
    def outcome(self) -> str:
        """``success``, ``timeout``, ``cancelled``, ``later`` (``complete_later()``: the
        holder of its task token finishes it) or ``failure``: the metrics' result label."""
        if self.failure is None:
            return "success"
        if self.failure.type == CANCELLED_TYPE:
            return "cancelled"
        if self.failure.type == LATER_TYPE:
            return "later"
        return "timeout" if self.failure.type in _TIMEOUT_TYPES else "failure"

    def result(self) -> ActivityResult:
        t = self.task
        return ActivityResult(
            t.instance_id,
            t.generation,
            t.task_id,
            t.attempt,
            self.output,
            self.failure,
            details=self.details,
            run_id=t.run_id,
        )


def _log_failed_attempt(c: Completion) -> None:
    """One WARNING per failed or timed-out attempt: what ran, which attempt, why (the
    workflow's retry policy decides what happens next)."""
    task, failure = c.task, c.failure
    assert failure is not None
    what = "timed out" if c.outcome == "timeout" else "failed"
    log.warning(
        "activity %s %s: instance %s, task %d, attempt %d: %s: %s",
        task.name,
        what,
        task.instance_id,
        task.task_id,
        task.attempt,
        failure.type,
        failure.message,
        extra={
            "instance_id": task.instance_id,
            "generation": task.generation,
            "task_id": task.task_id,
            "attempt": task.attempt,
            "error_type": failure.type,
        },
    )


_TIMEOUT_TYPES = frozenset({"TimeoutError", TIMEOUT_TYPE})
#: The failure type of an attempt whose body called ``complete_later()`` (also from a child
#: process, where the exception arrives as its type name).
LATER_TYPE = ActivityCompletesLater.__name__


class ActivityObserver(Protocol):
    """What a worker tells its metrics about each attempt (called on the loop's thread)."""

    def started(self, activity: str) -> None:
        """An attempt of ``activity`` was taken and is starting (or queued to start)."""

    def finished(self, activity: str, result: str, duration_s: float) -> None:
        """An attempt ended with ``result`` (success, failure, timeout) after running
        ``duration_s`` seconds."""

    def unserved(self, activity: str, task_queue: str) -> None:
        """A task for ``activity``, which this worker does not register, went back to its
        queue."""


# --- flow control and commit timing --------------------------------------------------------


class FlowAction(StrEnum):
    NONE = "none"
    PAUSE = "pause"
    RESUME = "resume"


def flow_action(load: int, high: int, low: int, paused: bool) -> FlowAction:
    """Pause the partitions once ``high`` tasks are taken; resume when at most ``low`` are.

    Polling goes on while paused, so a long activity never exceeds max.poll.interval.ms and
    never causes a rebalance. The gap between the two marks is a prefetch backlog: pausing
    and resuming costs a fetch round trip each time, which short activities would otherwise
    pay on nearly every task.
    """
    if not paused and load >= high:
        return FlowAction.PAUSE
    if paused and load <= low:
        return FlowAction.RESUME
    return FlowAction.NONE


@dataclass
class CommitPolicy:
    """Batch offset commits: commit ``interval_s`` after something settled, or as soon as
    idle. Results do not wait for the commit (they are visible once delivered), so the
    interval only bounds how much a crash makes run again and how many commits are sent."""

    interval_s: float = 0.1
    clock: Callable[[], float] = time.monotonic
    _changed: float | None = None

    def changed(self) -> None:
        """Something settled since the last commit."""
        if self._changed is None:
            self._changed = self.clock()

    def committed(self) -> None:
        self._changed = None

    def due(self, *, idle: bool) -> bool:
        if self._changed is None:
            return False
        return idle or self.clock() - self._changed >= self.interval_s


# --- the worker ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Pending:
    task: ActivityTask
    partition: int
    offset: int
    epoch: int
    parent: SpanContext | None = None


#: Waiting tasks per partition at which a queue-limited worker pauses that partition.
_PARTITION_BACKLOG = 8
#: The default prefetch (tasks taken beyond ``concurrency``), at least 4 x concurrency.
#: Every pause empties librdkafka's fetch queue and every resume costs fetch round trips,
#: so a small backlog makes a burst of short activities pay that every few dozen tasks
#: (a backlog of 64 ran chain3 at 0.38x the throughput of one of 1,000).
_DEFAULT_PREFETCH = 1000
#: The backlog's bound in record bytes (estimated from the mean task size): large inputs
#: shrink the prefetch so that a worker never holds more than this in waiting tasks.
_BACKLOG_BYTES = 64 * 2**20

#: What ``Worker.stats`` counts: tasks taken, results, failures, dead letters, expired
#: (past schedule-to-start), unserved and cancelled tasks.
_STATS = ("tasks", "results", "failures", "dead", "expired", "unserved", "cancelled", "later")

#: The header that counts how often a task went back to its queue unserved.
REQUEUES_HEADER = "turnstile-requeues"
#: How long an unserved task is held before it goes back to its queue: doubling per
#: requeue, so a task no worker serves costs a record every ``_REQUEUE_MAX_S`` at most.
_REQUEUE_FIRST_S = 0.5
_REQUEUE_MAX_S = 10.0


@dataclass(frozen=True, slots=True)
class _Unserved:
    """A task of an activity this worker lacks, held until ``due`` and then put back on its
    queue, one partition further on (so it reaches the group's other members in turn)."""

    record: TaskRecord
    epoch: int
    requeues: int
    due: float
    #: (instance, run id, generation, task id, attempt) of the task, to match a cancellation.
    call: tuple[str, str, int, int, int] = ("", "", 0, 0, 0)

    def requeued(self, partitions: int) -> Outbound:
        headers = tuple(h for h in self.record.headers if h[0] != REQUEUES_HEADER)
        headers += ((REQUEUES_HEADER, str(self.requeues + 1).encode()),)
        target = (self.record.partition + 1) % max(partitions, 1)
        key, value = self.record.key or b"", self.record.value or b""
        r = self.record
        return Outbound(key, value, r.partition, False, headers, target, r.offset, self.epoch)


def _call_of(task: ActivityTask) -> tuple[str, str, int, int, int]:
    return (task.instance_id, task.run_id, task.generation, task.task_id, task.attempt)


def _located(
    record: TaskRecord, task: ActivityTask, epoch: int, unserved: str, queue: str
) -> Outbound:
    """The note for the processor about a task record taken here: ``unserved`` (this
    worker lacks the activity; the task goes back to its queue) and, for a requeued copy,
    where the copy is. The processor sends a cancellation of the attempt to that partition;
    the note leaves only after the copy was read, so the cancellation comes after it."""
    requeues = _requeues(record)
    result = ActivityResult(
        task.instance_id,
        task.generation,
        task.task_id,
        task.attempt,
        unserved=unserved,
        requeued_to=record.partition if requeues else -1,
        requeues=requeues,
        task_queue=queue if requeues else "",
        run_id=task.run_id,
    )
    key = task.instance_id.encode("utf-8")
    return Outbound(
        key, encode_message(result), record.partition, offset=record.offset, epoch=epoch
    )


def _requeues(record: TaskRecord) -> int:
    for name, value in record.headers:
        if name == REQUEUES_HEADER:
            try:
                return max(int(value), 0)
            except ValueError:
                return 0
    return 0


class Worker:
    """The worker's state machine: accepts task records, runs them, hands out what to produce
    and which offsets to commit. Called from one thread (the Kafka loop) only, except for
    the completion queue that runner threads fill.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        source_topic: str,
        concurrency: int = 16,
        prefetch: int | None = None,
        worker_id: str = "",
        runner: ActivityRunner | None = None,
        observer: ActivityObserver | None = None,
        tracing: TraceHook | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        wall_ms: Callable[[], int] | None = None,
        executor: str = "thread",
        queue_limits: QueueLimits | None = None,
    ) -> None:
        """``wall_ms``: the wall clock the timeouts are checked against, in epoch ms (the
        in-process test engine passes its manual clock; default: the system's)."""
        if concurrency < 1:
            raise TurnstileError(f"worker concurrency must be at least 1, got {concurrency}")
        self.registry = registry
        self.source_topic = source_topic
        self.concurrency = concurrency
        #: Tasks taken beyond ``concurrency`` wait here (at most ``_BACKLOG_BYTES`` of
        #: them); default: ``_DEFAULT_PREFETCH`` or 4 x concurrency if that is more.
        self.prefetch = (
            max(4 * concurrency, _DEFAULT_PREFETCH) if prefetch is None else max(prefetch, 0)
        )
        #: The mean size of a task record (moving average), for the backlog's byte bound.
        self._task_bytes = 1024.0
        self.worker_id = worker_id
        self.runner = runner or ActivityRunner(concurrency, worker_id, executor)
        self.observer = observer
        self.tracing: TraceHook = tracing or NoTracing()
        self.task_queue = task_queue
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        #: Partitions of ``source_topic``: where unserved tasks are put back (the adapter
        #: sets it from the topic's metadata).
        self.source_partitions = 1
        self.offsets = OffsetTracker()
        self._backlog: deque[_Pending] = deque()
        self._unserved: list[_Unserved] = []
        #: Per-worker limits of activities registered with max_concurrency, and how many
        #: of each run now.
        self._limits = {a.name: a.max_concurrency for a in registry.activities()}
        self._limited = any(self._limits.values())
        #: The queue's fleet-wide rate and concurrency, this worker's share per partition.
        self.queue_limits = queue_limits or QueueLimits()
        self._by_activity: dict[str, int] = {}
        #: Attempts running now, by (partition, offset, epoch) of their task.
        self._attempts: dict[tuple[int, int, int], Attempt] = {}
        self._done: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._running = 0
        #: Records whose delivery failed, to be produced again (see :meth:`redo`).
        self._redo: list[Outbound] = []
        self.stats: dict[str, int] = dict.fromkeys(_STATS, 0)

    # --- load -------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Activities executing now (including ones whose partition moved away)."""
        return self._running

    @property
    def load(self) -> int:
        """Running plus waiting tasks: what the pause decision looks at."""
        return self._running + len(self._backlog)

    @property
    def queued(self) -> int:
        """Tasks taken and waiting for a free slot."""
        return len(self._backlog)

    @property
    def backlog_room(self) -> int:
        """How many tasks may wait for a slot: ``prefetch``, fewer when tasks are large."""
        if not self.prefetch:
            return 0
        return max(min(self.prefetch, int(_BACKLOG_BYTES // self._task_bytes)), 1)

    @property
    def free(self) -> int:
        """How many more tasks to take before pausing."""
        return max(self.concurrency + self.backlog_room - self.load, 0)

    @property
    def idle(self) -> bool:
        return self.load == 0 and not self._unserved

    @property
    def unsent(self) -> int:
        """Records produced and not delivered yet (those to produce again included)."""
        return self.offsets.unsent

    @property
    def redo_pending(self) -> bool:
        """Whether records wait to be produced again (:meth:`redo`)."""
        return bool(self._redo)

    @property
    def settled(self) -> bool:
        """Idle, and every record it produced was delivered: all it consumed may commit."""
        return self.idle and self.offsets.unsent == 0

    @property
    def held(self) -> int:
        """Unserved tasks waiting to go back to their queue."""
        return len(self._unserved)

    def crowded_partitions(self) -> set[int]:
        """Partitions with at least ``_PARTITION_BACKLOG`` tasks waiting: under a queue
        limit the adapter pauses them one by one, so that every partition's share of the
        limit has tasks to start."""
        counts: dict[int, int] = {}
        for p in self._backlog:
            counts[p.partition] = counts.get(p.partition, 0) + 1
        return {p for p, n in counts.items() if n >= _PARTITION_BACKLOG}

    def flow(self, paused: bool) -> FlowAction:
        room = self.backlog_room
        high = self.concurrency + room
        low = self.concurrency if room else self.concurrency - 1
        if self.queue_limits.active:
            # the waiting tasks are bounded per partition instead (crowded_partitions):
            # a pause of all of them would starve the partitions with nothing waiting
            return flow_action(self._running, self.concurrency, self.concurrency - 1, paused)
        # records on their way count too: a producer that cannot deliver stops the intake
        return flow_action(self.load + self.unsent, high, low, paused)

    # --- input ------------------------------------------------------------------------------

    def accept(self, records: Iterable[TaskRecord]) -> list[Outbound]:
        """Take consumed records: start (or queue) tasks; returns what to produce at once
        (dead letters, and notes for the processor about tasks this worker does not serve).

        A task of an activity this worker does not register is never failed: another
        worker of the same task queue may have it (a rolling deploy, say). The worker tells
        the instance (its status shows the note) and puts the task back on the queue after
        a growing delay, one partition further, so it visits the other members in turn.
        """
        letters: list[Outbound] = []
        for record in records:
            self._task_bytes += (len(record.value or b"") - self._task_bytes) / 16
            epoch = self.offsets.consumed(record.partition, record.offset)
            if epoch is None:
                log.debug("ignoring a record of unassigned partition %d", record.partition)
                continue
            task, reason = self._decode(record)
            if task is None:
                letters.append(self._held(dead_letter(record, self.source_topic, reason, epoch)))
                self.offsets.done(record.partition, record.offset, epoch)
                self.stats["dead"] += 1
                continue
            if isinstance(task, ActivityCancel):
                self.offsets.done(record.partition, record.offset, epoch)
                self._cancel(task)
                continue
            if not self.registry.has_activity(task.name):
                letters.append(self._held(self._hold_unserved(record, task, epoch)))
                continue
            if _requeues(record):  # a copy some worker put back: tell where it is now
                queue = task.task_queue or self.task_queue
                letters.append(self._held(_located(record, task, epoch, "", queue)))
            self.stats["tasks"] += 1
            if self.observer is not None:
                self.observer.started(task.name)
            parent = attempt_parent(self.tracing, record)
            self._backlog.append(_Pending(task, record.partition, record.offset, epoch, parent))
        self._start_backlog()
        return letters

    def _held(self, record: Outbound) -> Outbound:
        """``record``, with its source offset kept open until it is delivered."""
        self.offsets.hold(record.partition, record.offset, record.epoch)
        return record

    def _hold_unserved(self, record: TaskRecord, task: ActivityTask, epoch: int) -> Outbound:
        requeues = _requeues(record)
        delay = min(_REQUEUE_FIRST_S * 2**requeues, _REQUEUE_MAX_S)
        due = time.monotonic() + delay
        self._unserved.append(_Unserved(record, epoch, requeues, due, _call_of(task)))
        self.stats["unserved"] += 1
        if self.observer is not None:
            self.observer.unserved(task.name, task.task_queue or self.task_queue)
        names = ", ".join(sorted(a.name for a in self.registry.activities())) or "none"
        queue = task.task_queue or self.task_queue
        note = (
            f"activity {task.name!r} (task queue {queue!r}) is not served by worker "
            f"{self.worker_id or '(unnamed)'} (it registers: {names}); the task waits on the "
            f"queue for a worker that registers it: start one with --task-queue {queue} and "
            f"the module that defines {task.name!r}"
        )
        log.warning("%s (%s)", note, task.attempt_label)
        return _located(record, task, epoch, note, queue)

    def _requeue_due(self) -> list[Outbound]:
        """Unserved tasks whose delay is over, as records back onto the queue (their
        offsets settle once these are delivered)."""
        if not self._unserved:
            return []
        now = time.monotonic()
        due = [u for u in self._unserved if u.due <= now]
        if not due:
            return []
        self._unserved = [u for u in self._unserved if u.due > now]
        out = []
        for u in due:
            if self.offsets.is_current(u.record.partition, u.epoch):
                out.append(self._held(u.requeued(self.source_partitions)))
                self.offsets.done(u.record.partition, u.record.offset, u.epoch)
        return out

    def _cancel(self, c: ActivityCancel) -> None:
        """Stop the attempt the workflow no longer waits for: running (the runner stops
        it), waiting for a slot, or held as unserved (dropped); else it is over already."""
        call = (c.instance_id, c.run_id, c.generation, c.task_id, c.attempt)
        for attempt in list(self._attempts.values()):
            if _call_of(attempt.task) == call:
                log.info("cancelling %s: %s", attempt.task.attempt_label, c.reason)
                attempt.stop(cancelled_failure(attempt.task, c.reason))
                return
        for p in [p for p in self._backlog if _call_of(p.task) == call]:
            self._backlog.remove(p)
            self.offsets.done(p.partition, p.offset, p.epoch)
            self.stats["cancelled"] += 1
            if self.observer is not None:
                self.observer.finished(p.task.name, "cancelled", 0.0)
        for u in [u for u in self._unserved if u.call == call]:
            self._unserved.remove(u)
            self.offsets.done(u.record.partition, u.record.offset, u.epoch)

    def _decode(self, record: TaskRecord) -> tuple[ActivityTask | ActivityCancel | None, str]:
        if record.value is None:
            return None, "empty record (tombstone) on the activity-tasks topic"
        try:
            message = decode_message(record.value)
        except CodecError as exc:
            return None, f"undecodable activity task: {exc}"
        if isinstance(message, ActivityCancel):
            return message, ""
        if not isinstance(message, ActivityTask):
            return None, f"{type(message).__name__} record on the activity-tasks topic"
        return message, ""

    def _start_backlog(self) -> None:
        """Start waiting tasks in order while slots are free; a task whose activity is at
        its own per-worker limit (``@activity(max_concurrency=N)``) waits, later tasks of
        other activities go first."""
        if not self._limited and not self.queue_limits.active:
            while self._backlog and self._running < self.concurrency:
                self._launch(self._backlog.popleft())
            return
        waiting: deque[_Pending] = deque()
        while self._backlog and self._running < self.concurrency:
            pending = self._backlog.popleft()
            if self._may_start(pending):
                self._launch(pending)
            else:
                waiting.append(pending)
        waiting.extend(self._backlog)
        self._backlog = waiting

    def _may_start(self, pending: _Pending) -> bool:
        limit = self._limits.get(pending.task.name, 0)
        if limit and self._by_activity.get(pending.task.name, 0) >= limit:
            return False
        return self.queue_limits.may_start(pending.partition)

    def _launch(self, pending: _Pending) -> None:
        self._running += 1
        name = pending.task.name
        self._by_activity[name] = self._by_activity.get(name, 0) + 1
        self.queue_limits.started(pending.partition)
        self._start(pending)

    def _start(self, p: _Pending) -> None:
        began = time.monotonic()
        began_ns = time.time_ns() if p.parent is not None else 0

        def done(
            output: Payload | None,
            failure: FailureDetails | None,
            details: Payload | None = None,
        ) -> None:
            took = time.monotonic() - began
            self._done.put(
                Completion(
                    p.task,
                    p.partition,
                    p.offset,
                    p.epoch,
                    output,
                    failure,
                    took,
                    parent=p.parent,
                    began_ns=began_ns,
                    details=details,
                )
            )

        task = p.task
        now_ms = self._wall_ms()
        refused = not_startable(task, now_ms)
        if refused is not None:
            self.stats["expired"] += 1
            done(None, refused)
            return
        fn = self.registry.get_activity(p.task.name).fn  # accept() checked it
        try:
            self._attempts[(p.partition, p.offset, p.epoch)] = self.runner.submit(
                fn, p.task, done, now_ms
            )
        except CodecError as exc:  # an input payload no converter can read: final
            done(None, failure_from_exception(exc, retryable=False))
        except Exception as exc:  # the runner is shutting down: let a retry run it
            done(None, failure_from_exception(exc))

    # --- output -----------------------------------------------------------------------------

    def collect(self, wait_s: float = 0.0) -> list[Outbound]:
        """Results of activities that finished since the last call (waiting up to ``wait_s``
        for the first one), and unserved tasks due to go back to their queue. Each keeps
        its task's offset open until :meth:`delivered` is called for it."""
        out = self._requeue_due()
        self._check_heartbeats()
        if self._backlog and self.queue_limits.rate:
            self._start_backlog()  # tokens refill with time, not only when a task ends
        try:
            completion = self._done.get(timeout=wait_s) if wait_s > 0 else self._done.get_nowait()
        except queue.Empty:
            return out
        while True:
            self._running -= 1
            name = completion.task.name
            self._by_activity[name] = self._by_activity.get(name, 1) - 1
            self.queue_limits.finished(completion.partition)
            self._attempts.pop((completion.partition, completion.offset, completion.epoch), None)
            if self.observer is not None:
                self.observer.finished(
                    completion.task.name, completion.outcome, completion.duration_s
                )
            result = self._result(completion)
            if result is not None:
                out.append(result)
            try:
                completion = self._done.get_nowait()
            except queue.Empty:
                break
        self._start_backlog()
        return out

    def _check_heartbeats(self) -> None:
        """Stop the attempts that went past their heartbeat timeout (their failure carries
        the last details, so the retry resumes from there)."""
        for attempt in list(self._attempts.values()):
            overdue = attempt.heartbeat_overdue()
            if overdue is not None:
                log.warning("%s", overdue.message)
                attempt.stop(overdue)

    def _result(self, c: Completion) -> Outbound | None:
        if not self.offsets.is_current(c.partition, c.epoch):
            log.info("dropping the result of %s: its partition moved", c.task.attempt_label)
            return None
        if c.outcome in ("cancelled", "later"):  # nothing to report (yet, for "later")
            self.offsets.done(c.partition, c.offset, c.epoch)
            self.stats[c.outcome] += 1
            return None
        self.stats["results"] += 1
        if c.failure is not None:
            self.stats["failures"] += 1
            _log_failed_attempt(c)
        key = c.task.instance_id.encode("utf-8")
        failure_type = c.failure.type if c.failure is not None else ""
        headers = attempt_span(
            self.tracing, c.task, c.parent, c.began_ns, c.duration_s, c.outcome, failure_type
        )
        value = encode_message(c.result())
        out = self._held(Outbound(key, value, c.partition, False, headers, None, c.offset, c.epoch))
        self.offsets.done(c.partition, c.offset, c.epoch)
        return out

    def replace_rejected(self, record: Outbound, reason: str) -> Outbound:
        """A failure result in place of a result the broker refused (too large, say); it
        takes over the refused record's hold on its task's offset."""
        result = decode_message(record.value)
        assert isinstance(result, ActivityResult)
        failure = FailureDetails(
            "ResultRejected",
            f"the result of activity task {result.task_id} could not be written: {reason}. "
            f"Return a smaller value (store large data elsewhere and return a reference).",
            retryable=False,
        )
        replaced = ActivityResult(
            result.instance_id,
            result.generation,
            result.task_id,
            result.attempt,
            None,
            failure,
            run_id=result.run_id,
        )
        value = encode_message(replaced)
        r = record
        return Outbound(r.key, value, r.partition, False, (), None, r.offset, r.epoch)

    # --- delivery and commits ---------------------------------------------------------------

    def delivered(self, record: Outbound) -> bool:
        """The broker acknowledged ``record``: its task's offset may settle. False for a
        record of a partition that moved away meanwhile (nothing to settle)."""
        return self.offsets.delivered(record.partition, record.offset, record.epoch)

    def undelivered(self, record: Outbound) -> None:
        """``record`` could not be delivered: keep its task's offset open and hand it out
        again (:meth:`redo`), unless its partition moved away."""
        if self.offsets.is_current(record.partition, record.epoch):
            self._redo.append(record)

    def redo(self) -> list[Outbound]:
        """The records to produce again (their delivery failed); each still holds its
        task's offset."""
        out, self._redo = self._redo, []
        return out

    def committed(self, offsets: Mapping[int, int]) -> None:
        """These offsets (next to read, per partition) were committed."""
        self.offsets.committed(offsets)

    # --- rebalancing ------------------------------------------------------------------------

    def assigned(self, partitions: Iterable[int]) -> None:
        self.offsets.assign(partitions)

    def revoked(self, partitions: Iterable[int]) -> None:
        """Forget partitions that moved away: queued tasks and results waiting to be produced
        again are dropped (the new owner runs the tasks again); running ones finish but
        their results are dropped."""
        gone = set(partitions)
        self.offsets.drop(gone)
        self._backlog = deque(p for p in self._backlog if p.partition not in gone)
        self._unserved = [u for u in self._unserved if u.record.partition not in gone]
        self._redo = [r for r in self._redo if r.partition not in gone]

    def drop_backlog(self) -> int:
        """Forget tasks that have not started (at shutdown); their offsets stay uncommitted,
        so the next owner of the partition runs them."""
        dropped = len(self._backlog) + len(self._unserved)
        self._backlog.clear()
        self._unserved.clear()
        return dropped

    def shutdown(self) -> None:
        self.runner.shutdown()
