"""What a partition's state machine keeps between records: counters, loaded instances, the
hot-instance cache, and what every partition of a processor shares.

Plain data with no behaviour beyond bookkeeping, so that every other module of the
processor can import it without importing each other.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, fields

from engine.config.topics import TopicNames
from engine.core.history import Inbound
from engine.core.instance_row import InstanceRow
from engine.core.limits import Limits
from engine.runtime.executor import WorkflowExecution
from engine.runtime.interrupt import DEFAULT_MAX_TURN_EVENTS
from engine.runtime.registry import Registry
from engine.services.watchdog import TurnWatchdog


@dataclass
class Counters:
    """What a partition did; the loop aggregates these into its progress line."""

    records: int = 0
    turns: int = 0
    dead_letters: int = 0
    rejected: int = 0
    timers_fired: int = 0
    completed: int = 0

    def add(self, other: Counters) -> None:
        for f in fields(Counters):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Loaded:
    """An instance as the batch sees it: its metadata row and, if running, its execution."""

    meta: InstanceRow
    execution: WorkflowExecution | None = None
    inbox: list[Inbound] = field(default_factory=list)


class InstanceCache:
    """Hot instances kept in memory (LRU), so a turn does not replay history every time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Loaded] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, instance_id: str) -> Loaded | None:
        item = self._items.get(instance_id)
        if item is not None:
            self._items.move_to_end(instance_id)
        return item

    def put(self, instance_id: str, item: Loaded) -> None:
        self._items[instance_id] = item
        self._items.move_to_end(instance_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def evict(self, instance_id: str) -> None:
        self._items.pop(instance_id, None)

    def clear(self) -> None:
        """Forget every hot instance (they are rebuilt from their rows on next use)."""
        self._items.clear()


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
    cache_capacity: int = 10000
    #: Size limits of the values a workflow moves and of one record (settings max_*_bytes).
    limits: Limits = field(default_factory=Limits)
    #: Enforces the per-turn CPU budget (turn_budget_ms).
    watchdog: TurnWatchdog = field(default_factory=lambda: TurnWatchdog(5000))
    #: History events one turn may add (turn_max_events).
    turn_max_events: int = DEFAULT_MAX_TURN_EVENTS
