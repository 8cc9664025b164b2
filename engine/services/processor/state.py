"""What a partition's state machine keeps between records: counters, loaded instances, the
hot-instance cache, and what every partition of a processor shares.

Plain data with no behaviour beyond bookkeeping, so that every other module of the
processor can import it without importing each other.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, fields
from typing import TypeVar

from engine.config.settings import Settings
from engine.config.topics import TopicNames
from engine.core.history import (
    ContinuedAsNew,
    EventBody,
    ExecutionCompleted,
    ExecutionStarted,
    Inbound,
    RuntimeStatus,
)
from engine.core.instance_row import InstanceRow
from engine.core.limits import HistoryLimits, Limits
from engine.runtime.continuation import Continuation
from engine.runtime.executor import WorkflowExecution
from engine.runtime.interrupt import DEFAULT_MAX_TURN_EVENTS
from engine.runtime.registry import Registry
from engine.services.tracing import NoTracing, TraceHook
from engine.services.watchdog import TurnWatchdog

K = TypeVar("K")


#: Upper bounds (ms) of the timer-lateness tally; later timers count under ``None``.
TIMER_LATENESS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10_000, 60_000)


@dataclass
class Counters:
    """What a partition did; the loop aggregates these into its progress line, and a
    metrics exporter reads the totals, labelled tallies included (their labels are record
    kinds, topics and registered workflow names, never instance ids, so they stay few)."""

    records: int = 0
    turns: int = 0
    dead_letters: int = 0
    rejected: int = 0
    timers_fired: int = 0
    completed: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    #: input records by topic
    topics: dict[str, int] = field(default_factory=dict, repr=False)
    #: dead letters by the kind of error that refused the record
    dead_letter_kinds: dict[str, int] = field(default_factory=dict, repr=False)
    #: refused inbound records by message or event kind
    rejected_kinds: dict[str, int] = field(default_factory=dict, repr=False)
    #: runs by (workflow name, version, started|completed|failed|terminated|continued_as_new)
    workflow_runs: dict[tuple[str, str, str], int] = field(default_factory=dict, repr=False)
    #: fired timers by lateness bucket (an upper bound of ``TIMER_LATENESS_MS``, or None)
    timer_lateness: dict[int | None, int] = field(default_factory=dict, repr=False)
    #: the summed lateness of the fired timers (ms after their due time)
    timer_late_ms: int = field(default=0, repr=False)
    #: answered commands by (command kind, accepted|buffered|refused|duplicate)
    command_outcomes: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    #: refused commands by (command kind, the error the client raises)
    refusals: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    def reject(self, kind: str) -> None:
        """One refused inbound record or callback of ``kind``."""
        self.rejected += 1
        _tally(self.rejected_kinds, kind)

    def outcome(self, kind: str, result: str) -> None:
        """One command of ``kind`` answered with ``result``."""
        _tally(self.command_outcomes, (kind, result))

    def refuse(self, kind: str, error: str) -> None:
        """One command of ``kind`` refused with ``error`` (also a rejected record)."""
        self.reject(kind)
        _tally(self.refusals, (kind, error))

    def dead_letter(self, kind: str) -> None:
        """One input record parked as a dead letter, refused by a ``kind`` error."""
        self.dead_letters += 1
        _tally(self.dead_letter_kinds, kind)

    def recorded(self, name: str, version: str, body: EventBody) -> None:
        """Tally a history event that starts or ends a run (other events are ignored)."""
        if isinstance(body, ExecutionStarted):
            _tally(self.workflow_runs, (body.name, body.version, "started"))
        elif isinstance(body, ExecutionCompleted):
            _tally(self.workflow_runs, (name, version, body.status.value.lower()))
        elif isinstance(body, ContinuedAsNew):
            _tally(self.workflow_runs, (name, version, "continued_as_new"))

    def timer_fired(self, late_ms: int) -> None:
        """One timer delivered ``late_ms`` after its due time."""
        late_ms = max(late_ms, 0)
        self.timers_fired += 1
        self.timer_late_ms += late_ms
        bound = next((b for b in TIMER_LATENESS_MS if late_ms <= b), None)
        _tally(self.timer_lateness, bound)

    def add(self, other: Counters) -> None:
        """Add ``other``'s counts to these (once per partition and batch: kept cheap)."""
        for name in _NUMBERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in _TALLIES:
            mine = getattr(self, name)
            for key, n in getattr(other, name).items():
                mine[key] = mine.get(key, 0) + n


@dataclass
class Progress(Counters):
    """A replica's totals: its partitions' counters, its transactions, and where the time
    went (seconds), for progress lines, metrics and benchmarks. The Kafka loop keeps it;
    it lives here, beside :class:`Counters`, so that readers of it need not import the
    loop."""

    transactions: int = 0
    aborts: int = 0
    outputs: int = 0
    turn_s: float = 0.0
    produce_s: float = 0.0
    offsets_s: float = 0.0
    commit_s: float = 0.0
    restores: int = 0
    restored_records: int = 0
    restore_s: float = 0.0
    #: changelog partitions whose restore had to wait for an open transaction, and how long
    restore_waits: int = 0
    restore_wait_s: float = 0.0


#: Counters' plain numbers and its labelled tallies (dicts), by field name.
_TALLIES = tuple(f.name for f in fields(Counters) if f.default_factory is dict)
_NUMBERS = tuple(f.name for f in fields(Counters) if f.name not in _TALLIES)


def _tally(counts: dict[K, int], key: K) -> None:
    counts[key] = counts.get(key, 0) + 1


#: What the instance counts of a partition know of one instance: its status, workflow name
#: and version (None: no row).
Standing = tuple[RuntimeStatus, str, str] | None

#: Statuses whose instances still run their version's code (they count per version).
_OPEN = frozenset(
    {RuntimeStatus.PENDING, RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED, RuntimeStatus.PARKED}
)


def standing(meta: InstanceRow) -> Standing:
    """The instance row's entry in :class:`StatusCounts` (the status it reports: a parked
    instance counts as PARKED, not as the RUNNING its history says)."""
    status = meta.reported_status
    return None if status is None else (status, meta.name, meta.version)


#: The history events that start or end a run: the ones :meth:`Counters.recorded` tallies.
RUN_EVENTS = (ExecutionStarted, ExecutionCompleted, ContinuedAsNew)


class StatusCounts:
    """One partition's committed instances per status, and its open instances (PENDING,
    RUNNING, SUSPENDED, PARKED) per workflow name and version (metrics gauges): counted once, then
    moved by every committed batch's changes."""

    def __init__(self, standings: Iterable[Standing]) -> None:
        self._counts: dict[RuntimeStatus, int] = {}
        self._versions: dict[tuple[str, str], int] = {}
        for entry in standings:
            self._add(entry, 1)

    def _add(self, entry: Standing, n: int) -> None:
        if entry is None:
            return
        status, name, version = entry
        self._counts[status] = self._counts.get(status, 0) + n
        if status in _OPEN:
            key = (name, version)
            left = self._versions.get(key, 0) + n
            if left:
                self._versions[key] = left
            else:
                del self._versions[key]  # a version no instance runs leaves the gauge

    def move(self, moves: Iterable[tuple[Standing, Standing]]) -> None:
        for before, after in moves:
            self._add(before, -1)
            self._add(after, 1)

    def snapshot(self) -> dict[RuntimeStatus, int]:
        """A copy (safe to read from another thread while the loop moves the counts)."""
        return dict(self._counts)

    def versions(self) -> dict[tuple[str, str], int]:
        """Open instances per (workflow name, version), a copy."""
        return dict(self._versions)


#: An open activity attempt: generation, attempt number, task queue.
OpenAttempt = tuple[int, int, str]


@dataclass
class Loaded:
    """An instance as the batch sees it: its metadata row and, if running, its execution."""

    meta: InstanceRow
    execution: WorkflowExecution | None = None
    inbox: list[Inbound] = field(default_factory=list)
    #: A parked instance's retry runs in this batch (set by ``parking``, never stored).
    retrying: bool = False
    #: Its wake-up timer fired: it takes a turn even with no new event (``backlog``).
    wake: bool = False
    #: The generation the running turn begins after a continue-as-new (read before the
    #: step, never stored): a failure recorded in place of the turn begins it too.
    continuing: Continuation | None = None
    #: Trace contexts (trace id, span id) of the records that fed the coming turn, with
    #: tracing on: its span links to them (``spans``; never stored).
    trace_links: list[tuple[str, str]] = field(default_factory=list)
    #: The activity attempts sent to workers and not settled, by task id (see
    #: ``processor.cancels``; None: not known yet, read from the execution).
    open_attempts: dict[int, OpenAttempt] | None = None
    #: Task ids of requeued copies whose notes came while its open attempts were not
    #: known (it was cold): the batch replays it to check them (``processor.requeued``;
    #: never stored).
    requeue_checks: set[int] = field(default_factory=set)


def partition_cache_capacity(budget: int, partitions: int) -> int:
    """One partition's share of a replica's cache budget (setting ``cache_instances``).

    The budget is split evenly over the topic's partitions, so a replica that owns every
    partition caches at most ``budget`` instances in all (at least one per partition).
    """
    return max(1, budget // max(1, partitions))


#: A running instance with no turn for this long counts as idle: it leaves a full cache
#: before the instances that are busy (one asleep on a timer of hours needs no hot copy).
IDLE_AFTER_MS = 60_000


class InstanceCache:
    """Hot instances kept in memory, so a turn does not replay history every time.

    ``capacity`` bounds it each time a batch commits (:meth:`trim`); while a batch runs,
    the instances it loads come on top. A full cache drops, in this order:

    1. *cheap* entries, least recently used first: instances without a loaded execution
       (an ended one drops its execution at commit; one loaded only to buffer an event or
       refuse a command never had one). Rebuilding them is one row read, no replay;
    2. *idle* running instances (no turn for ``idle_ms``), least recently used first;
    3. *newcomers*: running instances loaded cold since the last trim, newest first;
    4. the least recently used running instance (only when nothing else is left).

    Plain LRU is the worst order for a workflow engine under pressure: once more
    instances are in flight than fit, the one it evicts is exactly the one whose turn
    comes next, so every turn replays. This order keeps ``capacity`` running instances
    hot until they end or go idle, turns newcomers away instead of them (those replay as
    they would have anyway), and never lets an ended instance push a running one out.
    """

    def __init__(self, capacity: int, idle_ms: int = IDLE_AFTER_MS) -> None:
        self.capacity = capacity
        self.idle_ms = idle_ms
        self._items: dict[str, Loaded] = {}
        #: Ids without a loaded execution, least recently used first.
        self._cheap: OrderedDict[str, None] = OrderedDict()
        #: Ids with a loaded execution -> when their last turn committed (ms), oldest first.
        self._running: OrderedDict[str, int] = OrderedDict()
        #: Ids put (loaded cold) since the last trim, in order.
        self._fresh: list[str] = []

    def __len__(self) -> int:
        return len(self._items)

    def get(self, instance_id: str) -> Loaded | None:
        """The hot instance, if cached (its rank changes when its batch commits: :meth:`keep`)."""
        return self._items.get(instance_id)

    def put(self, instance_id: str, item: Loaded) -> None:
        """Add an instance loaded cold; it counts as a newcomer until the next trim."""
        self._items[instance_id] = item
        self._running.pop(instance_id, None)
        self._cheap[instance_id] = None
        self._cheap.move_to_end(instance_id)
        self._fresh.append(instance_id)

    def keep(self, instance_id: str, item: Loaded, now_ms: int) -> None:
        """After a commit: the instance was used at ``now_ms``; rank it by what it holds."""
        self._items[instance_id] = item
        if item.execution is None:
            self._running.pop(instance_id, None)
            self._cheap[instance_id] = None
            self._cheap.move_to_end(instance_id)
        else:
            self._cheap.pop(instance_id, None)
            self._running[instance_id] = now_ms
            self._running.move_to_end(instance_id)

    def evict(self, instance_id: str) -> None:
        self._items.pop(instance_id, None)
        self._cheap.pop(instance_id, None)
        self._running.pop(instance_id, None)

    def trim(self, now_ms: int, keep: Collection[str] = ()) -> None:
        """Shrink to ``capacity`` in the order of the class docstring; forget newcomers.
        The ids in ``keep`` stay whatever their rank (a batch not yet committed works on
        them); the cache may then stay above ``capacity`` until they are settled."""
        fresh, self._fresh = self._fresh, []
        cheap = {i: None for i in keep if self._cheap.pop(i, 0) is None}
        running = {i: t for i in keep if (t := self._running.pop(i, None)) is not None}
        while len(self._items) > self.capacity and self._cheap:
            self._drop(next(iter(self._cheap)))
        idle_before = now_ms - self.idle_ms
        while len(self._items) > self.capacity and self._running:
            instance_id, used_ms = next(iter(self._running.items()))
            if used_ms > idle_before:
                break
            self._drop(instance_id)
        for instance_id in reversed(fresh):
            if len(self._items) <= self.capacity:
                break
            if instance_id in self._running:
                self._drop(instance_id)
        while len(self._items) > self.capacity and self._running:
            self._drop(next(iter(self._running)))
        self._cheap.update(cheap)
        self._running.update(running)

    def _drop(self, instance_id: str) -> None:
        del self._items[instance_id]
        self._cheap.pop(instance_id, None)
        self._running.pop(instance_id, None)

    def clear(self) -> None:
        """Forget every hot instance (they are rebuilt from their rows on next use)."""
        self._items.clear()
        self._cheap.clear()
        self._running.clear()
        self._fresh.clear()


@dataclass
class Environment:
    """What every partition of one processor shares."""

    registry: Registry
    topics: TopicNames
    #: Partition count of the co-partitioned topics: a record must sit on
    #: ``murmur2(key) % partitions``.
    partitions: int
    pending_events_max: int
    pending_events_ttl_ms: int
    #: Command request ids remembered per instance: count and age (settings dedup_window*).
    dedup_window: int = 64
    dedup_window_ms: int = 24 * 3600 * 1000
    cache_capacity: int = 10000
    #: Finished instances are purged this long after they end (0: never; settings
    #: retention_ms, or the workflow's own ``retention``).
    retention_ms: int = 0
    #: Park instances whose workflow code raised unexpectedly instead of failing them.
    park_workflow_errors: bool = True
    #: Events a parked instance keeps, by count and encoded bytes (settings parked_events_*).
    parked_events_max: int = 1000
    parked_events_max_bytes: int = 256 * 1024
    #: Size limits of the values a workflow moves and of one record (settings max_*_bytes).
    limits: Limits = field(default_factory=Limits)
    #: Enforces the per-turn CPU budget (turn_budget_ms).
    watchdog: TurnWatchdog = field(default_factory=lambda: TurnWatchdog(5000))
    #: History events one turn may add (turn_max_events).
    turn_max_events: int = DEFAULT_MAX_TURN_EVENTS
    #: Where the spans of committed runs and turns go (tracing off: :class:`NoTracing`).
    tracing: TraceHook = field(default_factory=NoTracing)
    #: The user topics workflows may publish to (``ctx.publish``; setting publish_topics).
    publish_topics: frozenset[str] = frozenset()
    #: Events an instance's backlog holds at most (setting backlog_events_max).
    backlog_events_max: int = 10_000
    #: How large one generation's history may grow (settings history_*).
    history_limits: HistoryLimits = field(default_factory=HistoryLimits)
    #: An offset at or before where the next record of a payloads-topic partition lands
    #: (the adapter asks the broker): a turn's large payloads go to that topic
    #: (``payload_aside``). None: every payload stays inline (the in-memory engine).
    payload_offsets: Callable[[int], int] | None = None


def environment_for(
    settings: Settings, registry: Registry, topics: TopicNames, tracing: TraceHook
) -> Environment:
    """What every partition of the replica shares, from its settings."""
    return Environment(
        registry=registry,
        topics=topics,
        partitions=settings.partitions,
        pending_events_max=settings.pending_events_max,
        pending_events_ttl_ms=settings.pending_events_ttl_ms,
        dedup_window=settings.dedup_window,
        dedup_window_ms=settings.dedup_window_ms,
        retention_ms=settings.retention_ms,
        park_workflow_errors=settings.park_workflow_errors,
        parked_events_max=settings.parked_events_max,
        parked_events_max_bytes=settings.parked_events_max_bytes,
        # the cache budget is per replica; each partition gets its share
        cache_capacity=partition_cache_capacity(settings.cache_instances, settings.partitions),
        limits=settings.limits,
        watchdog=TurnWatchdog(settings.turn_budget_ms),
        turn_max_events=settings.turn_max_events,
        tracing=tracing,
        publish_topics=frozenset(settings.publish_topics),
        backlog_events_max=settings.backlog_events_max,
        history_limits=settings.history_limits,
    )
