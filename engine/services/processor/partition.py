"""One partition's share of a turn: route inbound records, step instances, collect output.

The Kafka loop owns transactions; this class owns everything between "here are the records
of this batch" and "here is what to produce and what to write once the commit succeeds".
Inbound records only queue events on the instances they touch; the workflow code runs once
per touched instance at the end of the batch, so a burst of results for one instance costs
one step, not one per record.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.codec import decode_history, encode_message, instance_key
from engine.core.errors import CodecError
from engine.core.history import Inbound
from engine.core.limits import Limits, fit_status
from engine.core.messages import DeadLetter, Message
from engine.runtime.executor import WorkflowExecution
from engine.runtime.interrupt import DEFAULT_MAX_TURN_EVENTS
from engine.runtime.registry import Registry
from engine.services.processor import keys
from engine.services.processor.meta import InstanceMeta
from engine.services.processor.poison import Quarantine, instance_of_key, turn_error
from engine.services.processor.ports import OutRecord, PartitionStore
from engine.services.processor.tables import Tables
from engine.services.topics import TopicNames
from engine.services.watchdog import TurnWatchdog

log = logging.getLogger("engine.processor")


@dataclass
class Counters:
    """What a partition did; the loop aggregates these into its progress line."""

    records: int = 0
    turns: int = 0
    dead_letters: int = 0
    rejected: int = 0
    timers_fired: int = 0
    completed: int = 0


@dataclass
class Loaded:
    """An instance as the batch sees it: its metadata row and, if running, its execution."""

    meta: InstanceMeta
    execution: WorkflowExecution | None = None
    inbox: list[Inbound] = field(default_factory=list)


class InstanceCache:
    """Hot instances kept in memory (LRU), so a turn does not replay history every time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Loaded] = OrderedDict()

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


@dataclass
class Environment:
    """What every partition of one processor shares."""

    registry: Registry
    topics: TopicNames
    pending_events_max: int
    pending_events_ttl_ms: int
    cache_capacity: int = 10000
    limits: Limits = field(default_factory=Limits)
    #: Enforces the per-turn CPU budget (turn_budget_ms).
    watchdog: TurnWatchdog = field(default_factory=lambda: TurnWatchdog(5000))
    turn_max_events: int = DEFAULT_MAX_TURN_EVENTS


class PartitionProcessor:
    def __init__(self, partition: int, store: PartitionStore, env: Environment) -> None:
        self.partition = partition
        self.env = env
        self.tables = Tables(partition, store)
        self.cache = InstanceCache(env.cache_capacity)
        self.counters = Counters()
        self.out: list[OutRecord] = []
        #: Instances touched in this batch, in first-touch order.
        self.batch: dict[str, Loaded] = {}
        #: Rows changed in this batch: written, with one status record each, at its end.
        self.dirty: dict[str, InstanceMeta] = {}
        #: Instances and records that must fail alone when the batch is done again.
        self.quarantine = Quarantine()
        #: The instance whose handling or turn is producing records right now.
        self.origin = ""
        # Imported here to keep the handler table next to its functions without a cycle.
        from engine.services.processor.handlers import MESSAGE_HANDLERS
        from engine.services.processor.outcome import step_instance

        self._handlers = MESSAGE_HANDLERS
        self._step: Callable[[PartitionProcessor, Loaded, int], None] = step_instance

    # --- loading --------------------------------------------------------------------------

    def load(self, instance_id: str) -> Loaded:
        """The instance for this batch; a new, not-yet-started row if none exists."""
        item = self.batch.get(instance_id)
        if item is not None:
            return item
        item = self.cache.get(instance_id)
        if item is None:
            meta = self.tables.load_meta(instance_id) or InstanceMeta(instance_id)
            item = Loaded(meta)
            self.cache.put(instance_id, item)
        self.batch[instance_id] = item
        return item

    def execution(self, item: Loaded) -> WorkflowExecution:
        """The instance's execution, rebuilt by replaying its current generation if cold."""
        if item.execution is None:
            meta = item.meta
            self.replay(item, self.tables.history(meta.instance_id, meta.generation_start))
        assert item.execution is not None
        return item.execution

    def replay(self, item: Loaded, rows: list[bytes]) -> None:
        """Rebuild the instance's execution from its current generation's history rows."""
        execution = WorkflowExecution(
            self.env.registry, item.meta.instance_id, max_turn_events=self.env.turn_max_events
        )
        execution.replay([decode_history(raw) for raw in rows])
        item.execution = execution

    # --- inbound --------------------------------------------------------------------------

    def handle(self, message: Message, now_ms: int) -> None:
        self.counters.records += 1
        handler = self._handlers.get(type(message))
        if handler is None:
            raise CodecError(f"{message.KIND} records are not accepted on this topic")
        self.origin = message.instance_id
        handler(self, message, now_ms)

    def dead_letter(
        self,
        reason: str,
        topic: str,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
    ) -> None:
        """Park an unusable record with the reason, so the partition can go on."""
        self.counters.dead_letters += 1
        log.warning("dead letter from %s[%d]@%d: %s", topic, self.partition, offset, reason)
        instance = _decode_key(key)
        value, reason = _fit_dead_letter(value, reason, self.env.limits.record)
        record = DeadLetter(
            instance_id=instance,
            reason=reason,
            source_topic=topic,
            source_partition=self.partition,
            source_offset=offset,
            key=key,
            value=value,
            timestamp_ms=timestamp_ms,
        )
        headers = (
            ("reason", reason.encode()),
            ("source-topic", topic.encode()),
            ("source-partition", str(self.partition).encode()),
            ("source-offset", str(offset).encode()),
        )
        origin, self.origin = self.origin, ""  # no instance made it: it must never fail one
        self.emit(self.env.topics.dead_letters, key or b"", encode_message(record), None, headers)
        self.origin = origin

    def fire_due_timers(self, now_ms: int) -> int:
        from engine.services.processor.handlers import fire_timer

        due = self.tables.due_timers(now_ms)
        for timer in due:
            self.origin = timer.instance_id
            if timer.instance_id in self.quarantine.instances:
                self.tables.delete_timer(timer)  # the instance fails when the batch ends
                self.load(timer.instance_id)
                continue
            try:
                fire_timer(self, timer, now_ms)
            except Exception as exc:  # a bug firing it: the instance fails alone
                raise turn_error(self.partition, timer.instance_id, exc) from exc
        self.origin = ""
        self.counters.timers_fired += len(due)
        return len(due)

    # --- output ---------------------------------------------------------------------------

    def emit(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        partition: int | None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        self.out.append(OutRecord(topic, key, value, partition, headers, self.origin))

    def send(self, topic: str, message: Message) -> None:
        """A message to another instance or to the workers, partitioned by its key."""
        self.emit(topic, instance_key(message.instance_id), encode_message(message), None)

    def end_batch(self, now_ms: int) -> tuple[list[OutRecord], dict[bytes, bytes | None]]:
        """Step every touched instance; return the records to produce and the table changes."""
        for item in list(self.batch.values()):
            if item.inbox or item.meta.instance_id in self.quarantine.instances:
                self.origin = item.meta.instance_id
                try:
                    self._step(self, item, now_ms)
                except Exception as exc:  # a bug finishing this turn: it fails alone
                    raise turn_error(self.partition, self.origin, exc) from exc
        self._write_rows()
        changes = self.tables.take_changes()
        for key, value in changes.items():
            self.origin = instance_of_key(key)
            self.emit(self._changelog_for(key), key, value, self.partition)
        self.origin = ""
        out, self.out = self.out, []
        return out, changes

    def _write_rows(self) -> None:
        status_topic = self.env.topics.status
        for meta in self.dirty.values():
            self.tables.put_meta(meta)
            if meta.exists:
                self.origin = meta.instance_id
                try:
                    status = encode_message(fit_status(meta.to_status(), self.env.limits.record))
                except Exception as exc:  # an unencodable row fails its instance alone
                    raise turn_error(self.partition, meta.instance_id, exc) from exc
                self.emit(status_topic, meta.instance_id.encode(), status, self.partition)
        self.dirty = {}

    def _changelog_for(self, key: bytes) -> str:
        if key[:1] == keys.TIMER:
            return self.env.topics.timer_changelog
        return self.env.topics.state_changelog

    def committed(self, changes: dict[bytes, bytes | None], offsets: dict[str, int]) -> None:
        """The batch's transaction committed: make its table changes durable locally."""
        self.tables.apply(changes, offsets)
        self.quarantine.committed()
        for instance_id, item in self.batch.items():
            if item.meta.status is not None and item.meta.status.is_terminal:
                item.execution = None
            if not item.meta.exists and not item.meta.pending_events:
                self.cache.evict(instance_id)
        self.batch = {}

    def rolled_back(self) -> None:
        """The transaction aborted: forget everything this batch changed."""
        self.tables.drop_overlay()
        self.quarantine.rolled_back()
        self.dirty = {}
        for instance_id in self.batch:
            self.cache.evict(instance_id)
        self.batch = {}
        self.out = []

    def close(self) -> None:
        self.tables.store.close()


def _fit_dead_letter(value: bytes | None, reason: str, limit: int) -> tuple[bytes | None, str]:
    """A dead letter carries its record's value, cut when it would not fit in one record."""
    keep = limit // 2
    if value is None or len(value) <= keep:
        return value, reason
    return value[:keep], f"{reason} (value cut from {len(value)} to its first {keep} bytes)"


def _decode_key(key: bytes | None) -> str:
    if not key:
        return ""
    try:
        return key.decode()
    except UnicodeDecodeError:
        return ""


__all__ = ["Counters", "Environment", "InstanceCache", "Loaded", "PartitionProcessor"]
